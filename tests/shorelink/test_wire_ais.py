"""AIS sentences coded as fields (shorelink/wire_ais.py): the satellite's bytes for a
ship's AIS stream, without ever changing a record. Whatever a payload is (sentences
that render back exactly, sentences that almost do, text, bytes), the batch decodes to
the same bytes; a hostile AIS body costs a gateway no more than the bound it is charged
for; a gateway from before the coding refuses it cleanly."""

from __future__ import annotations

import contextlib
from functools import reduce
from operator import xor
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shorelink import wire
from shorelink.wire import (
    FLAG_AIS,
    FLAG_TEMPLATED,
    Batch,
    WireError,
    WireRecord,
    decode_batch,
    encode_batch,
    peek_header,
)
from shorelink.wire_ais import MAX_CHARS, MIN_RECORDS, parse_record, render_record
from tests import wire_bombs
from tests.bounds import FAST, measured
from tests.shorelink.test_wire_cost import _peak_within_bound
from tests.strategies import any_bytes, any_text, mutated

SAMPLE = Path(__file__).resolve().parents[2] / "fleet_sim" / "data" / "nmea_data_sample.txt"
T0 = 1_767_225_600_000
#: message type -> the data field's bit lengths it comes in (ITU-R M.1371-5; the
#: binary and safety messages from their shortest to a long one)
LENGTHS = {
    1: [168], 2: [168], 3: [168], 4: [168], 5: [424], 6: [88, 424, 1008], 7: [72, 168],
    8: [56, 1008], 9: [168], 10: [72], 11: [168], 12: [72, 1008], 13: [72, 168],
    14: [40, 1008], 15: [88, 160], 16: [96, 144], 17: [80, 816], 18: [168], 19: [312],
    20: [72, 160], 21: [272, 360], 22: [168], 23: [160], 24: [160, 168], 25: [40, 168],
    26: [60, 1064], 27: [96],
}  # fmt: skip
ARMOR = bytes(list(range(48, 88)) + list(range(96, 120)))


def checksum(body: bytes) -> int:
    return reduce(xor, body, 0)


def sentence(
    head: bytes, total: int, num: int, seqid: bytes, channel: bytes, data: bytes,
    fill: int, check: str,
) -> bytes:  # fmt: skip
    body = b"%s,%d,%d,%s,%s,%s,%d" % (head, total, num, seqid, channel, data, fill)
    tail = {"upper": b"*%02X", "lower": b"*%02x", "none": b""}[check]
    return b"!" + body + (tail % checksum(body) if tail else b"")


@st.composite
def messages(draw: st.DrawFn) -> bytes:
    """One AIS message as the sentences a receiver or a ship's transponder gives: any
    type at its bit lengths (or any length), its bits at random, split over 1-9
    fragments, fill bits 0-5, either channel or none, a sequential id for multipart,
    checksums upper, lower or missing, LF or CRLF between the sentences and after the
    last, or nothing."""
    kind = draw(st.integers(0, 63))
    nbits = draw(st.sampled_from(LENGTHS.get(kind, [6])) | st.integers(0, 6 * MAX_CHARS))
    bits = (kind << max(nbits - 6, 0) if nbits >= 6 else 0) | draw(
        st.integers(0, (1 << max(nbits - 6, 0)) - 1)
    )
    chars = -(-nbits // 6)
    data = bytes(ARMOR[(bits << (6 * chars - nbits) >> (6 * (chars - 1 - i))) & 63]
                 for i in range(chars))  # fmt: skip
    total = draw(st.integers(1, 9))
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), min_size=total - 1, max_size=total - 1)))
    parts = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    head = draw(st.sampled_from([b"AIVDM", b"AIVDO", b"BSVDM", b"ABVDO"]))
    seqid = draw(st.sampled_from([b""] + [b"%d" % i for i in range(10)])) if total > 1 else b""
    channel = draw(st.sampled_from([b"A", b"B", b"1", b"2", b""]))
    check = draw(st.sampled_from(["upper", "lower", "none"]))
    sep = draw(st.sampled_from([b"\r\n", b"\n"]))
    fills = [draw(st.integers(0, 5)) for _ in parts]
    out = [
        sentence(head, total, i + 1, seqid, channel, part, fill, check)
        for i, (part, fill) in enumerate(zip(parts, fills, strict=True))
    ]
    return sep.join(out) + draw(st.sampled_from([b"", sep]))


def batch_of(payloads: list[bytes]) -> Batch:
    return Batch(
        "bigblue",
        "nav",
        tuple(
            WireRecord(i + 1, "ais", T0 + 3000 * i, "bigblue/ship1/nav/ais", p)
            for i, p in enumerate(payloads)
        ),
    )


#: a few real sentences: a batch of fewer than MIN_RECORDS records goes as text
PAD = SAMPLE.read_bytes().splitlines(keepends=True)[:MIN_RECORDS]


def round_trip(payloads: list[bytes]) -> int:
    """Encode and decode the payloads as one batch (after a few real sentences); the
    header's flags."""
    batch = batch_of(PAD + payloads)
    data = encode_batch(batch, level=1)
    assert decode_batch(data) == batch
    return peek_header(data).flags


@FAST
@given(st.lists(messages(), min_size=1, max_size=12))
def test_valid_sentences_of_every_type_are_coded_as_fields_and_come_back_exact(
    payloads: list[bytes],
) -> None:
    """What a receiver sends (types 1-27 at their lengths, multipart, every framing a
    device writes) is what the coding must take: every such record is taken, and
    comes back byte for byte."""
    for p in payloads:
        assert parse_record(p) is not None, p
        assert render_record(parse_record(p) or []) == p
    assert round_trip(payloads) & FLAG_AIS


@FAST
@given(st.lists(messages(), min_size=1, max_size=8), st.lists(any_bytes(200), max_size=8))
def test_any_bytes_beside_sentences_come_back_exact(
    sentences: list[bytes], others: list[bytes]
) -> None:
    flags = round_trip(sentences + others)
    assert bool(flags & FLAG_AIS) == (MIN_RECORDS + len(sentences) >= len(others))


@FAST
@given(st.lists(messages(), min_size=1, max_size=6), st.lists(any_text(120), max_size=6))
def test_any_text_beside_sentences_comes_back_exact(
    sentences: list[bytes], texts: list[str]
) -> None:
    """Text of every Unicode category (controls, odd whitespace, line breaks) as a
    record of its own and glued to a sentence."""
    glued = [s + t.encode("utf-8", "surrogatepass") for s, t in zip(sentences, texts, strict=False)]
    round_trip(sentences + glued + [t.encode("utf-8", "surrogatepass") for t in texts])


@FAST
@given(st.data())
def test_sentences_that_almost_render_back_go_literally_and_come_back_exact(
    data: st.DataObject,
) -> None:
    """A bad checksum, a character out of the armor, a space, a missing field, a stray
    CR: such a record is not taken as sentences, and is never changed."""
    good = data.draw(st.lists(messages(), min_size=2, max_size=6))
    bad = [data.draw(mutated(p)) for p in good]
    for p in bad:
        parsed = parse_record(p)
        assert parsed is None or render_record(parsed) == p
    round_trip(good + bad)


def test_a_bad_checksum_is_sent_as_it_came() -> None:
    good = sentence(b"AIVDM", 1, 1, b"", b"A", b"13RlIW?04F1beOVEFLB9bRvH0L0L", 0, "upper")
    bad = good[:-2] + (b"00" if good[-2:] != b"00" else b"01")
    assert parse_record(good) is not None and parse_record(bad) is None
    assert parse_record(good + b" ") is None and parse_record(b" " + good) is None
    assert round_trip([good, bad, good]) & FLAG_AIS


def sample_payloads() -> list[bytes]:
    return SAMPLE.read_bytes().splitlines(keepends=True)


def test_the_real_sample_is_coded_as_fields_exactly_and_smaller() -> None:
    """The 898 sentences of fleet_sim's sample (CRLF kept) in the satellite's batches
    of 200: each batch coded as fields, decoded byte for byte, and fewer bytes than the
    same batch coded as text (bench/wire_size.py has the figures)."""
    lines = sample_payloads()
    assert len(lines) == 898
    fields = text = 0
    for lo in range(0, len(lines), 200):
        batch = batch_of(lines[lo : lo + 200])
        data = encode_batch(batch)
        assert peek_header(data).flags & FLAG_AIS
        assert decode_batch(data) == batch
        fields += len(data)
        plain = encode_batch(batch, ais=False)
        assert not peek_header(plain).flags & FLAG_AIS
        text += len(plain)
    assert fields < 0.9 * text


def test_a_batch_of_a_few_records_goes_as_text() -> None:
    """One record a batch (a satellite session's one since the last) is smaller as text:
    the fields' columns cost a few bytes each whatever they hold."""
    lines = sample_payloads()
    for n in (1, MIN_RECORDS - 1):
        data = encode_batch(batch_of(lines[:n]))
        assert not peek_header(data).flags & FLAG_AIS
        assert decode_batch(data) == batch_of(lines[:n])
    assert peek_header(encode_batch(batch_of(lines[:MIN_RECORDS]))).flags & FLAG_AIS


def test_a_record_of_many_sentences_comes_back_exact() -> None:
    """A record may carry several sentences (a receiver's burst); past MAX_SENTENCES it
    goes literally."""
    lines = sample_payloads()
    assert round_trip([b"".join(lines[:64]), b"".join(lines[64:65]), b"".join(lines)]) & FLAG_AIS


def test_a_gateway_from_before_the_coding_refuses_it_as_bad_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A gateway that does not know FLAG_AIS (its flags were those of 0x07) refuses the
    batch with bad_version before decompressing, as it did for FLAG_DICTIONARY; a ship
    told not to code AIS (``ais=False``) is read by it."""
    batch = batch_of(sample_payloads()[:200])
    coded, plain = encode_batch(batch), encode_batch(batch, ais=False)
    monkeypatch.setattr(wire, "_KNOWN_FLAGS", wire._KNOWN_FLAGS & ~FLAG_AIS)
    for call in (peek_header, decode_batch):
        with pytest.raises(WireError) as info:
            call(coded)
        assert info.value.reason == "bad_version"
    assert decode_batch(plain) == batch


def _within_bound(data: bytes) -> str:
    """Decode ``data`` measured against ``decode_cost_bound`` (test_wire_cost.py)."""
    return _peak_within_bound(data)[0]


def test_many_short_sentences_cost_at_most_their_bound() -> None:
    """Two bytes of body a sentence that renders to 17: a thousand records of 64 decode
    a stretch at a time; fifty thousand are refused before a sentence is built."""
    small = wire_bombs.batch(wire_bombs.ais_sentences(1000, 64), 1000, flags=FLAG_AIS)
    assert _within_bound(small) == "ok"
    big = wire_bombs.batch(wire_bombs.ais_sentences(50_000, 64), 50_000, flags=FLAG_AIS)
    with measured() as m:
        assert _within_bound(big) == "decompressed_too_large"
    assert m.cpu_s < 1


HEAD = wire_bombs._head(6)


@FAST
@given(any_bytes(600), st.integers(0, 1))
def test_any_ais_body_only_ever_raises_wire_error_within_its_bound(raw: bytes, both: int) -> None:
    """Arbitrary bytes as the AIS section (after honest keys and times), under a valid
    checksum; with the templated flag too, refused."""
    flags = FLAG_AIS | (FLAG_TEMPLATED if both else 0)
    outcome = _within_bound(wire_bombs.batch(HEAD + raw, 6, flags=flags))
    assert outcome != "ok" or not both


@FAST
@given(st.data())
def test_edited_real_ais_bodies_only_ever_raise_wire_error_within_their_bound(
    data: st.DataObject,
) -> None:
    """A real body (the encoder's, eight sentences), bytes of it edited: every count,
    form, index and difference a decoder meets wrong in turn."""
    from shorelink.wire_ais import AIS
    from shorelink.wire_body import build_body

    flags, raw, _ = build_body(batch_of(sample_payloads()[:MIN_RECORDS]).records, AIS)
    assert flags == FLAG_AIS
    edited = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(len(HEAD) - 20, len(raw) - 1))
        edited[at] = data.draw(st.integers(0, 255))
    with contextlib.suppress(WireError):
        _within_bound(wire_bombs.batch(bytes(edited), MIN_RECORDS, flags=FLAG_AIS))
