"""The columnar body codec: records <-> the bytes inside a batch's zstd frame.

Layout in ``docs/wire-format.md`` ("Body"): key and topic dictionaries, varint columns
and, under :data:`FLAG_TEMPLATED`, payloads as templates plus numeric columns. Parsing
checks every count, index and length against what remains and charges decoded bytes to
a budget. :mod:`shorelink.wire` frames batches and is the only module others import; it
re-exports the small types defined here for both (:class:`WireRecord`, :class:`WireError`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from shorelink.errors import ShorelinkError

__all__ = [
    "FLAG_TEMPLATED",
    "I64_MAX",
    "I64_MIN",
    "REASONS",
    "WireError",
    "WireRecord",
    "build_body",
    "parse_body",
]

#: Header flag: payloads are stored as templates plus numeric columns (see the docs).
FLAG_TEMPLATED = 0x01

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

I64_MIN, I64_MAX = -(2**63), 2**63 - 1
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


# --------------------------------------------------------------------------- encode


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


def build_body(records: tuple[WireRecord, ...]) -> tuple[int, bytearray, int]:
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


def parse_body(
    raw: bytes, *, flags: int, first_seq: int, count: int, max_decoded: int
) -> tuple[WireRecord, ...]:
    """The ``count`` records (seqs from ``first_seq``) in ``raw``, a decompressed body
    written with header ``flags``; their keys, topics and payloads together may take at
    most ``max_decoded`` bytes. Anything wrong raises :class:`WireError`."""
    rd = _Reader(raw)
    budget = _Budget(max_decoded)
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
        if not I64_MIN <= ts <= I64_MAX:
            raise WireError("malformed", f"ts {ts} is not an int64")
        times.append(ts)
    record_keys = [keys[k] for k in key_of]
    if flags & FLAG_TEMPLATED:
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
    return tuple(
        WireRecord(first_seq + i, record_keys[i], times[i], topics[i], payloads[i])
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
