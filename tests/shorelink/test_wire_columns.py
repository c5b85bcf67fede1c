"""The v2 body's columns: fixed-width integer columns, numbers rendered in bulk, and
every edge the bulk paths must get exactly right (widths, signs, decimals, long numbers,
payloads that are not JSON), plus the checks a hostile body meets in the new columns."""

from __future__ import annotations

import json
import random
import struct
import zlib

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shorelink.wire_body as wb
from shorelink.wire import (
    FLAG_TEMPLATED,
    Batch,
    Limits,
    WireError,
    WireRecord,
    decode_batch,
    decode_columns,
    encode_batch,
    peek_header,
)

FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def batch_of(records: list[WireRecord]) -> Batch:
    return Batch("bigblue", "containers", tuple(records))


def round_trip(records: list[WireRecord]) -> bytes:
    data = encode_batch(batch_of(records))
    assert decode_batch(data).records == tuple(records)
    # and decoded a few numbers at a time: every stretch boundary (a run of one key
    # carried over, a difference column's running value) inside the batch
    h = peek_header(data)
    few = wb.parse_columns(
        body_of(data), flags=h.flags, count=h.count, max_decoded=2**30, stretch=3
    )
    assert few == decode_columns(data)[1]
    return data


def body_of(data: bytes) -> bytes:
    h = peek_header(data)
    return zstandard.ZstdDecompressor().decompress(data[h.header_len :])


def forge_v2(raw: bytes, *, count: int, flags: int = 0) -> bytes:
    body = zstandard.ZstdCompressor().compress(raw)
    fixed = struct.pack(
        "<4sBBBBQIQIII", b"SLKB", 2, flags, 7, 10, 1, count, 1, len(raw), len(body), 0
    )
    crc = zlib.crc32(fixed[:36] + b"bigblue" + b"containers" + body)
    return fixed[:36] + struct.pack("<I", crc) + b"bigblue" + b"containers" + body


def reason(data: bytes, limits: Limits | None = None) -> str:
    with pytest.raises(WireError) as info:
        decode_batch(data) if limits is None else decode_batch(data, limits)
    return info.value.reason


# ------------------------------------------------------------------ integer columns


@pytest.mark.parametrize(
    ("values", "width"),
    [
        ([0, 1, -1, 127, -128], 1),
        ([128, -129, 5], 2),
        ([32767, -32768], 2),
        ([32768, -5], 4),
        ([2**31 - 1, -(2**31)], 4),
        ([2**31, -5], 8),
        ([2**63 - 1, -(2**63), 0], 8),
        ([1_767_225_600_000 + 60_000 * i for i in range(50)], 4),  # as differences
        ([], 1),
    ],
)
def test_integer_columns_take_the_narrowest_width_and_come_back(
    values: list[int], width: int
) -> None:
    out = bytearray()
    wb.put_ints(out, values)
    assert 1 << (out[0] & 3) == width
    assert len(out) == 1 + (8 if out[0] & 0x20 else 0) + width * len(values)
    rd = wb.Reader(bytes(out))
    assert rd.ints(len(values), "test") == values
    assert rd.pos == rd.end


@FUZZ
@given(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=40), st.booleans())
def test_any_int64_column_round_trips(values: list[int], delta: bool) -> None:
    out = bytearray()
    wb.put_ints(out, values, delta=delta)
    assert wb.Reader(bytes(out)).ints(len(values), "test") == values


def test_an_integer_column_is_checked_against_the_body_and_its_range() -> None:
    out = bytearray()
    wb.put_ints(out, [1, 2, 300])
    with pytest.raises(WireError, match="overrun"):
        wb.Reader(bytes(out[:-1])).ints(3, "test")
    with pytest.raises(WireError, match="not in"):
        wb.Reader(bytes(out)).ints(3, "test", 0, 299)
    with pytest.raises(WireError, match="unknown column code"):
        wb.Reader(b"\x40" + bytes(out[1:])).ints(3, "test")
    # differences that add up past int64 are refused, not wrapped
    big = bytes([0x23]) + struct.pack("<qqq", 2**63 - 1, 0, 1)  # base, differences
    with pytest.raises(WireError, match="not in"):
        wb.Reader(big).ints(2, "test")


# ------------------------------------------------------------------ numbers in payloads


def readings(values: list[str], keys: int = 3, template: str = '{{"v":{}}}') -> list[WireRecord]:
    return [
        WireRecord(i + 1, f"c{i % keys}", 1_700_000_000_000 + i, "t", template.format(v).encode())
        for i, v in enumerate(values)
    ]


@pytest.mark.parametrize(
    "values",
    [
        ["-0.05", "0.05", "-12.34", "12.34", "0.00", "-99.99"],  # negatives, fixed decimals
        ["-5", "0", "7", "-123456789", "123456789012345678"],  # integers up to 18 digits
        ["4.2", "4.21", "4.0", "-0.5", "1767225599.804", "1767225599.8"],  # repr floats
        ["4.20", "4.2", "4", "4.200"],  # varying decimals, not reprs: stays text
        ["123456789012345.67", "-123456789012345.68", "0.01"],  # 17 digits, 2 decimals
        ["999999999999999.9", "-999999999999999.9"],  # 16 digits: past the float path
        ["99999999999999.99", "-99999999999999.99"],  # 16 digits
        ["0.000000000000000001", "-0.000000000000000001"],  # 18 decimals
        ["1234567890123456789", "12345678901234567890123", "1.5"],  # over 18 digits
        ["-0", "-0.0", "0", "0.0"],  # negative zero stays literal
        ["007", "1e5", "1.5.3", ".5", "5.", "NaN", "-", "+3", "0x1F"],  # not numbers
    ],
)
def test_numbers_of_every_kind_come_back_byte_for_byte(values: list[str]) -> None:
    records = readings(values * 4)
    data = round_trip(records)
    assert peek_header(data).flags & FLAG_TEMPLATED


def test_the_fast_float_rendering_is_the_reference_rendering() -> None:
    """b'%.{d}f' % (m / 10**d) must equal the digit-by-digit rendering for every
    mantissa under 10**15: the decoder uses it for all such columns."""
    rng = random.Random(11)
    edge = [0, 1, 5, 9, 10, 99, 10**14, 10**15 - 1, 2**49, 2**50 - 1, 999_999_999_999_995]
    mantissas = edge + [rng.randrange(10 ** rng.randint(1, 15)) for _ in range(20_000)]
    for d in range(1, 19):
        for m in mantissas:
            for v in (m, -m):
                assert b"%.*f" % (d, v / 10**d) == wb._render_fixed(v, d), (v, d)


@FUZZ
@given(
    st.lists(
        st.one_of(
            st.integers(-(10**18) + 1, 10**18 - 1).map(str),
            st.tuples(st.integers(-(10**15), 10**15), st.integers(0, 6)).map(
                lambda t: wb._render_fixed(*t).decode()
            ),
            st.floats(allow_nan=False, allow_infinity=False, width=64).map(repr),
            st.from_regex(r"-?[0-9]{1,20}(\.[0-9]{1,20})?", fullmatch=True),
        ),
        min_size=1,
        max_size=30,
    ),
    st.integers(1, 5),
)
def test_any_numbers_round_trip(values: list[str], keys: int) -> None:
    round_trip(readings(values * 2, keys, '{{"a":{0},"b":[{0},1]}}'))


def test_python_json_floats_travel_as_numbers_not_text() -> None:
    """json.dumps prints floats as their shortest repr (4.2, then 4.21): such a column is
    carried as integers and rendered back with repr, not stored as text."""
    rng = random.Random(2)
    records = []
    for i in range(1, 400):
        doc = {"ts": (1_700_000_000_000 + i * 997) / 1000, "t": round(rng.gauss(4, 2), 2)}
        records.append(
            WireRecord(i, f"c{i % 9}", 1_700_000_000_000 + i * 997, "t", json.dumps(doc).encode())
        )
    data = round_trip(records)
    assert wb._REPR in body_of(data)  # a column of kind repr exists ...
    text = encode_batch(
        batch_of(
            [
                WireRecord(r.seq, r.key, r.ts_ms, r.topic, r.payload.replace(b".", b". "))
                for r in records
            ]
        )
    )
    assert len(data) < len(text)


@pytest.mark.parametrize(
    "payloads",
    [
        [b""] * 10,
        [b"\x00\xff\x80 1.5 \xfe"] * 6 + [b"\x00\xff\x80 2.5 \xfe"] * 6,  # binary around numbers
        ["température 21.5 °C, humidité 40 %".encode()] * 8,  # non-ASCII, a % sign
        [b"%s %d %% %(x)s 12 %r"] * 8,  # format characters in the literal text
        [b"1", b"2", b"3", b"-4", b"5.5", b"6"] * 3,  # nothing but a number
        [b"a,1,2\nb,3,4\n", b"a,5,6\nb,7,8\n"] * 5,  # CSV
        [b"<r t='21.5'/>", b"<r t='-3.25'/>", b"<r t='0'/>"] * 4,  # XML
    ],
)
def test_payloads_that_are_not_json_round_trip(payloads: list[bytes]) -> None:
    records = [WireRecord(i + 1, "k", i, "t", p) for i, p in enumerate(payloads)]
    round_trip(records)


def test_non_ascii_keys_and_topics_round_trip() -> None:
    keys = ["conteneur-é", "容器-1", "😀", "", "k"]
    records = [
        WireRecord(i + 1, keys[i % 5], i * 1000, f"navire/{keys[i % 5]}/é", b'{"t":%d}' % i)
        for i in range(40)
    ]
    round_trip(records)


def test_many_keys_and_topics_use_wider_index_columns() -> None:
    """More than 127 and 32,767 pairs: the per-record index columns widen."""
    for n in (300, 33_000):
        records = [
            WireRecord(i + 1, f"k{i}", i, f"t/k{i}/env", b'{"v":%d.5}' % (i % 7)) for i in range(n)
        ]
        round_trip(records)


def test_time_jumps_both_ways_and_int64_extremes() -> None:
    times = [0, -(2**63), 2**63 - 1, 5, -5, 2**31, -(2**31) - 1, 1_767_225_600_000]
    records = [WireRecord(i + 1, "k", t, "t", b'{"ts":%d}' % t) for i, t in enumerate(times)]
    round_trip(records * 1)


def test_time_predicted_columns_with_every_exponent() -> None:
    """A payload's own timestamp in seconds, ms, us or minutes costs (almost) nothing."""
    for fmt in ("{s}", "{ms}", "{us}", "{s}.{ms3}", "{min}"):
        records = []
        for i in range(60):
            ms = 1_767_225_599_804 + i * 60_013
            text = fmt.format(
                s=ms // 1000, ms=ms, us=ms * 1000, ms3=f"{ms % 1000:03d}", min=ms // 60_000
            )
            records.append(
                WireRecord(i + 1, f"c{i % 4}", ms, "t", b'{"ts":%s,"x":1}' % text.encode())
            )
        round_trip(records)


def test_the_charged_rendering_is_the_fast_one() -> None:
    """A batch whose numbers could overrun what is left of the budget is rendered one
    number at a time, each charged first: same records, and the same limit decisions."""
    rng = random.Random(4)
    records = []
    for i in range(1, 200):
        t = round(rng.uniform(-30, 30), rng.choice([1, 2]))
        big = rng.randrange(10**17)
        payload = (
            f'{{"a":{t},"b":{rng.uniform(-30, 30):.2f},"c":{big},"d":{big}.25,"e":{i % 9 - 4}}}'
        )
        records.append(WireRecord(i, f"c{i % 5}", 1_700_000_000_000 + i, "t/x", payload.encode()))
    data = encode_batch(batch_of(records))
    decoded = sum(len(r.key.encode()) + len(r.topic.encode()) + len(r.payload) for r in records)
    exact = Limits(max_decompressed_bytes=decoded)
    assert decode_batch(data, exact).records == tuple(records)
    assert reason(data, Limits(max_decompressed_bytes=decoded - 1)) == "decompressed_too_large"


# ------------------------------------------------------------------ hostile bodies


def good_body() -> tuple[bytes, int]:
    records = [
        WireRecord(i + 1, f"c{i % 3}", 1_700_000_000_000 + i * 60_000, f"s/c{i % 3}/env",
                   b'{"ts":%d.000,"t":%d.25}' % (1_700_000_000 + i * 60, i))
        for i in range(12)
    ]  # fmt: skip
    return body_of(encode_batch(batch_of(records))), len(records)


def test_a_pair_no_record_uses_is_refused() -> None:
    """Unused dictionary entries would let a body allocate topics nobody pays for."""
    raw, count = good_body()
    data = decode_batch(forge_v2(raw, count=count, flags=FLAG_TEMPLATED))
    assert data.count == count
    # the same body claiming fewer records leaves pairs unused or columns short
    assert reason(forge_v2(raw, count=count - 1, flags=FLAG_TEMPLATED)) == "malformed"


def test_numbers_expanding_past_the_budget_are_refused() -> None:
    """Ten thousand 18-digit numbers from one small, highly compressible body."""
    n = 10_000
    records = [WireRecord(i + 1, "k", 0, "t", b"%d" % (10**17 + i)) for i in range(n)]
    data = encode_batch(batch_of(records))
    assert reason(data, Limits(max_decompressed_bytes=n * 19)) == "decompressed_too_large"
    assert len(decode_batch(data, Limits(max_decompressed_bytes=n * 20)).records) == n


@FUZZ
@given(st.data())
def test_edited_v2_bodies_only_ever_raise_wire_error(data: st.DataObject) -> None:
    raw, count = good_body()
    body = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(body) - 1))
        body[i] = data.draw(st.sampled_from([0, 1, 2, 0x7F, 0x80, 0xFF, 0x13, 0x33, body[i] ^ 1]))
    try:
        got = decode_batch(forge_v2(bytes(body), count=count, flags=FLAG_TEMPLATED))
    except WireError:
        return
    assert got.count == count


def test_a_payload_with_more_numbers_than_a_template_holds_keeps_the_rest_as_text() -> None:
    """A template has at most ``_MAX_SLOTS`` number slots (a decoder refuses more):
    the numbers after them stay in the template's literal text, and the payloads come
    back byte for byte."""
    head = wb._MAX_SLOTS

    def payload(i: int) -> bytes:
        return ",".join([*map(str, range(i, i + head)), *["7"] * 50]).encode()

    records = [WireRecord(i + 1, "c1", 1_700_000_000_000 + i, "t", payload(i)) for i in range(4)]
    data = round_trip(records)
    assert peek_header(data).flags & FLAG_TEMPLATED
    assert body_of(data).count(b",7" * 50) == 1  # the numbers past the slots: literal, once
