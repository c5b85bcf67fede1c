"""bench/fuzz.py's ``mqtt`` target: an MQTT message through the edge agent's mapping as
ingest takes it (edge_agent/ingest.py ``_prepare``: the topic's bytes decoded as UTF-8,
then ``map_message`` with the rules of the sample config deploy/edge/edge.toml and one
more with ``#``, two key levels and a dotted ``ts_field``).

An input is the topic's length (2 bytes, little-endian, modulo 513), the topic's bytes,
then the payload.

A finding is any of: an exception other than ``UnusableMessage`` (ingest would quarantine
the message as ``mapping_error`` and log a traceback: "no payload may stop ingest", but
none should get there); a stream other than the first rule's that matches the topic by
MQTT's own level-by-level rule (or a refusal other than ``unmapped_topic`` when none
does); a key other than the rule's template filled from the topic's levels (or
``bad_key`` when a level is missing); an event time outside 1970..2200 taken from the
payload, or a reason for not taking it that the docs do not list; more CPU than
:data:`CPU_FIXED_S` plus :data:`CPU_PER_BYTE_S` per byte.
"""

from __future__ import annotations

import re
import time
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any

from edge_agent.errors import UnusableMessage
from edge_agent.rules import MAX_EVENT_MS, MIN_EVENT_MS, Rule, map_message
from shorelink.config import Section

__all__ = ["CPU_FIXED_S", "CPU_PER_BYTE_S", "DICTIONARY", "check", "mqtt_matches", "seeds"]

SAMPLE = Path(__file__).resolve().parent.parent / "deploy" / "edge" / "edge.toml"
RECV_MS = 1_767_225_600_000
CPU_FIXED_S = 0.05
CPU_PER_BYTE_S = 2e-6
#: why a payload's event time was not used (edge_agent/rules.py)
PROBLEMS = {None, "too_deep", "not_json", "missing", "out_of_range", "not_a_time"}
_PLACEHOLDER = re.compile(r"\{(\d+)\}")
DICTIONARY = [
    b"bigblue/",
    b"/containers/",
    b"/env",
    b"/alert",
    b"bigblue/nav/ais",
    b"/sensors/",
    b'"ts":',
    b'{"a":{"b":{"ts":',
    b"1767225600",
    b"2026-01-01T00:00:00Z",
    b"1e308",
    b"NaN",
    b"[[[[[[[[",
]

stats: dict[str, Any] = {"outcomes": Counter(), "cpu_over_bound": 0.0}


def _rules() -> tuple[Rule, ...]:
    doc = tomllib.loads(SAMPLE.read_text())
    streams = doc["streams"]
    extra = {"filter": "bigblue/+/sensors/#", "stream": "containers", "key": "{2}-{4}"}
    sections = [*doc["rules"], extra | {"ts_field": "a.b.ts"}]
    return tuple(
        Rule.from_section(Section(dict(s), f"rules[{i}]"), streams) for i, s in enumerate(sections)
    )


RULES = _rules()


def mqtt_matches(flt: str, topic: str) -> bool:
    """MQTT's rule, level by level (the spec's, written plainly, the oracle the target
    and ``tests/edge_agent/test_rules.py`` hold ``Rule.matches`` to): ``+`` is one
    level, ``#`` the rest (its parent level included)."""
    f, t = flt.split("/"), topic.split("/")
    for i, lvl in enumerate(f):
        if lvl == "#":
            return True
        if i >= len(t) or (lvl != "+" and lvl != t[i]):
            return False
    return len(f) == len(t)


def check(data: bytes) -> None:
    """Raise on a finding (see the module's docstring)."""
    n = int.from_bytes(data[:2], "little") % 513
    raw_topic, payload = data[2 : 2 + n], data[2 + n :]
    try:
        topic = raw_topic.decode("utf-8")
    except UnicodeDecodeError:
        stats["outcomes"]["bad_topic"] += 1
        return
    rule = next((r for r in RULES if mqtt_matches(r.filter, topic)), None)
    c0 = time.thread_time()
    try:
        mapped = map_message(RULES, topic, payload, RECV_MS)
    except UnusableMessage as exc:
        stats["outcomes"][exc.reason] += 1
        if rule is None:
            assert exc.reason == "unmapped_topic", exc
        else:
            assert exc.reason == "bad_key" and _key(rule.key, topic) is None, (exc, rule)
        mapped = None
    cpu = time.thread_time() - c0
    cpu_bound = CPU_FIXED_S + CPU_PER_BYTE_S * (len(raw_topic) + len(payload))
    stats["cpu_over_bound"] = max(stats["cpu_over_bound"], cpu / cpu_bound)
    assert cpu <= cpu_bound, f"{cpu:.3f} s of CPU > the bound {cpu_bound:.3f} s"
    if mapped is None:
        return
    stats["outcomes"][mapped.ts_problem or "ok"] += 1
    assert rule is not None, f"{topic!r} mapped by {mapped}, no rule matches it"
    assert mapped.stream == rule.stream, (mapped, rule)
    assert mapped.key == _key(rule.key, topic), (mapped, rule)
    assert mapped.ts_problem in PROBLEMS, mapped
    assert type(mapped.ts_ms) is int, mapped
    if mapped.ts_problem is None and rule.ts_field:
        assert MIN_EVENT_MS <= mapped.ts_ms < MAX_EVENT_MS, mapped
    else:
        assert mapped.ts_ms == RECV_MS, mapped


def _key(template: str, topic: str) -> str | None:
    """The key the docs say (``{n}``: the topic's n-th level), None if a level is missing."""
    levels = topic.split("/")
    out, at = [], 0
    for m in _PLACEHOLDER.finditer(template):
        n = int(m.group(1))
        if n > len(levels):
            return None
        out += [template[at : m.start()], levels[n - 1]]
        at = m.end()
    return "".join([*out, template[at:]])


def seeds() -> list[bytes]:
    """Topics and payloads as the ship's sensors publish them, and a few that are not."""
    msgs = [
        (b"bigblue/deck1/containers/MSCU1234565/env", b'{"ts":1767225599.804,"temperature":4.5}'),
        (b"bigblue/deck1/containers/MSCU1234565/alert", b'{"ts":"2026-01-01T00:00:00Z"}'),
        (b"bigblue/nav/ais", b"!AIVDM,1,1,,A,15M67FC000G?ufbE`FepT@3n00Sa,0*5C"),
        (b"bigblue/d2/sensors/x/y/z", b'{"a":{"b":{"ts":1767225600123}}}'),
        (b"bigblue/d2/sensors", b'{"a":{"b":{"ts":1e308}}}'),
        (b"bigblue/d2/containers/C1/env", b'{"ts":NaN}' + b"[" * 2000),
        (b"other/topic", b""),
    ]
    return [len(t).to_bytes(2, "little") + t + p for t, p in msgs]
