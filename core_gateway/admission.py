"""The pure decision of what a batch adds to what the site holds (:func:`plan_admission`).

The service (service.py) asks it for every batch, with the holdings of the batch's
``(ship, stream)`` and the seqs of the writes still in flight, then does the Kafka work
(ingress.py); like the merge's ``plan_batch``, the decision needs no broker to be tested.

A batch is taken if it starts at most one past the contiguous end of what the site has
settled (written, replicated or abandoned, plus what is being written), or at most one
past ``first_available - 1`` (the ship no longer has what lies before): anything later is
refused as a ``gap`` (with ``held``: the ship resends from its end + 1). Of a batch that overlaps
what is settled, only the new seqs are written. The seqs between the settled end and
``first_available`` are abandoned: they can never arrive, so the site stops waiting for
them; each abandonment is a hole, bounded by ``MAX_HOLDINGS_RANGES`` (refused as
``too_many_holes``).

A refusal is a decision like any other (:class:`Refused`), returned, not raised: which
HTTP status it becomes is the service's business (service.py), not the planner's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from core_gateway.holdings import SourceHoldings
from shorelink.ledger import MAX_HOLDINGS_RANGES
from shorelink.ranges import RangeSet
from shorelink.wire import Batch, WireRecord

__all__ = ["Admission", "Refused", "plan_admission"]


@dataclass(frozen=True)
class Admission:
    """What a batch adds: ``new`` records (seqs ``written``) and ``abandoned`` seqs."""

    #: the batch's records the site does not hold (nor is writing) yet
    new: list[WireRecord]
    #: the seqs of ``new``
    written: RangeSet
    #: seqs the ship no longer has, given up by this batch
    abandoned: RangeSet

    @property
    def nothing(self) -> bool:
        """The batch adds nothing (a resend of what the site holds): answer at once."""
        return not self.new and not self.abandoned


@dataclass(frozen=True)
class Refused:
    """The batch adds nothing and the ship must resend from ``held``'s end + 1:
    ``gap`` (it does not start where the site's holdings end) or ``too_many_holes``
    (it would abandon seqs past the bound on holes)."""

    reason: Literal["gap", "too_many_holes"]
    message: str
    #: what the site holds of the batch's (ship, stream)
    held: RangeSet


def plan_admission(
    ship: str, batch: Batch, holdings: SourceHoldings, pending: RangeSet
) -> Admission | Refused:
    """Pure: what ``batch`` of ``ship`` adds to ``holdings`` and to the ``pending`` seqs
    (admitted, not committed yet), or why it is refused: ``gap`` when it does not start
    where they end, ``too_many_holes`` when it would abandon seqs past the bound."""
    stream = batch.stream
    settled = holdings.settled()
    settled.update(pending)
    end = settled.contiguous_end()
    floor = max(end, batch.first_available - 1)
    if batch.first_seq > floor + 1:
        return Refused(
            "gap",
            f"batch starts at seq {batch.first_seq} but this site holds "
            f"{ship}/{stream} only up to {end}: resend from {end + 1}",
            holdings.held(),
        )
    if settled.overlaps(batch.first_seq, batch.last_seq):
        new = [r for r in batch.records if r.seq not in settled]
        written = RangeSet.from_seqs(r.seq for r in new)
    else:  # the usual case: nothing of it held yet (a batch's seqs are contiguous)
        new = list(batch.records)
        written = RangeSet([(batch.first_seq, batch.last_seq)])
    abandoned = RangeSet()
    if batch.first_available - 1 > end:
        # the ship no longer has these (dropped on board by policy): they can never
        # arrive, so the site stops waiting for them
        if len(holdings.abandoned) >= MAX_HOLDINGS_RANGES:
            # each abandonment is a hole in what the site writes, and every hole is
            # rewritten with every batch (cursor, ledger): a ship that keeps
            # abandoning (hostile, or broken) must not grow them without bound
            return Refused(
                "too_many_holes",
                f"{ship}/{stream} already has {len(holdings.abandoned)} abandoned ranges (the"
                f" most is {MAX_HOLDINGS_RANGES}); send seqs from {end + 1}",
                holdings.held(),
            )
        abandoned.add_range(end + 1, batch.first_available - 1)
    return Admission(new, written, abandoned)
