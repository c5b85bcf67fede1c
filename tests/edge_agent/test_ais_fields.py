"""AIS sentences as fields on the uplink (``uplink.ais_fields``, shorelink/wire_ais.py):
a ship upgraded before its gateway must cost nothing but a refused batch. A gateway
from before the coding refuses it (400 ``bad_version``); the stream goes on with the
sentences as text to that gateway, every record arrives exactly once and byte for byte.
Real SQLite log, real gateway on loopback, real Kafka."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from core_gateway.auth import Credentials
from edge_agent.gateway import HttpGateway
from local_stack.kafka import KafkaBroker
from shorelink import wire
from shorelink.config import Secret
from shorelink.contract import H_ORIGIN, H_SEQ, ingress_topic
from shorelink.kafka.reading import read_to_end
from shorelink.wire import FLAG_AIS
from tests.core_gateway.helpers import assert_exactly_once, gateway_config, start_gateway
from tests.edge_agent.uplink_helpers import fill_ais, open_edge_log, send_all, uplink_config
from tests.helpers import unique

N = 600
#: the satellite's batches (200 records)
LINKS = {"satellite": {"streams": ["*"], "batch_max_records": 200}}


def _payloads(kafka: KafkaBroker, ship: str) -> dict[int, bytes]:
    out = {}
    for m in read_to_end(kafka.endpoint, [ingress_topic("nav")], settled=True):
        h = dict(m.headers() or [])
        if h.get(H_ORIGIN) == ship.encode():
            out[int(h[H_SEQ])] = m.value()
    return out


@pytest.mark.parametrize("old_gateway", [False, True], ids=["gateway-reads-it", "older-gateway"])
async def test_ais_reaches_any_gateway_exactly_once_as_fields_or_as_text(
    tmp_path: Path,
    kafka_sites: Callable[..., dict[str, KafkaBroker]],
    monkeypatch: pytest.MonkeyPatch,
    old_gateway: bool,
) -> None:
    """Three satellite batches of the real AIS sample. A gateway that reads FLAG_AIS
    takes them as fields; one from before (its decoder without the flag) refuses the
    first ones as bad_version and gets the stream as text. Either way every record is
    in sl.ingress once, byte for byte."""
    kafka = kafka_sites("gateway-tests")["gateway-tests"]
    if old_gateway:
        monkeypatch.setattr(wire, "_KNOWN_FLAGS", wire._KNOWN_FLAGS & ~FLAG_AIS)
    ship = unique("ship")
    gw_cfg = gateway_config(tmp_path / "shore", kafka, site="tokyo")
    token = Credentials(gw_cfg.credentials_file).add(ship)
    stop = asyncio.Event()
    gw_task = await start_gateway(gw_cfg, stop)
    cfg = uplink_config(tmp_path, gateways=[("tokyo", "satellite")], links=LINKS)
    cfg = dataclasses.replace(cfg, ship=ship)
    edge_log = open_edge_log(cfg)
    sent = fill_ais(edge_log, "nav", N)
    endpoint = dataclasses.replace(cfg.gateways[0], url=f"http://127.0.0.1:{gw_cfg.port}")
    http = HttpGateway(endpoint, cfg.links["satellite"], ship, Secret(token))
    up = await send_all(cfg, edge_log, http, "nav", (stop, gw_task))
    assert_exactly_once(kafka, ship, N, "nav")
    assert _payloads(kafka, ship) == {i + 1: p for i, p in enumerate(sent)}
    refused = up.metrics.registry.get_sample_value(
        "shorelink_edge_uplink_batches_failed_total",
        {"site": "tokyo", "stream": "nav", "reason": "bad_version"},
    )
    assert (refused or 0) >= 1 if old_gateway else refused is None
