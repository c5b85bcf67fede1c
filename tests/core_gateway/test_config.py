"""Gateway config: the sample is valid and complete; errors name the field."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from core_gateway.config import load_config, parse_config
from shorelink.config import load_toml
from shorelink.errors import ConfigError
from shorelink.fleet.log import Registry
from tests.core_gateway.helpers import sample_config


def test_sample_config_is_valid(tmp_path: Path) -> None:
    cfg = load_config(sample_config(tmp_path))
    assert cfg.tls_cert_file is not None and cfg.ssl_context() is not None  # HTTPS
    assert (cfg.site, cfg.port, cfg.streams) == (
        "tokyo",
        8443,
        ("alerts", "nav", "containers", "containers_latest"),
    )
    assert cfg.transactional_id == "shorelink-gateway-tokyo"
    assert cfg.limits.max_compressed_bytes == 8 * 1024 * 1024
    # metrics on loopback, on a port of their own, not on the ships' port
    assert (cfg.metrics_host, cfg.metrics_port, cfg.metrics_on_ships_port) == (
        "127.0.0.1",
        9465,
        False,
    )


@pytest.mark.parametrize(
    ("section", "key", "value", "field"),
    [
        (None, "site", "Tokyo Port", "site"),
        ("listen", "port", 99999, "listen.port"),
        ("listen", "tls_cert_file", "/x.crt", "listen.tls_cert_file"),
        ("limits", "max_batch_bytes", "huge", "limits.max_batch_bytes"),
        ("kafka", "bootstrapp", "x", "kafka.bootstrapp"),
        # a CA that is not there: named at load, not by librdkafka at the first connection
        ("kafka", "ca_file", "/nonexistent/ca.pem", "kafka.ca_file"),
        (None, "streams", [], "streams"),
        # metrics share no port with ships
        ("metrics", "port", 8443, "metrics.port"),
        ("metrics", "on_ships_port", "yes", "metrics.on_ships_port"),
    ],
)
def test_invalid_config_names_the_field(
    section: str | None, key: str, value: object, field: str, tmp_path: Path
) -> None:
    data = load_toml(sample_config(tmp_path))
    (data[section] if section else data)[key] = value
    with pytest.raises(ConfigError) as exc:
        parse_config(data)
    assert exc.value.field == field


def test_check_config_cli(tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "core_gateway.cli", "check-config", str(sample_config(tmp_path))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0 and "site=tokyo" in res.stdout
    assert "metrics=127.0.0.1:9465" in res.stdout  # where Prometheus and probes go


def test_env_stands_for_a_number_a_flag_a_size_or_a_duration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review (ecosystem): ``${ENV}`` worked only in string keys; a container sets the
    port from its environment. The whole value may be one; a value that is not what
    the key takes is named by its field, with what it came from."""
    monkeypatch.setenv("SL_TEST_PORT", "8444")
    monkeypatch.setenv("SL_TEST_BATCH", "4MiB")
    data = load_toml(sample_config(tmp_path))
    data["listen"]["port"] = "${SL_TEST_PORT}"  # type: ignore[index]
    data["limits"]["max_batch_bytes"] = "${SL_TEST_BATCH}"  # type: ignore[index]
    data["listen"]["idle_timeout"] = "${SL_TEST_IDLE:-45s}"  # type: ignore[index]
    cfg = parse_config(data)
    assert (cfg.port, cfg.limits.max_compressed_bytes) == (8444, 4 * 1024 * 1024)
    assert cfg.idle_timeout_s == 45
    monkeypatch.setenv("SL_TEST_PORT", "eighty")
    with pytest.raises(ConfigError) as exc:
        parse_config(data)
    assert exc.value.field == "listen.port" and "'eighty' (from ${SL_TEST_PORT})" in str(exc.value)
    monkeypatch.delenv("SL_TEST_PORT")
    with pytest.raises(ConfigError, match="SL_TEST_PORT is not set"):
        parse_config(data)


def test_a_gateway_names_either_the_registry_or_its_files(tmp_path: Path) -> None:
    """A gateway following the fleet registry takes tokens and keys from it alone: a
    files left beside it would be a second, silent source of who may upload."""
    reg = Registry.init(tmp_path / "registry")
    data = load_toml(sample_config(tmp_path))
    data["fleet_pub_file"] = str(reg.directory / "fleet.pub")
    with pytest.raises(ConfigError) as exc:
        parse_config(data)
    assert exc.value.field == "fleet_pub_file"
    del data["credentials_file"], data["ship_keys_file"]
    cfg = parse_config(data)
    assert (cfg.credentials_file, cfg.ship_keys_file) == (None, None)
    del data["fleet_pub_file"]
    with pytest.raises(ConfigError) as exc:
        parse_config(data)
    assert exc.value.field == "credentials_file"
    data["fleet_pub_file"] = str(tmp_path / "nothing.pub")
    with pytest.raises(ConfigError) as exc:
        parse_config(data)
    assert exc.value.field == "fleet_pub_file"
