"""Alarm rules: the agent raises ``alerts`` records itself from the readings it commits.

Why on the ship and not ashore: a container lost overboard sends one reading with a
shock spike and then nothing. Ashore that silence is noticed only after the containers
backlog crossed the link (days at sea, where the satellite link carries only alerts and
nav); on board the agent sees it at once and the alert goes up the satellite link first.

Two kinds of alarm (``[[alarms]]``, docs/edge-agent.md "Alarms"):

- **threshold** (no ``silence``): raised when a key's value crosses into the condition
  (``> above`` or ``< below``), once; re-armed by a reading of that key back within
  bounds. Edge-triggered, so a container reporting 30 °C every minute raises one alert.
- **silence**: a key had a reading in the condition (shock > 10 g), and then no further
  reading of that key within ``silence``. Time is the readings' own clock, their event
  time (``ts_field`` of the ``[[rules]]``): the alarm fires when a reading matching the
  same filter (any key) carries an event time past ``shock + silence`` while the shocked
  key stayed silent. So it does not depend on a simulator's speed-up nor on the ship's
  wall clock; it needs other keys to keep reporting (on a ship, thousands do).

This module is pure: :func:`evaluate` takes the configured alarms, the state and a
group of committed readings and returns the alerts and the state's changes;
:meth:`AlarmState.apply` applies them once the group is committed. :func:`load_state`
and :func:`save_changes` keep the state in the log database (table ``alarm_state``), in
the transaction that commits the readings and the alerts (edge_agent/ingest.py), so a
crash neither loses nor doubles an alert.

Whatever a sensor publishes never escapes from here: a payload that is not JSON, lacks
the field, or holds a string, a bool, NaN, an infinity or a number beyond a float is not
matched (no alarm, no state change).
"""

from __future__ import annotations

import json
import math
import re
import sqlite3
from collections.abc import Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from dataclasses import field as dc_field
from typing import Any, Protocol

from edge_agent.rules import _filter_regex
from shorelink.boundary import boundary
from shorelink.config import Section, read
from shorelink.config import key as config_key
from shorelink.errors import ConfigError

__all__ = [
    "ALERTS_STREAM",
    "Alarm",
    "AlarmState",
    "Alert",
    "Episode",
    "Evaluation",
    "Reading",
    "evaluate",
    "load_state",
    "save_changes",
]

#: the stream alerts are committed to (it must be configured)
ALERTS_STREAM = "alerts"
#: the MQTT-topic header of an alert record: ``shorelink/alarm/<name>``
ALERT_TOPIC_PREFIX = "shorelink/alarm/"

_NAME = re.compile(r"[a-z0-9_-]{1,63}")
_PLACEHOLDER = re.compile(r"\{(\d+)\}")


@dataclass(frozen=True)
class Alarm:
    """One ``[[alarms]]`` entry."""

    #: a-z 0-9 _ -; unique; the alert's ``alarm`` and the metric's label
    name: str
    #: MQTT topic filter, as in ``[[rules]]``
    filter: str
    #: dotted JSON path of the value in the payload
    field: str
    #: the alert's key: ``{n}`` is the topic's n-th level; "": the mapped record's key
    key: str = ""
    #: the condition: value > above, or value < below (at least one of them)
    above: float | None = None
    below: float | None = None
    #: a silence alarm: after a reading in the condition, no reading of that key for
    #: this long (event time); None: a threshold alarm
    silence_s: float | None = dc_field(
        default=None, metadata=config_key("silence", gt=0, why="must be > 0")
    )
    _regex: re.Pattern[str] | None = dc_field(default=None, repr=False, compare=False)

    @classmethod
    def from_section(cls, s: Section, streams: Mapping[str, object]) -> Alarm:
        if ALERTS_STREAM not in streams:
            raise ConfigError(
                s.field("name"), f"alarms raise records of stream {ALERTS_STREAM!r}: configure it"
            )
        out = read(cls, s, above=_number(s, "above"), below=_number(s, "below"))
        if not _NAME.fullmatch(out.name):
            raise ConfigError(s.field("name"), f"{out.name!r}: use 1-63 of a-z 0-9 _ -")
        if out.above is None and out.below is None:
            raise ConfigError(s.field("above"), "set above, below or both")
        if out.above is not None and out.below is not None and out.below > out.above:
            raise ConfigError(s.field("below"), "must not exceed above")
        if not out.field or any(not p for p in out.field.split(".")):
            raise ConfigError(s.field("field"), f"{out.field!r} is not a dotted JSON path")
        for m in _PLACEHOLDER.finditer(out.key):
            if int(m.group(1)) < 1:
                raise ConfigError(s.field("key"), "topic levels count from {1}")
        return replace(out, _regex=_filter_regex(out.filter, s.field("filter")))

    @property
    def kind(self) -> str:
        return "threshold" if self.silence_s is None else "silence"

    def matches(self, topic: str) -> bool:
        regex = self._regex if self._regex is not None else _filter_regex(self.filter, "filter")
        return regex.fullmatch(topic) is not None

    def key_for(self, topic: str, record_key: str) -> str | None:
        """The alert key of a reading; None when the topic lacks a level it names."""
        if not self.key:
            return record_key
        levels = topic.split("/")
        out = []
        pos = 0
        for m in _PLACEHOLDER.finditer(self.key):
            n = int(m.group(1))
            if n > len(levels):
                return None
            out += [self.key[pos : m.start()], levels[n - 1]]
            pos = m.end()
        return "".join([*out, self.key[pos:]])

    def breached(self, value: float) -> bool:
        return (self.above is not None and value > self.above) or (
            self.below is not None and value < self.below
        )


def _number(s: Section, name: str) -> float | None:
    """A threshold: a finite TOML integer or float (the config reader has no number
    kind: a float field there is a duration)."""
    v = s._get(name, None, (int, float), "a number")
    if v is None:
        return None
    try:
        out = float(v)
    except OverflowError:
        raise ConfigError(s.field(name), f"{v!r} is not a finite number") from None
    if not math.isfinite(out):
        raise ConfigError(s.field(name), f"{v!r} is not a finite number")
    return out


class Reading(Protocol):
    """A committed record as the engine sees it (``edge_agent.log.Incoming`` is one)."""

    @property
    def topic(self) -> str: ...
    @property
    def key(self) -> str: ...
    @property
    def ts_ms(self) -> int: ...
    @property
    def payload(self) -> bytes: ...


@dataclass(frozen=True, slots=True)
class Episode:
    """The reading that put a key in the condition: for a threshold alarm the key is
    disarmed while it has one; for a silence alarm it is the pending shock."""

    ts_ms: int
    value: float
    topic: str


@dataclass(frozen=True, slots=True)
class Alert:
    """An alert to commit on :data:`ALERTS_STREAM`."""

    alarm: str
    kind: str
    key: str
    #: event time: the triggering reading's (threshold) or the shock's (silence)
    ts_ms: int
    #: the MQTT-topic header: ``shorelink/alarm/<name>``
    topic: str
    #: compact JSON (docs/edge-agent.md "Alarms")
    payload: bytes
    value: float
    #: the topic of the reading the value came from
    source_topic: str


#: (alarm name, key) -> the new episode, or None: removed
Changes = dict[tuple[str, str], Episode | None]


@dataclass
class AlarmState:
    """Per alarm, per key: the episode that disarmed it (threshold) or is pending
    (silence). Keys within bounds have no entry."""

    entries: dict[str, dict[str, Episode]] = dc_field(default_factory=dict)

    def get(self, alarm: str, k: str) -> Episode | None:
        return self.entries.get(alarm, {}).get(k)

    def apply(self, changes: Changes) -> None:
        """Take a committed group's changes."""
        for (alarm, k), ep in changes.items():
            if ep is None:
                self.entries.get(alarm, {}).pop(k, None)
            else:
                self.entries.setdefault(alarm, {})[k] = ep


@dataclass
class Evaluation:
    alerts: list[Alert]
    #: to apply (:meth:`AlarmState.apply`) and save (:func:`save_changes`) with the group
    changes: Changes


class _View:
    """The state with a group's changes laid over it (the state itself changes only
    once the group is committed: a rolled-back group leaves it as it was)."""

    def __init__(self, state: AlarmState) -> None:
        self.state = state
        self.changes: Changes = {}

    def get(self, alarm: str, k: str) -> Episode | None:
        if (alarm, k) in self.changes:
            return self.changes[(alarm, k)]
        return self.state.get(alarm, k)

    def set(self, alarm: str, k: str, ep: Episode | None) -> None:
        self.changes[(alarm, k)] = ep

    def pending(self, alarm: str) -> Iterator[tuple[str, Episode]]:
        out = [
            (k, ep)
            for k, ep in self.state.entries.get(alarm, {}).items()
            if (alarm, k) not in self.changes
        ]
        out += [(k, ep) for (a, k), ep in self.changes.items() if a == alarm and ep is not None]
        return iter(out)


_UNPARSED: Any = object()
_BAD: Any = object()


@boundary
def _parse(payload: bytes) -> Any:
    try:
        return json.loads(payload)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, too deep, too many digits
        return _BAD


@boundary
def _value(doc: Any, path: str) -> float | None:
    """The finite number at ``path``, or None (missing, not a number, NaN, too large)."""
    if doc is _BAD:
        return None
    try:
        for part in path.split("."):
            if not isinstance(doc, dict):
                return None
            doc = doc[part]
    except KeyError:
        return None
    if isinstance(doc, bool) or not isinstance(doc, int | float):
        return None
    try:
        out = float(doc)
    except OverflowError:
        return None
    return out if math.isfinite(out) else None


def _alert(alarm: Alarm, k: str, ep: Episode) -> Alert:
    body = {
        "alarm": alarm.name,
        "key": k,
        "field": alarm.field,
        "value": ep.value,
        "ts": ep.ts_ms,
        "topic": ep.topic,
        "kind": alarm.kind,
        "silence_s": alarm.silence_s,
    }
    payload = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
    return Alert(
        alarm.name,
        alarm.kind,
        k,
        ep.ts_ms,
        ALERT_TOPIC_PREFIX + alarm.name,
        payload,
        ep.value,
        ep.topic,
    )


def evaluate(
    alarms: Sequence[Alarm],
    state: AlarmState,
    readings: Iterable[Reading],
    *,
    unclocked: Container[object] = (),
) -> Evaluation:
    """The alerts a group of committed readings raises, in order, and the state's
    changes. ``readings`` are the records the log stored (not the redeliveries it
    recognised), in commit order. ``unclocked`` readings carry their receive time, not
    an event time (their payload's was unusable): for silence alarms they show their key
    is alive, but neither pass another key's deadline nor start a wait (the two clocks
    do not compare)."""
    view = _View(state)
    alerts: list[Alert] = []
    for r in readings:
        clocked = not unclocked or r not in unclocked
        doc = _UNPARSED
        for a in alarms:
            if not a.matches(r.topic):
                continue
            k = a.key_for(r.topic, r.key)
            if k is None:
                continue
            if doc is _UNPARSED:
                doc = _parse(r.payload)
            v = _value(doc, a.field)
            if a.silence_s is None:
                _threshold(a, view, k, r, v, alerts)
            else:
                _silence(a, int(a.silence_s * 1000), view, k, r, v, alerts, clocked)
    return Evaluation(alerts, view.changes)


def _threshold(
    a: Alarm, view: _View, k: str, r: Reading, v: float | None, alerts: list[Alert]
) -> None:
    if v is None:
        return  # not matched: the key stays as it was
    ep = view.get(a.name, k)
    if a.breached(v):
        if ep is None:  # crossing into the condition: raise once, disarm
            ep = Episode(r.ts_ms, v, r.topic)
            view.set(a.name, k, ep)
            alerts.append(_alert(a, k, ep))
    elif ep is not None:  # back within bounds: re-arm
        view.set(a.name, k, None)


def _silence(
    a: Alarm,
    silence_ms: int,
    view: _View,
    k: str,
    r: Reading,
    v: float | None,
    alerts: list[Alert],
    clocked: bool,
) -> None:
    ep = view.get(a.name, k)
    if not clocked:  # alive, at a time that does not compare with event times
        if ep is not None:
            view.set(a.name, k, None)
        return
    # This reading's event time may pass the deadline of keys that stayed silent (this
    # key's own too: a key whose next reading comes later than `silence` was silent).
    for pk, shock in view.pending(a.name):
        if r.ts_ms > shock.ts_ms + silence_ms:
            view.set(a.name, pk, None)
            alerts.append(_alert(a, pk, shock))
    ep = view.get(a.name, k)
    if v is not None and a.breached(v):
        if ep is None or r.ts_ms >= ep.ts_ms:  # the newest shock starts the wait again
            view.set(a.name, k, Episode(r.ts_ms, v, r.topic))
    elif ep is not None and r.ts_ms > ep.ts_ms:  # the key reported again: not silent
        view.set(a.name, k, None)


# -- persistence (table alarm_state, edge_agent/migrations.py) ----------------------------
def load_state(conn: sqlite3.Connection) -> AlarmState:
    state = AlarmState()
    for alarm, k, ts_ms, value, topic in conn.execute(
        "SELECT alarm, key, ts_ms, value, topic FROM alarm_state"
    ):
        state.entries.setdefault(alarm, {})[k] = Episode(ts_ms, value, topic)
    return state


def save_changes(conn: sqlite3.Connection, changes: Changes) -> None:
    """Write a group's changes (inside the transaction that commits the group)."""
    gone = [(alarm, k) for (alarm, k), ep in changes.items() if ep is None]
    kept = [
        (alarm, k, ep.ts_ms, ep.value, ep.topic)
        for (alarm, k), ep in changes.items()
        if ep is not None
    ]
    if gone:
        conn.executemany("DELETE FROM alarm_state WHERE alarm = ? AND key = ?", gone)
    if kept:
        conn.executemany(
            "INSERT OR REPLACE INTO alarm_state (alarm, key, ts_ms, value, topic)"
            " VALUES (?, ?, ?, ?, ?)",
            kept,
        )
