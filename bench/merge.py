"""Benchmark: the site's exactly-once merge, side by side with a plain Spark
Kafka->Kafka copy.

Everything runs on loopback against a private single-node Kafka (``local_stack.kafka``)
and a local-mode SparkSession in this process (configured like the tests' ``spark``
fixture), running the project's own merge (``spark_core.merge.Merger`` /
``start_merge``) with a sites file generated for the run. Every phase is bounded.

0. fill ``sl.ingress.containers`` (6 partitions) with N records in the record contract
   (container JSON payloads, several origins), uploaded in chunks of ``--chunk``; every
   fifth chunk is a retried upload of an earlier chunk of the same origin (same
   identities, same bytes): 20% duplicates;
0. warm-up (untimed): the Spark side of both pipelines over a slice of ingress, three
   times, so that neither timed phase pays for JIT compilation the other one got for free;
1. reference: a plain Spark copy (readStream kafka -> writeStream kafka, includeHeaders,
   read_committed, Trigger.AvailableNow, same maxOffsetsPerTrigger) of the same input to
   another topic, no dedup: records/s. Run before and after the merge (JVM warm-up and
   a shared machine skew single runs); the faster of the two is the reference;
2. merge throughput: ``start_merge(..., available_now=True)`` over the same input (its
   output topics created before the clock starts, as the copy's topic is; its start-up,
   fencing and state load are timed):
   records/s of input processed and identities written; where the driver's time went
   (the merge's own totals: ``fetch`` = Spark computing the batch and handing it over as
   Arrow, ``plan`` = dedup, order and turning the written rows into Python objects,
   ``kafka_txn`` = producing and committing the transaction); every phase lists each
   batch's time (``batch_ms``: the JVM warming up shows in the first ones);
3. state size: ranges and sources of the merge's state, its status file, the
   ``sl.ledger`` entries (count and bytes);
4. latency: the merge running continuously (processingTime trigger from the sites file),
   a producer process paced at ``--steady-rate`` for ``--steady-seconds`` (new
   identities, ``sl.ts`` header = produce time in ms) and a read_committed consumer
   process on ``sl.containers``: p50/p99 of (canonical record received - sl.ts) and of
   (canonical record CreateTime, i.e. when the merge produced it - sl.ts);
5. exactly once: ``shorelink.kafka.audit.audit_site`` over ``sl.containers``: every identity
   produced is there once, no duplicates, no gaps.

    .venv/bin/python bench/merge.py --quick     # 100k records, ~2-3 minutes
    .venv/bin/python bench/merge.py             # 1M records, ~8-10 minutes

Progress goes to stderr; one JSON object goes to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import secrets
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tomli_w
from _common import (
    add_run_options,
    bench_parser,
    fill_defaults,
    progress,
    require_at_least_one,
    run_bench,
)

from local_stack.kafka import BrokerSecurity, KafkaBroker, start_kafka
from local_stack.process import Proc, stop_procs
from local_stack.tls import make_authority
from shorelink.config import Secret
from shorelink.contract import H_TS, LEDGER_TOPIC, Record, canonical_topic, ingress_topic
from shorelink.identity import Identity
from shorelink.kafka.audit import audit_site
from shorelink.kafka.auth import KafkaAuth
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.reading import PartitionReader, read_to_end
from shorelink.kafka.topics import PlainProducer, TopicSpec, ensure_topics, producer

SITE = "benchport"
STREAM = "containers"
INGRESS = ingress_topic(STREAM)
CANONICAL = canonical_topic(STREAM)
COPY_TOPIC = "bench.copy.containers"
PARTITIONS = 6
CONTAINERS = 500  # containers per ship
GOALS = {"ratio": 0.6}
REPO = Path(__file__).resolve().parent.parent

say = progress("merge")


# -- records -----------------------------------------------------------------------------
def ship_name(i: int, prefix: str = "ship") -> str:
    return f"{prefix}-{i:02d}"


def make_record(origin: str, seq: int, ts_ms: int) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
    """One container reading as the gateway writes it to ingress: key, value, headers."""
    c = (seq * 7919) % CONTAINERS
    cid = f"MSCU{c:06d}"
    value = (
        f'{{"ts":{ts_ms / 1000:.3f},"container":"{cid}","seq":{seq},'
        f'"temp_c":{-18 + (seq % 40) / 10:.1f},"setpoint_c":-18.0,'
        f'"humidity":{60 + seq % 30}.5,"power_kw":{2 + (seq % 9) / 10:.2f},'
        f'"door":"{"open" if seq % 997 == 0 else "closed"}","ship":"{origin}"}}'
    ).encode()
    rec = Record(
        Identity(origin, STREAM, seq),
        cid.encode(),
        value,
        ts_ms,
        SITE,
        f"{origin}/deck{c % 4 + 1}/containers/{cid}/env",
    )
    return rec.key, rec.value, rec.headers()


def _produce(p: PlainProducer, topic: str, key: bytes, value: bytes, headers: Any) -> None:
    while True:
        try:
            p.produce(topic, value=value, key=key, headers=headers)
            return
        except BufferError:
            p.poll(0.05)


def _producer(kafka: KafkaEndpoint) -> PlainProducer:
    return producer(
        kafka, {"linger.ms": 5, "compression.type": "lz4", "queue.buffering.max.messages": 500_000}
    )


def fill_ingress(
    kafka: KafkaEndpoint, n: int, origins: int, chunk: int, seed: int
) -> tuple[dict[tuple[str, str], int], int]:
    """N records in upload chunks; every fifth chunk re-sends an earlier chunk of the
    same origin (a retried upload). Returns the highest seq per
    (origin, stream) and the number of duplicates sent."""
    rng = random.Random(seed)
    p = _producer(kafka)
    next_seq = {ship_name(o): 1 for o in range(origins)}
    sent_chunks: dict[str, list[list[tuple[bytes, bytes, Any]]]] = {o: [] for o in next_seq}
    names = list(next_seq)
    produced = dups = 0
    t0 = time.monotonic()
    k = 0
    while produced < n:
        size = min(chunk, n - produced)
        origin = names[k % len(names)]
        if k % 5 == 4 and sent_chunks[origin]:
            earlier = sent_chunks[origin][-rng.randint(1, min(10, len(sent_chunks[origin]))) :]
            recs = earlier[0][:size]
            dups += len(recs)
        else:
            first = next_seq[origin]
            ts = int(time.time() * 1000)
            recs = [make_record(origin, s, ts) for s in range(first, first + size)]
            next_seq[origin] = first + size
            sent_chunks[origin].append(recs)
            del sent_chunks[origin][:-10]
        for key, value, headers in recs:
            _produce(p, INGRESS, key, value, headers)
        produced += len(recs)
        k += 1
        p.poll(0)
        if k % 400 == 0:
            say(f"ingress: {produced}/{n} records ({produced / (time.monotonic() - t0):.0f}/s)")
    left = p.flush(120)
    if left:
        raise RuntimeError(f"ingress fill: {left} records not delivered")
    say(f"ingress: {produced} records, {dups} duplicates, {time.monotonic() - t0:.1f} s")
    return {(o, STREAM): s - 1 for o, s in next_seq.items() if s > 1}, dups


def end_offsets(kafka: KafkaEndpoint, topic: str) -> int:
    with PartitionReader(kafka, group="bench-offsets") as reader:
        total = 0
        for part in reader.partitions([topic], timeout=10)[topic]:
            lo, hi = reader.watermarks(topic, part, timeout=10)
            total += hi - lo
        return total


# -- helper processes: paced producer and canonical consumer ------------------------------
def run_steady_producer(spec: dict[str, Any]) -> None:
    """New identities at ``rate`` records/s for ``seconds``; sl.ts = produce time."""
    p = producer(_kafka(spec), {"linger.ms": 1, "compression.type": "lz4"})
    origins = [ship_name(i, "steady") for i in range(int(spec["origins"]))]
    rate, seconds = float(spec["rate"]), float(spec["seconds"])
    n = int(rate * seconds)
    sent = 0
    t0 = time.monotonic()
    while sent < n and time.monotonic() - t0 < seconds + 30:
        due = min(n, int((time.monotonic() - t0) * rate) + 1)
        while sent < due:
            origin = origins[sent % len(origins)]
            seq = sent // len(origins) + 1
            key, value, headers = make_record(origin, seq, int(time.time() * 1000))
            _produce(p, INGRESS, key, value, headers)
            sent += 1
        p.poll(0)
        time.sleep(0.002)
    left = p.flush(60)
    _write_result(
        spec["result"],
        {"sent": sent, "undelivered": left, "seconds": time.monotonic() - t0},
    )


def run_consumer(spec: dict[str, Any]) -> None:
    """Read sl.containers (read_committed) from the given offsets until ``expect``
    records of the steady origins arrived (or the deadline): latencies in ms."""
    c = PartitionReader(
        _kafka(spec), group="bench-latency", extra={"fetch.wait.max.ms": 10, "fetch.min.bytes": 1}
    )
    c.assign({(CANONICAL, int(p)): int(o) for p, o in spec["offsets"].items()})
    ready = Path(spec["result"] + ".ready")
    ready.write_text("1")
    expect, deadline = int(spec["expect"]), time.monotonic() + float(spec["timeout"])
    recv: list[float] = []
    append: list[float] = []
    seen = 0
    while seen < expect and time.monotonic() < deadline:
        got = c.poll(1000, timeout=0.2)
        if got.errors or got.gaps:
            raise RuntimeError(str([*got.errors, *got.gaps][0]))
        for msg in got.records:
            now_ms = time.time() * 1000
            hs = dict(msg.headers() or [])
            if not hs.get("sl.origin", b"").startswith(b"steady-"):
                continue
            ts = int(hs[H_TS])
            seen += 1
            recv.append(now_ms - ts)
            append.append(msg.timestamp()[1] - ts)
    c.close()
    _write_result(spec["result"], {"seen": seen, "receive_ms": recv, "append_ms": append})


def _kafka(spec: dict[str, Any]) -> KafkaEndpoint:
    """A helper process's Kafka and credentials, handed over in its spec (a file of
    the run)."""
    a = spec.get("auth") or {}
    if not a:
        return KafkaEndpoint.plaintext(spec["bootstrap"])
    auth = KafkaAuth(a["username"], Secret(a["password"]), Path(a["ca_file"]))
    return KafkaEndpoint(spec["bootstrap"], auth)


def _write_result(path: str, data: dict[str, Any]) -> None:
    tmp = Path(path + ".tmp")
    tmp.write_text(json.dumps(data))
    tmp.rename(path)


def batch_ms(q: Any) -> list[int]:
    """Each batch's time (Spark's triggerExecution): shows the JVM warming up."""
    return [int(p["durationMs"].get("triggerExecution", 0)) for p in q.recentProgress]


def pct(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return round(s[min(len(s) - 1, int(q * len(s)))], 1)


# -- the benchmark -----------------------------------------------------------------------
class Bench:
    def __init__(self, args: argparse.Namespace, work: Path, *, secure: bool = False) -> None:
        self.args = args
        self.work = work
        self.secure = secure
        self.procs: list[Proc] = []
        self.broker: KafkaBroker | None = None
        self.spark: Any = None
        self.queries: list[Any] = []
        self.mergers: list[Any] = []
        #: the generated sites file (the merge's ``sites``: customers_file)
        self.cfg: Any = None
        self.result: dict[str, Any] = {"benchmark": "merge"}

    @property
    def bootstrap(self) -> str:
        assert self.broker is not None
        return self.broker.bootstrap

    @property
    def kafka(self) -> KafkaEndpoint:
        """The benchmark's own clients: the super user (over TLS when secure)."""
        assert self.broker is not None
        return self.broker.endpoint

    def spark_kafka(self) -> dict[str, str]:
        """The same, as options of Spark's Kafka source and sink (the copy)."""
        return self.kafka.spark_options()

    def cleanup(self) -> None:
        for q in self.queries:
            with contextlib.suppress(Exception):
                if q.isActive:
                    q.stop()
        for m in self.mergers:
            with contextlib.suppress(Exception):
                m.close()
        if self.spark is not None:
            with contextlib.suppress(Exception):
                self.spark.stop()
        stop_procs([p for p in self.procs if p.alive()], grace=10)

    # set-up
    def start_broker(self) -> None:
        security = None
        if self.secure:
            security = BrokerSecurity(make_authority(self.work / "tls"), secrets.token_urlsafe(16))
        self.broker = start_kafka(
            SITE, self.work / "kafka", self.work / "logs", heap="1g", security=security
        )
        self.procs.append(self.broker.proc)
        say(f"kafka on {self.bootstrap}")

    def start_spark(self) -> None:
        from spark_core.session import local_session

        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        self.spark = local_session(
            "shorelink-bench-merge",
            conf={
                "spark.ui.enabled": "false",
                "spark.ui.showConsoleProgress": "false",
                "spark.sql.shuffle.partitions": "2",
                "spark.sql.warehouse.dir": str(self.work / "warehouse"),
                "spark.driver.memory": "2g",
            },
        )

    def site_config(self) -> Any:
        from spark_core.access import apply_access, plan_access
        from spark_core.config import load_config

        site: dict[str, Any] = {
            "streams": [STREAM],
            "checkpoint_dir": str(self.work / "checkpoints"),
            "table_dir": str(self.work / "tables"),
            "trigger_interval": self.args.trigger,
            "kafka": {"bootstrap": self.bootstrap, "timeout": "30s", **self._kafka_auth()},
            "merge": {
                "canonical_partitions": PARTITIONS,
                "max_offsets_per_trigger": self.args.max_offsets,
            },
        }
        if self.secure:
            site["access"] = self._secure_site()
        doc = {
            "log_level": "warning",
            **self._customers_file(),
            "spark": {"master": "local[2]", "driver_memory": "2g"},
            "sites": {SITE: site},
        }
        path = self.work / "sites.toml"
        path.write_text(tomli_w.dumps(doc))
        path.chmod(0o600)
        cfg = self.cfg = load_config(path)
        if self.secure:
            # the merge runs as the site application's principal, with its ACLs only
            assert self.broker is not None
            apply_access(plan_access(cfg, SITE), self.broker.endpoint)
        return cfg.site(SITE)

    def _customers_file(self) -> dict[str, str]:
        """``--customers``: one customer owning every container (MSCU): each new record
        also goes to ``sl.customer.bench.containers``, in the merge's transaction."""
        if not self.args.customers:
            return {}
        path = self.work / "customers.toml"
        path.write_text(tomli_w.dumps({"customers": {"bench": {"owner_codes": ["MSCU"]}}}))
        return {"customers_file": str(path)}

    def _kafka_auth(self) -> dict[str, str]:
        """The site application's principal, in its ``[sites.S.kafka]`` table."""
        if not self.secure:
            return {}
        assert self.broker is not None and self.broker.security is not None
        ca = self.broker.security.authority.ca_cert
        password = secrets.token_urlsafe(16)
        return {"username": "spark-bench", "password": password, "ca_file": str(ca)}

    def _secure_site(self) -> dict[str, str]:
        """--security: the merge as the site application's own principal, over SASL/SCRAM
        and TLS: the admin that grants it, in its ``[sites.S.access]`` table."""
        assert self.broker is not None and self.broker.security is not None
        sec = self.broker.security
        return {"admin_username": sec.admin_user, "admin_password": sec.admin_password}

    # phases
    def warm_up(self) -> float:
        """Untimed: run the Spark side of both pipelines once over a slice of ingress
        (the merge's projection and Arrow hand-over, the copy's Kafka write), so that
        no timed phase pays for the JIT compiling code the other phase already warmed."""
        from spark_core.merge_batch import ArrowBatch, batch_frame

        t0 = time.monotonic()
        ensure_topics(self.kafka, [TopicSpec(f"{COPY_TOPIC}.warm", partitions=PARTITIONS)])
        for _ in range(3):
            df = (
                self.spark.read.format("kafka")
                .options(**self.spark_kafka())
                .option("subscribe", INGRESS)
                .option("includeHeaders", "true")
                .option("kafka.isolation.level", "read_committed")
                .load()
                .limit(self.args.max_offsets)
            )
            ArrowBatch(batch_frame(df).toArrow())
            df.select("key", "value", "headers").write.format("kafka").options(
                **self.spark_kafka()
            ).option("topic", f"{COPY_TOPIC}.warm").save()
        say(f"warm-up: {time.monotonic() - t0:.1f} s")
        return round(time.monotonic() - t0, 1)

    def copy_phase(self, n: int, run: int) -> dict[str, Any]:
        """Plain Spark Kafka -> Kafka copy, no dedup: the reference."""
        topic = f"{COPY_TOPIC}.{run}"
        ensure_topics(self.kafka, [TopicSpec(topic, partitions=PARTITIONS)])
        t0 = time.monotonic()
        df = (
            self.spark.readStream.format("kafka")
            .options(**self.spark_kafka())
            .option("subscribe", INGRESS)
            .option("includeHeaders", "true")
            .option("startingOffsets", "earliest")
            .option("kafka.isolation.level", "read_committed")
            .option("maxOffsetsPerTrigger", str(self.args.max_offsets))
            .load()
        )
        q = (
            df.select("key", "value", "headers")
            .writeStream.format("kafka")
            .queryName(f"copy-{run}")
            .options(**self.spark_kafka())
            .option("topic", topic)
            .option("checkpointLocation", str(self.work / "checkpoints" / f"copy-{run}"))
            .trigger(availableNow=True)
            .start()
        )
        self.queries.append(q)
        if not q.awaitTermination(self.phase_timeout(n)):
            q.stop()
            raise RuntimeError(f"copy {run} did not finish in {self.phase_timeout(n):.0f} s")
        if q.exception() is not None:
            raise RuntimeError(f"copy {run} failed: {q.exception()}")
        wall = time.monotonic() - t0
        batches = sum(p["durationMs"].get("triggerExecution", 0) for p in q.recentProgress) / 1000
        copied = end_offsets(self.kafka, topic)
        out = {
            "records": copied,
            "wall_s": round(wall, 2),
            "batches": len(q.recentProgress),
            "batch_time_s": round(batches, 2),
            "records_per_s": round(copied / wall),
            "records_per_s_batches": round(copied / batches) if batches else None,
            "batch_ms": batch_ms(q),
        }
        say(f"copy {run}: {out}")
        return out

    def merge_phase(self, n: int, site: Any) -> dict[str, Any]:
        from spark_core.merge import Merger, start_merge

        merger = Merger(site, sites=self.cfg)
        self.mergers.append(merger)
        # its output topics exist before the clock starts, as the copy's does
        merger.prepare()
        merger.close()
        t0 = time.monotonic()
        q = start_merge(self.spark, merger, available_now=True)
        self.queries.append(q)
        t_started = time.monotonic()
        if not q.awaitTermination(self.phase_timeout(n)):
            q.stop()
            raise RuntimeError(f"merge did not finish in {self.phase_timeout(n):.0f} s")
        if q.exception() is not None:
            raise RuntimeError(f"merge failed: {q.exception()}")
        wall = time.monotonic() - t0
        merger.close()
        t = merger.totals
        batches = sum(p["durationMs"].get("triggerExecution", 0) for p in q.recentProgress) / 1000
        split = {"fetch": t.fetch_s, "plan": t.plan_s, "kafka_txn": t.txn_s}
        split = {k: round(v, 2) for k, v in split.items()}
        foreach = sum(split.values())
        out = {
            "input": t.input,
            "written": t.written,
            "customer": t.customer,
            "duplicates": t.duplicates,
            "dead": t.dead,
            "skipped": t.skipped,
            "batches": t.batches,
            "wall_s": round(wall, 2),
            "prepare_s": round(t_started - t0, 2),
            "batch_time_s": round(batches, 2),
            "records_per_s": round(t.input / wall),
            "records_per_s_batches": round(t.input / batches) if batches else None,
            "identities_written_per_s": round(t.written / wall),
            "driver_split_s": split,
            "driver_split_share": {k: round(v / foreach, 3) for k, v in split.items()}
            if foreach
            else {},
            "spark_outside_foreach_batch_s": round(batches - foreach, 2),
            "batch_ms": batch_ms(q),
        }
        say(f"merge: {out}")
        self.result["state"] = self.state_size(merger)
        return out

    def state_size(self, merger: Any) -> dict[str, Any]:
        entries: dict[bytes, int] = {}
        for msg in read_to_end(self.kafka, [LEDGER_TOPIC], timeout=60):
            if msg.value() is not None:
                entries[msg.key()] = len(msg.key()) + len(msg.value())
        status = merger.status_path
        st = json.loads(status.read_text())
        return {
            "sources": len(merger.state.held),
            "ranges": merger.state.ranges(),
            "status_file_ranges": st.get("state_ranges"),
            "status_file_bytes": status.stat().st_size,
            "ledger_entries": len(entries),
            "ledger_bytes_latest": sum(entries.values()),
            "ledger_records_total": end_offsets(self.kafka, LEDGER_TOPIC),
        }

    def latency_phase(self, site: Any) -> None:
        from spark_core.merge import Merger, start_merge

        a = self.args
        merger = Merger(site, sites=self.cfg)
        self.mergers.append(merger)
        q = start_merge(self.spark, merger, available_now=False)
        self.queries.append(q)
        # running once a batch (even an empty one) has gone through
        deadline = time.monotonic() + 120
        while q.lastProgress is None and time.monotonic() < deadline:
            if not q.isActive:
                raise RuntimeError(f"continuous merge died: {q.exception()}")
            time.sleep(0.2)
        if q.lastProgress is None:
            raise RuntimeError("continuous merge made no progress in 120 s")
        with PartitionReader(self.kafka, group="bench-ends") as reader:
            offsets = {
                str(p): reader.watermarks(CANONICAL, p, timeout=10)[1]
                for p in reader.partitions([CANONICAL], timeout=10)[CANONICAL]
            }
        n = int(a.steady_rate * a.steady_seconds)
        timeout = a.steady_seconds + 90
        cons = self.helper("consumer", offsets=offsets, expect=n, timeout=timeout)
        self.wait_file(Path(cons.result + ".ready"), 60)
        time.sleep(1.0)  # assignment + first fetch
        batches_before = merger.totals.batches
        prod = self.helper(
            "producer", rate=a.steady_rate, seconds=a.steady_seconds, origins=a.origins
        )
        say(f"steady: {n} records at {a.steady_rate:.0f}/s")
        p_res = prod.wait(a.steady_seconds + 60)
        c_res = cons.wait(timeout + 10)
        batches = merger.totals.batches - batches_before
        recv, append = c_res["receive_ms"], c_res["append_ms"]
        self.result["latency"] = {
            "rate": a.steady_rate,
            "seconds": a.steady_seconds,
            "trigger": a.trigger,
            "produced": p_res["sent"],
            "producer_seconds": round(p_res["seconds"], 2),
            "received": c_res["seen"],
            "merge_batches": batches,
            "receive_minus_produce_ms": {
                "p50": pct(recv, 0.5),
                "p99": pct(recv, 0.99),
                "max": pct(recv, 1.0),
                "mean": round(statistics.fmean(recv), 1) if recv else None,
            },
            "canonical_createtime_minus_produce_ms": {
                "p50": pct(append, 0.5),
                "p99": pct(append, 0.99),
                "max": pct(append, 1.0),
            },
        }
        say(f"latency: {self.result['latency']}")
        # stop between batches, like the supervisor does
        merger.stopping.set()
        if merger.busy.acquire(timeout=60):
            merger.busy.release()
        q.stop()
        merger.close()

    def audit(self, expected: dict[tuple[str, str], int]) -> None:
        t0 = time.monotonic()
        sources, malformed = audit_site(self.kafka, [STREAM], timeout=600)
        got = {(s.origin, s.stream): s for s in sources}
        missing = sum(
            max(0, hi - (got[src].identities if src in got else 0)) for src, hi in expected.items()
        )
        dup = sum(s.duplicates for s in sources)
        gaps = sum(s.gaps.count() for s in sources)
        extra = sorted(f"{o}/{s}" for o, s in got if (o, s) not in expected)
        wrong_max = sorted(
            f"{o}/{s}"
            for (o, s), a in got.items()
            if (o, s) in expected and a.held.last != expected[(o, s)]
        )
        identities = sum(s.identities for s in sources)
        self.result["audit"] = {
            "identities": identities,
            "expected_identities": sum(expected.values()),
            "duplicates": dup,
            "gaps": gaps,
            "missing": missing,
            "malformed": malformed,
            "unexpected_sources": extra + wrong_max,
            "seconds": round(time.monotonic() - t0, 1),
        }
        self.result["exactly_once"] = (
            dup == 0
            and gaps == 0
            and missing == 0
            and malformed == 0
            and not extra
            and not wrong_max
            and identities == sum(expected.values())
        )
        say(f"audit: {self.result['audit']}")

    # helpers
    def helper(self, role: str, **spec: Any) -> Any:
        auth = self.kafka.auth
        if auth.username:
            spec["auth"] = {
                "username": auth.username,
                "password": auth.password.value,
                "ca_file": str(auth.ca_file),
            }
        return Helper.start(role, self.work, bootstrap=self.bootstrap, procs=self.procs, **spec)

    @staticmethod
    def wait_file(path: Path, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not path.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{path.name} not written in {timeout:.0f} s")
            time.sleep(0.1)

    def phase_timeout(self, n: int) -> float:
        return 120 + n / 1000  # below 1000 records/s the run is broken, not slow

    def run(self) -> dict[str, Any]:
        a = self.args
        t_begin = time.monotonic()
        self.result.update(
            {
                "records": a.records,
                "origins": a.origins,
                "partitions": PARTITIONS,
                "max_offsets_per_trigger": a.max_offsets,
                "cpus": os.cpu_count(),
                "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
            }
        )
        self.start_broker()
        ensure_topics(self.kafka, [TopicSpec(INGRESS, partitions=PARTITIONS)])
        expected, dups = fill_ingress(self.kafka, a.records, a.origins, a.chunk, a.seed)
        self.result["duplicates_in_ingress"] = dups
        self.result["duplicate_share"] = round(dups / a.records, 4)
        self.result["ingress_records"] = end_offsets(self.kafka, INGRESS)
        self.result["payload_bytes"] = len(make_record("ship-00", 123456, 0)[1])
        say("starting spark")
        t0 = time.monotonic()
        self.start_spark()
        self.result["spark_start_s"] = round(time.monotonic() - t0, 1)
        site = self.site_config()
        self.result["warm_up_s"] = self.warm_up()
        copy1 = self.copy_phase(a.records, 1)
        merge = self.merge_phase(a.records, site)
        copy2 = self.copy_phase(a.records, 2)
        ref = max(copy1["records_per_s"], copy2["records_per_s"])
        ref_b = max(copy1["records_per_s_batches"] or 0, copy2["records_per_s_batches"] or 0)
        self.result["copy"] = {"before_merge": copy1, "after_merge": copy2}
        self.result["merge"] = merge
        self.result["ratio"] = round(merge["records_per_s"] / ref, 3)
        self.result["ratio_batch_time"] = (
            round(merge["records_per_s_batches"] / ref_b, 3) if ref_b else None
        )
        self.result["goal_ratio"] = GOALS["ratio"]
        if a.steady_seconds > 0:
            self.latency_phase(site)
            n = int(a.steady_rate * a.steady_seconds)
            per = n // a.origins
            for i in range(a.origins):
                cnt = per + (1 if i < n % a.origins else 0)
                if cnt:
                    expected[(ship_name(i, "steady"), STREAM)] = cnt
        self.audit(expected)
        self.result["goals_met"] = {"ratio": self.result["ratio"] >= GOALS["ratio"]}
        self.result["elapsed_s"] = round(time.monotonic() - t_begin, 1)
        self.result["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
        return self.result


class Helper:
    """The bench script itself in a helper role, as a process of its own."""

    def __init__(self, proc: Proc, result: str) -> None:
        self.proc = proc
        self.result = result

    @classmethod
    def start(cls, role: str, work: Path, *, procs: list[Proc], **spec: Any) -> Helper:
        result = str(work / f"{role}.result.json")
        spec["result"] = result
        argv = [sys.executable, str(Path(__file__).resolve()), "--role", role]
        argv += ["--spec", json.dumps(spec)]
        proc = Proc.start(f"bench-{role}", argv, work / "logs" / f"{role}.log", cwd=REPO)
        procs.append(proc)
        return cls(proc, result)

    def wait(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        path = Path(self.result)
        while not path.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.proc.name}: no result in {timeout:.0f} s")
            if not self.proc.alive() and not path.exists():
                raise RuntimeError(f"{self.proc.name} exited:\n{self.proc.tail(20)}")
            time.sleep(0.2)
        return json.loads(path.read_text())


class SideBySide:
    """``--security both``: the whole benchmark on a plain broker, then on one as a
    site runs in production (SASL/SCRAM over TLS, ACLs; the merge as the site
    application's principal); ``tls_sasl``: each figure secure / plain."""

    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.runs = {m: Bench(args, work / m, secure=m == "secure") for m in ("plain", "secure")}
        for m in self.runs:
            (work / m).mkdir(parents=True, exist_ok=True)

    @property
    def procs(self) -> list[Proc]:
        return [p for b in self.runs.values() for p in b.procs]

    def cleanup(self) -> None:
        for b in self.runs.values():
            b.cleanup()

    def run(self) -> dict[str, Any]:
        out: dict[str, Any] = {"benchmark": "merge"}
        for mode, bench in self.runs.items():
            say(f"=== {mode} broker")
            out[mode] = bench.run()
            bench.cleanup()  # the next run gets the machine (and a fresh Spark) to itself
        plain, secure = out["plain"], out["secure"]

        def rate(r: dict[str, Any], what: str) -> float:
            if what == "merge":
                return float(r["merge"]["records_per_s"])
            return float(max(c["records_per_s"] for c in r["copy"].values()))

        out["tls_sasl"] = {
            f"{what}_records_s": {
                "plain": round(rate(plain, what)),
                "secure": round(rate(secure, what)),
                "secure_over_plain": round(rate(secure, what) / rate(plain, what), 3),
            }
            for what in ("merge", "copy")
        }
        return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = bench_parser("bench/merge.py", __doc__)
    add_run_options(p, "small sizes: 100k records, 10 s steady", "Kafka data, logs, checkpoints")
    p.add_argument(
        "--records",
        type=int,
        default=None,
        help="records in ingress (20%% duplicates); default 1000000, quick 100000",
    )
    p.add_argument("--origins", type=int, default=8, help="ships (origins), default 8")
    p.add_argument("--chunk", type=int, default=500, help="records per upload chunk, default 500")
    p.add_argument(
        "--max-offsets",
        type=int,
        default=100_000,
        help="max_offsets_per_trigger of the merge and the copy (default 100000)",
    )
    p.add_argument(
        "--trigger",
        default="500ms",
        help="trigger_interval of the continuous merge in the latency phase (default 500ms)",
    )
    p.add_argument(
        "--steady-rate", type=float, default=5000.0, help="records/s of the latency phase"
    )
    p.add_argument(
        "--steady-seconds",
        type=float,
        default=None,
        help="length of the latency phase (0 skips it); default 30, quick 10",
    )
    p.add_argument("--seed", type=int, default=5, help="seed of the duplicate choice")
    p.add_argument(
        "--customers",
        action="store_true",
        help="a customer owns every container: each record also goes to its customer "
        "stream in the merge's transaction (the cost of customer streams, worst case)",
    )
    p.add_argument(
        "--security",
        choices=("plain", "secure", "both"),
        default="plain",
        help="a plain broker, one with SASL/SCRAM over TLS and ACLs (the merge as the site "
        "application's principal), or both side by side (tls_sasl: the cost)",
    )
    p.add_argument("--role", choices=("producer", "consumer"), help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    fill_defaults(a, {"records": (100_000, 1_000_000), "steady_seconds": (10.0, 30.0)})
    require_at_least_one(p, a, "records", "origins", "chunk", "max_offsets")
    if a.steady_rate <= 0 or a.steady_seconds < 0:
        p.error("--steady-rate must be positive and --steady-seconds not negative")
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.role:
        spec = json.loads(args.spec)
        run_steady_producer(spec) if args.role == "producer" else run_consumer(spec)
        return 0

    # the JVM (Ivy's ":: loading settings ::") writes to the stdout it inherits: point
    # fd 1 at stderr for the run and keep the real stdout for the one JSON object
    out = os.fdopen(os.dup(1), "w")
    sys.stdout.flush()
    os.dup2(2, 1)

    def make(work: Path) -> Bench | SideBySide:
        if args.security == "both":
            return SideBySide(args, work)
        return Bench(args, work, secure=args.security == "secure")

    return run_bench(say, args.keep, "bench-merge-", make, out=out)


if __name__ == "__main__":
    sys.exit(main())
