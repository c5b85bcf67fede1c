"""The columnar body codec: records <-> the bytes inside a batch's zstd frame.

Layout in ``docs/wire-format.md`` ("Body", v2): key, topic and (key, topic) pair
dictionaries, fixed-width little-endian integer columns and, under
:data:`FLAG_TEMPLATED`, payloads as templates plus one column per number slot.

Speed comes from never touching a value in Python code where a C loop can: integer
columns are read with :mod:`array` and prefix-summed with :func:`itertools.accumulate`,
numbers are split out of payloads by one compiled regex per template and rendered back
by one bytes ``%`` format per record. Parsing checks every count, index and length
against what remains before allocating, and charges decoded bytes to a budget before the
records are built. :mod:`shorelink.wire` frames batches and is the only module others
import; it re-exports the small types defined here (:class:`WireRecord`,
:class:`WireError`).
"""

from __future__ import annotations

import copy
import re
import sys
from array import array
from collections import Counter
from collections.abc import Callable, Sequence
from functools import lru_cache, partial
from itertools import accumulate, chain, compress, repeat
from operator import add, attrgetter, floordiv, mul, ne, not_, sub, truediv
from typing import Any, NamedTuple, Protocol

from shorelink.errors import ShorelinkError

__all__ = [
    "FLAG_TEMPLATED",
    "I64_MAX",
    "I64_MIN",
    "REASONS",
    "STRETCH_VALUES",
    "Budget",
    "Ints",
    "PayloadCoding",
    "Reader",
    "WireError",
    "WireRecord",
    "build_body",
    "parse_columns",
    "put_ints",
    "put_u32",
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
        "record_too_large",
        "unknown_dictionary",
    }
)

I64_MIN, I64_MAX = -(2**63), 2**63 - 1

#: A number the templated coding lifts out of a payload when it first meets a shape:
#: JSON/CSV-style decimals with no exponent, no leading zeros, not glued to a word, a dot
#: or a sign, at most 18 digits, not a negative zero.
_NUMBER = re.compile(rb"(?<![\w.+-])(-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?)(?![\w.+-])")
#: A number slot in a template's own regex (the literal segments around it are fixed).
_SLOT = rb"(-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?)"
_FRACTION = re.compile(rb"\.([0-9]+)")
_MAX_DIGITS = 18
_MAX_VALUE = 10**_MAX_DIGITS - 1  # numeric column values (after prediction), either sign
_FLOAT_EXACT = 10**15  # |m| below this: b"%.{d}f" % (m / 10**d) renders m exactly
_EXPONENTS = range(-6, 7)  # time-predicted columns: value ~ ts_ms * 10**e
_PEEL_ROUNDS = 4  # templates found by a whole-batch regex pass; the rest one by one
#: a template with more literal bytes than this is not made a regex (compiling one costs
#: about 1.5 us of CPU per byte: 1.5 s for a record at the size limit); its payloads
#: take the one-by-one path, which gives the same templates
_PEEL_MAX_BYTES = 4096

# Integer columns: one code byte, then n fixed-width little-endian signed integers.
_WIDTH_BITS = 0x03  # width = 1 << (code & 3): 1, 2, 4 or 8 bytes
_PLANES = 0x10  # stored as byte planes: every value's byte 0, then every byte 1, ...
_DELTA = 0x20  # an int64 base, then differences from the previous value (the first: base)
_CODE_BITS = _WIDTH_BITS | _PLANES | _DELTA
_TYPECODE = {w: next(tc for tc in "bhilq" if array(tc).itemsize == w) for w in (1, 2, 4, 8)}
_BIG_ENDIAN = sys.byteorder == "big"

# Numeric column kinds.
_FIXED, _REPR, _TEXT = 0, 1, 2
_MAX_RENDERED = {_FIXED: 21, _REPR: 24}  # bytes one value can render to, at most
_PLAIN, _RUNS = 0, 1  # numeric column layouts: one integer column, or heads and steps
_SAMPLE = 512  # values the encoder looks at to choose a column's layout
_WIDE = 0x100  # decoded column flag: some |value| >= _FLOAT_EXACT
#: number slots in one template, at most: a payload with more numbers keeps the rest in
#: its literal text (a decoder refuses a template with more). A body's templates that
#: have records open at most ``count + _MAX_SLOTS`` number columns in all (an encoder
#: that would open more writes its payloads plain): each column costs a decoder a few
#: hundred bytes and microseconds whatever it holds, so one record per template of 180
#: slots must not make a 727-byte body cost 800 MiB (security review N1)
_MAX_SLOTS = 4096
#: numbers a decoder turns into Python ints at once (each about 40 bytes while it lives);
#: a template's records are decoded a stretch of about this many numbers at a time
#: (:func:`parse_columns` ``stretch``)
STRETCH_VALUES = 65536


class WireError(ShorelinkError):
    """A batch that cannot be encoded or decoded; ``reason`` is one of :data:`REASONS`.
    Never retryable: the same bytes fail the same way."""

    retryable = False

    def __init__(self, reason: str, message: str) -> None:
        if reason not in REASONS:
            raise ValueError(f"unknown wire error reason {reason!r}")
        self.reason = reason
        super().__init__(f"{reason}: {message}", retryable=False)


class WireRecord(NamedTuple):
    """One record as it travels in a batch (identity = batch origin/stream + ``seq``).
    A named tuple: decoding makes one per record, and a tuple is built three times
    faster than a frozen dataclass (a gateway's hot path)."""

    seq: int
    key: str
    ts_ms: int
    topic: str
    payload: bytes


class PayloadCoding(Protocol):
    """A payload coding for a kind of payload (shorelink/wire_ais.py: AIS sentences):
    the body's payload section when its header flag is set, in place of the plain or
    templated one. Its decoder keeps the body's bounds: counts and lengths checked
    against what remains, every decoded byte charged to ``budget`` before it is built."""

    #: the header flag that says a body's payloads are coded so
    flag: int

    def encode(self, payloads: list[bytes]) -> bytearray | None:
        """The payload section, or None where this coding does not apply."""
        ...

    def decode(self, rd: Reader, count: int, budget: Budget) -> list[bytes]:
        """The ``count`` payloads of the section at ``rd``, which it reads to its end."""
        ...


# --------------------------------------------------------------------------- shared


def _width(lo: int, hi: int) -> int:
    """The narrowest of 1/2/4/8 bytes holding every value in ``lo..hi``; 0 if none does."""
    for w in (1, 2, 4, 8):
        half = 1 << (8 * w - 1)
        if -half <= lo and hi < half:
            return w
    return 0


def _predictions(times: list[int], exp: int) -> list[int]:
    if exp >= 0:
        return list(map(mul, times, repeat(10**exp)))
    return list(map(floordiv, times, repeat(10**-exp)))


def _render_fixed(mantissa: int, decimals: int) -> bytes:
    """The reference rendering of a fixed-decimals value (see the docs)."""
    if not decimals:
        return b"%d" % mantissa
    digits = b"%0*d" % (decimals + 1, abs(mantissa))
    return (b"-" if mantissa < 0 else b"") + digits[:-decimals] + b"." + digits[-decimals:]


def _render_repr(value: int, scale: int) -> bytes:
    return b"%r" % (value / 10**scale)


# --------------------------------------------------------------------------- encode


_FIELDS = attrgetter("seq", "key", "ts_ms", "topic", "payload")


def put_u32(out: bytearray, n: int) -> None:
    if n > 0xFFFFFFFF:
        raise WireError("too_large", f"{n} entries do not fit the format")
    out += n.to_bytes(4, "little")


def put_ints(out: bytearray, values: list[int], *, delta: int = 1) -> None:
    """``values`` (each fitting int64) as an integer column at the narrowest width; as
    differences when that is narrower (``delta`` 1) or no wider (``delta`` 2); values
    wider than a byte as byte planes."""
    if not values:
        out.append(0)  # width 1, nothing follows
        return
    w = _width(min(values), max(values))
    code = 0
    base = b""
    if delta:
        diffs = list(map(sub, values, chain(values[:1], values)))
        dw = _width(min(diffs), max(diffs))
        if dw and (dw < w or not w or (delta == 2 and dw == w)):
            base = values[0].to_bytes(8, "little", signed=True)
            values, w, code = diffs, dw, _DELTA
    if not w:
        raise WireError("malformed", "a column value does not fit int64")
    data = array(_TYPECODE[w], values)
    if _BIG_ENDIAN:
        data.byteswap()
    raw = data.tobytes()
    if w > 1:
        code |= _PLANES
        raw = b"".join([raw[k::w] for k in range(w)])
    out.append(code | (w.bit_length() - 1))
    out += base
    out += raw


def _utf8(kind: str, seq: int, text: object) -> bytes:
    if not isinstance(text, str):
        raise WireError("malformed", f"seq {seq}: {kind} must be str, not {type(text).__name__}")
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise WireError("malformed", f"seq {seq}: {kind} is not valid unicode: {exc}") from None


def _encode_text(kind: str, text: str, seqs: list[int], pair_of: list[int], j: int) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # the message names the first record with this pair
        return _utf8(kind, seqs[pair_of.index(j)], text)


def build_body(
    records: Sequence[WireRecord], coding: PayloadCoding | None = None
) -> tuple[int, bytes, int]:
    """The columnar body; returns (flags, body, decoded size). With ``coding``, its
    payloads are coded so where it applies."""
    seqs, keys, times, topics, payloads = (
        list(c) for c in zip(*map(_FIELDS, records), strict=True)
    )
    for kind, texts in (("key", keys), ("topic", topics)):
        if not all(map(isinstance, texts, repeat(str))):
            i = next(i for i, t in enumerate(texts) if not isinstance(t, str))
            _utf8(kind, seqs[i], texts[i])
    if not all(map(isinstance, payloads, repeat(bytes))):
        payloads = [_payload(s, p) for s, p in zip(seqs, payloads, strict=True)]
    # (key, topic) pairs in order of first use; records refer to a pair
    key_topic = list(zip(keys, topics, strict=True))
    pair_ids = dict.fromkeys(key_topic, 0)
    for j, kt in enumerate(pair_ids):
        pair_ids[kt] = j
    pair_of = list(map(pair_ids.__getitem__, key_topic))
    key_ids: dict[str, int] = {}
    keys_b: list[bytes] = []
    patterns: dict[tuple[bytes, bytes | None], int] = {}
    pair_key: list[int] = []
    pair_pattern: list[int] = []
    pair_size: list[int] = []
    for j, (key, topic) in enumerate(pair_ids):
        kid = key_ids.get(key)
        if kid is None:
            kid = key_ids[key] = len(keys_b)
            keys_b.append(_encode_text("key", key, seqs, pair_of, j))
        tb = _encode_text("topic", topic, seqs, pair_of, j)
        at = topic.find(key) if key else -1
        pattern = (topic[:at].encode(), topic[at + len(key) :].encode()) if at >= 0 else (tb, None)
        pair_key.append(kid)
        pair_pattern.append(patterns.setdefault(pattern, len(patterns)))
        pair_size.append(len(keys_b[kid]) + len(tb))
    decoded = sum(map(pair_size.__getitem__, pair_of)) + sum(map(len, payloads))

    out = bytearray()
    put_u32(out, len(keys_b))
    put_ints(out, list(map(len, keys_b)), delta=0)
    out += b"".join(keys_b)
    put_u32(out, len(patterns))
    put_ints(out, [len(a) for a, _ in patterns], delta=0)
    put_ints(out, [-1 if b is None else len(b) for _, b in patterns], delta=0)
    out += b"".join([a + (b or b"") for a, b in patterns])
    put_u32(out, len(pair_ids))
    put_ints(out, pair_key)
    put_ints(out, pair_pattern)
    put_ints(out, pair_of, delta=2)  # arrival order repeats: mostly +1
    put_ints(out, times)
    key_of = list(map(pair_key.__getitem__, pair_of))
    section = None if coding is None else coding.encode(payloads)
    if coding is not None and section is not None:
        out += section
        return coding.flag, bytes(out), decoded
    templated = _templated_payloads(payloads, key_of, len(keys_b), times)
    if templated is not None:
        out += templated
        return FLAG_TEMPLATED, bytes(out), decoded
    put_ints(out, list(map(len, payloads)), delta=0)
    out += b"".join(payloads)
    return 0, bytes(out), decoded


def _payload(seq: int, p: object) -> bytes:
    if isinstance(p, bytes):
        return p
    if isinstance(p, bytearray | memoryview):
        return bytes(p)
    raise WireError("malformed", f"seq {seq}: payload must be bytes")


def _split_numbers(payload: bytes) -> tuple[tuple[bytes, ...], tuple[bytes, ...]]:
    """``payload`` as literal segments around the numbers lifted from it; the numbers
    put back between the segments give the exact same bytes."""
    parts = _NUMBER.split(payload)  # literal, number, literal, number, ..., literal
    segs = [parts[0]]
    nums: list[bytes] = []
    for j in range(1, len(parts), 2):
        tok = parts[j]
        negative = tok[:1] == b"-"
        digits = len(tok) - negative - (b"." in tok)
        if digits > _MAX_DIGITS or (negative and not tok.strip(b"-0.")) or len(nums) == _MAX_SLOTS:
            # stays literal: too long for a column, "-0", or past the template's slots
            segs[-1] += tok + parts[j + 1]
        else:
            nums.append(tok)
            segs.append(parts[j + 1])
    return tuple(segs), tuple(nums)


@lru_cache(maxsize=64)
def _template_regex(segs: tuple[bytes, ...]) -> re.Pattern[bytes]:
    return re.compile(_SLOT.join(map(re.escape, segs)))


def _templated_payloads(
    payloads: list[bytes], key_of: list[int], n_keys: int, times: list[int]
) -> bytearray | None:
    """Payloads as a template dictionary plus one column per number slot, or None when
    the payloads share too little structure for that to pay."""
    n = len(payloads)
    most = n // 2
    templates: dict[tuple[bytes, ...], int] = {}
    template_of = [0] * n
    rows: list[tuple[bytes, ...]] = [()] * n
    # Peel: the first unassigned payload's shape, as a regex, claims every payload that
    # has that shape in one C-level pass; a handful of rounds covers ordinary batches.
    remaining: list[int] = list(range(n))
    for _ in range(_PEEL_ROUNDS):
        if not remaining:
            break
        segs, _nums = _split_numbers(payloads[remaining[0]])
        if sum(map(len, segs)) > _PEEL_MAX_BYTES:
            break
        tid = templates.setdefault(segs, len(templates))
        if len(templates) > most:
            return None
        fullmatch = _template_regex(segs).fullmatch
        if len(remaining) == n:
            matches = list(map(fullmatch, payloads))
        else:
            matches = list(map(fullmatch, map(payloads.__getitem__, remaining)))
        if None not in matches and len(remaining) == n:
            template_of = [tid] * n
            rows = list(map(re.Match.groups, matches))  # type: ignore[arg-type]
            remaining = []
            break
        rest = []
        for i, m in zip(remaining, matches, strict=True):
            if m is None:
                rest.append(i)
            else:
                template_of[i] = tid
                rows[i] = m.groups()
        remaining = rest
    for i in remaining:
        segs, nums = _split_numbers(payloads[i])
        tid = templates.setdefault(segs, len(templates))
        if len(templates) > most:
            return None
        template_of[i] = tid
        rows[i] = nums

    if sum(len(segs) - 1 for segs in templates) > n + _MAX_SLOTS:
        return None  # more number columns than a decoder opens (_parse_templated)
    out = bytearray()
    put_u32(out, len(templates))
    put_ints(out, [len(segs) - 1 for segs in templates], delta=0)
    put_ints(out, [len(s) for segs in templates for s in segs], delta=0)
    out += b"".join([s for segs in templates for s in segs])
    put_ints(out, template_of, delta=2)
    order, sizes = _column_order(template_of, key_of, n_keys, len(templates))
    start = 0
    for segs, size in zip(templates, sizes, strict=True):
        members = order[start : start + size]
        start += size
        if len(segs) == 1 or not members:
            continue
        ts = list(map(times.__getitem__, members))
        runs = _Runs(list(map(key_of.__getitem__, members)))
        for column in zip(*map(rows.__getitem__, members), strict=True):
            _put_column(out, column, ts, runs)
    return out


def _column_order(
    template_of: list[int], key_of: list[int], n_keys: int, n_templates: int
) -> tuple[list[int], list[int]]:
    """Record indices by (template, key index, record index), and records per template."""
    n = len(template_of)
    if n_templates == 1:
        return sorted(range(n), key=key_of.__getitem__), [n]
    rank = list(map(add, map(mul, template_of, repeat(max(n_keys, 1))), key_of))
    counts = Counter(template_of)
    return sorted(range(n), key=rank.__getitem__), [counts[t] for t in range(n_templates)]


@lru_cache(maxsize=32)
def _fixed_regex(decimals: int) -> re.Pattern[bytes]:
    """Space-separated numbers with exactly ``decimals`` decimals, at most 18 digits."""
    one = rb"-?[0-9]{1,%d}" % (_MAX_DIGITS - decimals)
    if decimals:
        one += rb"\.[0-9]{%d}" % decimals
    return re.compile(one + rb"(?: " + one + rb")*")


class _Runs:
    """A template's records in column order fall into runs of one key each: where the
    runs start, and for each position the number of its run."""

    __slots__ = ("head_mask", "heads", "not_head", "run_of")

    def __init__(self, keys: list[int]) -> None:
        m = len(keys)
        self.heads = list(compress(range(m), map(ne, keys, chain((-1,), keys))))
        lengths = map(sub, chain(self.heads[1:], (m,)), self.heads)
        self.run_of = list(chain.from_iterable(map(repeat, range(len(self.heads)), lengths)))
        self.head_mask = list(map(ne, keys, chain((-1,), keys)))  # True at a run's start
        self.not_head = list(map(not_, self.head_mask))

    def split(self, values: list[int]) -> tuple[list[int], list[int]]:
        """``values`` as each run's first value and each value minus the one before it
        (0 at a run's first position)."""
        steps = list(map(mul, map(sub, values, chain((0,), values)), self.not_head))
        return list(map(values.__getitem__, self.heads)), steps


def _put_column(out: bytearray, column: tuple[bytes, ...], times: list[int], runs: _Runs) -> None:
    """One number slot over its template's records (column order): fixed decimals,
    shortest-repr floats or, failing both, the text of each number."""
    joined = b" ".join(column)
    first = column[0]
    dot = first.find(b".")
    decimals = len(first) - dot - 1 if dot >= 0 else 0
    values: list[int] | None = None
    kind = param = 0
    if decimals < _MAX_DIGITS and _fixed_regex(decimals).fullmatch(joined):
        negative_zero = b"-0." + b"0" * decimals if decimals else b"-0"
        if not (b"-0" in joined and negative_zero in column):
            kind, param = _FIXED, decimals
            values = list(map(int, joined.translate(None, b".").split()))
    if values is None:
        scale = max(map(len, _FRACTION.findall(joined)), default=0)
        if scale <= _MAX_DIGITS:
            try:
                scaled = list(map(round, map(mul, map(float, column), repeat(10.0**scale))))
            except (OverflowError, ValueError):
                scaled = []
            if (
                scaled
                and min(scaled) >= -_MAX_VALUE
                and max(scaled) <= _MAX_VALUE
                and list(map(b"%r".__mod__, map(truediv, scaled, repeat(10**scale))))
                == list(column)
            ):
                kind, param, values = _REPR, scale, scaled
    if values is None:
        out.append(_TEXT)
        put_ints(out, list(map(len, column)), delta=0)
        out += b"".join(column)
        return
    # predicted by the record's own time (a payload's "ts" costs nothing), or not; plain
    # or as runs of one key: the cheapest on a sample of the column's first values
    v0, t0 = values[0], times[0]
    exp = min(_EXPONENTS, key=lambda e: abs(v0 - (t0 * 10**e if e >= 0 else t0 // 10**-e)))
    sample = values[:_SAMPLE]
    residuals = list(map(sub, sample, _predictions(times[:_SAMPLE], exp)))
    head_mask = runs.head_mask[:_SAMPLE]
    _, pred, layout = min(
        (cost(seq, head_mask), pred, layout)
        for pred, seq in ((0, sample), (exp + 7, residuals))
        for layout, cost in ((_PLAIN, _plain_cost), (_RUNS, _runs_cost))
    )
    if pred:
        values = list(map(sub, values, _predictions(times, exp)))
    out += bytes((kind, param, pred, layout))
    if layout == _RUNS:
        heads, steps = runs.split(values)
        put_ints(out, heads)
        put_ints(out, steps, delta=0)
    else:
        put_ints(out, values)


def _plain_cost(values: list[int], head_mask: list[int]) -> int:
    """About the bits ``values`` take."""
    bits = sum(map(int.bit_length, values))
    return bits + (len(values) if values and min(values) < 0 else 0)  # a sign bit


def _runs_cost(values: list[int], head_mask: list[int]) -> int:
    """About the bits ``values`` take as runs (heads, then steps within a run)."""
    steps = list(map(sub, values, chain((0,), values)))
    heads = list(compress(values, head_mask))
    return _plain_cost(list(compress(steps, map(not_, head_mask))), head_mask) + sum(
        map(int.bit_length, heads)
    )


# --------------------------------------------------------------------------- decode


class Reader:
    """Bounds-checked reads over the decompressed body."""

    __slots__ = ("buf", "end", "pos", "stretch")

    def __init__(self, buf: bytes, stretch: int = STRETCH_VALUES) -> None:
        self.buf = buf
        self.pos = 0
        self.end = len(buf)
        #: numbers decoded at once (:data:`STRETCH_VALUES`)
        self.stretch = stretch

    def u8(self, what: str, most: int) -> int:
        if self.pos >= self.end:
            raise WireError("malformed", f"body ends before the {what}")
        n = self.buf[self.pos]
        self.pos += 1
        if n > most:
            raise WireError("malformed", f"{what} {n} > {most}")
        return n

    def u32(self, what: str, most: int) -> int:
        if self.end - self.pos < 4:
            raise WireError("malformed", f"body ends before the {what}")
        n = int.from_bytes(self.buf[self.pos : self.pos + 4], "little")
        self.pos += 4
        if n > most:
            raise WireError("malformed", f"{n} {what} > {most}")
        return n

    def ints(self, n: int, what: str, lo: int = I64_MIN, hi: int = I64_MAX) -> list[int]:
        """An integer column of ``n`` values, each checked to be in ``lo..hi``."""
        return Ints(self, n, what, lo, hi).take(n)

    def pieces(self, lengths: list[int], what: str) -> list[bytes]:
        """Consecutive byte strings of the given (already non-negative) lengths."""
        total = sum(lengths)
        if total > self.end - self.pos:
            raise WireError("malformed", f"{what} of {total} bytes overrun the body")
        offsets = list(accumulate(lengths, initial=self.pos))
        self.pos += total
        return list(map(self.buf.__getitem__, map(slice, offsets, offsets[1:])))

    def skip(self, total: int, what: str) -> int:
        """Step over ``total`` bytes (read later); return where they start."""
        if total > self.end - self.pos:
            raise WireError("malformed", f"{what} of {total} bytes overrun the body")
        at = self.pos
        self.pos += total
        return at


class Ints:
    """An integer column of the body, read in order a stretch at a time
    (:meth:`take`): only the stretch becomes Python ints. The column's place is checked
    and stepped over when it is opened."""

    __slots__ = (
        "buf", "carry", "checked", "delta", "done", "hi", "lo", "n", "planes", "pos", "stretch",
        "w", "what",
    )  # fmt: skip

    def __init__(self, rd: Reader, n: int, what: str, lo: int = I64_MIN, hi: int = I64_MAX) -> None:
        code = rd.u8(f"{what} column code", 0xFF)
        if code & ~_CODE_BITS:
            raise WireError("malformed", f"{what}: unknown column code {code:#04x}")
        self.w = w = 1 << (code & _WIDTH_BITS)
        self.delta = bool(code & _DELTA)
        self.planes = bool(code & _PLANES) and w > 1
        self.carry = 0
        if self.delta:
            if rd.end - rd.pos < 8:
                raise WireError("malformed", f"body ends before the {what} base")
            self.carry = int.from_bytes(rd.buf[rd.pos : rd.pos + 8], "little", signed=True)
            rd.pos += 8
        if n * w > rd.end - rd.pos:
            raise WireError("malformed", f"{what}: {n} values overrun the body")
        self.buf, self.pos, self.n, self.done, self.what = rd.buf, rd.pos, n, 0, what
        self.stretch = rd.stretch
        half = 1 << (8 * w - 1)
        # a column not coded as differences is in range by its width, unless told less
        self.checked = self.delta or lo > -half or hi < half - 1
        self.lo, self.hi = lo, hi
        rd.pos += n * w

    def take(self, k: int) -> list[int]:
        """The next ``k`` values."""
        a, b, w = self.done, self.done + k, self.w
        self.done = b
        data = array(_TYPECODE[w])
        if self.planes:
            raw = bytearray(k * w)
            for plane in range(w):
                at = self.pos + plane * self.n
                raw[plane::w] = self.buf[at + a : at + b]
            data.frombytes(raw)
        else:
            data.frombytes(self.buf[self.pos + a * w : self.pos + b * w])
        if _BIG_ENDIAN:
            data.byteswap()
        values = data.tolist()
        if self.delta and values:
            values = list(accumulate(values, initial=self.carry))
            del values[0]
            self.carry = values[-1]
        if self.checked and values and (min(values) < self.lo or max(values) > self.hi):
            raise WireError("malformed", f"{self.what}: a value is not in {self.lo}..{self.hi}")
        return values

    def total(self) -> int:
        """The sum of the values not yet taken (a stretch at a time; takes none)."""
        probe = copy.copy(self)
        left, out = probe.n - probe.done, 0
        while left:
            k = min(left, probe.stretch)
            out += sum(probe.take(k))
            left -= k
        return out


def _text(what: str, raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise WireError("malformed", f"{what} is not UTF-8") from None


class Budget:
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


def parse_columns(
    raw: bytes,
    *,
    flags: int,
    count: int,
    max_decoded: int,
    stretch: int = STRETCH_VALUES,
    coding: PayloadCoding | None = None,
) -> tuple[list[str], list[int], list[str], list[bytes]]:
    """The ``count`` records in ``raw``, a decompressed body written with header
    ``flags``, as columns: keys, event times, topics, payloads (their seqs follow from the
    header). Keys, topics and payloads together may take at most ``max_decoded`` bytes.
    Anything wrong raises :class:`WireError`. Columns, not records: building a tuple per
    record is a quarter of the decoding time, which a caller that hands the columns on
    (the gateway's decode workers) does not pay. ``stretch``: how many numbers become
    Python ints at once (what decoding holds; any value decodes the same records).
    ``coding``: the payload coding a body flagged with its flag is decoded with."""
    rd = Reader(raw, stretch)
    budget = Budget(max_decoded)
    n_keys = rd.u32("keys", count)
    key_bytes = rd.pieces(rd.ints(n_keys, "key lengths", 0), "keys")
    keys = [_text("key", k) for k in key_bytes]
    n_patterns = rd.u32("topics", count)
    prefix_lens = rd.ints(n_patterns, "topic prefix lengths", 0)
    suffix_lens = rd.ints(n_patterns, "topic suffix lengths", -1)
    lengths = [n for a, b in zip(prefix_lens, suffix_lens, strict=True) for n in (a, max(b, 0))]
    parts = rd.pieces(lengths, "topics")
    patterns = [
        (parts[2 * j], None if b < 0 else parts[2 * j + 1]) for j, b in enumerate(suffix_lens)
    ]
    n_pairs = rd.u32("pairs", count)
    pair_key = rd.ints(n_pairs, "pair keys", 0, n_keys - 1)
    pair_pattern = rd.ints(n_pairs, "pair topics", 0, n_patterns - 1)
    pair_of = rd.ints(count, "pair per record", 0, n_pairs - 1)
    if len(set(pair_of)) != n_pairs:
        raise WireError("malformed", "a (key, topic) pair no record uses")
    pair_size = []
    for k, t in zip(pair_key, pair_pattern, strict=True):
        a, b = patterns[t]
        pair_size.append(
            len(key_bytes[k]) + len(a) + (len(key_bytes[k]) + len(b) if b is not None else 0)
        )
    # keys and topics of every record are charged before a single topic string is built
    budget.spend(sum(map(pair_size.__getitem__, pair_of)))
    pair_topic = []
    for k, t in zip(pair_key, pair_pattern, strict=True):
        a, b = patterns[t]
        pair_topic.append(_text("topic", a + key_bytes[k] + b if b is not None else a))
    times = rd.ints(count, "event times")
    key_of = list(map(pair_key.__getitem__, pair_of))
    if coding is not None and flags & coding.flag:
        if flags & FLAG_TEMPLATED:
            raise WireError("malformed", "a body with two payload codings")
        payloads = coding.decode(rd, count, budget)
    elif flags & FLAG_TEMPLATED:
        payloads = _parse_templated(rd, key_of, n_keys, times, budget)
    else:
        lengths = rd.ints(count, "payload lengths", 0)
        if sum(lengths) != rd.end - rd.pos:
            raise WireError("malformed", "payload lengths do not match the body")
        budget.spend(sum(lengths))
        payloads = rd.pieces(lengths, "payloads")
    if rd.pos != rd.end:
        raise WireError("malformed", f"{rd.end - rd.pos} unread bytes at the end of the body")
    return (
        list(map(keys.__getitem__, key_of)),
        times,
        list(map(pair_topic.__getitem__, pair_of)),
        payloads,
    )


#: A stretch of a decoded numeric column: kind, decimals or scale (text: 0; plus _WIDE
#: when a value is beyond the float path's exact range), values (text: bytes).
_Column = tuple[int, int, list[Any]]


def _parse_templated(
    rd: Reader, key_of: list[int], n_keys: int, times: list[int], budget: Budget
) -> list[bytes]:
    """Templated payloads, a template and then a stretch of its records at a time: at
    most about ``rd.stretch`` numbers (:data:`STRETCH_VALUES`) are Python ints at once, and what a stretch
    renders is charged to ``budget`` before the next is read. Whatever the body, the
    decoder holds the records it built plus a bounded working set (docs/wire-format.md,
    "What decoding costs")."""
    count = len(key_of)
    n_templates = rd.u32("templates", count)
    slots = rd.ints(n_templates, "slots", 0, _MAX_SLOTS)
    seg_lens = Ints(rd, sum(slots) + n_templates, "segment lengths", 0)
    segs_at = copy.copy(seg_lens)  # read again, template by template, to render
    literal = [sum(seg_lens.take(s + 1)) for s in slots]
    segments = rd.skip(sum(literal), "segments")
    template_of = rd.ints(count, "template per record", 0, n_templates - 1)
    budget.spend(sum(map(literal.__getitem__, template_of)))
    order, sizes = _column_order(template_of, key_of, n_keys, n_templates)
    columns = sum(s for s, size in zip(slots, sizes, strict=True) if size)
    if columns > count + _MAX_SLOTS:
        raise WireError(
            "malformed", f"{columns} number columns for {count} records > {count + _MAX_SLOTS}"
        )
    payloads: list[bytes] = [b""] * count
    start = 0
    # a template at a time: its columns are opened where they lie, its records rendered
    # and charged, and its columns dropped before the next template's are opened
    for s, lit, size in zip(slots, literal, sizes, strict=True):
        members = order[start : start + size]
        start += size
        lengths = segs_at.take(s + 1)
        offsets = list(accumulate(lengths, initial=segments))
        segments = offsets[-1]
        if not members:
            continue
        segs = list(map(rd.buf.__getitem__, map(slice, offsets, offsets[1:])))
        if not s:
            for i in members:
                payloads[i] = segs[0]
            continue
        runs = _Runs(list(map(key_of.__getitem__, members)))
        cols = [_Numbers(rd, size, runs) for _ in range(s)]
        step = max(1, rd.stretch // s)
        for a in range(0, len(members), step):
            part = members[a : a + step]
            ts = list(map(times.__getitem__, part))
            stretch = [c.take(a, len(part), ts) for c in cols]
            bound = sum(_bound(c, len(part)) for c in stretch)
            if budget.used + bound <= budget.cap:
                rendered = _render_template(segs, stretch, len(part))
                budget.spend(sum(map(len, rendered)) - lit * len(part))
            else:
                rendered = _render_template_charged(segs, stretch, len(part), budget)
            for i, p in zip(part, rendered, strict=True):
                payloads[i] = p
    if rd.pos != rd.end:
        raise WireError("malformed", f"{rd.end - rd.pos} unread bytes at the end of the body")
    return payloads


def _bound(col: _Column, n: int) -> int:
    """The most ``n`` values of ``col`` can render to."""
    kind, _, values = col
    return sum(map(len, values)) if kind == _TEXT else n * _MAX_RENDERED[kind]


class _Numbers:
    """One number slot of a template over its records (column order), opened where it
    lies in the body and decoded a stretch at a time (:meth:`take`)."""

    __slots__ = ("acc", "buf", "heads", "kind", "off", "param", "pred", "runs", "text_at", "values")

    def __init__(self, rd: Reader, size: int, runs: _Runs) -> None:
        self.kind = rd.u8("column kind", _TEXT)
        self.buf, self.runs = rd.buf, runs
        self.param = self.pred = self.acc = self.off = self.text_at = 0
        self.heads: Ints | None = None
        if self.kind == _TEXT:
            self.values = Ints(rd, size, "number lengths", 1)
            self.text_at = rd.skip(self.values.total(), "numbers")
            return
        self.param = rd.u8("decimals", _MAX_DIGITS)
        self.pred = rd.u8("time exponent", len(_EXPONENTS))
        if rd.u8("column layout", _RUNS) == _RUNS:
            self.heads = Ints(rd, len(runs.heads), "number heads")
            self.values = Ints(rd, size, "number steps")
        else:
            self.values = Ints(rd, size, "numbers")

    def take(self, a: int, k: int, times: list[int]) -> _Column:
        """Positions ``a`` to ``a + k`` (the next ones), whose records' times are
        ``times``."""
        if self.kind == _TEXT:
            offsets = list(accumulate(self.values.take(k), initial=self.text_at))
            self.text_at = offsets[-1]
            return _TEXT, 0, list(map(self.buf.__getitem__, map(slice, offsets, offsets[1:])))
        values = self.values.take(k)
        if self.heads is not None:
            values = self._join(a, values)
        if self.pred:
            values = list(map(add, values, _predictions(times, self.pred - 7)))
        lo, hi = min(values), max(values)
        if lo < -_MAX_VALUE or hi > _MAX_VALUE:
            raise WireError("malformed", "a number has more than 18 digits")
        wide = 0 if hi < _FLOAT_EXACT and lo > -_FLOAT_EXACT else _WIDE
        return self.kind, self.param | wide, values

    def _join(self, a: int, steps: list[int]) -> list[int]:
        """Values from steps and the heads of the runs that start among them: each run's
        first value is its head, each next one the value before it plus its step. The
        running sum and the last run's offset carry over to the next stretch."""
        assert self.heads is not None
        b = a + len(steps)
        sums = list(accumulate(steps, initial=self.acc))
        del sums[0]
        self.acc = sums[-1]
        starts = self.runs.head_mask[a:b]
        offs = list(map(sub, self.heads.take(sum(starts)), compress(sums, starts)))
        if not starts[0]:
            offs.insert(0, self.off)  # the run that began in an earlier stretch
        self.off = offs[-1]
        run_of = self.runs.run_of
        first = run_of[a]
        return list(map(add, sums, map(offs.__getitem__, map(sub, run_of[a:b], repeat(first)))))


def _render_template(segs: list[bytes], cols: list[_Column], size: int) -> list[bytes]:
    """Each record's payload with one bytes ``%`` format: the template's segments around
    one conversion per slot, fed column by column."""
    if not cols:
        return [segs[0]] * size
    fmt = [segs[0].replace(b"%", b"%%")]
    args: list[list[Any]] = []
    for (kind, param, values), seg in zip(cols, segs[1:], strict=True):
        if kind == _TEXT:
            fmt.append(b"%s")
            args.append(values)
        elif kind == _REPR:
            fmt.append(b"%r")
            args.append(list(map(truediv, values, repeat(10 ** (param & ~_WIDE)))))
        elif not param & ~_WIDE:
            fmt.append(b"%d")
            args.append(values)
        elif not param & _WIDE:
            fmt.append(b"%%.%df" % param)
            args.append(list(map(truediv, values, repeat(10**param))))
        else:
            fmt.append(b"%s")
            args.append(list(map(_render_fixed, values, repeat(param & ~_WIDE))))
        fmt.append(seg.replace(b"%", b"%%"))
    return list(map(b"".join(fmt).__mod__, zip(*args, strict=True)))


def _render_template_charged(
    segs: list[bytes], cols: list[_Column], size: int, budget: Budget
) -> list[bytes]:
    """Like :func:`_render_template`, one number at a time, each charged to the budget
    before it is kept: for batches whose numbers could exceed what is left of it."""
    render: list[Callable[[Any], bytes]] = []
    for kind, param, _ in cols:
        if kind == _FIXED:
            render.append(partial(_render_fixed, decimals=param & ~_WIDE))
        elif kind == _REPR:
            render.append(partial(_render_repr, scale=param & ~_WIDE))
        else:
            render.append(bytes)
    out = []
    for j in range(size):
        parts = [segs[0]]
        for (_, _, values), fn, seg in zip(cols, render, segs[1:], strict=True):
            text = fn(values[j])
            budget.spend(len(text))
            parts.append(text)
            parts.append(seg)
        out.append(b"".join(parts))
    return out
