"""``shorelink fleet``: the commands an operator at headquarters runs to provision,
rotate, revoke and configure ships, and to export what today's sites read. Each secret
must land owner-only and exactly once; each change must be a verified entry; a refused
change or a tampered log must fail with a one-line error, not a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

from click.testing import CliRunner, Result

from core_gateway.auth import Credentials
from local_stack.kafka import KafkaBroker
from shorelink.cli import main
from shorelink.contract import H_PROOF, Record, ingress_topic
from shorelink.fleet.entry import FLEET_ORIGIN, REGISTRY_STREAM
from shorelink.fleet.log import Registry
from shorelink.fleet.state import FleetState
from shorelink.fleet.views import site_ship_keys
from shorelink.kafka.reading import read_to_end
from shorelink.proof import ShipKey, ShipKeys


def _fleet(*args: str) -> Result:
    return CliRunner().invoke(main, ["fleet", *args], catch_exceptions=False)


def _ok(*args: str) -> Result:
    result = _fleet(*args)
    assert result.exit_code == 0, result.output
    return result


def test_provision_rotate_revoke_configure_and_export_end_to_end(tmp_path: Path) -> None:
    reg = tmp_path / "registry"
    r = ["--registry", str(reg)]
    _ok("init", *r)
    assert (reg / "fleet.key").stat().st_mode & 0o077 == 0
    assert reg.stat().st_mode & 0o077 == 0
    tar = tmp_path / "bigblue.tar"
    _ok("provision", "bigblue", "--group", "north", "--group", "reefer", "--tar", str(tar), *r)
    _ok("provision", "red", "--group", "north", *r)
    bundle = reg / "bundles" / "bigblue"
    for secret in ("gateway.token", "ship.key"):
        assert (bundle / secret).stat().st_mode & 0o077 == 0
    assert tar.stat().st_mode & 0o077 == 0
    with tarfile.open(tar) as t:
        assert {m.name for m in t.getmembers()} >= {"bigblue/gateway.token", "bigblue/ship.key"}
    token = (bundle / "gateway.token").read_text().strip()
    assert token not in (reg / "registry.log").read_text()  # only its hash
    ShipKey.load(bundle / "ship.key", "uplink.signing_key_file")

    again = _fleet("provision", "bigblue", "--group", "north", "--out", str(tmp_path / "b2"), *r)
    assert again.exit_code == 2 and "error: entry" in again.output and "exists" in again.output
    assert not list(tmp_path.glob("*b2*")), "a refused provision leaves no bundle, not even half"

    _ok("rotate-key", "bigblue", "--from-seq", "nav=100", "--from-seq", "alerts=7", *r)
    status = json.loads(_ok("status", "--json", *r).output)
    keys = status["ships"][0]["keys"]
    assert [k["valid_below"] for k in keys] == [{"alerts": 7, "nav": 100}, None]
    bad = _fleet("revoke", "bigblue", "--key", keys[1]["id"], "--from-seq", "5", *r)
    assert bad.exit_code == 2 and "newest" in bad.output
    _ok("revoke", "bigblue", "--key", keys[0]["id"], "--from-seq", "nav=50", *r)
    config = tmp_path / "north.toml"
    config.write_text("[alarms]\nthreshold = 4\n")
    _ok("config", "set", str(config), "--group", "north", "--port-links-only", *r)
    _ok("rotate-token", "red", *r)
    _ok("revoke", "red", *r)

    status = json.loads(_ok("status", "--json", *r).output)
    ships = {s["ship"]: s for s in status["ships"]}
    assert ships["bigblue"]["keys"][0]["valid_below"] == {"nav": 50}
    assert ships["bigblue"]["config_version"] == ships["red"]["config_version"] == 10
    assert ships["red"]["revoked"] and status["version"] == 12
    table = _ok("status", *r).output
    assert "registry version 12" in table and "revoked" in table

    creds, keys_file = tmp_path / "ships.json", tmp_path / "ship_keys.toml"
    _ok("export", "--gateway-credentials", str(creds), "--ship-keys", str(keys_file), *r)
    assert creds.stat().st_mode & 0o077 == 0
    assert Credentials(creds).ship_for_token(token) == "bigblue"
    assert sorted(ShipKeys.load(keys_file).ships) == ["bigblue", "red"]

    _ok("rotate-fleet-key", *r)
    assert "version 13" in _ok("verify", *r).output

    # a configuration removed: its ships have none from their group any more, and a
    # scope without one cannot be removed
    assert "removed at version 14" in _ok("config", "remove", "--group", "north", *r).output
    status = json.loads(_ok("status", "--json", *r).output)
    assert {s["ship"]: s["config_version"] for s in status["ships"]}["bigblue"] is None
    again = _fleet("config", "remove", "--group", "north", *r)
    assert again.exit_code == 2 and "has no configuration" in again.output
    # a ship's groups changed: status says them
    out = _ok("set-groups", "bigblue", "--group", "reefer", "--group", "south", *r).output
    assert "groups reefer, south from version 15" in out
    status = json.loads(_ok("status", "--json", *r).output)
    assert {s["ship"]: s["groups"] for s in status["ships"]}["bigblue"] == ["reefer", "south"]


def test_verify_names_the_first_entry_that_fails_and_exits_2(tmp_path: Path) -> None:
    reg = tmp_path / "registry"
    r = ["--registry", str(reg)]
    _ok("init", *r)
    _ok("provision", "bigblue", "--group", "north", *r)
    log = reg / "registry.log"
    log.write_bytes(log.read_bytes().replace(b'"north"', b'"south"'))
    result = _fleet("verify", *r)
    assert result.exit_code == 2
    assert result.output.strip().startswith("error: entry 2: ") and "forged" in result.output
    other = tmp_path / "other"
    _ok("init", "--registry", str(other))
    log.write_bytes(log.read_bytes().replace(b'"south"', b'"north"'))
    pinned = _fleet("verify", "--fleet-pub", str(other / "fleet.pub"), *r)
    assert pinned.exit_code == 2 and "another fleet key" in pinned.output


def test_every_fleet_command_has_help() -> None:
    for cmd in (
        "init",
        "provision",
        "rotate-key",
        "revoke",
        "rotate-token",
        "retire-token",
        "status",
        "export",
        "verify",
        "rotate-fleet-key",
        "client-cert",
        "config set",
        "config remove",
        "set-groups",
    ):
        assert "Usage:" in _ok(*cmd.split(), "--help").output


def test_the_registry_bench_runs_and_prints_each_figure_beside_its_goal(
    tmp_path: Path, kafka: KafkaBroker
) -> None:
    """bench/fleet_registry.py is how the 700-ship figure is measured: it must not rot."""
    root = Path(__file__).resolve().parents[2]
    bench = [sys.executable, "bench/fleet_registry.py", "--ships", "3", "--groups", "2"]
    done = subprocess.run(
        [*bench, "--runs", "1", "--kafka", kafka.bootstrap, "--reports-per-ship", "2"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["ships"] == 3 and out["entries"] == 1 + 3 * 3 + 2 + 1 + 2
    assert out["status_json_s"]["goal"] == 1.0 and out["status_json_s"]["median"] > 0
    assert out["status_with_reports_json_s"]["goal"] == 1.0
    assert out["reports"] == 6 and sum(out["rollout"]["health"].values()) == 3


def test_publish_writes_every_entry_as_a_record_of_the_fleet_its_sites_can_prove(
    tmp_path: Path, kafka: KafkaBroker
) -> None:
    """What headquarters publishes is what every merge must take from a neighbour: one
    record per entry, at seq = its version, proved by the fleet key (a record without
    a valid proof would be dead-lettered at the sites behind)."""
    reg = tmp_path / "registry"
    r = ["--registry", str(reg)]
    _ok("init", *r)
    _ok("provision", "bigblue", "--group", "north", *r)
    sites = tmp_path / "sites.toml"
    sites.write_text(
        f'[sites.hq]\nstreams = ["alerts"]\n[sites.hq.kafka]\nbootstrap = "{kafka.bootstrap}"\n'
    )
    out = _ok("publish", "--sites", str(sites), "--site", "hq", *r).output
    assert "entries 1-4 published to hq" in out
    state = Registry.open(reg).state
    keys = site_ship_keys(FleetState(anchor=state.fleet_key))  # a site that knows the root
    mine = [
        m
        for m in read_to_end(kafka.endpoint, [ingress_topic(REGISTRY_STREAM)], settled=True)
        if (m.value() or b"") in {e.raw for e in Registry.open(reg).entries()}
    ]
    assert [Record.from_kafka(m.key(), m.value(), m.headers()).identity.seq for m in mine] == [
        1,
        2,
        3,
        4,
    ]
    for m in mine:
        rec = Record.from_kafka(m.key(), m.value(), m.headers())
        i, proof = rec.identity, dict(m.headers() or [])[H_PROOF]
        assert (i.origin, i.stream) == (FLEET_ORIGIN, REGISTRY_STREAM)
        assert isinstance(proof, bytes)
        why = keys.check(FLEET_ORIGIN, i.stream, i.seq, rec.ts_ms, rec.key, "", rec.value, proof)
        assert why is None
    bad = _fleet("publish", "--sites", str(sites), "--site", "nowhere", *r)
    assert bad.exit_code == 2 and "no site 'nowhere'" in bad.output


def test_provision_and_client_cert_say_whether_a_ship_needs_its_certificate(
    tmp_path: Path,
) -> None:
    """What `shorelink-gateway ships add --require-client-cert` said at a site alone, the
    registry says for every site: status shows it, export writes it, and it can be lifted."""
    r = ["--registry", str(tmp_path / "registry")]
    _ok("init", *r)
    _ok("provision", "bigblue", "--group", "north", "--require-client-cert", *r)

    def required() -> bool:
        return bool(
            json.loads(_ok("status", "--json", *r).output)["ships"][0]["require_client_cert"]
        )

    assert required()
    creds = tmp_path / "ships.json"
    _ok("export", "--gateway-credentials", str(creds), *r)
    assert Credentials(creds).requires_client_cert("bigblue")
    assert "optional" in _ok("client-cert", "bigblue", "optional", *r).output
    assert not required()
    bad = _fleet("client-cert", "ghost", "required", *r)
    assert bad.exit_code == 2 and "no ship ghost" in bad.output


def test_audit_key_says_per_stream_which_seqs_each_of_a_ships_keys_proves(tmp_path: Path) -> None:
    """Issue 41: an operator whose ship's key was stolen must see what it could sign:
    its first key up to the rotation's seq per stream named (nothing of a stream the
    revocation does not name), the new key from there on; an unknown key is one line."""
    reg = tmp_path / "registry"
    r = ["--registry", str(reg)]
    _ok("init", *r)
    _ok("provision", "bigblue", "--group", "north", *r)
    first = Registry.open(reg).state.ships["bigblue"].keys[0].id
    _ok("rotate-key", "bigblue", "--from-seq", "nav=101", "--from-seq", "alerts=7", "--revoke", *r)
    second = Registry.open(reg).state.ships["bigblue"].keys[1].id
    old = json.loads(_ok("audit-key", "bigblue", first, "--json", *r).output)
    assert old["proves"] == {"alerts": [1, 7], "nav": [1, 101], "*": [1, 1]}
    assert (old["index"], old["keys"], old["revoked_at"]) == (1, 2, {"alerts": 7, "nav": 101})
    new = json.loads(_ok("audit-key", "bigblue", second, "--json", *r).output)
    assert new["proves"] == {"alerts": [7, None], "nav": [101, None], "*": [1, None]}
    text = _ok("audit-key", "bigblue", first, *r).output
    assert "nav: 1-100" in text and "*: none" in text and "revoked at alerts=7 nav=101" in text
    bad = _fleet("audit-key", "bigblue", "0" * 16, *r)
    assert bad.exit_code == 2 and f"its keys: {first}, {second}" in bad.output
