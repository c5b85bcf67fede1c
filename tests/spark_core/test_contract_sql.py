"""Spark reads the record contract as ``Record.from_kafka`` does: on good and hostile
headers, the merge's vouching and the tables' columns (spark_core/contract_sql.py)
agree with the Python definition. Where they did not, a broken record could reach a
canonical topic or a good one die."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shorelink.contract import H_ENTERED, H_PROOF, H_SEQ, HEADER_LAYOUT, MAX_TS_MS, Record
from shorelink.errors import ContractError
from shorelink.identity import NAME_RE, Identity
from spark_core.contract_sql import CONTRACT_COLUMNS, IDENTITY_COLUMNS, read_contract
from spark_core.merge_batch import ArrowBatch, batch_frame
from spark_core.merge_state import Headers, topic_stream

BIGINT_MAX = 2**63 - 1
#: the largest ``sl.ts`` a Spark TIMESTAMP holds (microseconds in a BIGINT)
TS_MAX = BIGINT_MAX // 1000

Case = tuple[str, Headers | None, bool | None]  # topic, headers, vouched (None: not asserted)


def hdrs(n: int = 1, **change: bytes | None) -> Headers:
    """The contract's headers of ``ship1/nav/<n>``, some values changed."""
    rec = Record(Identity("ship1", "nav", n), b"k", b"v", 1_700_000_000_000, "tokyo", "s/c1")
    return [(k, change.get(k.removeprefix("sl."), v)) for k, v in rec.headers()]


IN, INBOX = "sl.ingress.nav", "sl.inbox.hq.nav"
FIXED: list[Case] = [
    (IN, hdrs(), True),
    (INBOX, hdrs(2), False),  # the old inbox topics: not a source any more
    (IN, hdrs(3, site=b"Tokyo Port", mqtt_topic=b""), True),  # any text is a site
    (IN, hdrs(999_999_999_999_999_999), True),  # 18 digits
    # as a canonical or relay topic has it: read at its places, not vouched at ingress
    (IN, [*hdrs(4), (H_ENTERED, b"1700000000912")], False),
    (IN, [*hdrs(5), (H_ENTERED, b"1"), ("sl.seq", b"6")], False),  # the last sl.seq: 6
    # a signing ship's record (binary proof, not UTF-8): vouched at ingress, with it
    (IN, [*hdrs(20), (H_PROOF, b"\xff\x00proof")], True),
    (IN, [*hdrs(21), (H_PROOF, None)], False),
    (IN, [*hdrs(22), (H_PROOF, b"\xfe"), (H_ENTERED, b"1700000000913")], False),
    (IN, [*hdrs(23), (H_PROOF, b"p"), (H_SEQ, b"24")], False),  # the last sl.seq: 24
    # good, left to Python
    (IN, hdrs(BIGINT_MAX), False),
    (IN, hdrs(4, seq=b"0004"), False),  # leading zeros
    (IN, hdrs(5)[::-1], False),  # other order
    (IN, [hdrs(6)[1], hdrs(6)[0], *hdrs(6)[2:]], False),  # two swapped
    (IN, [*hdrs(7), ("x-extra", b"1")], False),
    (IN, [*hdrs(8), (H_SEQ, b"9")], False),  # the last sl.seq counts: 9
    (IN, [*hdrs(10), (H_SEQ, None)], False),  # a null value is skipped: 10
    (IN, [*hdrs(11)[:5], (H_SEQ, b"12"), hdrs(11)[5]], False),  # duplicate inside: 12
    (IN, hdrs(13)[:5], False),  # no sl.mqtt_topic: ""
    (IN, hdrs(14, mqtt_topic=None), False),
    (IN, hdrs(15, mqtt_topic="ship/kühl".encode()), False),  # UTF-8
    (IN, hdrs(16, ts=b"0"), True),
    (IN, hdrs(17, ts=b"%d" % TS_MAX), True),
    (IN, hdrs(18, ts=b"%d" % (TS_MAX + 1)), True),  # beyond a TIMESTAMP
    (IN, hdrs(18, ts=b"%d" % (MAX_TS_MS + 1)), True),  # beyond the year 9999
    # beyond a BIGINT the contract refuses it (review N4); 19 digits Python decides
    (IN, hdrs(19, ts=b"1" * 30), False),
    (IN, hdrs(19, ts=b"%d" % BIGINT_MAX), False),
    (IN, hdrs(19, ts=b"%d" % (BIGINT_MAX + 1)), False),
    # not digits, as Python reads them: no sign, no space, no newline (a negative sl.ts
    # beyond -2**63 µs once overflowed timestamp_millis and failed the whole query)
    (IN, hdrs(25, ts=b"-9999999999999999"), False),
    *((IN, hdrs(26, ts=t), False) for t in (b"-1", b"+5", b" 5", b"5\n", b"5 ", b"")),
    *((IN, hdrs(27, seq=s), False) for s in (b"-27", b"+27", b"27\n")),
    (IN, hdrs(BIGINT_MAX + 1), False),
    (IN, hdrs(10**30), False),
    # broken
    (IN, [], False),
    (IN, None, False),  # Kafka's null header array
    *((IN, [h for h in hdrs(20) if h[0] != name], False) for name in HEADER_LAYOUT[:5]),
    *((IN, hdrs(21, **{n: None}), False) for n in ("origin", "stream", "seq", "ts", "site")),
    (IN, hdrs(22, origin=b"ship1\n"), False),  # a name is matched whole
    (IN, hdrs(23, stream=b"nav\n"), False),
    (IN, hdrs(24, origin=b"Ship1"), False),
    (IN, hdrs(25, origin=b""), False),
    (IN, hdrs(26, origin=b"a" * 64), False),
    (IN, hdrs(27, origin=b"-a"), False),
    (IN, hdrs(28, origin=b"a.b"), False),
    (IN, hdrs(29, stream=b"containers"), False),  # not the topic's stream
    (IN, hdrs(30, seq=b"-30"), False),
    (IN, hdrs(31, seq=b"+31"), False),
    (IN, hdrs(32, seq=b" 32"), False),
    (IN, hdrs(33, seq=b"33 "), False),
    (IN, hdrs(34, seq=b"0"), False),
    (IN, hdrs(35, seq=b""), False),
    (IN, hdrs(36, seq=b"3.6"), False),
    (IN, hdrs(37, seq="٣٧".encode()), False),  # non-ASCII digits
    (IN, hdrs(38, ts=b"-38"), False),
    (IN, hdrs(39, ts=b"39a"), False),
    (IN, hdrs(40, site=b"\xff"), False),
    (IN, hdrs(41, mqtt_topic=b"\xc3"), False),  # cut UTF-8
    (IN, [*hdrs(42), ("x-bin", b"\xff")], False),  # any header must be UTF-8
    (IN, [(k.upper(), v) for k, v in hdrs(43)], False),  # names are case-sensitive
    (IN, [(f"{k} ", v) for k, v in hdrs(44)], False),
    # the topic: Spark vouches that sl.stream is its last part; Python checks the name
    ("sl.ingress.nav.x", hdrs(45), False),
    ("sl.ingress.navx", hdrs(46), False),
    ("sl.inbox.nav", hdrs(47), False),
    ("sl.inbox.hq.x.nav", hdrs(48), False),
    ("sl.ingress.nav.x", hdrs(49, stream=b"nav.x"), False),
    ("sl.ingress.Bad", hdrs(50, stream=b"Bad"), True),  # vouched: the topic names no stream
]

# -- generated: a record's headers, then a few hostile changes ------------------------------
_names = st.from_regex(NAME_RE, fullmatch=True)
_odd = st.sampled_from(
    [
        b"",
        b"0",
        b"00",
        b"-1",
        b"+1",
        b" 1",
        b"1\n",
        b"nav\n",
        b"Nav",
        b"a.b",
        b"nav",
        b"\xff",
        b"\xc3",
        "ü".encode(),
        "٣".encode(),
        b"%d" % BIGINT_MAX,
        b"%d" % (BIGINT_MAX + 1),
        b"%d" % TS_MAX,
        b"%d" % (TS_MAX + 1),
        b"%d" % MAX_TS_MS,
        b"%d" % (MAX_TS_MS + 1),
    ]
)
_values = st.one_of(
    st.none(),
    _odd,
    _names.map(str.encode),
    st.integers(0, 2**70).map(b"%d".__mod__),
    st.binary(max_size=6),
)
_tweaks = st.sampled_from(
    [
        lambda v: v + b"\n",
        lambda v: v.upper(),
        lambda v: b"0" + v,
        lambda v: b"-" + v,
        lambda v: b" " + v,
        lambda v: v + b".x",
        lambda v: v + b"\xff",
    ]
)
_text = st.text(st.characters(codec="ascii"), max_size=8) | st.text(max_size=8)
_keys = st.sampled_from([*HEADER_LAYOUT, H_ENTERED, H_PROOF, "x-extra", "SL.SEQ", "sl.seq "])


@st.composite
def _case(draw: st.DrawFn) -> Case:
    stream = draw(st.sampled_from(["nav", "containers", "a-b_1"]))
    topic = draw(
        st.sampled_from(
            [
                f"sl.ingress.{stream}",
                f"sl.inbox.hq.{stream}",
                f"sl.ingress.{stream}x",
                f"sl.inbox.{stream}",
                "sl.ingress.nav",
            ]
        )
    )
    rec = Record(
        Identity(draw(_names), stream, draw(st.integers(1, 10**6) | st.integers(1, 2**64))),
        b"k",
        b"v",
        draw(st.integers(0, 2**45) | st.integers(0, 2**64)),
        draw(_text),
        draw(_text),
    )
    hs: Headers = list(rec.headers())
    # mostly one change, and mostly a small one: a record a little off the contract
    changes = st.sampled_from([0, 1, 2, 3, 4, 5, 5, 5, 6, 7, 8, 8, 9])
    for change in draw(st.lists(changes, max_size=2)):
        i = draw(st.integers(0, max(len(hs) - 1, 0)))
        if not hs and change != 4:
            continue
        if change == 0:
            del hs[i]
        elif change == 1:  # a value changed
            hs[i] = (hs[i][0], draw(_values))
        elif change == 2:  # a name changed
            hs[i] = (draw(_keys), hs[i][1])
        elif change == 3:  # repeated, with another value
            hs.insert(draw(st.integers(0, len(hs))), (hs[i][0], draw(_values)))
        elif change == 4:
            hs.insert(draw(st.integers(0, len(hs))), (draw(_keys), draw(_values)))
        elif change == 5:  # a value bent a little
            hs[i] = (hs[i][0], draw(_tweaks)(hs[i][1] or b""))
        elif change == 9:  # a signing ship's proof, as the gateway writes it (binary)
            hs.append((H_PROOF, draw(st.binary(max_size=8) | st.none())))
        elif change == 8:  # as the merge writes it to a canonical or relay topic
            hs.append((H_ENTERED, draw(st.integers(0, 2**45).map(b"%d".__mod__) | _values)))
        elif change == 6:
            j = draw(st.integers(0, len(hs) - 1))
            hs[i], hs[j] = hs[j], hs[i]
        else:
            hs = hs[::-1]
    # every untouched record of ASCII text in its own topic is vouched for
    certain = (
        (
            hs == rec.headers()
            or (hs[:-1] == rec.headers() and hs[-1][0] == H_PROOF and hs[-1][1] is not None)
        )
        and topic_stream(topic) == stream
        and rec.identity.seq < 10**18
        and rec.ts_ms < 10**18
        and (rec.site + rec.mqtt_topic).isascii()
    )
    return topic, hs, True if certain else None


def _generated(n: int) -> list[Case]:
    """``n`` examples drawn by hypothesis, evaluated together in one DataFrame below
    (a Spark job per example would take minutes)."""
    out: list[Case] = []

    @settings(
        max_examples=n,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(_case())
    def draw(case: Case) -> None:
        out.append(case)

    draw()
    return out


def _python(hs: Headers | None) -> Record | None:
    try:
        return Record.from_kafka(b"k", b"v", hs)
    except ContractError:
        return None


#: the Kafka source's schema, as the merge's and the tables' batches have it
KAFKA_SCHEMA = (
    "topic STRING, partition INT, offset BIGINT, key BINARY, value BINARY,"
    " headers ARRAY<STRUCT<key: STRING, value: BINARY>>, timestamp TIMESTAMP"
)


@pytest.mark.spark
def test_spark_reads_the_record_contract_as_record_from_kafka_does(spark: Any) -> None:
    cases = FIXED + _generated(600)
    written = datetime.now(UTC)
    rows = [(t, 0, i, b"k", b"v", hs, written) for i, (t, hs, _) in enumerate(cases)]
    frame = spark.createDataFrame(rows, KAFKA_SCHEMA).coalesce(1).cache()
    batch = ArrowBatch(batch_frame(frame).toArrow())
    read = {
        r.offset: r
        for r in read_contract(frame, "offset")
        .selectExpr("offset", *(c for c in CONTRACT_COLUMNS if c != "ts"), "unix_millis(ts) AS ts")
        .collect()
    }
    assert batch.offsets == list(range(len(cases))) and len(read) == len(cases)
    vouched = [i for i, o in enumerate(batch.origins) if o]
    records = batch.records([""] * len(vouched), vouched)
    rebuilt = {j: h for j, (_, _, _, h) in zip(vouched, records, strict=True)}
    for i, (topic, hs, want_vouched) in enumerate(cases):
        rec, stream = _python(hs), topic_stream(topic)
        why = f"case {i}: {topic} {hs!r} -> {rec}"
        # the merge: Spark vouches only for what Python accepts with the topic's stream
        # (or for a topic that names no stream, which Python rejects for the topic);
        # the headers come back byte for byte
        if want_vouched is not None:
            assert (i in rebuilt) == want_vouched, why
        if i in rebuilt and stream is not None:
            assert rec is not None and rec.identity.stream == stream, why
            assert (batch.origins[i], batch.seqs[i]) == (rec.identity.origin, rec.identity.seq)
            assert rebuilt[i] == hs, why
        # the tables: every record Python accepts, as it reads it
        if rec is None:
            continue
        ident, got = rec.identity, read[i]
        assert (got.site, got.mqtt_topic) == (rec.site, rec.mqtt_topic), why
        seq = ident.seq if ident.seq <= BIGINT_MAX else None
        assert tuple(got[c] for c in IDENTITY_COLUMNS) == (ident.origin, ident.stream, seq), why
        assert got.ts_ms == (rec.ts_ms if rec.ts_ms <= BIGINT_MAX else None), why
        # a time shown up to the year 9999 (beyond, every Python reader of the row fails)
        assert got.ts == (rec.ts_ms if rec.ts_ms <= MAX_TS_MS else None), why
    # the table holds every kind: vouched, accepted but not vouched, rejected
    accepted = [i for i, c in enumerate(cases) if _python(c[1]) is not None]
    assert vouched and set(accepted) - set(vouched) and len(accepted) < len(cases)
    frame.unpersist()
