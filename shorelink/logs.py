"""Structured logs: one event per line, ``key=value`` (or JSON with ``--log-json``).

Call sites log ``log.info("event=batch_sent stream=%s seqs=%s", ...)``; the formatter
prefixes time, level and logger, so every line greps and parses the same way.
"""

from __future__ import annotations

import json
import logging
import sys
import time

__all__ = ["RateLimitedLog", "configure_logging"]


class _KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line = f"ts={ts}.{int(record.msecs):03d}Z level={record.levelname.lower()} logger={record.name} {record.getMessage()}"
        if record.exc_info:
            line += " exc=" + json.dumps(self.formatException(record.exc_info))
        return line


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": record.created,
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        for part in record.getMessage().split(" "):
            k, sep, v = part.partition("=")
            if sep:
                out[k] = v
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


def configure_logging(level: str = "info", *, as_json: bool = False) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter() if as_json else _KeyValueFormatter())
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
