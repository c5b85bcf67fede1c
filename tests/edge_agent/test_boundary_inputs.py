"""The edge agent's boundaries over the whole input space (docs/boundaries.md): a
sensor's message is mapped or quarantined with its reason, the alarms read a number or
nothing, a gateway's first message is holdings or a ValueError, a key file is a key or
a ConfigError; each within its row's bound. One message that escapes as another
exception is retried one by one forever, and ingest stalls behind it."""

from __future__ import annotations

import math
from base64 import b64encode
from pathlib import Path

import aiohttp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge_agent.alarms import _BAD, _parse, _value
from edge_agent.config import DEFAULT_LINKS, GatewayEndpoint, load_signing_key
from edge_agent.errors import UnusableMessage, UplinkError
from edge_agent.gateway import HttpGateway, SendResult, _parse_hello
from edge_agent.rules import MAX_EVENT_MS, MIN_EVENT_MS, Mapped, Rule, admit_message, map_message
from shorelink import strict_json
from shorelink.config import Secret, Section
from shorelink.contract import MAX_RECORD_BYTES
from shorelink.errors import ConfigError
from shorelink.proof import ShipKey
from shorelink.ranges import RangeSet
from tests.bounds import FAST, KIB, Bound, within
from tests.strategies import HUGE_INTS, any_bytes, any_text, deep_json, json_values, mutated

STREAMS = {"containers": 1, "nav": 1, "alerts": 1}
RULES = tuple(
    Rule.from_section(Section(kw, f"rules[{i}]"), STREAMS)
    for i, kw in enumerate(
        [
            {
                "filter": "ship/+/containers/+/env",
                "stream": "containers",
                "key": "{2}/{4}",
                "ts_field": "meta.ts",
            },
            {"filter": "ship/nav/#", "stream": "nav", "key": "{9}", "ts_field": "t"},
            {"filter": "#", "stream": "alerts", "key": "{1}"},
        ]
    )
)

_TOPICS = st.one_of(
    any_text(80),
    st.lists(
        st.one_of(any_text(10), st.sampled_from(["ship", "containers", "env", "nav"])), max_size=12
    ).map("/".join),
)
_TIMES = st.one_of(
    st.integers(),
    HUGE_INTS,
    st.floats(),
    any_text(30),
    st.sampled_from(["2024-01-01T00:00:00Z", "9999-12-31T23:59:59", "0001-01-01", "+inf"]),
)
_PAYLOADS = st.one_of(
    any_bytes(300),
    deep_json(),
    _TIMES.map(lambda t: b'{"meta": {"ts": %s}, "t": %s}' % (repr(t).encode(), repr(t).encode())),
    json_values().map(lambda d: strict_json.dumps({"meta": d, "t": d}).encode()),
    mutated(b'{"meta": {"ts": 1700000000000}, "t": "2024-01-01T00:00:00Z"}'),
)


@FAST
@given(topic=_TOPICS, payload=_PAYLOADS)
def test_any_topic_and_payload_is_mapped_or_unusable(topic: str, payload: bytes) -> None:
    out = within(
        Bound(256 * KIB, 16, cpu_s=0.5),
        (UnusableMessage,),
        map_message,
        RULES,
        topic,
        payload,
        1_700_000_000_000,
        size=len(topic) + len(payload),
    )
    if isinstance(out, Mapped):
        assert MIN_EVENT_MS <= out.ts_ms < MAX_EVENT_MS and isinstance(out.key, str)
    else:
        assert out.reason in ("bad_key", "unmapped_topic")


@FAST
@given(
    topic=st.one_of(
        any_bytes(120),
        _TOPICS.map(lambda t: t.encode("utf-8", "surrogatepass")),
        st.integers(0, 70_000).map(lambda n: b"ship/nav/" + b"a" * n),
    ),
    payload=st.one_of(_PAYLOADS, st.integers(0, 1_100_000).map(bytes)),
    max_payload=st.sampled_from([0, 100, 256 * 1024, 4 * 1024 * 1024]),
)
def test_any_message_the_broker_delivers_is_admitted_or_unusable(
    topic: bytes, payload: bytes, max_payload: int
) -> None:
    out = within(
        Bound(256 * KIB, 16, cpu_s=0.5),
        (UnusableMessage,),
        admit_message,
        RULES,
        topic,
        payload,
        1_700_000_000_000,
        max_payload,
        size=len(topic) + len(payload),
    )
    if isinstance(out, UnusableMessage):
        assert out.reason in ("bad_topic", "oversized", "unmapped_topic", "bad_key")
    else:
        text, mapped = out
        assert text.encode() == topic and len(payload) <= max_payload
        assert len(payload) + len(mapped.key) + len(topic) <= MAX_RECORD_BYTES


@FAST
@given(
    payload=_PAYLOADS,
    path=st.one_of(st.sampled_from(["meta.ts", "t", "a.b.c", "0", ""]), any_text(20)),
)
def test_an_alarms_reading_of_any_payload_is_a_finite_number_or_none(
    payload: bytes, path: str
) -> None:
    doc = within(Bound(256 * KIB, 16, cpu_s=0.5), (), _parse, payload)
    value = within(Bound(64 * KIB), (), _value, doc, path, size=0)
    assert value is None or (isinstance(value, float) and math.isfinite(value))
    assert doc is not _BAD or value is None


def _hello(text: str) -> aiohttp.WSMessage:
    return aiohttp.WSMessage(aiohttp.WSMsgType.TEXT, text, None)


@FAST
@given(
    st.one_of(
        any_text(300),
        deep_json().map(bytes.decode),
        json_values().map(lambda d: strict_json.dumps({"type": "holdings", "streams": d})),
        st.dictionaries(any_text(10), st.one_of(any_text(30), HUGE_INTS)).map(
            lambda d: strict_json.dumps({"type": "holdings", "streams": d})
        ),
        mutated(b'{"type": "holdings", "streams": {"containers": "1-5,9"}}').map(
            lambda b: b.decode(errors="replace")
        ),
    )
)
def test_the_gateways_first_message_is_holdings_or_a_value_error(text: str) -> None:
    within(
        Bound(256 * KIB, 32, cpu_s=0.5), (ValueError,), _parse_hello, _hello(text), size=len(text)
    )


_KEY = ShipKey.generate()


@settings(
    max_examples=40,
    deadline=2000,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    st.one_of(
        any_bytes(200),
        st.binary(max_size=60).map(lambda b: b"ed25519-secret:" + b),
        st.binary(min_size=32, max_size=32).map(lambda b: b"ed25519-secret:" + b64encode(b)),
    )
)
def test_a_signing_key_file_is_loaded_or_refused_with_a_config_error(
    tmp_path: Path, data: bytes
) -> None:
    path = tmp_path / "ship.key"
    path.unlink(missing_ok=True)
    path.write_bytes(data)
    path.chmod(0o600)
    out = within(
        Bound(64 * KIB, 8, cpu_s=0.2), (ConfigError,), load_signing_key, path, size=len(data)
    )
    if isinstance(out, ShipKey):  # a private key as `save` writes it, never a public one
        assert data.strip().startswith(b"ed25519-secret:")
    else:
        assert out.field == "uplink.signing_key_file"


_GATEWAY = HttpGateway(
    GatewayEndpoint("tokyo", "http://127.0.0.1:1", "port_wifi"),
    DEFAULT_LINKS["port_wifi"],
    "bigblue",
    Secret("t"),
)
_ANSWER_VALUES = st.one_of(json_values(), any_text(40), HUGE_INTS, st.integers(0, 600))


@FAST
@given(
    st.one_of(
        st.dictionaries(
            st.sampled_from(["status", "held", "written", "error", "message", "x"]),
            _ANSWER_VALUES,
            max_size=6,
        ),
        st.tuples(st.integers(100, 599), _ANSWER_VALUES, any_text(30)).map(
            lambda s: {"status": s[0], "held": s[1], "error": s[2], "message": s[1]}
        ),
    )
)
def test_the_gateways_answer_is_a_result_or_an_uplink_error(data: dict[str, object]) -> None:
    """The ship trusts its gateway's TLS, not its every byte: an answer of any shape is
    a result or an error of the uplink's tree, which the session knows how to take."""
    size = len(strict_json.dumps(data))
    out = within(
        Bound(256 * KIB, 32, cpu_s=0.5),
        (UplinkError,),
        _GATEWAY._result,
        "containers",
        data,
        10,
        size=size,
    )
    if isinstance(out, SendResult):  # only an answer of 200 that says what the site holds
        assert data.get("status", 200) == 200 and out.held == RangeSet.parse(str(data["held"]))
