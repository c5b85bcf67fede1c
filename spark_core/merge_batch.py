"""The merge's batch, from Spark to the driver: what Spark computes on the executors
(:func:`batch_frame`: the columns the driver needs, and which rows Spark can vouch for
under the record contract) and how the driver reads it (:class:`ArrowBatch`: Arrow
buffers straight into Python lists, headers rebuilt byte for byte). spark_core/merge.py
plans and writes the batch; this module only makes it cheap to hand over
(docs/exactly-once.md, "Design").
"""

from __future__ import annotations

import contextlib
import gc
import itertools
from collections.abc import Iterator, Sequence
from functools import partial
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc

from spark_core.contract_sql import FLAT_COLUMNS, PROOF_COLUMN, rebuild_headers, vouch
from spark_core.merge_state import Out, SourceRow, topic_stream

__all__ = ["ArrowBatch", "batch_frame", "batch_sizes", "cyclic_gc_paused", "unwritten"]

_KAFKA = ("topic", "partition", "offset", "key", "value")


def batch_frame(df: Any) -> Any:
    """The columns the driver needs, with the identity (``origin``, ``seq``) of every
    row Spark can vouch for under the record contract; ``origin`` is ``""`` and ``seq``
    0 where it cannot (``spark_core.contract_sql.vouch``, which says when it can).

    Every other row, good or bad, gets the full check in Python, which alone decides
    what is dead: vouching saves the driver the per-row check (it runs on the
    executors, in parallel) and never changes the outcome (``tests/spark_core/
    test_merge.py`` and ``test_contract_sql.py`` hold it to that). A vouched row travels
    without its ``headers`` list: three flat columns (``h_ts``, ``h_site``,
    ``h_mqtt_topic``) carry what origin, seq and topic do not say, which is far cheaper
    to turn into Arrow and back (see ``ArrowBatch``). ``written_ms`` is the Kafka
    timestamp in epoch ms (for ``sl.ingress.*``, when the gateway wrote the record)."""
    return vouch(df.selectExpr("*", "unix_millis(timestamp) AS written_ms"), *_KAFKA, "written_ms")


def unwritten(df: Any, committed: dict[tuple[str, int], int]) -> Any:
    """The rows of a Kafka batch at or above their partition's ``committed`` offset
    (the merge state's, per source topic and partition): the rows below it another
    reader of the same topics wrote already (the ingest puller, spark_core/pull.py),
    and the planner would skip them anyway; so they stay on the executors instead of
    crossing to the driver. ``committed`` may be older than what the merge holds when
    the batch is planned (the planner skips the rest)."""
    below = [
        f"(topic = '{t}' AND partition = {p} AND offset < {o})"
        for (t, p), o in sorted(committed.items())
        if topic_stream(t) is not None  # the site's ingress topics (names checked)
    ]
    return df.where(f"NOT ({' OR '.join(below)})") if below else df


#: a Kafka row's bytes as the merge holds them: key, value, and each header's name and value
_ROW_BYTES = (
    "coalesce(length(key), 0) + coalesce(length(value), 0) + coalesce(aggregate(headers, 0L,"
    " (n, h) -> n + octet_length(h.key) + coalesce(length(h.value), 0)), 0)"
)


def batch_sizes(df: Any) -> list[tuple[str, int, int, int]]:
    """Per source partition of a Kafka batch: ``(topic, partition, bytes, last offset)``,
    computed on the executors (what the driver would hold of it, without taking it)."""
    rows = (
        df.selectExpr("topic", "partition", "offset", f"{_ROW_BYTES} AS bytes")
        .groupBy("topic", "partition")
        .agg({"bytes": "sum", "offset": "max"})
        .collect()
    )
    return [(r[0], r[1], int(r["sum(bytes)"] or 0), int(r["max(offset)"])) for r in rows]


class ArrowBatch:
    """A batch as ``batch_frame(df).toArrow()`` gives it (the :class:`SourceBatch` the
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
        ts, sites, mqtt_topics = (_repeated(col(c)) for c in FLAT_COLUMNS)
        rebuilt = rebuild_headers(
            _strings(col("topic")),
            _strings(col("origin")),
            _ints(col("seq")),
            ts,
            sites,
            mqtt_topics,
            _binaries(col(PROOF_COLUMN)),
        )
        headers = [
            # not vouched for: the headers as they came
            SourceRow.from_spark(sub.slice(j, 1).to_pylist()[0]).headers if h is None else h
            for j, h in enumerate(rebuilt)
        ]
        return list(zip(topics, keys, values, headers, strict=True))

    def written_ms(self, rows: Sequence[int]) -> Sequence[int | None]:
        if not rows:
            return []
        return _ints(pc.take(self._col("written_ms"), pa.array(rows, pa.int64())))


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
def cyclic_gc_paused() -> Iterator[None]:
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
