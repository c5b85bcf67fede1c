"""Latest-value snapshots: after a long dark period each key's newest reading reaches
shore ahead of the backlog, as a copy with an identity of its own, taken once per
outage and committed whole, so exactly once holds for copies and originals alike.
Real SQLite logs; the gateway is the in-memory implementation of the seam."""

from __future__ import annotations

import asyncio
import sqlite3
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core_gateway.auth import Credentials
from edge_agent import latest
from edge_agent.agent import Agent
from edge_agent.config import EdgeConfig, load_config
from edge_agent.errors import LogError
from edge_agent.latest import Snapshots
from edge_agent.log import EdgeLog, Incoming, LogRecord
from edge_agent.metrics import EdgeMetrics
from edge_agent.status import open_log
from edge_agent.uplink import Uplink
from local_stack.kafka import KafkaBroker
from local_stack.mosquitto import MosquittoBroker
from shorelink.ranges import RangeSet
from shorelink.snapshot import decode_copy
from tests.core_gateway.helpers import assert_exactly_once, gateway_config, start_gateway
from tests.edge_agent.helpers import Publisher, edge_config_doc
from tests.edge_agent.memory_gateway import MemoryGateway
from tests.edge_agent.uplink_helpers import fill, uplink_config
from tests.helpers import eventually_async, unique, write_toml
from tests.strategies import any_bytes, any_text

STREAMS = {
    "alerts": {"priority": 0},
    "nav": {"priority": 10},
    "containers_latest": {"priority": 20},
    "containers": {"priority": 50, "latest_stream": "containers_latest"},
}
#: fill()'s records were received in November 2023: a backlog far older than an hour
NOW = 1_800_000_000.0


def _config(tmp_path: Path, **streams: dict[str, object]) -> EdgeConfig:
    return uplink_config(
        tmp_path,
        gateways=[("tokyo", "port_wifi"), ("hq", "satellite")],
        streams={**STREAMS, **streams},
        links={"port_wifi": {"batch_max_records": 100}},
    )


def _all(log: EdgeLog, stream: str) -> list[LogRecord]:
    return log.read(stream, 1, 10**9, max_records=10**6)


def _newest_per_key(records: list[LogRecord]) -> dict[str, LogRecord]:
    out: dict[str, LogRecord] = {}
    for r in records:
        out[r.key] = r  # in seq order: the last one wins
    return out


def test_snapshot_copies_each_keys_newest_unsent_reading_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What shore learns first after an outage must be every container's newest
    state, each once, and each copy must say which reading it is (the backlog read
    in many stretches here)."""
    monkeypatch.setattr(latest, "SCAN_SEQS", 64)
    cfg = _config(tmp_path)
    log = open_log(cfg)
    fill(log, "containers", 700)
    log.set_holdings("tokyo", "containers", RangeSet([(1, 100), (699, 700)]))
    metrics = EdgeMetrics()
    snaps = Snapshots(cfg, log, metrics, clock=lambda: NOW).take_due(cfg.links["port_wifi"])
    assert [(s.source, s.target, s.records) for s in snaps] == [
        ("containers", "containers_latest", 5)
    ]
    originals = _all(log, "containers")
    # C0..C6 by seq % 7; seqs 699 (C5) and 700 (C6) are held: those keys' newest is ashore
    unsent = {k: r for k, r in _newest_per_key(originals).items() if r.seq < 699}
    copies = _all(log, "containers_latest")
    assert [c.seq for c in copies] == [1, 2, 3, 4, 5]
    assert {c.key for c in copies} == set(unsent) and len(copies) == len(unsent)
    for c in copies:
        copy = decode_copy(c.payload)
        original = unsent[c.key]
        assert (copy.stream, copy.seq, copy.payload) == (
            "containers",
            original.seq,
            original.payload,
        )
        assert (c.ts_ms, c.topic) == (original.ts_ms, original.topic)
    assert snaps[0].upto == 698 and snaps[0].bytes == sum(len(c.payload) for c in copies)
    assert metrics.latest_records.labels("containers")._value.get() == 5
    log.close()


def test_no_snapshot_for_a_fresh_backlog_nor_over_a_link_that_does_not_carry_it(
    tmp_path: Path,
) -> None:
    """A snapshot costs bytes: only a backlog older than latest_after earns one, and
    only a link that carries the snapshot stream (the satellite does not, by default)."""
    cfg = _config(tmp_path)
    log = open_log(cfg)
    fill(log, "containers", 50)
    fresh = Snapshots(cfg, log, clock=lambda: 1_700_000_000 + 60.0)
    assert fresh.take_due(cfg.links["port_wifi"]) == []
    dark = Snapshots(cfg, log, clock=lambda: NOW)
    assert dark.take_due(cfg.links["satellite"]) == []
    assert _all(log, "containers_latest") == []
    log.close()


def test_snapshot_is_taken_once_per_outage_across_links_and_restarts(tmp_path: Path) -> None:
    """Each link coming up (a port's Wi-Fi drops and returns, the agent restarts)
    must not copy the same readings again: the time and reach of the last snapshot are
    in the log, in its transaction."""
    cfg = _config(tmp_path)
    log = open_log(cfg)
    fill(log, "containers", 70)
    port = cfg.links["port_wifi"]
    assert len(Snapshots(cfg, log, clock=lambda: NOW).take_due(port)) == 1
    assert Snapshots(cfg, log, clock=lambda: NOW + 60).take_due(port) == []
    log.close()
    log = open_log(cfg)  # the agent restarted
    assert Snapshots(cfg, log, clock=lambda: NOW + 120).take_due(port) == []
    assert len(_all(log, "containers_latest")) == 7
    # an hour on, still dark: only keys with a reading newer than the last snapshot
    fill(log, "containers", 2)  # C0, C1 again
    later = Snapshots(cfg, log, clock=lambda: NOW + 3600).take_due(port)
    assert [s.records for s in later] == [2]
    assert {decode_copy(r.payload).seq for r in _all(log, "containers_latest")[7:]} == {71, 72}
    assert Snapshots(cfg, log, clock=lambda: NOW + 7200).take_due(port) == []  # nothing new
    log.close()


def test_snapshot_commits_whole_or_not_at_all(tmp_path: Path) -> None:
    """Copies without the snapshot's time would be copied again at the next link;
    the time without the copies would lose the snapshot: one transaction."""
    cfg = _config(tmp_path)
    log = open_log(cfg)
    fill(log, "containers", 70)
    with sqlite3.connect(cfg.log.path) as conn:  # the snapshot's last write fails
        conn.execute(
            "CREATE TRIGGER fail_latest BEFORE INSERT ON meta WHEN NEW.key LIKE 'latest:%'"
            " BEGIN SELECT RAISE(ABORT, 'disk trouble'); END"
        )
    snapshots = Snapshots(cfg, log, clock=lambda: NOW)
    with pytest.raises(LogError):
        snapshots.take(cfg.stream("containers"), cfg.links["port_wifi"], int(NOW * 1000))
    assert snapshots.take_due(cfg.links["port_wifi"]) == []  # logged, the link goes on
    assert _all(log, "containers_latest") == []
    assert log.stream_state("containers_latest").next_seq == 1
    with sqlite3.connect(cfg.log.path) as conn:
        conn.execute("DROP TRIGGER fail_latest")
    assert [s.records for s in snapshots.take_due(cfg.links["port_wifi"])] == [7]
    assert [r.seq for r in _all(log, "containers_latest")] == list(range(1, 8))
    log.close()


def test_snapshot_keeps_to_its_bounds_newest_keys_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream keyed by something unbounded must not make a snapshot the size of its
    backlog (the bounds made small here: the rule is the same at 20,000 keys)."""
    monkeypatch.setattr(latest, "MAX_LATEST_KEYS", 10)
    monkeypatch.setattr(latest, "MAX_LATEST_BYTES", 1000)
    monkeypatch.setattr(latest, "SCAN_SEQS", 7)
    cfg = _config(tmp_path)
    log = open_log(cfg)
    t0 = 1_700_000_000_000
    log.commit([Incoming("containers", f"K{i}", t0 + i, t0 + i, "t", b"x" * 10) for i in range(45)])
    (snap,) = Snapshots(cfg, log, clock=lambda: NOW).take_due(cfg.links["port_wifi"])
    assert snap.records == 10 and snap.left_out > 0  # (counted among the keys kept in view)
    assert [c.key for c in _all(log, "containers_latest")] == [f"K{i}" for i in range(35, 45)]
    log.commit([Incoming("containers", "big", t0, t0, "t", b"x" * 995)])
    (snap,) = Snapshots(cfg, log, clock=lambda: NOW + 3600).take_due(cfg.links["port_wifi"])
    assert (snap.records, snap.bytes > 995) == (1, True)
    log.close()


async def test_snapshot_uploads_ahead_of_the_backlog_and_every_identity_once(
    tmp_path: Path,
) -> None:
    """The point of it: a port call learns every container's newest state before the
    month's backlog has crossed, and the backlog still arrives whole, once."""
    cfg = _config(tmp_path)
    log = open_log(cfg)
    fill(log, "containers", 1000)
    fill(log, "alerts", 5)
    gw = MemoryGateway("tokyo", "port_wifi", streams=tuple(STREAMS))
    up = Uplink(cfg, log, EdgeMetrics(), asyncio.Event(), gateways=[gw], clock=lambda: NOW)
    taken = threading.Event()  # the snapshot takes as long as the test says
    take_due = up.snapshots.take_due
    up.snapshots.take_due = lambda *a: taken.wait(10) and take_due(*a)  # type: ignore[method-assign]
    syncing = asyncio.create_task(up.sync_once())
    # alerts do not wait for the snapshot; the containers do
    await eventually_async(lambda: gw.held("alerts") == RangeSet([(1, 5)]), within=10)
    assert {r.stream for r in gw.log} == {"alerts"}
    taken.set()
    await syncing
    assert [r.stream for r in gw.log][1] == "containers_latest"
    assert {r.stream for r in gw.log[2:]} == {"containers"}
    assert gw.held("containers_latest") == RangeSet([(1, 7)])
    assert gw.held("containers") == RangeSet([(1, 1000)])
    assert max(gw.arrivals.values()) == 1
    newest = _newest_per_key(_all(log, "containers"))
    held = {
        gw.records["containers_latest"][s].key: gw.records["containers_latest"][s]
        for s in range(1, 8)
    }
    assert {k: decode_copy(r.payload).seq for k, r in held.items()} == {
        k: r.seq for k, r in newest.items()
    }
    up.close()
    log.close()


async def test_no_snapshot_for_a_site_that_does_not_take_its_stream(tmp_path: Path) -> None:
    """Copies a site refuses would wait on board for nothing (a site whose gateway
    does not list the stream): none are taken, and the backlog goes."""
    cfg = _config(tmp_path)
    log = open_log(cfg)
    fill(log, "containers", 100)
    gw = MemoryGateway("tokyo", "port_wifi")  # alerts, nav, containers
    up = Uplink(cfg, log, EdgeMetrics(), asyncio.Event(), gateways=[gw], clock=lambda: NOW)
    await up.sync_once()
    assert gw.held("containers") == RangeSet([(1, 100)])
    assert _all(log, "containers_latest") == []
    up.close()
    log.close()


async def test_agent_snapshot_and_backlog_reach_kafka_each_identity_once(
    tmp_path: Path,
    kafka_sites: Callable[..., dict[str, KafkaBroker]],
    mosquitto: MosquittoBroker,
    publisher: Publisher,
) -> None:
    """The whole way, for real: readings acknowledged over MQTT while no gateway
    answers, then the port's gateway; the copies and the originals land in
    sl.ingress each once, the copies naming each container's newest reading."""
    kafka = kafka_sites("tokyo")["tokyo"]
    gw_cfg = gateway_config(tmp_path / "shore", kafka, site="tokyo")
    gw_cfg = replace(gw_cfg, streams=(*gw_cfg.streams, "containers_latest"))
    ship = unique("ship")
    token = Credentials(gw_cfg.credentials_file).add(ship)
    doc = edge_config_doc(tmp_path, mosquitto)
    doc["ship"] = ship
    doc["streams"]["containers"]["latest_stream"] = "containers_latest"
    doc["streams"]["containers_latest"] = {"priority": 20}
    doc["uplink"] = {
        "token": token,
        "linger": "10ms",
        "retry_min": "20ms",
        "retry_max": "100ms",
        "encode_workers": 0,
    }
    url = f"http://127.0.0.1:{gw_cfg.port}"
    doc["gateways"] = [{"site": "tokyo", "url": url, "link": "port_wifi"}]
    agent = Agent(load_config(write_toml(tmp_path / "edge.toml", doc)))
    assert agent.uplink is not None
    agent.uplink.snapshots.clock = lambda: time.time() + 3600  # an hour dark, at once
    task = asyncio.create_task(agent.run(install_signals=False))
    gw_stop = asyncio.Event()
    gw_task = None
    try:
        await asyncio.wait_for(agent.ingest.connected.wait(), 20)
        await asyncio.to_thread(publisher.readings, 1, 30)  # C0, C1, C2
        await eventually_async(
            lambda: agent.log.stream_state("containers").next_seq == 31, within=10
        )
        gw_task = await start_gateway(gw_cfg, gw_stop)  # in port
        await eventually_async(lambda: agent.log.backlog("containers")[0] == 0, within=30)
        await eventually_async(lambda: agent.log.backlog("containers_latest")[0] == 0, within=10)
    finally:
        agent.stop.set()
        await asyncio.wait_for(task, 15)
        gw_stop.set()
        if gw_task is not None:
            await gw_task
    assert_exactly_once(kafka, ship, 30, "containers")
    assert_exactly_once(kafka, ship, 3, "containers_latest")
    log = open_log(agent.cfg)
    copies = _all(log, "containers_latest")
    assert sorted(decode_copy(r.payload).seq for r in copies) == [28, 29, 30]
    log.close()


_HOSTILE = settings(
    max_examples=20,
    deadline=5000,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@_HOSTILE
@given(
    st.lists(
        st.tuples(
            # what the log can hold of a key: the UTF-8 of an MQTT topic's level
            any_text(40).map(lambda t: t.encode("utf-8", "replace").decode()),
            any_bytes(200),
        ),
        min_size=1,
        max_size=30,
    )
)
def test_hostile_keys_and_payloads_are_copied_exactly(
    tmp_path: Path, readings: list[tuple[str, bytes]]
) -> None:
    """Keys and payloads are whatever sensors sent: every one must come back out of
    its copy unchanged, one copy per key."""
    with tempfile.TemporaryDirectory(dir=tmp_path) as d:
        cfg = _config(Path(d))
        log = open_log(cfg)
        t0 = 1_700_000_000_000
        log.commit(
            [
                Incoming("containers", k, t0 + i, t0 + i, f"t/{i}", p)
                for i, (k, p) in enumerate(readings)
            ]
        )
        Snapshots(cfg, log, clock=lambda: NOW).take_due(cfg.links["port_wifi"])
        copies = _all(log, "containers_latest")
        newest = _newest_per_key(_all(log, "containers"))
        assert sorted(c.key for c in copies) == sorted(newest)
        for c in copies:
            copy = decode_copy(c.payload)
            assert (copy.seq, copy.payload) == (newest[c.key].seq, newest[c.key].payload)
        log.close()
