"""A neighbour's feed parked when it brings too many records its ships' keys do not
prove (review N5).

Checking a forged proof costs a site about ten times a genuine record (an Ed25519
verification per record, about 80 µs: a genuine chunk's signature is checked once for
its 128 records, and a failed chunk is remembered by shorelink/proof.py, but a forger
can sign every record differently). The pullers of a site share its merge
(``Merger.busy``) with the site's own ingest, so a neighbour that forges records by the
thousand would delay the site's own ships' alerts.

So each puller keeps a :class:`FeedGuard`: once more than ``limit`` of what it handed to
the merge in ``window_s`` seconds were unproved, the puller reads nothing from that
neighbour for ``park_s`` seconds (``event=pull_parked``). Nothing is lost: its cursor
stays where the merge committed, and what the neighbour holds is read after the park,
checked as ever. A neighbour that keeps forging costs the site at most one batch of
checks per park; its genuine records come late, or through another neighbour.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["PARK_S", "UNPROVED_LIMIT", "UNPROVED_WINDOW_S", "FeedGuard"]

#: unproved records a neighbour's feed may bring in :data:`UNPROVED_WINDOW_S` seconds
#: before it is parked: under a second of Ed25519 checks (80 µs each) per window and
#: park, about 1% of a core, where an unparked forger could fill one; a burst of a few
#: thousand garbage records (a buggy neighbour) is dead-lettered without a park
UNPROVED_LIMIT = 10_000
UNPROVED_WINDOW_S = 60.0
#: how long a parked feed is not read
PARK_S = 60.0


@dataclass
class FeedGuard:
    """Counts the unproved records of one feed in a sliding window; parks the feed
    when they pass ``limit``."""

    limit: int = UNPROVED_LIMIT
    window_s: float = UNPROVED_WINDOW_S
    park_s: float = PARK_S
    clock: Callable[[], float] = time.monotonic
    #: unproved records in all, and times the feed was parked
    unproved: int = 0
    parks: int = 0
    #: until when (``clock``) the feed is parked; 0: not parked
    parked_until: float = 0.0
    _recent: deque[tuple[float, int]] = field(default_factory=deque, repr=False)
    _in_window: int = field(default=0, repr=False)

    def parked(self) -> bool:
        """Is the feed parked now?"""
        return self.clock() < self.parked_until

    def note(self, unproved: int) -> bool:
        """Count a batch's ``unproved`` records; True if that parks the feed (it was
        not parked before)."""
        if unproved <= 0:
            return False
        now = self.clock()
        self.unproved += unproved
        self._recent.append((now, unproved))
        self._in_window += unproved
        while self._recent and self._recent[0][0] <= now - self.window_s:
            self._in_window -= self._recent.popleft()[1]
        if self._in_window <= self.limit:
            return False
        self.parked_until = now + self.park_s
        self.parks += 1
        self._recent.clear()
        self._in_window = 0
        return True
