"""``shorelink-spark check-config``: a sites file checked as an operator runs it, before
anything starts: what is missing is an error naming its field, what is merely risky a
warning."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from shorelink.errors import ConfigError
from shorelink.fleet.log import Registry
from spark_core.config import load_config

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "deploy" / "spark" / "sites.toml"


def _check(
    config: Path, *extra: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spark_core.cli", "check-config", str(config), *extra],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_the_sample_names_every_file_it_lacks_here_and_every_variable() -> None:
    out = _check(SAMPLE)
    assert out.returncode == 1, out.stderr
    for field in (
        "sites.tokyo.kafka.ca_file",
        "sites.tokyo.ops.listen.tls_cert_file",
        "sites.tokyo.ops.users_file",
    ):
        assert f"error: {field}:" in out.stderr, field
    # every error and warning at once, not only the first
    assert out.stderr.count("error: ") == 4
    assert "warning: sites.tokyo.access.admin_password: environment variable" in out.stderr
    assert "warning: sites.hq.kafka: Kafka at 10.2.0.10 without TLS" in out.stderr
    assert "customers: 2 in" in out.stdout and "ok: site=tokyo" in out.stdout


def test_a_site_with_its_files_passes_and_a_readable_users_file_is_refused(
    tmp_path: Path,
) -> None:
    for name in ("ca.pem", "ops.crt", "ops.key"):
        (tmp_path / name).write_text("x")
    users = tmp_path / "ops-users"
    users.write_text("# nobody yet\n")
    users.chmod(0o600)
    config = tmp_path / "sites.toml"
    config.write_text(
        f"""\
[sites.tokyo]
streams = ["nav"]
checkpoint_dir = "{tmp_path}/c"
table_dir = "{tmp_path}/t"

[sites.tokyo.kafka]
bootstrap = "10.1.0.10:9093"
ca_file = "ca.pem"

[sites.tokyo.ops]
users_file = "ops-users"

[sites.tokyo.ops.listen]
host = "0.0.0.0"
tls_cert_file = "ops.crt"
tls_key_file = "ops.key"
"""
    )
    good = _check(config, "--site", "tokyo")
    assert good.returncode == 0, good.stderr
    assert "ok: site=tokyo" in good.stdout and "ops=https://0.0.0.0:8090" in good.stdout
    assert "error" not in good.stderr
    users.chmod(0o644)
    bad = _check(config)
    assert bad.returncode == 1 and "world-readable" in bad.stderr
    # the page open beyond loopback, in plain HTTP
    config.write_text(
        config.read_text().replace('users_file = "ops-users"\n', "").replace("tls_", "# tls_")
    )
    open_page = _check(config)
    assert open_page.returncode == 1
    assert "error: sites.tokyo.ops.users_file: not set" in open_page.stderr
    assert "warning: sites.tokyo.ops.listen: plain HTTP on 0.0.0.0" in open_page.stderr
    unknown = _check(config, "--site", "osaka")
    assert unknown.returncode == 2 and "tokyo" in unknown.stderr


def test_check_config_says_how_pulled_records_are_proved_and_warns_where_they_are_not(
    tmp_path: Path,
) -> None:
    """Review N10: a site that pulls from neighbours without ``ship_keys_file`` takes
    any record they offer without a proof, and nothing said so."""
    sites = "\n".join(
        f"""
[sites.{name}]
streams = ["nav"]
neighbours = ["{other}"]
checkpoint_dir = "{tmp_path}/{name}-c"
table_dir = "{tmp_path}/{name}-t"

[sites.{name}.kafka]
bootstrap = "127.0.0.1:{port}"
"""
        for name, other, port in (("tokyo", "hq", 9092), ("hq", "tokyo", 9093))
    )
    config = tmp_path / "sites.toml"
    config.write_text(sites)
    out = _check(config)
    assert out.returncode == 0, out.stderr
    assert "signatures: off" in out.stdout
    assert "warning: ship_keys_file is not set" in out.stderr
    keys = tmp_path / "ship_keys.toml"
    keys.write_text("require_signatures = true\n[ships]\n")
    config.write_text(f'ship_keys_file = "{keys}"\n' + sites)
    out = _check(config)
    assert out.returncode == 0, out.stderr
    assert "signatures: required ships=0" in out.stdout and "ship_keys_file" not in out.stderr
    # the fleet registry instead: its keys, nothing to warn of; and the registry's stream
    # is carried by every site, never named among a site's own streams
    reg = Registry.init(tmp_path / "registry")
    config.write_text(f'fleet_pub_file = "{reg.directory / "fleet.pub"}"\n' + sites)
    out = _check(config)
    assert out.returncode == 0, out.stderr
    assert "signatures: the fleet registry's keys" in out.stdout and "warning" not in out.stderr
    cfg = load_config(config)
    assert all(s.streams == ("nav", "registry") for s in cfg.sites.values())
    assert all(s.urgent_streams == ("registry",) for s in cfg.sites.values())
    config.write_text(
        f'fleet_pub_file = "{reg.directory / "fleet.pub"}"\n'
        + sites.replace('streams = ["nav"]', 'streams = ["nav", "registry"]')
    )
    with pytest.raises(ConfigError, match="fleet registry's"):
        load_config(config)
