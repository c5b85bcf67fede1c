"""Benchmark: one site's gateway taking a fleet's uploads at growing fleet sizes, side
by side, and an alert entering during the load.

The first part of the fleet bench (issue "A fleet's worth"): what one site's gateway and
Kafka cost as the fleet grows, per ship. All real, on loopback: a single-node Kafka and
the gateway as a process of its own (``bench/_stack.py``), a fresh stack per size. For
each fleet size N (``--ships``, default 50, 200 and 700):

1. every ship uploads a slice of its day on its real streams (``bench/_shipday.py``,
   from the voyage's generators): container readings (2,500 containers reporting
   hourly), AIS every 10 s and the ship's own sensors (``nav``), the ship report
   (``agent``), in a real day's proportions, ``--records-per-ship`` records. Most ships
   are at sea and send the satellite link's batches (200 records); a
   ``--docking-share`` of them dock with a month's backlog (``--backlog`` times as many
   records) and send the port link's batches (50,000 records, 8 MiB). Each ship
   uploads through the edge agent's own client (``HttpGateway``: the WebSocket
   upload), its streams in the agent's priority order, ``--window`` batches in flight,
   all ships at once, with a token and credentials each;
2. meanwhile one ship raises an alert every ``--alert-every`` seconds on its ``alerts``
   stream (a batch of one record, on its own upload connection): the time from send to
   the gateway's answer, which comes once Kafka committed it, is the alert's latency
   through the site's front door under that load (p50, p99);
3. sampled every 0.5 s while it runs: the gateway's and Kafka's RSS and threads;
   CPU seconds of each over the load (``/proc``); each with its child processes (the
   gateway's decode workers);
4. ``sl.ingress.<stream>`` of every stream read to its end (read_committed): every seq
   of every ship once;
5. with ``--merge`` (the default): the site's Spark application (``shorelink-spark
   site``, ``bench/_stack.SiteApp``) started before the load merges behind the gateway
   as in production (its ingest puller, the backstop query, ``merge-urgent`` for the
   alerts, the tables; the ingress not purged, so that step 4 still reads it whole).
   Its ledger is followed until every ``(origin, stream)`` is held: records/s through
   the merge from the first upload to the ledger entry that completed the last one, how
   long the merge trailed the gateway after its last answer, each record's lag behind
   the gateway's write (its canonical timestamp minus ``sl.entered``; the alerts' on
   their own), the application's RSS, threads and CPU (spark-submit's JVM, the Python
   driver, pyspark's workers), each component's CPU over the whole (cores used: where
   the time went), and every canonical topic ``sl.<stream>`` read back once per seq.

Printed per size: records/s through the gateway (all streams, and per stream) and the
merge, alert latency, peak RSS, threads, CPU per record, the credentials file's bytes,
the merge's figures (``merge``); then how each
grows from the smallest size to the largest, per ship (``growth``: 1.0 is flat per
ship). ``--report DIR`` also writes ``DIR/fleet.html``, each cost charted against the
fleet size. The site's side (its application at M neighbours: threads, Kafka clients,
the marker's and relay index's bytes, the merge state per origin, the operations page)
with neighbours is ``bench/site_scale.py``; one merge's ceiling, ``bench/realtime_mode.py
--modes puller``.

    .venv/bin/python bench/fleet.py --quick      # 10 and 50 ships, about a minute
    .venv/bin/python bench/fleet.py              # 50, 200 and 700 ships

Progress goes to stderr; one JSON object goes to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from _common import (
    add_run_options,
    bench_parser,
    fill_defaults,
    pct,
    progress,
    r3,
    require_at_least_one,
    run_bench,
    tree_cpu_s,
    tree_rss_mb,
    tree_status,
    write_size_report,
)
from _shipday import DAY, STREAMS, ShipDay, link_of, ship_day
from _stack import SITE, SiteApp, Stack, check_once, read_identities, wait_merged

from local_stack.process import Proc
from shorelink.errors import ShorelinkError
from shorelink.wire import Batch, WireRecord, encode_batch

if TYPE_CHECKING:
    from edge_agent.gateway import HttpGateway

say = progress("fleet")


class Sampler:
    """RSS and threads of some processes every 0.5 s, until stopped: the peaks."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.rss_mb = dict.fromkeys(pids, 0.0)
        self.threads = dict.fromkeys(pids, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while True:
            for name, pid in self.pids.items():
                self.rss_mb[name] = max(self.rss_mb[name], tree_rss_mb(pid)[0])
                self.threads[name] = max(self.threads[name], tree_status(pid, "Threads")[0])
            if self._stop.wait(0.5):
                return


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.stack: Stack | None = None
        #: ships' uploads that failed (a link error, a 503 busy) and went on after
        #: asking the site what it held, in the current size
        self.retries = 0
        #: per stream: seconds from the start of the load to its last batch answered
        self.stream_done: dict[str, float] = {}
        self.days: list[ShipDay] = []
        self.result: dict[str, Any] = {"benchmark": "fleet", "site": SITE}

    @property
    def procs(self) -> list[Proc]:
        return self.stack.procs if self.stack else []

    def cleanup(self) -> None:
        if self.stack:
            self.stack.cleanup()

    def run(self) -> dict[str, Any]:
        a = self.args
        t0 = time.monotonic()
        self.result["config"] = {
            "ships": a.ships,
            "records_per_ship": a.records_per_ship,
            "day": {k: {"stream": s, "records": n} for k, (s, n) in DAY.items()},
            "docking_share": a.docking_share,
            "backlog": a.backlog,
            "batch": {
                "at_sea": link_of(False).batch_max_records,
                "docking": link_of(True).batch_max_records,
            },
            "window": a.window,
            "alert_every_s": a.alert_every,
            "max_uploads": a.max_uploads or "ships + 1",
        }
        self.result["loadavg_1m_at_start"] = round(os.getloadavg()[0], 2)
        self.days = build_days(max(a.ships), a.records_per_ship, a.docking_share, a.backlog)
        sizes: list[dict[str, Any]] = []
        for n in a.ships:
            for shards in a.shards if a.merge else [1]:
                sizes.append(self.size(n, shards))
                self.cleanup()  # the next size gets the machine to itself
                self.stack = None
        if a.merge and len(a.shards) > 1:
            self.result["shards"] = {
                f"{s['ships']} ships, {s['shards']} shard(s)": (s["merge"] or {}).get("records_s")
                for s in sizes
            }
            say(f"merge records/s by shards: {self.result['shards']}")
        self.result["sizes"] = sizes
        self.result["growth"] = _growth([s for s in sizes if s["shards"] == a.shards[0]])
        self.result["exactly_once"] = all(s["exactly_once"] for s in sizes)
        self.result["loadavg_1m_at_end"] = round(os.getloadavg()[0], 2)
        self.result["seconds_total"] = round(time.monotonic() - t0, 1)
        if a.report:
            page = write_size_report(
                a.report / "fleet.html", "bench/fleet.py", self.result, "ships", _CHARTS
            )
            say(f"report: {page}")
        return self.result

    def size(self, n: int, shards: int = 1) -> dict[str, Any]:
        a = self.args
        days = self.days[:n]
        ships = [d.ship for d in days]
        work = self.work / f"ships-{n}-shards-{shards}"
        work.mkdir(parents=True, exist_ok=True)
        say(f"=== {n} ships: starting kafka and the gateway")
        # every ship, and the alerting one twice, holds an upload open at once: the
        # default limits.max_uploads (32) would turn the rest away (503 busy)
        uploads = a.max_uploads or n + 1
        self.stack = stack = Stack(
            work,
            ships,
            say,
            limits={"max_uploads": uploads},
            streams=("alerts", *STREAMS),
            ingress_by_origin=shards > 1,
        )
        stack.start()
        assert stack.kafka is not None and stack.gateway is not None
        gw_pid, kafka_pid = stack.gateway.pid, stack.kafka.proc.pid
        pids = {"gateway": gw_pid, "kafka": kafka_pid}
        app: SiteApp | None = None
        if a.merge:
            # the ingress topics stay whole (no purge) so that the gateway's exactly-once
            # check reads them after the merge as without it
            app = SiteApp(
                stack,
                ("alerts", *STREAMS),
                driver_memory=a.driver_memory,
                merge={"purge_sources": False},
                shards=shards,
            )
            app_started_s = app.start()
            for k, pid in enumerate(app.pids):  # each shard's application
                pids[f"site{k or ''}"] = pid
        per_stream = {s: sum(d.last.get(s, 0) for d in days) for s in STREAMS}
        records = sum(per_stream.values())
        docking = sum(d.docking for d in days)
        batches = sum(len(b) for d in days for b in d.batches.values())
        say(f"{n} ships ({docking} docking): {records} records {per_stream}, {batches} batches")
        self.retries = 0
        self.stream_done = {}
        cpu0 = {k: tree_cpu_s(pid) for k, pid in pids.items()}
        merged: dict[str, Any] = {}
        with Sampler(pids) as sampled:
            elapsed, alerts = asyncio.run(self._load(stack, days, ships[0]))
            cpu = {k: tree_cpu_s(pids[k]) - cpu0[k] for k in ("gateway", "kafka")}
            if app is not None:
                expected = {(d.ship, st): d.last[st] for d in days for st in STREAMS}
                if alerts:
                    expected[(ships[0], "alerts")] = len(alerts)
                say(f"{n} ships: waiting for the merge")
                merged = wait_merged(stack.endpoint, expected, a.merge_timeout, say)
                merged["cpu_s"] = {k: tree_cpu_s(pid) - cpu0[k] for k, pid in pids.items()}
        streams: dict[str, dict[str, Any]] = {}
        verify_s = 0.0
        for stream in STREAMS:
            ok, detail, took = stack.verify({d.ship: d.last[stream] for d in days}, stream)
            verify_s += took
            done = self.stream_done.get(stream, elapsed)
            streams[stream] = {
                "records": per_stream[stream],
                "records_s": round(per_stream[stream] / elapsed),
                "done_s": round(done, 2),
                "exactly_once": ok and all(d["missing"] == 0 for d in detail.values()),
            }
        say(f"{n} ships: {records / elapsed:.0f} records/s; alert p99 {pct(alerts, 0.99)} ms")
        merge: dict[str, Any] | None = None
        if app is not None:
            merge = self._merge(
                days, alerts, elapsed, merged, app_started_s, sampled, app.state_dirs()
            )
            say(f"{n} ships: the merge {merge['records_s']} records/s; lag {merge['lag_ms']}")
        return {
            "ships": n,
            "shards": shards,
            "docking_ships": docking,
            "max_uploads": uploads,
            "records": records,
            "batches": batches,
            "seconds": round(elapsed, 2),
            "gateway_records_s": round(records / elapsed),
            "streams": streams,
            "uploads_retried": self.retries,
            "alert_ms": {
                "count": len(alerts),
                "p50": r3(pct(alerts, 0.5)),
                "p99": r3(pct(alerts, 0.99)),
                "max": r3(max(alerts, default=None)),
            },
            "peak_rss_mb": sampled.rss_mb,
            "peak_threads": sampled.threads,
            "cpu_s": {k: round(v, 2) for k, v in cpu.items()},
            "cpu_us_per_record": {k: round(v / records * 1e6, 1) for k, v in cpu.items()},
            "credentials_file_bytes": (work / "gateway" / "ships.json").stat().st_size,
            "exactly_once": all(s["exactly_once"] for s in streams.values())
            and (merge is None or merge["exactly_once"]),
            "verify_s": round(verify_s, 1),
            "merge": merge,
        }

    def _merge(
        self,
        days: list[ShipDay],
        alerts: list[float],
        elapsed: float,
        merged: dict[str, Any],
        started_s: float,
        sampled: Sampler,
        state_dirs: list[Path],
    ) -> dict[str, Any]:
        """The merge's figures: records/s from the first upload to the last record
        merged (the ledger's entry that completed the last ``(origin, stream)``), how
        long it trailed the gateway, each record's lag behind the gateway's write, the
        driver's cost; every canonical topic read back once per seq."""
        from shorelink.contract import canonical_topic

        assert self.stack is not None
        streams: dict[str, dict[str, Any]] = {}
        lags: list[float] = []
        alert_lags: list[float] = []
        t0 = time.monotonic()
        for stream in (*STREAMS, "alerts"):
            if stream == "alerts":
                expected = {days[0].ship: len(alerts)} if alerts else {}
            else:
                expected = {d.ship: d.last[stream] for d in days}
            say(f"merge: reading {canonical_topic(stream)} to its end")
            counts, got = read_identities(self.stack.endpoint, canonical_topic(stream))
            ok, detail = check_once(counts, expected)
            (alert_lags if stream == "alerts" else lags).extend(got)
            streams[stream] = {
                "records": sum(expected.values()),
                "exactly_once": ok and all(d["missing"] == 0 for d in detail.values()),
            }
        records = sum(s["records"] for s in streams.values())
        last_ms = merged.get("last_ms")
        complete = merged.get("complete") == merged.get("expected")
        seconds = last_ms / 1000 - self.t_load_epoch if complete and last_ms else None
        cpu = merged.get("cpu_s", {})
        return {
            "started_s": started_s,
            "records": records,
            "complete": f"{merged.get('complete')}/{merged.get('expected')}",
            "seconds": r3(seconds),
            "records_s": round(records / seconds) if seconds else None,
            "tail_after_gateway_s": r3(seconds - elapsed) if seconds else None,
            "lag_ms": _spread(lags),
            "alert_lag_ms": _spread(alert_lags),
            "streams": streams,
            "exactly_once": complete and all(s["exactly_once"] for s in streams.values()),
            "site_peak_rss_mb": _sum_site(sampled.rss_mb),
            "site_peak_threads": _sum_site(sampled.threads),
            "cpu_s": {k: round(v, 1) for k, v in cpu.items()},
            "cores": {k: round(v / seconds, 2) for k, v in cpu.items()} if seconds else None,
            "driver": _merge_totals(state_dirs),
            "verify_s": round(time.monotonic() - t0, 1),
        }

    async def _load(
        self, stack: Stack, days: list[ShipDay], alerter: str
    ) -> tuple[float, list[float]]:
        """Every ship's upload at once, and an alert every ``--alert-every`` seconds
        from ``alerter`` until the uploads are done: the seconds the uploads took and
        each alert's ms to its answer. The alerts are sent from a process of their own
        (``--role alerter``), as from a ship: in this one, the fleet's uploads keep the
        event loop busy and an alert's answer would wait for them here, not at the site."""
        argv = [
            sys.executable,
            __file__,
            *("--role", "alerter", "--url", stack.gw_url, "--ship", alerter),
            *("--alert-every", str(self.args.alert_every)),
        ]
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "SHORELINK_BENCH_TOKEN": stack.tokens[alerter]},
        )
        assert proc.stdin is not None
        try:
            self.t_load_epoch = time.time()
            self.t_load = t0 = time.perf_counter()
            await asyncio.gather(*(self._ship(stack, d) for d in days))
            elapsed = time.perf_counter() - t0
        finally:
            proc.stdin.close()  # the alerter stops at the end of its input
            out, _ = await asyncio.wait_for(proc.communicate(), 60)
        if proc.returncode:
            raise RuntimeError(f"the alerter failed (exit {proc.returncode})")
        return elapsed, [float(x) for x in json.loads(out)]

    async def _ship(self, stack: Stack, day: ShipDay) -> None:
        """One ship's upload, as its agent does it: its streams in priority order on
        one connection, ``--window`` batches in flight; when the link fails (a ``503
        busy`` too: the gateway's memory budget or upload slots are full), wait, ask
        the site what it holds and go on from there."""
        from edge_agent.errors import GatewayGap, LinkError

        ship = day.ship
        gw = _client(
            stack.gw_url, "port_wifi" if day.docking else "satellite", ship, stack.tokens[ship]
        )
        slots = asyncio.Semaphore(self.args.window)
        held = dict.fromkeys(day.batches, 0)
        last = day.last

        async def send(stream: str, body: bytes) -> None:
            async with slots:
                got = (await gw.send(stream, body)).held.contiguous_end()
            held[stream] = max(held[stream], got)
            if held[stream] >= last[stream]:
                done = time.perf_counter() - self.t_load
                self.stream_done[stream] = max(self.stream_done.get(stream, 0.0), done)

        try:
            for _ in range(MAX_TRIES):
                if all(held[s] >= last[s] for s in last):
                    return
                try:
                    async with asyncio.TaskGroup() as tg:  # one fails: the rest are cancelled
                        for stream in STREAMS:
                            for end, body in day.batches[stream]:
                                if end > held[stream]:
                                    tg.create_task(send(stream, body))
                    continue
                except* (LinkError, GatewayGap):
                    # a gap: an earlier batch of the stream was refused (busy) after
                    # this one left; as the agent does, go on from what the site holds
                    self.retries += 1
                try:
                    await retry_after(gw)
                    holdings = await gw.holdings()
                    for s in held:
                        if s in holdings:
                            held[s] = holdings[s].contiguous_end()
                except LinkError:  # no slot for the holdings either: the next turn asks again
                    self.retries += 1
            raise RuntimeError(f"{ship}: not done after {MAX_TRIES} tries")
        finally:
            await gw.close()


def _sum_site(per: dict[str, Any]) -> Any:
    """The site's applications together (one per shard): the sum of their peaks."""
    got = [v for k, v in per.items() if k.startswith("site") and v is not None]
    return sum(got) if got else None


def _merge_totals(state_dirs: list[Path]) -> dict[str, Any]:
    """What each merge said of its work (``<state_dir>/<query>.status.json``, a shard's
    query named ``merge-o<k>of<N>``): its transactions, the records in and written, and
    the driver's seconds in Spark's fetch, in planning and in the Kafka transaction (the
    rest of its time is reading ingress and waiting)."""
    out: dict[str, Any] = {}
    for path in sorted(p for d in state_dirs for p in d.glob("merge*.status.json")):
        query = path.name.removesuffix(".status.json")
        try:
            totals = json.loads(path.read_text())["totals"]
        except (OSError, ValueError, KeyError):
            continue
        out[query] = {
            k: round(totals[k], 1) if isinstance(totals.get(k), float) else totals.get(k)
            for k in ("batches", "pulled", "input", "written", "fetch_s", "plan_s", "txn_s")
        }
    return out


def _spread(ms: list[float]) -> dict[str, float | None]:
    return {"p50": r3(pct(ms, 0.5)), "p99": r3(pct(ms, 0.99)), "max": r3(max(ms, default=None))}


def docks(i: int, share: float) -> bool:
    """Whether the ``i``-th ship (from 0) is one of those docking: ``share`` of every
    fleet's first ships, spread evenly (the first of each 1/share ships)."""
    return int((i + 1) * share) > int(i * share)


def build_days(ships: int, records: int, share: float, backlog: int) -> list[ShipDay]:
    """The days of ships ``fleet0001``..: built once for the largest size (the smaller
    fleets are its first ships), in two worker processes."""
    from concurrent.futures import ProcessPoolExecutor

    t0 = time.monotonic()
    names = [f"fleet{i:04d}" for i in range(1, ships + 1)]
    now = time.time()
    jobs = [(s, i, records, docks(i, share), backlog, now) for i, s in enumerate(names)]
    with ProcessPoolExecutor(max_workers=2) as pool:
        days = list(pool.map(_day, jobs, chunksize=8))
    say(f"{ships} ships' days built in {time.monotonic() - t0:.1f} s")
    return days


def _day(job: tuple[str, int, int, bool, int, float]) -> ShipDay:
    ship, i, records, docking, backlog, now = job
    return ship_day(ship, i, records, docking=docking, backlog=backlog, now=now)


#: tries of one ship's upload, or of one alert, before the bench gives up on the gateway
MAX_TRIES = 1000


async def retry_after(gw: HttpGateway) -> None:
    """After a failed send (a ``503 busy`` too), as the agent does: a new connection
    after the ``Retry-After`` (1 s), with jitter."""
    await gw.reset()
    await asyncio.sleep(random.uniform(0.5, 1.5))


#: the report's charts: title, y label, lines (label -> a size's figure)
_CHARTS = [
    (
        "records/s through the gateway and the merge",
        "records/s",
        {"gateway": "gateway_records_s", "merge": "merge.records_s"},
    ),
    (
        "the merge's lag behind the gateway",
        "ms",
        {"p50": "merge.lag_ms.p50", "p99": "merge.lag_ms.p99"},
    ),
    ("an alert's answer during the load", "ms", {"p50": "alert_ms.p50", "p99": "alert_ms.p99"}),
    (
        "peak RSS (with child processes)",
        "MB",
        {
            "gateway": "peak_rss_mb.gateway",
            "kafka": "peak_rss_mb.kafka",
            "site application": "peak_rss_mb.site",
        },
    ),
    (
        "CPU per record",
        "µs",
        {"gateway": "cpu_us_per_record.gateway", "kafka": "cpu_us_per_record.kafka"},
    ),
    ("uploads refused busy and retried", "uploads", {"retried": "uploads_retried"}),
]


def _growth(sizes: list[dict[str, Any]]) -> dict[str, Any]:
    """From the smallest size to the largest: how each cost grew against the ships
    (1.0: in proportion to the ships; below: cheaper per ship at scale)."""
    if len(sizes) < 2:
        return {}
    small, large = sizes[0], sizes[-1]
    ships = large["ships"] / small["ships"]

    def per_ship(a: float, b: float) -> float | None:
        return round(b / a / ships, 3) if a else None

    return {
        "ships_ratio": round(ships, 2),
        "records_s_ratio": round(large["gateway_records_s"] / small["gateway_records_s"], 3),
        "alert_p99_ratio": (
            round(large["alert_ms"]["p99"] / small["alert_ms"]["p99"], 2)
            if small["alert_ms"]["p99"] and large["alert_ms"]["p99"]
            else None
        ),
        "gateway_rss_per_ship": per_ship(
            small["peak_rss_mb"]["gateway"], large["peak_rss_mb"]["gateway"]
        ),
        "gateway_threads_ratio": round(
            large["peak_threads"]["gateway"] / max(1, small["peak_threads"]["gateway"]), 2
        ),
        "merge_records_s_ratio": (
            round(large["merge"]["records_s"] / small["merge"]["records_s"], 3)
            if large.get("merge")
            and small.get("merge")
            and small["merge"]["records_s"]
            and large["merge"]["records_s"]
            else None
        ),
        "gateway_cpu_per_record_ratio": (
            round(large["cpu_us_per_record"]["gateway"] / small["cpu_us_per_record"]["gateway"], 3)
            if small["cpu_us_per_record"]["gateway"]
            else None
        ),
    }


# -- command line --------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = bench_parser("bench/fleet.py", __doc__)
    add_run_options(p, "10 and 50 ships, 300 records each: about a minute", "logs, configs")
    p.add_argument(
        "--ships",
        type=lambda s: [int(x) for x in s.split(",")],
        default=None,
        help="fleet sizes, comma-separated, smallest first (default 50,200,700; quick 10,50)",
    )
    p.add_argument(
        "--records-per-ship",
        type=int,
        default=None,
        help="records a ship at sea uploads, its day's streams in a real day's "
        "proportions (bench/_shipday.py; default 1000; quick 300)",
    )
    p.add_argument(
        "--docking-share",
        type=float,
        default=0.1,
        help="share of the ships docking with a month's backlog, sent in the port "
        "link's batches (default 0.1)",
    )
    p.add_argument(
        "--backlog",
        type=int,
        default=30,
        help="a docking ship's records, in records per ship (default 30: a month to a day)",
    )
    p.add_argument("--window", type=int, default=2, help="batches in flight per ship (default 2)")
    p.add_argument(
        "--merge",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the site's Spark application downstream of the gateway and measure "
        "the merge (default on; --no-merge: the gateway and Kafka alone)",
    )
    p.add_argument(
        "--shards",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1],
        help="with --merge: the site's merge split by origin into this many shards, each "
        "its own application (comma-separated: each fleet size once per count, a fresh "
        "stack each, side by side; default 1)",
    )
    p.add_argument(
        "--merge-timeout",
        type=float,
        default=900.0,
        help="seconds to wait for the merge after the uploads (default 900)",
    )
    p.add_argument(
        "--driver-memory",
        default="2g",
        help="the site application's driver memory (default 2g)",
    )
    p.add_argument(
        "--max-uploads",
        type=int,
        default=0,
        help="the gateway's limits.max_uploads (default: the fleet size + 1, so that "
        "every ship uploads at once; the gateway's own default is 32)",
    )
    p.add_argument(
        "--alert-every",
        type=float,
        default=0.5,
        help="seconds between the alerts sent during the load (default 0.5)",
    )
    p.add_argument(
        "--report",
        type=Path,
        default=None,
        metavar="DIR",
        help="also write DIR/fleet.html: each cost charted against the fleet size",
    )
    a = p.parse_args(argv)
    fill_defaults(a, {"ships": ([10, 50], [50, 200, 700]), "records_per_ship": (300, 1000)})
    require_at_least_one(p, a, "records_per_ship", "backlog", "window")
    if not 0 <= a.docking_share <= 1:
        p.error("--docking-share must be between 0 and 1")
    if not a.ships or min(a.ships) < 1 or a.ships != sorted(a.ships):
        p.error("--ships must be fleet sizes of at least 1, smallest first")
    if a.alert_every <= 0:
        p.error("--alert-every must be above 0")
    return a


def _client(url: str, link: str, ship: str, token: str) -> HttpGateway:
    """The edge agent's own client of a gateway, over one of its default link classes
    (a 2-minute timeout: the gateway may be saturated)."""
    from edge_agent.config import DEFAULT_LINKS, GatewayEndpoint
    from edge_agent.gateway import HttpGateway
    from shorelink.config import Secret

    cfg = replace(DEFAULT_LINKS[link], timeout_s=120.0)
    return HttpGateway(GatewayEndpoint(SITE, url, link), cfg, ship, Secret(token))


async def alerter(url: str, ship: str, every: float) -> list[float]:
    """Until its input ends: an alert every ``every`` seconds on ``ship``'s alerts
    stream, on an upload connection of its own; each one's ms to the gateway's answer
    (a refusal retried included)."""
    from edge_agent.errors import LinkError

    gw = _client(url, "satellite", ship, os.environ["SHORELINK_BENCH_TOKEN"])
    loop = asyncio.get_running_loop()
    ended = loop.run_in_executor(None, sys.stdin.buffer.read)
    took: list[float] = []
    seq = 1
    try:
        while not ended.done():
            rec = WireRecord(seq, "BBLU1022087", int(time.time() * 1000), "overboard", b"{}")
            body = encode_batch(Batch(ship, "alerts", (rec,)))
            t = time.perf_counter()
            for _ in range(MAX_TRIES):  # as the agent does: a busy gateway is retried
                try:
                    result = await gw.send("alerts", body)
                    break
                except LinkError:
                    await retry_after(gw)
            else:
                raise RuntimeError(f"alert {seq}: not taken after {MAX_TRIES} tries")
            took.append((time.perf_counter() - t) * 1000)
            if result.held.contiguous_end() != seq:
                raise RuntimeError(f"alert {seq}: the gateway holds {result.held}")
            seq += 1
            await asyncio.wait([ended], timeout=every)
    finally:
        await gw.close()
    return took


def main(argv: list[str] | None = None) -> int:
    if argv is None and sys.argv[1:3] == ["--role", "alerter"]:
        p = argparse.ArgumentParser(description="bench/fleet.py's alerting ship")
        p.add_argument("--role", choices=("alerter",), required=True)
        p.add_argument("--url", required=True)
        p.add_argument("--ship", required=True)
        p.add_argument("--alert-every", type=float, required=True)
        r = p.parse_args()
        print(json.dumps(asyncio.run(alerter(r.url, r.ship, r.alert_every))))
        return 0
    args = parse_args(argv)
    return run_bench(
        say, args.keep, "fleet-", lambda work: Bench(args, work), errors=(ShorelinkError,)
    )


if __name__ == "__main__":
    sys.exit(main())
