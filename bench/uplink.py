"""Benchmark: a ship's backlog drained over a slow, flaky link; the gateway's ingest rate.

All real, on loopback: a single-node Kafka (``local_stack.kafka``), the gateway
(``core_gateway.cli.serve``) and the edge agent (``edge_agent.agent.Agent``) as processes
of their own (ship and shore do not share a CPU or a GIL in production either: this
script starts itself with ``--role gateway`` / ``--role agent``), toxiproxy for the link.

1. ingest (first: it also warms the broker and the gateway up, as a port's Kafka that
   has run for months is; a drain of a few seconds on a cold broker measures the JIT):
   the gateway on loopback (no toxiproxy) takes ``--ingest-records`` records as
   pre-encoded batches of ``--ingest-batch`` (``shorelink.wire.encode_batch``) sent
   flat out with the edge agent's own client (``HttpGateway``: the WebSocket upload,
   ``--ingest-window`` batches in flight per ship), ``--ingest-ships`` ships in
   parallel: records/s committed. Beside it, a bare confluent-kafka producer
   (idempotent, linger 5 ms, lz4, acks=all) produces the same records with the same
   key, value and headers (``shorelink.contract.Record(...).headers()``) to another
   topic: records/s to ``flush()``. An uncounted warm-up round of both, then rounds
   alternate (``--ingest-rounds``, medians reported).
2. link: ``--records`` container readings (1,000 containers reporting once a minute,
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
   (60 s, as the issue has it: a drain of a few seconds sees none). Then the same for a
   second ship ("link_cut") whose first outage comes ``--cut-at-s`` into its drain:
   what an outage costs. Reported: wire bytes per record (bytes sent / records), drain
   time (first batch sent -> last batch confirmed), link utilisation (bytes sent /
   (bandwidth x drain time), and over the time the link was up), resent bytes (bytes
   of failed batches whose records were sent again), what went on around each outage,
   and what bounds the throughput. Bytes sent come from the agent's Prometheus counter
   and its persisted link spend; which batches the gateway confirmed comes from a
   recording wrapper around the agent's ``HttpGateway`` (times, sizes, outcome of
   every batch).
3. exactly once: ``sl.ingress.containers`` is read to its end (read_committed): every
   seq of every ship exactly once.

    .venv/bin/python bench/uplink.py --quick     # ~35 seconds (300k records, cut 1 s into the drain)
    .venv/bin/python bench/uplink.py             # full run, ~75 seconds
    .venv/bin/python bench/uplink.py --in-flight 6 --bandwidth-mode shared

Progress goes to stderr; one JSON object goes to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from _common import exit_on_signals, progress, require_at_least_one, work_dir
from prometheus_client.parser import text_string_to_metric_families
from telemetry import Container, fleet

from edge_agent.budget import utc_day
from edge_agent.config import load_config
from edge_agent.gateway import SendResult
from edge_agent.log import EdgeLog, Incoming
from local_stack.kafka import KafkaBroker, start_kafka
from local_stack.process import Proc, free_port, stop_procs
from local_stack.toxiproxy import Toxiproxy, start_toxiproxy
from shorelink.errors import ShorelinkError
from shorelink.ranges import RangeSet
from shorelink.wire import WireRecord, peek_header

SHIP = "bigblue"
#: the second drain's ship (the same backlog, an outage in the middle of the drain)
CUT_SHIP = "redstar"
SITE = "tokyo"
STREAM = "containers"
CONTAINERS = 1000
BARE_TOPIC = "bench.bare.containers"
INGRESS_PARTITIONS = 6  # the gateway's default
GOALS = {"link_utilisation": 0.85, "resent_batches_per_outage": 1.0, "ingest_ratio": 0.5}
REPO = Path(__file__).resolve().parent.parent

AGENT_CONFIG = """\
ship = "{ship}"
log_level = "info"

[mqtt]
# nothing listens here: the log is filled directly, the agent only uploads
host = "127.0.0.1"
port = {mqtt_port}
client_id = "shorelink-edge-bench-uplink"
subscriptions = ["{ship}/#"]

[log]
path = "{log_path}"
max_bytes = "4GB"

[metrics]
host = "127.0.0.1"
port = {metrics_port}

[streams.alerts]
priority = 0
on_full = "reject"

[streams.nav]
priority = 10

[streams.containers]
priority = 50

[[rules]]
filter = "{ship}/+/containers/+/env"
stream = "containers"
key = "{{4}}"
ts_field = "ts"

[uplink]
token = "{token}"
{uplink}
[links.{link}]
{link_overrides}
[[gateways]]
site = "{site}"
url = "http://127.0.0.1:{proxy_port}"
link = "{link}"
"""

GATEWAY_CONFIG = """\
site = "{site}"
credentials_file = "{credentials}"
streams = ["alerts", "nav", "containers"]
log_level = "info"

[listen]
host = "127.0.0.1"
port = {port}

[kafka]
bootstrap = "{bootstrap}"
transactional_id = "bench-gateway-{site}"
ingress_partitions = {partitions}
"""


say = progress("uplink")


# -- the workload: container telemetry -----------------------------------------------------
def fleet_in_arrival_order(rng: random.Random, n: int = CONTAINERS) -> list[Container]:
    return sorted(fleet(rng, n), key=lambda c: c.phase_ms)  # arrival order within a minute


def readings(ship: str, n: int, seed: int, end_ms: int) -> Iterator[tuple[str, int, str, bytes]]:
    """``n`` readings ``(key, ts_ms, topic, payload)`` in arrival order: every container
    once a minute, the last minute ending at ``end_ms``."""
    rng = random.Random(seed)
    boxes = fleet_in_arrival_order(rng)
    minutes = math.ceil(n / len(boxes))
    start = end_ms - minutes * 60_000
    done = 0
    for minute in range(minutes):
        for c in boxes:
            if done == n:
                return
            ts = start + minute * 60_000 + c.phase_ms
            yield c.id, ts, c.topic(ship), c.reading(rng, ts)
            done += 1


# -- small helpers -----------------------------------------------------------------------
Metrics = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Metrics:
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    out: Metrics = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out


def total(m: Metrics, name: str, **labels: str) -> float:
    """Sum of ``name`` over the series whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, lab), v in m.items() if n == name and want <= set(lab))


def delta(before: Metrics, after: Metrics, name: str, **labels: str) -> float:
    return total(after, name, **labels) - total(before, name, **labels)


def hist_mean_ms(before: Metrics, after: Metrics, name: str) -> float | None:
    n = delta(before, after, name + "_count")
    return round(delta(before, after, name + "_sum") / n * 1000, 1) if n else None


def get_json(url: str, token: str | None = None, timeout: float = 3.0) -> Any:
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def r3(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


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
            self.sends.append([t0, time.time(), len(body), h.first_seq, h.count, repr(exc)[:200]])
            raise
        self.sends.append([t0, time.time(), len(body), h.first_seq, h.count, "ok"])
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


async def gateway_role(config: Path) -> None:
    from core_gateway.cli import serve
    from core_gateway.config import load_config as load_gateway_config
    from shorelink.logs import configure_logging

    cfg = load_gateway_config(config)
    configure_logging(cfg.log_level)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await serve(cfg, install_signals=False, started=asyncio.Event(), stop=stop)


class SharedShaper:
    """A TCP relay whose bandwidth is shared by all its connections (one virtual clock
    per direction), for ``--bandwidth-mode shared``: toxiproxy's bandwidth toxic limits
    each connection on its own, so ``in_flight`` batches on as many connections get
    ``in_flight`` times the bandwidth. Runs its own event loop in a thread; when the far
    side closes (toxiproxy disabled: an outage) the near side is closed too."""

    CHUNK = 8192

    def __init__(self, listen_port: int, target_port: int, rate: int) -> None:
        self.listen_port = listen_port
        self.target_port = target_port
        self.rate = rate
        self._next = {"up": 0.0, "down": 0.0}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="shaper", daemon=True)
        self.error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()
        if not self._started.wait(10) or self.error is not None:
            raise RuntimeError(f"shaper did not start: {self.error}")

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported by start() or ignored at stop
            self.error = exc
            self._started.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._relay, "127.0.0.1", self.listen_port)
        self._started.set()
        async with server:
            await self._stop.wait()

    async def _relay(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        try:
            ur, uw = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            cw.close()
            return
        pumps = [
            asyncio.create_task(self._pump(cr, uw, "up")),
            asyncio.create_task(self._pump(ur, cw, "down")),
        ]
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for t in pumps:
            t.cancel()
        for w in (cw, uw):
            w.close()

    async def _pump(self, r: asyncio.StreamReader, w: asyncio.StreamWriter, way: str) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await r.read(self.CHUNK):
                now = time.monotonic()
                start = max(now, self._next[way])
                self._next[way] = start + len(data) / self.rate
                await asyncio.sleep(self._next[way] - now)
                w.write(data)
                await w.drain()


def start_role(role: str, name: str, config: Path, logs: Path, *extra: str) -> Proc:
    argv = [sys.executable, str(Path(__file__).resolve()), "--role", role, "--config", str(config)]
    return Proc.start(name, [*argv, *extra], logs / f"{name}.log", cwd=REPO)


# -- the benchmark -----------------------------------------------------------------------
class Bench:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.logs = work / "logs"
        self.procs: list[Proc] = []
        self.kafka: KafkaBroker | None = None
        self.toxiproxy: Toxiproxy | None = None
        self.gateway: Proc | None = None
        self.gw_port = free_port()
        self.tokens: dict[str, str] = {}
        self.ingest_ships = [f"loop{i}" for i in range(1, args.ingest_ships + 1)]
        self.ingest_next_seq = dict.fromkeys(self.ingest_ships, 1)
        self.result: dict[str, Any] = {"benchmark": "uplink"}

    def cleanup(self) -> None:
        if self.toxiproxy is not None:
            for ship in (SHIP, CUT_SHIP):
                with contextlib.suppress(Exception):
                    self.toxiproxy.set_enabled(f"{ship}-to-{SITE}", True)
        stop_procs([p for p in self.procs if p.alive()], grace=20)

    @property
    def gw_url(self) -> str:
        return f"http://127.0.0.1:{self.gw_port}"

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
            "ingest_records_per_round": a.ingest_records,
            "ingest_batch": a.ingest_batch,
            "ingest_ships": a.ingest_ships,
            "ingest_window": a.ingest_window,
            "ingest_rounds": a.ingest_rounds,
        }
        # this machine's other load skews every number here: keep it beside them
        self.result["loadavg_1m_at_start"] = round(os.getloadavg()[0], 2)
        self.start_stack()
        # first, because it also warms the broker and the gateway up (JIT, connections,
        # partition leaders): a port's Kafka has been running for months, and a drain of
        # a few seconds measured on a cold broker measures its warm-up
        self.ingest_phase()
        # as the issue has it (an outage every --outage-every-s, the first at
        # --outage-first-s), then the same backlog of another ship with one outage in
        # the middle of its drain (what an outage costs)
        self.result["link"] = self.link_phase(SHIP, a.outage_first_s)
        if a.cut_at_s is not None:
            self.result["link_cut"] = self.link_phase(CUT_SHIP, a.cut_at_s)
        self.verify()
        self.result["loadavg_1m_at_end"] = round(os.getloadavg()[0], 2)
        self.result["seconds_total"] = round(time.monotonic() - t0, 1)
        return self.result

    # -- processes ---------------------------------------------------------------------------
    def start_stack(self) -> None:
        from core_gateway.auth import Credentials

        say("starting kafka")
        try:
            self.kafka = start_kafka(SITE, self.work / "kafka", self.logs)
        except ShorelinkError as exc:
            if "storage format failed" not in str(exc):
                raise
            # a random cluster id that starts with "-" reads as an option to
            # kafka-storage (local_stack/kafka.py): a new id is one retry away
            say("kafka: storage format failed (cluster id?); once more")
            shutil.rmtree(self.work / "kafka", ignore_errors=True)
            self.kafka = start_kafka(SITE, self.work / "kafka", self.logs)
        self.procs.append(self.kafka.proc)
        say(f"kafka at {self.kafka.bootstrap}; starting toxiproxy")
        server = start_toxiproxy(self.logs)
        self.procs.append(server.proc)
        self.toxiproxy = server.client()
        creds = Credentials(self.work / "gateway" / "ships.json")
        for ship in [SHIP, CUT_SHIP, *self.ingest_ships]:
            self.tokens[ship] = creds.add(ship)
        config = self.work / "gateway" / "gateway.toml"
        config.write_text(
            GATEWAY_CONFIG.format(
                site=SITE,
                credentials=creds.path,
                port=self.gw_port,
                bootstrap=self.kafka.bootstrap,
                partitions=INGRESS_PARTITIONS,
            )
        )
        self.gateway = start_role("gateway", "gateway", config, self.logs)
        self.procs.append(self.gateway)

        def ready() -> bool:
            try:
                return bool(get_json(self.gw_url + "/readyz").get("ready"))
            except (OSError, ValueError):
                return False

        self.gateway.wait_ready(ready, timeout=90)
        say(f"gateway ready at {self.gw_url}")

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

    def write_agent_config(self, ship: str, metrics_port: int, proxy_port: int) -> Path:
        def toml(d: dict[str, Any]) -> str:
            return "".join(
                f"{k} = {json.dumps(v) if isinstance(v, str) else v}\n" for k, v in d.items()
            )

        path = self.work / ship / "edge.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            AGENT_CONFIG.format(
                ship=ship,
                site=SITE,
                mqtt_port=free_port(),
                log_path=self.work / ship / "edge.db",
                metrics_port=metrics_port,
                token=self.tokens[ship],
                uplink=toml(self.uplink_overrides()),
                link=self.args.link,
                link_overrides=toml(self.link_overrides()),
                proxy_port=proxy_port,
            )
        )
        return path

    def prefill(self, config: Path, n: int) -> None:
        say(f"link: committing {n} records to the ship's log")
        cfg = load_config(config)
        edge_log = EdgeLog(
            cfg.log.path, cfg.ship, cfg.streams, replace(cfg.log, synchronous="normal")
        )
        t0 = time.monotonic()
        batch: list[Incoming] = []
        try:
            for key, ts, topic, payload in readings(cfg.ship, n, 1, int(time.time() * 1000)):
                batch.append(Incoming(STREAM, key, ts, ts + 20, topic, payload))
                if len(batch) == 5000:
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
        assert self.toxiproxy is not None
        tp = self.toxiproxy
        proxy = f"{ship}-to-{SITE}"
        metrics_port, proxy_port = free_port(), free_port()
        config = self.write_agent_config(ship, metrics_port, proxy_port)
        self.prefill(config, a.records)
        shaper: SharedShaper | None = None
        if a.bandwidth_mode == "shared":
            # agent -> shaper (shared bandwidth) -> toxiproxy (latency, outages) -> gateway
            toxi_port = free_port()
            tp.create_proxy(proxy, f"127.0.0.1:{toxi_port}", f"127.0.0.1:{self.gw_port}")
            shaper = SharedShaper(proxy_port, toxi_port, a.bandwidth)
            shaper.start()
        else:
            tp.create_proxy(proxy, f"127.0.0.1:{proxy_port}", f"127.0.0.1:{self.gw_port}")
            rate_kb = max(1, round(a.bandwidth / 1000))  # toxiproxy: KB/s of 1000 bytes
            tp.add_toxic(proxy, "bandwidth", name="bw_up", stream="upstream", rate=rate_kb)
            tp.add_toxic(proxy, "bandwidth", name="bw_down", stream="downstream", rate=rate_kb)
        if a.latency_ms:
            tp.add_toxic(proxy, "latency", name="lat_up", stream="upstream", latency=a.latency_ms)
        toxics = sorted(t["name"] for t in tp.proxies()[proxy]["toxics"])
        record = self.work / ship / "sends.json"
        agent_metrics = f"http://127.0.0.1:{metrics_port}/metrics"
        g0 = scrape(self.gw_url + "/metrics")
        say(
            f"link: {ship}'s agent drains {a.records} records over {a.link} "
            f"({a.bandwidth} B/s, {a.latency_ms} ms, {a.outage_s:g}s outage every "
            f"{a.outage_every_s:g}s from {outage_first_s:g}s)"
        )
        # the ship at sea: the agent starts with the link down and seals its backlog
        # (edge_agent/sealing.py); then it reaches port and the link comes up
        tp.set_enabled(proxy, False)
        t_agent = time.time()
        agent = start_role("agent", "agent", config, self.logs, "--record", str(record))
        self.procs.append(agent)
        sealing = self.wait_sealed(agent, agent_metrics, t_agent, config)
        tp.set_enabled(proxy, True)
        t_start = time.time()
        outages: list[tuple[float, float]] = []
        deadline = time.monotonic() + a.drain_timeout
        t_first: float | None = None
        t_done: float | None = None
        next_poll = 0.0
        last_say = time.monotonic()
        held = RangeSet()
        want = f"1-{a.records}"
        try:
            while t_done is None:
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
                if now_m >= next_poll:
                    next_poll = now_m + 0.2
                    with contextlib.suppress(OSError, ValueError):
                        body = get_json(
                            f"{self.gw_url}/v1/ships/{ship}/holdings", self.tokens[ship]
                        )
                        held = RangeSet.parse(body["streams"][STREAM])
                        if str(held) == want:
                            t_done = time.time()
                if now_m - last_say > 10:
                    last_say = now_m
                    say(f"link: site holds {held.count()}/{a.records}")
                time.sleep(0.01)
            say(f"link: drained in {t_done - (t_first or t_start):.1f}s; {len(outages)} outages")
            time.sleep(0.3)  # the agent settles the last reply
            m = scrape(agent_metrics)
            g1 = scrape(self.gw_url + "/metrics")
            toxics_after = sorted(t["name"] for t in tp.proxies()[proxy]["toxics"])
        finally:
            tp.set_enabled(proxy, True)
            agent.stop(grace=30)
            if shaper is not None:
                shaper.stop()
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
        return {"ship": ship, "outage_first_s": outage_first_s, "sealing": sealing, **report}

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
        sends = [
            {"t0": s[0], "t1": s[1], "bytes": s[2], "first": s[3], "count": s[4], "outcome": s[5]}
            for s in sent["sends"]
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

    # -- 3. the gateway's ingest rate on loopback ---------------------------------------------
    def ingest_records(self, ship: str, n: int, seed: int) -> list[WireRecord]:
        first = self.ingest_next_seq[ship]
        self.ingest_next_seq[ship] = first + n
        return [
            WireRecord(first + i, key, ts, topic, payload)
            for i, (key, ts, topic, payload) in enumerate(
                readings(ship, n, seed, int(time.time() * 1000))
            )
        ]

    def ingest_phase(self) -> None:
        from shorelink.wire import Batch, encode_batch

        a = self.args
        assert self.kafka is not None
        from shorelink.topics import TopicSpec, ensure_topics

        ensure_topics(self.kafka.bootstrap, [TopicSpec(BARE_TOPIC, partitions=INGRESS_PARTITIONS)])
        per_ship = a.ingest_records // len(self.ingest_ships)
        gw_rates: list[float] = []
        bare_rates: list[float] = []
        writes: list[float | None] = []
        req_ms: list[float] = []
        # round 0 is not counted: it warms the broker, the gateway and the producer up
        # alike (JIT, connections, partition leaders), so neither side's first round
        # pays for starting the stack
        for r in range(0, a.ingest_rounds + 1):
            recs = {
                s: self.ingest_records(s, per_ship, 100 * r + i)
                for i, s in enumerate(self.ingest_ships)
            }
            bodies = {
                s: [
                    encode_batch(Batch(s, STREAM, tuple(rs[i : i + a.ingest_batch])))
                    for i in range(0, len(rs), a.ingest_batch)
                ]
                for s, rs in recs.items()
            }
            n = sum(len(rs) for rs in recs.values())
            g0 = scrape(self.gw_url + "/metrics")
            say(f"ingest round {r}/{a.ingest_rounds}: gateway, {n} records")  # 0: warm-up
            elapsed, lat = asyncio.run(self.post_all(bodies, recs))
            g1 = scrape(self.gw_url + "/metrics")
            if not r:
                self.bare_produce(recs)
                say("ingest: warm-up round done (not counted)")
                continue
            gw_rates.append(n / elapsed)
            writes.append(hist_mean_ms(g0, g1, "shorelink_gateway_kafka_write_seconds"))
            req_ms += lat
            say(f"ingest round {r}: gateway {n / elapsed:.0f} records/s")
            say(f"ingest round {r}/{a.ingest_rounds}: bare producer, {n} records")
            bare_s = self.bare_produce(recs)
            bare_rates.append(n / bare_s)
            say(f"ingest round {r}: bare producer {n / bare_s:.0f} records/s")
        gw = statistics.median(gw_rates)
        bare = statistics.median(bare_rates)
        self.result["ingest"] = {
            "records_per_round": per_ship * len(self.ingest_ships),
            "gateway_records_s": round(gw),
            "bare_producer_records_s": round(bare),
            "ratio": round(gw / bare, 3),
            "goal_ratio": GOALS["ingest_ratio"],
            "rounds": {
                "gateway_records_s": [round(x) for x in gw_rates],
                "bare_producer_records_s": [round(x) for x in bare_rates],
                "gateway_kafka_write_ms_mean": writes,
            },
            "request_ms": {"p50": r3(pct(req_ms, 0.5)), "p90": r3(pct(req_ms, 0.9))},
            "wire_bytes_per_record": round(
                sum(len(b) for bs in bodies.values() for b in bs) / n, 2
            ),
        }

    async def post_all(
        self, bodies: dict[str, list[bytes]], recs: dict[str, list[WireRecord]]
    ) -> tuple[float, list[float]]:
        """Every ship's batches through the edge agent's own client (``HttpGateway``:
        the WebSocket upload), ``--ingest-window`` batches in flight per ship."""
        from edge_agent.config import DEFAULT_LINKS
        from edge_agent.config import GatewayConfig as EdgeGatewayConfig
        from edge_agent.gateway import HttpGateway
        from shorelink.config import Secret

        lat: list[float] = []
        link = replace(DEFAULT_LINKS["port_wifi"], timeout_s=120.0)

        async def one_ship(ship: str) -> None:
            gw = HttpGateway(
                EdgeGatewayConfig(SITE, self.gw_url, "port_wifi"),
                link,
                ship,
                Secret(self.tokens[ship]),
            )
            window = asyncio.Semaphore(self.args.ingest_window)

            async def send(body: bytes) -> SendResult:
                async with window:
                    t = time.perf_counter()
                    res = await gw.send(STREAM, body)
                    lat.append((time.perf_counter() - t) * 1000)
                    return res

            try:
                results = await asyncio.gather(*(send(b) for b in bodies[ship]))
            finally:
                await gw.close()
            want = recs[ship][-1].seq
            if results[-1].held.contiguous_end() != want:
                raise RuntimeError(f"ingest: {ship}: the gateway holds {results[-1].held}")

        t0 = time.perf_counter()
        await asyncio.gather(*(one_ship(s) for s in bodies))
        return time.perf_counter() - t0, lat

    def bare_produce(self, recs: dict[str, list[WireRecord]]) -> float:
        from confluent_kafka import Producer

        from shorelink.contract import Record
        from shorelink.identity import Identity

        assert self.kafka is not None
        p = Producer(
            {
                "bootstrap.servers": self.kafka.bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "compression.type": "lz4",
                "queue.buffering.max.messages": 500_000,
            }
        )
        p.list_topics(timeout=10)  # connected before the clock starts
        failed = 0

        def on_delivery(err: Any, _msg: Any) -> None:
            nonlocal failed
            if err is not None:
                failed += 1

        t0 = time.perf_counter()
        for ship, rs in recs.items():
            for r in rs:
                rec = Record(
                    Identity(ship, STREAM, r.seq), r.key.encode(), r.payload, r.ts_ms, SITE, r.topic
                )
                while True:
                    try:
                        p.produce(
                            BARE_TOPIC,
                            value=rec.value,
                            key=rec.key,
                            headers=rec.headers(),
                            on_delivery=on_delivery,
                        )
                        break
                    except BufferError:
                        p.poll(0.05)
                p.poll(0)
        left = p.flush(60)
        elapsed = time.perf_counter() - t0
        if left or failed:
            raise RuntimeError(f"bare producer: {left} not flushed, {failed} failed")
        return elapsed

    # -- 2. exactly once ---------------------------------------------------------------------
    def verify(self) -> None:
        from shorelink.contract import H_ORIGIN, H_SEQ, ingress_topic
        from shorelink.kafka_io import read_to_end

        assert self.kafka is not None
        say(f"verify: reading {ingress_topic(STREAM)} to its end")
        t0 = time.monotonic()
        counts: dict[str, Counter[int]] = {}
        for msg in read_to_end(self.kafka.bootstrap, [ingress_topic(STREAM)], timeout=300):
            h = dict(msg.headers() or [])
            origin = h[H_ORIGIN].decode()
            counts.setdefault(origin, Counter())[int(h[H_SEQ])] += 1

        def check(origin: str, last: int) -> dict[str, Any]:
            c = counts.get(origin, Counter())
            return {
                "expected": last,
                "distinct": len(c),
                "missing": sum(1 for s in range(1, last + 1) if s not in c),
                "doubled": sum(1 for v in c.values() if v > 1),
                "unexpected": sum(1 for s in c if not 1 <= s <= last),
            }

        drained = [SHIP, CUT_SHIP] if "link_cut" in self.result else [SHIP]
        link = {ship: check(ship, self.args.records) for ship in drained}
        self.result["exactly_once"] = all(
            d["distinct"] == d["expected"] and not d["doubled"] and not d["unexpected"]
            for d in link.values()
        )
        self.result["exactly_once_detail"] = link
        ingest = {s: check(s, self.ingest_next_seq[s] - 1) for s in self.ingest_ships}
        self.result["ingest"]["exactly_once"] = all(
            d["distinct"] == d["expected"] and not d["doubled"] and not d["unexpected"]
            for d in ingest.values()
        )
        self.result["verify_s"] = round(time.monotonic() - t0, 1)
        say(f"verify: exactly once = {self.result['exactly_once']} ({link})")


# -- command line --------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Progress goes to stderr; one JSON object goes to stdout.",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="small sizes, the cut 1 s into the drain: a run of about 35 seconds",
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
        "--ingest-records",
        type=int,
        default=None,
        help="records per gateway ingest round (default 200000; quick 50000)",
    )
    p.add_argument("--ingest-batch", type=int, default=5000, help="records a batch (default 5000)")
    p.add_argument(
        "--ingest-ships", type=int, default=2, help="ships uploading in parallel (default 2)"
    )
    p.add_argument(
        "--ingest-window",
        type=int,
        default=4,
        help="batches in flight per ship on its upload connection (default 4)",
    )
    p.add_argument(
        "--ingest-rounds",
        type=int,
        default=None,
        help="alternating gateway/bare rounds, medians reported (default 3; quick 1)",
    )
    p.add_argument(
        "--keep",
        type=Path,
        default=None,
        metavar="DIR",
        help="work in DIR and keep it (logs, configs, the ship's log) instead of a temp dir",
    )
    p.add_argument("--role", choices=("agent", "gateway"), help=argparse.SUPPRESS)
    p.add_argument("--config", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--record", type=Path, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    q = a.quick
    defaults = {
        "records": (300_000, 500_000),
        "outage_every_s": (5.0, 60.0),
        "outage_first_s": (5.0, 60.0),
        "cut_at_s": (1.0, 1.5),
        "drain_timeout": (90.0, 420.0),
        "ingest_records": (50_000, 200_000),
        "ingest_rounds": (1, 3),
    }
    for name, (quick, full) in defaults.items():
        if getattr(a, name) is None:
            setattr(a, name, quick if q else full)
    require_at_least_one(
        p,
        a,
        "records",
        "ingest_records",
        "ingest_batch",
        "ingest_ships",
        "ingest_window",
        "ingest_rounds",
    )
    if a.bandwidth < 1000 or a.latency_ms < 0 or a.outage_s < 0 or a.outage_every_s <= a.outage_s:
        p.error("need --bandwidth >= 1000, --latency-ms >= 0, 0 <= --outage-s < --outage-every-s")
    if a.cut_at_s is not None and a.cut_at_s < 0:
        a.cut_at_s = None
    if a.ingest_records < a.ingest_ships:
        p.error("--ingest-records must be at least --ingest-ships")
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.role == "agent":
        asyncio.run(agent_role(args.config, args.record))
        return 0
    if args.role == "gateway":
        asyncio.run(gateway_role(args.config))
        return 0
    # SIGTERM/SIGHUP unwind through the finally blocks: every process we started stops
    exit_on_signals(say)
    with work_dir(args.keep, "uplink-") as work:
        bench = Bench(args, work)
        try:
            result = bench.run()
        except (
            RuntimeError,
            ShorelinkError,
            subprocess.SubprocessError,
            OSError,
        ) as exc:
            say(f"failed: {exc}; logs in {work / 'logs'}" + ("" if args.keep else " (removed)"))
            for p in bench.procs:
                say(f"--- {p.name} ({p.log}):\n{p.tail(10)}")
            return 1
        finally:
            bench.cleanup()
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
