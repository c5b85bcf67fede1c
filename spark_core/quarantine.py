"""The quarantine: what a merge refuses, kept with its cause, and which causes can change.

A merge never drops a record it read: one it cannot write goes to ``sl.dead.<stream>``
(``sl.dead.unknown`` when the record names no stream it could read) with its own key,
value and headers, and three more headers:

- ``sl.dead.cause``: one word from :data:`CAUSES`, for machines (the metric, the page,
  the re-drive);
- ``sl.dead.reason``: the refusal in words, for people;
- ``sl.dead.source``: ``topic/partition/offset`` where the merge read it.

A cause either can change, and the record is tried again when it does
(spark_core/redrive.py), or it cannot, and the record waits for a person (its writer is
broken or hostile; the quarantine's retention bounds how long):

============== =============================================== =====================
cause          what refused it                                 tried again when
============== =============================================== =====================
unknown_ship   no key for the ship, and keys are required      the ship keys change
unsigned       the ship signs; this record has no proof        the ship keys change
bad_signature  no key of the ship verifies the proof           the ship keys change
revoked        the key was revoked below the record's seq      the ship keys change
holes          the ship's ledger entry is at the bound on      the entry has room
               holes (``MAX_HOLDINGS_RANGES`` ranges)          again
contract       the record breaks the record contract           never
too_large      the record is over ``MAX_RECORD_BYTES``         never
============== =============================================== =====================

Dead letters written before ``sl.dead.cause`` existed get their cause from their
reason (:func:`cause_of`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from shorelink.proof import KEY_CAUSES, key_cause

__all__ = [
    "CAUSES",
    "CONTRACT",
    "HOLES",
    "H_DEAD_CAUSE",
    "H_DEAD_HEADERS",
    "H_DEAD_REASON",
    "H_DEAD_SOURCE",
    "REDRIVE",
    "RETRIED_CAUSES",
    "TOO_LARGE",
    "cause_of",
    "dead_cause",
    "retried_when",
]

#: headers added to a dead-lettered record (the original ones are kept as they were)
H_DEAD_CAUSE = "sl.dead.cause"
H_DEAD_REASON = "sl.dead.reason"
H_DEAD_SOURCE = "sl.dead.source"
H_DEAD_HEADERS = (H_DEAD_CAUSE, H_DEAD_REASON, H_DEAD_SOURCE)

#: the neighbour part of a re-drive's source name (spark_core/redrive.py): no site's
#: name (``~`` is not a name's character), so no puller's cursor is ever taken for it;
#: a dead letter whose ``sl.dead.source`` begins with it is one tried again and refused
REDRIVE = "~redrive"

HOLES = "holes"
CONTRACT = "contract"
TOO_LARGE = "too_large"
#: the causes a change can lift: the ship keys file's (shorelink/proof.py) and the bound
#: on holes
RETRIED_CAUSES = frozenset({*KEY_CAUSES, HOLES})
CAUSES = frozenset({*RETRIED_CAUSES, CONTRACT, TOO_LARGE})

#: how a refusal at the bound on holes begins its reason (merge_state ``_order_new``)
_HOLES_TEXT = " ranges already"


def cause_of(reason: str) -> str:
    """The cause of a refusal given in words (a dead letter written before
    ``sl.dead.cause``): a ship keys cause, the bound on holes, the size limit, or else
    the contract."""
    if (cause := key_cause(reason)) is not None:
        return cause
    if reason.endswith(_HOLES_TEXT) and " holds " in reason:
        return HOLES
    if reason.startswith("record of ") and "MAX_RECORD_BYTES" in reason:
        return TOO_LARGE
    return CONTRACT


def dead_cause(headers: Iterable[Any] | None) -> str | None:
    """The cause of a dead letter from its headers (the last ``sl.dead.cause``, else its
    last ``sl.dead.reason`` read by :func:`cause_of`); None when it has neither: not a
    dead letter a merge wrote."""
    cause = reason = None
    for k, v in headers or ():
        if k == H_DEAD_CAUSE:
            cause = v
        elif k == H_DEAD_REASON:
            reason = v
    if isinstance(cause, bytes) and (text := cause.decode(errors="replace")) in CAUSES:
        return text
    if isinstance(reason, bytes):
        return cause_of(reason.decode(errors="replace"))
    return None


def retried_when(cause: str) -> str:
    """What becomes of a record quarantined for ``cause``, in words (the status and the
    operations page)."""
    if cause in KEY_CAUSES:
        return "tried again when the ship keys change"
    if cause == HOLES:
        return "tried again when the ship's ledger entry has room"
    return "not tried again: its writer must be mended"
