"""Rules decide which stream and key a reading gets: a wrong key scatters one
container's history over partitions."""

from __future__ import annotations

import pytest

from edge_agent.errors import UnusableMessage
from edge_agent.rules import Rule, map_message
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
