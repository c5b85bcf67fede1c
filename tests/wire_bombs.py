"""Hostile batch bodies built to make a decoder allocate as much as it can for the
bytes it is charged (the security review's finding H1): small zstd frames of
honest length whose columns a naive decoder turns into one Python object per byte.
Used by the decoder's cost tests and by ``bench/gateway_bomb.py``."""

from __future__ import annotations

import zstandard

from shorelink.wire import Body, frame_batch
from shorelink.wire_ais import FIELD_COLUMNS
from shorelink.wire_body import FLAG_TEMPLATED

TS = 1_700_000_000_000


def _u32(n: int) -> bytes:
    return n.to_bytes(4, "little")


def _head(count: int) -> bytes:
    """One key "k", one topic "t", one (key, topic) pair used by every record, and the
    records' times as a base plus zero steps (width 1, delta)."""
    b = bytearray()
    b += _u32(1) + b"\x00\x01" + b"k"  # one key
    b += _u32(1) + b"\x00\x01" + b"\x00\xff" + b"t"  # one topic pattern, no suffix
    b += _u32(1) + b"\x00\x00" + b"\x00\x00"  # one (key, topic) pair
    b += b"\x00" + bytes(count)  # the pair of each record: 0
    b += b"\x20" + TS.to_bytes(8, "little", signed=True) + bytes(count)  # times
    return bytes(b)


def number_columns(slots: int, count: int = 50_000) -> bytes:
    """The review's batch: one template of ``slots`` number slots around empty literals,
    every column width-1 zeros predicted by the record's time (each value a new int)."""
    b = bytearray(_head(count))
    b += _u32(1) + b"\x01" + slots.to_bytes(2, "little")  # one template, its slots
    b += b"\x00" + bytes(slots + 1)  # empty literal segments
    b += b"\x00" + bytes(count)  # the template of each record: 0
    b += (bytes((0, 0, 7, 0)) + b"\x00" + bytes(count)) * slots  # fixed, ts * 10**0
    return bytes(b)


def many_templates(
    n_templates: int, slots: int, *, text: bool = False, first: int | None = None
) -> bytes:
    """The security review's N1: one record per template, each template ``slots`` number
    slots (the first one ``first``, if given) around empty literals; number columns are
    width-1 zeros predicted by the record's time (13 digits each), text columns one
    byte "7"."""
    count = n_templates
    widths = [slots] * n_templates
    if first is not None:
        widths[0] = first
    b = bytearray(_head(count))
    b += _u32(n_templates) + b"\x01" + b"".join(s.to_bytes(2, "little") for s in widths)
    b += b"\x00" + bytes(sum(widths) + n_templates)  # empty literal segments
    b += b"\x20" + (-1).to_bytes(8, "little", signed=True) + b"\x01" * count  # 0, 1, 2, ...
    column = b"\x02\x00\x01" + b"7" if text else bytes((0, 0, 7, 0)) + b"\x00\x00"
    b += column * sum(widths)
    return bytes(b)


def segment_lengths(slots: int, count: int = 1) -> bytes:
    """One template of ``slots`` slots whose segment lengths are delta-coded from a
    large base (each a new int) before the segments overrun the body."""
    b = bytearray(_head(count))
    b += _u32(1) + b"\x03" + slots.to_bytes(8, "little")  # one template (width 8)
    b += b"\x20" + (2**40).to_bytes(8, "little") + bytes(slots + 1)
    return bytes(b)


def batch(
    raw: bytes,
    count: int,
    origin: str = "bomber",
    stream: str = "containers",
    flags: int = FLAG_TEMPLATED,
) -> bytes:
    """``raw`` (a templated body of ``count`` records, or as ``flags`` say) framed as a
    whole batch."""
    frame = zstandard.ZstdCompressor(level=19, write_content_size=True).compress(raw)
    body = Body(flags, 1, count, len(raw), frame, 0)
    return frame_batch(origin, stream, body, 1)


def int_column(n: int, width: int, *, delta: bool, planes: bool, fill: bytes) -> bytes:
    """An integer column of ``n`` values, ``width`` bytes each (1, 2, 4 or 8), from a
    large base when ``delta``, its bytes ``fill`` repeated (the decoder sees whatever
    values those bytes make)."""
    code = {1: 0, 2: 1, 4: 2, 8: 3}[width] | (0x10 if planes else 0) | (0x20 if delta else 0)
    base = TS.to_bytes(8, "little", signed=True) if delta else b""
    size = n * width
    data = (fill * (size // max(len(fill), 1) + 1))[:size] if fill else bytes(size)
    return bytes((code,)) + base + data


def templated(
    count: int, n_keys: int, slots: list[int], columns: list[tuple[int, int, int, bytes]]
) -> bytes:
    """A templated body of ``count`` records over ``n_keys`` keys and one template per
    entry of ``slots`` (record i: key i % n_keys, template i % len(slots)); each number
    slot's column is the next entry of ``columns`` (cycled): (kind 0 fixed, 1 repr or
    2 text; layout 0 plain or 1 runs; width; fill bytes), predicted by the records'
    times, differences from a large base. Well formed in its layout; the values are
    whatever the fill makes."""
    keys = [f"k{j}".encode() for j in range(n_keys)]
    b = bytearray()
    b += _u32(n_keys) + int_column(n_keys, 1, delta=False, planes=False, fill=b"")
    b[-n_keys:] = bytes(len(k) for k in keys)
    b += b"".join(keys)
    b += _u32(1) + b"\x00\x01" + b"\x00\xff" + b"t"  # one topic pattern, no suffix
    b += _u32(n_keys) + b"\x00" + bytes(range(n_keys)) + b"\x00" + bytes(n_keys)
    b += b"\x00" + bytes(i % n_keys for i in range(count))  # pair (= key) per record
    b += b"\x20" + TS.to_bytes(8, "little", signed=True) + bytes(count)  # times
    n_t = len(slots)
    b += _u32(n_t) + b"\x03" + b"".join(s.to_bytes(8, "little") for s in slots)
    b += b"\x00" + bytes(sum(slots) + n_t)  # empty literals
    b += b"\x00" + bytes(i % n_t for i in range(count))  # template per record
    at = 0
    for t, s in enumerate(slots):
        members = [i for i in range(count) if i % n_t == t]
        if not s or not members:
            continue
        runs = len({i % n_keys for i in members})
        for _ in range(s):
            kind, layout, width, fill = columns[at % len(columns)]
            at += 1
            size = len(members)
            if kind == 2:
                b += b"\x02" + b"\x00" + bytes([1]) * size + b"7" * size
                continue
            b += bytes((kind, 0, 7, layout))
            if layout:
                b += int_column(runs, width, delta=True, planes=False, fill=fill)
            b += int_column(size, width, delta=True, planes=width > 1, fill=fill)
    return bytes(b)


def ais_sentences(count: int, per_record: int) -> bytes:
    """An AIS body (shorelink/wire_ais.py) of ``count`` records of ``per_record``
    sentences each, all of one form (``!AIVDM,1,1,,,,0`` and a newline), its columns
    width-1 zeros: two bytes of body a sentence that renders to 17."""
    n = count * per_record
    b = bytearray(_head(count))
    b += b"\x00" + bytes([per_record]) * count  # sentences per record
    b += b"\x00"  # no literal records: no lengths
    b += _u32(1) + b"AIVDM"  # one head
    b += _u32(1) + bytes((0, 1, 1, 10, 0, 0, 0, 2, 1))  # one form, no checksum
    b += _u32(0) + b"\x00"  # no MMSIs
    b += b"\x00" + bytes(n)  # the form of each sentence: 0
    b += b"\x00" + bytes(n)  # the channel of each sentence: none
    b += bytes(len(FIELD_COLUMNS))  # every field column empty (no sentence has fields)
    return bytes(b)
