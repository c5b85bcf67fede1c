"""Alarm rules (edge_agent/alarms.py): the ship raises an alert itself, once, from the
readings it commits; the alert crosses the satellite link first.

The pure engine is tested on its own (hypothesis); the promises that need the log are
tested through the real ingest, the real SQLite log and a real Mosquitto.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import sqlite3
import threading
import time
import tomllib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

from edge_agent.agent import Agent
from edge_agent.alarms import Alarm, AlarmState, Alert, evaluate
from edge_agent.config import EdgeConfig, load_config, parse_config
from edge_agent.ingest import Ingest
from edge_agent.log import EdgeLog, Incoming, message_digest
from edge_agent.metrics import EdgeMetrics
from local_stack.mosquitto import MosquittoBroker
from shorelink.errors import ConfigError
from shorelink.ranges import RangeSet
from tests.edge_agent.helpers import AgentProcess, Publisher, edge_config_doc
from tests.edge_agent.memory_gateway import MemoryGateway
from tests.helpers import eventually, eventually_async, write_toml

T0 = 1_700_000_000_000  # event times of the readings, ms
HOUR = 3_600_000
ENV = "bigblue/deck{}/containers/{}/env"

OVERBOARD = """
[[alarms]]
name = "overboard"
filter = "bigblue/+/containers/+/env"
key = "{4}"
field = "shock"
above = 10.0
silence = "2h"

[[alarms]]
name = "warm"
filter = "bigblue/+/containers/+/env"
field = "temp"
above = 8.0
"""


# -- the pure engine ------------------------------------------------------------------------
@dataclass(frozen=True)
class R:
    topic: str
    key: str
    ts_ms: int
    payload: bytes


def reading(container: str, ts_ms: int, **fields: Any) -> R:
    return R(
        ENV.format(1, container), container, ts_ms, json.dumps({"ts": ts_ms, **fields}).encode()
    )


def alarms(extra: str = "") -> tuple[Alarm, ...]:
    return _config(OVERBOARD + extra).alarms


def _config(
    alarms_toml: str,
    *,
    streams: Sequence[str] = ("alerts", "containers"),
    log: dict[str, str] | None = None,
) -> EdgeConfig:
    data: dict[str, Any] = {
        "ship": "bigblue",
        "log": log or {},
        "streams": {s: {} for s in streams},
        "rules": [{"filter": "bigblue/+/containers/+/env", "stream": "containers", "key": "{4}"}],
        **tomllib.loads(alarms_toml),
    }
    return parse_config(data)


def run(
    alarm_set: Sequence[Alarm], groups: Sequence[Sequence[R]], state: AlarmState | None = None
) -> list[Alert]:
    """Evaluate group after group, applying each group's changes (as a commit does)."""
    state = state if state is not None else AlarmState()
    out: list[Alert] = []
    for g in groups:
        ev = evaluate(alarm_set, state, g)
        state.apply(ev.changes)
        out += ev.alerts
    return out


def test_threshold_alarm_is_raised_once_per_crossing_and_rearmed_within_bounds() -> None:
    """Edge-triggered: a reefer that stays warm for a day raises one alert, not 1,440."""
    got = run(
        alarms(),
        [
            [
                reading("C1", T0, temp=5),
                reading("C1", T0 + 1, temp=9),
                reading("C1", T0 + 2, temp=12),
            ],
            [reading("C1", T0 + 3, temp=9.5), reading("C1", T0 + 4, temp=7)],  # back within
            [reading("C1", T0 + 5, temp=8.5), reading("C2", T0 + 6, temp=30)],
        ],
    )
    assert [(a.alarm, a.key, a.ts_ms, a.value) for a in got] == [
        ("warm", "C1", T0 + 1, 9.0),
        ("warm", "C1", T0 + 5, 8.5),
        ("warm", "C2", T0 + 6, 30.0),
    ]
    body = json.loads(got[0].payload)
    assert body == {
        "alarm": "warm",
        "key": "C1",
        "field": "temp",
        "value": 9.0,
        "ts": T0 + 1,
        "topic": ENV.format(1, "C1"),
        "kind": "threshold",
        "silence_s": None,
    }
    assert got[0].topic == "shorelink/alarm/warm"
    assert b" " not in got[0].payload  # compact


def test_silence_fires_once_per_key_when_other_keys_event_time_passes_the_deadline() -> None:
    """The overboard container: one shock, then nothing; the others' clock tells."""
    groups = [
        [reading("C1", T0, shock=0.1), reading("C2", T0, shock=0.1)],
        [reading("C1", T0 + 60_000, shock=14.5)],  # the spike, then silence
        [reading("C2", T0 + k * 60_000, shock=0.1) for k in range(2, 121)],  # < 2 h later
    ]
    assert run(alarms(), groups) == []
    later = [reading("C2", T0 + 60_000 + 2 * HOUR + 1, shock=0.1)]
    state = AlarmState()
    got = run(alarms(), [*groups, later], state)
    assert [(a.alarm, a.kind, a.key, a.ts_ms, a.value) for a in got] == [
        ("overboard", "silence", "C1", T0 + 60_000, 14.5)
    ]
    body = json.loads(got[0].payload)
    assert body["silence_s"] == 7200.0 and body["topic"] == ENV.format(1, "C1")
    # once: more readings past the deadline raise nothing more
    assert run(alarms(), [[reading("C2", T0 + 5 * HOUR, shock=0.1)]], state) == []


def test_silence_does_not_fire_when_the_key_keeps_reporting() -> None:
    """A container knocked by a crane (shock) that goes on reporting is not lost."""
    groups = [
        [reading("C1", T0, shock=20.0)],
        [reading("C1", T0 + 30 * 60_000, shock=0.1)],  # reported again within 2 h
        [reading("C2", T0 + k * HOUR, shock=0.1) for k in range(1, 10)],
    ]
    assert run(alarms(), groups) == []


def test_silence_ignores_a_payload_without_the_field_for_the_condition_but_counts_it_as_life() -> (
    None
):
    groups = [
        [reading("C1", T0, shock=20.0)],
        [R(ENV.format(1, "C1"), "C1", T0 + 1000, b"not json")],  # the container is still there
        [reading("C2", T0 + 3 * HOUR, shock=0.1)],
    ]
    assert run(alarms(), groups) == []


# A model of the threshold alarm: per key, one alert per crossing from within bounds.
def _model_threshold(
    values: list[tuple[str, float | None]], above: float
) -> list[tuple[str, float]]:
    tripped: set[str] = set()
    out = []
    for k, v in values:
        if v is None:
            continue
        if v > above and k not in tripped:
            tripped.add(k)
            out.append((k, v))
        elif v <= above:
            tripped.discard(k)
    return out


_values = st.one_of(
    st.none(),
    st.floats(allow_nan=False, allow_infinity=False, min_value=-50, max_value=50),
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["C1", "C2", "C3"]), _values), max_size=60),
    st.lists(st.integers(min_value=1, max_value=10), max_size=20),
)
def test_threshold_alerts_match_the_model_however_the_readings_are_grouped(
    values: list[tuple[str, float | None]], cuts: list[int]
) -> None:
    """Group commit cuts the stream anywhere: the alerts must not depend on where."""
    readings = [
        reading(k, T0 + i) if v is None else reading(k, T0 + i, temp=v)
        for i, (k, v) in enumerate(values)
    ]
    groups: list[list[R]] = []
    rest = readings
    for c in cuts:
        groups.append(rest[:c])
        rest = rest[c:]
    groups.append(rest)
    got = run(alarms(), groups)
    assert [(a.key, a.value) for a in got] == _model_threshold(values, 8.0)
    assert run(alarms(), [readings]) == got


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["C1", "C2", "C3", "C4"]),
            st.integers(min_value=0, max_value=30),  # minutes since the previous reading
            st.sampled_from([0.1, 20.0]),
        ),
        max_size=60,
    ),
    st.lists(st.integers(min_value=1, max_value=10), max_size=20),
)
def test_silence_alerts_match_the_model_however_the_readings_are_grouped(
    steps: list[tuple[str, int, float]], cuts: list[int]
) -> None:
    """Every alert is a shock followed by no reading of its key for 2 h of event time,
    at most one per shock, never for a key that reported again in time."""
    silence = 240_000
    cfg = _config(
        """
[[alarms]]
name = "lost"
filter = "bigblue/+/containers/+/env"
field = "shock"
above = 10.0
silence = "4m"
"""
    )
    ts = T0
    readings = []
    for k, gap, shock in steps:
        ts += gap * 60_000 // 4
        readings.append(reading(k, ts, shock=shock))
    groups: list[list[R]] = []
    rest = readings
    for c in cuts:
        groups.append(rest[:c])
        rest = rest[c:]
    groups.append(rest)
    got = run(cfg.alarms, groups)
    assert sorted(map(repr, run(cfg.alarms, [readings]))) == sorted(map(repr, got))

    def shock(r: R) -> bool:
        return bool(json.loads(r.payload)["shock"] > 10)

    # the model, per shock: the first later reading decides: one past the deadline
    # raises it (the key stayed silent); a reading of the key before that ends it (a
    # newer shock takes over; another reading shows the container is there)
    expected = []
    for i, r in enumerate(readings):
        if not shock(r):
            continue
        for later in readings[i + 1 :]:
            if later.ts_ms > r.ts_ms + silence:
                expected.append((r.key, r.ts_ms))
                break
            if later.key == r.key and (shock(later) or later.ts_ms > r.ts_ms):
                break
    assert sorted((a.key, a.ts_ms) for a in got) == sorted(expected)


def test_a_reading_without_a_usable_event_time_keeps_its_key_alive_but_moves_no_clock() -> None:
    """Its time is the ship's receive time, not comparable with sensors' event times: a
    sensor with a broken clock must neither fire every pending silence nor start one."""
    c1 = reading("C1", T0, shock=20.0)
    broken = reading("C2", T0 + 10 * HOUR, shock=20.0)  # ts: the receive time
    ev = evaluate(alarms(), AlarmState(), [c1, broken], unclocked={broken})
    assert ev.alerts == []
    assert [k for (a, k), ep in ev.changes.items() if ep is not None] == ["C1"]
    alive = reading("C1", T0 - HOUR, shock=0.1)
    ev = evaluate(alarms(), AlarmState(), [c1, alive], unclocked={alive})
    assert all(ep is None for ep in ev.changes.values())


_hostile_values = st.one_of(
    st.floats(),  # NaN, infinities
    st.integers(min_value=-(10**400), max_value=10**400),
    st.text(max_size=20),
    st.booleans(),
    st.none(),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=3),
)


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.binary(max_size=200),
        _hostile_values.map(lambda v: json.dumps({"shock": v, "temp": v}).encode()),
    )
)
def test_no_payload_escapes_the_engine_and_only_finite_numbers_match(payload: bytes) -> None:
    """Whatever a sensor publishes, evaluate returns: an alert only for a finite number."""
    ev = evaluate(alarms(), AlarmState(), [R(ENV.format(1, "C1"), "C1", T0, payload)])
    for a in ev.alerts:
        assert math.isfinite(a.value)
        json.loads(a.payload)  # always valid JSON


def test_deep_nesting_and_a_huge_integer_are_not_matched() -> None:
    deep = b'{"temp":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    huge = b'{"temp": 1' + b"0" * 5000 + b"}"
    big = b'{"temp": 1' + b"0" * 400 + b"}"
    ev = evaluate(
        alarms(), AlarmState(), [R(ENV.format(1, "C1"), "C1", T0, p) for p in (deep, huge, big)]
    )
    assert ev.alerts == [] and ev.changes == {}


@pytest.mark.parametrize(
    ("toml", "field", "streams"),
    [
        (
            '[[alarms]]\nname="a"\nfilter="x/#"\nfield="v"\nabove=1\n',
            "alarms[0].name",
            ("containers",),
        ),
        ('[[alarms]]\nname="A b"\nfilter="x/#"\nfield="v"\nabove=1\n', "alarms[0].name", None),
        ('[[alarms]]\nname="a"\nfilter="x/#"\nfield="v"\n', "alarms[0].above", None),
        (
            '[[alarms]]\nname="a"\nfilter="x/#"\nfield="v"\nabove=1\nbelow=2\n',
            "alarms[0].below",
            None,
        ),
        ('[[alarms]]\nname="a"\nfilter="x/#"\nfield="v"\nabove="1"\n', "alarms[0].above", None),
        ('[[alarms]]\nname="a"\nfilter="x/#"\nfield="v"\nabove=nan\n', "alarms[0].above", None),
        (
            '[[alarms]]\nname="a"\nfilter="x/#"\nfield="v"\nabove=1\nsilence="0s"\n',
            "alarms[0].silence",
            None,
        ),
        ('[[alarms]]\nname="a"\nfilter="x/#/y"\nfield="v"\nabove=1\n', "alarms[0].filter", None),
        ('[[alarms]]\nname="a"\nfilter="x/#"\nfield="v.."\nabove=1\n', "alarms[0].field", None),
        (
            '[[alarms]]\nname="a"\nfilter="x/#"\nfield="v"\nabove=1\nkey="{0}"\n',
            "alarms[0].key",
            None,
        ),
        (
            '[[alarms]]\nname="a"\nfilter="x/#"\nfield="v"\nabove=1\nbogus=1\n',
            "alarms[0].bogus",
            None,
        ),
        (
            '[[alarms]]\nname="a"\nfilter="x/#"\nfield="v"\nabove=1\n'
            '[[alarms]]\nname="a"\nfilter="y/#"\nfield="v"\nbelow=1\n',
            "alarms[1].name",
            None,
        ),
    ],
)
def test_a_bad_alarm_is_a_config_error_naming_the_field(
    toml: str, field: str, streams: Sequence[str] | None
) -> None:
    """check-config names the field; an alarm without an alerts stream could raise nothing."""
    with pytest.raises(ConfigError) as err:
        _config(toml, streams=streams or ("alerts", "containers"))
    assert err.value.field == field


# -- through the real ingest and log --------------------------------------------------------
def _incoming(
    container: str, ts_ms: int, mid: int = 0, dup: bool = False, **fields: Any
) -> Incoming:
    topic = ENV.format(1, container)
    payload = json.dumps({"ts": ts_ms, **fields}).encode()
    return Incoming(
        "containers",
        container,
        ts_ms,
        ts_ms,
        topic,
        payload,
        mid=mid,
        dup=dup,
        digest=message_digest(topic.encode(), payload),
    )


class _Ship:
    """An ingest over a real log file, its commit path driven directly (no broker)."""

    def __init__(self, tmp_path: Path) -> None:
        self.cfg = _config(OVERBOARD, log={"path": str(tmp_path / "edge.db")})
        self.open()

    def open(self) -> None:
        self.log = EdgeLog(self.cfg.log.path, "bigblue", self.cfg.streams, self.cfg.log)
        self.metrics = EdgeMetrics()
        self.ingest = Ingest(self.cfg, self.log, self.metrics)

    def restart(self) -> None:
        self.log.close()
        self.open()

    def commit(self, *batch: Incoming) -> None:
        asyncio.run(self.ingest._commit_with_retry(list(batch), []))

    def alerts(self) -> list[tuple[str, dict[str, Any]]]:
        return [(r.key, json.loads(r.payload)) for r in self.log.read("alerts", 1, 10_000)]


def test_alert_is_committed_with_the_reading_that_raised_it_on_the_alerts_stream(
    tmp_path: Path,
) -> None:
    """One transaction: a crash either keeps both or neither (no lost, no double alert)."""
    ship = _Ship(tmp_path)
    ship.commit(_incoming("C1", T0, temp=3), _incoming("C1", T0 + 1, temp=9.5))
    recs = ship.log.read("alerts", 1, 10)
    assert [(r.seq, r.key, r.ts_ms, r.topic) for r in recs] == [
        (1, "C1", T0 + 1, "shorelink/alarm/warm")
    ]
    assert json.loads(recs[0].payload)["value"] == 9.5
    with sqlite3.connect(ship.cfg.log.path) as c:
        assert c.execute("SELECT alarm, key, ts_ms FROM alarm_state").fetchall() == [
            ("warm", "C1", T0 + 1)
        ]
    assert ship.metrics.alarms.labels("warm")._value.get() == 1
    assert ship.metrics.ingested.labels("alerts")._value.get() == 1


def test_alarm_state_survives_a_restart_of_the_ingest_over_the_same_log(tmp_path: Path) -> None:
    """A shock before a restart still alerts after it; a disarmed threshold stays disarmed."""
    ship = _Ship(tmp_path)
    ship.commit(_incoming("C1", T0, shock=15.0), _incoming("C3", T0, temp=20))
    assert [(k, a["alarm"]) for k, a in ship.alerts()] == [("C3", "warm")]
    ship.restart()
    ship.commit(_incoming("C3", T0 + 1000, temp=25))  # still warm: disarmed, no alert
    ship.commit(_incoming("C2", T0 + 2 * HOUR + 1, shock=0.1))  # C1's deadline passes
    ship.restart()
    ship.commit(_incoming("C2", T0 + 3 * HOUR, shock=0.1))
    assert [(k, a["alarm"], a["ts"]) for k, a in ship.alerts()] == [
        ("C3", "warm", T0),
        ("C1", "overboard", T0),
    ]


def test_a_rolled_back_commit_raises_its_alert_again_when_retried_and_once(tmp_path: Path) -> None:
    """State is applied only after the commit: a failed transaction leaves no trace."""
    ship = _Ship(tmp_path)
    real = ship.log.commit
    calls = 0

    def failing_once(*a: Any, **kw: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            derive = kw["derive"]

            def boom(conn: sqlite3.Connection, stored: list[Incoming]) -> Any:
                derive(conn, stored)
                raise sqlite3.OperationalError("disk I/O error")  # the txn rolls back

            kw = {**kw, "derive": boom}
        return real(*a, **kw)

    ship.log.commit = failing_once  # type: ignore[method-assign]
    ship.commit(_incoming("C1", T0, temp=30))
    assert calls == 2
    assert [a["alarm"] for _, a in ship.alerts()] == ["warm"]


def test_a_redelivered_message_raises_nothing(tmp_path: Path) -> None:
    """The broker resends after a crash; the log recognises it and so must the alarms."""
    ship = _Ship(tmp_path)
    ship.commit(_incoming("C1", T0, mid=1, temp=30))  # alert, disarmed
    ship.commit(_incoming("C1", T0 + 1, mid=2, temp=3))  # re-armed
    ship.commit(_incoming("C1", T0, mid=1, dup=True, temp=30))  # the first, again
    assert [a["ts"] for _, a in ship.alerts()] == [T0]
    assert ship.log.stream_state("containers").count == 2


def test_hostile_payloads_commit_as_readings_and_raise_nothing(tmp_path: Path) -> None:
    ship = _Ship(tmp_path)
    topic = ENV.format(1, "C1")
    bad = [
        b"nan",
        b'{"temp": NaN}',
        b'{"temp": Infinity}',
        b'{"temp": "hot"}',
        b'{"temp": 1e999}',
        b'{"temp": 1' + b"0" * 400 + b"}",
        b"\xff\xfe",
        b'{"temp": {"x": 1}}',
        b'{"temp": true}',
    ]
    ship.commit(
        *[Incoming("containers", "C1", T0, T0, topic, p) for p in bad], _incoming("C2", T0, temp=9)
    )
    assert ship.log.stream_state("containers").count == len(bad) + 1
    assert [k for k, _ in ship.alerts()] == ["C2"]


# -- the agent with a real Mosquitto --------------------------------------------------------
def _agent_config(tmp_path: Path, mosquitto: MosquittoBroker, **sections: Any) -> Path:
    """The agent's config with the alarms of ``OVERBOARD`` and ``sections``."""
    return write_toml(
        tmp_path / "edge.toml",
        {**edge_config_doc(tmp_path, mosquitto), **tomllib.loads(OVERBOARD), **sections},
    )


def _alert_rows(db: Path) -> list[tuple[int, str, bytes]]:
    with sqlite3.connect(db) as c:
        if not c.execute("SELECT 1 FROM sqlite_master WHERE name = 'records'").fetchone():
            return []
        return c.execute(
            "SELECT seq, key, payload FROM records WHERE stream = 'alerts' ORDER BY seq"
        ).fetchall()


async def test_agent_raises_alerts_from_mqtt_and_hostile_payloads_do_not_stop_it(
    tmp_path: Path, mosquitto: MosquittoBroker, publisher: Publisher
) -> None:
    cfg = load_config(_agent_config(tmp_path, mosquitto))
    agent = Agent(cfg)
    task = asyncio.create_task(agent.run(install_signals=False))
    await asyncio.wait_for(agent.ingest.connected.wait(), 20)

    def publish() -> None:
        publisher.publish(ENV.format(1, "C1"), json.dumps({"ts": T0, "shock": 12.0}).encode())
        for p in (
            b"\xff",
            b'{"shock": NaN}',
            b'{"shock": "x"}',
            b'{"shock": 1e999}',
            b"[" * 50_000,
        ):
            publisher.publish(ENV.format(1, "C9"), p)
        publisher.publish(ENV.format(1, "C2"), json.dumps({"ts": T0 + HOUR, "temp": 9}).encode())
        publisher.publish(
            ENV.format(1, "C2"), json.dumps({"ts": T0 + 3 * HOUR, "temp": 9}).encode()
        )
        publisher.wait_all_acked()

    await asyncio.to_thread(publish)
    await eventually_async(lambda: agent.log.stream_state("containers").count == 8, within=10)
    recs = agent.log.read("alerts", 1, 10)
    assert [(r.key, json.loads(r.payload)["alarm"]) for r in recs] == [
        ("C2", "warm"),
        ("C1", "overboard"),
    ]
    assert recs[1].ts_ms == T0 and recs[1].topic == "shorelink/alarm/overboard"
    metrics = generate_latest(agent.metrics.registry).decode()
    assert 'shorelink_edge_alarms_total{alarm="overboard"} 1.0' in metrics
    agent.stop.set()
    await asyncio.wait_for(task, 15)


def test_alerts_are_neither_lost_nor_doubled_across_kill9_of_the_agent(
    tmp_path: Path,
    mosquitto: MosquittoBroker,
    publisher: Publisher,
    agent_process: type[AgentProcess],
) -> None:
    """Every container crosses the threshold once: exactly one alert each, however
    often the agent dies between commit and PUBACK (the broker then redelivers)."""
    cfg = _agent_config(tmp_path, mosquitto)
    db = tmp_path / "edge.db"
    agent = agent_process(cfg, tmp_path / "agent.log")
    agent.start()

    def subscribed() -> bool:  # the session exists once one alert is in
        if db.exists() and _alert_rows(db):
            return True
        publisher.publish(ENV.format(0, "probe"), json.dumps({"ts": T0, "temp": 50}).encode())
        return False

    eventually(subscribed, within=20, what="the agent to subscribe", interval=0.2)
    n = 1000
    stop = False

    def publish_steadily() -> None:
        for i in range(n):
            for temp in (5, 20, 25):  # crosses once, stays warm
                if stop:
                    return
                topic = ENV.format(1, f"K{i}")
                publisher.publish(topic, json.dumps({"ts": T0 + i, "temp": temp}).encode())
                time.sleep(0.001)

    t = threading.Thread(target=publish_steadily, daemon=True)
    t.start()
    rng = random.Random(3)
    for _ in range(8):
        time.sleep(rng.uniform(0.3, 0.8))
        agent.kill9()
        agent.start()
    t.join(60)
    stop = True
    publisher.wait_all_acked()
    eventually(lambda: len(_alert_rows(db)) >= n + 1, within=60, what="every alert")
    time.sleep(1)
    keys = Counter(k for _, k, _ in _alert_rows(db) if k.startswith("K"))
    assert [k for k, c in keys.items() if c > 1] == [], "an alert was raised twice"
    assert set(keys) == {f"K{i}" for i in range(n)}, "an alert is missing"
    seqs = [s for s, _, _ in _alert_rows(db)]
    assert seqs == list(range(1, len(seqs) + 1))


async def test_an_alert_reaches_the_satellite_gateway(
    tmp_path: Path, mosquitto: MosquittoBroker, publisher: Publisher
) -> None:
    """At sea the satellite link carries alerts (not container telemetry): the
    overboard alert reaches the shore without waiting for a port."""
    path = _agent_config(
        tmp_path,
        mosquitto,
        uplink={
            "token": "t0ken",
            "interval": "30s",
            "linger": "10ms",
            "retry_min": "50ms",
            "retry_max": "500ms",
        },
        gateways=[{"site": "tokyo", "url": "http://127.0.0.1:9", "link": "satellite"}],
    )
    gw = MemoryGateway("tokyo", "satellite")
    agent = Agent(load_config(path), gateways=[gw])
    task = asyncio.create_task(agent.run(install_signals=False))
    await asyncio.wait_for(agent.ingest.connected.wait(), 20)

    def publish() -> None:
        publisher.publish(ENV.format(1, "C1"), json.dumps({"ts": T0, "shock": 30}).encode())
        publisher.publish(ENV.format(1, "C2"), json.dumps({"ts": T0 + 3 * HOUR}).encode())
        publisher.wait_all_acked()

    await asyncio.to_thread(publish)
    await eventually_async(lambda: gw.held("alerts") == RangeSet([(1, 1)]), within=15)
    rec = gw.records["alerts"][1]
    assert rec.key == "C1"
    assert json.loads(rec.payload)["kind"] == "silence"
    assert gw.held("containers") == RangeSet()  # not on the satellite link
    agent.stop.set()
    await asyncio.wait_for(task, 15)
