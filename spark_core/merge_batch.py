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

from shorelink.contract import (
    H_MQTT_TOPIC,
    H_ORIGIN,
    H_SEQ,
    H_SITE,
    H_STREAM,
    H_TS,
    HEADER_LAYOUT,
)
from spark_core.merge_state import Headers, Out, SourceRow

__all__ = ["ArrowBatch", "batch_frame", "cyclic_gc_paused"]

#: the headers exactly as the record contract writes them (``Record.headers``, the
#: gateway's writer, the canonical records that reach other sites' inboxes)
CONTRACT_LAYOUT = HEADER_LAYOUT


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
