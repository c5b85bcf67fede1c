"""The gateway's admission decision (core_gateway/admission.py), without Kafka: what a
batch adds to what the site holds decides what is written once, what is never waited
for again, and what the ship must resend."""

from __future__ import annotations

from core_gateway.admission import Admission, Refused, plan_admission
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


def _plan(batch: Batch, held: SourceHoldings, pending: RangeSet) -> Admission:
    plan = plan_admission(SHIP, batch, held, pending)
    assert isinstance(plan, Admission), plan
    return plan


def test_a_batch_past_the_held_end_is_refused_as_a_gap_naming_what_to_resend() -> None:
    """A gap taken would be a hole nobody fills: the ship must resend from the end. The
    planner decides and returns the refusal (the service makes it a 409): a pure
    decision raises no HTTP error."""
    refused = plan_admission(SHIP, _batch(21, 30), _holding("1-10"), RangeSet())
    assert isinstance(refused, Refused)
    assert (refused.reason, refused.held) == ("gap", RangeSet.parse("1-10"))
    assert "resend from 11" in refused.message


def test_a_batch_next_to_what_is_in_flight_is_taken_whole() -> None:
    """Pipelining: batch N+1 builds on batch N while N is still being written."""
    plan = _plan(_batch(11, 20), _holding("1-5"), RangeSet([(6, 10)]))
    assert [r.seq for r in plan.new] == list(range(11, 21))
    assert plan.written == RangeSet([(11, 20)]) and not plan.abandoned


def test_an_overlapping_batch_writes_only_the_seqs_not_held() -> None:
    """A resend after a lost reply must not write any identity twice."""
    held = _holding("1-10", replicated="12")
    plan = _plan(_batch(8, 15), held, RangeSet([(13, 13)]))
    assert [r.seq for r in plan.new] == [11, 14, 15]
    assert plan.written == RangeSet.parse("11,14-15")
    assert not plan.abandoned and not plan.nothing


def test_a_batch_of_what_is_held_adds_nothing() -> None:
    plan = _plan(_batch(1, 10), _holding("1-10"), RangeSet())
    assert plan.nothing and not plan.written


def test_seqs_the_ship_no_longer_has_are_abandoned() -> None:
    """Seqs dropped on board can never arrive: the site stops waiting for them."""
    plan = _plan(_batch(21, 30, first_available=21), _holding("1-10"), RangeSet())
    assert plan.abandoned == RangeSet([(11, 20)])
    assert plan.written == RangeSet([(21, 30)])


def test_abandoning_past_the_bound_is_refused_as_too_many_holes() -> None:
    """Every hole is rewritten with every batch: a ship may not add them without bound."""
    # every even seq abandoned (as many holes as the bound), every odd one written
    end = 2 * MAX_HOLDINGS_RANGES + 1
    held = SourceHoldings(
        written=RangeSet((s, s) for s in range(1, end + 1, 2)),
        abandoned=RangeSet((s, s) for s in range(2, end, 2)),
    )
    refused = plan_admission(
        SHIP, _batch(end + 2, end + 2, first_available=end + 2), held, RangeSet()
    )
    assert isinstance(refused, Refused) and refused.reason == "too_many_holes"
    assert str(refused.held).endswith(f",{end}")
    # what does not abandon anything is still taken
    plan = _plan(_batch(end + 1, end + 2), held, RangeSet())
    assert plan.written == RangeSet([(end + 1, end + 2)]) and not plan.abandoned
