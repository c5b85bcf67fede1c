"""A strict reader of the log lines shorelink writes (``shorelink/logs.py``, and the JVM's
``log4j_pattern``), as an operator's tool would read them: ``key=value`` pairs separated
by one space, a value bare or in double quotes with JSON's escapes. The product never
reads its lines back; tests do, to check that every value survives."""

from __future__ import annotations

import json
import re

__all__ = ["read_logfmt"]

_PAIR = re.compile(r'([A-Za-z0-9_.\-]+)=("(?:[^"\\]|\\.)*"|[^\s"=\\]+)')
_PRIORITY = re.compile(r"<[0-7]>")


def read_logfmt(line: str) -> dict[str, str]:
    """The fields of one line, in order (a leading ``<N>`` syslog priority skipped).
    Raises ValueError on anything that is not exactly such pairs, or on a key twice."""
    pos = m.end() if (m := _PRIORITY.match(line)) else 0
    out: dict[str, str] = {}
    while True:
        pair = _PAIR.match(line, pos)
        if pair is None:
            raise ValueError(f"no key=value at {pos}: {line[pos : pos + 40]!r}")
        key, raw = pair.groups()
        if key in out:
            raise ValueError(f"{key} twice")
        out[key] = json.loads(raw) if raw.startswith('"') else raw
        pos = pair.end()
        if pos == len(line):
            return out
        if line[pos] != " ":
            raise ValueError(f"no space after {key}= at {pos}")
        pos += 1
