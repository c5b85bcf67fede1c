"""A merge's pullers, one per neighbour, in one thread (issue "A fleet's worth": threads
flat in the number of neighbours).

A feed (spark_core/feed.py) was a thread each: a site with M neighbours and two merges
ran 2M puller threads, and each batch a puller read waited in its own thread for the
merge (docs/data-centre.md, "A site's costs as neighbours grow": 2.0 Python threads a
neighbour). A :class:`FeedLoop` runs the pullers of one merge in turn in one thread:

- **Read, then write.** Each turn reads a round from every puller that is due
  (:meth:`Feed.read_round`, its poll not waiting: librdkafka's Python client cannot
  wait on several consumers at once), queues every batch read for the merge
  (:meth:`Merger.enqueue`), then waits for them (:meth:`Merger.written`): the first
  writes them all in one transaction (spark_core/merge_queue.py, group commit), so
  the merge's transactions follow the loop's turns, not the number of neighbours.
  Exactly once is the merge's as ever: records, ledger and every batch's cursors
  commit together or not at all, and a failed transaction fails each batch in it
  (its puller reads again from what the merge committed).
- **Health.** A turn that wrote, or found every partition at its end, ends a puller's
  failures in a row (its backoff, and the ``failing_since`` by which the routes hold
  its link: spark_core/routing.py); one that read nothing before its reader fetched
  says nothing (a poll that does not wait finds nothing right after a failure closed
  and reopened the reader: counted as healed, a puller whose merge refused every
  batch never backed off nor had its link held).
- **Pace.** A puller that read something is due again at once; one that read
  nothing, after :data:`TICK_S` (what a record arriving then waits at most, against
  a thread's poll that woke at once); one with nothing assigned or parked, after the
  probe interval; one that failed, after its backoff (``FEED_BACKOFF``). When no
  puller is due the loop sleeps until the next one is, at most a tick.
- **One neighbour does not hold up the others for long.** A puller's calls to its
  neighbour other than the poll (describing its topics every ``DESCRIBE_EVERY_S``,
  the relay index's walk on a first read, the ends of a history) wait at most the
  probe timeout (``replication.probe_timeout``: the neighbour's one admin client, the
  link probe's too, is made with it: ``SharedAdmin`` in spark_core/neighbour_admin.py), and a
  failure backs that puller off alone. A neighbour whose link the probes found down
  (``ready``: spark_core/routing.py, ``NeighbourLink.up``) is not read until they find
  it up again: its calls would only time out. Between a neighbour's last answer and
  the probe that finds it gone (``probe_interval`` plus ``probe_timeout``), the
  loop's other pullers may wait once for one of its calls; threads did not, and that
  is the price of the fixed count.

The site's ingest pullers (its own ships' records, the alerts' first hop) keep a
thread each: one per merge, whatever M.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from spark_core.feed import Feed, Turn
from spark_core.merge_queue import Waiting

__all__ = ["TICK_S", "FeedLoop"]

#: how long a puller that read nothing waits for its next turn: the most a record
#: arriving then waits before it is read (the poll of a feed in a thread of its own
#: woke at once, and cost a thread per neighbour)
TICK_S = 0.1


class FeedLoop:
    """The feeds of one merge, read in turn in the calling thread (:meth:`run`)."""

    def __init__(
        self,
        feeds: Sequence[Feed],
        *,
        tick_s: float = TICK_S,
        ready: Callable[[Feed], bool] = lambda feed: True,
    ) -> None:
        if not feeds:
            raise ValueError("a feed loop needs a feed")
        merger = feeds[0].merger
        if any(f.merger is not merger for f in feeds):
            raise ValueError("a feed loop's feeds write to one merge")
        self.feeds = list(feeds)
        self.merger = merger
        self.tick_s = tick_s
        #: whether a feed is read now (its neighbour's link is up)
        self.ready = ready
        #: turns of the loop, and those that wrote a batch
        self.turns = 0
        self.writes = 0

    @property
    def name(self) -> str:
        return f"pull-loop-{self.merger.query}"

    def run(self, stop: threading.Event) -> None:
        """Read every feed in turn until ``stop`` (or the merge stops); each feed's
        failure is its own (closed, backed off, retried from what the merge committed)."""
        due = [0.0] * len(self.feeds)
        ended = [False] * len(self.feeds)
        try:
            while not stop.is_set() and not self.merger.stopping.is_set():
                self.turns += 1
                turns: list[tuple[int, Turn, Waiting | None]] = []
                now = time.monotonic()
                for i, feed in enumerate(self.feeds):
                    if ended[i] or due[i] > now:
                        continue
                    if not self.ready(feed):  # its link is down: looked at again in a tick
                        feed.idle = False  # not caught up with what it cannot read
                        due[i] = now + self.tick_s
                        continue
                    try:
                        turn = feed.read_round(0.0)
                        if turn is None:  # nothing assigned, or parked
                            feed.after_turn()
                            feed.ok()
                            due[i] = now + feed.pace(self.tick_s)
                            continue
                    except Exception as exc:
                        self._failed(i, exc, due, ended)
                        continue
                    waiting = self.merger.enqueue(turn.rows) if turn.rows else None
                    turns.append((i, turn, waiting))
                if any(w is not None for _, _, w in turns):
                    self.writes += 1
                for i, turn, waiting in turns:
                    feed = self.feeds[i]
                    try:
                        try:
                            plan = self.merger.written(waiting) if waiting is not None else None
                        except BaseException:
                            turn.release()
                            raise
                        read = feed.finish_round(turn, plan)
                        feed.after_turn()
                    except Exception as exc:
                        self._failed(i, exc, due, ended)
                        continue
                    if read or feed.at_end():
                        # a turn that read nothing says nothing of the feed's health
                        # before its reader has fetched (its poll does not wait): a
                        # failing feed must not look healed by it, every other turn
                        feed.ok()
                    due[i] = now if read else now + feed.pace(self.tick_s)
                live = [d for d, e in zip(due, ended, strict=True) if not e]
                if not live:
                    break
                wait = min(live) - time.monotonic()
                if wait > 0:
                    stop.wait(min(wait, self.tick_s))
        finally:
            for feed in self.feeds:
                feed.close()

    def _failed(self, i: int, exc: Exception, due: list[float], ended: list[bool]) -> None:
        wait = self.feeds[i].fail(exc)
        if wait is None:
            ended[i] = True
            self.feeds[i].close()
        else:
            due[i] = time.monotonic() + wait
