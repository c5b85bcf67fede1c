"""Structured logs: one event per line, logfmt (or JSON lines with ``--log-json``).

Call sites pass the event's name and its fields as data, never a message to be read
back::

    log = get_logger(__name__)
    log.warning("batch_refused", stream=stream, seqs=f"{first}-{last}", error=str(exc))

The renderer writes ``ts``, ``level``, ``logger`` and ``event`` first, then the fields
in the call's order: in logfmt a value is bare when it is one plain printable word and
otherwise in double quotes with JSON's escapes (``--log-json``: one JSON object a line).
Every character that is not printable (controls, U+2028, U+00A0, a lone surrogate ...)
is written as its ``\\uXXXX`` escape, so no value can end a line, add a field or stand in
for the line's own ``ts``, ``level``, ``logger``, ``event`` or ``exc`` (a call's field
of one of those names is written with a ``_`` after it), and each comes back
exactly (``json.loads`` of the quoted text; bytes as ``b'...'``; a key is letters,
digits, ``_``, ``.`` and ``-``, any other character of it ``_``). Under systemd (``JOURNAL_STREAM`` names
stderr) each line starts with its syslog priority (``<4>`` for a warning), so
``journalctl -p warning`` finds it.

Third-party libraries log through the standard library (librdkafka through
``shorelink.kafka.endpoint.LIBRDKAFKA_LOG``, aiohttp, py4j): their records get the same
``ts``, ``level`` and ``logger``, and their text is one quoted ``message`` value, never
read for fields. The JVM's lines follow :func:`log4j_pattern`, which writes the same
shape.

Why structlog: the earlier formatter took ``"event=x topic=%s"`` messages and parsed them
back; a topic holding a no-break space hung it inside the logging lock (review security
N2) and one holding `` level=debug event=all_good`` rewrote the line (N8). Fields that
are data from the call to the renderer remove the parsing, and structlog is the
maintained library for exactly that: bound loggers that take fields as keywords, and a
``ProcessorFormatter`` that renders the standard library's records with the same
processors. It is pure Python without dependencies (the edge's aarch64 included). A
record's message for other handlers (pytest's ``caplog``, a default handler before
:func:`configure_logging`) is the logfmt of its event and fields.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
import traceback
from collections.abc import Mapping
from typing import Any

from structlog.stdlib import BoundLogger, ProcessorFormatter
from structlog.typing import EventDict, WrappedLogger

from shorelink.boundary import boundary

__all__ = [
    "Logger",
    "RateLimitedLog",
    "configure_logging",
    "formatter",
    "get_logger",
    "log4j_pattern",
    "logfmt",
]

#: the standard library's level of each of a logger's methods
_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "exception": logging.ERROR,
    "critical": logging.CRITICAL,
    "fatal": logging.CRITICAL,
}

#: a key as written; any other character of a key becomes ``_``
_KEY_CHARS = re.compile(r"[^A-Za-z0-9_.\-]")
#: a value written without quotes (also printable, see :func:`_logfmt_value`)
_BARE = re.compile(r'[^\s"=\\]+')
#: the line's own fields, which no call site's field replaces (``exc``: the traceback
#: of ``log.exception``, which replaced a call's ``exc`` field)
_OWN = ("ts", "level", "logger", "event", "exc")
#: syslog priorities of the levels (sd-daemon's ``<N>`` prefix)
_PRIORITY = {"critical": 2, "error": 3, "warning": 4, "info": 6, "debug": 7}


class Logger(BoundLogger):
    """A logger of this project: ``log.info("event_name", key=value, ...)``. A call
    below the standard library logger's level returns at once (the ingest loop's debug
    lines: under 1 us, against 5 us with structlog's level filter as a processor)."""

    def _proxy_to_logger(
        self, method_name: str, event: str | None = None, *event_args: Any, **event_kw: Any
    ) -> Any:
        if not self._logger.isEnabledFor(_LEVELS.get(method_name, logging.NOTSET)):
            return None
        return super()._proxy_to_logger(method_name, event, *event_args, **event_kw)


def get_logger(name: str) -> Logger:
    """The logger named ``name`` (``__name__``): fields as keywords, rendered by the
    handler :func:`configure_logging` installs, filtered by the standard library's
    levels. It does not depend on structlog's global configuration."""
    return Logger(logging.getLogger(name), processors=[_to_record], context={})


class _Event(dict[str, Any]):
    """An event on its way through the standard library: a record's ``msg``. Its text
    (what ``record.getMessage()`` gives any handler) is its logfmt."""

    def __str__(self) -> str:
        head = {"event": self["event"]} if "event" in self else {}
        return logfmt(head | {k: v for k, v in self.items() if k not in ("event", "exc_info")})


def _to_record(
    logger: WrappedLogger, method: str, event_dict: EventDict
) -> tuple[tuple[EventDict], dict[str, Any]]:
    """The last processor of a call: hands the event to the standard library logger as
    its record's ``msg`` (:class:`ProcessorFormatter` takes it from there), with the
    exception (``log.exception``, ``exc_info=True``) resolved now, while it is handled."""
    exc = event_dict.pop("exc_info", None)
    extra: dict[str, Any] = {"_logger": logger, "_name": method}
    if exc:
        exc = sys.exc_info() if exc is True else exc
        if isinstance(exc, BaseException):
            exc = (type(exc), exc, exc.__traceback__)
        if exc[0] is not None:
            event_dict["exc_info"] = exc
            return (_Event(event_dict),), {"extra": extra, "exc_info": exc}
    return (_Event(event_dict),), {"extra": extra}


def _head(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    """The line's fields in order: ``ts``, ``level``, ``logger`` from the record, then
    ``event`` and the call's fields (or, for another library's record, its text as
    ``message``), then ``exc``. A call's field named like one of the line's own is
    written with a ``_`` after it; a key is letters, digits, ``_``, ``.`` and ``-``."""
    record: logging.LogRecord = event_dict.pop("_record")
    ours = event_dict.pop("_from_structlog")
    exc = event_dict.pop("exc_info", None)
    event_dict.pop("stack_info", None)
    ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    out: dict[str, Any] = {
        "ts": f"{ts}.{int(record.msecs):03d}Z",
        "level": record.levelname.lower(),
        "logger": record.name,
    }
    event = event_dict.pop("event", None)
    if not ours:
        out["message"] = event
    elif event is not None:
        out["event"] = event
    for key, value in event_dict.items():
        k = _KEY_CHARS.sub("_", str(key)) or "_"
        while k in out or k in _OWN:
            k += "_"
        out[k] = value
    if isinstance(exc, tuple) and exc[0] is not None:
        out["exc"] = "".join(traceback.format_exception(*exc)).rstrip("\n")
    return out


class _Renderer:
    """The last processor of the handler: one line of logfmt or JSON, with the syslog
    priority in front under systemd."""

    def __init__(self, *, as_json: bool, priority: bool) -> None:
        self.as_json = as_json
        self.priority = priority

    @boundary
    def __call__(self, _logger: WrappedLogger, _method: str, event_dict: EventDict) -> str:
        if self.as_json:
            line = (
                "{" + ",".join(f"{_quote(k)}:{_json_value(v)}" for k, v in event_dict.items()) + "}"
            )
        else:
            line = logfmt(event_dict)
        if self.priority:
            line = f"<{_PRIORITY.get(event_dict.get('level', ''), 6)}>{line}"
        return line


def _quote(text: str) -> str:
    """``text`` as a JSON string on one line: JSON's escapes, and every character that is
    not printable (U+0085, U+2028, U+00A0, a lone surrogate, ...) as ``\\uXXXX``."""
    out = json.dumps(text, ensure_ascii=False)
    if out.isprintable():
        return out
    # a stretch at a time: joining every character at once held a string object per
    # character (a value of control characters cost 90 times its length at the peak)
    return "".join(_printable(out[i : i + _STRETCH]) for i in range(0, len(out), _STRETCH))


_STRETCH = 512


def _printable(text: str) -> str:
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape(c) for c in text)


def _escape(c: str) -> str:
    """JSON's ``\\uXXXX`` for one character (a surrogate pair beyond U+FFFF)."""
    n = ord(c)
    if n < 0x10000:
        return f"\\u{n:04x}"
    n -= 0x10000
    return f"\\u{0xD800 + (n >> 10):04x}\\u{0xDC00 + (n & 0x3FF):04x}"


def _text(value: object) -> str:
    """A value as text: a string as it is, bytes as Python writes them (``b'...'``),
    anything else its ``str`` (a number too big for ``str``: its hex)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return repr(bytes(value))
    try:
        return str(value)
    except Exception:
        if isinstance(value, int):  # past the digits str writes
            return hex(value)
        # (a ValueError, UnicodeError among them, was raised on and lost the whole
        # line: bench/fuzz.py found it)
        return object.__repr__(value)


def _logfmt_value(value: object) -> str:
    text = _text(value)
    if text.isprintable() and _BARE.fullmatch(text):
        return text
    return _quote(text)


def _json_value(value: object) -> str:
    """A value in JSON: numbers, booleans and null as themselves, the rest as text."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, int) and abs(value) < 1 << 64:
        return str(int(value))
    if isinstance(value, float) and value == value and abs(value) != float("inf"):
        return repr(float(value))
    return _quote(_text(value))


def logfmt(pairs: Mapping[str, object]) -> str:
    """``key=value`` pairs, a value quoted (JSON's escapes) unless it is one plain word;
    a key as a line writes it (:func:`_head`), with a ``_`` after it while an earlier
    pair has it, so that keys that differ only in characters a key cannot hold stay two
    fields (bench/fuzz.py found ``{"a b": 1, "a_b": 2}`` written as ``a_b`` twice)."""
    seen: set[str] = set()
    out = []
    for k, v in pairs.items():
        key = _KEY_CHARS.sub("_", str(k)) or "_"
        while key in seen:
            key += "_"
        seen.add(key)
        out.append(f"{key}={_logfmt_value(v)}")
    return " ".join(out)


def log4j_pattern(*, as_json: bool = False) -> str:
    """A log4j2 ``PatternLayout`` that writes a JVM's events as this module writes
    Python's: ``ts``, ``level``, ``logger`` and the ``message`` (and ``exc``, a stack
    trace on one line) in logfmt with every value quoted (JSON's escapes), or one JSON
    object per line; with the syslog priority first under systemd."""
    ts = "%d{yyyy-MM-dd'T'HH:mm:ss.SSS'Z'}{UTC}"
    level = "%level{WARN=warning, ERROR=error, FATAL=critical, INFO=info, DEBUG=debug, TRACE=debug}"
    if as_json:
        return (
            f'{{"ts":"{ts}","level":"{level}","logger":"%enc{{%c}}{{JSON}}",'
            '"message":"%enc{%m}{JSON}"%notEmpty{,"exc":"%enc{%throwable}{JSON}"}}%n'
        )
    priority = (
        "%level{WARN=<4>, ERROR=<3>, FATAL=<2>, INFO=<6>, DEBUG=<7>, TRACE=<7>}"
        if _to_journal()
        else ""
    )
    return (
        f'{priority}ts={ts} level={level} logger="%enc{{%c}}{{JSON}}" message="%enc{{%m}}{{JSON}}"'
        '%notEmpty{ exc="%enc{%throwable}{JSON}"}%n'
    )


def _to_journal() -> bool:
    """Whether stderr is systemd's journal (``JOURNAL_STREAM`` is its device:inode)."""
    try:
        st = os.fstat(sys.stderr.fileno())
    except (OSError, ValueError):
        return False
    return os.environ.get("JOURNAL_STREAM", "") == f"{st.st_dev}:{st.st_ino}"


def formatter(*, as_json: bool = False, priority: bool = False) -> logging.Formatter:
    """The formatter of this process's handler: our events and other libraries' records
    alike, one line each."""
    return ProcessorFormatter(
        processors=[_head, _Renderer(as_json=as_json, priority=priority)],
        use_get_message=True,
    )


def configure_logging(level: str = "info", *, as_json: bool = False) -> None:
    """Every record of the process (ours and other libraries') to stderr, one line each,
    from ``level`` up."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(as_json=as_json, priority=not as_json and _to_journal()))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


class RateLimitedLog:
    """Logs a repeated error at most once per ``interval`` seconds, counting the rest
    (a link that is down for an hour must not write a line per retry)."""

    def __init__(self, logger: Logger, interval: float = 30.0) -> None:
        self._log = logger
        self._interval = interval
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def warning(self, key: str, event: str, **fields: object) -> None:
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self._interval:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return
        n = self._suppressed.pop(key, 0)
        self._last[key] = now
        self._log.warning(event, **fields, suppressed=n)
