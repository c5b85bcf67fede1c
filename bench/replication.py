"""Benchmark: replication among four sites in a full mesh, shorelink side by side with
Kafka MirrorMaker 2 on the same brokers, data and links, in one run.

Four single-node Kafka brokers on loopback (``local_stack.kafka``); every broker has
one more listener per other site, and a byte-counting TCP relay in front of each (this
script's own, ``Relay``): whatever crosses a site link is counted in the direction
broker -> reader (fetched records; the requests the other way are small).

Systems:
- ``shorelink``: each site's application (merges, relay topics, pullers, link
  probes) as ``shorelink-spark site`` runs it in production: a spark-submit of its own
  per site (local mode); records enter at a site as its gateway writes them (``sl.ingress.<stream>``,
  Kafka transactions); a site reads ``sl.<stream>``.
- ``mm2-default``: MirrorMaker 2 (``connect-mirror`` 4.1.1, dedicated mode, every flow
  x->y of the mesh, ``topics = .*sl\\.(containers|alerts)``, DefaultReplicationPolicy:
  remote topics renamed ``x.sl.containers``, multi-hop copies included, the only way it
  reaches a site whose direct link is down); records enter at a site's
  ``sl.<stream>``; a site reads every topic matching ``.*sl\\.<stream>``.
- ``mm2-identity``: the same with ``IdentityReplicationPolicy`` and ``topics =
  sl\\.(containers|alerts)`` (the topic names stay; in a loop nothing stops a record
  from going round: the run is bounded by ``--phase-timeout``).

Phases per system (every loop bounded):
1. bulk: ``--records`` records entering at each of 3 sites at once; convergence time
   (every site holds every identity), duplicates at each site, bytes fetched across
   site links per record per receiving site, against the records' own size (key + value
   + headers, the record's size in Kafka's record format without batch framing);
2. steady: ``--rate`` records/s entering at each of 3 sites for ``--steady-seconds``;
   end-to-end lag (creation at the entry site, ``sl.ts`` = produce time, to a read at
   each other site) p50/p99;
3. alert during a catch-up: a ``--backlog`` containers backlog enters at one site, then
   an alert every 0.5 s for 10 s; alert lag p99 at the other sites.

Where the lag goes (``hops`` of phases 2 and 3, p50/p99 and the mean over the slowest
tenth of the records, per record read at a site other than its entry): each site's
reader notes when it first read a record and the Kafka timestamp of that copy (when
the writer there produced it), and the writer at the entry when its write returned.
``gateway_commit + entry_write + pull_write + commit_read`` is the lag;
``entry_commit_read`` is the part of ``pull_write`` until the entry site could be read:

- ``gateway_commit``: creation to the entry's write returned (shorelink: the
  gateway's transaction into ``sl.ingress.*`` committed; MirrorMaker 2: the producer
  flushed into ``sl.<stream>``);
- ``entry_write``: that to the entry site's copy produced (shorelink: the ingest
  puller's fetch and wait, the merge's lock and plan);
- ``entry_commit_read``: that copy produced to read at the entry site (its
  transaction's commit, read_committed visibility, this script's reader);
- ``pull_write``: the entry site's copy produced to the other site's produced
  (shorelink: the entry's commit, the puller's fetch across the link and its wait, the
  merge's lock and plan);
- ``commit_read``: the other site's copy produced to read there (its commit, this
  script's reader).

MirrorMaker 2 gives its copies the source record's timestamp, so for it ``pull_write``
is 0 and ``commit_read`` is the whole copy. The readers return with a record as it
arrives (``PartitionReader.poll(wake=True)``), so what they add is a fetch.

``--signed`` (shorelink only): every ship signs (docs/replication.md, "Ship
signatures"): each record enters with its ``sl.proof`` as a gateway writes it, the sites
read a ship keys file that requires signatures, and every merge checks the proof of
what it pulls; the record's own size then includes its proof.

    .venv/bin/python bench/replication.py --quick   # 20k records a site, ~10 minutes
    .venv/bin/python bench/replication.py           # 200k records a site

Progress goes to stderr; one JSON object goes to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
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
)
from local_stack.kafka import KafkaBroker, LinkListener, _java_argv, start_kafka
from local_stack.process import Proc, free_ports
from shorelink.contract import H_PROOF, Record, ingress_topic
from shorelink.identity import Identity
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.errors import KafkaClientError
from shorelink.kafka.reading import BEGINNING, PartitionReader
from shorelink.kafka.topics import PlainProducer, TopicSpec, ensure_topics, producer
from shorelink.kafka.transactions import TransactionalProducer
from shorelink.proof import ShipKey, ShipKeys, record_hash

say = progress("replication")

SITES = ("tokyo", "singapore", "sydney", "hq")
ENTRY = SITES[:3]
MM2 = "mm2"  # the reader name of MirrorMaker's links (it runs in one process)
GOALS = {
    "duplicates": 0,
    "lag_p99_s": 10.0,
    "alert_lag_p99_s": 5.0,
    "bytes_per_record_ratio": 1.2,
}


# -- links ------------------------------------------------------------------------------
class Relay:
    """TCP relays in one event loop thread, counting bytes broker -> client per link."""

    def __init__(self) -> None:
        self.down: Counter[str] = Counter()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._servers: list[asyncio.AbstractServer] = []

    def add(self, name: str, listen: int, target: int) -> None:
        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter, count: bool) -> None:
            try:
                while data := await r.read(65536):
                    if count:
                        self.down[name] += len(data)
                    w.write(data)
                    await w.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                w.close()

        async def handle(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
            try:
                ur, uw = await asyncio.open_connection("127.0.0.1", target)
            except OSError:
                cw.close()
                return
            await asyncio.gather(pipe(cr, uw, False), pipe(ur, cw, True))

        async def start() -> None:
            self._servers.append(await asyncio.start_server(handle, "127.0.0.1", listen))

        asyncio.run_coroutine_threadsafe(start(), self._loop).result(10)

    def close(self) -> None:
        async def stop() -> None:
            for s in self._servers:
                s.close()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)


def link_name(source: str, reader: str) -> str:
    return f"{source}>{reader}"


# -- records ----------------------------------------------------------------------------
def make_records(
    entry: str, stream: str, origin: str, seqs: range, size: int, payload: str = "padded"
) -> list[Record]:
    """``padded``: every record the same body, ``size`` bytes of padding (lz4 takes it
    several-fold); ``random``: each body's padding is ``size`` random base64 characters,
    which lz4 cannot shrink (the bytes figure for payloads that do not compress)."""
    now = int(time.time() * 1000)
    head, tail = b'{"t":4.5,"h":61.2,"door":"closed","battery":88,"pad":"', b'"}'
    fixed = head + b"x" * size + tail

    def body() -> bytes:
        if payload == "padded":
            return fixed
        return head + base64.b64encode(os.urandom(size))[:size] + tail

    return [
        Record(
            Identity(origin, stream, q),
            f"MSCU{q % 5000:07d}".encode(),
            body(),
            now,
            entry,
            f"ship/{origin}/c",
        )
        for q in seqs
    ]


def wire_size(r: Record, proof: bytes | None = None) -> int:
    extra = 0 if proof is None else len(H_PROOF) + len(proof)
    return len(r.key) + len(r.value) + sum(len(k) + len(v) for k, v in r.headers()) + extra


#: the ships' keys of a ``--signed`` run, by origin (made as records of a ship are)
SHIP_KEYS: dict[str, ShipKey] = {}


def proved(recs: list[Record]) -> list[bytes]:
    """Each record's ``sl.proof``, as the gateway writes it for a batch its ship signed
    (runs of consecutive seqs of one ship and stream, each signed as one batch)."""
    out: list[bytes] = []
    i = 0
    while i < len(recs):
        first = recs[i].identity
        j = i + 1
        while (
            j < len(recs)
            and recs[j].identity.source == first.source
            and recs[j].identity.seq == first.seq + (j - i)
        ):
            j += 1
        run = recs[i:j]
        key = SHIP_KEYS.setdefault(first.origin, ShipKey.generate())
        leaves = [record_hash(r.identity.seq, r.ts_ms, r.key, r.mqtt_topic, r.value) for r in run]
        out += key.proofs(first.origin, first.stream, first.seq, leaves)
        i = j
    return out


class Entry:
    """Writes records at a site: as its gateway does (shorelink: transactions into
    ingress) or straight into ``sl.<stream>`` (MirrorMaker's source topics)."""

    def __init__(self, kafka: KafkaEndpoint, shorelink: bool, signed: bool = False) -> None:
        self.shorelink = shorelink
        self.signed = signed
        conf: dict[str, Any] = kafka.client_config({"linger.ms": 5, "compression.type": "lz4"})
        self.txn: TransactionalProducer | None = None
        self.p: PlainProducer | None = None
        if shorelink:
            conf["transactional.id"] = (
                f"bench-gw-{os.getpid()}-{kafka.bootstrap}-{time.monotonic_ns()}"
            )
            self.txn = TransactionalProducer(conf, timeout=30)
            self.txn.init()
        else:
            self.p = producer(
                kafka, {"linger.ms": 5, "compression.type": "lz4", "enable.idempotence": True}
            )

    def write(
        self, recs: list[Record], *, stamp: bool = False, proofs: list[bytes] | None = None
    ) -> None:
        """``proofs``: the records' own (made here for a signed run that has none, or
        whose records are stamped: a proof covers the event time)."""
        if stamp:
            recs = [
                Record(r.identity, r.key, r.value, int(time.time() * 1000), r.site, r.mqtt_topic)
                for r in recs
            ]
        if self.signed and (stamp or proofs is None):
            proofs = proved(recs)
        if self.txn is not None:
            with self.txn.transaction() as txn:
                for i, r in enumerate(recs):
                    headers = r.headers()
                    if proofs is not None:
                        headers.append((H_PROOF, proofs[i]))
                    txn.produce(ingress_topic(r.identity.stream), r.key, r.value, headers)
            return
        assert self.p is not None
        for r in recs:
            while True:
                try:
                    self.p.produce(
                        f"sl.{r.identity.stream}",
                        key=r.key,
                        value=r.value,
                        headers=r.headers(),  # type: ignore[arg-type]
                    )
                    break
                except BufferError:
                    self.p.poll(0.05)
        self.p.flush(60)


# -- reading at each site ---------------------------------------------------------------
class Watch(threading.Thread):
    """A site's reader: every topic matching ``pattern`` (read_committed); per identity,
    how often it was read and when first; lag = first read - sl.ts."""

    def __init__(self, site: str, kafka: KafkaEndpoint, pattern: str) -> None:
        super().__init__(daemon=True, name=f"watch-{site}")
        self.site = site
        self.counts: Counter[tuple[str, str, int]] = Counter()
        self.lag: dict[tuple[str, str, int], float] = {}
        #: per identity: when first read here, and that copy's Kafka timestamp (s)
        self.read_at: dict[tuple[str, str, int], float] = {}
        self.written_at: dict[tuple[str, str, int], float] = {}
        self.stop = threading.Event()
        self.pattern = re.compile(pattern)
        self.c = PartitionReader(kafka, group=f"bench-watch-{site}-{time.monotonic_ns()}")
        self.lock = threading.Lock()

    def run(self) -> None:
        assigned: set[tuple[str, int]] = set()
        rescan = 0.0
        while not self.stop.is_set():
            if time.monotonic() >= rescan:  # topics the merges create as records come
                rescan = time.monotonic() + 2.0
                with contextlib.suppress(KafkaClientError):  # asked again at the next scan
                    found = self.c.topics(timeout=5)
                    new = {
                        (t, p): BEGINNING
                        for t, ps in found.items()
                        if self.pattern.fullmatch(t)
                        for p in ps
                        if (t, p) not in assigned
                    }
                    self.c.add(new)
                    assigned |= set(new)
            msgs = self.c.poll(5000, 0.2, wake=True).records
            now = time.time()
            with self.lock:
                for m in msgs:
                    h = dict(m.headers() or [])
                    try:
                        ident = (h["sl.origin"].decode(), h["sl.stream"].decode(), int(h["sl.seq"]))
                        ts = int(h["sl.ts"]) / 1000
                    except (KeyError, ValueError):
                        continue
                    self.counts[ident] += 1
                    if ident not in self.lag:
                        self.lag[ident] = now - ts
                        self.read_at[ident] = now
                        self.written_at[ident] = m.timestamp()[1] / 1000
        self.c.close()

    def holds(self, idents: set[tuple[str, str, int]]) -> bool:
        with self.lock:
            return all(i in self.counts for i in idents)

    def duplicates(self) -> int:
        with self.lock:
            return sum(n - 1 for n in self.counts.values() if n > 1)


HOPS = ("gateway_commit", "entry_write", "entry_commit_read", "pull_write", "commit_read")


def hops(
    watches: dict[str, Watch],
    idents: set[tuple[str, str, int]],
    entry_of: Callable[[str], str],
    committed: dict[tuple[str, str, int], float],
) -> dict[str, dict[str, float | None]]:
    """Where the lag of ``idents`` went (module docstring), per hop: p50, p99, and the
    mean over the records whose lag is in the slowest tenth. ``entry_of``: an origin's
    entry site; ``committed``: when the entry's write of each returned."""
    rows: list[tuple[float, ...]] = []
    for w in watches.values():
        for i in idents:
            entry = watches.get(entry_of(i[0]))
            if entry is None or entry is w or i not in w.read_at or i not in entry.read_at:
                continue
            created = w.read_at[i] - w.lag[i]
            ew, er = entry.written_at[i], entry.read_at[i]
            done = committed.get(i, created)
            rows.append(
                (
                    done - created,
                    ew - done,
                    er - ew,
                    w.written_at[i] - ew,
                    w.read_at[i] - w.written_at[i],
                    w.lag[i],
                )
            )
    slow = sorted(rows, key=lambda r: r[-1])[int(0.9 * len(rows)) :]
    return {
        name: {
            "p50_s": r3(pct([r[k] for r in rows], 0.5)),
            "p99_s": r3(pct([r[k] for r in rows], 0.99)),
            "slowest_tenth_mean_s": r3(sum(r[k] for r in slow) / len(slow)) if slow else None,
        }
        for k, name in enumerate(HOPS)
    }


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while not check():
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(f"timed out after {timeout:.0f}s: {what}")
        time.sleep(0.5)
    return time.monotonic() - t0


# -- the two systems --------------------------------------------------------------------
class ShorelinkSystem:
    name = "shorelink"
    shorelink = True

    def __init__(self, bench: ReplicationBench) -> None:
        self.b = bench
        self.procs: list[Proc] = []

    def pattern(self, stream: str) -> str:
        return rf"sl\.{stream}"

    def start(self) -> None:
        """Each site's application as in production: ``shorelink-spark site`` (its own
        spark-submit JVM and Python driver), one sites file for the four."""
        root = self.b.work / "shorelink"
        root.mkdir(parents=True, exist_ok=True)
        head = ""
        if self.b.args.signed:
            for origin in (*(f"ship-{s}" for s in ENTRY), "ship-backlog", "ship-alert"):
                SHIP_KEYS.setdefault(origin, ShipKey.generate())
            keys = root / "ship_keys.toml"
            public = {o: k.public() for o, k in SHIP_KEYS.items()}
            keys.write_text(ShipKeys.render(public, require_signatures=True))
            head = f'ship_keys_file = "{keys}"\n'
        parts = [
            head
            + '[spark]\nmaster = "local[2]"\ndriver_memory = "1g"\n[spark.conf]\n"spark.ui.enabled" = "false"\n"spark.sql.shuffle.partitions" = "2"\n'
        ]
        for s in SITES:
            parts.append(
                f"""
[sites.{s}]
streams = ["containers", "alerts"]
neighbours = {[n for n in SITES if n != s]!r}
checkpoint_dir = "{root}/{s}/checkpoints"
table_dir = "{root}/{s}/tables"
trigger_interval = "500ms"
[sites.{s}.kafka]
bootstrap = "{self.b.brokers[s].bootstrap}"
[sites.{s}.replication]
max_offsets_per_trigger = {self.b.args.max_offsets}
probe_interval = "1s"
[sites.{s}.replication.via]
"""
                + "".join(
                    f'{n} = "{self.b.brokers[n].link_bootstrap(s)}"\n' for n in SITES if n != s
                )
            )
        root.mkdir(parents=True, exist_ok=True)
        config = root / "sites.toml"
        config.write_text("".join(parts))
        for s in SITES:
            ensure_topics(
                self.b.brokers[s].endpoint,
                [
                    TopicSpec(ingress_topic(x), partitions=3, retention_ms=-1)
                    for x in ("containers", "alerts")
                ],
            )
        logs = self.b.work / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        for s in SITES:
            proc = Proc.start(
                f"site:{s}",
                [
                    sys.executable,
                    "-m",
                    "spark_core.cli",
                    "site",
                    "--site",
                    s,
                    "--config",
                    str(config),
                ],
                logs / f"site-{s}.log",
            )
            self.procs.append(proc)
            self.b.procs.append(proc)
        # every site's merges and relay topics are up before data enters
        for s in SITES:
            status = root / s / "checkpoints" / "merge.status.json"
            wait_for(lambda st=status: st.exists(), 300, f"site {s} started")

    def stop(self) -> None:
        for p in self.procs:
            p.stop(grace=30)


class MM2System:
    shorelink = False

    def __init__(self, bench: ReplicationBench, identity: bool) -> None:
        self.b = bench
        self.identity = identity
        self.name = "mm2-identity" if identity else "mm2-default"
        self.proc: Proc | None = None

    def pattern(self, stream: str) -> str:
        return rf"sl\.{stream}" if self.identity else rf"(.*\.)?sl\.{stream}"

    def start(self) -> None:
        for s in SITES:
            ensure_topics(
                self.b.brokers[s].endpoint,
                [TopicSpec(f"sl.{x}", partitions=3) for x in ("containers", "alerts")],
            )
        lines = [f"clusters = {', '.join(SITES)}"]
        for s in SITES:
            lines.append(f"{s}.bootstrap.servers = {self.b.brokers[s].link_bootstrap(MM2)}")
            # its remote topics compressed as shorelink's relay topics are (lz4)
            lines.append(f"{s}.producer.compression.type = lz4")
        for a in SITES:
            for b in SITES:
                if a != b:
                    lines.append(f"{a}->{b}.enabled = true")
        lines += [
            "topics = "
            + (r"sl\.(containers|alerts)" if self.identity else r".*sl\.(containers|alerts)"),
            "replication.factor = 1",
            "checkpoints.topic.replication.factor = 1",
            "heartbeats.topic.replication.factor = 1",
            "offset-syncs.topic.replication.factor = 1",
            "offset.storage.replication.factor = 1",
            "status.storage.replication.factor = 1",
            "config.storage.replication.factor = 1",
            "sync.topic.acls.enabled = false",
            "sync.topic.configs.enabled = false",
            "emit.checkpoints.enabled = false",
            "refresh.topics.interval.seconds = 5",
            "tasks.max = 2",
            "consumer.isolation.level = read_committed",
        ]
        if self.identity:
            lines.append(
                "replication.policy.class = org.apache.kafka.connect.mirror.IdentityReplicationPolicy"
            )
        props = self.b.work / f"{self.name}.properties"
        props.write_text("\n".join(lines) + "\n")
        logs = self.b.work / "logs" / self.name
        logs.mkdir(parents=True, exist_ok=True)
        self.proc = Proc.start(
            self.name,
            _java_argv(
                "org.apache.kafka.connect.mirror.MirrorMaker", str(props), logs=logs, heap="768m"
            ),
            logs / "stdout.log",
        )
        self.b.procs.append(self.proc)
        time.sleep(20)  # the workers join their groups and start their connectors

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop(grace=15)


# -- the benchmark -----------------------------------------------------------------------
class ReplicationBench:
    def __init__(self, work: Path, args: argparse.Namespace) -> None:
        self.work = work
        self.args = args
        self.procs: list[Proc] = []
        self.brokers: dict[str, KafkaBroker] = {}
        self.relay = Relay()

    def _brokers(self, tag: str) -> None:
        """Fresh brokers for one system (no data of another system's run)."""
        self.relay.down.clear()
        links: dict[str, dict[str, LinkListener]] = {}
        ports = iter(free_ports(2 * len(SITES) * len(SITES)))
        for s in SITES:
            links[s] = {}
            for r in [*[x for x in SITES if x != s], MM2]:
                ln = LinkListener(next(ports), next(ports))
                links[s][r] = ln
                self.relay.add(link_name(s, r), ln.advertised, ln.port)
        self.brokers = {
            s: start_kafka(
                f"{tag}-{s}",
                self.work / tag / s,
                self.work / "logs",
                heap="384m",
                wait=False,
                links=links[s],
            )
            for s in SITES
        }
        self.procs += [b.proc for b in self.brokers.values()]
        for b in self.brokers.values():
            b.proc.wait_ready(b.ready, timeout=120)

    def _stop_brokers(self) -> None:
        for b in self.brokers.values():
            b.proc.stop(grace=10)

    def run_system(self, system: Any) -> dict[str, Any]:
        a = self.args
        say(f"{system.name}: starting four brokers")
        self._brokers(system.name)
        out: dict[str, Any] = {}
        watches: dict[str, Watch] = {}
        try:
            system.start()
            watches = {
                s: Watch(s, self.brokers[s].endpoint, system.pattern("(containers|alerts)"))
                for s in SITES
            }
            for w in watches.values():
                w.start()
            signed = system.shorelink and a.signed
            entries = {s: Entry(self.brokers[s].endpoint, system.shorelink, signed) for s in ENTRY}
            # 1. bulk
            bulk = {
                s: make_records(
                    s, "containers", f"ship-{s}", range(1, a.records + 1), a.size, a.payload
                )
                for s in ENTRY
            }
            want = {(*r.identity.source, r.identity.seq) for recs in bulk.values() for r in recs}
            bulk_proofs = {s: proved(recs) if signed else None for s, recs in bulk.items()}
            record_bytes = sum(
                wire_size(r, None if bulk_proofs[s] is None else bulk_proofs[s][i])
                for s, recs in bulk.items()
                for i, r in enumerate(recs)
            ) / len(want)
            say(f"{system.name}: bulk: {a.records} records entering at each of {', '.join(ENTRY)}")
            t0 = time.monotonic()
            threads = [
                threading.Thread(
                    target=lambda s=s: [
                        entries[s].write(
                            bulk[s][i : i + 20_000],
                            proofs=None if (p := bulk_proofs[s]) is None else p[i : i + 20_000],
                        )
                        for i in range(0, len(bulk[s]), 20_000)
                    ]
                )
                for s in ENTRY
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            converged = None
            with contextlib.suppress(RuntimeError):
                wait_for(
                    lambda: all(w.holds(want) for w in watches.values()),
                    a.phase_timeout,
                    "bulk convergence",
                )
                converged = time.monotonic() - t0
            time.sleep(3)
            received = sum(len(want) - (a.records if s in ENTRY else 0) for s in SITES)
            crossed = sum(self.relay.down.values())
            out["bulk"] = {
                "signed": signed,
                "records_entered": len(want),
                "convergence_s": r3(converged),
                "converged": converged is not None,
                "record_bytes": round(record_bytes, 1),
                "bytes_across_links": crossed,
                "bytes_per_record_per_receiving_site": round(crossed / received, 1),
                "bytes_per_record_ratio": r3(crossed / received / record_bytes),
                "duplicates": {s: w.duplicates() for s, w in watches.items()},
                "missing": {
                    s: sum(1 for i in want if i not in w.counts) for s, w in watches.items()
                },
            }
            say(f"{system.name}: bulk: {json.dumps(out['bulk'])}")
            # 2. steady rate
            say(f"{system.name}: steady: {a.rate}/s at each entry site for {a.steady_seconds}s")
            steady: set[tuple[str, str, int]] = set()
            committed: dict[tuple[str, str, int], float] = {}  # the entry's write returned
            base = a.records + 1
            end = time.monotonic() + a.steady_seconds
            tick = 0
            while time.monotonic() < end:
                t_tick = time.monotonic()
                for s in ENTRY:
                    recs = make_records(
                        s,
                        "containers",
                        f"ship-{s}",
                        range(base + tick * a.rate // 2, base + (tick + 1) * a.rate // 2),
                        a.size,
                        a.payload,
                    )
                    entries[s].write(recs, stamp=True)
                    done = time.time()
                    for r in recs:
                        ident = (*r.identity.source, r.identity.seq)
                        steady.add(ident)
                        committed[ident] = done
                tick += 1
                time.sleep(max(0.0, 0.5 - (time.monotonic() - t_tick)))
            with contextlib.suppress(RuntimeError):
                wait_for(
                    lambda: all(w.holds(steady) for w in watches.values()),
                    a.phase_timeout,
                    "steady convergence",
                )
            lags = [
                w.lag[i]
                for s, w in watches.items()
                for i in steady
                if i in w.lag and not i[0].endswith(s)
            ]
            out["steady"] = {
                "records": len(steady),
                "lag_p50_s": r3(pct(lags, 0.5)),
                "lag_p99_s": r3(pct(lags, 0.99)),
                "samples": len(lags),
                "hops": hops(
                    watches, steady, lambda origin: origin.removeprefix("ship-"), committed
                ),
            }
            say(f"{system.name}: steady: {json.dumps(out['steady'])}")
            # 3. alert during a containers catch-up
            say(f"{system.name}: alerts during a {a.backlog}-record containers catch-up")
            backlog = make_records(
                ENTRY[0], "containers", "ship-backlog", range(1, a.backlog + 1), a.size, a.payload
            )
            for i in range(0, len(backlog), 20_000):
                entries[ENTRY[0]].write(backlog[i : i + 20_000])
            alerts = set()
            for k in range(1, 21):
                rec = make_records(ENTRY[0], "alerts", "ship-alert", range(k, k + 1), 20)
                entries[ENTRY[0]].write(rec, stamp=True)
                committed[(*rec[0].identity.source, k)] = time.time()
                alerts.add((*rec[0].identity.source, k))
                time.sleep(0.5)
            with contextlib.suppress(RuntimeError):
                wait_for(
                    lambda: all(w.holds(alerts) for s, w in watches.items() if s != ENTRY[0]),
                    a.phase_timeout,
                    "alerts",
                )
            alags = [
                w.lag[i] for s, w in watches.items() if s != ENTRY[0] for i in alerts if i in w.lag
            ]
            out["alert_during_catch_up"] = {
                "alerts": len(alerts),
                "lag_p50_s": r3(pct(alags, 0.5)),
                "lag_p99_s": r3(pct(alags, 0.99)),
                "samples": len(alags),
                "hops": hops(watches, alerts, lambda origin: ENTRY[0], committed),
            }
            say(f"{system.name}: alerts: {json.dumps(out['alert_during_catch_up'])}")
            time.sleep(5)
            out["duplicates_at_end"] = {s: w.duplicates() for s, w in watches.items()}
        finally:
            for w in watches.values():
                w.stop.set()
            for w in watches.values():
                w.join(10)
            system.stop()
            self._stop_brokers()
        return out

    def run(self) -> dict[str, Any]:
        a = self.args
        results: dict[str, Any] = {}
        for name in a.systems:
            system: Any = (
                ShorelinkSystem(self)
                if name == "shorelink"
                else MM2System(self, identity=name == "mm2-identity")
            )
            results[name] = self.run_system(system)
        return {
            "benchmark": "replication",
            "topology": "full mesh of 4 sites, records entering at 3",
            "records_per_entry_site": a.records,
            "goals": GOALS,
            "systems": results,
        }

    def cleanup(self) -> None:
        for p in self.procs:
            with contextlib.suppress(Exception):
                p.stop(grace=5)
        self.relay.close()


def main(argv: list[str] | None = None) -> int:
    p = bench_parser("bench/replication.py", __doc__)
    add_run_options(p, "20k records a site, short phases", "brokers' data and logs")
    p.add_argument("--records", type=int, default=None, help="records entering at each of 3 sites")
    p.add_argument("--size", type=int, default=60, help="payload padding, bytes")
    p.add_argument(
        "--payload",
        choices=["padded", "random"],
        default="padded",
        help="padding the same in every record (compresses) or random (does not)",
    )
    p.add_argument(
        "--rate", type=int, default=None, help="records/s per entry site in the steady phase"
    )
    p.add_argument("--steady-seconds", type=int, default=None)
    p.add_argument(
        "--backlog", type=int, default=None, help="containers backlog of the alert phase"
    )
    p.add_argument("--max-offsets", type=int, default=20_000, help="shorelink pulled batch bound")
    p.add_argument(
        "--signed",
        action="store_true",
        help="shorelink: ships sign, records carry sl.proof, every merge checks it",
    )
    p.add_argument(
        "--phase-timeout", type=float, default=None, help="bound of each phase's wait, s"
    )
    p.add_argument(
        "--systems",
        nargs="+",
        default=["shorelink", "mm2-default", "mm2-identity"],
        choices=["shorelink", "mm2-default", "mm2-identity"],
    )
    a = p.parse_args(argv)
    fill_defaults(
        a,
        {
            "records": (20_000, 200_000),
            "rate": (100, 500),
            "steady_seconds": (20, 60),
            "backlog": (50_000, 500_000),
            "phase_timeout": (240.0, 900.0),
        },
    )
    return run_bench(say, a.keep, "sl-bench-repl-", lambda work: ReplicationBench(work, a))


if __name__ == "__main__":
    sys.exit(main())
