"""``shorelink-gateway ships list`` (core_gateway/cli.py): as text, every line fits 80
columns (a terminal, or piped) and every ship name and date is whole, whatever the
names; ``--json`` for scripts. It never shows a token, nor its hash. No Kafka: the
command reads the credentials file only."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from core_gateway.auth import Credentials, ShipCredential
from core_gateway.cli import main, render_ships
from tests.core_gateway.helpers import sample_config
from tests.helpers import eventually
from tests.strategies import DIGITS, LOWER, words

names = words(LOWER + DIGITS, LOWER + DIGITS + "_-", 62)


def _config(tmp_path: Path) -> Path:
    return sample_config(tmp_path)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.builds(
            ShipCredential,
            ship=names,
            token_hash=st.just("sha256:" + "0" * 64),
            created=st.just("2027-01-15T08:00:00Z"),
            revoked=st.booleans(),
            require_client_cert=st.booleans(),
        ),
        max_size=10,
    )
)
def test_every_line_fits_80_columns_and_every_ship_is_whole(creds: list[ShipCredential]) -> None:
    lines = render_ships(creds, 80)
    assert all(len(line) <= 80 for line in lines), [ln for ln in lines if len(ln) > 80]
    words = set(re.split(r"\s+", "\n".join(lines)))
    for c in creds:
        assert c.ship in words and c.created in words
    assert "sha256" not in "\n".join(lines)


def test_the_command_piped_fits_80_columns_and_json_says_the_same(tmp_path: Path) -> None:
    config = _config(tmp_path)
    creds = Credentials(tmp_path / "ships.json")
    long_name = "maersk-mc-kinney-moller-triple-e-class-container-ship-of-the-line"[:63]
    tokens = [creds.add("bigblue"), creds.add(long_name, require_client_cert=True)]
    creds.revoke("bigblue")
    runner = CliRunner()
    text = runner.invoke(main, ["ships", "list", "--config", str(config)], env={"COLUMNS": "80"})
    assert text.exit_code == 0, text.output
    lines = text.output.splitlines()
    assert all(len(line) <= 80 for line in lines), text.output
    words = set(text.output.split())
    assert {"bigblue", "revoked", long_name, "active", "client-cert"} <= words, text.output
    doc = json.loads(
        runner.invoke(main, ["ships", "list", "--config", str(config), "--json"]).output
    )
    assert [(s["ship"], s["revoked"], s["require_client_cert"]) for s in doc] == [
        ("bigblue", True, False),
        (long_name, False, True),
    ]
    stored = json.loads((tmp_path / "ships.json").read_text())["ships"]
    for out in (text.output, json.dumps(doc)):
        assert not any(t in out for t in tokens)
        assert not any(s["token_hash"] in out for s in stored.values())


def test_no_ships_says_so(tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["ships", "list", "--config", str(_config(tmp_path))])
    assert r.exit_code == 0 and "no ship has a credential in" in r.output


def test_a_revocation_stays_when_another_command_changed_the_file_meanwhile(
    tmp_path: Path,
) -> None:
    """Review L3: two ``ships`` commands each read the file, one revokes a stolen
    token, the other adds a ship; the second wrote back what it had read, and the
    stolen token was accepted again."""
    path = tmp_path / "ships.json"
    token = Credentials(path).add("stolen")
    first, second = Credentials(path), Credentials(path)  # both loaded: "stolen" valid
    assert first.revoke("stolen")
    new = second.add("newship")
    second.require_client_cert("newship", True)
    now = Credentials(path)
    assert now.ship_for_token(token) is None
    assert now.ship_for_token(new) == "newship"
    assert now.requires_client_cert("newship")
    assert {c.ship for c in now.list()} == {"stolen", "newship"}


def test_ships_added_by_commands_running_at_once_are_all_kept(tmp_path: Path) -> None:
    """Real processes, as an operator's scripts would run them: every ship added by
    eight ``shorelink-gateway ships add`` at once is in the file, with a token that
    works."""
    config = _config(tmp_path)
    ships = [f"ship{i}" for i in range(8)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "core_gateway.cli", "ships", "add", s, "--config", str(config)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for s in ships
    ]
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0] * len(ships), outs
    creds = Credentials(tmp_path / "ships.json")
    assert sorted(c.ship for c in creds.list()) == ships
    for ship, (out, _) in zip(ships, outs, strict=True):
        token = re.search(r"slk_[A-Za-z0-9_-]+", out)
        assert token is not None, out
        assert creds.ship_for_token(token.group(0)) == ship


@pytest.mark.parametrize(
    ("kafka", "warned"),
    [
        ('bootstrap = "127.0.0.1:9092"', []),
        ('bootstrap = "localhost:9092,[::1]:9093"', []),
        ('bootstrap = "kafka-1.port.example:9093"', ["kafka-1.port.example", "records cross"]),
        (
            'bootstrap = "127.0.0.1:9092,10.0.0.7:9093"\nusername = "gw"\npassword = "pw"',
            ["10.0.0.7", "records and SASL login"],
        ),
    ],
)
def test_check_config_warns_where_kafka_is_reached_without_tls(
    tmp_path: Path, kafka: str, warned: list[str]
) -> None:
    """Review L7: a username without ``ca_file`` is SASL_PLAINTEXT, every ship's
    records in clear text, and nothing said so. Loopback is the one place it may be."""
    config = _config(tmp_path)
    text = re.sub(
        r'bootstrap = "[^"]*"', kafka.replace("\\", "\\\\"), config.read_text(), count=1
    ).replace('host = "0.0.0.0"', 'host = "127.0.0.1"')
    config.write_text(text)
    result = CliRunner().invoke(main, ["check-config", str(config)])
    assert result.exit_code == 0, result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.startswith("warning: Kafka")]
    if not warned:
        assert lines == [], result.stderr
    else:
        assert len(lines) == 1, result.stderr
        assert all(w in lines[0] for w in warned), lines


def test_check_config_warns_when_the_sample_is_taken_off_tls(tmp_path: Path) -> None:
    """The sample serves HTTPS on every address (review M4): no warning. Without its
    TLS files it would serve ships' tokens in clear text beyond loopback: a warning."""
    config = _config(tmp_path)
    result = CliRunner().invoke(main, ["check-config", str(config)])
    assert result.exit_code == 0, result.output
    assert "tls=on" in result.stdout and "warning" not in result.stderr
    text = config.read_text()
    config.write_text("\n".join(ln for ln in text.splitlines() if not ln.startswith("tls_")))
    result = CliRunner().invoke(main, ["check-config", str(config)])
    assert result.exit_code == 0, result.output
    assert "warning: listening on 0.0.0.0:" in result.stderr


def test_a_credentials_file_that_does_not_parse_keeps_the_ships_and_its_mend_applies(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Review L4: a hand edit with a typo made the next request a 500 and then left
    the old credentials for good (the file's mtime was taken before it was read), so
    the revocation the edit meant never applied."""
    path = tmp_path / "ships.json"
    token = Credentials(path).add("stolen")
    gateway = Credentials(path)  # as the running gateway holds it
    good = path.read_text()
    assert '"revoked": false' in good
    path.write_text(good.replace('"revoked": false', '"revoked": true,,'))  # the typo

    def refused_and_kept() -> bool:
        gateway.maybe_reload()  # never raises: no 500
        assert gateway.ship_for_token(token) == "stolen"
        return "event=credentials_unreadable" in caplog.text

    eventually(refused_and_kept, within=10, what="the broken file noticed")
    path.write_text(good.replace('"revoked": false', '"revoked": true'))  # mended

    def revoked() -> bool:
        gateway.maybe_reload()
        return gateway.ship_for_token(token) is None

    eventually(revoked, within=10, what="the mended revocation applied")


def test_check_config_states_the_signature_mode_and_warns_where_it_is_not_enforced(
    tmp_path: Path,
) -> None:
    """Review N10: a gateway without ``ship_keys_file`` takes any ship's batches
    without a proof (a token thief's forgeries become canonical), and nothing said so.
    check-config says the mode; it warns without the file or with
    ``require_signatures = false``, and refuses a keys file others may write (whoever
    may write it adds a key of theirs for any ship)."""
    config = _config(tmp_path)
    keys_file = tmp_path / "ship_keys.toml"
    result = CliRunner().invoke(main, ["check-config", str(config)])
    assert result.exit_code == 0, result.output
    assert "signatures=required ships=0 unsigned_below=0" in result.stdout
    assert "warning" not in result.stderr
    keys_file.write_text(
        keys_file.read_text().replace("require_signatures = true", "require_signatures = false")
    )
    result = CliRunner().invoke(main, ["check-config", str(config)])
    assert result.exit_code == 0, result.output
    assert "signatures=per_ship" in result.stdout
    assert "warning: require_signatures = false" in result.stderr
    keys_file.chmod(0o666)
    result = CliRunner().invoke(main, ["check-config", str(config)])
    assert result.exit_code != 0 and "world-writable" in result.output, result.output
    text = config.read_text()
    config.write_text(
        "\n".join(ln for ln in text.splitlines() if not ln.startswith("ship_keys_file"))
    )
    result = CliRunner().invoke(main, ["check-config", str(config)])
    assert result.exit_code == 0, result.output
    assert "signatures=off" in result.stdout
    assert "warning: ship_keys_file is not set" in result.stderr
