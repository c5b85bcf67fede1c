"""Dictionaries on the uplink (``uplink.dictionaries_dir``): a ship compresses its
batches with its streams' dictionaries, and a gateway that lacks one must cost nothing
but a refused batch: the stream goes on without a dictionary to that gateway, every
record arrives exactly once. Real SQLite log, real gateway on loopback, real Kafka."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from core_gateway.auth import Credentials
from edge_agent.config import load_config
from edge_agent.gateway import HttpGateway
from edge_agent.metrics import EdgeMetrics
from edge_agent.uplink import Uplink
from local_stack.kafka import KafkaBroker
from shorelink.config import Secret
from shorelink.errors import ConfigError
from shorelink.ranges import RangeSet
from shorelink.wire import Batch, WireRecord, encode_batch
from shorelink.wire_dict import Dictionary, train, training_samples
from tests.core_gateway.helpers import assert_exactly_once, gateway_config, start_gateway
from tests.edge_agent.memory_gateway import MemoryGateway
from tests.edge_agent.uplink_helpers import fill, open_edge_log, send_all, uplink_config
from tests.helpers import eventually_async, unique, write_toml

N = 1000
#: the satellite's batches (200 records), carrying containers here
LINKS = {"satellite": {"streams": ["*"], "batch_max_records": 200}}


def _like_fill(lo: int, hi: int) -> list[WireRecord]:
    """Records shaped as tests.edge_agent.uplink_helpers.fill makes them (another
    stretch of the same stream: what headquarters trained on)."""
    return [
        WireRecord(
            i + 1,
            f"C{i % 7}",
            1_700_000_000_000 + i,
            f"bigblue/d1/containers/C{i % 7}/env",
            f"containers-{i:08d}".encode().ljust(100, b"."),
        )
        for i in range(lo, hi)
    ]


def _dictionary(directory: Path) -> Dictionary:
    d = train("containers", training_samples(_like_fill(50_000, 54_000), 200), dict_id=50_001)
    directory.mkdir(parents=True, exist_ok=True)
    d.write(directory)
    return d


def _sample(metrics: EdgeMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


async def _deliver(
    tmp_path: Path, kafka: KafkaBroker, *, gateway_holds_it: bool, encode_workers: int = 0
) -> tuple[Uplink, str, Dictionary]:
    """Fill a ship's log with N containers records, send them over the satellite to a
    real gateway (holding the ship's dictionary or not) until the site holds them all."""
    ship = unique("ship")
    d = _dictionary(tmp_path / "dicts")
    gw_cfg = gateway_config(tmp_path / "shore", kafka, site="tokyo")
    if gateway_holds_it:
        gw_cfg = dataclasses.replace(gw_cfg, dictionaries_dir=tmp_path / "dicts")
    token = Credentials(gw_cfg.credentials_file).add(ship)
    stop = asyncio.Event()
    gw_task = await start_gateway(gw_cfg, stop)
    cfg = uplink_config(
        tmp_path,
        gateways=[("tokyo", "satellite")],
        links=LINKS,
        uplink={"dictionaries_dir": str(tmp_path / "dicts"), "encode_workers": encode_workers},
    )
    cfg = dataclasses.replace(cfg, ship=ship)
    edge_log = open_edge_log(cfg)
    fill(edge_log, "containers", N)
    endpoint = dataclasses.replace(cfg.gateways[0], url=f"http://127.0.0.1:{gw_cfg.port}")
    http = HttpGateway(endpoint, cfg.links["satellite"], ship, Secret(token))
    up = await send_all(cfg, edge_log, http, "containers", (stop, gw_task))
    assert_exactly_once(kafka, ship, N, "containers")
    return up, ship, d


async def test_a_gateway_without_the_dictionary_gets_the_stream_without_it_exactly_once(
    tmp_path: Path, kafka_sites: Callable[..., dict[str, KafkaBroker]]
) -> None:
    """The gateway refuses the first batch (422 unknown_dictionary); the ship sends the
    stream again without a dictionary from what the site holds: nothing stuck, nothing
    lost, nothing twice, and the fallback counted once."""
    kafka = kafka_sites("gateway-tests")["gateway-tests"]
    up, _, _ = await _deliver(tmp_path, kafka, gateway_holds_it=False)
    fallbacks = "shorelink_edge_uplink_dictionary_fallbacks_total"
    assert _sample(up.metrics, fallbacks, site="tokyo", stream="containers") == 1
    refused = _sample(
        up.metrics,
        "shorelink_edge_uplink_batches_failed_total",
        site="tokyo",
        stream="containers",
        reason="unknown_dictionary",
    )
    assert refused >= 1


@pytest.mark.parametrize("encode_workers", [0, 1], ids=["thread", "child-process"])
async def test_a_gateway_holding_the_dictionary_takes_the_smaller_batches(
    tmp_path: Path, kafka_sites: Callable[..., dict[str, KafkaBroker]], encode_workers: int
) -> None:
    """What the dictionary is for: the satellite carries fewer bytes for the same
    records, and the gateway decodes them (exactly once in Kafka); the batch builder's
    child process loads the dictionaries too."""
    kafka = kafka_sites("gateway-tests")["gateway-tests"]
    up, ship, _ = await _deliver(
        tmp_path, kafka, gateway_holds_it=True, encode_workers=encode_workers
    )
    fallbacks = "shorelink_edge_uplink_dictionary_fallbacks_total"
    assert _sample(up.metrics, fallbacks, site="tokyo", stream="containers") == 0
    sent = _sample(up.metrics, "shorelink_edge_uplink_bytes_sent_total", link="satellite")
    records = [
        WireRecord(r.seq, r.key, r.ts_ms, r.topic, r.payload)
        for r in up.log.read("containers", 1, N, max_records=N, max_bytes=1 << 30)
    ]
    plain = sum(
        len(encode_batch(Batch(ship, "containers", tuple(records[lo : lo + 200]))))
        for lo in range(0, N, 200)
    )
    assert 0 < sent < 0.8 * plain


def test_check_config_names_the_dictionaries_dir_when_a_file_is_no_dictionary(
    tmp_path: Path,
) -> None:
    (tmp_path / "dicts").mkdir()
    (tmp_path / "dicts" / "containers-50001.zdict").write_bytes(b"not a dictionary")
    cfg = uplink_config(tmp_path)
    path = write_toml(
        tmp_path / "edge.toml",
        {
            "ship": cfg.ship,
            "log": {"path": str(tmp_path / "edge.db")},
            "streams": {"containers": {"priority": 50}},
            "rules": [{"filter": "a/+", "stream": "containers", "key": "{2}"}],
            "uplink": {"dictionaries_dir": "dicts"},
        },
    )
    try:
        load_config(path)
    except ConfigError as exc:
        assert exc.field == "uplink.dictionaries_dir"
        assert "containers-50001.zdict" in str(exc)
    else:
        raise AssertionError("a file that is no dictionary was taken")


async def test_a_refused_dictionary_costs_at_most_the_window_and_every_record_arrives_once(
    tmp_path: Path,
) -> None:
    """Pipelined (three batches in flight): every batch in flight when the first refusal
    comes back is refused too; the stream starts again from what the site holds, without
    a dictionary, and no record is written twice or left behind. The in-memory gateway
    (the seam's contract: tests/edge_agent/test_gateway.py) lets the test count batches."""
    _dictionary(tmp_path / "dicts")
    cfg = uplink_config(
        tmp_path,
        gateways=[("tokyo", "port_wifi")],
        links={"port_wifi": {"batch_max_records": 50, "in_flight": 3}},
        uplink={"dictionaries_dir": str(tmp_path / "dicts")},
    )
    edge_log = open_edge_log(cfg)
    fill(edge_log, "containers", 600)
    gw = MemoryGateway("tokyo", "port_wifi", latency=0.01)
    up = Uplink(cfg, edge_log, EdgeMetrics(), asyncio.Event(), gateways=[gw])
    stop = asyncio.Event()
    task = asyncio.create_task(up.run(stop))
    try:
        await eventually_async(
            lambda: gw.held("containers") == RangeSet([(1, 600)]), 30, "all delivered"
        )
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        up.builder.close()
    refused = [r for r in gw.log if r.outcome == "rejected"]
    assert 1 <= len(refused) <= 3
    assert max(gw.arrivals.values()) == 1 and not gw.resent_after_confirm
    fallbacks = "shorelink_edge_uplink_dictionary_fallbacks_total"
    assert _sample(up.metrics, fallbacks, site="tokyo", stream="containers") == 1
    # and for the rest of the agent's run, that gateway gets the stream without one
    assert up._no_dictionary[gw.url] == {"containers"}
