"""Hostile JSON in a record (shorelink/strict_json.py): every reader of records gets a
ValueError (or its own contract error, counted) for what no strict reader takes, never
another exception, and what they keep is JSON a browser parses (review H2: one NaN
froze the operations page at every site, nesting 1,000 deep killed its follower)."""

from __future__ import annotations

import contextlib
import json
import math
import sys
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shorelink import strict_json
from shorelink.contract import Record
from shorelink.errors import ContractError
from shorelink.identity import Identity
from shorelink.ship_report import decode_report
from spark_core.ais import NavRecord, decode_nav
from spark_core.ops.follow import _alert

#: JSON values with the numbers Python's json writes but no browser reads
_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=20,
)
_DEEP = [b"[" * n + b"]" * n for n in (999, 5_000, 100_000)] + [
    b'{"a":' * 50_000 + b"1" + b"}" * 50_000
]
_CONSTANTS = [b"NaN", b"Infinity", b"-Infinity", b"1e999", b"-1e400", b'{"lat": NaN, "lon": 1}']


def _hostile() -> st.SearchStrategy[bytes]:
    lenient = _VALUES.map(lambda v: json.dumps(v).encode())  # NaN, Infinity as bare tokens
    return (
        lenient
        | st.sampled_from(_DEEP + _CONSTANTS)
        | st.binary(max_size=64)
        | st.builds(
            lambda v, d: b'{"lat": 1, "lon": 2, "x": ' + d + b"}", _VALUES, st.sampled_from(_DEEP)
        )
    )


def _strict(text: str) -> Any:
    """As a browser's JSON.parse reads it: NaN and Infinity are errors."""

    def no(name: str) -> Any:
        raise AssertionError(f"{name} in output")

    return json.loads(text, parse_constant=no)


@given(_hostile())
def test_loads_returns_strict_json_or_raises_value_error(payload: bytes) -> None:
    try:
        value = strict_json.loads(payload)
    except ValueError:
        return
    _strict(strict_json.dumps(value))
    assert strict_json.loads(strict_json.dumps(value)) == value


@pytest.mark.parametrize("payload", _DEEP + _CONSTANTS)
def test_what_python_reads_leniently_is_refused(payload: bytes) -> None:
    with pytest.raises(ValueError):
        strict_json.loads(payload)


@given(_VALUES)
def test_dumps_writes_only_strict_json(value: Any) -> None:
    out = _strict(strict_json.dumps(value))
    # a float that is no number became null, everything else is kept
    assert out == strict_json.finite(json.loads(json.dumps(value)))


@given(_hostile())
def test_a_ship_report_is_one_or_a_contract_error(payload: bytes) -> None:
    with contextlib.suppress(ContractError):
        report = decode_report(payload)
        _strict(json.dumps(report.streams))  # what the page shows of it


@given(st.lists(_hostile(), max_size=4))
def test_nav_positions_are_finite_and_bad_payloads_counted(payloads: list[bytes]) -> None:
    texts = [p.decode("utf-8", "replace") for p in payloads]
    records = [NavRecord("ship1", i, 1_700_000_000_000, t) for i, t in enumerate(texts, 1)]
    positions, errors = decode_nav(records)
    assert 0 <= errors <= len(records)
    for p in positions:
        assert math.isfinite(p.lat) and math.isfinite(p.lon)


@given(_hostile(), st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_an_alert_as_the_page_lists_it_is_strict_json(payload: bytes, ts: int) -> None:
    rec = Record(Identity("ship1", "alerts", 1), b"MSCU1234565", payload, ts, "tokyo", "t")
    alert = _alert(rec, None, None)
    json.dumps(alert, allow_nan=False)  # the reader keeps no number a browser refuses
    assert isinstance(alert["body"], dict | str)


def test_the_deepest_payload_costs_no_recursion_error_at_any_limit() -> None:
    limit = sys.getrecursionlimit()
    try:
        sys.setrecursionlimit(200)
        with pytest.raises(ValueError):
            strict_json.loads(b"[" * 500 + b"]" * 500)
    finally:
        sys.setrecursionlimit(limit)
