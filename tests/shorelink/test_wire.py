"""The batch wire format is the only thing a port gateway trusts from a ship: it must
round-trip every record exactly, and hostile or damaged bytes must end in a WireError,
never in wrong records, a crash or a memory blow-up."""

from __future__ import annotations

import contextlib
import json
import random
import struct
import tracemalloc
import zlib

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shorelink.errors import ShorelinkError
from shorelink.identity import NAME_RE
from shorelink.wire import (
    CONTENT_TYPE,
    DEFAULT_LIMITS,
    FLAG_TEMPLATED,
    MAX_SEQ,
    REASONS,
    Batch,
    Limits,
    WireError,
    WireRecord,
    decode_batch,
    encode_batch,
    peek_header,
)

FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
I64 = (-(2**63), 2**63 - 1)

# The header exactly as docs/wire-format.md lays it out, written independently of
# shorelink/wire.py so that a change to one without the other fails here.
DOC_FIXED = struct.Struct("<4sBBBBQIQIII")


def forge(
    raw: bytes = b"",
    *,
    compressed: bytes | None = None,
    magic: bytes = b"SLKB",
    version: int = 2,
    flags: int = 0,
    origin: bytes = b"bigblue",
    stream: bytes = b"containers",
    first_seq: int = 1,
    count: int = 1,
    first_available: int = 1,
    raw_len: int | None = None,
) -> bytes:
    """A batch with a correct CRC around any body: what a buggy or hostile ship sends."""
    body = zstandard.ZstdCompressor().compress(raw) if compressed is None else compressed
    fixed = DOC_FIXED.pack(
        magic, version, flags, len(origin), len(stream), first_seq, count, first_available,
        len(raw) if raw_len is None else raw_len, len(body), 0,
    )  # fmt: skip
    crc = zlib.crc32(fixed[:36] + origin + stream + body)
    return fixed[:36] + struct.pack("<I", crc) + origin + stream + body


def telemetry(containers: int, minutes: int, seed: int = 1) -> list[WireRecord]:
    """Container readings as the ship's sensors publish them, in arrival order."""
    rng = random.Random(seed)
    ids = [f"MSCU{rng.randrange(10**7):07d}" for _ in range(containers)]
    temp = {c: rng.uniform(-20, 30) for c in ids}
    out: list[tuple[int, str, bytes]] = []
    for minute in range(minutes):
        for n, c in enumerate(ids):
            ts = (
                1_767_225_600_000
                + minute * 60_000
                + n * 59_000 // containers
                + rng.randint(-99, 99)
            )
            temp[c] += rng.gauss(0, 0.05)
            door = "open" if rng.random() < 0.001 else "closed"
            payload = (
                f'{{"ts":{ts / 1000:.3f},"temperature":{temp[c]:.2f},"humidity":'
                f'{rng.uniform(60, 61):.1f},"door":"{door}","shock":{abs(rng.gauss(0, 0.02)):.2f},'
                f'"battery":{90 - minute * 0.01:.1f}}}'
            )
            out.append((ts, c, payload.encode()))
    return [
        WireRecord(i, c, ts, f"bigblue/deck{hash(c) % 9}/containers/{c}/env", p)
        for i, (ts, c, p) in enumerate(out, start=1)
    ]


def batch_of(records: list[WireRecord], first_available: int = 1) -> Batch:
    return Batch("bigblue", "containers", tuple(records), first_available)


GOOD = encode_batch(batch_of(telemetry(10, 3)))
GOOD_PLAIN = encode_batch(
    batch_of([WireRecord(i, f"k{i % 3}", i * 7, "t/x", bytes([i]) * i) for i in range(1, 30)])
)


def reason(data: bytes, limits: Limits = DEFAULT_LIMITS) -> str:
    with pytest.raises(WireError) as info:
        decode_batch(data, limits)
    return info.value.reason


# ------------------------------------------------------------------ round trips

number_text = st.one_of(
    st.from_regex(r"-?[0-9]{1,24}(\.[0-9]{1,20})?", fullmatch=True),
    st.sampled_from(["-0", "-0.0", "0.0", "007", "1e5", "1.5.3", ".5", "5.", "NaN", "-"]),
)
separators = st.sampled_from(['{"a":', ',"b":', "}", " ", ",", "[", "]", "x", ":", "\n", "é"])


@st.composite
def payloads_with_numbers(draw: st.DrawFn) -> list[bytes]:
    shapes = draw(st.lists(st.lists(separators, min_size=1, max_size=6), min_size=1, max_size=3))
    out = []
    for _ in range(draw(st.integers(1, 30))):
        shape = draw(st.sampled_from(shapes))
        parts = [s + draw(number_text) for s in shape]
        out.append("".join(parts).encode())
    return out


@st.composite
def batches(draw: st.DrawFn) -> Batch:
    n = draw(st.integers(1, 40))
    first = min(draw(st.one_of(st.integers(1, 1000), st.integers(1, MAX_SEQ))), MAX_SEQ - n + 1)
    key_pool = draw(st.lists(st.text(max_size=12), min_size=1, max_size=5))
    numeric = draw(st.booleans())
    numeric_payloads = draw(payloads_with_numbers()) if numeric else [b""]
    ts = draw(st.integers(*I64))
    records = []
    for i in range(n):
        key = draw(st.one_of(st.sampled_from(key_pool), st.text(max_size=12)))
        if draw(st.booleans()):
            topic = draw(st.text(max_size=8)) + key + draw(st.text(max_size=8))
        else:
            topic = draw(st.text(max_size=20))
        if draw(st.integers(0, 9)) == 0:
            ts = draw(st.integers(*I64))  # a large jump, either way
        else:
            ts = min(max(ts + draw(st.integers(-100_000, 100_000)), I64[0]), I64[1])
        if numeric:
            payload = numeric_payloads[i % len(numeric_payloads)]
        else:
            payload = draw(st.one_of(st.just(b""), st.binary(max_size=64)))
        records.append(WireRecord(first + i, key, ts, topic, payload))
    origin = draw(st.from_regex(NAME_RE, fullmatch=True))
    stream = draw(st.from_regex(NAME_RE, fullmatch=True))
    return Batch(origin, stream, tuple(records), draw(st.integers(1, first)))


@FUZZ
@given(batches())
def test_any_batch_round_trips_exactly(batch: Batch) -> None:
    """Unicode keys, empty and binary payloads, ts jumps both ways, seqs near 2**63:
    whatever the ship committed is what the gateway writes to Kafka."""
    data = encode_batch(batch)
    assert decode_batch(data) == batch
    h = peek_header(data)
    assert (h.origin, h.stream, h.first_seq, h.count, h.first_available) == (
        batch.origin, batch.stream, batch.first_seq, batch.count, batch.first_available,
    )  # fmt: skip
    assert (h.last_seq, h.total_len) == (batch.last_seq, len(data))


@FUZZ
@given(payloads_with_numbers(), st.integers(0, 19))
def test_numbers_lifted_out_of_payloads_come_back_byte_for_byte(
    payloads: list[bytes], level: int
) -> None:
    """The templated coding rewrites numbers as columns; "-0", "007", "1e5", 24-digit
    integers and trailing zeros must still come back exactly as the sensor wrote them."""
    records = [WireRecord(i + 1, f"c{i % 4}", i, "t", p) for i, p in enumerate(payloads * 3)]
    assert decode_batch(encode_batch(batch_of(records), level=level)).records == tuple(records)


def test_telemetry_uses_columns_and_random_bytes_do_not() -> None:
    """Container readings share a shape, so their numbers travel as columns; payloads
    with no shared shape are stored as they are (the templating would only cost)."""
    assert peek_header(GOOD).flags & FLAG_TEMPLATED
    rng = random.Random(3)
    noise = [WireRecord(i, "k", i, "t", rng.randbytes(40)) for i in range(1, 50)]
    data = encode_batch(batch_of(noise))
    assert not peek_header(data).flags & FLAG_TEMPLATED
    assert decode_batch(data).records == tuple(noise)


def test_python_style_json_with_varying_decimals_round_trips() -> None:
    """json.dumps of rounded floats prints 4.2 one minute and 4.21 the next; the column
    keeps each value's own decimals."""
    rng = random.Random(5)
    records = []
    for i in range(1, 300):
        ts = 1_700_000_000_000 + i * 8_571
        doc = {
            "ts": ts / 1000,
            "t": round(rng.gauss(4, 2), 2),
            "n": -round(rng.random(), 1),
            "count": rng.randrange(10**12),
            "serial": 10**25,  # too long for a column: stays in the template
        }
        records.append(WireRecord(i, f"c{i % 7}", ts, "t", json.dumps(doc).encode()))
    data = encode_batch(batch_of(records))
    assert peek_header(data).flags & FLAG_TEMPLATED
    assert decode_batch(data).records == tuple(records)


def test_telemetry_travels_in_under_8_percent_of_its_json_size() -> None:
    """The satellite and port links are paid or slow by the byte: a regression in the
    encoding shows here before it shows on the bill (bench/wire_size.py has the numbers)."""
    records = telemetry(200, 10)
    raw = sum(
        len(json.dumps({"origin": "bigblue", "stream": "containers", "seq": r.seq, "key": r.key,
                        "ts": r.ts_ms, "topic": r.topic, "payload": r.payload.decode()}))
        for r in records
    )  # fmt: skip
    assert len(encode_batch(batch_of(records))) / raw < 0.08


# ------------------------------------------------------------------ damage


@pytest.mark.parametrize("data", [GOOD, GOOD_PLAIN], ids=["templated", "plain"])
def test_no_single_byte_change_decodes_to_wrong_records(data: bytes) -> None:
    """A flipped bit on a flaky link must be refused (the ship resends), never written
    to Kafka as a different reading."""
    original = decode_batch(data)
    for i in range(len(data)):
        for flip in (0x01, 0x80, 0xFF):
            damaged = data[:i] + bytes([data[i] ^ flip]) + data[i + 1 :]
            try:
                got = decode_batch(damaged)
            except WireError:
                continue
            assert got == original, f"byte {i} ^ {flip:#x} decoded to other records"


@pytest.mark.parametrize("data", [GOOD, GOOD_PLAIN], ids=["templated", "plain"])
def test_every_truncation_is_reported_as_truncated(data: bytes) -> None:
    """A connection cut mid-upload gives a clear 'truncated', whatever the cut point."""
    for i in range(len(data)):
        assert reason(data[:i]) == "truncated", i
    assert reason(data + b"\0") == "malformed"


def test_a_damaged_body_fails_its_checksum() -> None:
    """Damage past the header is caught by the CRC before anything is decompressed."""
    assert reason(GOOD[:-3] + bytes([GOOD[-3] ^ 0x55]) + GOOD[-2:]) == "bad_checksum"


@FUZZ
@given(st.binary(max_size=300))
def test_random_bytes_only_ever_raise_wire_error(data: bytes) -> None:
    """Whatever reaches the gateway, the answer is a 4xx with a reason, not a 500."""
    for candidate in (data, b"SLKB\x01" + data, GOOD[:40] + data):
        with pytest.raises(WireError):
            decode_batch(candidate)
        with contextlib.suppress(WireError):
            peek_header(candidate)


@FUZZ
@given(st.binary(max_size=200), st.integers(1, 6), st.sampled_from([0, FLAG_TEMPLATED]))
def test_any_body_behind_a_valid_checksum_only_ever_raises_wire_error(
    raw: bytes, count: int, flags: int
) -> None:
    """A CRC is no authentication: a buggy ship can checksum garbage, and the body
    parser must refuse it cleanly too."""
    try:
        batch = decode_batch(forge(raw, count=count, flags=flags))
    except WireError:
        return
    assert batch.count == count


@FUZZ
@given(st.data())
def test_edited_real_bodies_behind_a_valid_checksum_only_ever_raise_wire_error(
    data: st.DataObject,
) -> None:
    """Near-valid bodies reach deep into the column parser, where an IndexError or a
    zero-length slice would otherwise hide."""
    source = data.draw(st.sampled_from([GOOD, GOOD_PLAIN]))
    h = peek_header(source)
    raw = bytearray(zstandard.ZstdDecompressor().decompress(source[h.header_len :]))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(raw) - 1))
        op = data.draw(st.sampled_from(["set", "insert", "delete"]))
        if op == "set":
            raw[i] = data.draw(st.integers(0, 255))
        elif op == "insert":
            raw.insert(i, data.draw(st.integers(0, 255)))
        elif len(raw) > 1:
            del raw[i]
    with contextlib.suppress(WireError):
        decode_batch(forge(bytes(raw), count=h.count, flags=h.flags))


# ------------------------------------------------------------------ hostile batches


def test_declared_decompressed_size_over_the_limit_is_refused_before_decompressing() -> None:
    """The header alone is enough to refuse a batch too big to unpack."""
    data = forge(b"x" * 100, raw_len=DEFAULT_LIMITS.max_decompressed_bytes + 1)
    assert reason(data) == "decompressed_too_large"
    with pytest.raises(WireError) as info:
        peek_header(data)
    assert info.value.reason == "decompressed_too_large"


@pytest.mark.parametrize("content_size", [True, False], ids=["frame-says-100MB", "frame-silent"])
def test_a_zstd_bomb_behind_a_lying_header_never_gets_unpacked(content_size: bool) -> None:
    """100 MB of zeros compress to a few KB; a header claiming 1 KB must not make the
    gateway allocate the 100 MB."""
    cctx = zstandard.ZstdCompressor(level=1, write_content_size=content_size)
    bomb = cctx.compress(b"\0" * 100_000_000)
    data = forge(compressed=bomb, raw_len=1000)
    tracemalloc.start()
    try:
        got = reason(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got == ("decompressed_too_large" if content_size else "malformed")
    assert peak < 5_000_000


def test_a_real_bomb_from_the_encoder_is_refused_by_declared_size() -> None:
    """An honest encoder of a huge payload says so in the header: refused at peek."""
    # two records, each within MAX_RECORD_BYTES, 2 MB together
    data = encode_batch(batch_of([WireRecord(i, "k", 1, "t", b"\0" * 1_000_000) for i in (1, 2)]))
    limits = Limits(max_decompressed_bytes=1_000_000)
    assert len(data) < 1_000
    with pytest.raises(WireError, match="decompressed_too_large"):
        peek_header(data, limits)
    assert reason(data, limits) == "decompressed_too_large"


def test_dictionary_reuse_cannot_expand_past_the_decoded_limit() -> None:
    """A 100 KB key sent once and referenced by 50 records is a 5 MB batch: the
    decoded-size cap counts what the records expand to, not the compressed body."""
    records = [WireRecord(i, "k" * 100_000, i, "t/k", b"") for i in range(1, 51)]
    data = encode_batch(batch_of(records))
    limits = Limits(max_decompressed_bytes=1_000_000)
    assert peek_header(data, limits).raw_len < 1_000_000
    assert reason(data, limits) == "decompressed_too_large"
    with pytest.raises(WireError, match="decompressed_too_large"):
        encode_batch(batch_of(records), limits=limits)


def test_limits_are_inclusive_and_the_encoder_agrees_with_the_decoder() -> None:
    """An uplink that sizes batches with encode_batch(limits=...) never sends one the
    gateway refuses, and loses nothing to an off-by-one."""
    batch = batch_of(telemetry(5, 4))
    data = encode_batch(batch)
    h = peek_header(data)
    decoded = sum(len(r.key) + len(r.topic) + len(r.payload) for r in batch.records)
    exact = Limits(h.count, len(data), max(h.raw_len, decoded))
    assert decode_batch(data, exact) == batch
    assert encode_batch(batch, limits=exact) == data
    for limits, why in [
        (Limits(h.count - 1, len(data), 10**8), "too_many_records"),
        (Limits(h.count, len(data) - 1, 10**8), "too_large"),
        (Limits(h.count, len(data), max(h.raw_len, decoded) - 1), "decompressed_too_large"),
    ]:
        assert reason(data, limits) == why
        with pytest.raises(WireError) as info:
            encode_batch(batch, limits=limits)
        assert info.value.reason == why


def test_count_beyond_the_limit_is_refused_from_the_header() -> None:
    """A header claiming four billion records is refused before any work is done."""
    assert reason(forge(b"\0", count=2**32 - 1)) == "too_many_records"


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"", "truncated"),
        (b"SL", "truncated"),
        (b"NOPE" + GOOD[4:], "bad_magic"),
        (b"{}", "bad_magic"),
        (GOOD[:4] + b"\x01" + GOOD[5:], "bad_version"),
        (GOOD[:4] + b"\x03" + GOOD[5:], "bad_version"),
        (b"SLKB\x01", "bad_version"),
        (b"SLKB\x03", "bad_version"),
        (forge(b"\0", flags=0x80), "bad_version"),
        (forge(b"\0", origin=b"Big Blue"), "bad_name"),
        (forge(b"\0", stream=b""), "bad_name"),
        (forge(b"\0", origin=b"\xff\xfe"), "bad_name"),
        (forge(b"\0", first_seq=0), "bad_seq_range"),
        (forge(b"\0", count=0), "bad_seq_range"),
        (forge(b"\0", first_seq=MAX_SEQ, count=2), "bad_seq_range"),
        (forge(b"\0", first_seq=5, first_available=6), "bad_seq_range"),
        (forge(b"\0", first_available=0), "bad_seq_range"),
        (forge(b"not zstd at all", compressed=b"not zstd at all"), "malformed"),
        (forge(b"\0\0\0\0\0"), "malformed"),
    ],
)
def test_hostile_headers_get_the_right_reason(data: bytes, why: str) -> None:
    """The reason becomes the gateway's error code and metric label: operators act on it."""
    assert reason(data) == why


@pytest.mark.parametrize(
    ("seqs", "first_available"),
    [
        ([], 1),
        ([1, 2, 4], 1),
        ([3, 2, 1], 1),
        ([1, 1], 1),
        ([0, 1], 1),
        ([5, 6], 6),
        ([5, 6], 0),
        ([MAX_SEQ, MAX_SEQ + 1], 1),
    ],
)
def test_encoder_refuses_batches_that_break_the_seq_rules(
    seqs: list[int], first_available: int
) -> None:
    """Seqs are gapless per (origin, stream): a batch with a hole or a step back would
    make the site record a range it does not hold."""
    records = [WireRecord(s, "k", 0, "t", b"") for s in seqs]
    with pytest.raises(WireError) as info:
        encode_batch(batch_of(records, first_available))
    assert info.value.reason == "bad_seq_range"


@pytest.mark.parametrize(
    ("origin", "stream"), [("Big Blue", "nav"), ("bigblue", "nav/x"), ("", "nav")]
)
def test_encoder_refuses_bad_names(origin: str, stream: str) -> None:
    """Names end up in Kafka topic names and URLs; a bad one is a ship config bug."""
    with pytest.raises(WireError) as info:
        encode_batch(Batch(origin, stream, (WireRecord(1, "k", 0, "t", b""),)))
    assert info.value.reason == "bad_name"


def test_encoder_refuses_values_the_format_cannot_carry() -> None:
    """ts outside int64 or a key that is not valid unicode would not survive the trip."""
    for rec in [WireRecord(1, "k", 2**63, "t", b""), WireRecord(1, "\ud800", 0, "t", b"")]:
        with pytest.raises(WireError) as info:
            encode_batch(batch_of([rec]))
        assert info.value.reason == "malformed"


# ------------------------------------------------------------------ the contract


def test_header_layout_is_the_documented_one() -> None:
    """The gateway and the ship may be built years apart: the bytes are the contract."""
    batch = batch_of(telemetry(3, 2), first_available=1)
    data = encode_batch(batch)
    magic, version, flags, olen, slen, first, count, avail, raw_len, clen, crc = (
        DOC_FIXED.unpack_from(data)
    )
    assert (magic, version, olen, slen) == (b"SLKB", 2, 7, 10)
    assert (first, count, avail) == (1, 6, 1)
    assert data[40:57] == b"bigblue" + b"containers"
    assert clen == len(data) - 57
    assert crc == zlib.crc32(data[:36] + data[40:])
    assert len(zstandard.ZstdDecompressor().decompress(data[57:])) == raw_len
    assert forge(compressed=data[57:], raw_len=raw_len, flags=flags, count=6) == data


def test_peek_header_reads_a_prefix_when_asked() -> None:
    """A gateway can decide on the first bytes of a long upload (origin, size) before
    the rest has arrived."""
    h = peek_header(GOOD[:60], complete=False)
    assert h.total_len == len(GOOD) and h.origin == "bigblue"
    with pytest.raises(WireError, match="truncated"):
        peek_header(GOOD[:60])


def test_wire_error_is_a_non_retryable_shorelink_error() -> None:
    """Resending the same bytes cannot help: the uplink must not retry them forever."""
    err = WireError("bad_magic", "x")
    assert isinstance(err, ShorelinkError) and not err.retryable and err.reason == "bad_magic"
    assert {"truncated", "malformed"} <= REASONS
    with pytest.raises(ValueError, match="unknown wire error reason"):
        WireError("oops", "x")
    assert CONTENT_TYPE == "application/x-shorelink-batch"


def test_batch_takes_any_sequence_and_reports_its_range() -> None:
    """Callers build records in lists; the batch is immutable all the same."""
    b = Batch("bigblue", "nav", [WireRecord(s, "position", s, "t", b"") for s in (7, 8, 9)])  # type: ignore[arg-type]
    assert isinstance(b.records, tuple)
    assert (b.first_seq, b.last_seq, b.count) == (7, 9, 3)
    with pytest.raises(WireError, match="bad_seq_range"):
        _ = Batch("bigblue", "nav", ()).first_seq


GOLDEN_V1 = bytes.fromhex(
    "534c4b420101070a2900000000000000040000002900000000000000a1000000aa00000050fa5ebd62696762"
    "6c7565636f6e7461696e65727328b52ffd20a1090500020b4d5343553132333435363508706f736974696f6e"
    "00000201020119626967626c75652f6465636b332f636f6e7461696e6572732f042f656e76000b626967626c"
    "75652f6e617601000200f89cd5edee66a4a9079ba60788d00e0202067b227473223a0f2c2274656d70657261"
    "74757265223a112c22646f6f72223a22636c6f736564227d0002c3a900000100010003030303000000000202"
    "0201ca0603a907"
)


GOLDEN_V2 = bytes.fromhex(
    "534c4b420201070a2900000000000000040000002900000000000000cb000000b4000000ec3010cf62696762"
    "6c7565636f6e7461696e65727328b52ffd20cb5d0500740802000b084d53435531323334353635706f736974"
    "696f6e190b0004ff626967626c75652f6465636b332f636f6e7461696e6572732f2f656e766e61760001133c"
    "8e0004a791a87cdadbdadc769b010002060f11027b227473223a2c2274656d7065726174757265646f6f7222"
    "3a22636c6f736564227dc3a9030702000111a5011100fe2b00fffe0e08f006e7016e204e065c65da283b8081"
    "04bc707527d081abd221a07c7bca00c002"
)


def golden_batch() -> Batch:
    topic = "bigblue/deck3/containers/MSCU1234565/env"

    def reading(seq: int, ts: int, temp: str) -> WireRecord:
        payload = f'{{"ts":{ts // 1000}.{ts % 1000:03d},"temperature":{temp},"door":"closed"}}'
        return WireRecord(seq, "MSCU1234565", ts, topic, payload.encode())

    return Batch(
        "bigblue",
        "containers",
        (
            reading(41, 1767225599804, "4.21"),
            reading(42, 1767225659790, "4.19"),
            WireRecord(43, "position", 1767225600000, "bigblue/nav", "é".encode()),
            reading(44, 1767225719812, "-0.5"),
        ),
        first_available=41,
    )


def test_a_frozen_v2_batch_still_decodes() -> None:
    """Ships at sea run old software for months: every gateway release must read the v2
    bytes they send, templated columns included."""
    assert peek_header(GOLDEN_V2).flags == FLAG_TEMPLATED
    assert peek_header(GOLDEN_V2).version == 2
    assert decode_batch(GOLDEN_V2) == golden_batch()


def test_a_v1_batch_is_refused_by_version() -> None:
    """No ship ever sent v1 (none was deployed before v2), so the gateway reads only v2
    and says so, before looking at anything past the version byte."""
    assert GOLDEN_V1[4] == 1
    for data in (GOLDEN_V1, GOLDEN_V1[:5], GOLDEN_V1[:40]):
        assert reason(data) == "bad_version"
        with pytest.raises(WireError) as info:
            peek_header(data, complete=False)
        assert info.value.reason == "bad_version"
