"""bench/fuzz.py's ``logs`` target: one event through ``shorelink/logs.py`` as a
process's handler writes it (``formatter()``: logfmt, logfmt under systemd with the
priority, JSON), and as any other handler reads its record's message (logfmt of the
event and its fields).

The input is read with atheris's ``FuzzedDataProvider``: a level; then either a call of
ours (``log.<level>("fuzzed", **fields)``, ``log.exception`` inside a handled exception)
with up to eight fields, each key any text and each value text of any code point (lone
surrogates included), bytes, an int (past the 4,300 digits ``str`` writes), a float
(NaN, infinities), a bool, None, an object whose ``str`` is any text or raises, an
exception, or a huge text; or another library's record whose message is any text.

A finding is any of: an exception; output that is not exactly one line (one ``\\n``, at
its end, nothing else ``str.splitlines`` splits at, every character printable); a line
that the strict reader (tests/logfmt.py; ``json.loads`` for JSON) does not read as its
fields; ``ts``, ``level``, ``logger`` and ``event`` (``message``) not the first four
fields or not the call's (a time of this call, its level and logger, the event); not
exactly one field per value in the call's order, each under its key as documented and
coming back exactly (JSON reads a high and a low surrogate side by side as the one
character they encode: compared so); more than :data:`ESCAPED_CHARS` characters written
per character of input plus :data:`LINE_FIXED_CHARS`; more CPU than :data:`CPU_FIXED_S`
plus :data:`CPU_PER_CHAR_S` per character written.
"""

from __future__ import annotations

import ast
import io
import json
import logging
import re
import time
import traceback
from collections import Counter
from typing import Any

import atheris

from shorelink.logs import formatter, get_logger
from tests.logfmt import read_logfmt

__all__ = ["CPU_FIXED_S", "CPU_PER_CHAR_S", "DICTIONARY", "check", "seeds"]

NAME = "shorelink.fuzz"
LIBRARY = "aiohttp.fuzz"
EVENT = "fuzzed"
#: a character written as ``\\uXXXX\\uXXXX`` (one beyond U+FFFF that is not printable)
ESCAPED_CHARS = 12
LINE_FIXED_CHARS = 160
CPU_FIXED_S = 0.05
CPU_PER_CHAR_S = 2e-6
_METHODS = {
    "debug": "debug",
    "info": "info",
    "warning": "warning",
    "warn": "warning",
    "error": "error",
    "exception": "error",
    "critical": "critical",
    "fatal": "critical",
}
_PRIORITY = {"critical": 2, "error": 3, "warning": 4, "info": 6, "debug": 7}
_STDLIB_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}
#: keys that are structlog's or the standard library's machinery, not a call site's
#: field (``event`` is the call's first argument)
_MACHINERY = {"event", "exc_info", "stack_info", "_record", "_from_structlog"}
#: the line's own fields: a call's field of one of these names gets a ``_`` after it
_OWN = ("ts", "level", "logger", "event", "exc")
_KEY_CHARS = re.compile(r"[^A-Za-z0-9_.\-]")
_TS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
DICTIONARY = [
    b" level=debug",
    b" event=all_good",
    b" ts=2001-01-01T00:00:00.000Z",
    b"logger=x",
    b"exc",
    b"message",
    b"level",
    b"\n",
    b"\r\n",
    b"\xe2\x80\xa8",
    b"\xc2\x85",
    b"\xc2\xa0",
    b'"',
    b"\\",
    b"=",
    b"<3>",
]

stats: dict[str, Any] = {"outcomes": Counter(), "chars_over_bound": 0.0, "cpu_over_bound": 0.0}
_MODES: tuple[dict[str, bool], ...] = ({}, {"priority": True}, {"as_json": True})
#: what a value's ``str`` may raise
_RAISES: list[type[Exception]] = [RuntimeError, ValueError, TypeError, UnicodeError]


class _Text:
    """A value whose ``str`` is any text (or raises)."""

    def __init__(self, text: str, raises: type[Exception] | None) -> None:
        self.text, self.raises = text, raises

    def __str__(self) -> str:
        if self.raises is not None:
            raise self.raises(self.text)
        return self.text


class _Message(logging.Formatter):
    """What any other handler reads of a record: its message alone."""

    def format(self, record: logging.LogRecord) -> str:
        return record.getMessage()


def _buffers() -> tuple[list[io.StringIO], io.StringIO]:
    """The three formatters' outputs and a plain handler's (the record's message), on
    our logger and another library's."""
    outs = [io.StringIO() for _ in _MODES]
    plain = io.StringIO()
    for name in (NAME, LIBRARY):
        std = get_logger(name)._logger
        std.handlers.clear()
        for out, mode in zip(outs, _MODES, strict=True):
            handler = logging.StreamHandler(out)
            handler.setFormatter(formatter(**mode))
            std.addHandler(handler)
        std.propagate = False
        std.setLevel(logging.DEBUG)
    message = logging.StreamHandler(plain)
    message.setFormatter(_Message())
    get_logger(NAME)._logger.addHandler(message)
    return outs, plain


_OUTS, _PLAIN = _buffers()


def _value(fdp: atheris.FuzzedDataProvider) -> object:
    kind = fdp.ConsumeIntInRange(0, 10)
    n = fdp.ConsumeIntInRange(0, 64)
    if kind == 0:
        return fdp.ConsumeUnicode(n)
    if kind == 1:
        return fdp.ConsumeBytes(n)
    if kind == 2:
        return fdp.ConsumeInt(fdp.ConsumeIntInRange(1, 24))
    if kind == 3:
        return int.from_bytes(fdp.ConsumeBytes(n * 64), "little") * (-1) ** n  # huge
    if kind == 4:
        return fdp.ConsumeFloat()
    if kind == 5:
        return fdp.PickValueInList([True, False, None])
    if kind == 6:
        return _Text(fdp.ConsumeUnicode(n), None)
    if kind == 7:
        return _Text(fdp.ConsumeUnicode(n), fdp.PickValueInList(_RAISES))
    if kind == 8:
        return ValueError(fdp.ConsumeUnicode(n))
    if kind == 9:
        return fdp.ConsumeUnicode(1) * fdp.ConsumeIntInRange(1_000, 20_000)
    return fdp.ConsumeUnicode(n) + " level=debug event=all_good\n" + fdp.ConsumeUnicode(n)


def _text(value: object) -> str:
    """A value as the docs say it is written (shorelink/logs.py)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return repr(value)
    if isinstance(value, _Text):
        return value.text if value.raises is None else object.__repr__(value)
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return str(value)
        except ValueError:
            return hex(value)
    return str(value)


def _as_json(value: object) -> object:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int) and abs(value) < 1 << 64:
        return value
    if isinstance(value, float) and value == value and abs(value) != float("inf"):
        return value
    return _text(value)


def _joined(text: str) -> str:
    """``text`` as JSON reads it back: a high and a low surrogate side by side are the one
    character they encode."""
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")


def _same(got: object, want: object) -> bool:
    if isinstance(want, str):
        return isinstance(got, str) and got == _joined(want)
    if isinstance(want, float):
        return isinstance(got, float | int) and float(got) == want
    return got == want and type(got) is type(want)


def _keys(fields: dict[str, object]) -> list[str]:
    """The keys the line writes the fields under (documented in shorelink/logs.py)."""
    seen, out = set(_OWN), []
    for key in fields:
        k = _KEY_CHARS.sub("_", key) or "_"
        while k in seen:
            k += "_"
        seen.add(k)
        out.append(k)
    return out


def _one_line(out: io.StringIO) -> str:
    text = out.getvalue()
    out.seek(0)
    out.truncate()
    assert text.count("\n") == 1 and text.endswith("\n"), f"not one line: {text[:300]!r}"
    line = text[:-1]
    assert len(line.splitlines()) <= 1, f"a line break inside: {line[:300]!r}"
    assert line.isprintable(), f"unprintable: {line[:300]!r}"
    return line


def check(data: bytes) -> None:
    """Raise on a finding (see the module's docstring)."""
    fdp = atheris.FuzzedDataProvider(data)
    method = fdp.PickValueInList(sorted(_METHODS))
    level = _METHODS[method]
    library = fdp.ConsumeIntInRange(0, 7) == 0
    fields: dict[str, object] = {}
    message = ""
    exc: BaseException | None = None
    if library:
        message = fdp.ConsumeUnicode(fdp.remaining_bytes())
    else:
        for _ in range(fdp.ConsumeIntInRange(0, 8)):
            key = fdp.ConsumeUnicode(fdp.ConsumeIntInRange(0, 24))
            fields[key + "_" if key in _MACHINERY else key] = _value(fdp)
    texts = [message, *map(str, fields), *map(_text, fields.values())]
    t0, c0 = time.time(), time.thread_time()
    if library:
        lib = get_logger(LIBRARY)._logger
        lib.log(_STDLIB_LEVELS[level], message)
    elif method == "exception":
        try:
            raise KeyError(fdp.ConsumeUnicode(fdp.remaining_bytes()))
        except KeyError as e:
            exc = e
            get_logger(NAME).exception(EVENT, **fields)
    else:
        getattr(get_logger(NAME), method)(EVENT, **fields)
    cpu, t1 = time.thread_time() - c0, time.time()
    lines = [_one_line(out) for out in _OUTS]
    exc_text = ""
    if exc is not None:
        exc_text = "".join(traceback.format_exception(exc)).rstrip("\n")
        texts.append(exc_text)
    stats["outcomes"]["library" if library else method] += 1
    for mode, line in zip(_MODES, lines, strict=True):
        _check_line(line, mode, level, t0, t1, library, message, fields, exc_text)
    if not library:
        plain = read_logfmt(_one_line(_PLAIN))
        assert list(plain)[:1] == ["event"] and plain["event"] == EVENT, plain
        assert len(plain) == 1 + len(fields), (list(plain), list(fields))
    written = sum(map(len, lines))
    bound = 3 * (LINE_FIXED_CHARS + sum(ESCAPED_CHARS * len(t) + len(fields) + 4 for t in texts))
    stats["chars_over_bound"] = max(stats["chars_over_bound"], written / bound)
    assert written <= bound, f"{written} characters written > the bound {bound}"
    cpu_bound = CPU_FIXED_S + CPU_PER_CHAR_S * written
    stats["cpu_over_bound"] = max(stats["cpu_over_bound"], cpu / cpu_bound)
    assert cpu <= cpu_bound, f"{cpu:.3f} s of CPU > the bound {cpu_bound:.3f} s"


def _check_line(
    line: str,
    mode: dict[str, bool],
    level: str,
    t0: float,
    t1: float,
    library: bool,
    message: str,
    fields: dict[str, object],
    exc_text: str,
) -> None:
    if mode.get("priority"):
        prefix = f"<{_PRIORITY[level]}>"
        assert line.startswith(prefix + "ts="), line[:80]
    back: dict[str, Any] = json.loads(line) if mode.get("as_json") else read_logfmt(line)
    head = ["ts", "level", "logger", "message" if library else "event"]
    assert list(back)[:4] == head, list(back)[:4]
    assert back["level"] == level and back["logger"] == (LIBRARY if library else NAME), back
    ts = back["ts"]
    assert isinstance(ts, str) and _TS.fullmatch(ts), ts
    when = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t0))
    last = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t1))
    assert when <= ts[:19] <= last, (ts, when, last)
    if library:
        assert list(back) == head and _same(back["message"], message), back
        return
    assert back["event"] == EVENT, back["event"]
    keys = _keys(fields) + (["exc"] if exc_text else [])
    assert list(back)[4:] == keys, (list(back)[4:], keys)
    for key, value in zip(keys, fields.values(), strict=False):
        got = back[key]
        want = _as_json(value) if mode.get("as_json") else _text(value)
        if isinstance(value, bytes):
            ok = isinstance(got, str) and ast.literal_eval(got) == value
        else:
            ok = _same(got, want)
        assert ok, f"{key}: {got!r} != {want!r}"
    if exc_text:
        assert _same(back["exc"], exc_text), back["exc"]


def seeds() -> list[bytes]:
    """Inputs that reach each kind of value and both kinds of record."""
    out = [bytes(16), b"\x01" * 40, b"\x03\x00" + b"\x05" * 60]
    out += [bytes((m, 1, 4)) + bytes((k, 12)) * 6 + b"a \n\xe2\x80\xa8=" * 8 for m in range(8)
            for k in range(0, 11, 2)]  # fmt: skip
    out.append(b"\x02\x07" + "é\u2028 level=debug\n".encode("utf-16-le") * 4)
    return out
