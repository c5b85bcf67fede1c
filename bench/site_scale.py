"""Benchmark: what one site's Spark application costs as the number of its neighbours
M grows (fleet issue, items 1 and 2; replication review, section 3): threads of its
driver (Python and JVM), the Kafka clients it holds, the marker's bytes per
transaction, the relay index's bytes, the merge state's bytes per origin and the
operations page's response time, at each M side by side, with the growth per neighbour.

What runs, per M (a fresh pair of brokers each time):

- the site ``hub`` as ``shorelink-spark site`` runs it in production (its own
  spark-submit, local mode, its merges ``merge`` and ``merge-urgent``, pullers, link
  probes, repair), on a single-node Kafka of its own, and its operations page
  (``shorelink ops``);
- M neighbours ``n01``..``nM`` in the same sites file (each with ``hub`` as its only
  neighbour: a star, so every route from the hub is the direct link), each with its
  own address in the file but all on **one** second single-node Kafka. Simplified:
  a neighbour is not an application (no merge, no gateway, no index, no link reports
  of its own); what the hub reads of it, its relay topics ``sl.relay.<nXX>.<stream>``,
  is written by this script in Kafka transactions, records in the record contract,
  ``--origins`` ships per neighbour, so every puller reads and every marker carries
  its sources. The topics a neighbour would have beside them (``sl.ledger``, the
  indexes, canonical topics) exist once, shared and empty. What the hub holds per
  neighbour (a puller per merge, its reader, an admin, probes) is as in production;
  the broker connections all go to one host:port instead of M.

Phases per M, each bounded: start (brokers, topics, the application until its merges
report, the page); feed (``--feed-seconds`` of relay traffic, ``--rate`` records/s per
neighbour, an alert per neighbour a second), the driver sampled every 2 s; drain (the
hub's ledger holds every record fed); the page asked ``--requests`` times; then the
marker, the relay index and the merge state read from the hub's Kafka.

    .venv/bin/python bench/site_scale.py --quick          # M = 2, 6: ~3 minutes
    .venv/bin/python bench/site_scale.py                  # M = 3, 10, 20: ~7 minutes

Progress goes to stderr; one JSON object goes to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import (
    add_run_options,
    bench_parser,
    fill_defaults,
    pct,
    progress,
    r3,
    run_bench,
    tree_pids,
)
from bench.replication import make_records, wait_for
from local_stack.kafka import KafkaBroker, start_kafka
from local_stack.process import Proc, free_port
from shorelink.contract import (
    CANONICAL_INDEX_TOPIC,
    MARKER_TOPIC,
    RELAY_INDEX_TOPIC,
    relay_topic,
)
from shorelink.kafka.reading import read_to_end
from shorelink.kafka.transactions import TransactionalProducer
from shorelink.ranges import RangeSet
from spark_core.config import load_config
from spark_core.merge_state import MergeState
from spark_core.relay_index import decode_round
from spark_core.topics import apply_topics, site_specs

say = progress("site_scale")

HUB = "hub"
STREAMS = ("containers", "alerts")
#: the issue's goal for the merge state per origin
ORIGIN_STATE_GOAL_BYTES = 10 * 1024
#: seconds the driver is watched at rest before the feed (its pullers polling)
IDLE_S = 10.0


def neighbour_names(m: int) -> list[str]:
    return [f"n{i:02d}" for i in range(1, m + 1)]


# -- the driver seen from /proc ---------------------------------------------------------
def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _kind(pid: int) -> str:
    """``jvm`` (spark-submit's JVM), ``driver`` (the Python driver it runs),
    ``launcher`` (``python -m spark_core.cli site``), ``worker`` (pyspark's), other."""
    comm = _read(f"/proc/{pid}/comm").strip()
    cmd = _read(f"/proc/{pid}/cmdline").replace("\0", " ")
    if comm == "java":
        return "jvm"
    if "python" not in comm and "python" not in cmd:
        return "other"
    if "pyspark.daemon" in cmd or "pyspark.worker" in cmd:
        return "worker"
    if "spark_core.cli" in cmd:
        return "launcher"
    return "driver"


def _sockets(pid: int) -> set[int]:
    out = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                link = fd.readlink().as_posix()
            except OSError:
                continue
            if link.startswith("socket:["):
                out.add(int(link[8:-1]))
    except OSError:
        pass
    return out


def _tcp_remote_ports(pid: int) -> dict[int, int]:
    """Socket inode -> remote port of the process's established TCP connections."""
    out = {}
    for table in ("tcp", "tcp6"):
        for line in _read(f"/proc/{pid}/net/{table}").splitlines()[1:]:
            f = line.split()
            if len(f) > 9 and f[3] == "01":  # ESTABLISHED
                out[int(f[9])] = int(f[2].rsplit(":", 1)[1], 16)
    return out


def sample(root: int, brokers: dict[str, int]) -> dict[str, dict[str, Any]]:
    """Per kind of process under ``root``: threads, librdkafka clients (a ``rdk:main``
    thread each), JVM Kafka client threads, and TCP connections to each broker."""
    out: dict[str, dict[str, Any]] = {}
    for pid in tree_pids(root):
        kind = _kind(pid)
        names = (
            Counter(
                _read(f"/proc/{pid}/task/{t.name}/comm").strip()
                for t in Path(f"/proc/{pid}/task").iterdir()
                if t.name.isdigit()
            )
            if Path(f"/proc/{pid}/task").exists()
            else Counter()
        )
        ports = _tcp_remote_ports(pid)
        conns = Counter(ports[i] for i in _sockets(pid) if i in ports)
        d = out.setdefault(kind, Counter())
        d["processes"] += 1
        d["threads"] += sum(names.values())
        d["rdkafka_clients"] += names.get("rdk:main", 0)
        d["rdkafka_threads"] += sum(n for c, n in names.items() if c.startswith("rdk:"))
        d["jvm_kafka_threads"] += sum(
            n for c, n in names.items() if c.startswith(("kafka-", "KafkaConsumer", "kafka_"))
        )
        for name, port in brokers.items():
            d[f"connections_{name}"] += conns.get(port, 0)
    return {k: dict(v) for k, v in out.items()}


def driver_cpu_s(root: int) -> float:
    """User + system CPU seconds so far of the Python driver(s) under ``root``."""
    total = 0
    for pid in tree_pids(root):
        if _kind(pid) != "driver":
            continue
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def peak(samples: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for s in samples:
        for kind, d in s.items():
            o = out.setdefault(kind, {})
            for k, v in d.items():
                o[k] = max(o.get(k, 0), v)
    return out


# -- memory of the merge state ----------------------------------------------------------
def deep_size(obj: object, seen: set[int] | None = None) -> int:
    """Bytes of ``obj`` and what it references (containers, ``__dict__``, ``__slots__``)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, dict):
        size += sum(deep_size(k, seen) + deep_size(v, seen) for k, v in obj.items())
    elif isinstance(obj, (list, tuple, set, frozenset)):
        size += sum(deep_size(x, seen) for x in obj)
    if hasattr(obj, "__dict__"):
        size += deep_size(vars(obj), seen)
    for slot in getattr(type(obj), "__slots__", ()):
        if hasattr(obj, slot):
            size += deep_size(getattr(obj, slot), seen)
    return size


def state_per_origin(state: MergeState) -> dict[str, Any]:
    """The merge state's bytes per origin: its ledger ranges (``held``) and its relayed
    ranges (``relayed``), keys included, over the origins it holds."""
    per: Counter[str] = Counter()
    for (origin, stream), seqs in state.held.items():
        per[origin] += deep_size((origin, stream)) + deep_size(seqs)
    for (entry, origin, stream), seqs in state.relayed.items():
        per[origin] += deep_size((entry, origin, stream)) + deep_size(seqs)
    values = sorted(per.values())
    return {
        "origins": len(per),
        "held_keys": len(state.held),
        "relayed_keys": len(state.relayed),
        "ranges": state.ranges() + sum(len(r) for r in state.relayed.values()),
        "bytes_per_origin_p50": pct([float(v) for v in values], 0.5),
        "bytes_per_origin_max": max(values, default=0),
        "whole_state_bytes": deep_size(state),
    }


# -- one size ---------------------------------------------------------------------------
class Size:
    """One M: the brokers, the sites file, the hub's application and page, the feed."""

    def __init__(self, bench: SiteScaleBench, m: int) -> None:
        self.b = bench
        self.a = bench.args
        self.m = m
        self.root = bench.work / f"m{m}"
        self.logs = bench.work / "logs"
        self.neighbours = neighbour_names(m)
        self.hub: KafkaBroker | None = None
        self.nbrs: KafkaBroker | None = None
        self.app: Proc | None = None
        self.ops: Proc | None = None
        self.ops_port = free_port()
        self.seqs: Counter[tuple[str, str]] = Counter()
        self.samples: list[dict[str, dict[str, Any]]] = []
        self.fed = 0

    def origins(self, n: str) -> list[str]:
        return [f"ship-{n}-{k}" for k in range(self.a.origins)]

    def start(self) -> None:
        say(f"M={self.m}: two brokers (the hub's; the {self.m} neighbours' relay topics)")
        self.hub = start_kafka(
            f"hub{self.m}", self.root / "hub-kafka", self.logs, heap="384m", wait=False
        )
        self.nbrs = start_kafka(
            f"nbrs{self.m}", self.root / "nbrs-kafka", self.logs, heap="384m", wait=False
        )
        for k in (self.hub, self.nbrs):
            self.b.procs.append(k.proc)
            k.proc.wait_ready(k.ready, timeout=120)
        self.config = self.root / "sites.toml"
        self.config.write_text(self.sites_file())
        cfg = load_config(self.config)
        # the hub's topics as `topics apply` makes them; one neighbour's stand for all
        apply_topics(self.hub.endpoint, site_specs(cfg, HUB))
        apply_topics(self.nbrs.endpoint, site_specs(cfg, self.neighbours[0]))
        say(f"M={self.m}: the hub's application (spark-submit)")
        t0 = time.monotonic()
        self.app = Proc.start(
            f"site-hub-m{self.m}",
            [
                sys.executable,
                "-m",
                "spark_core.cli",
                "site",
                "--site",
                HUB,
                "--config",
                str(self.config),
            ],
            self.logs / f"site-hub-m{self.m}.log",
        )
        self.b.procs.append(self.app)
        status = self.root / HUB / "checkpoints" / "merge.status.json"
        self.app.wait_ready(status.exists, timeout=self.a.phase_timeout)
        self.started_s = round(time.monotonic() - t0, 1)
        shorelink = Path(sys.executable).with_name("shorelink")
        self.ops = Proc.start(
            f"ops-hub-m{self.m}",
            [
                str(shorelink),
                "ops",
                "--site",
                HUB,
                "--config",
                str(self.config),
                "--port",
                str(self.ops_port),
            ],
            self.logs / f"ops-hub-m{self.m}.log",
        )
        self.b.procs.append(self.ops)
        self.ops.wait_ready(lambda: self._get("/healthz") is not None, timeout=60)
        say(f"M={self.m}: started in {self.started_s} s")

    def sites_file(self) -> str:
        assert self.hub is not None and self.nbrs is not None
        root = self.root
        parts = [
            '[spark]\nmaster = "local[2]"\ndriver_memory = "1g"\n[spark.conf]\n'
            '"spark.ui.enabled" = "false"\n"spark.sql.shuffle.partitions" = "2"\n'
        ]

        def site(name: str, bootstrap: str, neighbours: list[str], extra: str = "") -> str:
            return (
                f"\n[sites.{name}]\nstreams = {list(STREAMS)!r}\n"
                f"neighbours = {neighbours!r}\n"
                f'checkpoint_dir = "{root}/{name}/checkpoints"\n'
                f'table_dir = "{root}/{name}/tables"\ntrigger_interval = "1s"\n'
                f'[sites.{name}.kafka]\nbootstrap = "{bootstrap}"\n'
                f'[sites.{name}.replication]\nprobe_interval = "1s"\n{extra}'
            )

        parts.append(site(HUB, self.hub.bootstrap, self.neighbours))
        parts += [site(n, self.nbrs.bootstrap, [HUB]) for n in self.neighbours]
        return "".join(parts)

    def _get(self, path: str) -> bytes | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ops_port}{path}", timeout=10) as r:
                return bytes(r.read())
        except OSError:
            return None

    # -- feed -----------------------------------------------------------------------
    def feed(self) -> dict[str, Any]:
        """Relay traffic at every neighbour for ``--feed-seconds``: each round (0.5 s)
        one transaction with ``--rate``/2 containers per neighbour over its origins and,
        every other round, one alert per neighbour; the driver sampled meanwhile."""
        assert self.nbrs is not None and self.app is not None
        conf: dict[str, Any] = self.nbrs.endpoint.client_config(
            {"linger.ms": 5, "compression.type": "lz4"}
        )
        conf["transactional.id"] = f"bench-neighbours-{self.m}-{time.monotonic_ns()}"
        txn = TransactionalProducer(conf, timeout=30)
        txn.init()
        stop = threading.Event()
        ports = {"hub": self.hub.port, "neighbours": self.nbrs.port}  # type: ignore[union-attr]

        def sampler() -> None:
            while not stop.wait(2.0):
                self.samples.append(sample(self.app.pid, ports))  # type: ignore[union-attr]

        t = threading.Thread(target=sampler, daemon=True)
        t.start()
        per_round = max(1, self.a.rate // 2)
        t0 = time.monotonic()
        rounds = 0
        try:
            while time.monotonic() - t0 < self.a.feed_seconds:
                with txn.transaction() as tx:
                    for n in self.neighbours:
                        origins = self.origins(n)
                        for i in range(per_round):
                            self._put(tx, n, "containers", origins[i % len(origins)])
                        if rounds % 2 == 0:
                            self._put(tx, n, "alerts", origins[rounds // 2 % len(origins)])
                rounds += 1
                time.sleep(max(0.0, t0 + rounds * 0.5 - time.monotonic()))
        finally:
            txn.close()
        fed_s = time.monotonic() - t0
        say(f"M={self.m}: fed {self.fed} records in {fed_s:.0f} s; draining")
        drain_s = wait_for(self._holds_all, self.a.phase_timeout, f"M={self.m}: hub holds all")
        self.samples.append(sample(self.app.pid, ports))
        stop.set()
        t.join()
        return {
            "records": self.fed,
            "records_per_s": round(self.fed / fed_s),
            "seconds": round(fed_s, 1),
            "drain_s": round(drain_s, 1),
        }

    def _put(self, tx: Any, n: str, stream: str, origin: str) -> None:
        self.seqs[(origin, stream)] += 1
        seq = self.seqs[(origin, stream)]
        (r,) = make_records(n, stream, origin, range(seq, seq + 1), 60)
        tx.produce(relay_topic(n, stream), r.key, r.value, r.headers())
        self.fed += 1

    def _holds_all(self) -> bool:
        assert self.hub is not None
        self.state = MergeState.load(self.hub.endpoint, HUB, timeout=30)
        return all(
            self.state.held_for(src).contains_all(RangeSet([(1, last)]))
            for src, last in self.seqs.items()
        )

    # -- what it cost -----------------------------------------------------------------
    def page(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for path in ("/api/site", "/api/snapshot"):
            ms, size = [], 0
            for _ in range(self.a.requests):
                t = time.perf_counter()
                body = self._get(path)
                ms.append((time.perf_counter() - t) * 1000)
                size = len(body or b"")
            out[path] = {"p50_ms": r3(pct(ms, 0.5)), "p99_ms": r3(pct(ms, 0.99)), "bytes": size}
        return out

    def marker(self) -> dict[str, Any]:
        """Per merge (head key ``<site>/<query>``): its transactions (a head each), the
        bytes they wrote (keys and values; a tombstone its key), the largest, and the
        marker as it stands. A head of the whole form (merges before the marker was
        keyed per source) holds every cursor and tail itself."""
        assert self.hub is not None
        heads: dict[str, list[int]] = {}  # per query, the bytes of each transaction
        last: dict[str, dict[str, bytes]] = {}  # per query, key -> its latest value
        for msg in read_to_end(self.hub.endpoint, [MARKER_TOPIC], timeout=60):
            key = (msg.key() or b"").decode()
            query = "/".join(key.split("/", 2)[:2])
            size = len(msg.key() or b"") + len(msg.value() or b"")
            sizes = heads.setdefault(query, [])
            if key == query or not sizes:  # a transaction's records start at its head
                sizes.append(size)
            else:
                sizes[-1] += size
            value = msg.value()
            if value is None:
                last.setdefault(query, {}).pop(key, None)
            else:
                last.setdefault(query, {})[key] = value
        out = {}
        for query, sizes in sorted(heads.items()):
            now = last.get(query, {})
            data = json.loads(now.get(query, b"{}"))
            if "offsets" in data:  # the whole form
                offsets = data["offsets"]
                sources = list(offsets)
                partitions = sum(len(p) for p in offsets.values())
                tails = len(data.get("index", {}))
            else:
                keyed = {k[len(query) + 1 :]: v for k, v in now.items() if k != query}
                sources = [k.split("/", 1)[1] for k in keyed if k.startswith("source/")]
                partitions = sum(
                    len(json.loads(v).get("offsets", {}))
                    for k, v in keyed.items()
                    if k.startswith("source/")
                )
                tails = sum(1 for k in keyed if k.startswith("tail/"))
            pulled = [t for t in sources if "/" in t]
            bytes_now = sum(len(k) + len(v) for k, v in now.items())
            out[query] = {
                "transactions": len(sizes),
                "bytes_last": bytes_now,
                "bytes_max": max(sizes),
                "bytes_written": sum(sizes),
                "bytes_per_transaction": round(sum(sizes) / max(1, len(sizes))),
                "records_now": len(now),
                "sources": len(sources),
                "pulled_sources": len(pulled),
                "partitions": partitions,
                "index_tails": tails,
                "bytes_per_source": round(bytes_now / max(1, len(sources))),
            }
        return out

    def index(self, seconds: float) -> dict[str, Any]:
        assert self.hub is not None
        out = {}
        for topic in (RELAY_INDEX_TOPIC, CANONICAL_INDEX_TOPIC):
            n, segs, size = 0, 0, 0
            for msg in read_to_end(self.hub.endpoint, [topic], timeout=60):
                n += 1
                size += len(msg.value() or b"") + len(msg.key() or b"")
                if (msg.key() or b"").startswith(b"sl."):
                    segs += 1  # a segment keyed by its topic (merges before rounds)
                else:
                    segs += len(decode_round(msg.value()))
            per_s = size / seconds if seconds else 0.0
            out[topic] = {
                "records": n,
                "records_per_s": round(n / seconds, 2) if seconds else 0.0,
                "segments": segs,
                "bytes": size,
                "bytes_per_day_at_this_rate": round(per_s * 86400),
                "retained_7d_bytes": round(per_s * 86400 * 7),
            }
        return out

    def run(self) -> dict[str, Any]:
        self.start()
        assert self.app is not None
        idle = sample(self.app.pid, {"hub": self.hub.port, "neighbours": self.nbrs.port})  # type: ignore[union-attr]
        # the driver at rest for IDLE_S (every puller polling its neighbour, nothing
        # fed): what the pullers' loop costs with nothing to read
        c0 = driver_cpu_s(self.app.pid)
        time.sleep(IDLE_S)
        c1 = driver_cpu_s(self.app.pid)
        t0 = time.monotonic()
        fed = self.feed()
        since_start = time.monotonic() - t0
        fed["driver_cpu_s"] = round(driver_cpu_s(self.app.pid) - c1, 1)
        fed["driver_idle_cpu_pct"] = round(100 * (c1 - c0) / IDLE_S, 1)
        out = {
            "neighbours": self.m,
            "origins": self.m * self.a.origins,
            "start_s": self.started_s,
            "feed": fed,
            "driver_idle": idle,
            "driver_peak": peak(self.samples),
            "merge_state": state_per_origin(self.state),
            "ops_page": self.page(),
            "marker": self.marker(),
            "index": self.index(since_start),
        }
        say(f"M={self.m}: {json.dumps(summary_row(out))}")
        return out

    def stop(self) -> None:
        for p in (self.ops, self.app):
            if p is not None and p.alive():
                p.stop(grace=30)
        for k in (self.hub, self.nbrs):
            if k is not None:
                k.proc.stop(grace=10)


def summary_row(r: dict[str, Any]) -> dict[str, Any]:
    """The figures compared across sizes (flat keys)."""
    peak_ = r["driver_peak"]
    drv, jvm = peak_.get("driver", {}), peak_.get("jvm", {})
    marker = r["marker"]
    return {
        "driver_python_threads": drv.get("threads", 0) - drv.get("rdkafka_threads", 0),
        "driver_threads": drv.get("threads", 0),
        "jvm_threads": jvm.get("threads", 0),
        "rdkafka_clients": drv.get("rdkafka_clients", 0),
        "rdkafka_threads": drv.get("rdkafka_threads", 0),
        "connections_to_neighbours": drv.get("connections_neighbours", 0)
        + jvm.get("connections_neighbours", 0),
        "connections_to_hub": drv.get("connections_hub", 0) + jvm.get("connections_hub", 0),
        "driver_idle_cpu_pct": r["feed"]["driver_idle_cpu_pct"],
        "driver_cpu_s_feed_and_drain": r["feed"]["driver_cpu_s"],
        "drain_s": r["feed"]["drain_s"],
        "marker_bytes": sum(v["bytes_last"] for v in marker.values()),
        "marker_sources": sum(v["sources"] for v in marker.values()),
        "marker_bytes_per_s": round(
            sum(v["bytes_written"] for v in marker.values()) / max(1.0, r["feed"]["seconds"])
        ),
        "marker_bytes_per_transaction": max(
            (v["bytes_per_transaction"] for v in marker.values()), default=0
        ),
        "marker_transactions": sum(v["transactions"] for v in marker.values()),
        "relay_index_bytes_per_day": r["index"][RELAY_INDEX_TOPIC]["bytes_per_day_at_this_rate"],
        "relay_index_records_per_s": r["index"][RELAY_INDEX_TOPIC]["records_per_s"],
        "relay_index_segments": r["index"][RELAY_INDEX_TOPIC]["segments"],
        "state_bytes_per_origin": r["merge_state"]["bytes_per_origin_max"],
        "ops_site_p50_ms": r["ops_page"]["/api/site"]["p50_ms"],
        "ops_snapshot_p50_ms": r["ops_page"]["/api/snapshot"]["p50_ms"],
        "ops_snapshot_p99_ms": r["ops_page"]["/api/snapshot"]["p99_ms"],
        "ops_snapshot_bytes": r["ops_page"]["/api/snapshot"]["bytes"],
    }


def growth(rows: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Per figure: smallest and largest M's, their ratio, and the added amount per
    neighbour between them."""
    ms = sorted(rows)
    lo, hi = ms[0], ms[-1]
    out = {}
    for key in rows[lo]:
        a, b = rows[lo][key], rows[hi][key]
        if a is None or b is None:
            continue
        out[key] = {
            f"M={lo}": a,
            f"M={hi}": b,
            "ratio": round(b / a, 2) if a else None,
            "per_neighbour": round((b - a) / (hi - lo), 2) if hi > lo else None,
        }
    return out


class SiteScaleBench:
    def __init__(self, work: Path, args: argparse.Namespace) -> None:
        self.work = work
        self.args = args
        self.procs: list[Proc] = []
        self.current: Size | None = None

    def run(self) -> dict[str, Any]:
        sizes: dict[int, dict[str, Any]] = {}
        for m in self.args.neighbours:
            self.current = Size(self, m)
            try:
                sizes[m] = self.current.run()
            finally:
                self.current.stop()
        rows = {m: summary_row(r) for m, r in sizes.items()}
        g = growth(rows)
        biggest = rows[max(rows)]
        return {
            "command": " ".join(sys.argv),
            "simplified": "the M neighbours' relay topics on one broker; neighbours are "
            "topics written by this script, not applications",
            "per_size": rows,
            "growth": g,
            "goals": {
                # one size says nothing of growth
                "threads_independent_of_M": None
                if len(rows) < 2
                else g["driver_threads"]["per_neighbour"] == 0
                and g["jvm_threads"]["per_neighbour"] == 0,
                "kafka_clients_independent_of_M": None
                if len(rows) < 2
                else g["rdkafka_clients"]["per_neighbour"] == 0,
                "state_per_origin_under_10KB": biggest["state_bytes_per_origin"]
                < ORIGIN_STATE_GOAL_BYTES,
            },
            "detail": {str(m): r for m, r in sizes.items()},
        }

    def cleanup(self) -> None:
        if self.current is not None:
            self.current.stop()
        for p in self.procs:
            if p.alive():
                p.stop(grace=5)


def main(argv: list[str] | None = None) -> int:
    p = bench_parser("bench/site_scale.py", __doc__)
    add_run_options(p, "M = 2, 6 and short phases", "brokers' data and logs")
    p.add_argument(
        "--neighbours",
        type=lambda s: sorted({int(x) for x in s.split(",")}),
        default=None,
        help="comma-separated numbers of neighbours (default 3,10,20; quick 2,6)",
    )
    p.add_argument("--origins", type=int, default=3, help="ships entering at each neighbour")
    p.add_argument("--rate", type=int, default=None, help="containers/s fed per neighbour")
    p.add_argument("--feed-seconds", type=float, default=None)
    p.add_argument("--requests", type=int, default=20, help="requests per page path")
    p.add_argument("--phase-timeout", type=float, default=None, help="bound of each wait, s")
    a = p.parse_args(argv)
    fill_defaults(
        a,
        {
            "neighbours": ([2, 6], [3, 10, 20]),
            "rate": (50, 100),
            "feed_seconds": (30.0, 60.0),
            "phase_timeout": (300.0, 600.0),
        },
    )
    return run_bench(say, a.keep, "sl-bench-scale-", lambda work: SiteScaleBench(work, a))


if __name__ == "__main__":
    sys.exit(main())
