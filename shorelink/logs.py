"""Structured logs: one event per line, logfmt (or JSON lines with ``--log-json``).

Call sites log ``log.info("event=batch_sent stream=%s seqs=%s error=%r", ...)``: each
field ``key=value``, a value that may hold spaces written with ``%r`` (Python's quotes).
The formatter reads the fields back (:func:`fields`: a quoted value exactly as it was,
spaces, quotes and all) and writes them with time, level and logger in front: logfmt
(a value with a space, a quote, ``=`` or a control character in double quotes, JSON
escapes) or one JSON object per line. Under systemd (``JOURNAL_STREAM`` names stderr)
each line starts with its syslog priority (``<4>`` for a warning), so ``journalctl -p
warning`` finds it.
"""

from __future__ import annotations

import ast
import json
import logging
import os
import re
import sys
import time

__all__ = ["RateLimitedLog", "configure_logging", "fields", "log4j_pattern", "logfmt"]

_KEY = re.compile(r"([A-Za-z_][\w.\-]*)=")
_QUOTED = re.compile(r"'(?:[^'\\\n]|\\.)*'" + r'|"(?:[^"\\\n]|\\.)*"')
_BARE = re.compile(r"\S*")
_SPACE = re.compile(r"\s+")
_PLAIN = re.compile(r"[^\s\"=\\\x00-\x1f\x7f]+")
#: syslog priorities of the levels (sd-daemon's ``<N>`` prefix)
_PRIORITY = {"CRITICAL": 2, "ERROR": 3, "WARNING": 4, "INFO": 6, "DEBUG": 7}


def fields(message: str) -> dict[str, str]:
    """The ``key=value`` fields of a call site's message, in order. A value in Python's
    quotes (``%r`` of a string) is read back exactly; any other runs to the next space.
    Words that are no field are kept under ``msg``."""
    out: dict[str, str] = {}
    rest: list[str] = []
    pos, n = 0, len(message)
    while pos < n:
        space = _SPACE.match(message, pos)
        if space is not None:  # any whitespace, so the word after it is never empty
            pos = space.end()
            continue
        key = _KEY.match(message, pos)
        if key is None:
            end = _bare_end(message, pos)
            rest.append(message[pos:end])
            pos = end
            continue
        pos = key.end()
        value = _quoted(message, pos)
        if value is None:
            end = _bare_end(message, pos)
            text, pos = message[pos:end], end
        else:
            text, pos = value
        # the call site's own field comes first: a value that holds "event=..." adds none
        out.setdefault(key.group(1), text)
    if rest:
        out["msg"] = " ".join(rest)
    return out


def _bare_end(message: str, pos: int) -> int:
    """Where the word at ``pos`` ends: at the next whitespace of any kind (tab, U+00A0,
    U+2003 ...: what ``\\s`` matches), or the end."""
    word = _BARE.match(message, pos)
    assert word is not None
    return word.end()


def _quoted(message: str, pos: int) -> tuple[str, int] | None:
    m = _QUOTED.match(message, pos)
    if m is None or (m.end() < len(message) and not _SPACE.match(message, m.end())):
        return None
    try:
        value = ast.literal_eval(m.group())
    except (ValueError, SyntaxError):
        return None
    return (value, m.end()) if isinstance(value, str) else None


def logfmt(pairs: dict[str, str]) -> str:
    """``key=value`` pairs, a value quoted (JSON's escapes) unless it is one plain word."""
    return " ".join(
        f"{k}={v}" if _PLAIN.fullmatch(v) else f"{k}={json.dumps(v, ensure_ascii=False)}"
        for k, v in pairs.items()
    )


def _head(record: logging.LogRecord) -> dict[str, str]:
    ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return {
        "ts": f"{ts}.{int(record.msecs):03d}Z",
        "level": record.levelname.lower(),
        "logger": record.name,
    }


def _fields(record: logging.LogRecord) -> dict[str, str]:
    """Time, level and logger, then the message's fields: no value a call site logs can
    stand in for the line's own ``ts``, ``level`` or ``logger``."""
    head = _head(record)
    return head | {k: v for k, v in fields(record.getMessage()).items() if k not in head}


class _LogfmtFormatter(logging.Formatter):
    def __init__(self, priority: bool = False) -> None:
        super().__init__()
        self.priority = priority

    def format(self, record: logging.LogRecord) -> str:
        out = _fields(record)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        line = logfmt(out)
        if self.priority:
            line = f"<{_PRIORITY.get(record.levelname, 6)}>{line}"
        return line


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = _fields(record)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


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


def configure_logging(level: str = "info", *, as_json: bool = False) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter() if as_json else _LogfmtFormatter(_to_journal()))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


class RateLimitedLog:
    """Logs a repeated error at most once per ``interval`` seconds, counting the rest
    (a link that is down for an hour must not write a line per retry)."""

    def __init__(self, logger: logging.Logger, interval: float = 30.0) -> None:
        self._log = logger
        self._interval = interval
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def warning(self, key: str, msg: str, *args: object) -> None:
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self._interval:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return
        n = self._suppressed.pop(key, 0)
        self._last[key] = now
        self._log.warning(msg + " suppressed=%d", *args, n)
