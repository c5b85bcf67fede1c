"""The record contract (shorelink/contract.py) as Spark reads it: every projection Spark
makes of a Kafka row's ``sl.*`` headers, generated from :data:`HEADER_LAYOUT` and the
name rule (:data:`shorelink.identity.NAME_RE`), so that Spark and ``Record.from_kafka``
read one contract instead of three SQL copies of it.

- :func:`read_contract`: the contract's columns as ``Record.from_kafka`` reads them
  (``origin``, ``stream``, ``seq``, ``ts_ms``, ``ts``, ``site``, ``mqtt_topic``): the
  Delta tables' columns (spark_core/tables.py), the identity among them
  (:data:`IDENTITY_COLUMNS`);
- :func:`vouch`: the rows Spark can vouch for, with their identity and the other
  headers as flat columns (the merge's hand-over, spark_core/merge_batch.py);
  :func:`rebuild_headers` turns those back into the headers, byte for byte.

Why positions: every shorelink writer puts the headers in :data:`HEADER_LAYOUT`, so a
row whose headers are exactly that layout is read at fixed places
(``try_element_at(headers, i)``); only a row in another layout pays for a
``filter(headers, h -> ...)`` lambda, which costs the merge's batch ~40%. Why two
projections: the first checks the layout once per row, every column of the second
reads that flag. Why SQL text, not Column objects: one py4j call per projection, not
one per operator.

``tests/spark_core/test_contract_sql.py`` holds every projection to
``Record.from_kafka`` on good and hostile headers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from shorelink.contract import (
    H_ENTERED,
    H_MQTT_TOPIC,
    H_ORIGIN,
    H_PROOF,
    H_SEQ,
    H_SITE,
    H_STREAM,
    H_TS,
    HEADER_LAYOUT,
    MAX_TS_MS,
)
from shorelink.identity import NAME_RE

__all__ = [
    "CONTRACT_COLUMNS",
    "FLAT_COLUMNS",
    "FLAT_HEADERS",
    "IDENTITY_COLUMNS",
    "PROOF_COLUMN",
    "VOUCHED",
    "name_regex",
    "read_contract",
    "rebuild_headers",
    "vouch",
]

#: as spark_core.merge_state has them
Headers = list[tuple[str, str | bytes | None]]


def name_regex() -> str:
    """:data:`NAME_RE` as a Spark SQL string literal for ``RLIKE``, matched whole:
    ``RLIKE`` finds, and Java's ``$`` (like Python's) admits a final newline; ``\\z``
    does not."""
    return _sql_string(rf"^(?:{NAME_RE.pattern})\z")


def _sql_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _at(name: str) -> str:
    """SQL: header ``name``'s value at its place in :data:`HEADER_LAYOUT` (binary)."""
    return f"try_element_at(headers, {HEADER_LAYOUT.index(name) + 1}).value"


def _last(name: str) -> str:
    """SQL: the value ``Record.from_kafka`` reads for header ``name`` wherever it
    stands: the last non-null one under that name (binary; NULL if none)."""
    return (
        f"try_element_at(filter(headers, h -> h.key = '{name}' AND h.value IS NOT NULL), -1).value"
    )


def _text(sql: str) -> str:
    return f"CAST({sql} AS STRING)"


#: SQL: the contract's headers at their places in :data:`HEADER_LAYOUT` (false for no
#: headers at all); what may follow them is said by each use below. Then what
#: ``Record.from_kafka`` reads of each header is the value at its place (a null value
#: there is a missing header either way).
_AT_PLACES = " AND ".join(
    f"try_element_at(headers, {i + 1}).key = '{n}'" for i, n in enumerate(HEADER_LAYOUT)
)
_N = len(HEADER_LAYOUT)
#: SQL: exactly :data:`HEADER_LAYOUT`, or it then ``sl.proof`` (what a gateway writes
#: for a ship that signs): what the merge vouches for
_LAYOUT_HOLDS = (
    f"(size(headers) = {_N} OR (size(headers) = {_N + 1}"
    f" AND try_element_at(headers, {_N + 1}).key = '{H_PROOF}'"
    f" AND try_element_at(headers, {_N + 1}).value IS NOT NULL)) AND {_AT_PLACES}"
)
#: SQL: :data:`HEADER_LAYOUT`, then at most ``sl.proof`` and ``sl.entered`` (what the
#: merge writes to a canonical or relay topic): the contract's headers are still at
#: their places
_READ_LAYOUT_HOLDS = (
    f"(size(headers) BETWEEN {_N} AND {_N + 2})"
    f" AND forall(slice(headers, {_N + 1}, 2), h -> h.key IN ('{H_PROOF}', '{H_ENTERED}'))"
    f" AND {_AT_PLACES}"
)
_IN_LAYOUT = f"coalesce({_READ_LAYOUT_HOLDS}, false)"
_LAYOUT = "sl_layout"  # the flag's column between the two projections

# -- read: what Record.from_kafka reads ----------------------------------------------------
#: ``sl.seq`` and ``sl.ts`` as ``Record.from_kafka`` reads them: ASCII digits only (a
#: cast alone would take a sign, spaces or a newline, and a negative ``sl.ts`` overflows
#: ``timestamp_millis``, failing the query on every retry), NULL beyond a BIGINT
_DIGITS = "CASE WHEN {0} <> '' AND NOT {0} RLIKE '[^0-9]' THEN try_cast({0} AS BIGINT) END"
#: each header's column and how its text becomes what ``Record.from_kafka`` gives: an
#: int for ``sl.seq`` and ``sl.ts`` (:data:`_DIGITS`), ``""`` for a missing
#: ``sl.mqtt_topic`` (a header added to the contract without an entry here fails the
#: import)
_READ: dict[str, tuple[str, str]] = {
    H_ORIGIN: ("origin", "{0}"),
    H_STREAM: ("stream", "{0}"),
    H_SEQ: ("seq", _DIGITS),
    H_TS: ("ts_ms", _DIGITS),
    H_SITE: ("site", "{0}"),
    H_MQTT_TOPIC: ("mqtt_topic", "coalesce({0}, '')"),
}


def _read(name: str) -> str:
    value = f"CASE WHEN {_LAYOUT} THEN {_at(name)} ELSE {_last(name)} END"
    return _READ[name][1].format(_text(value))


#: the columns :func:`read_contract` adds, in :data:`HEADER_LAYOUT` order, then ``ts``
#: (``sl.ts`` as a TIMESTAMP; NULL beyond :data:`~shorelink.contract.MAX_TS_MS`, where
#: ``timestamp_millis`` would fail the query on every retry past Spark's range, and a
#: Python reader of the row (``collect``) fails past the year 9999)
CONTRACT_COLUMNS = (*(_READ[n][0] for n in HEADER_LAYOUT), "ts")
#: a record's identity among them
IDENTITY_COLUMNS = tuple(_READ[n][0] for n in (H_ORIGIN, H_STREAM, H_SEQ))
_READ_SQL = (
    *(f"{_read(n)} AS {_READ[n][0]}" for n in HEADER_LAYOUT),
    f"CASE WHEN {_read(H_TS)} <= {MAX_TS_MS} THEN timestamp_millis({_read(H_TS)}) END AS ts",
)


def read_contract(df: Any, *keep: str) -> Any:
    """``df`` (Kafka rows: ``headers`` and the columns named in ``keep``) with the
    contract's headers as columns (:data:`CONTRACT_COLUMNS`), as ``Record.from_kafka``
    reads them: the last non-null value of each name, in any order.

    On every record ``Record.from_kafka`` accepts the columns equal its fields (but
    for a ``seq`` or ``ts`` beyond a BIGINT: NULL). Of a record it rejects they say
    nothing: the topics the tables read hold only what the merge accepted."""
    first = dict.fromkeys([*keep, "headers"])
    return df.selectExpr(*first, f"{_IN_LAYOUT} AS {_LAYOUT}").selectExpr(*keep, *_READ_SQL)


# -- vouch: when Spark is sure Record.from_kafka accepts a row -----------------------------
#: the headers a vouched row carries as flat binary columns: what its identity (``origin``,
#: ``seq`` and the topic's stream) does not say
FLAT_HEADERS = tuple(n for n in HEADER_LAYOUT if n not in (H_ORIGIN, H_STREAM, H_SEQ))
#: their columns: ``h_ts``, ``h_site``, ``h_mqtt_topic``
FLAT_COLUMNS = tuple("h_" + n.removeprefix("sl.") for n in FLAT_HEADERS)
#: a vouched row's ``sl.proof`` (NULL where it has none)
PROOF_COLUMN = "h_proof"


def _stream_of_topic(stream: str) -> str:
    """SQL: ``stream`` (the header's text) is the last part of the source topic,
    ``sl.ingress.<stream>`` (spark_core.merge_state.topic_stream). Python checks that
    it is a valid name, once per topic."""
    return f"NOT contains({stream}, '.') AND topic = concat('sl.ingress.', {stream})"


#: what Spark checks of each header's value before it vouches: ``Record.from_kafka``'s
#: rule or a stricter one (Python decides what Spark cannot be sure of)
_VOUCH: dict[str, Callable[[str], str]] = {
    H_ORIGIN: lambda v: f"{_text(v)} RLIKE {name_regex()}",
    H_STREAM: lambda v: _stream_of_topic(_text(v)),
    # a BIGINT that prints back as it came (no leading zero, at most 18 digits)
    H_SEQ: lambda v: rf"{_text(v)} RLIKE '^[1-9][0-9]{{0,17}}\\z'",
    # at most 18 digits: within MAX_INT64 (Python decides a longer one)
    H_TS: lambda v: rf"{_text(v)} RLIKE '^[0-9]{{1,18}}\\z'",
}
#: any text (UTF-8) for Python; Spark vouches for ASCII, checked for all at once
#: (``is_valid_utf8`` and one byte a character; null if any value is null)
_ASCII = (H_SITE, H_MQTT_TOPIC)
if sorted([*_VOUCH, *_ASCII]) != sorted(HEADER_LAYOUT):  # a header without a rule
    raise ImportError(f"contract_sql has no vouching rule for some of {HEADER_LAYOUT}")
_ascii = "concat({})".format(", ".join(_at(n) for n in _ASCII))

#: SQL (columns ``headers``, ``topic``): Spark vouches for a row when
#: ``Record.from_kafka`` certainly accepts it and its ``sl.stream`` is the topic's
VOUCHED = "coalesce({}, false)".format(
    " AND ".join(
        [
            _LAYOUT_HOLDS,
            *(_VOUCH[n](_at(n)) for n in HEADER_LAYOUT if n in _VOUCH),
            f"is_valid_utf8(CAST({_ascii} AS STRING))",
            f"length(CAST({_ascii} AS STRING)) = octet_length({_ascii})",
        ]
    )
)
_CHECKED = (
    "headers",
    f"{VOUCHED} AS sl_vouched",
    f"{_text(_at(H_ORIGIN))} AS v_origin",
    f"{_text(_at(H_SEQ))} AS v_seq",
    *(f"{_at(n)} AS {c}" for n, c in zip(FLAT_HEADERS, FLAT_COLUMNS, strict=True)),
    f"try_element_at(headers, {_N + 1}).value AS {PROOF_COLUMN}",
)
_PROJECTED = (
    "CASE WHEN sl_vouched THEN NULL ELSE headers END AS headers",
    "CASE WHEN sl_vouched THEN v_origin ELSE '' END AS origin",
    "CASE WHEN sl_vouched THEN try_cast(v_seq AS BIGINT) ELSE 0L END AS seq",
    *(f"CASE WHEN sl_vouched THEN {c} END AS {c}" for c in (*FLAT_COLUMNS, PROOF_COLUMN)),
)


def vouch(df: Any, *keep: str) -> Any:
    """``df`` (Kafka rows: ``topic``, ``headers`` and the columns named in ``keep``)
    with the identity (``origin``, ``seq``) of every row Spark can vouch for, ``""``
    and 0 where it cannot, and ``headers`` only where it cannot: a vouched row carries
    the rest as :data:`FLAT_COLUMNS` instead, which :func:`rebuild_headers` turns back
    into its headers.

    Spark vouches for a row only when ``Record.from_kafka`` certainly accepts it:
    headers exactly :data:`HEADER_LAYOUT` (names and order), or it then ``sl.proof``
    (:data:`PROOF_COLUMN` carries it), with every value present,
    ``sl.origin`` a valid name, ``sl.stream`` the stream the topic carries (Python
    checks that name, once per topic), ``sl.seq`` 1 to 18 digits without a leading
    zero, ``sl.ts`` 1 to 18 digits, ``sl.site`` and ``sl.mqtt_topic`` ASCII."""
    keep = tuple(k for k in keep if k != "headers")
    return df.selectExpr(*keep, *_CHECKED).selectExpr(*keep, *_PROJECTED)


#: the layout :func:`rebuild_headers` writes, spelled out for speed (a row loop with the
#: repeated tuples shared is ~30% faster than zipping columns generated from the layout)
_REBUILT = (H_ORIGIN, H_STREAM, H_SEQ, *FLAT_HEADERS)
if _REBUILT != HEADER_LAYOUT or FLAT_HEADERS != (H_TS, H_SITE, H_MQTT_TOPIC):
    raise ImportError(f"rebuild_headers writes {_REBUILT}, the contract is {HEADER_LAYOUT}")


def rebuild_headers(
    topics: Sequence[str],
    origins: Sequence[str],
    seqs: Sequence[int],
    ts: Sequence[bytes | None],
    sites: Sequence[bytes | None],
    mqtt_topics: Sequence[bytes | None],
    proofs: Sequence[bytes | None] | None = None,
) -> list[Headers | None]:
    """The headers of the rows :func:`vouch` vouched for, in :data:`HEADER_LAYOUT`
    (``None`` for the other rows: ``origin`` ``""``), from its columns. Spark vouched
    for ASCII values, a seq without leading zeros and ``sl.stream`` the topic's last
    part, byte for byte, so ``origin.encode()``, ``b"%d" % seq`` and that part are the
    bytes that came in. The repeated values (origins, streams, sites) share one tuple
    each. A row with a proof (``proofs``) gets its ``sl.proof`` after them."""
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
    if proofs is not None:
        for headers, proof in zip(out, proofs, strict=True):
            if headers is not None and proof is not None:
                headers.append((H_PROOF, proof))
    return out
