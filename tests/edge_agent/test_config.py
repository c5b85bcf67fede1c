"""Config errors name the bad field: a ship's operator fixing a config at sea has no
one to ask what 'invalid value' means."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from edge_agent.config import load_config, parse_config
from shorelink.config import load_toml
from shorelink.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "deploy" / "edge" / "edge.toml"


def test_sample_config_is_valid() -> None:
    """(That the sample names every key: tests/test_config_samples.py.)"""
    cfg = load_config(SAMPLE)
    assert cfg.ship == "bigblue"
    assert [s.name for s in cfg.by_priority()] == [
        "alerts",
        "agent",
        "nav",
        "containers_latest",
        "containers",
    ]
    assert cfg.stream("containers").latest_stream == "containers_latest"
    assert cfg.stream("containers").latest_after_s == 3600.0
    assert (cfg.report.stream, cfg.report.interval_s) == ("agent", 600.0)
    assert cfg.log.group_commit_s == pytest.approx(0.005)


def _with(change: dict[str, object]) -> dict[str, object]:
    data = load_toml(SAMPLE)
    for dotted, value in change.items():
        node = data
        *parents, last = dotted.split(".")
        for p in parents:
            node = node[p] if not p.isdigit() else node[int(p)]  # type: ignore[index]
        if value is None:
            del node[last]  # type: ignore[attr-defined]
        else:
            node[last] = value  # type: ignore[index]
    return data


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"ship": "Big Blue"}, "ship"),
        ({"streams.alerts.on_full": "drop_oldest"}, "streams.alerts.on_full"),
        ({"streams.nav.on_full": "sometimes"}, "streams.nav.on_full"),
        ({"streams.nav.max_bytes": "lots"}, "streams.nav.max_bytes"),
        ({"mqtt.port": 70000}, "mqtt.port"),
        ({"mqtt.prot": 1883}, "mqtt.prot"),
        ({"log.group_commit": "5s"}, "log.group_commit"),
        ({"log.alerts_reserve_bytes": "3GB"}, "log.alerts_reserve_bytes"),
        ({"mqtt.password": "${SHORELINK_TEST_UNSET_VAR}"}, "mqtt.password"),
        ({"ship": None}, "ship"),
        # over the record limit of every hop (MAX_RECORD_BYTES): the shore could not take it
        ({"mqtt.max_payload_bytes": "2MiB"}, "mqtt.max_payload_bytes"),
        # a reconnect wait of 0 reconnected in a tight loop while the broker was away
        ({"mqtt.reconnect_min": "0s"}, "mqtt.reconnect_min"),
        ({"mqtt.reconnect_min": "1m", "mqtt.reconnect_max": "1s"}, "mqtt.reconnect_min"),
        # a snapshot goes to another configured stream sent ahead of its source
        ({"streams.containers.latest_stream": "weather"}, "streams.containers.latest_stream"),
        ({"streams.containers.latest_stream": "alerts"}, "streams.containers.latest_stream"),
        ({"streams.containers.latest_stream": "containers"}, "streams.containers.latest_stream"),
        ({"streams.containers_latest.priority": 60}, "streams.containers.latest_stream"),
        ({"streams.nav.latest_stream": "containers_latest"}, "streams.nav.latest_stream"),
        ({"streams.containers.latest_after": "0s"}, "streams.containers.latest_after"),
    ],
)
def test_invalid_config_names_the_field(change: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_config(_with(change))
    assert exc.value.field == field


def test_rule_naming_unknown_stream_is_an_error() -> None:
    data = load_toml(SAMPLE)
    data["rules"][0]["stream"] = "weather"
    with pytest.raises(ConfigError, match=r"rules\[0\]\.stream"):
        parse_config(data)


def test_secret_comes_from_env_and_never_prints(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHORELINK_MQTT_PASSWORD", "hunter2")
    cfg = load_config(SAMPLE)
    assert cfg.mqtt.password.value == "hunter2"
    assert "hunter2" not in repr(cfg) and "hunter2" not in str(cfg.mqtt)


def test_check_config_cli(tmp_path: Path) -> None:
    ok = subprocess.run(
        [sys.executable, "-m", "edge_agent.cli", "check-config", str(SAMPLE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0 and "ship=bigblue" in ok.stdout
    bad = tmp_path / "bad.toml"
    bad.write_text(SAMPLE.read_text().replace('ship = "bigblue"', 'ship = "BAD NAME"'))
    res = subprocess.run(
        [sys.executable, "-m", "edge_agent.cli", "check-config", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2 and "ship:" in res.stderr


@pytest.mark.parametrize(
    "url",
    ["http://gw.tokyo.example.net:8443", "http://10.0.0.7:8080", "http://[2001:db8::1]:80"],
)
def test_plain_http_to_a_remote_gateway_is_refused(url: str) -> None:
    """A bearer token sent over plain http on a satellite or cellular link can be read
    by anyone on the path: TLS is required unless the operator opts out explicitly."""
    with pytest.raises(ConfigError) as exc:
        parse_config(_with({"gateways.0.url": url}))
    assert exc.value.field == "gateways[0].url"
    assert "allow_plaintext" in str(exc.value)


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:8443", "http://127.3.2.1:80", "http://[::1]:8443", "http://localhost:1"],
)
def test_plain_http_to_this_machine_is_accepted(url: str) -> None:
    cfg = parse_config(_with({"gateways.0.url": url}))
    assert cfg.gateways[0].url == url and not cfg.gateways[0].allow_plaintext


def test_plaintext_opt_out_is_accepted_and_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="edge_agent.config")
    cfg = parse_config(
        _with(
            {"gateways.0.url": "http://gw.tokyo.example.net:80", "gateways.0.allow_plaintext": True}
        )
    )
    assert cfg.gateways[0].allow_plaintext
    warned = [r for r in caplog.records if "event=gateway_plaintext" in r.getMessage()]
    assert len(warned) == 1 and "clear text" in warned[0].getMessage()
    # https needs no opt-out, and is not warned about
    caplog.clear()
    parse_config(_with({}))
    assert not [r for r in caplog.records if "gateway_plaintext" in r.getMessage()]
