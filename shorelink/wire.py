"""The batch wire format: how a ship's uplink hands records to a port gateway.

One batch carries a contiguous run of seqs of one ``(origin, stream)``. Layout, columns,
limits and versioning are specified in ``docs/wire-format.md``; in short: a fixed
little-endian header (magic, version, flags, seq range, lengths, CRC32 over header and
body) and the two names, then one zstd frame holding a columnar body.

Decoding is built for hostile input: every length is checked against the limits and the
bytes that remain before anything is allocated or decompressed, the zstd frame must
declare exactly the raw length of the header, and nothing but :class:`WireError` ever
escapes :func:`decode_batch` or :func:`peek_header`.

A body may be compressed with a stream's trained dictionary (shorelink/wire_dict.py):
the header says so (``FLAG_DICTIONARY``) and names it by id; a decoder given the
dictionaries it holds decodes it under the same bounds, and refuses one it does not hold
as ``unknown_dictionary``.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import attrgetter
from typing import Any

import zstandard

from shorelink.boundary import boundary
from shorelink.contract import MAX_RECORD_BYTES, oversized_record, record_bytes
from shorelink.errors import ContractError
from shorelink.identity import check_name
from shorelink.proof import CHUNK_RECORDS, SIGNATURE_BYTES, ShipKey, leaves_of, sign_records
from shorelink.wire_ais import AIS, FLAG_AIS
from shorelink.wire_body import (
    FLAG_TEMPLATED,
    I64_MAX,
    I64_MIN,
    REASONS,
    WireError,
    WireRecord,
    build_body,
    parse_columns,
)
from shorelink.wire_dict import Dictionaries, Dictionary

__all__ = [
    "CONTENT_TYPE",
    "DEFAULT_LIMITS",
    "FLAG_AIS",
    "FLAG_DICTIONARY",
    "FLAG_SIGNED",
    "FLAG_TEMPLATED",
    "MAGIC",
    "MAX_SEQ",
    "REASONS",
    "VERSION",
    "Batch",
    "Body",
    "Header",
    "Limits",
    "WireError",
    "WireRecord",
    "decode_batch",
    "decode_columns",
    "decode_cost_bound",
    "dictionary_of",
    "encode_batch",
    "encode_body",
    "frame_batch",
    "peek_header",
]

CONTENT_TYPE = "application/x-shorelink-batch"
_SIZED = ("key", "topic", "payload")
MAGIC = b"SLKB"
VERSION = 2
#: flag bit 1: the ship's chunk signatures follow the names (shorelink/proof.py)
FLAG_SIGNED = 0x02
#: flag bit 2: the body was compressed with the dictionary whose id (u32) follows the
#: names (shorelink/wire_dict.py)
FLAG_DICTIONARY = 0x04
#: flag bit 3: the payloads are AIS sentences coded as fields (shorelink/wire_ais.py)
_KNOWN_FLAGS = FLAG_TEMPLATED | FLAG_SIGNED | FLAG_DICTIONARY | FLAG_AIS
_DICT_ID = struct.Struct("<I")

MAX_SEQ = 2**63 - 1
_U32 = 2**32 - 1
#: magic, version, flags, origin_len, stream_len, first_seq, count, first_available,
#: raw_len, compressed_len, crc32. The names follow; the CRC field is at byte 36.
_FIXED = struct.Struct("<4sBBBBQIQIII")
_CRC_AT = 36
_MAX_WINDOW = 1 << 27  # zstd's own default cap on the window a decoder accepts
_SEQ = attrgetter("seq")
_TS = attrgetter("ts_ms")


@dataclass(frozen=True)
class Batch:
    """Contiguous ascending seqs of one ``(origin, stream)``, at least one record.

    ``first_available`` is the lowest seq the ship still holds for this stream: a site
    may stop waiting for seqs below it (the ship dropped them by policy). It is never
    above ``first_seq``. :func:`encode_batch` checks all of this.
    """

    origin: str
    stream: str
    records: tuple[WireRecord, ...]
    first_available: int = 1
    #: the ship's chunk signatures, as the batch came (``FLAG_SIGNED``; empty: unsigned)
    signatures: bytes = b""

    def __post_init__(self) -> None:
        if not isinstance(self.records, tuple):
            object.__setattr__(self, "records", tuple(self.records))

    @classmethod
    def from_columns(
        cls,
        origin: str,
        stream: str,
        first_seq: int,
        first_available: int,
        columns: Sequence[Sequence[Any]],
        signatures: bytes = b"",
    ) -> Batch:
        """The batch of records ``first_seq`` on whose keys, event times, topics and
        payloads are ``columns`` (what :func:`decode_columns` returns)."""
        keys, times, topics, payloads = columns
        seqs = range(first_seq, first_seq + len(keys))
        return cls(
            origin,
            stream,
            tuple(map(WireRecord, seqs, keys, times, topics, payloads)),
            first_available,
            signatures,
        )

    @property
    def first_seq(self) -> int:
        if not self.records:
            raise WireError("bad_seq_range", "a batch holds at least one record")
        return self.records[0].seq

    @property
    def last_seq(self) -> int:
        if not self.records:
            raise WireError("bad_seq_range", "a batch holds at least one record")
        return self.records[-1].seq

    @property
    def count(self) -> int:
        return len(self.records)

    @property
    def decoded_size(self) -> int:
        """Key, topic and payload lengths over the records: about what a decoder charged
        for them (keys and topics counted in characters)."""
        return sum(sum(map(len, map(attrgetter(f), self.records))) for f in _SIZED)


@dataclass(frozen=True)
class Limits:
    """What a decoder accepts. ``max_compressed_bytes`` bounds the whole encoded batch
    (header included); ``max_decompressed_bytes`` bounds both the zstd output and the
    decoded records (sum of key, topic and payload bytes)."""

    max_records: int = 50_000
    max_compressed_bytes: int = 8 * 1024 * 1024
    max_decompressed_bytes: int = 64 * 1024 * 1024

    def __post_init__(self) -> None:
        for name in ("max_records", "max_compressed_bytes", "max_decompressed_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or not 1 <= value <= _U32:
                raise ValueError(f"Limits.{name} must be an int in 1..{_U32}, not {value!r}")


DEFAULT_LIMITS = Limits()

#: What decoding one batch may allocate at its peak, besides the decoded records' own
#: bytes (keys, topics, payloads: what the decoder charges to its budget): a multiple of
#: the bytes it arrived as and decompressed to, a cost per record (the columns and
#: objects every record needs) and a fixed working set (a stretch of numbers decoded at
#: once). Asserted on hostile bodies by tests/shorelink/test_wire_cost.py, stated in
#: docs/wire-format.md ("What decoding costs").
DECODE_BYTES_FACTOR = 2
DECODE_RECORD_BYTES = 320
DECODE_WORKING_BYTES = 8 * 1024 * 1024


def decode_cost_bound(batch_len: int, raw_len: int, count: int, decoded: int) -> int:
    """The most decoding a batch of ``batch_len`` bytes, ``raw_len`` decompressed and
    ``count`` records whose records decode to ``decoded`` bytes may allocate."""
    return (
        decoded
        + DECODE_BYTES_FACTOR * (batch_len + raw_len)
        + DECODE_RECORD_BYTES * count
        + DECODE_WORKING_BYTES
    )


@dataclass(frozen=True, slots=True)
class Header:
    """What :func:`peek_header` reads without decompressing."""

    version: int
    flags: int
    origin: str
    stream: str
    first_seq: int
    count: int
    first_available: int
    raw_len: int
    compressed_len: int
    crc32: int
    header_len: int
    #: the chunks' signatures (``FLAG_SIGNED``), else empty
    signatures: bytes = b""
    #: the dictionary the body was compressed with (``FLAG_DICTIONARY``), else 0
    dict_id: int = 0

    @property
    def last_seq(self) -> int:
        return self.first_seq + self.count - 1

    @property
    def total_len(self) -> int:
        """Bytes of the whole encoded batch."""
        return self.header_len + self.compressed_len


# --------------------------------------------------------------------------- encode


def encode_batch(
    batch: Batch,
    *,
    level: int = 12,
    limits: Limits | None = None,
    key: ShipKey | None = None,
    dictionary: Dictionary | None = None,
    ais: bool = True,
) -> bytes:
    """Encode ``batch``; raise :class:`WireError` if it breaks the seq-range or name
    rules, or (when ``limits`` is given) if a decoder with those limits would refuse it.
    With ``key`` (the ship's), the batch carries its chunks' signatures; with
    ``dictionary``, its body is compressed with it (and names it); with ``ais`` (the
    default), records of AIS sentences are coded as fields where they are most of the
    batch (``FLAG_AIS``: a gateway from before it refuses such a batch as
    ``bad_version``)."""
    origin = _encode_name("origin", batch.origin)
    stream = _encode_name("stream", batch.stream)
    body = encode_body(
        batch.records,
        first_available=batch.first_available,
        level=level,
        signer=None if key is None else (key, batch.origin, batch.stream),
        dictionary=dictionary,
        ais=ais,
    )
    data = _frame(origin, stream, body, batch.first_available)
    if limits is not None:
        _check_limits(body.count, len(data), body.raw_len, body.decoded_len, limits)
    return data


@dataclass(frozen=True, slots=True)
class Body:
    """A batch's compressed body without its header: records encoded once can be framed
    later with the ``first_available`` of the moment (the edge agent's sealed segments,
    ``docs/wire-format.md``: "Framing a body again")."""

    flags: int
    first_seq: int
    count: int
    raw_len: int
    #: the zstd frame
    data: bytes
    #: key + topic + payload bytes of the records (what a decoder charges to its budget)
    decoded_len: int
    #: the ship's signature of each chunk of the records, concatenated (``FLAG_SIGNED``)
    signatures: bytes = b""
    #: the dictionary ``data`` was compressed with (``FLAG_DICTIONARY``), else 0
    dict_id: int = 0


def encode_body(
    records: tuple[WireRecord, ...],
    *,
    first_available: int = 1,
    level: int = 12,
    signer: tuple[ShipKey, str, str] | None = None,
    dictionary: Dictionary | None = None,
    ais: bool = True,
) -> Body:
    """The compressed body of ``records`` (contiguous ascending seqs, checked). With
    ``signer`` (the ship's key, origin and stream), signed chunk by chunk; with
    ``dictionary``, compressed with it; with ``ais``, AIS sentences coded as fields
    where they are most of the records."""
    _check_records(records, first_available)
    flags, raw, decoded_size = build_body(records, AIS if ais else None)
    if len(raw) > _U32:
        raise WireError("too_large", f"body of {len(raw)} bytes does not fit the format")
    dict_id = 0
    if dictionary is None:
        cctx = zstandard.ZstdCompressor(level=level, write_content_size=True, write_checksum=False)
    else:
        # the header names the dictionary: the frame need not (4 bytes fewer)
        cctx = zstandard.ZstdCompressor(
            level=level,
            dict_data=dictionary.zstd,
            write_content_size=True,
            write_checksum=False,
            write_dict_id=False,
        )
        flags |= FLAG_DICTIONARY
        dict_id = dictionary.dict_id
    sigs = b""
    if signer is not None:
        key, origin, stream = signer
        leaves = leaves_of(
            records[0].seq,
            (r.key for r in records),
            (r.ts_ms for r in records),
            (r.topic for r in records),
            (r.payload for r in records),
        )
        sigs = sign_records(key, origin, stream, records[0].seq, leaves)
        flags |= FLAG_SIGNED
    return Body(
        flags,
        records[0].seq,
        len(records),
        len(raw),
        cctx.compress(raw),
        decoded_size,
        sigs,
        dict_id,
    )


def frame_batch(origin: str, stream: str, body: Body, first_available: int) -> bytes:
    """The whole batch: header (names, seq range, lengths, CRC) around ``body``."""
    if not isinstance(first_available, int) or not 1 <= first_available <= body.first_seq:
        raise WireError(
            "bad_seq_range", f"first_available {first_available!r} is not in 1..{body.first_seq}"
        )
    return _frame(
        _encode_name("origin", origin), _encode_name("stream", stream), body, first_available
    )


def _frame(origin: bytes, stream: bytes, body: Body, first_available: int) -> bytes:
    fixed = _FIXED.pack(
        MAGIC, VERSION, body.flags, len(origin), len(stream), body.first_seq, body.count,
        first_available, body.raw_len, len(body.data), 0,
    )  # fmt: skip
    dict_id = _DICT_ID.pack(body.dict_id) if body.flags & FLAG_DICTIONARY else b""
    names = origin + stream + dict_id + body.signatures
    crc = zlib.crc32(body.data, zlib.crc32(names, zlib.crc32(fixed[:_CRC_AT])))
    return b"".join((fixed[:_CRC_AT], crc.to_bytes(4, "little"), names, body.data))


def _encode_name(kind: str, name: object) -> bytes:
    try:
        check_name(kind, name)  # type: ignore[arg-type]
    except ContractError as exc:
        raise WireError("bad_name", str(exc)) from None
    assert isinstance(name, str)
    return name.encode("ascii")


def _check_records(records: tuple[WireRecord, ...], first_available: object) -> None:
    if not records:
        raise WireError("bad_seq_range", "a batch holds at least one record")
    if len(records) > _U32:
        raise WireError("too_many_records", f"{len(records)} records do not fit the format")
    first = records[0].seq
    if not isinstance(first, int) or not 1 <= first <= MAX_SEQ - len(records) + 1:
        raise WireError("bad_seq_range", f"first seq {first!r} is not in 1..2**63-count")
    if not isinstance(first_available, int) or not 1 <= first_available <= first:
        raise WireError(
            "bad_seq_range", f"first_available {first_available!r} is not in 1..{first}"
        )
    seqs = list(map(_SEQ, records))
    if seqs != list(range(first, first + len(records))):
        i = next(i for i, s in enumerate(seqs) if s != first + i)
        raise WireError(
            "bad_seq_range", f"seqs must be contiguous ascending: {seqs[i]!r} at {first + i}"
        )
    times = list(map(_TS, records))
    if not all(map(isinstance, times, repeat(int))) or not (
        min(times) >= I64_MIN and max(times) <= I64_MAX
    ):
        i = next(
            i for i, t in enumerate(times) if not isinstance(t, int) or not I64_MIN <= t <= I64_MAX
        )
        raise WireError("malformed", f"seq {seqs[i]}: ts_ms {times[i]!r} is not an int64")
    big = oversized_record(
        [r.key for r in records], [r.payload for r in records], [r.topic for r in records]
    )
    if big is not None:
        raise _record_too_large(records[big].seq, records[big])


def _record_too_large(seq: int, r: WireRecord) -> WireError:
    return WireError(
        "record_too_large",
        f"seq {seq}: record of {record_bytes(r.key, r.payload, r.topic)} bytes (payload, key"
        f" and topic) > the {MAX_RECORD_BYTES}-byte limit of every hop",
    )


def _check_limits(count: int, total: int, raw: int, decoded: int, limits: Limits) -> None:
    if count > limits.max_records:
        raise WireError("too_many_records", f"{count} records > {limits.max_records}")
    if total > limits.max_compressed_bytes:
        raise WireError("too_large", f"batch of {total} bytes > {limits.max_compressed_bytes}")
    if max(raw, decoded) > limits.max_decompressed_bytes:
        raise WireError(
            "decompressed_too_large",
            f"{max(raw, decoded)} decompressed bytes > {limits.max_decompressed_bytes}",
        )


# --------------------------------------------------------------------------- decode


@boundary
def peek_header(data: bytes, limits: Limits = DEFAULT_LIMITS, *, complete: bool = True) -> Header:
    """Read and check the header without decompressing: magic, version, flags, names,
    seq range and every length against ``limits``. With ``complete`` (the default)
    ``data`` must be the whole batch; without it a prefix holding the header is enough
    (``Header.total_len`` then says how many bytes to expect). The CRC is checked by
    :func:`decode_batch`."""
    try:
        return _peek(memoryview(data), limits, complete)
    except WireError:
        raise
    except Exception as exc:  # belt and braces: nothing but WireError escapes
        raise WireError("malformed", f"unreadable header: {exc!r}") from None


@boundary
def decode_batch(
    data: bytes, limits: Limits = DEFAULT_LIMITS, dictionaries: Dictionaries | None = None
) -> Batch:
    """Decode and fully check one batch; raise :class:`WireError` on anything wrong
    (``unknown_dictionary``: its body needs a dictionary not in ``dictionaries``)."""
    h, columns = decode_columns(data, limits, dictionaries)
    return Batch.from_columns(
        h.origin, h.stream, h.first_seq, h.first_available, columns, h.signatures
    )


@boundary
def decode_columns(
    data: bytes, limits: Limits = DEFAULT_LIMITS, dictionaries: Dictionaries | None = None
) -> tuple[Header, tuple[list[str], list[int], list[str], list[bytes]]]:
    """As :func:`decode_batch` (the same checks), the records as columns: keys, event
    times, topics, payloads (seqs: ``header.first_seq`` on)."""
    try:
        view = memoryview(data)
        header = _peek(view, limits, True)
        # CRC order: the fixed part without the CRC field, the names, the body
        crc = zlib.crc32(view[:_CRC_AT], 0)
        crc = zlib.crc32(view[_CRC_AT + 4 :], crc)
        if crc != header.crc32:
            raise WireError("bad_checksum", f"CRC32 {crc:08x} != header's {header.crc32:08x}")
        raw = _decompress(view[header.header_len :], header, dictionaries)
        columns = parse_columns(
            raw,
            flags=header.flags,
            count=header.count,
            max_decoded=limits.max_decompressed_bytes,
            coding=AIS,
        )
        keys, _, topics, payloads = columns
        big = oversized_record(keys, payloads, topics)
        if big is not None:
            seq = header.first_seq + big
            raise _record_too_large(seq, WireRecord(seq, keys[big], 0, topics[big], payloads[big]))
        return header, columns
    except WireError:
        raise
    except Exception as exc:  # belt and braces: nothing but WireError escapes
        raise WireError("malformed", f"undecodable batch: {exc!r}") from None


def _peek(view: memoryview, limits: Limits, complete: bool) -> Header:
    n = len(view)
    if n < len(MAGIC):
        if bytes(view) != MAGIC[:n]:
            raise WireError("bad_magic", "not a shorelink batch")
        raise WireError("truncated", f"{n} bytes: no header")
    if bytes(view[:4]) != MAGIC:
        raise WireError("bad_magic", f"magic {bytes(view[:4])!r} != {MAGIC!r}")
    if n > 4 and view[4] != VERSION:
        raise WireError("bad_version", f"version {view[4]}: this decoder reads {VERSION}")
    if n < _FIXED.size:
        raise WireError("truncated", f"{n} bytes < the {_FIXED.size}-byte header")
    (_, version, flags, olen, slen, first, count, first_available, raw_len, clen, crc) = (
        _FIXED.unpack_from(view)
    )
    if flags & ~_KNOWN_FLAGS:
        raise WireError("bad_version", f"unknown flags {flags:#04x} (decoder is v{version})")
    names_end = _FIXED.size + olen + slen
    sigs_at = names_end + (_DICT_ID.size if flags & FLAG_DICTIONARY else 0)
    signed = -(-count // CHUNK_RECORDS) * SIGNATURE_BYTES if flags & FLAG_SIGNED else 0
    header_len = sigs_at + signed
    if n < header_len:
        raise WireError("truncated", f"{n} bytes < the {header_len}-byte header")
    origin = _decode_name("origin", view[_FIXED.size : _FIXED.size + olen])
    stream = _decode_name("stream", view[_FIXED.size + olen : names_end])
    dict_id = 0
    if flags & FLAG_DICTIONARY:
        (dict_id,) = _DICT_ID.unpack_from(view, names_end)
        if dict_id == 0:
            raise WireError("malformed", "a body compressed with dictionary 0")
    if header_len + clen > limits.max_compressed_bytes:
        raise WireError(
            "too_large", f"batch of {header_len + clen} bytes > {limits.max_compressed_bytes}"
        )
    if complete and n > limits.max_compressed_bytes:
        raise WireError("too_large", f"batch of {n} bytes > {limits.max_compressed_bytes}")
    if count > limits.max_records:
        raise WireError("too_many_records", f"{count} records > {limits.max_records}")
    if raw_len > limits.max_decompressed_bytes:
        raise WireError(
            "decompressed_too_large",
            f"declared {raw_len} decompressed bytes > {limits.max_decompressed_bytes}",
        )
    if count < 1 or first < 1 or first > MAX_SEQ - count + 1:
        raise WireError("bad_seq_range", f"seqs {first}+{count} are not in 1..2**63-1")
    if not 1 <= first_available <= first:
        raise WireError("bad_seq_range", f"first_available {first_available} not in 1..{first}")
    if complete and n < header_len + clen:
        raise WireError("truncated", f"{n} bytes < the {header_len + clen} declared")
    if complete and n > header_len + clen:
        raise WireError("malformed", f"{n - header_len - clen} bytes after the body")
    return Header(
        version, flags, origin, stream, first, count, first_available, raw_len, clen, crc,
        header_len, bytes(view[sigs_at:header_len]), dict_id,
    )  # fmt: skip


def _decode_name(kind: str, raw: memoryview) -> str:
    try:
        return check_name(kind, bytes(raw).decode("ascii"))
    except (UnicodeDecodeError, ContractError) as exc:
        raise WireError("bad_name", f"bad {kind} name {bytes(raw)!r}: {exc}") from None


def dictionary_of(header: Header, dictionaries: Dictionaries | None) -> Dictionary | None:
    """The dictionary ``header``'s body was compressed with, among ``dictionaries``
    (None: it was compressed without one); ``unknown_dictionary`` when it is not there."""
    if not header.dict_id:
        return None
    held = None if dictionaries is None else dictionaries.get(header.dict_id)
    if held is None:
        ids = ", ".join(map(str, dictionaries.ids())) if dictionaries else ""
        raise WireError(
            "unknown_dictionary",
            f"body compressed with dictionary {header.dict_id}, which this decoder lacks"
            f" (it holds {ids or 'none'})",
        )
    return held


def _decompress(body: memoryview, header: Header, dictionaries: Dictionaries | None) -> bytes:
    """Decompress with a hard cap: the frame must declare exactly ``raw_len`` (already
    within the limits) and produce exactly that, so no input can make us allocate more.
    With a dictionary the same holds: it is looked up by the header's id (the frame may
    name none, or the same), and the window stays within 128 MiB."""
    raw_len = header.raw_len
    try:
        params = zstandard.get_frame_parameters(body)
    except zstandard.ZstdError as exc:
        raise WireError("malformed", f"body is not a zstd frame: {exc}") from None
    if params.content_size != raw_len:
        if params.content_size != zstandard.CONTENTSIZE_UNKNOWN and params.content_size > raw_len:
            raise WireError(
                "decompressed_too_large",
                f"zstd frame declares {params.content_size} bytes, header {raw_len}",
            )
        raise WireError("malformed", f"zstd frame size {params.content_size} != header {raw_len}")
    if params.dict_id not in (0, header.dict_id):
        raise WireError(
            "malformed",
            f"zstd frame needs dictionary {params.dict_id}, header says {header.dict_id or 'none'}",
        )
    if params.window_size > _MAX_WINDOW:
        raise WireError("malformed", f"zstd frame window {params.window_size} > {_MAX_WINDOW}")
    held = dictionary_of(header, dictionaries)
    if held is not None:
        dctx = zstandard.ZstdDecompressor(dict_data=held.zstd, max_window_size=_MAX_WINDOW)
    else:
        dctx = zstandard.ZstdDecompressor(max_window_size=_MAX_WINDOW)
    try:
        out = dctx.decompress(body, max_output_size=raw_len, allow_extra_data=False)
    except zstandard.ZstdError as exc:
        raise WireError("malformed", f"zstd: {exc}") from None
    if len(out) != raw_len:
        raise WireError("malformed", f"body decompressed to {len(out)} bytes, not {raw_len}")
    return out
