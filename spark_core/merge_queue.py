"""The feeds' batches waiting for their merge, written together (group commit).

A merge has several feeds (spark_core/feed.py: a puller per neighbour, its ingest
puller), each a thread that hands the merge a batch (``Merger.write_pulled``) and waits
for its lock. Each batch was a Kafka transaction of its own, and a transaction takes
20-700 ms on a busy site: a batch waited for every batch ahead of it, one commit each,
and in ``bench/replication.py --quick --signed`` the time from the entry site's copy to
a neighbour's (``pull_write``) was most of the steady lag's p99. Now the feed that takes
the lock writes every batch waiting then, its own and the others', in one transaction,
as a database's log writer commits the transactions that queued behind the one it
writes; the others find theirs written when they get the lock, and return.

What one transaction takes stays within ``merge.max_batch_bytes`` (the first batch
always goes, so every feed moves): the batches waiting were already held in memory
(the feeds' shared budget), and the merge plans no more at once than a batch's bytes.
The rest waits, in order, for the next turn. Exactly once is the merge's as before:
the records, the ledger and every batch's cursors commit together or not at all, and
a batch written with others fails with them (each feed then reads again from what
the merge committed).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property

from spark_core.merge_state import BatchPlan, MergeError, SourceRow

__all__ = ["Waiting", "WriteQueue", "rows_bytes", "settle"]


def rows_bytes(rows: Sequence[SourceRow]) -> int:
    """The bytes of ``rows`` as a feed counts them: key, value and headers."""
    return sum(
        len(r.key or b"") + len(r.value or b"") + sum(len(k) + len(v or b"") for k, v in r.headers)
        for r in rows
    )


@dataclass(eq=False)
class Waiting:
    """One feed's batch in the queue, and what became of it."""

    rows: Sequence[SourceRow]
    plan: BatchPlan | None = None
    error: BaseException | None = None

    @property
    def done(self) -> bool:
        return self.plan is not None or self.error is not None

    @cached_property
    def nbytes(self) -> int:
        return rows_bytes(self.rows)

    def outcome(self) -> BatchPlan:
        """The plan of the transaction that wrote this batch, or its failure raised."""
        if self.error is not None:
            raise self.error
        assert self.plan is not None
        return self.plan


class WriteQueue:
    """The batches handed to one merge and not written yet, in arrival order. The
    merge's lock decides who writes; this only keeps the queue (its own small lock:
    a feed adds its batch before it waits for the merge's)."""

    def __init__(self, cap: int) -> None:
        #: the bytes one transaction takes at most (the first batch always)
        self.cap = cap
        self._waiting: list[Waiting] = []
        self._lock = threading.Lock()

    def add(self, rows: Sequence[SourceRow]) -> Waiting:
        w = Waiting(rows)
        with self._lock:
            self._waiting.append(w)
        return w

    def take(self) -> list[Waiting]:
        """The batches at the head of the queue that fit in one transaction."""
        with self._lock:
            group = self._waiting[:1]
            if len(self._waiting) > 1:  # sizes counted only when batches wait together
                size = group[0].nbytes
                for w in self._waiting[1:]:
                    if size + w.nbytes > self.cap:
                        break
                    group.append(w)
                    size += w.nbytes
            del self._waiting[: len(group)]
            return group

    def __len__(self) -> int:
        with self._lock:
            return len(self._waiting)


def settle(
    group: Sequence[Waiting],
    own: Waiting,
    plan: BatchPlan | None = None,
    error: BaseException | None = None,
) -> None:
    """Tell each batch of ``group`` what became of the transaction ``own``'s feed wrote
    it in: the plan, with the records found unproved in that batch's own sources (its
    feed's guard counts them: a forging neighbour parks its feed, not another's); or
    the failure (the writer's own; another feed's as a :class:`MergeError` of it,
    fatal if it was)."""
    for w in group:
        if error is not None:
            if w is own:
                w.error = error
            else:
                fatal = bool(getattr(error, "fatal", False))
                relayed = MergeError(f"written with another feed's batch: {error}", fatal=fatal)
                relayed.__cause__ = error
                w.error = relayed
            continue
        assert plan is not None
        if len(group) == 1:
            w.plan = plan
            continue
        sources = {r.topic for r in w.rows}
        w.plan = replace(
            plan, unproved=sum(n for src, n in plan.unproved_from.items() if src in sources)
        )
