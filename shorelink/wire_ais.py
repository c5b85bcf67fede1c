"""AIS sentences as fields: the payload coding of a batch whose records carry AIVDM/AIVDO.

Why: a ship's AIS stream is NMEA text, ``!AIVDM,1,1,,A,13RlIW?04F1beOVEFLB9bRvH0L0L,0*6C``
a record. zstd on 200 such lines learns little: the 6-bit armoring hides the bit fields
from it (an MMSI or a latitude straddles characters), and the framing and checksum are
bytes it must send. Decoded into fields, the same records are columns zstd does well on:
the MMSI an index into the batch's MMSIs, positions a difference from the vessel's
previous one, each other field a column of its own, the framing a few small numbers and
the checksum recomputed (docs/wire-format.md, "AIS sentences").

Lossless for any payload: a record is coded so only when it is one or more sentences
that render back byte for byte (:func:`parse_record`: a valid checksum or none, fill bits
0-5, every field as given, ``\\n`` or ``\\r\\n`` between sentences and optionally after
the last); any other record goes literally, inside the same section. The encoder takes
this coding when at least half of a batch's records are such sentences and it has at
least :data:`MIN_RECORDS` (``FLAG_AIS``); otherwise the body is coded as before.

A decoder is bounded as the rest of the body is (shorelink/wire_body.py): every count,
index and value is checked against what remains and the field's width before use, the
rendered bytes are charged to the budget before they are built, and sentences are decoded
a stretch at a time (:data:`STRETCH_SENTENCES`), so a hostile body costs no more than
:func:`shorelink.wire.decode_cost_bound` says.
"""

from __future__ import annotations

import copy
import re
import struct
from bisect import bisect_right
from collections import Counter
from collections.abc import Iterator
from itertools import accumulate, repeat
from typing import NamedTuple

from shorelink.wire_body import I64_MAX, Budget, Ints, Reader, WireError, put_ints

__all__ = [
    "AIS",
    "FIELD_COLUMNS",
    "FLAG_AIS",
    "MAX_CHARS",
    "MAX_EXTRA_MMSIS",
    "MAX_FORMS",
    "MAX_HEADS",
    "MAX_SENTENCES",
    "MIN_RECORDS",
    "STRETCH_SENTENCES",
    "Sentence",
    "parse_record",
    "render_record",
]

#: Header flag: the body's payloads are coded as AIS fields (this module).
FLAG_AIS = 0x08
#: records in a batch coded as fields, at least: a batch of fewer (a satellite session's
#: one record since the last) is smaller as text (bench/wire_size.py: 173 bytes a record
#: as fields, 155 as text, one record a batch; even at 8; fewer as fields from there on)
MIN_RECORDS = 8
#: sentences in one record coded as fields, at most (a record with more goes literally)
MAX_SENTENCES = 64
#: armored characters in one sentence coded as fields, at most
MAX_CHARS = 255
#: distinct MMSIs in a batch, at most this many more than its records
MAX_EXTRA_MMSIS = 4096
#: sentences a decoder turns into fields at once
STRETCH_SENTENCES = 4096

_SENTENCE = re.compile(
    rb"!([A-Z]{2}VD[MO]),([1-9]),([1-9]),([0-9]?),([AB12]?),([0-W`-w]*),([0-5])"
    rb"(?:\*([0-9A-Fa-f]{2}))?(\r\n|\n)?"
)
_CHANNELS = (b"", b"A", b"B", b"1", b"2")
_SEPS = (b"", b"\n", b"\r\n")
_UPPER, _LOWER, _NONE = 0, 1, 2  # checksum as sent
_NO_SEQID = 10
_ARMOR = bytes(list(range(48, 88)) + list(range(96, 120)))  # 6-bit value -> character
_UNARMOR = {c: v for v, c in enumerate(_ARMOR)}


class Sentence(NamedTuple):
    """One sentence as its fields: everything needed to render it back exactly."""

    head: bytes  # talker and formatter, b"AIVDM"
    total: int  # fragments of the message, 1-9
    num: int  # this fragment, 1-9
    seqid: int  # 0-9, or 10: empty
    channel: int  # index in _CHANNELS
    chars: int  # armored characters of the data field
    bits: int  # the data field's 6 * chars bits, as one number
    fill: int  # 0-5
    checksum: int  # _UPPER, _LOWER or _NONE
    sep: int  # index in _SEPS: what follows the sentence


def _xor(data: bytes) -> int:
    x = 0
    for b in data:
        x ^= b
    return x


def _body(s: Sentence, data: bytes) -> bytes:
    """The sentence between ``!`` and ``*``."""
    seqid = b"" if s.seqid == _NO_SEQID else b"%d" % s.seqid
    return b"%s,%d,%d,%s,%s,%s,%d" % (
        s.head, s.total, s.num, seqid, _CHANNELS[s.channel], data, s.fill
    )  # fmt: skip


def _armor(bits: int, chars: int) -> bytes:
    return bytes(_ARMOR[(bits >> (6 * (chars - 1 - i))) & 63] for i in range(chars))


def render(s: Sentence) -> bytes:
    """The sentence's bytes, its checksum recomputed."""
    body = _body(s, _armor(s.bits, s.chars))
    if s.checksum == _NONE:
        tail = b""
    else:
        tail = (b"*%02X" if s.checksum == _UPPER else b"*%02x") % _xor(body)
    return b"!" + body + tail + _SEPS[s.sep]


def render_record(sentences: list[Sentence]) -> bytes:
    return b"".join(map(render, sentences))


def parse_record(payload: bytes) -> list[Sentence] | None:
    """``payload`` as its sentences, or None unless it is 1 to :data:`MAX_SENTENCES`
    sentences that :func:`render_record` gives back byte for byte."""
    out: list[Sentence] = []
    pos, end = 0, len(payload)
    while pos < end:
        m = _SENTENCE.match(payload, pos)
        if m is None or len(out) == MAX_SENTENCES:
            return None
        head, total, num, seqid, channel, data, fill, check, sep = m.groups()
        if len(data) > MAX_CHARS or (sep is None and m.end() != end):
            return None
        bits = 0
        for c in data:
            bits = (bits << 6) | _UNARMOR[c]
        s = Sentence(
            head, int(total), int(num), int(seqid) if seqid else _NO_SEQID,
            _CHANNELS.index(channel), len(data), bits, int(fill),
            _NONE if check is None else (_LOWER if check != check.upper() else _UPPER),
            _SEPS.index(sep or b""),
        )  # fmt: skip
        if check is not None and int(check, 16) != _xor(payload[pos + 1 : m.start(8) - 1]):
            return None  # a bad checksum goes as it came
        out.append(s)
        pos = m.end()
    if not out or render_record(out) != payload:
        return None
    return out


# --------------------------------------------------------------------------- fields

#: The body's field columns: name -> (width in bits, kind). A column is shared by every
#: message type that has the field, in sentence order. ``_SMALL`` fields of a sentence
#: are one value of the column ``small`` together (a byte each would cost zstd's entropy
#: coder at least a bit a field).
_PLAIN, _MMSI, _POSITION, _TRACK, _SMALL, _HEADING, _SIGNED = 0, 1, 2, 3, 4, 5, 6
_COLUMNS: dict[str, tuple[int, int]] = {
    "small": (0, _PLAIN),
    "repeat": (2, _PLAIN),
    "mmsi": (30, _MMSI),
    "status": (4, _SMALL),
    "turn": (8, _SIGNED),
    "speed": (10, _TRACK),
    "accuracy": (1, _SMALL),
    "lon": (28, _POSITION),
    "lat": (27, _POSITION),
    "course": (12, _TRACK),
    "heading": (9, _HEADING),
    "second": (6, _PLAIN),
    "maneuver": (2, _PLAIN),
    "spare3": (3, _PLAIN),
    "raim": (1, _SMALL),
    "radio_state": (5, _PLAIN),  # SOTDMA's sync state and slot timeout
    "radio_sub": (14, _PLAIN),
    "year": (14, _PLAIN),
    "month": (4, _PLAIN),
    "day": (5, _PLAIN),
    "hour": (5, _PLAIN),
    "minute": (6, _PLAIN),
    "epfd": (4, _SMALL),
    "spare10": (10, _PLAIN),
    "ais_version": (2, _PLAIN),
    "imo": (30, _PLAIN),
    "reserved8": (8, _PLAIN),
    "flags7": (7, _PLAIN),  # class B's regional, cs, display, dsc, band, msg22, assigned
    "radio20": (20, _PLAIN),
    "partno": (2, _PLAIN),
}
_HEAD = ("repeat", "mmsi")
_POSITION_A = ("status", "turn", "speed", "accuracy", "lon", "lat", "course", "heading",
               "second", "maneuver", "spare3", "raim", "radio_state", "radio_sub")  # fmt: skip
_BASE = ("year", "month", "day", "hour", "minute", "second", "accuracy", "lon", "lat",
         "epfd", "spare10", "raim", "radio_state", "radio_sub")  # fmt: skip
_CLASS_B = ("reserved8", "speed", "accuracy", "lon", "lat", "course", "heading", "second")
#: message type -> its fields after the type (first fragments only); a type not named
#: has the repeat indicator and the MMSI as fields, its other bits are raw
_LAYOUTS: dict[int, tuple[str, ...]] = {
    1: _HEAD + _POSITION_A,
    2: _HEAD + _POSITION_A,
    3: _HEAD + _POSITION_A,
    4: _HEAD + _BASE,
    5: (*_HEAD, "ais_version", "imo"),
    11: _HEAD + _BASE,
    18: (*_HEAD, *_CLASS_B, "flags7", "raim", "radio20"),
    19: _HEAD + _CLASS_B,
    24: (*_HEAD, "partno"),
}
_NAMES = list(_COLUMNS)
#: the section's field columns, in the order they follow the framing
FIELD_COLUMNS = tuple(_NAMES)
_WIDTH = [w for w, _ in _COLUMNS.values()]
_KIND = [k for _, k in _COLUMNS.values()]
_SMALL_COL, _MMSI_COL = _NAMES.index("small"), _NAMES.index("mmsi")
_COURSE_COL = _NAMES.index("course")
_NO_COURSE = 3600  # "not available"


def _heading_of(course: int) -> int:
    """The heading a course predicts (a heading is coded as its difference from it)."""
    return course // 10 if course < _NO_COURSE else 511


#: layout (message type 1-27; 0: every bit raw) -> its columns, and the bits of the type
#: and the first k fields
_FIELDS = [()] + [tuple(map(_NAMES.index, _LAYOUTS.get(t, _HEAD))) for t in range(1, 28)]
_ENDS = [list(accumulate((_WIDTH[c] for c in cols), initial=6)) for cols in _FIELDS]
_ENDS[0] = [0]
_LAYOUT_MOST = 27
_LEAST_SIZE = 15  # bytes the shortest sentence renders to (_Form.size)
_FORM = struct.Struct("<9B")
#: distinct forms of sentence in a batch, at most (a batch with more is coded as before)
MAX_FORMS = 256
MAX_HEADS = 256


class _Form(NamedTuple):
    """What sentences share (the batch's table of forms; each sentence names one): all
    but the channel and the data field's bits."""

    head: int  # index in the batch's heads
    total: int
    num: int
    seqid: int
    layout: int
    chars: int
    fill: int
    checksum: int
    sep: int

    @property
    def fields(self) -> tuple[int, ...]:
        """The columns of the fields its bits cover, in order."""
        ends = _ENDS[self.layout]
        return _FIELDS[self.layout][: bisect_right(ends, 6 * self.chars) - 1]

    @property
    def rest(self) -> int:
        """Bits after the type and the fields (the raw bits)."""
        return 6 * self.chars - _ENDS[self.layout][len(self.fields)]

    @property
    def size(self) -> int:
        """Bytes the sentence renders to."""
        return (
            15 + self.chars + (self.seqid != _NO_SEQID) + 3 * (self.checksum != _NONE)
            + len(_SEPS[self.sep])
        )  # fmt: skip


def _layout(s: Sentence) -> int:
    """The sentence's layout: its message type if it is a first fragment of one (1-27),
    else 0 (every bit raw)."""
    nbits = 6 * s.chars
    if s.num != 1 or not nbits:
        return 0
    kind = s.bits >> (nbits - 6)
    return kind if 1 <= kind <= _LAYOUT_MOST else 0


def _form_of(f: bytes, n_heads: int) -> _Form:
    form = _Form(*_FORM.unpack(f))
    most = (n_heads - 1, 9, 9, _NO_SEQID, _LAYOUT_MOST, MAX_CHARS, 5, _NONE, len(_SEPS) - 1)
    least = (0, 1, 1, 0, 0, 1 if form.layout else 0, 0, 0, 0)
    if any(not lo <= v <= hi for lo, v, hi in zip(least, form, most, strict=True)):
        raise WireError("malformed", f"AIS sentence form {tuple(form)} out of range")
    return form


def _most_mmsis(records: list[bytes] | list[int]) -> int:
    """Distinct MMSIs a batch of ``records`` may code: a decoder keeps a few of its own
    numbers for each (its last position, speed and course), within the bound it is
    charged per record (``DECODE_RECORD_BYTES``) and its fixed working set."""
    return len(records) + MAX_EXTRA_MMSIS


def _ints(values: list[int], delta: int = 0) -> bytes:
    out = bytearray()
    put_ints(out, values, delta=delta)
    return bytes(out)


def _signed(u: int, w: int) -> int:
    return u - (1 << w) if u >> (w - 1) else u


class _Coding:
    """The AIS payload coding: what ``build_body`` and ``parse_columns`` call."""

    flag = FLAG_AIS

    def encode(self, payloads: list[bytes]) -> bytearray | None:
        """The payload section, or None when fewer than half the records are sentences
        (or they have more forms, heads or MMSIs than a decoder takes)."""
        parts = self.parts(payloads)
        return None if parts is None else bytearray(b"".join(p for _, p in parts))

    def parts(self, payloads: list[bytes]) -> list[tuple[str, bytes]] | None:
        """The section as its parts in order, each named (bench/wire_size.py measures
        where the bytes go), or None where the coding does not apply: fewer than
        :data:`MIN_RECORDS` records, or fewer than half of them sentences."""
        n = len(payloads)
        if n < MIN_RECORDS or 2 * sum(map(bytes.startswith, payloads, repeat(b"!"))) < n:
            return None  # (a C loop: other streams pay about 0.06 us a record for it)
        parsed = list(map(parse_record, payloads))
        coded = [p for p in parsed if p is not None]
        if not coded or 2 * len(coded) < len(payloads):
            return None
        sentences = [s for p in coded for s in p]
        heads = {h: i for i, h in enumerate(dict.fromkeys(s.head for s in sentences))}
        layouts = list(map(_layout, sentences))
        forms_of = [
            _Form(
                heads[s.head], s.total, s.num, s.seqid, layout, s.chars, s.fill, s.checksum, s.sep
            )
            for s, layout in zip(sentences, layouts, strict=True)
        ]
        forms = {f: i for i, f in enumerate(dict.fromkeys(forms_of))}
        table = sorted(
            {
                (s.bits >> (6 * s.chars - 38)) & ((1 << 30) - 1)
                for s, f in zip(sentences, forms_of, strict=True)
                if _MMSI_COL in f.fields
            }
        )
        if len(heads) > MAX_HEADS or len(forms) > MAX_FORMS or len(table) > _most_mmsis(payloads):
            return None
        mmsis = {m: i for i, m in enumerate(table)}
        columns: list[list[int]] = [[] for _ in _NAMES]
        state = _State(len(table))
        rest = bytearray()
        for s, f in zip(sentences, forms_of, strict=True):
            who = small = 0
            course = _NO_COURSE
            for c, at in zip(f.fields, _ENDS[f.layout], strict=False):
                w = _WIDTH[c]
                v = (s.bits >> (6 * s.chars - at - w)) & ((1 << w) - 1)
                if _KIND[c] == _SMALL:
                    small = (small << w) | v
                    continue
                if c == _MMSI_COL:
                    who = v = mmsis[v]
                elif _KIND[c] == _HEADING:
                    v = state.heading(c, who, v, course)
                elif _KIND[c] == _SIGNED:
                    v = _zigzag(_signed(v, w))
                elif _KIND[c] != _PLAIN:
                    if c == _COURSE_COL:
                        course = v
                    v = state.encode(c, who, v)
                columns[c].append(v)
            if _SMALL_BITS[f.layout][len(f.fields)]:
                columns[_SMALL_COL].append(small)
            r = f.rest
            rest += (s.bits & ((1 << r) - 1)).to_bytes((r + 7) // 8, "big")
        literal = [payloads[i] for i, p in enumerate(parsed) if p is None]
        return [
            ("sentences per record", _ints([0 if p is None else len(p) for p in parsed])),
            ("literal lengths", _ints(list(map(len, literal)))),
            ("literal", b"".join(literal)),
            ("heads", len(heads).to_bytes(4, "little") + b"".join(heads)),
            ("forms", len(forms).to_bytes(4, "little") + b"".join(_FORM.pack(*f) for f in forms)),
            ("mmsi table", len(table).to_bytes(4, "little") + _ints(table, delta=1)),
            ("form", _ints(list(map(forms.__getitem__, forms_of)))),
            ("channel", _ints([s.channel for s in sentences])),
            *((name, _ints(values)) for name, values in zip(_NAMES, columns, strict=True)),
            ("raw bits", bytes(rest)),
        ]

    def decode(self, rd: Reader, count: int, budget: Budget) -> list[bytes]:
        """The ``count`` payloads of the section at ``rd``."""
        per_record = rd.ints(count, "AIS sentences per record", 0, MAX_SENTENCES)
        n_literal = per_record.count(0)
        lengths = rd.ints(n_literal, "literal payload lengths", 0)
        budget.spend(sum(lengths))
        literal = iter(rd.pieces(lengths, "literal payloads"))
        n_heads = rd.u32("AIS heads", MAX_HEADS)
        heads = rd.pieces([5] * n_heads, "AIS heads")
        n_forms = rd.u32("AIS sentence forms", MAX_FORMS)
        forms = [_form_of(f, n_heads) for f in rd.pieces([_FORM.size] * n_forms, "AIS forms")]
        n_mmsis = rd.u32("MMSIs", _most_mmsis(per_record))
        mmsis = rd.ints(n_mmsis, "MMSIs", 0, (1 << 30) - 1)
        n = sum(per_record)
        form_of = Ints(rd, n, "AIS sentence forms", 0, n_forms - 1)
        channels = Ints(rd, n, "AIS channels", 0, len(_CHANNELS) - 1)
        if budget.used + _LEAST_SIZE * n > budget.cap:
            raise WireError(
                "decompressed_too_large",
                f"{n} AIS sentences decode to more than {budget.cap} bytes",
            )
        # how many values each column holds, and the raw bits' bytes: from the number of
        # sentences of each form (counted a stretch at a time)
        uses: Counter[int] = Counter()
        probe = copy.copy(form_of)
        for a in range(0, n, STRETCH_SENTENCES):
            uses.update(probe.take(min(STRETCH_SENTENCES, n - a)))
        sizes = [0] * len(_NAMES)
        rest_bytes = 0
        for i, f in enumerate(forms):
            used = uses[i]
            for c in _values_of(f):
                sizes[c] += used
            rest_bytes += used * ((f.rest + 7) // 8)
        cols = [
            Ints(rd, size, f"AIS {name}", *_range(c))
            for c, (name, size) in enumerate(zip(_NAMES, sizes, strict=True))
        ]
        rest = _Rest(rd.buf, rd.skip(rest_bytes, "AIS raw bits"))
        if rd.pos != rd.end:
            raise WireError("malformed", f"{rd.end - rd.pos} unread bytes at the end of the body")
        framing = _Framing(form_of, channels, cols, heads, forms, mmsis, rest)
        out: list[bytes] = []
        group: list[int] = []
        held = 0
        for m in per_record:
            group.append(m)
            held += m
            if held >= STRETCH_SENTENCES:
                framing.render(group, held, literal, budget, out)
                group, held = [], 0
        framing.render(group, held, literal, budget, out)
        return out


#: per layout and fields covered: the bits of the covered ``_SMALL`` fields together
_SMALL_BITS = [
    list(accumulate((_WIDTH[c] * (_KIND[c] == _SMALL) for c in cols), initial=0))
    for cols in _FIELDS
]


def _values_of(f: _Form) -> list[int]:
    """The columns a sentence of form ``f`` has a value in, in order."""
    cols = [c for c in f.fields if _KIND[c] != _SMALL]
    return [*cols, _SMALL_COL] if _SMALL_BITS[f.layout][len(f.fields)] else cols


def _range(c: int) -> tuple[int, ...]:
    """The values column ``c`` may hold (checked as it is read; the rest when used)."""
    w, kind = _WIDTH[c], _KIND[c]
    if kind in (_PLAIN, _MMSI, _SIGNED) and w:
        return (0, (1 << w) - 1)
    if kind == _HEADING:
        return (0, 511)
    return (0, I64_MAX)  # a difference, zigzagged: checked once added to its base


def _zigzag(v: int) -> int:
    """Signed as unsigned, small either side of 0 small (0, -1, 1, -2 -> 0, 1, 2, 3): a
    column of differences keeps its high bytes 0, which zstd codes for nearly nothing
    (two's complement would make them 0 or 255 at random)."""
    return 2 * v if v >= 0 else -2 * v - 1


def _unzigzag(z: int) -> int:
    return (z >> 1) ^ -(z & 1)


class _State:
    """What a field is coded against: a position, the vessel's last one (its MMSI's
    index in the batch) or else the last one of any vessel (a station hears one area); a
    vessel's speed or course, its last one (its first: the value itself). Differences
    are zigzagged."""

    __slots__ = ("anyone", "last")

    def __init__(self, vessels: int) -> None:
        self.last: dict[int, list[int | None]] = {
            c: [None] * vessels
            for c, kind in enumerate(_KIND)
            if kind in (_POSITION, _TRACK, _HEADING)
        }
        self.anyone = dict.fromkeys(self.last, 0)

    def _base(self, c: int, who: int) -> int | None:
        """What the value is a difference from (None: none, the value itself)."""
        seen = self.last[c][who]
        if seen is not None or _KIND[c] != _POSITION:
            return seen
        return self.anyone[c]

    def encode(self, c: int, who: int, u: int) -> int:
        v = _signed(u, _WIDTH[c]) if _KIND[c] == _POSITION else u
        base = self._base(c, who)
        self.last[c][who] = self.anyone[c] = v
        return v if base is None else _zigzag(v - base)

    def heading(self, c: int, who: int, v: int, course: int, *, decode: bool = False) -> int:
        """A heading (``v``; decoding: what was stored) as its difference from the
        vessel's last one, or for its first from its course's tenth, within -256..255
        modulo 512, zigzagged; decoding, the heading."""
        seen = self.last[c][who]
        base = _heading_of(course) if seen is None else seen
        if decode:
            v = (_unzigzag(v) + base) % 512
            self.last[c][who] = v
            return v
        self.last[c][who] = v
        return _zigzag((v - base + 256) % 512 - 256)

    def decode(self, c: int, who: int, stored: int) -> int:
        """The field's bits from the stored difference; WireError if out of its width."""
        w = _WIDTH[c]
        base = self._base(c, who)
        v = stored if base is None else _unzigzag(stored) + base
        if _KIND[c] == _POSITION:
            lo, hi = -(1 << (w - 1)), (1 << (w - 1)) - 1
        else:
            lo, hi = 0, (1 << w) - 1
        if not lo <= v <= hi:
            raise WireError("malformed", f"AIS {_NAMES[c]} {v} not in {lo}..{hi}")
        self.last[c][who] = self.anyone[c] = v
        return v & ((1 << w) - 1)


class _Rest:
    """The raw bits of each sentence, in order, as they lie in the body."""

    __slots__ = ("at", "buf")

    def __init__(self, buf: bytes, at: int) -> None:
        self.buf, self.at = buf, at

    def take(self, r: int) -> int:
        nbytes = (r + 7) // 8
        tail = int.from_bytes(self.buf[self.at : self.at + nbytes], "big")
        self.at += nbytes
        if tail >> r:
            raise WireError("malformed", "AIS raw bits past the data field")
        return tail


class _Framing:
    """A section's columns, opened; :meth:`render` decodes the next records a stretch
    of sentences at a time."""

    def __init__(
        self,
        form_of: Ints,
        channels: Ints,
        cols: list[Ints],
        heads: list[bytes],
        forms: list[_Form],
        mmsis: list[int],
        rest: _Rest,
    ) -> None:
        self.form_of, self.channels, self.cols = form_of, channels, cols
        self.heads, self.forms, self.mmsis, self.rest = heads, forms, mmsis, rest
        self.values = list(map(_values_of, forms))
        self.state = _State(len(mmsis))

    def render(
        self, group: list[int], k: int, literal: Iterator[bytes], budget: Budget, out: list[bytes]
    ) -> None:
        """Append the payloads of ``group`` (records' sentence counts, 0: literal), whose
        sentences are the next ``k``."""
        form_of, channels = self.form_of.take(k), self.channels.take(k)
        budget.spend(sum(self.forms[i].size for i in form_of))
        counts = [0] * len(_NAMES)
        for i in form_of:
            for c in self.values[i]:
                counts[c] += 1
        its = [iter(col.take(n)) for col, n in zip(self.cols, counts, strict=True)]
        sents: list[Sentence] = []
        for i, channel in zip(form_of, channels, strict=True):
            f = self.forms[i]
            fields = f.fields
            bits = f.layout
            who = 0
            course = _NO_COURSE
            small_w = _SMALL_BITS[f.layout][len(fields)]
            small = next(its[_SMALL_COL]) if small_w else 0
            if small >> small_w:
                raise WireError("malformed", f"AIS small fields {small} wider than {small_w} bits")
            for c in fields:
                w = _WIDTH[c]
                if _KIND[c] == _SMALL:
                    small_w -= w
                    v = (small >> small_w) & ((1 << w) - 1)
                else:
                    v = next(its[c])
                    if c == _MMSI_COL:
                        if v >= len(self.mmsis):
                            raise WireError("malformed", f"MMSI {v} of {len(self.mmsis)}")
                        who, v = v, self.mmsis[v]
                    elif _KIND[c] == _HEADING:
                        v = self.state.heading(c, who, v, course, decode=True)
                    elif _KIND[c] == _SIGNED:
                        v = _unzigzag(v) & ((1 << w) - 1)
                    elif _KIND[c] != _PLAIN:
                        v = self.state.decode(c, who, v)
                        if c == _COURSE_COL:
                            course = v
                bits = (bits << w) | v
            r = f.rest
            bits = (bits << r) | self.rest.take(r)
            sents.append(
                Sentence(
                    self.heads[f.head],
                    f.total,
                    f.num,
                    f.seqid,
                    channel,
                    f.chars,
                    bits,
                    f.fill,
                    f.checksum,
                    f.sep,
                )
            )
        j = 0
        for m in group:
            if m:
                out.append(render_record(sents[j : j + m]))
                j += m
            else:
                out.append(next(literal))


AIS = _Coding()
