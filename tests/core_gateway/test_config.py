"""Gateway config: the sample is valid and complete; errors name the field."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from core_gateway.config import load_config, parse_config
from shorelink.config import load_toml
from shorelink.errors import ConfigError
from tests.core_gateway.helpers import sample_config


def test_sample_config_is_valid(tmp_path: Path) -> None:
    cfg = load_config(sample_config(tmp_path))
    assert cfg.tls_cert_file is not None and cfg.ssl_context() is not None  # HTTPS
    assert (cfg.site, cfg.port, cfg.streams) == ("tokyo", 8443, ("alerts", "nav", "containers"))
    assert cfg.transactional_id == "shorelink-gateway-tokyo"
    assert cfg.limits.max_compressed_bytes == 8 * 1024 * 1024


@pytest.mark.parametrize(
    ("section", "key", "value", "field"),
    [
        (None, "site", "Tokyo Port", "site"),
        ("listen", "port", 99999, "listen.port"),
        ("listen", "tls_cert_file", "/x.crt", "listen.tls_cert_file"),
        ("limits", "max_batch_bytes", "huge", "limits.max_batch_bytes"),
        ("kafka", "bootstrapp", "x", "kafka.bootstrapp"),
        (None, "streams", [], "streams"),
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
