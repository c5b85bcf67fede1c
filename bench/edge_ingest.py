"""Benchmark: the edge agent's durable ingest, side by side with a bare MQTT subscriber.

Everything runs on loopback against a real Mosquitto (``local_stack.mosquitto``), with
the agent as a real process (``python -m edge_agent.cli run --config FILE``) and the
publisher and the bare subscriber as processes of their own. Every phase is bounded.

1. flat out, in alternating rounds (``--rounds``, medians reported): a bare paho
   subscriber that stores nothing (QoS 1, auto-ack) takes N messages from a QoS 1
   publisher going flat out, rate = N / (publisher start -> Nth message received); then
   the agent (``synchronous = "full"``) takes N messages from the same publisher,
   rate = N / (publisher start -> the log holds all N), polled read-only in SQLite. The
   agent subscribes to ``bigblue/#`` only and the bare subscriber's messages go to
   ``bigpeer/...`` (same shape), so each has the broker to itself in its round.
2. steady: the publisher paced at ``--steady-rate`` for ``--steady-seconds``; p50/p99 of
   the agent's own receive -> PUBACK histogram (bucket counts after minus before), and
   publish -> receive from the stored records (time spent queued in the broker).
3. backlog: the agent is stopped, ``--backlog`` records are added to its log with
   ``EdgeLog.commit``, and it is started again: seconds from process start until a new
   probe message is stored ("ready"), and its RSS after it took a few thousand more.

    .venv/bin/python bench/edge_ingest.py --quick     # ~20 seconds
    .venv/bin/python bench/edge_ingest.py             # full run, ~2 minutes

Progress goes to stderr; one JSON object goes to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sqlite3
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import tomli_w
from _common import (
    Metrics,
    add_run_options,
    agent_metrics_and_streams,
    bench_parser,
    fill_defaults,
    progress,
    require_at_least_one,
    run_bench,
    scrape,
)
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edge_agent.config import load_config
from edge_agent.log import EdgeLog, Incoming
from local_stack.mosquitto import MosquittoBroker, start_mosquitto
from local_stack.process import Proc, free_port, port_open, stop_procs

SHIP = "bigblue"
#: the bare subscriber's messages: same shape, another first level (the agent only
#: subscribes to its ship's topics, so bare and agent rounds can alternate on one broker)
PEER = "bigpeer"
STREAM = "containers"  # the measured messages
PROBE_STREAM = "nav"  # readiness probes go to another stream, so they never skew counts
PROBE_TOPIC = "bigblue/nav/ais"
CONTAINERS = 500
RECEIVE_MAXIMUM = 1000  # the agent's default; the bare subscriber asks for the same
#: most messages a publisher has handed to paho but not seen acknowledged: paho's packet
#: ids wrap at 65535 and it does not check for ids still in use, so a flat-out publisher
#: with more than that queued overwrites its own messages and never sees their PUBACKs
MAX_UNACKED = 20_000
GOALS = {"ratio": 0.8, "p99_ms": 25.0, "rss_mb": 80.0, "ready_s": 3.0}
REPO = Path(__file__).resolve().parent.parent


def agent_config(
    *, ship: str, host: str, port: int, log_path: Path, synchronous: str, metrics_port: int
) -> str:
    return tomli_w.dumps(
        {
            "ship": ship,
            "log_level": "info",
            "mqtt": {
                "host": host,
                "port": port,
                "client_id": "shorelink-edge-bench",
                "subscriptions": ["bigblue/#"],
                "receive_maximum": RECEIVE_MAXIMUM,
            },
            "log": {
                "path": str(log_path),
                "group_commit": "5ms",
                "group_commit_max": 500,
                "max_bytes": "2GB",
                "alerts_reserve_bytes": "50MB",
                "synchronous": synchronous,
            },
            **agent_metrics_and_streams(metrics_port),
            "rules": [
                {"filter": "bigblue/+/containers/+/alert", "stream": "alerts", "key": "{4}"},
                {
                    "filter": "bigblue/+/containers/+/env",
                    "stream": "containers",
                    "key": "{4}",
                    "ts_field": "ts",
                },
                {"filter": "bigblue/nav/ais", "stream": "nav", "key": "position"},
            ],
        }
    )


say = progress("edge_ingest")


# -- messages ----------------------------------------------------------------------------
def topic(i: int, ship: str = SHIP) -> str:
    c = i % CONTAINERS
    return f"{ship}/deck{c % 4 + 1}/containers/MSCU{c:06d}/env"


def payload(i: int, ts: float) -> bytes:
    """Container telemetry, ~120 bytes of JSON; ``ts`` (epoch seconds) is the event time."""
    return (
        f'{{"ts":{ts:.3f},"seq":{i},"temp_c":{-18 + (i % 40) / 10:.1f},"setpoint_c":-18.0,'
        f'"humidity":{60 + i % 30}.5,"power_kw":{2 + (i % 9) / 10:.2f},"door":"closed"}}'
    ).encode()


# -- helper processes: publisher and bare subscriber -------------------------------------
def _write_result(path: str, data: dict[str, Any]) -> None:
    tmp = Path(path + ".tmp")
    tmp.write_text(json.dumps(data))
    tmp.rename(path)


def _connect_props(expiry: int = 0) -> Properties:
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = expiry
    props.ReceiveMaximum = RECEIVE_MAXIMUM
    return props


def run_publisher(spec: dict[str, Any]) -> None:
    """QoS 1 publisher: ``n`` messages flat out (rate 0) or paced at ``rate`` msg/s."""
    n, rate, first = int(spec["n"]), float(spec["rate"]), int(spec["first"])
    acked = 0
    all_acked = threading.Event()

    def on_publish(_c: mqtt.Client, _u: object, _mid: int, _rc: Any, _p: Any) -> None:
        nonlocal acked
        acked += 1
        if acked >= n:
            all_acked.set()

    client = mqtt.Client(
        CallbackAPIVersion.VERSION2,
        client_id=spec["client_id"],
        protocol=MQTTProtocolVersion.MQTTv5,
    )
    client.max_inflight_messages_set(1000)
    client.max_queued_messages_set(0)
    client.on_publish = on_publish
    client.connect(spec["host"], spec["port"], clean_start=True, properties=_connect_props())
    client.loop_start()
    topics = [topic(first + i, spec["ship"]) for i in range(CONTAINERS)]
    t_start = time.monotonic()
    sent = 0
    while sent < n:
        due = n if rate <= 0 else min(n, int((time.monotonic() - t_start) * rate) + 1)
        if due - acked > MAX_UNACKED:
            due = acked + MAX_UNACKED
            time.sleep(0.001)
        while sent < due:
            client.publish(topics[sent % CONTAINERS], payload(first + sent, time.time()), qos=1)
            sent += 1
        if rate > 0 and sent < n:
            time.sleep(0.002)
    t_sent = time.monotonic()
    ok = all_acked.wait(float(spec["timeout"]))
    t_acked = time.monotonic()
    client.disconnect()
    client.loop_stop()
    _write_result(
        spec["result"],
        {"t_start": t_start, "t_sent": t_sent, "t_acked": t_acked, "acked": acked, "complete": ok},
    )


def run_bare(spec: dict[str, Any]) -> None:
    """A subscriber that stores nothing: QoS 1, paho's automatic PUBACK, counts."""
    n = int(spec["n"])
    count = 0
    t_first = t_done = 0.0
    done = threading.Event()

    def on_connect(client: mqtt.Client, _u: object, _f: Any, _rc: Any, _p: Any) -> None:
        client.subscribe(spec["filter"], qos=1)

    def on_subscribe(_c: mqtt.Client, _u: object, _mid: int, _rcs: Any, _p: Any) -> None:
        Path(spec["ready"]).touch()

    def on_message(_c: mqtt.Client, _u: object, _m: mqtt.MQTTMessage) -> None:
        nonlocal count, t_first, t_done
        count += 1
        if count == 1:
            t_first = time.monotonic()
        if count == n:
            t_done = time.monotonic()
            done.set()

    client = mqtt.Client(
        CallbackAPIVersion.VERSION2,
        client_id=spec["client_id"],
        protocol=MQTTProtocolVersion.MQTTv5,
    )
    client.on_connect = on_connect
    client.on_subscribe = on_subscribe
    client.on_message = on_message
    client.connect(spec["host"], spec["port"], clean_start=True, properties=_connect_props())
    client.loop_start()
    ok = done.wait(float(spec["timeout"]))
    client.disconnect()
    client.loop_stop()
    _write_result(
        spec["result"], {"t_first": t_first, "t_done": t_done, "count": count, "complete": ok}
    )


@dataclass
class Helper:
    """A publisher or bare subscriber process, started with ``--role`` and a JSON spec;
    it writes its result to a file when done."""

    proc: Proc
    result: Path

    @classmethod
    def start(cls, role: str, work: Path, name: str, **spec: Any) -> Helper:
        result = work / f"{name}.json"
        result.unlink(missing_ok=True)
        spec["result"] = str(result)
        argv = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--role",
            role,
            "--spec",
            json.dumps(spec),
        ]
        return cls(Proc.start(name, argv, work / "logs" / f"{name}.log", cwd=REPO), result)

    def wait(self, timeout: float) -> dict[str, Any]:
        """The result, once written; ``timeout`` is the one the helper got (plus slack)."""
        deadline = time.monotonic() + timeout + 15
        while not self.result.exists():
            if not self.proc.alive():
                time.sleep(0.1)  # it may have written the file as it exited
                if self.result.exists():
                    break
                raise RuntimeError(f"{self.proc.name} exited without a result:\n{self.proc.tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.proc.name}: no result after {timeout:.0f}s")
            time.sleep(0.02)
        self.proc.stop(grace=5)
        data: dict[str, Any] = json.loads(self.result.read_text())
        if not data.get("complete"):
            raise RuntimeError(f"{self.proc.name} did not complete: {data}")
        return data


# -- watching the agent ------------------------------------------------------------------
class LogWatch:
    """Read-only view of the agent's log: how many records each stream got so far."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._conn: sqlite3.Connection | None = None

    def stored(self, stream: str = STREAM) -> int:
        try:
            if self._conn is None:
                if not self.path.exists():
                    return 0
                self._conn = sqlite3.connect(
                    f"file:{self.path}?mode=ro", uri=True, isolation_level=None
                )
            row = self._conn.execute(
                "SELECT next_seq - 1 FROM streams WHERE name = ?", [stream]
            ).fetchone()
        except sqlite3.Error:
            self.close()
            return 0
        return int(row[0]) if row else 0

    def delays_ms(self, lo: int, hi: int) -> list[int]:
        """recv_ms - ts_ms (publish -> receive) of records ``lo..hi``."""
        assert self._conn is not None
        rows = self._conn.execute(
            "SELECT recv_ms - ts_ms FROM records WHERE stream = ? AND seq BETWEEN ? AND ?",
            [STREAM, lo, hi],
        ).fetchall()
        return sorted(int(r[0]) for r in rows)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def wait_until(
    check: Callable[[], bool],
    timeout: float,
    what: str,
    alive: Callable[[], bool] | None = None,
    poll: float = 0.005,
) -> float:
    """Poll until ``check()``; return the monotonic time it first held."""
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return time.monotonic()
        if alive is not None and not alive():
            raise RuntimeError(f"process died while waiting for {what}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(poll)


def histogram_delta(before: Metrics, after: Metrics, name: str) -> list[tuple[float, float]]:
    """Cumulative (upper bound, count) of ``name`` observed between two scrapes."""
    buckets = []
    for (sample, labels), value in after.items():
        if sample == name + "_bucket":
            le = dict(labels)["le"]
            buckets.append((float(le), value - before.get((sample, labels), 0.0)))
    return sorted(buckets)


def quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Like Prometheus' histogram_quantile: linear within the bucket holding rank q."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for bound, cum in buckets:
        if cum >= rank:
            if bound == float("inf"):
                return lower  # beyond the last finite bucket: its bound, as Prometheus does
            if cum == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (cum - below)
        lower, below = bound, cum
    return lower


def hist_mean(before: Metrics, after: Metrics, name: str) -> float | None:
    n = after.get((name + "_count", ()), 0.0) - before.get((name + "_count", ()), 0.0)
    s = after.get((name + "_sum", ()), 0.0) - before.get((name + "_sum", ()), 0.0)
    return s / n if n else None


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


def pct(sorted_values: list[int], q: float) -> float | None:
    if not sorted_values:
        return None
    return float(sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))])


def rss_mb(pid: int) -> dict[str, float]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = round(int(value.split()[0]) / 1024, 1)
    return out


# -- the benchmark -----------------------------------------------------------------------
class Bench:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.procs: list[Proc] = []
        self.broker: MosquittoBroker | None = None
        self.agent: Proc | None = None
        self.config = work / "edge.toml"
        self.db = work / "edge.db"
        self.metrics_port = free_port()
        self.watch = LogWatch(self.db)
        self.seq = 0  # message numbers already used (each run gets fresh payloads)
        self.result: dict[str, Any] = {"benchmark": "edge_ingest"}

    def cleanup(self) -> None:
        self.watch.close()
        stop_procs([p for p in self.procs if p.alive()], grace=10)

    # processes
    def start_broker(self) -> MosquittoBroker:
        self.broker = start_mosquitto(SHIP, self.work / "mosquitto", self.work / "logs")
        self.procs.append(self.broker.proc)
        say(f"mosquitto on {self.broker.host}:{self.broker.port}")
        return self.broker

    def helper(self, role: str, name: str, **spec: Any) -> Helper:
        assert self.broker is not None
        h = Helper.start(
            role,
            self.work,
            name,
            host=self.broker.host,
            port=self.broker.port,
            client_id=f"bench-{name}",
            **spec,
        )
        self.procs.append(h.proc)
        return h

    def publish(self, name: str, n: int, rate: float = 0, ship: str = SHIP) -> Helper:
        first = self.seq
        self.seq += n
        return self.helper(
            "publisher",
            name,
            n=n,
            rate=rate,
            first=first,
            ship=ship,
            timeout=self.phase_timeout(n),
        )

    def phase_timeout(self, n: int) -> float:
        return 30 + n / 1000  # a run below 1000 msg/s is broken, not slow

    def start_agent(self) -> float:
        assert self.broker is not None
        self.config.write_text(
            agent_config(
                ship=SHIP,
                host=self.broker.host,
                port=self.broker.port,
                log_path=self.db,
                synchronous=self.args.synchronous,
                metrics_port=self.metrics_port,
            )
        )
        argv = [sys.executable, "-m", "edge_agent.cli", "run", "--config", str(self.config)]
        t0 = time.monotonic()
        self.agent = Proc.start("edge-agent", argv, self.work / "logs" / "agent.log", cwd=REPO)
        self.procs.append(self.agent)
        return t0

    def stop_agent(self) -> float:
        assert self.agent is not None
        t0 = time.monotonic()
        self.agent.stop(grace=30)
        self.watch.close()
        return time.monotonic() - t0

    def wait_agent_ready(self, timeout: float = 60) -> float:
        """Publish probes (nav stream) until the agent stores one: then it is subscribed
        and the broker queues for its session. Returns the monotonic time it was stored."""
        assert self.broker is not None and self.agent is not None
        base = self.watch.stored(PROBE_STREAM)
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id="bench-probe",
            protocol=MQTTProtocolVersion.MQTTv5,
        )
        client.connect(
            self.broker.host, self.broker.port, clean_start=True, properties=_connect_props()
        )
        client.loop_start()
        last = 0.0
        try:

            def stored() -> bool:
                nonlocal last
                if time.monotonic() - last > 0.02:
                    client.publish(PROBE_TOPIC, b'{"probe": true}', qos=1)
                    last = time.monotonic()
                return self.watch.stored(PROBE_STREAM) > base

            return wait_until(
                stored, timeout, "the agent to store a probe", self.agent.alive, poll=0.002
            )
        finally:
            client.disconnect()
            client.loop_stop()

    # phases
    def bare_round(self, n: int, r: int) -> dict[str, float]:
        ready = self.work / f"bare-{r}.ready"
        bare = self.helper(
            "bare",
            f"bare-{r}",
            n=n,
            filter=f"{PEER}/#",
            ready=str(ready),
            timeout=self.phase_timeout(n),
        )
        wait_until(ready.exists, 30, "the bare subscriber to subscribe", bare.proc.alive)
        pub = self.publish(f"pub-bare-{r}", n, ship=PEER).wait(self.phase_timeout(n))
        got = bare.wait(self.phase_timeout(n))
        return {
            "rate": n / (got["t_done"] - pub["t_start"]),
            "publisher": n / (pub["t_acked"] - pub["t_start"]),
        }

    def agent_round(self, n: int, r: int) -> dict[str, float]:
        assert self.agent is not None
        target = self.watch.stored() + n
        pub = self.publish(f"pub-agent-{r}", n)
        t_done = wait_until(
            lambda: self.watch.stored() >= target,
            self.phase_timeout(n),
            f"the agent to store {n} messages",
            self.agent.alive,
        )
        p = pub.wait(self.phase_timeout(n))
        return {
            "rate": n / (t_done - p["t_start"]),
            "publisher": n / (p["t_acked"] - p["t_start"]),
        }

    def flat_out(self, n: int, rounds: int) -> None:
        """Alternate bare and agent rounds of ``n`` messages; report the medians."""
        m0 = scrape(f"http://127.0.0.1:{self.metrics_port}/metrics")
        bare: list[dict[str, float]] = []
        agent: list[dict[str, float]] = []
        for r in range(1, rounds + 1):
            say(f"round {r}/{rounds}: bare subscriber, {n} messages")
            bare.append(self.bare_round(n, r))
            say(f"round {r}/{rounds}: bare subscriber {bare[-1]['rate']:.0f} msg/s")
            say(f"round {r}/{rounds}: agent, {n} messages (synchronous={self.args.synchronous})")
            agent.append(self.agent_round(n, r))
            say(f"round {r}/{rounds}: agent {agent[-1]['rate']:.0f} msg/s")
        m1 = scrape(f"http://127.0.0.1:{self.metrics_port}/metrics")
        agent_rate = statistics.median(x["rate"] for x in agent)
        bare_rate = statistics.median(x["rate"] for x in bare)
        commit = histogram_delta(m0, m1, "shorelink_edge_commit_seconds")
        self.result.update(
            {
                "agent_rate_msg_s": round(agent_rate),
                "bare_subscriber_rate_msg_s": round(bare_rate),
                "ratio": round(agent_rate / bare_rate, 3),
                "goal_ratio": GOALS["ratio"],
                "rounds": {
                    "agent_msg_s": [round(x["rate"]) for x in agent],
                    "bare_msg_s": [round(x["rate"]) for x in bare],
                    "publisher_msg_s_agent_rounds": [round(x["publisher"]) for x in agent],
                    "publisher_msg_s_bare_rounds": [round(x["publisher"]) for x in bare],
                },
                "agent_flat_out": {
                    "commit_group_mean_messages": _round(
                        hist_mean(m0, m1, "shorelink_edge_commit_group_messages")
                    ),
                    "commit_ms": {
                        "p50": ms(quantile(0.5, commit)),
                        "p99": ms(quantile(0.99, commit)),
                        "mean": ms(hist_mean(m0, m1, "shorelink_edge_commit_seconds")),
                    },
                },
            }
        )

    def steady_phase(self, rate: float, seconds: float) -> None:
        n = int(rate * seconds)
        say(f"steady: {n} messages at {rate:.0f} msg/s")
        assert self.agent is not None
        m0 = scrape(f"http://127.0.0.1:{self.metrics_port}/metrics")
        lo = self.watch.stored() + 1
        target = lo - 1 + n
        pub = self.publish("pub-steady", n, rate)
        t_done = wait_until(
            lambda: self.watch.stored() >= target,
            self.phase_timeout(n),
            f"the agent to store {n} paced messages",
            self.agent.alive,
        )
        p = pub.wait(self.phase_timeout(n))
        time.sleep(0.2)  # the last group's PUBACKs go out just after its commit
        m1 = scrape(f"http://127.0.0.1:{self.metrics_port}/metrics")
        ack = histogram_delta(m0, m1, "shorelink_edge_receive_to_ack_seconds")
        commit = histogram_delta(m0, m1, "shorelink_edge_commit_seconds")
        delays = self.watch.delays_ms(lo, target)
        out = {
            "p50": ms(quantile(0.5, ack)),
            "p99": ms(quantile(0.99, ack)),
            "rate_msg_s": rate,
            "published_msg_s": round(n / (p["t_sent"] - p["t_start"])),
            "stored_msg_s": round(n / (t_done - p["t_start"])),
            "drain_after_last_publish_s": round(t_done - p["t_sent"], 3),
            "observations": ack[-1][1] if ack else 0,
            "goal_p99_ms": GOALS["p99_ms"],
        }
        self.result["receive_to_puback_ms"] = out
        self.result["steady_commit_ms"] = {
            "p50": ms(quantile(0.5, commit)),
            "p99": ms(quantile(0.99, commit)),
        }
        self.result["steady_commit_group_mean_messages"] = _round(
            hist_mean(m0, m1, "shorelink_edge_commit_group_messages")
        )
        self.result["publish_to_receive_ms"] = {
            "p50": pct(delays, 0.5),
            "p99": pct(delays, 0.99),
            "max": float(delays[-1]) if delays else None,
        }
        self.result["rss_mb_after_steady"] = rss_mb(self.agent.pid).get("VmRSS")
        say(f"steady: receive->PUBACK p50={out['p50']}ms p99={out['p99']}ms")

    def prefill(self, n: int, batch: int = 5000) -> None:
        say(f"backlog: adding {n} records to {self.db} with EdgeLog.commit")
        cfg = load_config(self.config)
        edge_log = EdgeLog(
            cfg.log.path, cfg.ship, cfg.streams, replace(cfg.log, synchronous="normal")
        )
        t0 = time.monotonic()
        now_ms = int(time.time() * 1000)
        first = self.seq
        self.seq += n
        try:
            done = 0
            while done < n:
                k = min(batch, n - done)
                items = []
                for i in range(first + done, first + done + k):
                    t = topic(i)
                    items.append(
                        Incoming(
                            STREAM, t.split("/")[3], now_ms, now_ms, t, payload(i, now_ms / 1000)
                        )
                    )
                edge_log.commit(items)
                done += k
                if done % 200_000 < batch:
                    say(f"backlog: {done}/{n}")
        finally:
            edge_log.close()
        self.result["backlog_prefilled"] = n
        self.result["backlog_prefill_s"] = round(time.monotonic() - t0, 1)

    def restart_phase(self, after: int) -> None:
        t0 = self.start_agent()
        wait_until(
            lambda: port_open("127.0.0.1", self.metrics_port),
            60,
            "the agent's metrics",
            self.agent.alive if self.agent else None,
            poll=0.01,
        )
        t_ready = self.wait_agent_ready()
        assert self.agent is not None
        self.result["restart_ready_s"] = round(t_ready - t0, 3)
        self.result["goal_ready_s"] = GOALS["ready_s"]
        self.result["restart_log_open_s"] = _log_open_seconds(self.agent.log)
        self.result["rss_mb_at_ready"] = rss_mb(self.agent.pid).get("VmRSS")
        say(f"restart with backlog: ready in {t_ready - t0:.2f}s; {after} more messages")
        target = self.watch.stored() + after
        pub = self.publish("pub-after", after)
        wait_until(
            lambda: self.watch.stored() >= target,
            self.phase_timeout(after),
            f"the agent to store {after} more",
            self.agent.alive,
        )
        pub.wait(self.phase_timeout(after))
        time.sleep(max(0.0, 6 - (time.monotonic() - t_ready)))  # one gauge update (5 s) too
        mem = rss_mb(self.agent.pid)
        self.result["rss_mb_with_backlog"] = mem.get("VmRSS")
        self.result["rss_peak_mb_with_backlog"] = mem.get("VmHWM")
        self.result["goal_rss_mb"] = GOALS["rss_mb"]
        self.result["backlog_records"] = self.watch.stored()  # all undelivered: no uplink
        say(f"restart with backlog: RSS {mem}")

    def run(self) -> dict[str, Any]:
        a = self.args
        t_begin = time.monotonic()
        self.result.update(
            {
                "messages": a.messages,
                "payload_bytes": len(payload(123456, time.time())),
                "synchronous": a.synchronous,
                "cpus": os.cpu_count(),
                # the machine may be shared: a load above the CPU count skews every figure
                "loadavg_1m_at_start": round(os.getloadavg()[0], 2),
            }
        )
        self.start_broker()
        t0 = self.start_agent()
        self.result["first_start_ready_s"] = round(self.wait_agent_ready() - t0, 3)
        self.flat_out(a.messages, a.rounds)
        self.steady_phase(a.steady_rate, a.steady_seconds)
        self.result["agent_stop_s"] = round(self.stop_agent(), 3)
        self.prefill(a.backlog)
        self.restart_phase(a.after_messages)
        self.stop_agent()
        r = self.result
        p99 = r["receive_to_puback_ms"]["p99"]
        r["goals_met"] = {
            "ratio": r.get("ratio", 0) >= GOALS["ratio"],
            "receive_to_puback_p99": p99 is not None and p99 <= GOALS["p99_ms"],
            "rss_with_backlog": (r["rss_mb_with_backlog"] or 1e9) <= GOALS["rss_mb"],
            "restart_ready": r["restart_ready_s"] < GOALS["ready_s"],
        }
        r["elapsed_s"] = round(time.monotonic() - t_begin, 1)
        r["loadavg_1m_at_end"] = round(os.getloadavg()[0], 2)
        return r


def _round(x: float | None, nd: int = 1) -> float | None:
    return None if x is None else round(x, nd)


def _log_open_seconds(log: Path) -> float | None:
    """The agent's own ``event=log_opened ... seconds=S`` from its latest start."""
    found = None
    with contextlib.suppress(OSError):
        for line in log.read_text(errors="replace").splitlines():
            if "event=log_opened" in line:
                for part in line.split():
                    if part.startswith("seconds="):
                        found = float(part.removeprefix("seconds="))
    return found


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = bench_parser("bench/edge_ingest.py", __doc__)
    add_run_options(p, "small sizes: a run of about 20 seconds", "logs, log file, configs")
    p.add_argument(
        "--messages",
        type=int,
        default=None,
        help="messages per flat-out phase (bare and agent); default 50000, quick 5000",
    )
    p.add_argument(
        "--backlog",
        type=int,
        default=None,
        help="records added to the log before the restart; default 2000000, quick 100000",
    )
    p.add_argument(
        "--steady-rate",
        type=float,
        default=5000.0,
        help="publish rate of the latency phase, msg/s (default 5000)",
    )
    p.add_argument(
        "--steady-seconds",
        type=float,
        default=None,
        help="length of the latency phase; default 10, quick 3",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="alternating bare/agent flat-out rounds (medians reported); default 3, quick 1",
    )
    p.add_argument(
        "--after-messages",
        type=int,
        default=5000,
        help="messages the restarted agent takes before its RSS is read (default 5000)",
    )
    p.add_argument(
        "--synchronous",
        choices=("full", "normal"),
        default="full",
        help="the agent's log.synchronous (default full)",
    )
    p.add_argument("--role", choices=("publisher", "bare"), help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    fill_defaults(
        a,
        {
            "messages": (5000, 50_000),
            "backlog": (100_000, 2_000_000),
            "rounds": (1, 3),
            "steady_seconds": (3.0, 10.0),
        },
    )
    require_at_least_one(p, a, "messages", "backlog", "after_messages", "rounds")
    if a.steady_rate <= 0 or a.steady_seconds <= 0:
        p.error("--steady-rate and --steady-seconds must be positive")
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.role:
        spec = json.loads(args.spec)
        run_publisher(spec) if args.role == "publisher" else run_bare(spec)
        return 0

    return run_bench(say, args.keep, "edge-ingest-", lambda work: Bench(args, work))


if __name__ == "__main__":
    sys.exit(main())
