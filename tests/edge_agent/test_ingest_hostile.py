"""No payload stops ingest: whatever a sensor publishes is stored or quarantined,
counted, and the messages after it are stored. (One ``{"ts": NaN}`` used to kill the
commit task while the process stayed up, and every later message waited forever.)"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sqlite3
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge_agent.agent import Agent
from edge_agent.config import EdgeConfig, load_config
from edge_agent.ingest import Ingest, _Received
from edge_agent.log import CommitResult, EdgeLog, Incoming
from edge_agent.metrics import EdgeMetrics
from edge_agent.quarantine import Quarantined
from edge_agent.rules import MAX_EVENT_MS, MIN_EVENT_MS
from local_stack.mosquitto import MosquittoBroker
from tests.edge_agent.helpers import Publisher, write_config
from tests.edge_agent.test_rules import _levels, _payloads, _topic_for

SAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "edge" / "edge.toml"

HOSTILE = [
    b'{"ts": NaN, "t": 1}',
    b'{"ts": Infinity}',
    b'{"ts": -Infinity}',
    b'{"ts": 1e308}',
    b'{"ts": 1e19}',
    b'{"ts": ' + b"9" * 400 + b"}",  # 10**400-ish
    b'{"ts": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",  # 100,000-deep nesting
    b'{"ts": "9999-12-31T23:59:59-23:59"}',
    b"\xff\xfe not json at all",
]


def _sample_config(db: Path) -> EdgeConfig:
    cfg = load_config(SAMPLE)
    return dataclasses.replace(cfg, log=dataclasses.replace(cfg.log, path=db))


def _received(topic: str, payload: bytes, qos: int = 0, mid: int = 0) -> _Received:
    msg = mqtt.MQTTMessage(mid=mid, topic=topic.encode())
    msg.payload = payload
    msg.qos = qos
    return _Received(1, mqtt.Client(mqtt.CallbackAPIVersion.VERSION2), msg, 1_700_000_000_000, 0.0)


def _counts(db: Path) -> tuple[int, int]:
    with sqlite3.connect(db) as c:
        stored = c.execute("SELECT count(*) FROM records").fetchone()[0]
        quarantined = c.execute("SELECT count(*) FROM quarantine").fetchone()[0]
        bad_ts = c.execute(
            "SELECT count(*) FROM records WHERE ts_ms < ? OR ts_ms >= ?",
            [MIN_EVENT_MS, MAX_EVENT_MS],
        ).fetchone()[0]
    assert bad_ts == 0
    return stored, quarantined


def test_arbitrary_payloads_on_every_sample_rule_are_stored_or_quarantined() -> None:
    """Through the real mapping and the real log (a SQLite file): every message of a
    group is stored or quarantined, and the commit path keeps working afterwards."""
    with tempfile.TemporaryDirectory() as d:
        db = Path(d) / "edge.db"
        cfg = _sample_config(db)
        # keep every quarantined message (the table is bounded by quarantine_max)
        cfg = dataclasses.replace(cfg, log=dataclasses.replace(cfg.log, quarantine_max=10**6))
        edge_log = EdgeLog(db, cfg.ship, cfg.streams, cfg.log)
        ingest = Ingest(cfg, edge_log, EdgeMetrics())
        published = 0

        @settings(
            max_examples=150,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        @given(
            st.lists(
                st.tuples(
                    st.sampled_from([*cfg.rules, None]),
                    _levels(8),
                    _payloads,
                ),
                min_size=1,
                max_size=8,
            )
        )
        def check(messages: list[tuple[object, str, bytes]]) -> None:
            nonlocal published
            batch = [
                _received(_topic_for(rule, level) if rule else f"other/{level}", payload)  # type: ignore[arg-type]
                for rule, level, payload in messages
            ]
            asyncio.run(ingest._process(batch))
            published += len(batch)
            stored, quarantined = _counts(db)
            assert stored + quarantined == published
            assert ingest.stuck_since is None

        check()
        edge_log.close()


class _PoisonedLog(EdgeLog):
    """The real log, except that a payload containing ``poison`` makes its commit fail
    with a non-SQLite error (like an ``OverflowError`` binding an int64): the test is
    about ingest's side of that seam."""

    poison_quarantine = False

    def commit(
        self, batch: Sequence[Incoming], quarantine: Sequence[Quarantined] = (), **kw: Any
    ) -> CommitResult:
        if any(b"poison" in m.payload for m in batch):
            raise OverflowError("Python int too large to convert to SQLite INTEGER")
        if self.poison_quarantine and any(b"poison" in q.payload for q in quarantine):
            raise OverflowError("cannot even quarantine")
        return super().commit(batch, quarantine, **kw)  # derive: the sample's alarms


async def test_a_message_the_log_keeps_refusing_is_quarantined_and_the_rest_of_its_group_stored(
    tmp_path: Path,
) -> None:
    """One poisonous message must cost only itself: the group is retried one by one."""
    db = tmp_path / "edge.db"
    cfg = _sample_config(db)
    edge_log = _PoisonedLog(db, cfg.ship, cfg.streams, cfg.log)
    ingest = Ingest(cfg, edge_log, EdgeMetrics())
    topic = "bigblue/d1/containers/C1/env"
    batch = [_received(topic, p) for p in (b'{"n": 1}', b'{"poison": 1}', b'{"n": 2}')]
    await ingest._process(batch)
    assert [r.payload for r in edge_log.read("containers", 1, 10)] == [b'{"n": 1}', b'{"n": 2}']
    assert [(q.reason, q.payload) for q in edge_log.quarantine.newest()] == [
        ("commit_error", b'{"poison": 1}')
    ]
    assert ingest.metrics.ingest_errors._value.get() >= 1
    assert ingest.healthy()
    await ingest._process([_received(topic, b'{"n": 3}')])
    assert edge_log.stream_state("containers").count == 3
    edge_log.close()


async def test_ingest_that_can_neither_commit_nor_quarantine_stops_feeding_the_watchdog(
    tmp_path: Path,
) -> None:
    """systemd restarts an agent whose ingest is stuck only if ``healthy()`` says so."""
    db = tmp_path / "edge.db"
    cfg = _sample_config(db)
    edge_log = _PoisonedLog(db, cfg.ship, cfg.streams, cfg.log)
    edge_log.poison_quarantine = True
    ingest = Ingest(cfg, edge_log, EdgeMetrics())
    stop = asyncio.Event()
    committer = asyncio.create_task(ingest._commit_loop())
    ingest._committer = committer
    ingest._queue.put_nowait(_received("bigblue/d1/containers/C1/env", b'{"poison": 1}'))
    for _ in range(100):
        if ingest.stuck_since is not None:
            break
        await asyncio.sleep(0.01)
    assert ingest.healthy(max_stuck=60)
    await asyncio.sleep(0.3)
    assert not ingest.healthy(max_stuck=0.2), "stuck for longer than max_stuck"
    committer.cancel()
    stop.set()
    await asyncio.gather(committer, return_exceptions=True)
    assert not ingest.healthy(), "a dead commit task is never healthy"
    edge_log.close()


async def test_hostile_payloads_through_mosquitto_do_not_stop_ingest(
    tmp_path: Path, mosquitto: MosquittoBroker, publisher: Publisher
) -> None:
    """End to end: hostile payloads on a ts_field rule, then normal messages; all are
    stored (with the receive time where the event time is unusable) and the agent
    stays healthy."""
    agent = Agent(load_config(write_config(tmp_path, mosquitto)))
    task = asyncio.create_task(agent.run(install_signals=False))
    await asyncio.wait_for(agent.ingest.connected.wait(), 10)
    topic = "bigblue/d1/containers/C7/env"
    for p in HOSTILE:
        publisher.publish(topic, p)
    normal = [json.dumps({"ts": 1_700_000_000 + i, "n": i}).encode() for i in range(20)]
    for p in normal:
        publisher.publish(topic, p)
    await asyncio.to_thread(publisher.wait_all_acked)
    published = len(HOSTILE) + len(normal)
    for _ in range(200):
        if agent.log.stream_state("containers").count + agent.log.quarantine.count() >= published:
            break
        await asyncio.sleep(0.05)
    recs = agent.log.read("containers", 1, 100)
    assert [r.payload for r in recs] == HOSTILE + normal
    assert [r.ts_ms for r in recs[len(HOSTILE) :]] == [
        (1_700_000_000 + i) * 1000 for i in range(20)
    ]
    assert all(MIN_EVENT_MS <= r.ts_ms < MAX_EVENT_MS for r in recs)
    unusable = agent.metrics.event_time_unusable
    counted = sum(unusable.labels(r)._value.get() for r in ("out_of_range", "too_deep", "not_json"))
    assert counted == len(HOSTILE)
    assert agent.ingest.healthy() and not task.done()
    agent.stop.set()
    await task
