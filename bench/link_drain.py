"""Benchmark: a ship's backlog drained over a slow, flaky link.

All real, on loopback: a single-node Kafka (``local_stack.kafka``), the gateway
(``core_gateway.cli.serve``, ``bench/_stack.py``) and the edge agent
(``edge_agent.agent.Agent``) as processes of their own (ship and shore do not share a
CPU or a GIL in production either: this script starts itself with ``--role agent``),
toxiproxy for the link.

0. warm-up (uncounted): ``--warmup-records`` records uploaded flat out to the gateway
   on loopback, as a port's Kafka that has run for months is warm; a drain of a few
   seconds on a cold broker measures the JIT (the gateway's ingest rate itself is
   ``bench/gateway_ingest.py``).
1. link: ``--records`` container readings (1,000 containers reporting once a minute,
   JSON with ts, temperature, humidity, door, shock, battery, on
   ``bigblue/deck{d}/containers/{id}/env``) are committed straight into the ship's
   SQLite log with ``EdgeLog.commit``. The agent starts with the link down (the ship
   at sea) and seals the backlog into encoded segments (edge_agent/sealing.py;
   reported under "sealing"; ``--seal-records 0`` turns sealing off, so every batch is
   read and encoded while the link waits). Then the link comes up (the ship in port)
   and the agent drains the backlog to the gateway through a toxiproxy proxy:
   bandwidth ``--bandwidth`` bytes/s on both directions (toxiproxy ``bandwidth``
   toxic), ``--latency-ms`` on the ship->shore direction (so every request/reply round
   trip takes at least that), and the proxy disabled for ``--outage-s`` every
   ``--outage-every-s``, the first ``--outage-first-s`` after the first batch went out
   (60 s by default: a drain of a few seconds then sees none). Then the same for a
   second ship ("link_cut") whose first outage comes ``--cut-at-s`` into its drain:
   what an outage costs. Reported: wire bytes per record (bytes sent / records), drain
   time (first batch sent -> last batch confirmed), link utilisation (bytes sent /
   (bandwidth x drain time), and over the time the link was up), resent bytes (bytes
   of failed batches whose records were sent again), what went on around each outage,
   and what bounds the throughput. Bytes sent come from the agent's Prometheus counter
   and its persisted link spend; which batches the gateway confirmed comes from a
   recording wrapper around the agent's ``HttpGateway`` (times, sizes, outcome of
   every batch).
2. exactly once: ``sl.ingress.containers`` is read to its end (read_committed): every
   seq of every ship exactly once.

``--dark``: a month dark, then a short port call (issue 42, item 4). The backlog is the
month (scaled: ``--records`` of the month's 1.8 million readings a ship) with
``--alerts-before`` alerts committed among it (raised at sea, the link down); during
the drain the ship's sensors publish to its Mosquitto (the agent's real ingest) one
alert every ``--alert-every-s`` with ``--live-readings`` fresh container readings
beside it. The agent takes the containers' latest-value snapshot into
``containers_latest`` (priority 20; edge_agent/latest.py) as the link comes up.
Reported under "dark", from the gateway's holdings polled every 50 ms: when each alert
arrived (from the port call's start, and from its commit), when the snapshot arrived
(and, from the ship's log, whether it holds the newest reading of every container of
the backlog, each once), when the newest reading of the backlog arrived, when the
whole backlog did, and when the readings committed during the port call did. The cut
drain is skipped; ``sl.ingress.alerts`` and ``sl.ingress.containers_latest`` are
checked exactly once too.

    .venv/bin/python bench/link_drain.py --quick     # ~50 seconds (300k records, cut 1 s into the drain)
    .venv/bin/python bench/link_drain.py             # full run, ~75 seconds
    .venv/bin/python bench/link_drain.py --in-flight 6 --bandwidth-mode shared
    .venv/bin/python bench/link_drain.py --quick --dark        # a month dark, scaled

Progress goes to stderr; one JSON object goes to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import signal
import statistics
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import tomli_w
from _common import (
    Metrics,
    add_run_options,
    agent_metrics_and_streams,
    bench_parser,
    delta,
    fill_defaults,
    get_json,
    hist_mean_ms,
    pct,
    progress,
    r3,
    require_at_least_one,
    run_bench,
    scrape,
    total,
)
from _shaper import SharedShaper
from _stack import (
    CONTAINERS,
    SITE,
    STREAM,
    Stack,
    readings,
    start_role,
    wire_records,
)

from edge_agent.budget import utc_day
from edge_agent.config import load_config
from edge_agent.gateway import SendResult
from edge_agent.log import EdgeLog, Incoming
from local_stack.mosquitto import MosquittoBroker, start_mosquitto
from local_stack.process import Proc, free_port
from shorelink.errors import ShorelinkError
from shorelink.files import write_atomic
from shorelink.ranges import RangeSet
from shorelink.snapshot import decode_copy
from shorelink.wire import peek_header

SHIP = "bigblue"
#: the second drain's ship (the same backlog, an outage in the middle of the drain)
CUT_SHIP = "redstar"
#: the warm-up's ship (uploads flat out on loopback, not over the link)
WARMUP_SHIP = "warmup"
GOALS = {"link_utilisation": 0.85, "resent_batches_per_outage": 1.0}
#: a month dark: 2,500 reefers reporting hourly for 30 days (issue 42)
MONTH_READINGS = 1_800_000
ALERTS = "alerts"
#: with --dark, the containers' latest-value snapshot stream (edge_agent/latest.py)
LATEST = "containers_latest"

say = progress("link_drain")


# -- small helpers -----------------------------------------------------------------------
def union_length(intervals: list[tuple[float, float]]) -> float:
    out = 0.0
    end = -math.inf
    for a, b in sorted(intervals):
        if b <= end:
            continue
        out += b - max(a, end)
        end = b
    return out


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.rename(path)


# -- the role processes --------------------------------------------------------------------
class RecordingGateway:
    """The agent's real ``HttpGateway``, with every POST's wall-clock start and end, body
    size, seq range and outcome written down (``ok`` means the gateway confirmed it)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.sends: list[list[Any]] = []
        self.probes: list[list[Any]] = []

    @property
    def site(self) -> str:
        return str(self._inner.site)

    @property
    def link(self) -> str:
        return str(self._inner.link)

    @property
    def url(self) -> str:
        return str(self._inner.url)

    async def holdings(self) -> dict[str, RangeSet]:
        t0 = time.time()
        try:
            held: dict[str, RangeSet] = await self._inner.holdings()
        except BaseException as exc:
            self.probes.append([t0, time.time(), type(exc).__name__])
            raise
        self.probes.append([t0, time.time(), "ok"])
        return held

    async def send(self, stream: str, body: bytes) -> SendResult:
        h = peek_header(body)
        t0 = time.time()
        try:
            result: SendResult = await self._inner.send(stream, body)
        except BaseException as exc:
            self.sends.append(
                [t0, time.time(), len(body), h.first_seq, h.count, repr(exc)[:200], stream]
            )
            raise
        self.sends.append([t0, time.time(), len(body), h.first_seq, h.count, "ok", stream])
        return result

    async def reset(self) -> None:
        await self._inner.reset()

    async def close(self) -> None:
        await self._inner.close()


async def agent_role(config: Path, record: Path) -> None:
    from edge_agent.agent import Agent
    from edge_agent.gateway import HttpGateway
    from shorelink.logs import configure_logging

    cfg = load_config(config)
    configure_logging(cfg.log_level)
    gateways = [
        RecordingGateway(HttpGateway(g, cfg.links[g.link], cfg.ship, cfg.uplink.token))
        for g in cfg.gateways
    ]
    agent = Agent(cfg, gateways=gateways)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, agent.stop.set)
    try:
        await agent.run(install_signals=False)
    finally:
        write_json(
            record,
            {"sends": [s for g in gateways for s in g.sends], "probes": gateways[0].probes},
        )


# -- a month dark, then a port call (--dark) ------------------------------------------------
class PortCall:
    """The ship's sensors during the port call (an alert and fresh readings published
    to its Mosquitto every ``every_s``, QoS 1: the agent's PUBACK comes after its
    commit) and when each record arrived at the gateway (its holdings, polled)."""

    def __init__(
        self, ship: str, broker: MosquittoBroker, alerts_before: int, every_s: float, live: int
    ) -> None:
        self.ship = ship
        self.every_s = every_s
        self.live = live
        self.alerts_before = alerts_before
        self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2, client_id="sensors", clean_session=True
        )
        self.client.connect(broker.host, broker.port)
        self.client.loop_start()
        self.t_start = 0.0
        self.next_at = 0.0
        #: alert seq -> (published, acknowledged: committed by the agent); seqs below
        #: alerts_before + 1 were committed at sea
        self.alerts: dict[int, tuple[float, float]] = {}
        #: per group of fresh readings: (last seq, published, acknowledged)
        self.groups: list[tuple[int, float, float]] = []
        self.alert_arrived: dict[int, float] = {}
        self.group_arrived: dict[int, float] = {}
        self.last_reading = 0

    def start(self, t_start: float, last_reading: int) -> None:
        self.t_start = t_start
        self.next_at = t_start + self.every_s
        self.last_reading = last_reading

    def publish(self, now: float) -> None:
        """An alert and a group of fresh readings, when due."""
        if now < self.next_at:
            return
        self.next_at += self.every_s
        t0 = time.time()
        infos = [
            self.client.publish(topic, payload, qos=1)
            for _key, _ts, topic, payload in readings(
                self.ship, self.live, len(self.groups) + 11, int(t0 * 1000)
            )
        ]
        seq = self.alerts_before + len(self.alerts) + 1
        payload = json.dumps({"alarm": "overboard", "n": seq, "ts": int(t0 * 1000)})
        infos.append(self.client.publish(f"{self.ship}/alerts/overboard", payload, qos=1))
        for info in infos:
            info.wait_for_publish(10)
        acked = time.time()
        self.alerts[seq] = (t0, acked)
        if self.live:
            self.last_reading += self.live
            self.groups.append((self.last_reading, t0, acked))

    def observe(self, now: float, streams: dict[str, str]) -> None:
        alerts = RangeSet.parse(streams.get(ALERTS, ""))
        for seq in range(1, self.alerts_before + len(self.alerts) + 1):
            if seq not in self.alert_arrived and seq in alerts:
                self.alert_arrived[seq] = now
        held = RangeSet.parse(streams.get(STREAM, ""))
        for last, _, _ in self.groups:
            if last not in self.group_arrived and held.contains_range(1, last):
                self.group_arrived[last] = now

    def settled(self) -> bool:
        return len(self.alert_arrived) == self.alerts_before + len(self.alerts) and all(
            last in self.group_arrived for last, _, _ in self.groups
        )

    def stop(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()

    def report(
        self, records: int, t_newest: float | None, t_backlog: float | None
    ) -> dict[str, Any]:
        def since(t: float | None) -> float | None:
            return r3(None if t is None else t - self.t_start)

        def spread(values: list[float]) -> dict[str, float | None]:
            return {
                "min": r3(min(values, default=None)),
                "p50": r3(pct(values, 0.5)),
                "max": r3(max(values, default=None)),
            }

        at_sea = [self.alert_arrived.get(seq) for seq in range(1, self.alerts_before + 1)]
        during = [
            {
                "seq": seq,
                "committed_s": since(acked),
                "arrived_s": since(self.alert_arrived.get(seq)),
                "after_commit_s": r3(
                    None if seq not in self.alert_arrived else self.alert_arrived[seq] - acked
                ),
            }
            for seq, (_pub, acked) in sorted(self.alerts.items())
        ]
        fresh = [
            self.group_arrived[last] - acked
            for last, _, acked in self.groups
            if last in self.group_arrived
        ]
        return {
            # the month, scaled to what runs here in minutes
            "scale": {
                "backlog_readings": records,
                "month_readings": MONTH_READINGS,
                "fraction_of_month": round(records / MONTH_READINGS, 3),
                "days_of_the_month": round(30 * records / MONTH_READINGS, 1),
            },
            # every time from the port call's start (the link up), in seconds
            "alerts_at_sea": self.alerts_before,
            "alerts_at_sea_arrived_s": [since(t) for t in at_sea],
            "alerts_in_port_count": len(self.alerts),
            "alerts_in_port_after_commit_s": spread(
                [d["after_commit_s"] for d in during if d["after_commit_s"] is not None]
            ),
            "alerts_in_port": during,
            "newest_backlog_reading_arrived_s": since(t_newest),
            "whole_backlog_arrived_s": since(t_backlog),
            "fresh_readings_per_alert": self.live,
            "fresh_groups": len(self.groups),
            "fresh_readings_after_commit_s": spread(fresh),
            "fresh_last_seq": self.last_reading,
        }


# -- the benchmark -----------------------------------------------------------------------
class Bench:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.stack = Stack(
            work,
            [SHIP, CUT_SHIP, WARMUP_SHIP],
            say,
            link=True,
            streams=("alerts", "nav", STREAM, LATEST),
        )
        self.result: dict[str, Any] = {"benchmark": "link_drain"}

    @property
    def procs(self) -> list[Proc]:
        return self.stack.procs

    def cleanup(self) -> None:
        if self.stack.toxiproxy is not None:
            for ship in (SHIP, CUT_SHIP):
                with contextlib.suppress(Exception):
                    self.stack.toxiproxy.set_enabled(f"{ship}-to-{SITE}", True)
        self.stack.cleanup()

    @property
    def gw_url(self) -> str:
        return self.stack.gw_url

    def run(self) -> dict[str, Any]:
        t0 = time.monotonic()
        a = self.args
        self.result["config"] = {
            "records": a.records,
            "containers": CONTAINERS,
            "link": a.link,
            "link_overrides": self.link_overrides(),
            "uplink_overrides": self.uplink_overrides(),
            "bandwidth_bytes_s": a.bandwidth,
            "latency_ms_ship_to_shore": a.latency_ms,
            # toxiproxy's bandwidth toxic limits each TCP connection on its own: with
            # in_flight batches on as many connections the link carries up to in_flight x;
            # "shared": one limit for all connections (the bench's own relay)
            "bandwidth_mode": a.bandwidth_mode,
            "outage_s": a.outage_s,
            "outage_every_s": a.outage_every_s,
            "outage_first_s": a.outage_first_s,
            "cut_at_s": a.cut_at_s,
            "warmup_records": a.warmup_records,
            "dark": a.dark,
            "alerts_before": a.alerts_before if a.dark else None,
            "alert_every_s": a.alert_every_s if a.dark else None,
            "live_readings": a.live_readings if a.dark else None,
        }
        # this machine's other load skews every number here: keep it beside them
        self.result["loadavg_1m_at_start"] = round(os.getloadavg()[0], 2)
        self.stack.start()
        self.warm_up()
        # an outage every --outage-every-s, the first at --outage-first-s; then the
        # same backlog of another ship with one outage in the middle of its drain
        # (what an outage costs)
        self.result["link"] = self.link_phase(SHIP, a.outage_first_s)
        if a.cut_at_s is not None and not a.dark:
            self.result["link_cut"] = self.link_phase(CUT_SHIP, a.cut_at_s)
        self.verify()
        self.result["loadavg_1m_at_end"] = round(os.getloadavg()[0], 2)
        self.result["seconds_total"] = round(time.monotonic() - t0, 1)
        return self.result

    def warm_up(self) -> None:
        """Uncounted: the broker and the gateway warmed up (JIT, connections, partition
        leaders): a port's Kafka has been running for months, and a drain of a few
        seconds measured on a cold broker measures its warm-up."""
        from shorelink.wire import Batch, encode_batch

        n = self.args.warmup_records
        if not n:
            return
        say(f"warm-up: {n} records to the gateway on loopback (not counted)")
        recs = wire_records(WARMUP_SHIP, 1, n, 7)
        bodies = [
            encode_batch(Batch(WARMUP_SHIP, STREAM, tuple(recs[i : i + 5000])))
            for i in range(0, n, 5000)
        ]
        asyncio.run(self.stack.upload({WARMUP_SHIP: bodies}, {WARMUP_SHIP: n}, 4))

    def _given(self, keys: dict[str, str]) -> dict[str, Any]:
        """Config key -> value of the options (``keys``: option -> key) that were given."""
        given = {opt: getattr(self.args, opt) for opt in keys}
        return {keys[opt]: v for opt, v in given.items() if v is not None}

    def link_overrides(self) -> dict[str, Any]:
        return self._given(
            {
                "batch_records": "batch_max_records",
                "batch_bytes": "batch_max_bytes",
                "in_flight": "in_flight",
            }
        )

    def uplink_overrides(self) -> dict[str, Any]:
        return self._given(
            {"retry_min": "retry_min", "retry_max": "retry_max", "seal_records": "seal_records"}
        )

    def link_settings(self) -> dict[str, Any]:
        """The link class's effective settings (defaults in code plus our overrides)."""
        cfg = load_config(self.work / SHIP / "edge.toml")
        lc = cfg.links[self.args.link]
        u = cfg.uplink
        return {
            "batch_max_records": lc.batch_max_records,
            "batch_max_bytes": lc.batch_max_bytes,
            "in_flight": lc.in_flight,
            "timeout_s": lc.timeout_s,
            "retry_min_s": u.retry_min_s,
            "retry_max_s": u.retry_max_s,
            "probe_timeout_s": u.probe_timeout_s,
        }

    def write_agent_config(
        self, ship: str, metrics_port: int, proxy_port: int, mqtt_port: int | None = None
    ) -> Path:
        link = self.args.link
        rules: list[dict[str, str]] = [
            {
                "filter": f"{ship}/+/containers/+/env",
                "stream": "containers",
                "key": "{4}",
                "ts_field": "ts",
            }
        ]
        if mqtt_port is not None:  # --dark: the sensors publish alerts too
            rules.append({"filter": f"{ship}/alerts/+", "stream": ALERTS, "key": "{3}"})
        streams = agent_metrics_and_streams(metrics_port)
        if mqtt_port is not None:  # --dark: each container's newest reading goes first
            streams["streams"][STREAM]["latest_stream"] = LATEST
            streams["streams"][LATEST] = {"priority": 20}
        config = {
            "ship": ship,
            "log_level": "info",
            # nothing listens here (but with --dark): the log is filled directly, the
            # agent only uploads
            "mqtt": {
                "host": "127.0.0.1",
                "port": mqtt_port or free_port(),
                "client_id": "shorelink-edge-bench-uplink",
                "subscriptions": [f"{ship}/#"],
            },
            "log": {"path": str(self.work / ship / "edge.db"), "max_bytes": "4GB"},
            **streams,
            "rules": rules,
            "uplink": {"token": self.stack.tokens[ship], **self.uplink_overrides()},
            "links": {link: self.link_overrides()},
            "gateways": [{"site": SITE, "url": f"http://127.0.0.1:{proxy_port}", "link": link}],
        }
        path = self.work / ship / "edge.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, tomli_w.dumps(config), mode=0o600)  # it holds the ship's token
        return path

    def prefill(self, config: Path, n: int, alerts: int = 0) -> None:
        """``n`` readings in the ship's log, and ``alerts`` alerts spread among them."""
        say(f"link: committing {n} records and {alerts} alerts to the ship's log")
        cfg = load_config(config)
        edge_log = EdgeLog(
            cfg.log.path, cfg.ship, cfg.streams, replace(cfg.log, synchronous="normal")
        )
        t0 = time.monotonic()
        batch: list[Incoming] = []
        alert_at = {(i + 1) * n // (alerts + 1) for i in range(alerts)}
        try:
            for i, (key, ts, topic, payload) in enumerate(
                readings(cfg.ship, n, 1, int(time.time() * 1000))
            ):
                batch.append(Incoming(STREAM, key, ts, ts + 20, topic, payload))
                if i in alert_at:
                    body = json.dumps({"alarm": "overboard", "ts": ts}).encode()
                    where = f"{cfg.ship}/alerts/overboard"
                    batch.append(Incoming(ALERTS, "overboard", ts, ts + 20, where, body))
                if len(batch) >= 5000:
                    edge_log.commit(batch)
                    batch = []
            if batch:
                edge_log.commit(batch)
            last = edge_log.stream_state(STREAM).next_seq - 1
        finally:
            edge_log.close()
        if last != n:
            raise RuntimeError(f"prefill: the log ends at seq {last}, expected {n}")
        say(f"link: {n} records committed in {time.monotonic() - t0:.1f}s")

    # -- 1. the link ---------------------------------------------------------------------------
    def link_phase(self, ship: str, outage_first_s: float) -> dict[str, Any]:
        """``ship``'s backlog drained over the link, outages from ``outage_first_s``."""
        a = self.args
        assert self.stack.toxiproxy is not None
        tp = self.stack.toxiproxy
        proxy = f"{ship}-to-{SITE}"
        metrics_port, proxy_port = free_port(), free_port()
        broker = None
        if a.dark:
            broker = start_mosquitto(ship, self.work / ship / "mosquitto", self.stack.logs)
            self.stack.procs.append(broker.proc)
        config = self.write_agent_config(
            ship, metrics_port, proxy_port, None if broker is None else broker.port
        )
        self.prefill(config, a.records, a.alerts_before if a.dark else 0)
        shaper: SharedShaper | None = None
        if a.bandwidth_mode == "shared":
            # agent -> shaper (shared bandwidth) -> toxiproxy (latency, outages) -> gateway
            toxi_port = free_port()
            tp.create_proxy(proxy, f"127.0.0.1:{toxi_port}", f"127.0.0.1:{self.stack.gw_port}")
            shaper = SharedShaper(proxy_port, toxi_port, a.bandwidth)
            shaper.start()
        else:
            tp.create_proxy(proxy, f"127.0.0.1:{proxy_port}", f"127.0.0.1:{self.stack.gw_port}")
            rate_kb = max(1, round(a.bandwidth / 1000))  # toxiproxy: KB/s of 1000 bytes
            tp.add_toxic(proxy, "bandwidth", name="bw_up", stream="upstream", rate=rate_kb)
            tp.add_toxic(proxy, "bandwidth", name="bw_down", stream="downstream", rate=rate_kb)
        if a.latency_ms:
            tp.add_toxic(proxy, "latency", name="lat_up", stream="upstream", latency=a.latency_ms)
        toxics = sorted(t["name"] for t in tp.proxies()[proxy]["toxics"])
        record = self.work / ship / "sends.json"
        agent_metrics = f"http://127.0.0.1:{metrics_port}/metrics"
        g0 = scrape(self.stack.gw_metrics_url + "/metrics")
        say(
            f"link: {ship}'s agent drains {a.records} records over {a.link} "
            f"({a.bandwidth} B/s, {a.latency_ms} ms, {a.outage_s:g}s outage every "
            f"{a.outage_every_s:g}s from {outage_first_s:g}s)"
        )
        # the ship at sea: the agent starts with the link down and seals its backlog
        # (edge_agent/sealing.py); then it reaches port and the link comes up
        tp.set_enabled(proxy, False)
        t_agent = time.time()
        agent = start_role(
            __file__, "agent", "agent", config, self.stack.logs, "--record", str(record)
        )
        self.stack.procs.append(agent)
        sealing = self.wait_sealed(agent, agent_metrics, t_agent, config)
        port = None
        if broker is not None:
            port = PortCall(ship, broker, a.alerts_before, a.alert_every_s, a.live_readings)
        tp.set_enabled(proxy, True)
        t_start = time.time()
        if port is not None:
            port.start(t_start, a.records)
        t_newest: float | None = None
        #: with --dark: the snapshot's records (from the agent's metrics) and when the
        #: site held them all
        latest_n = 0
        t_latest: float | None = None
        outages: list[tuple[float, float]] = []
        deadline = time.monotonic() + a.drain_timeout
        t_first: float | None = None
        t_done: float | None = None
        next_poll = 0.0
        last_say = time.monotonic()
        held = RangeSet()
        try:
            while t_done is None or (
                port is not None and (not port.settled() or (latest_n and t_latest is None))
            ):
                now_m = time.monotonic()
                if now_m > deadline:
                    raise RuntimeError(
                        f"link: not drained after {a.drain_timeout:.0f}s (site holds {held})"
                    )
                if not agent.alive():
                    raise RuntimeError(f"the agent exited:\n{agent.tail()}")
                now = time.time()
                if t_first is None:
                    with contextlib.suppress(OSError, ValueError):
                        if total(scrape(agent_metrics), "shorelink_edge_uplink_bytes_sent_total"):
                            t_first = now
                else:
                    k = len(outages)
                    due = t_first + outage_first_s + k * a.outage_every_s
                    if a.outage_s > 0 and now >= due:
                        tp.set_enabled(proxy, False)
                        t_off = time.time()
                        time.sleep(max(0.0, t_off + a.outage_s - time.time()))
                        tp.set_enabled(proxy, True)
                        outages.append((t_off, time.time()))
                        say(f"link: outage {len(outages)} ({outages[-1][1] - t_off:.2f}s)")
                if port is not None and t_done is None:
                    port.publish(now)
                if now_m >= next_poll:
                    next_poll = now_m + (0.05 if port is not None else 0.2)
                    with contextlib.suppress(OSError, ValueError):
                        body = get_json(
                            f"{self.gw_url}/v1/ships/{ship}/holdings", self.stack.tokens[ship]
                        )
                        t_held = time.time()
                        held = RangeSet.parse(body["streams"][STREAM])
                        if t_newest is None and a.records in held:
                            t_newest = t_held
                        if t_done is None and held.contains_range(1, a.records):
                            t_done = t_held
                        if port is not None:
                            port.observe(t_held, body["streams"])
                            if not latest_n:
                                latest_n = int(
                                    total(
                                        scrape(agent_metrics), "shorelink_edge_latest_records_total"
                                    )
                                )
                            had = RangeSet.parse(body["streams"].get(LATEST, ""))
                            if t_latest is None and latest_n and had.contains_range(1, latest_n):
                                t_latest = t_held
                if now_m - last_say > 10:
                    last_say = now_m
                    say(f"link: site holds {held.count()}/{a.records}")
                time.sleep(0.01)
            say(f"link: drained in {t_done - (t_first or t_start):.1f}s; {len(outages)} outages")
            time.sleep(0.3)  # the agent settles the last reply
            m = scrape(agent_metrics)
            g1 = scrape(self.stack.gw_metrics_url + "/metrics")
            toxics_after = sorted(t["name"] for t in tp.proxies()[proxy]["toxics"])
        finally:
            tp.set_enabled(proxy, True)
            agent.stop(grace=30)
            if shaper is not None:
                shaper.stop()
            if port is not None:
                port.stop()
        if not record.exists():
            raise RuntimeError(f"the agent left no record of its sends:\n{agent.tail()}")
        sent = json.loads(record.read_text())
        cfg = load_config(config)
        edge_log = EdgeLog(cfg.log.path, cfg.ship, cfg.streams, cfg.log, readonly=True)
        try:
            days = {utc_day(t_start), utc_day(time.time())}
            spend = sum(edge_log.links.spend(a.link, d) for d in days)
        finally:
            edge_log.close()
        report = self.link_report(
            sent, outages, m, g0, g1, spend, t_start, t_first, t_done, toxics, toxics_after
        )
        if port is not None:
            self.result["dark"] = port.report(a.records, t_newest, t_done)
            self.result["dark"]["snapshot"] = {
                "arrived_s": r3(None if t_latest is None else t_latest - t_start),
                **self.check_snapshot(config),
            }
            self.latest_last = latest_n
            self.fresh_last = port.last_reading
            self.alerts_last = a.alerts_before + len(port.alerts)
        return {"ship": ship, "outage_first_s": outage_first_s, "sealing": sealing, **report}

    def check_snapshot(self, config: Path) -> dict[str, Any]:
        """What the ship's log says of its snapshot: its records and bytes, the seq of
        ``containers`` it reached (fresh readings of the port call committed before it
        was taken are in it too), and whether it holds, each once, the newest reading up
        to there of every container, the backlog's among them."""
        cfg = load_config(config)
        edge_log = EdgeLog(cfg.log.path, cfg.ship, cfg.streams, cfg.log, readonly=True)
        try:
            copies = edge_log.read(LATEST, 1, 10**9, max_records=10**6)
            of = {c.key: decode_copy(c.payload) for c in copies}
            reach = max((c.seq for c in of.values()), default=0)
            readings = edge_log.read(STREAM, 1, reach, max_records=10**7)
        finally:
            edge_log.close()
        newest = {r.key: r for r in readings}  # in seq order: the last one wins
        backlog = {r.key for r in readings if r.seq <= self.args.records}
        return {
            "records": len(copies),
            "payload_bytes": sum(len(c.payload) for c in copies),
            "reach_seq": reach,
            "backlog_containers": len(backlog),
            "newest_of_every_container": len(of) == len(copies)
            and backlog <= set(of)
            and {k: (c.seq, c.payload) for k, c in of.items()}
            == {k: (r.seq, r.payload) for k, r in newest.items()},
        }

    def wait_sealed(
        self, agent: Proc, metrics_url: str, t_agent: float, config: Path
    ) -> dict[str, Any]:
        """Until the agent sealed every whole segment of the backlog (at sea)."""
        seal = load_config(config).uplink.seal_records
        n = self.args.records
        want = n // seal * seal if seal else 0
        say(f"link: the ship at sea seals {want} of {n} records (link down)")
        sealed = 0.0
        deadline = time.monotonic() + self.args.drain_timeout
        while sealed < want:
            if not agent.alive():
                raise RuntimeError(f"the agent exited:\n{agent.tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the agent sealed {sealed:.0f} of {want} records")
            time.sleep(0.05)
            with contextlib.suppress(OSError, ValueError):
                sealed = total(scrape(metrics_url), "shorelink_edge_sealed_records_total")
        took = time.time() - t_agent
        return {
            "seal_records": seal,
            "records_sealed": int(sealed),
            "agent_start_to_sealed_s": round(took, 2),
            # what sealing costs the ship at sea (one core, not competing with sends)
            "records_per_s": round(sealed / took) if sealed else None,
        }

    def link_report(
        self,
        sent: dict[str, Any],
        outages: list[tuple[float, float]],
        m: Metrics,
        g0: Metrics,
        g1: Metrics,
        spend: int,
        t_start: float,
        t_first: float | None,
        t_done: float,
        toxics: list[str],
        toxics_after: list[str],
    ) -> dict[str, Any]:
        a = self.args
        n = a.records
        # the backlog's batches (with --dark, alerts' batches go too: reported apart)
        sends = [
            {"t0": s[0], "t1": s[1], "bytes": s[2], "first": s[3], "count": s[4], "outcome": s[5]}
            for s in sent["sends"]
            if s[6] == STREAM
        ]
        if not sends:
            raise RuntimeError("the agent recorded no sends")
        ok = [s for s in sends if s["outcome"] == "ok"]
        failed = [s for s in sends if s["outcome"] != "ok"]
        bytes_sent = int(total(m, "shorelink_edge_uplink_bytes_sent_total", link=a.link))
        confirmed = sum(s["bytes"] for s in ok)
        t0 = min(s["t0"] for s in sends)
        t1 = max(s["t1"] for s in ok)
        drain = t1 - t0
        # a failed batch whose first seq went again later was resent; else its reply
        # was lost but the gateway had committed it (the next probe said so)
        again = [
            s
            for s in failed
            if any(
                o["first"] <= s["first"] < o["first"] + o["count"] and o["t0"] > s["t0"] for o in ok
            )
        ]
        rtts = [s["t1"] - s["t0"] for s in ok]
        mean_bytes = confirmed / len(ok)
        in_flight = self.link_settings()["in_flight"]
        window_bps = in_flight * mean_bytes / statistics.mean(rtts)
        around = []
        for off, on in outages:
            cut = [s for s in failed if s["t0"] <= on and s["t1"] >= off - 0.5]
            nxt = min((s["t0"] for s in ok if s["t0"] >= on), default=None)
            last_ok = max((s["t1"] for s in ok if s["t1"] <= off), default=None)
            around.append(
                {
                    "at_s": round(off - t0, 1),
                    "down_s": round(on - off, 2),
                    "batches_cut": len(cut),
                    "bytes_cut": sum(s["bytes"] for s in cut),
                    # sent while the link was already down (the window is settled in
                    # order, so a failure behind the head is noticed late)
                    "batches_started_while_down": sum(1 for s in cut if s["t0"] >= off),
                    "next_send_after_up_s": r3(None if nxt is None else nxt - on),
                    "idle_s": r3(None if nxt is None or last_ok is None else nxt - last_ok),
                }
            )
        in_outage = sum(on - off for off, on in outages if off < t1)
        busy = union_length([(s["t0"], s["t1"]) for s in sends])
        ideal_s = bytes_sent / a.bandwidth
        # bytes that crossed twice: the failed batches whose records went again (a
        # failed batch the gateway had received whole was committed: not resent)
        resent = sum(s["bytes"] for s in again)
        up_s = drain - in_outage
        gw_write_ms = hist_mean_ms(g0, g1, "shorelink_gateway_kafka_write_seconds")
        build_ms = hist_mean_ms({}, m, "shorelink_edge_uplink_batch_build_seconds")
        gw_batches = delta(g0, g1, "shorelink_gateway_batches_written_total")
        return {
            "records": n,
            "wire_bytes_per_record": round(bytes_sent / n, 2),
            # each batch once (confirmed, or committed though its reply was lost)
            "encoded_bytes_per_record": round(
                (confirmed + sum(s["bytes"] for s in failed if s not in again)) / n, 2
            ),
            "drain_s": round(drain, 2),
            "link_up_to_drained_s": round(t_done - t_start, 2),
            "first_byte_after_link_up_s": r3(None if t_first is None else t_first - t_start),
            "records_per_s": round(n / drain),
            "bytes_sent": bytes_sent,
            "bytes_sent_link_spend": spend,
            "bytes_confirmed": confirmed,
            "link_utilisation": round(bytes_sent / (a.bandwidth * drain), 3),
            # over the time the link was up (an outage has no bandwidth to use)
            "link_utilisation_link_up": round(bytes_sent / (a.bandwidth * up_s), 3),
            "goal_link_utilisation": GOALS["link_utilisation"],
            "transfer_s_at_bandwidth": round(ideal_s, 2),
            "resent_bytes": resent,
            "resent_batches": len(again),
            "bytes_sent_not_confirmed": bytes_sent - confirmed,
            "outages": len(outages),
            "resent_batches_per_outage": r3(len(again) / len(outages)) if outages else None,
            "resent_bytes_per_outage": round(resent / len(outages)) if outages else None,
            "goal_resent_batches_per_outage": GOALS["resent_batches_per_outage"],
            # batches refused with 409: one that reached the gateway before the batch
            # ahead of it (pipelined on another connection) breaks the window behind it
            "batches_refused_409": sum(1 for s in failed if s["outcome"].startswith("GatewayGap")),
            "failed_batches_sent_again": len(again),
            "failed_batches_committed_anyway": len(failed) - len(again),
            "batches_confirmed": len(ok),
            "mean_batch_bytes": round(mean_bytes),
            "mean_batch_records": round(sum(s["count"] for s in ok) / len(ok)),
            "send_rtt_s": {
                "p50": r3(pct(rtts, 0.5)),
                "p90": r3(pct(rtts, 0.9)),
                "max": r3(max(rtts)),
                "mean": r3(statistics.mean(rtts)),
            },
            "mean_batches_in_flight": round(sum(s["t1"] - s["t0"] for s in sends) / drain, 2),
            "time_with_a_batch_in_flight": round(busy / drain, 3),
            # bytes over the time something was in flight: what outages and the retry
            # backoff after them cost is left out, the pipeline's own losses stay in
            "link_utilisation_while_sending": round(bytes_sent / (a.bandwidth * busy), 3),
            "time_in_outage_s": round(in_outage, 2),
            "window_bound_bytes_s": round(window_bps),
            "gateway_kafka_write_ms_mean": gw_write_ms,
            "gateway_batch_bound_bytes_s": round(mean_bytes / (gw_write_ms / 1000))
            if gw_write_ms
            else None,
            # what bounds the drain besides the link: the agent building batches (read
            # from the log + encode, one after another) and the gateway writing them
            "agent_build_ms_mean": build_ms,
            "agent_build_bound_bytes_s": round(mean_bytes / (build_ms / 1000))
            if build_ms
            else None,
            "agent_batches_from_segments": int(
                total(m, "shorelink_edge_uplink_sealed_batches_total")
            ),
            "gateway_batches_written": int(gw_batches),
            "gateway_records_already_held": int(
                delta(g0, g1, "shorelink_gateway_records_already_held_total")
            ),
            "agent_batches_failed": {
                dict(lab).get("reason", ""): int(v)
                for (name, lab), v in m.items()
                if name == "shorelink_edge_uplink_batches_failed_total"
            },
            "agent_gaps_409": int(total(m, "shorelink_edge_uplink_gaps_total")),
            "failed_send_errors": dict(
                Counter(s["outcome"].split(":", 2)[-1].strip()[:80] for s in failed)
            ),
            "probes": len(sent["probes"]),
            "probes_failed": sum(1 for p in sent["probes"] if p[2] != "ok"),
            "around_outages": around,
            "effective": self.link_settings(),
            "toxics": toxics,
            "toxics_after_outages": toxics_after,
        }

    # -- 2. exactly once ---------------------------------------------------------------------
    def verify(self) -> None:
        drained = [SHIP, CUT_SHIP] if "link_cut" in self.result else [SHIP]
        last = {ship: self.args.records for ship in drained}
        if "dark" in self.result:
            last[SHIP] = self.fresh_last
        ok, detail, seconds = self.stack.verify(last)
        if "dark" in self.result:
            for stream, last_seq in ((ALERTS, self.alerts_last), (LATEST, self.latest_last)):
                ok_more, detail_more, more = self.stack.verify({SHIP: last_seq}, stream)
                ok = ok and ok_more
                detail = {**detail, f"{SHIP}/{stream}": detail_more[SHIP]}
                seconds += more
        self.result["exactly_once"] = ok
        self.result["exactly_once_detail"] = detail
        self.result["verify_s"] = seconds


# -- command line --------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = bench_parser("bench/link_drain.py", __doc__)
    add_run_options(
        p,
        "small sizes, the cut 1 s into the drain: a run of about 50 seconds",
        "logs, configs, the ship's log",
    )
    p.add_argument(
        "--records", type=int, default=None, help="backlog to drain (default 500000; quick 300000)"
    )
    p.add_argument(
        "--link",
        choices=("port_wifi", "cellular"),
        default="port_wifi",
        help="link class the gateway is reached over (default port_wifi)",
    )
    p.add_argument(
        "--batch-records", type=int, default=None, help="override the link's batch_max_records"
    )
    p.add_argument(
        "--batch-bytes", type=int, default=None, help="override the link's batch_max_bytes"
    )
    p.add_argument("--in-flight", type=int, default=None, help="override the link's in_flight")
    p.add_argument("--retry-min", default=None, help='override uplink.retry_min (e.g. "200ms")')
    p.add_argument("--retry-max", default=None, help='override uplink.retry_max (e.g. "5s")')
    p.add_argument(
        "--seal-records",
        type=int,
        default=None,
        help="override uplink.seal_records (0: no sealing at sea, every batch is encoded "
        "while the link waits)",
    )
    p.add_argument(
        "--bandwidth",
        type=int,
        default=250_000,
        help="link bandwidth in bytes/s, each direction (default 250000: 2 Mbit/s)",
    )
    p.add_argument(
        "--bandwidth-mode",
        choices=("per-connection", "shared"),
        default="per-connection",
        help="per-connection: toxiproxy's bandwidth toxic, which limits each TCP connection "
        "on its own (default); shared: one limit for all the agent's connections, as on a "
        "real link (a relay in this script, in front of toxiproxy)",
    )
    p.add_argument(
        "--latency-ms",
        type=int,
        default=300,
        help="latency added ship->shore, ms (default 300)",
    )
    p.add_argument("--outage-s", type=float, default=2.0, help="outage length (default 2)")
    p.add_argument(
        "--outage-every-s",
        type=float,
        default=None,
        help="an outage this often (default 60; quick 5)",
    )
    p.add_argument(
        "--outage-first-s",
        type=float,
        default=None,
        help="first outage this long after the first batch went out (default 60; quick 5)",
    )
    p.add_argument(
        "--cut-at-s",
        type=float,
        default=None,
        help="then drain another ship's backlog with its first outage this long after its "
        "first batch (default 1.5; quick 1; a negative value skips that drain)",
    )
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=None,
        help="give up draining after this many seconds (default 420; quick 90)",
    )
    p.add_argument(
        "--warmup-records",
        type=int,
        default=None,
        help="records uploaded to the gateway on loopback before the drains, not counted "
        "(default 200000; quick 50000; 0: none)",
    )
    p.add_argument(
        "--dark",
        action="store_true",
        help="a month dark, then a short port call: alerts among the backlog and alerts "
        "with fresh readings published during the drain; when each arrived (no cut drain)",
    )
    p.add_argument(
        "--alerts-before",
        type=int,
        default=5,
        help="with --dark: alerts committed at sea among the backlog (default 5)",
    )
    p.add_argument(
        "--alert-every-s",
        type=float,
        default=2.0,
        help="with --dark: an alert published this often during the drain (default 2)",
    )
    p.add_argument(
        "--live-readings",
        type=int,
        default=100,
        help="with --dark: fresh container readings published beside each alert (default 100)",
    )
    p.add_argument("--role", choices=("agent",), help=argparse.SUPPRESS)
    p.add_argument("--config", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--record", type=Path, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    fill_defaults(
        a,
        {
            "records": (300_000, 500_000),
            "outage_every_s": (5.0, 60.0),
            "outage_first_s": (5.0, 60.0),
            "cut_at_s": (1.0, 1.5),
            "drain_timeout": (90.0, 420.0),
            "warmup_records": (50_000, 200_000),
        },
    )
    require_at_least_one(p, a, "records")
    if a.warmup_records < 0:
        p.error("--warmup-records must not be negative")
    if a.bandwidth < 1000 or a.latency_ms < 0 or a.outage_s < 0 or a.outage_every_s <= a.outage_s:
        p.error("need --bandwidth >= 1000, --latency-ms >= 0, 0 <= --outage-s < --outage-every-s")
    if a.alerts_before < 0 or a.alert_every_s <= 0 or a.live_readings < 0:
        p.error("need --alerts-before >= 0, --alert-every-s > 0, --live-readings >= 0")
    if a.cut_at_s is not None and a.cut_at_s < 0:
        a.cut_at_s = None
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.role == "agent":
        asyncio.run(agent_role(args.config, args.record))
        return 0
    return run_bench(
        say, args.keep, "link-drain-", lambda work: Bench(args, work), errors=(ShorelinkError,)
    )


if __name__ == "__main__":
    sys.exit(main())
