"""The batch wire format: how a ship's uplink hands records to a port gateway.

One batch carries a contiguous run of seqs of one ``(origin, stream)``. Layout, columns,
limits and versioning are specified in ``docs/wire-format.md``; in short: a fixed
little-endian header (magic, version, flags, seq range, lengths, CRC32 over header and
body) and the two names, then one zstd frame holding a columnar body.

Decoding is built for hostile input: every length is checked against the limits and the
bytes that remain before anything is allocated or decompressed, the zstd frame must
declare exactly the raw length of the header, and nothing but :class:`WireError` ever
escapes :func:`decode_batch` or :func:`peek_header`.
"""

from __future__ import annotations

import re
import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass

import zstandard

from shorelink.errors import ContractError, ShorelinkError
from shorelink.identity import check_name

__all__ = [
    "CONTENT_TYPE",
    "DEFAULT_LIMITS",
    "FLAG_TEMPLATED",
    "MAGIC",
    "MAX_SEQ",
    "REASONS",
    "VERSION",
    "Batch",
    "Header",
    "Limits",
    "WireError",
    "WireRecord",
    "decode_batch",
    "encode_batch",
    "peek_header",
]

CONTENT_TYPE = "application/x-shorelink-batch"
MAGIC = b"SLKB"
VERSION = 1
#: Header flag: payloads are stored as templates plus numeric columns (see the docs).
FLAG_TEMPLATED = 0x01
_KNOWN_FLAGS = FLAG_TEMPLATED

REASONS = frozenset(
    {
        "truncated",
        "bad_magic",
        "bad_version",
        "bad_checksum",
        "too_many_records",
        "too_large",
        "decompressed_too_large",
        "bad_seq_range",
        "bad_name",
        "malformed",
    }
)

MAX_SEQ = 2**63 - 1
_U32 = 2**32 - 1
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
#: magic, version, flags, origin_len, stream_len, first_seq, count, first_available,
#: raw_len, compressed_len, crc32. The names follow; the CRC field is at byte 36.
_FIXED = struct.Struct("<4sBBBBQIQIII")
_CRC_AT = 36
_MAX_WINDOW = 1 << 27  # zstd's own default cap on the window a decoder accepts
_MAX_VARINT = 20  # bytes: 140 bits covers every value the body may hold
#: A number the templated payload coding lifts out of the text: JSON/CSV-style decimals
#: with no exponent, no leading zeros, not glued to a word, a dot or a sign.
_NUMBER = re.compile(rb"(?<![\w.+-])(-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?)(?![\w.+-])")
_MAX_DIGITS = 18
_MAX_MANTISSA = 10**_MAX_DIGITS - 1
_EXPONENTS = range(-6, 7)  # time-predicted numeric columns: value ~ ts_ms * 10**e


class WireError(ShorelinkError):
    """A batch that cannot be encoded or decoded; ``reason`` is one of :data:`REASONS`.
    Never retryable: the same bytes fail the same way."""

    retryable = False

    def __init__(self, reason: str, message: str) -> None:
        if reason not in REASONS:
            raise ValueError(f"unknown wire error reason {reason!r}")
        self.reason = reason
        super().__init__(f"{reason}: {message}", retryable=False)


@dataclass(frozen=True, slots=True)
class WireRecord:
    """One record as it travels in a batch (identity = batch origin/stream + ``seq``)."""

    seq: int
    key: str
    ts_ms: int
    topic: str
    payload: bytes


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

    def __post_init__(self) -> None:
        if not isinstance(self.records, tuple):
            object.__setattr__(self, "records", tuple(self.records))

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

    @property
    def last_seq(self) -> int:
        return self.first_seq + self.count - 1

    @property
    def total_len(self) -> int:
        """Bytes of the whole encoded batch."""
        return self.header_len + self.compressed_len


# --------------------------------------------------------------------------- encode


def encode_batch(batch: Batch, *, level: int = 12, limits: Limits | None = None) -> bytes:
    """Encode ``batch``; raise :class:`WireError` if it breaks the seq-range or name
    rules, or (when ``limits`` is given) if a decoder with those limits would refuse it."""
    origin = _encode_name("origin", batch.origin)
    stream = _encode_name("stream", batch.stream)
    records = batch.records
    _check_records(records, batch.first_available)
    flags, raw, decoded_size = _build_body(records)
    if len(raw) > _U32:
        raise WireError("too_large", f"body of {len(raw)} bytes does not fit the format")
    cctx = zstandard.ZstdCompressor(level=level, write_content_size=True, write_checksum=False)
    body = cctx.compress(raw)
    fixed = _FIXED.pack(
        MAGIC, VERSION, flags, len(origin), len(stream), records[0].seq, len(records),
        batch.first_available, len(raw), len(body), 0,
    )  # fmt: skip
    crc = zlib.crc32(body, zlib.crc32(origin + stream, zlib.crc32(fixed[:_CRC_AT])))
    data = fixed[:_CRC_AT] + crc.to_bytes(4, "little") + origin + stream + body
    if limits is not None:
        _check_limits(len(records), len(data), len(raw), decoded_size, limits)
    return data


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
    for i, r in enumerate(records):
        if r.seq != first + i:
            raise WireError(
                "bad_seq_range", f"seqs must be contiguous ascending: {r.seq!r} at {first + i}"
            )
        if not isinstance(r.ts_ms, int) or not _I64_MIN <= r.ts_ms <= _I64_MAX:
            raise WireError("malformed", f"seq {r.seq}: ts_ms {r.ts_ms!r} is not an int64")


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


def _uvarint(out: bytearray, n: int) -> None:
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _zigzag(n: int) -> int:
    return n << 1 if n >= 0 else ((-n) << 1) - 1


def _utf8(kind: str, seq: int, text: object) -> bytes:
    if not isinstance(text, str):
        raise WireError("malformed", f"seq {seq}: {kind} must be str, not {type(text).__name__}")
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise WireError("malformed", f"seq {seq}: {kind} is not valid unicode: {exc}") from None


def _build_body(records: tuple[WireRecord, ...]) -> tuple[int, bytearray, int]:
    """The columnar body; returns (flags, body, decoded size)."""
    out = bytearray()
    key_ids: dict[str, int] = {}
    topic_ids: dict[tuple[int, bytes, bytes], int] = {}
    key_topic: dict[int, int] = {}
    key_col, topic_col, ts_col = bytearray(), bytearray(), bytearray()
    keys_b: list[bytes] = []
    payloads: list[bytes] = []
    prev_key = prev_ts = 0
    decoded = 0
    for r in records:
        kb = _utf8("key", r.seq, r.key)
        kid = key_ids.get(r.key)
        if kid is None:
            kid = key_ids[r.key] = len(keys_b)
            keys_b.append(kb)
        _uvarint(key_col, _zigzag(kid - prev_key))
        prev_key = kid
        tb = _utf8("topic", r.seq, r.topic)
        at = r.topic.find(r.key) if r.key else -1
        pattern = (
            (1, r.topic[:at].encode(), r.topic[at + len(r.key) :].encode())
            if at >= 0
            else (0, tb, b"")
        )
        tid = topic_ids.setdefault(pattern, len(topic_ids))
        # a key's topic rarely changes: 0 = "the same as this key's last one"
        _uvarint(topic_col, 0 if key_topic.get(kid) == tid else tid + 1)
        key_topic[kid] = tid
        _uvarint(ts_col, _zigzag(r.ts_ms - prev_ts))
        prev_ts = r.ts_ms
        p = r.payload
        if not isinstance(p, bytes):
            if not isinstance(p, bytearray | memoryview):
                raise WireError("malformed", f"seq {r.seq}: payload must be bytes")
            p = bytes(p)
        payloads.append(p)
        decoded += len(kb) + len(tb) + len(p)
    _uvarint(out, len(keys_b))
    for kb in keys_b:
        _uvarint(out, len(kb))
        out += kb
    out += key_col
    _uvarint(out, len(topic_ids))
    for kind, a, b in topic_ids:
        _uvarint(out, kind)
        _uvarint(out, len(a))
        out += a
        if kind:
            _uvarint(out, len(b))
            out += b
    out += topic_col
    out += ts_col
    templated = _templated_payloads(records, payloads)
    if templated is not None:
        return FLAG_TEMPLATED, out + templated, decoded
    for p in payloads:
        _uvarint(out, len(p))
    for p in payloads:
        out += p
    return 0, out, decoded


def _split_numbers(payload: bytes) -> tuple[tuple[bytes, ...], list[tuple[int, int]]]:
    """``payload`` as literal segments around lifted numbers ``(mantissa, scale)``;
    rendering the numbers back between the segments gives the exact same bytes."""
    parts = _NUMBER.split(payload)  # literal, number, literal, number, ..., literal
    segs = [parts[0]]
    nums: list[tuple[int, int]] = []
    for j in range(1, len(parts), 2):
        tok = parts[j]
        whole, _, frac = tok.partition(b".")
        negative = whole[:1] == b"-"
        mantissa = int(whole + frac)
        if len(whole) - negative + len(frac) > _MAX_DIGITS or (negative and not mantissa):
            segs[-1] += tok + parts[j + 1]  # stays literal: too long for a column, or "-0"
        else:
            nums.append((mantissa, len(frac)))
            segs.append(parts[j + 1])
    return tuple(segs), nums


def _templated_payloads(records: tuple[WireRecord, ...], payloads: list[bytes]) -> bytearray | None:
    """Payloads as a template dictionary plus one column per numeric slot, or None when
    the payloads share too little structure for that to pay."""
    template_ids: dict[tuple[bytes, ...], int] = {}
    rows: list[tuple[int, list[tuple[int, int]]]] = []
    for p in payloads:
        segs, nums = _split_numbers(p)
        tid = template_ids.setdefault(segs, len(template_ids))
        rows.append((tid, nums))
        if len(template_ids) > len(payloads) // 2:
            return None
    out = bytearray()
    _uvarint(out, len(template_ids))
    for segs in template_ids:
        _uvarint(out, len(segs) - 1)
        for s in segs:
            _uvarint(out, len(s))
            out += s
    for tid, _ in rows:
        _uvarint(out, tid)
    members: list[list[int]] = [[] for _ in template_ids]
    for i, (tid, _) in enumerate(rows):
        members[tid].append(i)
    for tid, segs in enumerate(template_ids):
        for slot in range(len(segs) - 1):
            column = [rows[i][1][slot] for i in members[tid]]
            keys = [records[i].key for i in members[tid]]
            times = [records[i].ts_ms for i in members[tid]]
            _encode_column(out, column, keys, times)
    return out


def _encode_column(
    out: bytearray, column: list[tuple[int, int]], keys: list[str], times: list[int]
) -> None:
    scale_max = max(s for _, s in column)
    values = [m * 10 ** (scale_max - s) for m, s in column]
    by_key = _deltas_by_key(values, keys)
    mode, exp, deltas = 0, 0, by_key
    if times:
        exp = min(_EXPONENTS, key=lambda e: abs(values[0] - _time_prediction(times[0], e)))
        by_time = [v - _time_prediction(t, exp) for v, t in zip(values, times, strict=True)]
        if _cost(by_time) < _cost(by_key):
            mode, deltas = 1, by_time
    _uvarint(out, mode)
    if mode == 1:
        _uvarint(out, _zigzag(exp))
    _uvarint(out, scale_max)
    for _, s in column:
        _uvarint(out, s)
    for d in deltas:
        _uvarint(out, _zigzag(d))


def _deltas_by_key(values: list[int], keys: Iterable[str]) -> list[int]:
    """Each value minus the previous value of the same key in this column (else the
    previous value in the column, else 0)."""
    last: dict[str, int] = {}
    prev = 0
    out = []
    for v, k in zip(values, keys, strict=True):
        out.append(v - last.get(k, prev))
        last[k] = prev = v
    return out


def _time_prediction(ts_ms: int, exp: int) -> int:
    return ts_ms * 10**exp if exp >= 0 else ts_ms // 10**-exp


def _cost(deltas: list[int]) -> int:
    return sum(_zigzag(d).bit_length() for d in deltas)


# --------------------------------------------------------------------------- decode


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


def decode_batch(data: bytes, limits: Limits = DEFAULT_LIMITS) -> Batch:
    """Decode and fully check one batch; raise :class:`WireError` on anything wrong."""
    try:
        view = memoryview(data)
        header = _peek(view, limits, True)
        # CRC order: the fixed part without the CRC field, the names, the body
        crc = zlib.crc32(view[:_CRC_AT], 0)
        crc = zlib.crc32(view[_CRC_AT + 4 :], crc)
        if crc != header.crc32:
            raise WireError("bad_checksum", f"CRC32 {crc:08x} != header's {header.crc32:08x}")
        raw = _decompress(view[header.header_len :], header.raw_len)
        records = _parse_body(raw, header, limits)
        return Batch(header.origin, header.stream, records, header.first_available)
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
    header_len = _FIXED.size + olen + slen
    if n < header_len:
        raise WireError("truncated", f"{n} bytes < the {header_len}-byte header")
    origin = _decode_name("origin", view[_FIXED.size : _FIXED.size + olen])
    stream = _decode_name("stream", view[_FIXED.size + olen : header_len])
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
        header_len,
    )  # fmt: skip


def _decode_name(kind: str, raw: memoryview) -> str:
    try:
        return check_name(kind, bytes(raw).decode("ascii"))
    except (UnicodeDecodeError, ContractError) as exc:
        raise WireError("bad_name", f"bad {kind} name {bytes(raw)!r}: {exc}") from None


def _decompress(body: memoryview, raw_len: int) -> bytes:
    """Decompress with a hard cap: the frame must declare exactly ``raw_len`` (already
    within the limits) and produce exactly that, so no input can make us allocate more."""
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
    if params.dict_id or params.window_size > _MAX_WINDOW:
        raise WireError("malformed", "zstd frame needs a dictionary or an oversized window")
    try:
        out = zstandard.ZstdDecompressor(max_window_size=_MAX_WINDOW).decompress(
            body, max_output_size=raw_len, allow_extra_data=False
        )
    except zstandard.ZstdError as exc:
        raise WireError("malformed", f"zstd: {exc}") from None
    if len(out) != raw_len:
        raise WireError("malformed", f"body decompressed to {len(out)} bytes, not {raw_len}")
    return out


class _Reader:
    """Bounds-checked reads over the decompressed body."""

    __slots__ = ("buf", "end", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0
        self.end = len(buf)

    def uvarint(self) -> int:
        buf, pos, end = self.buf, self.pos, self.end
        result = shift = 0
        while True:
            if pos >= end:
                raise WireError("malformed", "body ends inside a number")
            b = buf[pos]
            pos += 1
            result |= (b & 0x7F) << shift
            if b < 0x80:
                self.pos = pos
                return result
            shift += 7
            if shift >= 7 * _MAX_VARINT:
                raise WireError("malformed", "number too long")

    def zigzag(self) -> int:
        z = self.uvarint()
        return z >> 1 if not z & 1 else -((z + 1) >> 1)

    def count(self, what: str, most: int) -> int:
        n = self.uvarint()
        if n > most:
            raise WireError("malformed", f"{n} {what} > {most}")
        return n

    def take(self, what: str) -> bytes:
        n = self.uvarint()
        if n > self.end - self.pos:
            raise WireError("malformed", f"{what} of {n} bytes overruns the body")
        start = self.pos
        self.pos += n
        return self.buf[start : self.pos]

    def index(self, what: str, size: int) -> int:
        i = self.uvarint()
        if i >= size:
            raise WireError("malformed", f"{what} {i} not in 0..{size - 1}")
        return i


def _text(what: str, raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise WireError("malformed", f"{what} is not UTF-8") from None


def _parse_body(raw: bytes, h: Header, limits: Limits) -> tuple[WireRecord, ...]:
    rd = _Reader(raw)
    count = h.count
    budget = _Budget(limits.max_decompressed_bytes)
    key_bytes = [rd.take("key") for _ in range(rd.count("keys", count))]
    keys = [_text("key", k) for k in key_bytes]
    key_of: list[int] = []
    prev = 0
    for _ in range(count):
        prev += rd.zigzag()
        if not 0 <= prev < len(keys):
            raise WireError("malformed", f"key index {prev} not in 0..{len(keys) - 1}")
        key_of.append(prev)
        budget.spend(len(key_bytes[prev]))
    patterns: list[tuple[int, bytes, bytes]] = []
    for _ in range(rd.count("topics", count)):
        kind = rd.uvarint()
        if kind > 1:
            raise WireError("malformed", f"unknown topic kind {kind}")
        patterns.append((kind, rd.take("topic"), rd.take("topic") if kind else b""))
    topic_of: list[int] = []
    key_topic: dict[int, int] = {}
    for k in key_of:
        t = rd.index("topic index", len(patterns) + 1) - 1
        if t < 0:
            t = key_topic.get(k, -1)
            if t < 0:
                raise WireError("malformed", "topic refers to a key's earlier topic: none")
        topic_of.append(t)
        key_topic[k] = t
    topics: list[str] = []
    made: dict[tuple[int, int], str] = {}
    for t, k in zip(topic_of, key_of, strict=True):
        kind, a, b = patterns[t]
        budget.spend(len(a) + len(b) + (len(key_bytes[k]) if kind else 0))
        topic = made.get((t, k))
        if topic is None:
            topic = made[(t, k)] = _text("topic", a + key_bytes[k] + b if kind else a)
        topics.append(topic)
    times: list[int] = []
    ts = 0
    for _ in range(count):
        ts += rd.zigzag()
        if not _I64_MIN <= ts <= _I64_MAX:
            raise WireError("malformed", f"ts {ts} is not an int64")
        times.append(ts)
    record_keys = [keys[k] for k in key_of]
    if h.flags & FLAG_TEMPLATED:
        payloads = _parse_templated(rd, record_keys, times, budget)
    else:
        lengths = [rd.uvarint() for _ in range(count)]
        if sum(lengths) != rd.end - rd.pos:
            raise WireError("malformed", "payload lengths do not match the body")
        budget.spend(sum(lengths))
        payloads = []
        for n in lengths:
            payloads.append(raw[rd.pos : rd.pos + n])
            rd.pos += n
    if rd.pos != rd.end:
        raise WireError("malformed", f"{rd.end - rd.pos} unread bytes at the end of the body")
    first = h.first_seq
    return tuple(
        WireRecord(first + i, record_keys[i], times[i], topics[i], payloads[i])
        for i in range(count)
    )


class _Budget:
    """Decoded bytes (keys, topics, payloads over all records) so far, against the cap:
    a small body must not expand into a huge batch by reusing dictionary entries."""

    __slots__ = ("cap", "used")

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.used = 0

    def spend(self, n: int) -> None:
        self.used += n
        if self.used > self.cap:
            raise WireError(
                "decompressed_too_large", f"records decode to more than {self.cap} bytes"
            )


def _parse_templated(
    rd: _Reader, keys: list[str], times: list[int], budget: _Budget
) -> list[bytes]:
    count = len(keys)
    templates: list[list[bytes]] = []
    for _ in range(rd.count("templates", count)):
        slots = rd.count("slots", rd.end - rd.pos)
        templates.append([rd.take("template") for _ in range(slots + 1)])
    template_of = [rd.index("template", len(templates)) for _ in range(count)]
    literal = [sum(map(len, segs)) for segs in templates]
    members: list[list[int]] = [[] for _ in templates]
    for i, t in enumerate(template_of):
        members[t].append(i)
        budget.spend(literal[t])
    # numbers are appended to each record's buffer column by column: no object per number
    bufs = [bytearray(templates[t][0]) for t in template_of]
    for tid, segs in enumerate(templates):
        for slot in range(1, len(segs)):
            _parse_column(rd, members[tid], keys, times, bufs, segs[slot], budget)
    return [bytes(b) for b in bufs]


def _parse_column(
    rd: _Reader,
    members: list[int],
    keys: list[str],
    times: list[int],
    bufs: list[bytearray],
    after: bytes,
    budget: _Budget,
) -> None:
    mode = rd.uvarint()
    if mode > 1:
        raise WireError("malformed", f"unknown numeric column mode {mode}")
    exp = rd.zigzag() if mode else 0
    if exp not in _EXPONENTS:
        raise WireError("malformed", f"time exponent {exp} not in {_EXPONENTS}")
    scale_max = rd.count("decimals", _MAX_DIGITS)
    scales = [rd.count("decimals", scale_max) for _ in members]
    last: dict[str, int] = {}
    prev = 0
    for i, scale in zip(members, scales, strict=True):
        delta = rd.zigzag()
        if mode:
            value = delta + _time_prediction(times[i], exp)
        else:
            value = delta + last.get(keys[i], prev)
            last[keys[i]] = prev = value
        mantissa, rest = divmod(value, 10 ** (scale_max - scale))
        if rest or abs(mantissa) > _MAX_MANTISSA:
            raise WireError("malformed", f"number {value} does not fit {scale} decimals")
        text = _render(mantissa, scale)
        budget.spend(len(text))
        bufs[i] += text
        bufs[i] += after


def _render(mantissa: int, scale: int) -> bytes:
    if not scale:
        return b"%d" % mantissa
    digits = b"%0*d" % (scale + 1, abs(mantissa))
    return (b"-" if mantissa < 0 else b"") + digits[:-scale] + b"." + digits[-scale:]
