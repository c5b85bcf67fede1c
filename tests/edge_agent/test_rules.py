"""Rules decide which stream and key a reading gets: a wrong key scatters one
container's history over partitions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench._fuzz_mqtt import mqtt_matches
from edge_agent.config import load_config
from edge_agent.errors import UnusableMessage
from edge_agent.rules import MAX_EVENT_MS, MIN_EVENT_MS, Rule, map_message
from shorelink.config import Section
from shorelink.errors import ConfigError

STREAMS = {"containers": 1, "nav": 1, "alerts": 1}


def _rule(**kw: str) -> Rule:
    return Rule.from_section(Section(kw, "rules[0]"), STREAMS)


@pytest.mark.parametrize(
    ("flt", "topic", "match"),
    [
        ("bigblue/+/containers/+/env", "bigblue/deck1/containers/C1/env", True),
        ("bigblue/+/containers/+/env", "bigblue/deck1/containers/C1/env/x", False),
        ("bigblue/+/containers/+/env", "bigblue/containers/C1/env", False),
        ("bigblue/#", "bigblue", True),
        ("bigblue/#", "bigblue/a/b/c", True),
        ("bigblue/#", "bigbluex/a", False),
        ("#", "anything/at/all", True),
        ("a/+", "a/", True),
        ("a.b/+", "aXb/c", False),
    ],
)
def test_mqtt_filter_matching(flt: str, topic: str, match: bool) -> None:
    assert _rule(filter=flt, stream="nav").matches(topic) is match


_level = st.text(st.characters(codec="utf-8", exclude_characters="/+#"), max_size=4)
_filters = st.lists(st.one_of(st.just("+"), _level), min_size=1, max_size=4).flatmap(
    lambda ls: st.sampled_from(["/".join(ls), "/".join([*ls, "#"])])
)


@settings(max_examples=400)
@given(_filters, st.data())
def test_a_filter_matches_exactly_the_topics_mqtt_says(flt: str, data: st.DataObject) -> None:
    """Review (aesthetics): the filters were ``^...$`` regexes used with ``.match``, so
    ``a/b`` matched the topic ``"a/b\\n"`` (``$`` matches before a final newline). Any
    topic text (every category: newlines, control characters, odd whitespace), near the
    filter or not: the rule matches exactly when MQTT's level-by-level rule does."""
    near = "/".join("x\n" if lvl in ("+", "#") else lvl for lvl in flt.split("/"))
    topic = data.draw(
        st.one_of(st.text(max_size=20), st.sampled_from([near, near + "\n", near + "/\n"]))
    )
    assert _rule(filter=flt, stream="nav").matches(topic) is mqtt_matches(flt, topic)
    assert not _rule(filter="a/b", stream="nav").matches("a/b\n")


def test_key_from_topic_levels_and_first_rule_wins() -> None:
    rules = (
        _rule(filter="bigblue/+/containers/+/alert", stream="alerts", key="{4}"),
        _rule(filter="bigblue/+/containers/+/+", stream="containers", key="{2}-{4}"),
        _rule(filter="bigblue/nav/#", stream="nav", key="position"),
    )
    assert map_message(rules, "bigblue/d1/containers/C9/alert", b"{}", 5).stream == "alerts"
    m = map_message(rules, "bigblue/d1/containers/C9/env", b"{}", 5)
    assert (m.stream, m.key, m.ts_ms) == ("containers", "d1-C9", 5)
    assert map_message(rules, "bigblue/nav/ais", b"!AIVDM", 5).key == "position"
    with pytest.raises(UnusableMessage, match="unmapped_topic"):
        map_message(rules, "other/topic", b"", 5)


@pytest.mark.parametrize(
    ("payload", "ts"),
    [
        (b'{"ts": 1700000000}', 1700000000000),
        (b'{"ts": 1700000000123}', 1700000000123),
        (b'{"ts": 1700000000.5}', 1700000000500),
        (b'{"ts": "2023-11-14T22:13:20Z"}', 1700000000000),
        (b'{"meta": {"ts": 1700000000}}', 7),  # field path does not match: receive time
        (b"not json", 7),
        (b'{"ts": true}', 7),
        (b'{"ts": "yesterday"}', 7),
    ],
)
def test_event_time_from_payload_else_receive_time(payload: bytes, ts: int) -> None:
    rule = _rule(filter="#", stream="containers", ts_field="ts")
    assert map_message((rule,), "x", payload, 7).ts_ms == ts


def test_dotted_ts_field() -> None:
    rule = _rule(filter="#", stream="containers", ts_field="meta.ts")
    assert map_message((rule,), "x", b'{"meta": {"ts": 1700000000}}', 7).ts_ms == 1700000000000


def test_key_level_beyond_topic_is_unusable_not_a_crash() -> None:
    rule = _rule(filter="#", stream="nav", key="{9}")
    with pytest.raises(UnusableMessage, match="bad_key"):
        map_message((rule,), "a/b", b"", 1)


@pytest.mark.parametrize("flt", ["a/#/b", "a/b+", "a/#x"])
def test_bad_filters_are_config_errors(flt: str) -> None:
    with pytest.raises(ConfigError, match=r"rules\[0\]\.filter"):
        _rule(filter=flt, stream="nav")


# -- hostile payloads: whatever a sensor publishes, mapping answers ----------------------

SAMPLE = load_config(Path(__file__).resolve().parents[2] / "deploy" / "edge" / "edge.toml")

_json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e19, 1e308, -1e308, 1e11, 1e16, 2**63, -(2**63) - 1, 7258118400]),
    st.text(max_size=30),
    st.sampled_from(["9999-12-31T23:59:59-23:59", "0001-01-01T00:00:00+14:00", "2200-01-01Z"]),
)
_json = st.recursive(
    _json_leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=12,
)


def _encode(doc: object) -> bytes:
    # json.dumps writes NaN/Infinity as the non-standard tokens json.loads accepts
    return json.dumps(doc).encode()


_payloads = st.one_of(
    st.binary(max_size=300),
    _json.map(_encode),
    _json.map(lambda v: _encode({"ts": v})),
    _json_leaf.map(lambda v: _encode({"ts": v, "t": 4.5})),
    st.integers(min_value=1, max_value=200_000).map(lambda n: b'{"ts": ' + b"[" * n),
    st.integers(min_value=1, max_value=200_000).map(lambda n: b"[" * n + b"]" * n),
    st.sampled_from([b'{"ts": NaN}', b'{"ts": Infinity}', b'{"ts": -Infinity}', b'{"ts": 1e308}']),
)


def _levels(max_size: int) -> st.SearchStrategy[str]:
    """One MQTT topic level: any text MQTT can carry (UTF-8, so no lone surrogates; no
    level separator, wildcard or NUL)."""
    return st.text(
        st.characters(blacklist_characters="/+#\0", blacklist_categories=("Cs",)),
        min_size=1,
        max_size=max_size,
    )


def _topic_for(rule: Rule, level: str) -> str:
    return "/".join(level if part == "+" else part for part in rule.filter.split("/"))


@settings(max_examples=400, deadline=None)
@given(
    rule=st.sampled_from(SAMPLE.rules),
    level=_levels(12),
    payload=_payloads,
)
def test_no_payload_escapes_mapping_and_event_times_stay_in_1970_to_2200(
    rule: Rule, level: str, payload: bytes
) -> None:
    """One bad event time used to kill the commit task (NaN, Infinity, 1e308, deep
    nesting): mapping must answer for every payload, with a time SQLite can store."""
    recv_ms = 1_700_000_000_000
    m = map_message(SAMPLE.rules, _topic_for(rule, level), payload, recv_ms)
    assert m.stream == rule.stream
    assert MIN_EVENT_MS <= m.ts_ms < MAX_EVENT_MS
    if m.ts_problem is not None:
        assert m.ts_ms == recv_ms and m.ts_problem in {
            "not_json", "missing", "not_a_time", "out_of_range", "too_deep",
        }  # fmt: skip


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        (b'{"ts": NaN}', "out_of_range"),
        (b'{"ts": Infinity}', "out_of_range"),
        (b'{"ts": 1e19}', "out_of_range"),
        (b'{"ts": 1e308}', "out_of_range"),
        (b'{"ts": ' + b"9" * 400 + b"}", "out_of_range"),
        (b'{"ts": ' + b"9" * 5000 + b"}", "not_json"),
        (b'{"ts": -5}', "out_of_range"),
        (b'{"ts": "9999-12-31T23:59:59-23:59"}', "out_of_range"),
        (b'{"ts": "2201-01-01T00:00:00Z"}', "out_of_range"),
        (b"[" * 100_000 + b"]" * 100_000, "too_deep"),
        (b'{"t": 4}', "missing"),
        (b'{"ts": true}', "not_a_time"),
    ],
)
def test_unusable_event_time_means_receive_time_and_says_why(payload: bytes, problem: str) -> None:
    rule = _rule(filter="#", stream="containers", ts_field="ts")
    m = map_message((rule,), "x", payload, 7)
    assert (m.ts_ms, m.ts_problem) == (7, problem)
