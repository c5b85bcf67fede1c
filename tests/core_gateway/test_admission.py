"""The gateway's admission decision (core_gateway/admission.py), without Kafka: what a
batch adds to what the site holds decides what is written once, what is never waited
for again, and what the ship must resend."""

from __future__ import annotations

import pytest

from core_gateway.admission import plan_admission
from core_gateway.errors import ApiError
from core_gateway.holdings import SourceHoldings
from shorelink.ledger import MAX_HOLDINGS_RANGES
from shorelink.ranges import RangeSet
from shorelink.wire import Batch
from tests.core_gateway.helpers import records

SHIP = "bigblue"


def _batch(lo: int, hi: int, first_available: int = 1) -> Batch:
    return Batch(SHIP, "containers", records(lo, hi), first_available=first_available)


def _holding(written: str, abandoned: str = "", replicated: str = "") -> SourceHoldings:
    return SourceHoldings(
        written=RangeSet.parse(written),
        abandoned=RangeSet.parse(abandoned),
        replicated=RangeSet.parse(replicated),
    )


def test_a_batch_past_the_held_end_is_a_409_gap_naming_what_to_resend() -> None:
    """A gap taken would be a hole nobody fills: the ship must resend from the end."""
    with pytest.raises(ApiError) as refused:
        plan_admission(SHIP, _batch(21, 30), _holding("1-10"), RangeSet())
    assert (refused.value.status, refused.value.code) == (409, "gap")
    assert refused.value.extra["held"] == "1-10"
    assert "resend from 11" in str(refused.value)


def test_a_batch_next_to_what_is_in_flight_is_taken_whole() -> None:
    """Pipelining: batch N+1 builds on batch N while N is still being written."""
    plan = plan_admission(SHIP, _batch(11, 20), _holding("1-5"), RangeSet([(6, 10)]))
    assert [r.seq for r in plan.new] == list(range(11, 21))
    assert plan.written == RangeSet([(11, 20)]) and not plan.abandoned


def test_an_overlapping_batch_writes_only_the_seqs_not_held() -> None:
    """A resend after a lost reply must not write any identity twice."""
    held = _holding("1-10", replicated="12")
    plan = plan_admission(SHIP, _batch(8, 15), held, RangeSet([(13, 13)]))
    assert [r.seq for r in plan.new] == [11, 14, 15]
    assert plan.written == RangeSet.parse("11,14-15")
    assert not plan.abandoned and not plan.nothing


def test_a_batch_of_what_is_held_adds_nothing() -> None:
    plan = plan_admission(SHIP, _batch(1, 10), _holding("1-10"), RangeSet())
    assert plan.nothing and not plan.written


def test_seqs_the_ship_no_longer_has_are_abandoned() -> None:
    """Seqs dropped on board can never arrive: the site stops waiting for them."""
    plan = plan_admission(SHIP, _batch(21, 30, first_available=21), _holding("1-10"), RangeSet())
    assert plan.abandoned == RangeSet([(11, 20)])
    assert plan.written == RangeSet([(21, 30)])


def test_abandoning_past_the_bound_is_refused_422_too_many_holes() -> None:
    """Every hole is rewritten with every batch: a ship may not add them without bound."""
    # every even seq abandoned (as many holes as the bound), every odd one written
    end = 2 * MAX_HOLDINGS_RANGES + 1
    held = SourceHoldings(
        written=RangeSet((s, s) for s in range(1, end + 1, 2)),
        abandoned=RangeSet((s, s) for s in range(2, end, 2)),
    )
    with pytest.raises(ApiError) as refused:
        plan_admission(SHIP, _batch(end + 2, end + 2, first_available=end + 2), held, RangeSet())
    assert (refused.value.status, refused.value.code) == (422, "too_many_holes")
    assert str(refused.value.extra["held"]).endswith(f",{end}")
    # what does not abandon anything is still taken
    plan = plan_admission(SHIP, _batch(end + 1, end + 2), held, RangeSet())
    assert plan.written == RangeSet([(end + 1, end + 2)]) and not plan.abandoned
