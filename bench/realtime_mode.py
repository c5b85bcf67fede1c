"""Benchmark: Spark's Real-time Mode (RTM, Spark 4.1+) beside a micro-batch trigger, on a
stateless Kafka->Kafka pass of the record contract: could the merge run on executors?

The merge (spark_core/merge.py) runs in the driver: Spark hands each micro-batch over as
Arrow (``foreachBatch``), Python deduplicates it against the ledger and writes records,
ledger, marker and relay topics in ONE Kafka transaction. RTM runs a query's tasks
continuously on the executors (records processed as they come, no batch to wait for),
for stateless queries. This measures what RTM gives and what it refuses, against the
trigger the site uses today, on a private single-node Kafka (``local_stack.kafka``) and a
local-mode SparkSession in this process (like bench/merge.py):

0. fill ``sl.ingress.containers`` (``--partitions``) with N records in the record
   contract, 20% of them a retried upload (bench/merge.py's ``fill_ingress``);
1. throughput: the same query in each mode (RTM ``trigger(realTime=...)``, update mode;
   micro-batch ``processingTime``): Kafka rows (``includeHeaders``, read_committed)
   filtered by the contract's vouching predicate (``spark_core.contract_sql.VOUCHED``,
   what the merge's executors check today) and written with their headers to another
   topic; records/s from the first record out to the last (and from the start); then
   ``rtm_python``, the same in RTM into a Python ``foreach`` writer that only counts
   (what Python on the executors costs a row); then ``puller``, the project's own path:
   the site's merge (``spark_core.merge.Merger``, configured as bench/merge.py does)
   fed by its ingest puller (spark_core/ingest_pull.py: confluent-kafka in the driver,
   no Spark batch) over the same ingress, round after round, each one transaction:
   records/s and where its time went (read / plan / kafka_txn). Run it under
   ``taskset -c 1`` for one core's figure;
2. latency: each mode reading from ``latest`` into ``sl.containers`` while bench/merge.py's
   helper processes run: a producer paced at ``--steady-rate`` for ``--steady-seconds``
   (``sl.ts`` = produce time) and a read_committed consumer: p50/p99 of (received -
   sl.ts) and of (CreateTime at the sink - sl.ts), the figures bench/merge.py prints for
   the merge at the same rate; ``puller`` first, the ingest puller on its own thread as
   the site runs it (writing exactly once, the others copying);
3. what RTM accepts: one query per feature, each started in RTM over a small topic, and
   its outcome (``accepted``: records came out; ``refused``: the exception, its first
   lines verbatim): the Kafka sink plain, in append mode, with a ``transactional.id``,
   idempotent; dropDuplicates (without and with a watermark),
   dropDuplicatesWithinWatermark, foreachBatch, a Python UDF, a pandas UDF, a Python
   ``foreach`` writer; and more source partitions than task slots.

RTM needs a task slot for every source partition at once (its tasks run for the whole
batch duration): the session is ``local[--slots]``, by default the partition count.

    .venv/bin/python bench/realtime_mode.py --quick     # 100k records, 10 s steady, ~4-6 minutes
    .venv/bin/python bench/realtime_mode.py             # 500k records, 30 s steady

Progress goes to stderr; one JSON object goes to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import merge
from _common import (
    add_run_options,
    bench_parser,
    fill_defaults,
    progress,
    require_at_least_one,
    run_bench,
)
from merge import (
    CANONICAL,
    INGRESS,
    PARTITIONS,
    Helper,
    end_offsets,
    fill_ingress,
    make_record,
    pct,
    ship_name,
)

from local_stack.kafka import KafkaBroker, start_kafka
from local_stack.process import Proc, stop_procs
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.reading import PartitionReader
from shorelink.kafka.topics import TopicSpec, ensure_topics, producer

SITE = "benchport"
PROBE_IN = "bench.rtm.probe.in"
PROBE_RECORDS = 200
#: how long a probe may take to show records or fail (RTM's first batch included)
PROBE_TIMEOUT_S = 60.0
#: RTM's check of operators and sinks against its allowlist (true by default)
ALLOWLIST_CHECK = "spark.sql.streaming.realTimeMode.allowlistCheck"

say = progress("realtime_mode")


def _first_lines(exc: BaseException, n: int = 4) -> str:
    """An exception's message as Spark wrote it: its first lines, the JVM's stack cut."""
    text = str(exc).strip()
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("\tat ")]
    return "\n".join(lines[:n])[:1200]


class CountingWriter:
    """A Python ``foreach`` writer (row at a time, in the executors' Python workers)
    that only counts: each task's count in a file of its own under ``into`` (local
    mode: the executors share this machine), every ``every`` rows and at close."""

    def __init__(self, into: str, every: int = 1) -> None:
        self.into = into
        self.every = every

    def open(self, partition_id: int, epoch_id: int) -> bool:
        self.path = Path(self.into) / f"{partition_id}.{epoch_id}"
        self.n = 0
        return True

    def process(self, row: Any) -> None:
        self.n += 1
        if self.n % self.every == 0:
            self.path.write_text(str(self.n))

    def close(self, error: Any) -> None:
        self.path.write_text(str(self.n))


def counted(into: Path) -> int:
    """Rows the :class:`CountingWriter` tasks under ``into`` saw."""
    return sum(int(f.read_text() or 0) for f in into.iterdir() if f.is_file())


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.procs: list[Proc] = []
        self.broker: KafkaBroker | None = None
        self.spark: Any = None
        self.queries: list[Any] = []
        self._merger: Any = None
        self._puller: Any = None
        self.result: dict[str, Any] = {"benchmark": "realtime_mode"}

    @property
    def kafka(self) -> KafkaEndpoint:
        assert self.broker is not None
        return self.broker.endpoint

    def cleanup(self) -> None:
        if self._merger is not None:
            with contextlib.suppress(Exception):
                self._merger.close()
        for q in self.queries:
            with contextlib.suppress(Exception):
                if q.isActive:
                    q.stop()
        if self.spark is not None:
            with contextlib.suppress(Exception):
                self.spark.stop()
        stop_procs([p for p in self.procs if p.alive()], grace=10)

    # -- set-up --------------------------------------------------------------------------
    def start_broker(self) -> None:
        self.broker = start_kafka(SITE, self.work / "kafka", self.work / "logs", heap="1g")
        self.procs.append(self.broker.proc)
        say(f"kafka on {self.broker.bootstrap}")

    def start_spark(self) -> None:
        from spark_core.session import local_session

        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        self.spark = local_session(
            "shorelink-bench-realtime-mode",
            f"local[{self.args.slots}]",
            conf={
                "spark.ui.enabled": "false",
                "spark.ui.showConsoleProgress": "false",
                "spark.sql.shuffle.partitions": "2",
                "spark.sql.warehouse.dir": str(self.work / "warehouse"),
                "spark.driver.memory": "2g",
            },
        )

    def source(self, topic: str, starting: str = "earliest", **options: str) -> Any:
        """Kafka rows as the merge reads them: headers included, read_committed."""
        reader = (
            self.spark.readStream.format("kafka")
            .options(**self.kafka.spark_options())
            .option("subscribe", topic)
            .option("includeHeaders", "true")
            .option("startingOffsets", starting)
            .option("kafka.isolation.level", "read_committed")
        )
        for k, v in options.items():
            reader = reader.option(k, v)
        return reader.load()

    def contract_pass(self, df: Any) -> Any:
        """The stateless part of the merge: the rows the contract vouches for, as they
        came (key, value, headers)."""
        from spark_core.contract_sql import VOUCHED

        return df.where(VOUCHED).select("key", "value", "headers")

    def start(self, df: Any, mode: str, name: str, topic: str, **sink: str) -> Any:
        """``df`` to Kafka ``topic`` in ``mode`` (``rtm``, ``microbatch``), or to a
        Python ``foreach`` writer that counts into the directory ``topic``
        (``rtm_python``: what Python code on the executors costs per row in RTM)."""
        if mode == "rtm_python":
            w = df.writeStream.foreach(CountingWriter(topic, every=1000)).queryName(name)
            w = w.option("checkpointLocation", str(self.work / "checkpoints" / name))
        else:
            w = (
                df.writeStream.format("kafka")
                .queryName(name)
                .options(**self.kafka.spark_options())
                .option("topic", topic)
                .option("checkpointLocation", str(self.work / "checkpoints" / name))
            )
        for k, v in sink.items():
            w = w.option(k, v)
        if mode.startswith("rtm"):
            w = w.outputMode("update").trigger(realTime=self.args.rtm_batch)
        else:
            w = w.trigger(processingTime=self.args.trigger)
        q = w.start()
        self.queries.append(q)
        return q

    def stop(self, q: Any) -> None:
        with contextlib.suppress(Exception):
            q.stop()

    # -- 1. throughput -------------------------------------------------------------------
    def throughput(self, mode: str, n: int) -> dict[str, Any]:
        topic = f"bench.rtm.out.{mode}"
        into = self.work / f"thr-{mode}"  # rtm_python's counts
        if mode == "rtm_python":
            into.mkdir(exist_ok=True)
            topic = str(into)
        else:
            ensure_topics(self.kafka, [TopicSpec(topic, partitions=self.args.partitions)])
        opts = {} if mode != "microbatch" else {"maxOffsetsPerTrigger": str(self.args.max_offsets)}
        t0 = time.monotonic()
        q = self.start(self.contract_pass(self.source(INGRESS, **opts)), mode, f"thr-{mode}", topic)
        first = None
        out = 0
        deadline = t0 + 120 + n / 1000
        while out < n:
            if not q.isActive:
                raise RuntimeError(f"{mode} copy died: {_first_lines(q.exception())}")
            if time.monotonic() > deadline:
                self.stop(q)
                raise RuntimeError(f"{mode} copy: {out}/{n} records in {deadline - t0:.0f} s")
            time.sleep(0.2)
            out = counted(into) if mode == "rtm_python" else end_offsets(self.kafka, topic)
            if out and first is None:
                first = time.monotonic()
        done = time.monotonic()
        self.stop(q)
        assert first is not None
        res = {
            "records": out,
            "wall_s": round(done - t0, 2),
            "first_record_out_s": round(first - t0, 2),
            "records_per_s": round(out / (done - t0)),
            "records_per_s_after_first": round(out / max(done - first, 0.2)),
        }
        say(f"throughput {mode}: {res}")
        return res

    # -- 2. latency ----------------------------------------------------------------------
    def helper(self, role: str, **spec: Any) -> Helper:
        assert self.broker is not None
        return Helper.start(
            role, self.work, bootstrap=self.broker.bootstrap, procs=self.procs, **spec
        )

    def latency(self, mode: str, round_: int) -> dict[str, Any]:
        q = self.start(
            self.contract_pass(self.source(INGRESS, starting="latest")),
            mode,
            f"lat-{mode}-{round_}",
            CANONICAL,
        )
        # running: a progress report (micro-batch) or a few seconds into its first
        # long-running batch (RTM reports at the end of each batch)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and q.lastProgress is None:
            if not q.isActive:
                raise RuntimeError(f"{mode} query died: {_first_lines(q.exception())}")
            time.sleep(0.2)
            if mode == "rtm" and time.monotonic() > deadline - 50:
                break
        try:
            return self.paced(mode)
        finally:
            self.stop(q)

    def paced(self, mode: str) -> dict[str, Any]:
        """bench/merge.py's paced producer into ingress and its consumer of
        ``sl.containers`` while ``mode``'s writer runs: latencies."""
        a = self.args
        with PartitionReader(self.kafka, group="bench-ends") as reader:
            offsets = {
                str(p): reader.watermarks(CANONICAL, p, timeout=10)[1]
                for p in reader.partitions([CANONICAL], timeout=10)[CANONICAL]
            }
        n = int(a.steady_rate * a.steady_seconds)
        timeout = a.steady_seconds + 90
        cons = self.helper("consumer", offsets=offsets, expect=n, timeout=timeout)
        deadline = time.monotonic() + 60
        while not Path(cons.result + ".ready").exists():
            if time.monotonic() > deadline:
                raise RuntimeError("latency consumer not ready in 60 s")
            time.sleep(0.1)
        time.sleep(1.0)  # assignment + first fetch
        prod = self.helper("producer", rate=a.steady_rate, seconds=a.steady_seconds, origins=8)
        say(f"latency {mode}: {n} records at {a.steady_rate:.0f}/s")
        p_res = prod.wait(a.steady_seconds + 60)
        c_res = cons.wait(timeout + 10)
        for f in (cons.result, prod.result, cons.result + ".ready"):
            Path(f).unlink(missing_ok=True)
        recv, append = c_res["receive_ms"], c_res["append_ms"]
        res = {
            "rate": a.steady_rate,
            "seconds": a.steady_seconds,
            "produced": p_res["sent"],
            "received": c_res["seen"],
            "receive_minus_produce_ms": {
                "p50": pct(recv, 0.5),
                "p99": pct(recv, 0.99),
                "max": pct(recv, 1.0),
                "mean": round(statistics.fmean(recv), 1) if recv else None,
            },
            "sink_createtime_minus_produce_ms": {
                "p50": pct(append, 0.5),
                "p99": pct(append, 0.99),
                "max": pct(append, 1.0),
            },
        }
        say(f"latency {mode}: {res}")
        return res

    # -- the project's own path: the merge fed by its ingest puller ------------------------
    def merger(self) -> Any:
        """The site's merge (spark_core/merge.py) of ``sl.containers``, configured as
        bench/merge.py configures it, with its ingest puller (spark_core/ingest_pull.py):
        Python in the driver, no Spark batch."""
        from spark_core.ingest_pull import IngestPuller
        from spark_core.merge import Merger

        if self._merger is None:
            ns = argparse.Namespace(
                trigger="500ms", max_offsets=self.args.max_offsets, customers=False
            )
            mb = merge.Bench(ns, self.work)
            mb.broker = self.broker
            site = mb.site_config()
            self._merger = Merger(site, sites=mb.cfg)
            self._merger.ingest_puller = True
            self._merger.prepare()
            self._puller = IngestPuller.of(self._merger)
        return self._merger, self._puller

    def puller_throughput(self) -> dict[str, Any]:
        """The merge's ingest puller over the filled ingress topic, round after round
        until it has read it all (each round one transaction: records, ledger, marker)."""
        merger, puller = self.merger()
        with PartitionReader(self.kafka, group="bench-ends") as reader:
            ends = {
                (INGRESS, p): reader.watermarks(INGRESS, p, timeout=10)[1]
                for p in reader.partitions([INGRESS], timeout=10)[INGRESS]
            }
        n = sum(ends.values())
        t0 = time.monotonic()
        deadline = t0 + 120 + n / 1000
        rounds = 0
        while not puller.reached(ends):
            if time.monotonic() > deadline:
                raise RuntimeError(f"ingest puller: {merger.totals.input}/{n} in time")
            if puller.round():
                rounds += 1
        wall = time.monotonic() - t0
        t = merger.totals
        res = {
            "records": t.input,
            "written": t.written,
            "duplicates": t.duplicates,
            "rounds": rounds,
            "wall_s": round(wall, 2),
            "records_per_s": round(t.input / wall),
            "identities_written_per_s": round(t.written / wall),
            "driver_split_s": {
                "read": round(wall - t.plan_s - t.txn_s, 2),
                "plan": round(t.plan_s, 2),
                "kafka_txn": round(t.txn_s, 2),
            },
        }
        say(f"throughput puller: {res}")
        return res

    def puller_latency(self) -> dict[str, Any]:
        """The ingest puller running on its own thread (as the site runs it) while the
        paced producer writes new identities."""
        merger, puller = self.merger()
        stop = threading.Event()
        thread = threading.Thread(target=puller.run, args=(stop,), daemon=True)
        thread.start()
        try:
            return self.paced("puller")
        finally:
            stop.set()
            thread.join(60)
            merger.close()

    # -- 3. what RTM accepts ---------------------------------------------------------------
    def fill_probe_topic(self) -> None:
        ensure_topics(self.kafka, [TopicSpec(PROBE_IN, partitions=self.args.partitions)])
        many = f"{PROBE_IN}.wide"
        ensure_topics(self.kafka, [TopicSpec(many, partitions=self.args.slots * 2)])
        p = producer(self.kafka, {"linger.ms": 5})
        ts = int(time.time() * 1000)
        for seq in range(1, PROBE_RECORDS + 1):
            key, value, headers = make_record(ship_name(seq % 4), seq, ts)
            # PROBE_IN has every record twice (a retried upload): what dedup would drop
            for topic in (PROBE_IN, PROBE_IN, many, INGRESS):  # INGRESS: the contract's topic
                p.produce(topic, value=value, key=key, headers=headers)
        if p.flush(30):
            raise RuntimeError("probe records not delivered")

    def probes(self) -> dict[str, Any]:
        from pyspark.sql.functions import col, length, udf

        from spark_core.contract_sql import read_contract

        self.fill_probe_topic()
        out: dict[str, Any] = {}
        rtm = self.args.rtm_batch

        def identity(df: Any) -> Any:
            return read_contract(df, "key", "value", "timestamp")

        def to_kafka(name: str, df: Any, *, update: bool = True, **sink: str) -> Any:
            topic = f"bench.rtm.probe.{name}"
            ensure_topics(self.kafka, [TopicSpec(topic, partitions=1)])
            w = (
                df.writeStream.format("kafka")
                .queryName(f"probe-{name}")
                .options(**self.kafka.spark_options())
                .option("topic", topic)
                .option("checkpointLocation", str(self.work / "checkpoints" / f"probe-{name}"))
            )
            for k, v in sink.items():
                w = w.option(k, v)
            if update:
                w = w.outputMode("update")
            return w.trigger(realTime=rtm).start(), lambda: end_offsets(self.kafka, topic)

        def plain(name: str, **sink: str) -> Any:
            return to_kafka(name, self.source(PROBE_IN).select("key", "value", "headers"), **sink)

        calls: list[int] = []

        def each_batch(df: Any, batch_id: int) -> None:
            calls.append(df.count())

        counts = self.work / "foreach-counts"
        counts.mkdir(exist_ok=True)

        @udf("int")
        def py_len(b: Any) -> int:
            return len(b or b"")

        def started_foreach_batch() -> Any:
            q = (
                self.source(PROBE_IN)
                .writeStream.queryName("probe-foreach-batch")
                .foreachBatch(each_batch)
                .option("checkpointLocation", str(self.work / "checkpoints" / "probe-fb"))
                .outputMode("update")
                .trigger(realTime=rtm)
                .start()
            )
            return q, lambda: sum(calls)

        def started_foreach() -> Any:
            q = (
                self.source(PROBE_IN)
                .writeStream.queryName("probe-foreach")
                .foreach(CountingWriter(str(counts)))
                .option("checkpointLocation", str(self.work / "checkpoints" / "probe-fe"))
                .outputMode("update")
                .trigger(realTime=rtm)
                .start()
            )
            return q, lambda: counted(counts)

        def pandas_len() -> Any:
            from pyspark.sql.functions import pandas_udf

            @pandas_udf("long")  # needs pandas and pyarrow: refused at start without
            def pd_len(s: Any) -> Any:
                return s.str.len()

            return pd_len

        def unchecked(make: Any) -> Any:
            """``make`` started with RTM's allowlist check off ("at your own risk"): does
            the engine run it anyway? (The query reads the setting when it plans its
            first batch: :meth:`probe` puts it back once the query stopped.)"""
            self.spark.conf.set(ALLOWLIST_CHECK, "false")
            return make()

        def udf_pass(f: Any, name: str) -> Any:
            df = self.source(PROBE_IN).select(
                "key", f(col("value")).cast("string").cast("binary").alias("value"), "headers"
            )
            return to_kafka(name, df)

        dedup_cols = ["origin", "stream", "seq"]
        probes: dict[str, Any] = {
            "kafka_sink": lambda: plain("kafka-sink"),
            "kafka_sink_append_mode": lambda: to_kafka(
                "append",
                self.source(PROBE_IN).select("key", "value", "headers"),
                update=False,
            ),
            "kafka_sink_transactional_id": lambda: plain(
                "txn", **{"kafka.transactional.id": "bench-rtm-probe"}
            ),
            "kafka_sink_idempotent": lambda: plain(
                "idem", **{"kafka.enable.idempotence": "true", "kafka.acks": "all"}
            ),
            "contract_filter": lambda: to_kafka("vouch", self.contract_pass(self.source(INGRESS))),
            "drop_duplicates": lambda: to_kafka(
                "dedup",
                identity(self.source(PROBE_IN)).dropDuplicates(dedup_cols).select("key", "value"),
            ),
            "drop_duplicates_watermark": lambda: to_kafka(
                "dedup-wm",
                identity(self.source(PROBE_IN))
                .withWatermark("timestamp", "10 minutes")
                .dropDuplicates([*dedup_cols, "timestamp"])
                .select("key", "value"),
            ),
            "drop_duplicates_within_watermark": lambda: to_kafka(
                "dedup-within",
                identity(self.source(PROBE_IN))
                .withWatermark("timestamp", "10 minutes")
                .dropDuplicatesWithinWatermark(dedup_cols)
                .select("key", "value"),
            ),
            "foreach_batch": started_foreach_batch,
            "python_foreach_writer": started_foreach,
            "python_udf": lambda: udf_pass(py_len, "udf"),
            "pandas_udf": lambda: udf_pass(pandas_len(), "pandas-udf"),
            "sql_only_length": lambda: to_kafka(
                "sql",
                self.source(PROBE_IN).select(
                    "key", length(col("value")).cast("string").cast("binary").alias("value")
                ),
            ),
            f"partitions_{self.args.slots * 2}_over_{self.args.slots}_slots": lambda: to_kafka(
                "wide",
                self.source(f"{PROBE_IN}.wide").select("key", "value", "headers"),
            ),
            "drop_duplicates_allowlist_off": lambda: unchecked(
                lambda: to_kafka(
                    "dedup-off",
                    identity(self.source(PROBE_IN))
                    .dropDuplicates(dedup_cols)
                    .select("key", "value"),
                )
            ),
            "foreach_batch_allowlist_off": lambda: unchecked(started_foreach_batch),
            "python_udf_allowlist_off": lambda: unchecked(lambda: udf_pass(py_len, "udf-off")),
        }
        #: records each probe reads (PROBE_IN: every record twice) and the count a correct
        #: run writes (deduplicated: once each)
        once = {"contract_filter", f"partitions_{self.args.slots * 2}_over_{self.args.slots}_slots"}
        dedup = {n for n in probes if n.startswith("drop_duplicates")}
        for name, make in probes.items():
            if self.args.probes and name not in self.args.probes:
                continue
            n_in = PROBE_RECORDS if name in once else 2 * PROBE_RECORDS
            right = PROBE_RECORDS if name in dedup or name in once else n_in
            out[name] = self.probe(name, make, n_in, right)
        return out

    def probe(self, name: str, make: Any, n_in: int, right: int) -> dict[str, Any]:
        """Start one feature's query; ``accepted`` when ``right`` records came out of
        ``n_in`` (and no more a few seconds later), ``partial``/``wrong_count`` when
        not, ``refused`` with Spark's message."""
        t0 = time.monotonic()
        try:
            q, count = make()
        except Exception as exc:  # what Spark says is the figure
            # a Python package the feature needs (pandas) missing here is not RTM's answer
            outcome = "not_run" if "PACKAGE_NOT_INSTALLED" in str(exc) else "refused"
            res = {"outcome": outcome, "at": "start", "error": _first_lines(exc)}
            self.spark.conf.unset(ALLOWLIST_CHECK)
            say(f"probe {name}: {res}")
            return res
        self.queries.append(q)
        res: dict[str, Any] = {}
        deadline = t0 + PROBE_TIMEOUT_S
        while time.monotonic() < deadline:
            exc = q.exception() if not q.isActive else None
            if exc is not None:
                res = {"outcome": "refused", "at": "run", "error": _first_lines(exc)}
                break
            if not q.isActive:
                res = {"outcome": "stopped", "error": None}
                break
            if count() >= right:
                time.sleep(3.0)  # and no more after it
                break
            time.sleep(0.5)
        if not res:
            got = count()
            outcome = "accepted" if got == right else "partial" if got < right else "wrong_count"
            res = {"outcome": outcome if got else "no_output", "records_in": n_in}
            res.update({"records_out": got, "records_right": right})
        res["seconds"] = round(time.monotonic() - t0, 1)
        self.stop(q)
        self.spark.conf.unset(ALLOWLIST_CHECK)
        say(f"probe {name}: {res}")
        return res

    # -- the run ---------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        a = self.args
        t_begin = time.monotonic()
        import pyspark

        self.result.update(
            {
                "spark": pyspark.__version__,
                "records": a.records,
                "partitions": a.partitions,
                "master": f"local[{a.slots}]",
                "rtm_batch": a.rtm_batch,
                "microbatch_trigger": a.trigger,
                "cpus": os.cpu_count(),
                "affinity": sorted(os.sched_getaffinity(0)),
                "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
            }
        )
        self.start_broker()
        ensure_topics(
            self.kafka,
            [
                TopicSpec(INGRESS, partitions=a.partitions),
                TopicSpec(CANONICAL, partitions=PARTITIONS),  # as the merge makes it
            ],
        )
        say("starting spark")
        t0 = time.monotonic()
        self.start_spark()
        self.result["spark_start_s"] = round(time.monotonic() - t0, 1)
        if "probes" in a.phases:
            self.result["rtm_accepts"] = self.probes()
        if "throughput" in a.phases:
            fill_ingress(self.kafka, a.records, 8, 500, 5)
            n = end_offsets(self.kafka, INGRESS)
            spark_modes = [m for m in a.modes if m != "puller"]
            self.result["throughput"] = {m: self.throughput(m, n) for m in spark_modes}
            if "puller" in a.modes:  # last: the merge purges what it merged from ingress
                self.result["throughput"]["puller"] = self.puller_throughput()
        if "latency" in a.phases and a.steady_seconds > 0:
            lat: dict[str, Any] = {}
            if "puller" in a.modes:  # first: the stateless copies do not mind its seqs again
                lat["puller"] = self.puller_latency()
            for i, m in enumerate(a.modes):
                if m in ("rtm", "microbatch"):
                    lat[m] = self.latency(m, i)
            self.result["latency"] = lat
        self.result["elapsed_s"] = round(time.monotonic() - t_begin, 1)
        self.result["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
        return self.result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = bench_parser("bench/realtime_mode.py", __doc__)
    add_run_options(p, "small sizes: 100k records, 10 s steady", "Kafka data, logs, checkpoints")
    p.add_argument("--records", type=int, default=None, help="default 500000, quick 100000")
    p.add_argument("--partitions", type=int, default=2, help="partitions of the source (default 2)")
    p.add_argument(
        "--slots", type=int, default=None, help="local[N]: task slots (default: --partitions)"
    )
    p.add_argument(
        "--rtm-batch", default="5 seconds", help="RTM's batch duration (default '5 seconds')"
    )
    p.add_argument(
        "--trigger",
        default="500 milliseconds",
        help="the micro-batch trigger (default '500 milliseconds', the merge bench's)",
    )
    p.add_argument(
        "--max-offsets", type=int, default=100_000, help="micro-batch maxOffsetsPerTrigger"
    )
    p.add_argument("--steady-rate", type=float, default=5000.0, help="records/s, latency phase")
    p.add_argument("--steady-seconds", type=float, default=None, help="default 30, quick 10")
    p.add_argument(
        "--modes",
        default="rtm,microbatch,rtm_python,puller",
        help="modes to run, of rtm,microbatch,rtm_python,puller (all; rtm_python: "
        "throughput only; puller: the site's merge fed by its ingest puller)",
    )
    p.add_argument(
        "--phases",
        default="probes,throughput,latency",
        help="phases to run, of probes,throughput,latency (all)",
    )
    p.add_argument("--probes", default="", help="only these probes (comma-separated names)")
    a = p.parse_args(argv)
    fill_defaults(a, {"records": (100_000, 500_000), "steady_seconds": (10.0, 30.0)})
    if a.slots is None:
        a.slots = a.partitions
    require_at_least_one(p, a, "records", "partitions", "slots", "max_offsets")
    a.modes = [m for m in a.modes.split(",") if m]
    a.phases = [m for m in a.phases.split(",") if m]
    a.probes = [m for m in a.probes.split(",") if m]
    if not set(a.modes) <= {"rtm", "microbatch", "rtm_python", "puller"}:
        p.error("--modes takes rtm, microbatch, rtm_python and puller")
    if not set(a.phases) <= {"probes", "throughput", "latency"}:
        p.error("--phases takes probes, throughput and latency")
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # the JVM writes to the stdout it inherits: keep the real one for the JSON object
    out = os.fdopen(os.dup(1), "w")
    sys.stdout.flush()
    os.dup2(2, 1)
    return run_bench(say, args.keep, "bench-rtm-", lambda work: Bench(args, work), out=out)


if __name__ == "__main__":
    sys.exit(main())
