"""The merge: the only writer of a site's canonical topics ``sl.<stream>`` and ``sl.ledger``.

One streaming query reads ``sl.ingress.*`` and ``sl.inbox.*`` (read_committed, headers
included). Each micro-batch is collected on the driver (``maxOffsetsPerTrigger`` bounds
it), checked against the record contract, deduplicated on identity against the ranges
already written, and written in ONE Kafka transaction: the new records in seq order per
``(origin, stream)``, the malformed ones to ``sl.dead.<stream>``, the new ranges to
``sl.ledger`` and the batch marker to ``sl.merge.marker``. The dedup state is rebuilt from
the ledger (read_committed) at start-up and after any failed transaction, so a batch that
Spark replays after a crash finds its identities already written. docs/exactly-once.md
explains why that is exactly once.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import json
import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import KafkaError, KafkaException, Producer

from shorelink.contract import (
    H_MQTT_TOPIC,
    H_ORIGIN,
    H_SEQ,
    H_SITE,
    H_STREAM,
    H_TS,
    LEDGER_TOPIC,
    canonical_topic,
    dead_topic,
)
from shorelink.kafka_io import produce
from shorelink.ledger import encode_entry
from shorelink.topics import TopicSpec, ensure_topics
from spark_core.config import SiteConfig
from spark_core.merge_state import (
    DEAD_UNKNOWN_TOPIC,
    MARKER_TOPIC,
    Batch,
    BatchPlan,
    Headers,
    MergeError,
    MergeState,
    Out,
    RowBatch,
    SourceRow,
    marker_key,
    plan_batch,
    topic_stream,
)

__all__ = [
    "CONTRACT_LAYOUT",
    "DEAD_UNKNOWN_TOPIC",
    "ArrowBatch",
    "BatchPlan",
    "Merger",
    "SourceRow",
    "batch_frame",
    "plan_batch",
    "start_merge",
    "topic_stream",
]

log = logging.getLogger(__name__)


@dataclass
class Totals:
    batches: int = 0
    input: int = 0
    written: int = 0
    duplicates: int = 0
    dead: int = 0
    skipped: int = 0
    failures: int = 0
    #: where the driver's time went, in seconds: Spark computing the batch and handing
    #: it over as Arrow, the plan (dedup, order, fetching the rows written), the
    #: Kafka transaction
    fetch_s: float = 0.0
    plan_s: float = 0.0
    txn_s: float = 0.0


class Merger:
    """The driver-side half of the merge query: state, topics, the transactional
    producer, per-batch logic (``process_batch`` is the ``foreachBatch`` function)."""

    def __init__(self, site: SiteConfig, *, query: str = "merge") -> None:
        self.site = site
        self.query = query
        self.state = MergeState()
        self.totals = Totals()
        self.last: dict[str, object] = {}
        self.stopping = threading.Event()
        self.busy = threading.Lock()
        self._producer: Producer | None = None
        self._ensured: set[str] = set()

    @property
    def status_path(self) -> Path:
        return self.site.checkpoint_dir / f"{self.query}.status.json"

    # -- set-up -------------------------------------------------------------------------
    def prepare(self) -> None:
        """Create topics, fence any older merge of this site, load the state."""
        m = self.site.merge
        specs = [
            TopicSpec(LEDGER_TOPIC, partitions=1, compacted=True),
            TopicSpec(MARKER_TOPIC, partitions=1, compacted=True),
            TopicSpec(DEAD_UNKNOWN_TOPIC, retention_ms=m.dead_retention_ms),
        ]
        self._ensure([*specs, *self._stream_specs(self.site.streams)])  # one admin round
        self._close_producer()
        p = Producer(
            {
                "bootstrap.servers": self.site.kafka_bootstrap,
                "transactional.id": m.transactional_id,
                "transaction.timeout.ms": int(self.site.kafka_timeout_s * 2000),
                "linger.ms": 5,
                "compression.type": "lz4",
                # the Java clients' partitioner: same key, same partition, whoever writes
                "partitioner": "murmur2_random",
                "queue.buffering.max.messages": 1_000_000,
            }
        )
        try:
            # aborts whatever transaction a crashed predecessor left open, and fences it
            p.init_transactions(self.site.kafka_timeout_s)
        except KafkaException as exc:
            raise MergeError(f"cannot init transactions: {exc}") from exc
        self._producer = p
        self.state = MergeState.load(
            self.site.kafka_bootstrap, self.site.name, timeout=self.site.kafka_timeout_s * 2
        )
        log.info(
            "event=merge_ready site=%s sources=%d ranges=%d last_batch=%s",
            self.site.name,
            len(self.state.held),
            self.state.ranges(),
            self.state.last_batch,
        )
        self.write_status("running")

    def _ensure(self, specs: Sequence[TopicSpec]) -> None:
        todo = [s for s in specs if s.name not in self._ensured]
        if todo:
            ensure_topics(self.site.kafka_bootstrap, todo, timeout=self.site.kafka_timeout_s)
            self._ensured.update(s.name for s in todo)

    def _ensure_streams(self, streams: Iterable[str]) -> None:
        self._ensure(self._stream_specs(streams))

    def _stream_specs(self, streams: Iterable[str]) -> list[TopicSpec]:
        m = self.site.merge
        specs: list[TopicSpec] = []
        for s in streams:
            specs.append(
                TopicSpec(
                    canonical_topic(s),
                    partitions=m.canonical_partitions,
                    retention_ms=-1
                    if m.canonical_retention_ms is None
                    else m.canonical_retention_ms,
                )
            )
            specs.append(TopicSpec(dead_topic(s), retention_ms=m.dead_retention_ms))
        return specs

    # -- per batch ----------------------------------------------------------------------
    def process_batch(self, df: Any, batch_id: int) -> None:
        """``foreachBatch``: raise on any failure (Spark then replays the batch)."""
        with self.busy:
            if self.stopping.is_set():
                raise MergeError("merge is stopping; batch left for the next run")
            t0 = time.monotonic()
            # Arrow, not collect(): no Row objects; duplicates never leave Arrow buffers
            batch = ArrowBatch(batch_frame(df).toArrow())
            self.write_batch(batch_id, batch, t0=t0)

    def write_rows(self, batch_id: int, rows: Sequence[SourceRow]) -> BatchPlan:
        """``write_batch`` for rows already in Python (tests, tools)."""
        return self.write_batch(batch_id, RowBatch(rows))

    def write_batch(self, batch_id: int, batch: Batch, *, t0: float | None = None) -> BatchPlan:
        t1 = time.monotonic()
        t0 = t1 if t0 is None else t0
        if self._producer is None:
            self.prepare()  # after a failed transaction: new producer, state from Kafka
        replay = self.state.last_batch is not None and batch_id <= self.state.last_batch
        with _cyclic_gc_paused():
            plan = plan_batch(batch, self.state)
            self._ensure_streams(plan.streams)
            t2 = time.monotonic()
            if plan.canonical or plan.dead or plan.offsets:
                self._commit(batch_id, plan)
        t3 = time.monotonic()
        self.totals.fetch_s += t1 - t0
        self.totals.plan_s += t2 - t1
        self.totals.txn_s += t3 - t2
        self._account(batch_id, plan, t3 - t0, replay, (t1 - t0, t2 - t1, t3 - t2))
        return plan

    def _commit(self, batch_id: int, plan: BatchPlan) -> None:
        p = self._producer
        assert p is not None
        offsets = dict(self.state.offsets)
        offsets.update(plan.offsets)
        marker_state = MergeState(offsets=offsets)
        marker = marker_state.marker_value(
            self.site.name,
            batch_id,
            {
                "written": len(plan.canonical),
                "dead": len(plan.dead),
                "ts_ms": int(time.time() * 1000),
            },
        )
        try:
            p.begin_transaction()
            for topic, key, value, headers in plan.canonical:
                produce(p, topic, key, value, headers)
            for topic, key, value, headers in plan.dead:
                produce(p, topic, key, value, headers)
            for (origin, stream), held in plan.ledger.items():
                k, v = encode_entry(origin, stream, held)
                produce(p, LEDGER_TOPIC, k, v, None)
            produce(p, MARKER_TOPIC, marker_key(self.site.name, self.query), marker, None)
            p.commit_transaction(self.site.kafka_timeout_s * 2)
        except KafkaException as exc:
            self._fail(p, exc)
        # committed: the in-memory state follows what Kafka now holds
        self.state.held.update(plan.ledger)
        self.state.offsets = offsets
        self.state.last_batch = batch_id

    def _fail(self, p: Producer, exc: KafkaException) -> None:
        self.totals.failures += 1
        err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
        fatal = err is not None and err.fatal()
        if not fatal:
            # if this fails too, the next prepare() fences and aborts it anyway
            with contextlib.suppress(KafkaException):
                p.abort_transaction(self.site.kafka_timeout_s)
        # whatever happened, start the next batch from what Kafka committed
        self._close_producer()
        log.error(
            "event=merge_batch_failed site=%s fatal=%s error=%r", self.site.name, fatal, str(exc)
        )
        raise MergeError(f"merge transaction failed, aborted: {exc}", fatal=fatal) from exc

    def _account(
        self,
        batch_id: int,
        plan: BatchPlan,
        dt: float,
        replay: bool,
        split: tuple[float, float, float],
    ) -> None:
        t = self.totals
        t.batches += 1
        t.input += plan.input
        t.written += len(plan.canonical)
        t.duplicates += plan.duplicates
        t.dead += len(plan.dead)
        t.skipped += plan.skipped
        self.last = {
            "batch_id": batch_id,
            "input": plan.input,
            "written": len(plan.canonical),
            "duplicates": plan.duplicates,
            "dead": len(plan.dead),
            "skipped": plan.skipped,
            "replay": replay,
            "duration_ms": round(dt * 1000, 1),
        }
        log.info(
            "event=merge_batch site=%s batch=%d input=%d written=%d duplicates=%d dead=%d "
            "skipped=%d replay=%s sources=%d ranges=%d duration_ms=%.1f fetch_ms=%.1f "
            "plan_ms=%.1f txn_ms=%.1f",
            self.site.name,
            batch_id,
            plan.input,
            len(plan.canonical),
            plan.duplicates,
            len(plan.dead),
            plan.skipped,
            str(replay).lower(),
            len(self.state.held),
            self.state.ranges(),
            dt * 1000,
            *(x * 1000 for x in split),
        )
        self.write_status("running")

    # -- status and shutdown -------------------------------------------------------------
    def write_status(self, state: str, error: str | None = None) -> None:
        """``<checkpoint_dir>/<query>.status.json``, written atomically."""
        data = {
            "site": self.site.name,
            "query": self.query,
            "state": state,
            "error": error,
            "pid": os.getpid(),
            "updated_at": time.time(),
            "last_batch": self.last,
            "totals": asdict(self.totals),
            "state_sources": len(self.state.held),
            "state_ranges": self.state.ranges(),
        }
        path = self.status_path
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def _close_producer(self) -> None:
        p, self._producer = self._producer, None
        if p is not None:
            p.flush(1)

    def close(self) -> None:
        self._close_producer()


# -- the batch, from Spark to the driver ---------------------------------------------------
#: the headers exactly as the record contract writes them (``Record.headers``, the
#: gateway's writer, the canonical records that reach other sites' inboxes)
CONTRACT_LAYOUT = (H_ORIGIN, H_STREAM, H_SEQ, H_TS, H_SITE, H_MQTT_TOPIC)


def _value(i: int) -> str:
    return f"try_element_at(headers, {i + 1}).value"


def _text(i: int) -> str:
    return f"CAST({_value(i)} AS STRING)"


#: SQL (backslashes doubled for SQL string literals): when Spark vouches for a row
_VOUCHED = " AND ".join(
    [
        f"size(headers) = {len(CONTRACT_LAYOUT)}",
        *(f"try_element_at(headers, {i + 1}).key = '{n}'" for i, n in enumerate(CONTRACT_LAYOUT)),
        # a valid name (shorelink.identity.NAME_RE, but \z: no trailing newline)
        rf"{_text(0)} RLIKE '^[a-z0-9][a-z0-9_-]{{0,62}}\\z'",
        # the topic's last part; Python checks that it is a valid name, once per topic
        f"NOT contains({_text(1)}, '.')",
        f"CASE WHEN topic = concat('sl.ingress.', {_text(1)}) THEN true"  # lazily:
        rf" ELSE topic RLIKE '^sl\\.inbox\\.[^.]*\\.[^.]*\\z'"  # the regex for inbox only
        f" AND endswith(topic, concat('.', {_text(1)})) END",
        rf"{_text(2)} RLIKE '^[1-9][0-9]{{0,17}}\\z'",
        rf"{_text(3)} RLIKE '^[0-9]+\\z'",
        # ASCII (null if either value is null)
        f"is_valid_utf8(CAST(concat({_value(4)}, {_value(5)}) AS STRING))",
        f"length(CAST(concat({_value(4)}, {_value(5)}) AS STRING))"
        f" = octet_length(concat({_value(4)}, {_value(5)}))",
    ]
)
_KAFKA = ("topic", "partition", "offset", "key", "value")
_CHECKED = (
    *_KAFKA,
    "headers",
    f"coalesce({_VOUCHED}, false) AS vouched",
    f"{_text(0)} AS v_origin",
    f"{_text(2)} AS v_seq",
    *(f"{_value(i)} AS v_{i}" for i in (3, 4, 5)),
)
_PROJECTED = (
    *_KAFKA,
    "CASE WHEN vouched THEN NULL ELSE headers END AS headers",
    "CASE WHEN vouched THEN v_origin ELSE '' END AS origin",
    "CASE WHEN vouched THEN try_cast(v_seq AS BIGINT) ELSE 0L END AS seq",
    "CASE WHEN vouched THEN v_3 END AS h_ts",
    "CASE WHEN vouched THEN v_4 END AS h_site",
    "CASE WHEN vouched THEN v_5 END AS h_mqtt_topic",
)


def batch_frame(df: Any) -> Any:
    """The columns the driver needs, with the identity (``origin``, ``seq``) of every
    row Spark can vouch for; ``origin`` is ``""`` and ``seq`` 0 where it cannot.

    Spark vouches for a row only when ``Record.from_kafka`` certainly accepts it:
    headers exactly :data:`CONTRACT_LAYOUT` (names and order) with every value present,
    ``sl.origin`` a valid name, ``sl.stream`` the stream the topic carries (Python checks
    that name, once per topic), ``sl.seq`` 1 to 18 digits without a leading zero,
    ``sl.ts`` digits, ``sl.site`` and ``sl.mqtt_topic`` ASCII. Every other row, good or
    bad, gets the full check in Python, which alone decides what is dead: vouching
    saves the driver the per-row check (it runs on the executors, in parallel) and
    never changes the outcome (``tests/spark_core/test_merge.py`` holds
    it to that). A vouched row travels without its ``headers`` list: three flat
    columns (``h_ts``, ``h_site``, ``h_mqtt_topic``) carry what origin, seq and topic do
    not say, which is far cheaper to turn into Arrow and back (see ``ArrowBatch``).
    Plain positions, not ``filter(headers, ...)`` lambdas (those cost the batch ~40%);
    SQL text built once, not Column objects (one py4j call per projection, not one per
    operator); two projections, so that Spark computes ``vouched`` once per row, not
    once per use."""
    return df.selectExpr(*_CHECKED).selectExpr(*_PROJECTED)


class ArrowBatch:
    """A batch as ``batch_frame(df).toArrow()`` gives it (the :class:`Batch` the
    planner reads). Columns become Python lists straight from the Arrow buffers; keys,
    values and headers only for the rows written. A vouched row's headers come as the
    flat ``h_ts``, ``h_site``, ``h_mqtt_topic`` columns (plus ``origin``, ``seq`` and the
    topic's stream) and are rebuilt byte for byte in the contract's layout."""

    def __init__(self, table: pa.Table) -> None:
        self.table = table.combine_chunks()
        self.topics = _strings(self._col("topic"))
        self.partitions = _ints(self._col("partition"))
        self.offsets = _ints(self._col("offset"))
        self.origins = _strings(self._col("origin"))
        self.seqs = _ints(self._col("seq"))

    def _col(self, name: str) -> pa.Array:
        return _single(self.table.column(name))

    def row(self, i: int) -> SourceRow:
        if not self.origins[i]:
            return SourceRow.from_spark(self.table.slice(i, 1).to_pylist()[0])
        _, key, value, headers = self.records([""], [i])[0]
        return SourceRow(self.topics[i], self.partitions[i], self.offsets[i], key, value, headers)

    def records(self, topics: Sequence[str], rows: Sequence[int]) -> list[Out]:
        if not rows:
            return []
        sub = self.table.take(pa.array(rows, pa.int64()))
        col = partial(_column, sub)
        keys, values = _binaries(col("key")), _binaries(col("value"))
        rebuilt = _contract_headers(
            _strings(col("topic")),
            _strings(col("origin")),
            _ints(col("seq")),
            _repeated(col("h_ts")),
            _repeated(col("h_site")),
            _repeated(col("h_mqtt_topic")),
        )
        headers = [
            # not vouched for: the headers as they came
            SourceRow.from_spark(sub.slice(j, 1).to_pylist()[0]).headers if h is None else h
            for j, h in enumerate(rebuilt)
        ]
        return list(zip(topics, keys, values, headers, strict=True))


def _contract_headers(
    topics: list[str],
    origins: list[str],
    seqs: list[int],
    ts: list[bytes | None],
    sites: list[bytes | None],
    mqtt_topics: list[bytes | None],
) -> list[Headers | None]:
    """The headers of vouched rows in :data:`CONTRACT_LAYOUT` (``None`` for the other
    rows). Spark vouched only for ASCII values and a seq without leading zeros, so
    ``origin.encode()`` and ``b"%d" % seq`` are the bytes that came in."""
    # Spark vouched that sl.stream is the topic's last part, byte for byte
    streams = {t: (H_STREAM, t.rpartition(".")[2].encode()) for t in set(topics)}
    origin_h = {o: (H_ORIGIN, o.encode()) for o in set(origins)}
    site_h: dict[bytes | None, tuple[str, bytes | None]] = {s: (H_SITE, s) for s in set(sites)}
    out: list[Headers | None] = []
    append = out.append
    for topic, origin, seq, t, site, mqtt in zip(
        topics, origins, seqs, ts, sites, mqtt_topics, strict=True
    ):
        if not origin:
            append(None)
            continue
        append(
            [
                origin_h[origin],
                streams[topic],
                (H_SEQ, b"%d" % seq),
                (H_TS, t),
                site_h[site],
                (H_MQTT_TOPIC, mqtt),
            ]
        )
    return out


def _column(table: pa.Table, name: str) -> pa.Array:
    return _single(table.column(name))


def _single(col: pa.ChunkedArray) -> pa.Array:
    return col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)


def _ints(arr: pa.Array) -> list[int]:
    """An int32/int64 array without nulls, read from its buffer (``to_pylist`` builds
    every value through a scalar object: ~10x slower)."""
    if not len(arr) or arr.null_count or arr.type not in (pa.int32(), pa.int64()):
        return arr.to_pylist()
    fmt: Literal["i", "q"] = "i" if arr.type == pa.int32() else "q"
    return _buffer_ints(arr.buffers()[1], fmt, arr.offset, len(arr))


def _buffer_ints(buf: pa.Buffer, fmt: Literal["i", "q"], start: int, count: int) -> list[int]:
    width = 4 if fmt == "i" else 8
    view = memoryview(buf).cast("B")[start * width : (start + count) * width]
    return view.cast(fmt).tolist()


def _binaries(arr: pa.Array) -> list[bytes | None]:
    """A binary array as bytes objects sliced from one copy of its data buffer."""
    binary = pa.types.is_binary(arr.type) or pa.types.is_large_binary(arr.type)
    if not len(arr) or arr.null_count or not binary:
        return arr.to_pylist()
    fmt: Literal["i", "q"] = "q" if pa.types.is_large_binary(arr.type) else "i"
    bounds = _buffer_ints(arr.buffers()[1], fmt, arr.offset, len(arr) + 1)
    data = arr.buffers()[2]
    raw = b"" if data is None else data.to_pybytes()
    return [raw[a:b] for a, b in itertools.pairwise(bounds)]


def _repeated(arr: pa.Array) -> list[bytes | None]:
    """A binary column of repeated values (event times, sites, MQTT topics): each
    distinct value becomes one bytes object, shared by its rows."""
    if arr.null_count:
        return arr.to_pylist()
    enc = pc.dictionary_encode(arr)
    distinct = _binaries(enc.dictionary)
    return [distinct[i] for i in _ints(enc.indices)]


def _strings(arr: pa.Array) -> list[str]:
    """A string column of a few distinct values (topics, origins, header names)."""
    if arr.null_count:
        return arr.to_pylist()
    enc = pc.dictionary_encode(arr)
    names = enc.dictionary.to_pylist()
    return [names[i] for i in _ints(enc.indices)]


@contextlib.contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """A batch makes ~10 small tuples and lists per record (the records and their
    headers, as the producer takes them), all alive until the commit: the cyclic GC
    would scan them over and over while they pile up (it doubled the plan's time in
    bench/merge.py). Reference counting still frees everything at once; the few
    cycles wait for the end of the batch."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def start_merge(spark: Any, merger: Merger, *, available_now: bool = False) -> Any:
    """Start the merge query; returns the StreamingQuery."""
    site = merger.site
    m = site.merge
    merger.prepare()
    df = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", site.kafka_bootstrap)
        .option("subscribePattern", m.source_pattern)
        .option("includeHeaders", "true")
        .option("startingOffsets", "earliest")
        .option("kafka.isolation.level", "read_committed")
        .option("maxOffsetsPerTrigger", str(m.max_offsets_per_trigger))
        .option("failOnDataLoss", str(m.fail_on_data_loss).lower())
        .load()
    )
    writer = (
        df.writeStream.queryName(f"{merger.query}-{site.name}")
        .foreachBatch(merger.process_batch)
        .option("checkpointLocation", str(site.query_checkpoint(merger.query)))
    )
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(
            processingTime=f"{int(site.trigger_interval_s * 1000)} milliseconds"
        )
    return writer.start()
