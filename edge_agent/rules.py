"""Mapping rules: which MQTT topics become records of which stream, with which key and
event time.

A rule has an MQTT topic ``filter`` (``+`` one level, ``#`` the rest), a ``stream``, a
``key`` template whose ``{n}`` placeholders are the topic's n-th level (1-based), e.g.
``bigblue/+/containers/+/env`` with ``key = "{4}"`` keys by container id, and optionally
``ts_field``: the JSON field (dotted path) of the payload holding the event time (epoch
seconds or milliseconds, or ISO 8601). Without it, or when the payload lacks it, the
event time is the receive time. The first rule that matches a topic wins.

An event time that is missing, not a time, or outside 1970..2200 (NaN, Infinity, 1e308,
a date in year 9999) is replaced by the receive time and the reason is reported in
:attr:`Mapped.ts_problem` (ingest counts it): the record is kept, its time is the one
the ship can vouch for.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from edge_agent.errors import UnusableMessage
from shorelink.boundary import boundary
from shorelink.config import Section
from shorelink.contract import MAX_RECORD_BYTES, record_bytes
from shorelink.errors import ConfigError

__all__ = ["Mapped", "Rule", "map_message"]

_PLACEHOLDER = re.compile(r"\{(\d+)\}")


def _filter_regex(flt: str, field: str) -> re.Pattern[str]:
    """An MQTT topic filter as a regex for ``fullmatch`` (never ``match``: with ``$``,
    the filter ``a/b`` matched the topic ``"a/b\\n"``)."""
    levels = flt.split("/")
    parts: list[str] = []
    for i, lvl in enumerate(levels):
        if lvl == "#":
            if i != len(levels) - 1:
                raise ConfigError(field, f"'#' must be the last level in {flt!r}")
            # "a/#" also matches "a" itself
            return re.compile("/".join(parts) + ("(?:/.*)?" if parts else ".*"), re.DOTALL)
        if lvl == "+":
            parts.append("[^/]*")
        elif "+" in lvl or "#" in lvl:
            raise ConfigError(field, f"wildcards must fill a whole level in {flt!r}")
        else:
            parts.append(re.escape(lvl))
    return re.compile("/".join(parts), re.DOTALL)


@dataclass(frozen=True)
class Rule:
    filter: str
    stream: str
    key: str
    ts_field: str | None
    _regex: re.Pattern[str]

    @classmethod
    def from_section(cls, s: Section, streams: Mapping[str, object]) -> Rule:
        flt = s.text("filter")
        stream = s.text("stream")
        if stream not in streams:
            raise ConfigError(s.field("stream"), f"no stream {stream!r} is configured")
        key = s.text("key", "")
        ts_field = s.opt_str("ts_field")
        s.done()
        regex = _filter_regex(flt, s.field("filter"))
        for m in _PLACEHOLDER.finditer(key):
            if int(m.group(1)) < 1:
                raise ConfigError(s.field("key"), "topic levels count from {1}")
        return cls(flt, stream, key, ts_field, regex)

    def matches(self, topic: str) -> bool:
        return self._regex.fullmatch(topic) is not None

    def key_for(self, topic: str) -> str:
        if "{" not in self.key:
            return self.key
        levels = topic.split("/")

        def sub(m: re.Match[str]) -> str:
            n = int(m.group(1))
            if n > len(levels):
                raise UnusableMessage(
                    "bad_key", f"topic {topic!r} has no level {n} for key {self.key!r}"
                )
            return levels[n - 1]

        return _PLACEHOLDER.sub(sub, self.key)


@dataclass(frozen=True, slots=True)
class Mapped:
    stream: str
    key: str
    ts_ms: int
    #: why the payload's event time was not used (the receive time was), if it was not
    ts_problem: str | None = None


#: event times outside [1970, 2200) are not trusted: the record gets its receive time
MIN_EVENT_MS = 0
MAX_EVENT_MS = 7_258_118_400_000  # 2200-01-01T00:00Z


def _event_time(payload: bytes, path: str) -> tuple[int | None, str | None]:
    """(event time in ms, None), or (None, why it is unusable).

    Whatever a sensor publishes must not escape from here: NaN, Infinity, 1e308,
    integers of thousands of digits, JSON nested beyond the parser's recursion limit,
    dates Python's datetime cannot represent are all "unusable", never an exception."""
    try:
        doc: Any = json.loads(payload)
    except RecursionError:
        return None, "too_deep"
    except ValueError:  # also UnicodeDecodeError, and ints beyond int_max_str_digits
        return None, "not_json"
    try:
        for part in path.split("."):
            doc = doc[part]
    except (KeyError, TypeError, IndexError):
        return None, "missing"
    try:
        ms = _as_ms(doc)
    except (ValueError, OverflowError, OSError):
        return None, "out_of_range"
    if ms is None:
        return None, "not_a_time"
    if not MIN_EVENT_MS <= ms < MAX_EVENT_MS:
        return None, "out_of_range"
    return ms, None


def _as_ms(doc: Any) -> int | None:
    if isinstance(doc, bool):
        return None
    if isinstance(doc, float) and not math.isfinite(doc):
        raise ValueError("not a finite number")
    if isinstance(doc, int | float):
        if abs(doc) > 1e16:  # beyond any plausible ms; int() of 1e308 is a 300-digit int
            raise OverflowError("too large")
        # seconds or milliseconds: 1e11 ms is 1973, 1e11 s is year 5138
        return int(doc) if doc > 1e11 else int(doc * 1000)
    if isinstance(doc, str):
        try:
            dt = datetime.fromisoformat(doc.replace("Z", "+00:00"))
        except ValueError:
            return None
        return int(dt.timestamp() * 1000)
    return None


@boundary
def map_message(rules: tuple[Rule, ...], topic: str, payload: bytes, recv_ms: int) -> Mapped:
    """The stream, key and event time of a message; raises :class:`UnusableMessage`."""
    for rule in rules:
        if rule.matches(topic):
            key = rule.key_for(topic)
            if not rule.ts_field:
                return Mapped(rule.stream, key, recv_ms)
            ts, problem = _event_time(payload, rule.ts_field)
            return Mapped(rule.stream, key, recv_ms if ts is None else ts, problem)
    raise UnusableMessage("unmapped_topic", f"no rule maps topic {topic!r}")


@boundary
def admit_message(
    rules: tuple[Rule, ...], raw_topic: bytes, payload: bytes, recv_ms: int, max_payload: int
) -> tuple[str, Mapped]:
    """A received MQTT message, as the broker sent it: its topic as text and its
    :func:`map_message`, or :class:`UnusableMessage` saying why ingest quarantines it
    (``bad_topic``: not UTF-8; ``oversized``: past ``max_payload`` or, as a record, past
    :data:`~shorelink.contract.MAX_RECORD_BYTES`; ``unmapped_topic``, ``bad_key``)."""
    try:
        topic = raw_topic.decode("utf-8")
    except UnicodeDecodeError:
        raise UnusableMessage("bad_topic", f"topic is not UTF-8: {raw_topic[:80]!r}") from None
    if len(payload) > max_payload:
        raise UnusableMessage(
            "oversized", f"{len(payload)} bytes > max_payload_bytes {max_payload}"
        )
    mapped = map_message(rules, topic, payload, recv_ms)
    size = record_bytes(mapped.key, payload, topic)
    if size > MAX_RECORD_BYTES:  # the one record limit of every hop
        raise UnusableMessage(
            "oversized",
            f"record of {size} bytes (payload, key and topic) > MAX_RECORD_BYTES"
            f" {MAX_RECORD_BYTES}",
        )
    return topic, mapped
