"""The ship report's contract (shorelink/ship_report.py): what a ship writes, a site
reads back unchanged; whatever else arrives from the sea is a ContractError, never
another exception."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shorelink.errors import ContractError
from shorelink.ship_report import (
    MAX_FAILURE_CHARS,
    MAX_REPORT_BYTES,
    ReportedConfig,
    ShipReport,
    decode_report,
    encode_report,
)
from tests.strategies import DIGITS, LOWER, words

names = words(LOWER + DIGITS, LOWER + DIGITS + "_-", 62)
counts = st.integers(0, 2**63 - 1)
pairs = st.tuples(counts, counts)

reports = st.builds(
    ShipReport,
    at_ms=counts,
    link=st.one_of(st.none(), names),
    streams=st.dictionaries(names, pairs, max_size=8),
    links=st.dictionaries(names, pairs, max_size=4),
    log_bytes=counts,
    log_budget=counts,
    agent=st.one_of(st.none(), words(DIGITS, LOWER + DIGITS + ".+_-", 63)),
    config=st.one_of(
        st.none(),
        st.builds(
            ReportedConfig,
            version=counts,
            failure=st.one_of(st.none(), st.text(max_size=MAX_FAILURE_CHARS)),
        ),
    ),
    token=st.one_of(st.none(), st.text("0123456789abcdef", min_size=16, max_size=16)),
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


@given(reports)
def test_what_a_ship_writes_a_site_reads(report: ShipReport) -> None:
    assert decode_report(encode_report(report)) == report


@given(st.binary(max_size=300))
def test_any_bytes_are_a_report_or_a_contract_error(payload: bytes) -> None:
    with contextlib.suppress(ContractError):
        decode_report(payload)


@given(
    st.fixed_dictionaries(
        {"v": st.sampled_from([1, 1, 2, "1", None]), "at": json_values},
        optional={
            "link": json_values,
            "streams": json_values | st.dictionaries(names, json_values, max_size=3),
            "links": json_values,
            "log": json_values,
            "agent": json_values | st.text(max_size=70),
            "config": json_values
            | st.fixed_dictionaries({"version": json_values, "failure": json_values}),
        },
    )
)
def test_hostile_json_is_a_contract_error(doc: dict[str, object]) -> None:
    try:
        r = decode_report(json.dumps(doc).encode())
    except ContractError:
        return
    # what decodes is a report whose every figure is a non-negative count
    assert r.at_ms >= 0 and all(a >= 0 and b >= 0 for a, b in r.streams.values())


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ({"v": 1, "at": -1, "streams": {}, "links": {}}, "at: expected a count"),
        ({"v": 1, "at": True, "streams": {}, "links": {}}, "at: expected a count"),
        ({"v": 1, "at": 1, "streams": {"Nav": [1, 0]}, "links": {}}, "bad stream name"),
        ({"v": 1, "at": 1, "streams": {"nav": [1]}, "links": {}}, "streams.nav: expected [a, b]"),
        ({"v": 2, "at": 1, "streams": {}, "links": {}}, "version 2"),
        ({"v": 1, "at": 1, "streams": [], "links": {}}, "streams: expected an object"),
        (
            {"v": 1, "at": 1, "streams": {}, "links": {}, "agent": "1 0"},
            "agent: expected a version",
        ),
        ({"v": 1, "at": 1, "streams": {}, "links": {}, "agent": 1}, "agent: expected a version"),
        (
            {"v": 1, "at": 1, "streams": {}, "links": {}, "config": {"version": 1}},
            "config: expected {version, failure}",
        ),
        (
            {
                "v": 1,
                "at": 1,
                "streams": {},
                "links": {},
                "config": {"version": -1, "failure": None},
            },
            "config.version: expected a count",
        ),
        (
            {"v": 1, "at": 1, "streams": {}, "links": {}, "config": {"version": 1, "failure": 3}},
            "config.failure: expected text",
        ),
        (
            {"v": 1, "at": 1, "streams": {}, "links": {}, "token": "sl_" + "A" * 43},
            "token: expected a token's id",
        ),
        (
            {"v": 1, "at": 1, "streams": {}, "links": {}, "token": "3F0C9A2E71D4B855"},
            "token: expected a token's id",
        ),
    ],
)
def test_errors_say_what_is_wrong(doc: dict[str, object], says: str) -> None:
    with pytest.raises(ContractError, match=says.replace("[", r"\[").replace("]", r"\]")):
        decode_report(json.dumps(doc).encode())


def test_a_report_over_the_limit_is_refused_unread() -> None:
    with pytest.raises(ContractError, match="at most"):
        decode_report(b" " * (MAX_REPORT_BYTES + 1))


def test_a_report_from_an_agent_before_versions_is_read_without_one() -> None:
    """Ships are upgraded one by one: a site reads the reports of agents that do not say
    their version yet (the field came after version 1), and an older site ignores it."""
    old = {"v": 1, "at": 5, "link": None, "streams": {"nav": [3, 1]}, "links": {}}
    assert decode_report(json.dumps(old).encode()).agent is None
    new = json.loads(encode_report(ShipReport(5, None, {"nav": (3, 1)}, {}, agent="0.2.0")))
    assert new["agent"] == "0.2.0" and new["v"] == 1


def test_a_report_from_an_agent_before_fleet_configuration_is_read_without_one() -> None:
    """Rollouts read ``config`` from every ship's report while some ships still run an
    agent that does not write it: its absence is None, never an error; a failure text
    longer than a report should carry is cut by the writer, never refused."""
    old = {"v": 1, "at": 5, "link": None, "streams": {}, "links": {}, "agent": "0.2.0"}
    assert decode_report(json.dumps(old).encode()).config is None
    report = ShipReport(5, None, {}, {}, config=ReportedConfig(3, "x" * 1000))
    doc = json.loads(encode_report(report))
    assert doc["config"]["version"] == 3 and len(doc["config"]["failure"]) == MAX_FAILURE_CHARS
    assert json.loads(encode_report(ShipReport(5, None, {}, {}, config=ReportedConfig(4))))[
        "config"
    ] == {"version": 4, "failure": None}


def test_a_report_names_its_tokens_id_and_one_from_before_names_none() -> None:
    """Headquarters retires a rotated token on the ship's report naming the new one
    (shorelink/fleet/tokens.py): the id is read exactly, and a report of an agent from
    before names none (its rotation waits for `fleet retire-token`), never an error."""
    old = {"v": 1, "at": 5, "link": None, "streams": {}, "links": {}, "agent": "0.2.0"}
    assert decode_report(json.dumps(old).encode()).token is None
    doc = json.loads(encode_report(ShipReport(5, None, {}, {}, token="3f0c9a2e71d4b855")))
    assert doc["token"] == "3f0c9a2e71d4b855"
