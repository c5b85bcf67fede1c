"""The uplink's configuration: defaults per link class, errors that name the field, and
a token file nobody else can read (every key documented in the sample:
tests/test_config_samples.py)."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from edge_agent.agent import Agent
from edge_agent.config import (
    DEFAULT_LINKS,
    load_config,
    parse_config,
)
from shorelink.config import load_toml
from shorelink.errors import ConfigError
from shorelink.wire import Limits
from tests.edge_agent.uplink_helpers import uplink_config

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "deploy" / "edge" / "edge.toml"


def test_sample_gateways_and_links() -> None:
    cfg = load_config(SAMPLE)
    assert [(g.site, g.link) for g in cfg.gateways] == [
        ("tokyo", "port_wifi"),
        ("hq", "cellular"),
        ("hq", "satellite"),
    ]
    # the sample's satellite is the default one that also carries the ship report
    sat = cfg.links["satellite"]
    assert sat.streams == ("alerts", "agent", "nav")
    assert replace(sat, streams=DEFAULT_LINKS["satellite"].streams) == DEFAULT_LINKS["satellite"]


def test_link_defaults_in_code(tmp_path: Path) -> None:
    """Satellite: alerts and position only, small batches, a budget; the rest: all."""
    cfg = uplink_config(tmp_path)
    sat, cell, wifi = (cfg.links[n] for n in ("satellite", "cellular", "port_wifi"))
    assert sat.streams == ("alerts", "nav") and sat.daily_budget_bytes > 0
    assert (sat.batch_max_records, sat.batch_max_bytes) == (200, 32 * 1024)
    assert not sat.carries("containers") and sat.carries("nav")
    for link in (cell, wifi):
        assert link.carries("containers") and link.daily_budget_bytes == 0
        # large batches, three in flight (pipelined on the upload connection), and never
        # more records than a gateway takes by default
        assert (link.batch_max_records, link.in_flight) == (50_000, 3)
        assert link.batch_max_records <= Limits().max_records
    assert wifi.cost < cell.cost < sat.cost
    assert cfg.gateways == ()  # no gateways: ingest only


def test_link_section_overrides_defaults_field_by_field(tmp_path: Path) -> None:
    cfg = uplink_config(tmp_path, links={"satellite": {"daily_budget_bytes": "5MB"}})
    assert cfg.links["satellite"].daily_budget_bytes == 5_000_000
    assert cfg.links["satellite"].streams == ("alerts", "nav")


def _sample_with(change: dict[str, object]) -> dict[str, object]:
    data = load_toml(SAMPLE)
    for dotted, value in change.items():
        node: object = data
        *parents, last = dotted.split(".")
        for p in parents:
            node = node[int(p)] if p.isdigit() else node[p]  # type: ignore[index]
        node[last] = value  # type: ignore[index]
    return data


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"gateways.0.url": "ftp://gw.example:21"}, "gateways[0].url"),
        ({"gateways.0.url": "https://gw.example:99999"}, "gateways[0].url"),
        ({"gateways.0.link": "carrier_pigeon"}, "gateways[0].link"),
        ({"gateways.0.site": "Tokyo Port"}, "gateways[0].site"),
        ({"gateways.0.sit": "tokyo"}, "gateways[0].sit"),
        ({"links.satellite.streams": ["alerts", "weather"]}, "links.satellite.streams"),
        ({"links.satellite.batch_max_records": 0}, "links.satellite.batch_max_records"),
        ({"links.satellite.batch_max_bytes": "100"}, "links.satellite.batch_max_bytes"),
        ({"links.satellite.timeout": "soon"}, "links.satellite.timeout"),
        ({"links.cellular.in_flight": 0}, "links.cellular.in_flight"),
        ({"uplink.interval": "1ms"}, "uplink.interval"),
        ({"uplink.retry_min": "2m"}, "uplink.retry_min"),
        ({"uplink.tokn": "x"}, "uplink.tokn"),
        ({"uplink.token": "${SHORELINK_TEST_UNSET_VAR}"}, "uplink.token"),
    ],
)
def test_invalid_uplink_config_names_the_field(change: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_config(_sample_with(change))
    assert exc.value.field == field


def test_token_file_must_not_be_world_readable(tmp_path: Path) -> None:
    """The token lets anyone write as this ship: a world-readable file is refused."""
    token = tmp_path / "gateway.token"
    token.write_text("tok-123\n")
    os.chmod(token, 0o644)
    data = _sample_with({"uplink.token_file": str(token)})
    del data["uplink"]["token"]  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="world-readable") as exc:
        parse_config(data)
    assert exc.value.field == "uplink.token_file"
    os.chmod(token, 0o640)  # its group: the agent's own
    cfg = parse_config(data)
    assert cfg.uplink.token.value == "tok-123" and "tok-123" not in repr(cfg)
    # review L10: readable by a group that is not the agent's (here: another gid)
    os.chown(token, -1, os.getegid() + 1)
    with pytest.raises(ConfigError, match="readable by group") as exc:
        parse_config(data)
    assert exc.value.field == "uplink.token_file"


def test_a_config_that_holds_the_token_itself_must_be_as_private_as_a_token_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review L10: a literal ``uplink.token`` in an ``edge.toml`` anyone may read passed
    unchecked. Now that file is held to the token file's rule; a token from the
    environment (``${ENV}``) leaves the file free to be read."""
    literal = SAMPLE.read_text().replace(
        'token = "${SHORELINK_GATEWAY_TOKEN:-}"', 'token = "slk_literal"'
    )
    path = tmp_path / "edge.toml"
    path.write_text(literal)
    path.chmod(0o644)
    with pytest.raises(ConfigError, match="world-readable") as exc:
        load_config(path)
    assert exc.value.field == "uplink.token"
    path.chmod(0o600)
    assert load_config(path).uplink.token.value == "slk_literal"
    monkeypatch.setenv("SHORELINK_GATEWAY_TOKEN", "slk_from_env")
    path.write_text(SAMPLE.read_text())
    path.chmod(0o644)
    assert load_config(path).uplink.token.value == "slk_from_env"


def test_token_file_relative_to_config_and_exclusive_with_token(tmp_path: Path) -> None:
    (tmp_path / "gw.token").write_text("abc")
    os.chmod(tmp_path / "gw.token", 0o600)
    text = SAMPLE.read_text().replace(
        'token = "${SHORELINK_GATEWAY_TOKEN:-}"', 'token_file = "gw.token"'
    )
    (tmp_path / "edge.toml").write_text(text)
    assert load_config(tmp_path / "edge.toml").uplink.token.value == "abc"
    data = _sample_with({"uplink.token": "x", "uplink.token_file": str(tmp_path / "gw.token")})
    with pytest.raises(ConfigError) as exc:
        parse_config(data)
    assert exc.value.field == "uplink.token"
    data = _sample_with({"uplink.token_file": str(tmp_path / "missing.token")})
    del data["uplink"]["token"]  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="cannot read"):
        parse_config(data)


def test_agent_with_gateways_refuses_to_start_without_a_token(tmp_path: Path) -> None:
    cfg = uplink_config(tmp_path, gateways=[("tokyo", "port_wifi")], uplink={"token": ""})
    with pytest.raises(ConfigError) as exc:
        Agent(cfg)
    assert exc.value.field == "uplink.token"
