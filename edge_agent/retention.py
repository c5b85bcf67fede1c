"""Keeping the on-ship log inside its disk budget and retention, per stream policy.

Order of sacrifice when space is needed:
1. records a shore site already holds (delivered), lowest-priority stream first;
2. undelivered records of ``drop_oldest`` streams, lowest-priority stream first,
   counted as dropped and logged;
3. then a ``reject`` stream's new record is refused (counted), except ``alerts``:
   alerts are never dropped and never refused; they have ``alerts_reserve_bytes`` of the
   budget to themselves and, past even that, are accepted over budget with an error log.

Age (``max_age``) removes delivered records of every stream, and undelivered records of
``drop_oldest`` streams only.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from edge_agent.config import NEVER_DROPPED, LogConfig, StreamConfig
from edge_agent.numbering import StreamState
from shorelink.logs import RateLimitedLog, get_logger
from shorelink.ranges import RangeSet

__all__ = ["Retention"]

log = get_logger(__name__)
_limited = RateLimitedLog(log)

SCAN_CHUNK = 2000


class Retention:
    """Works inside the log's write transaction (the caller holds it)."""

    def __init__(
        self, conn: sqlite3.Connection, streams: dict[str, StreamConfig], cfg: LogConfig
    ) -> None:
        self._conn = conn
        self._streams = streams
        self._cfg = cfg
        self.state: dict[str, StreamState] = {}
        self.delivered: dict[str, RangeSet] = {}
        self.begin()

    def total_bytes(self) -> int:
        return sum(s.bytes for s in self.state.values())

    # -- per transaction -----------------------------------------------------------------
    def begin(self, flush: Callable[[], None] | None = None) -> None:
        """Start a transaction's bookkeeping. ``flush`` writes the rows the caller has
        assigned but not inserted yet: called before anything is deleted to make room,
        so a large group can make room by dropping its own oldest records too."""
        self._flush = flush or (lambda: None)
        self.dropped_now: dict[str, int] = {}
        self.retired_now: dict[str, int] = {}
        self.over_budget_now = 0
        self._touched: set[str] = set()

    def save(self) -> None:
        self._conn.executemany(
            "INSERT OR REPLACE INTO streams (name, next_seq, count, bytes, dropped, retired, rejected)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            [
                (n, s.next_seq, s.count, s.bytes, s.dropped, s.retired, s.rejected)
                for n in self._touched
                for s in [self.state[n]]
            ],
        )

    def _st(self, stream: str) -> StreamState:
        self._touched.add(stream)
        return self.state.setdefault(stream, StreamState())

    def touch(self, stream: str) -> StreamState:
        """``stream``'s state, saved with this transaction (:meth:`save`)."""
        return self._st(stream)

    def admit(self, stream: str, size: int) -> StreamState:
        """Count a record of ``size`` bytes into ``stream`` (room made already: see
        :meth:`make_room`); returns the stream's state, whose counter numbers it
        (edge_agent/numbering.py)."""
        st = self._st(stream)
        st.count += 1
        st.bytes += size
        return st

    # -- budget --------------------------------------------------------------------------
    def make_room(self, stream: str, size: int, now_ms: int) -> bool:
        """Free space for a record of ``size`` bytes of ``stream``; False if it must be
        rejected by policy."""
        sc = self._streams.get(stream)
        st = self._st(stream)
        reserve = 0 if stream == NEVER_DROPPED else self._cfg.alerts_reserve_bytes
        limit_total = self._cfg.max_bytes - reserve
        need_total = self.total_bytes() + size - limit_total
        need_stream = st.bytes + size - sc.max_bytes if sc and sc.max_bytes else 0
        if need_total <= 0 and need_stream <= 0:
            return True
        slack = max(size, limit_total // 50)  # free a little extra: not a delete per message
        self._flush()
        if need_stream > 0:
            freed = self._free([stream], need_stream + slack, delivered_only=True)
            if freed < need_stream and sc is not None and sc.on_full == "drop_oldest":
                freed += self._free([stream], need_stream + slack - freed, delivered_only=False)
            need_total -= freed
            if freed < need_stream:
                return self._full(stream, st, "stream budget")
        if need_total > 0:
            by_low_priority = sorted(self.state, key=lambda n: -self._priority(n))
            freed = self._free(by_low_priority, need_total + slack, delivered_only=True)
            if freed < need_total:
                droppable = [
                    n
                    for n in by_low_priority
                    if (c := self._streams.get(n)) is not None and c.on_full == "drop_oldest"
                ]
                freed += self._free(droppable, need_total + slack - freed, delivered_only=False)
            if freed < need_total:
                return self._full(stream, st, "log budget")
        return True

    def _full(self, stream: str, st: StreamState, what: str) -> bool:
        if stream == NEVER_DROPPED:
            self.over_budget_now += 1
            _limited.warning("alerts_over_budget", "alerts_over_budget", stream=stream, budget=what)
            return True
        st.rejected += 1
        _limited.warning(
            f"rejected:{stream}",
            "record_rejected",
            stream=stream,
            reason=f"{what.replace(' ', '_')}_full",
        )
        return False

    def _priority(self, stream: str) -> int:
        sc = self._streams.get(stream)
        return sc.priority if sc else 10_000  # streams no longer configured go first

    def _free(self, streams: list[str], want: int, *, delivered_only: bool) -> int:
        freed = 0
        for stream in streams:
            if freed >= want:
                break
            if delivered_only:
                ranges = list(self.delivered.get(stream, RangeSet()))
            else:
                ranges = (
                    [(1, self.state[stream].next_seq - 1)]
                    if self.state[stream].next_seq > 1
                    else []
                )
            for lo, hi in ranges:
                while freed < want and lo <= hi:
                    rows = self._conn.execute(
                        "SELECT seq, size FROM records WHERE stream = ? AND seq BETWEEN ? AND ?"
                        " ORDER BY seq LIMIT ?",
                        [stream, lo, hi, SCAN_CHUNK],
                    ).fetchall()
                    if not rows:
                        break
                    cut = rows[-1][0]
                    acc = 0
                    for seq, sz in rows:
                        acc += sz
                        if freed + acc >= want:
                            cut = seq
                            break
                    freed += self._delete(stream, lo, cut)
                    lo = cut + 1
                if freed >= want:
                    break
        return freed

    def _delete(self, stream: str, lo: int, hi: int) -> int:
        """Delete records ``lo..hi`` of ``stream``; update counters; return bytes freed."""
        conn = self._conn
        count, nbytes = conn.execute(
            "SELECT count(*), coalesce(sum(size), 0) FROM records WHERE stream = ? AND seq BETWEEN ? AND ?",
            [stream, lo, hi],
        ).fetchone()
        if not count:
            return 0
        held = 0
        for a, b in self.delivered.get(stream, RangeSet()):
            if b < lo or a > hi:
                continue
            held += conn.execute(
                "SELECT count(*) FROM records WHERE stream = ? AND seq BETWEEN ? AND ?",
                [stream, max(a, lo), min(b, hi)],
            ).fetchone()[0]
        conn.execute(
            "DELETE FROM records WHERE stream = ? AND seq BETWEEN ? AND ?", [stream, lo, hi]
        )
        # a sealed segment is only ever sent whole: it goes with any of its records
        conn.execute(
            "DELETE FROM segments WHERE stream = ? AND first_seq <= ? AND last_seq >= ?",
            [stream, hi, lo],
        )
        st = self._st(stream)
        st.count -= count
        st.bytes -= nbytes
        st.retired += held
        st.dropped += count - held
        self.retired_now[stream] = self.retired_now.get(stream, 0) + held
        if count - held:
            self.dropped_now[stream] = self.dropped_now.get(stream, 0) + count - held
            _limited.warning(
                f"dropped:{stream}",
                "records_dropped",
                stream=stream,
                seqs=f"{lo}-{hi}",
                undelivered=count - held,
            )
        return int(nbytes)

    # -- age -----------------------------------------------------------------------------
    def expire(self, now_ms: int) -> dict[str, int]:
        removed: dict[str, int] = {}
        for stream, st in list(self.state.items()):
            sc = self._streams.get(stream)
            if sc is None or st.count == 0:
                continue
            cutoff = now_ms - int(sc.max_age_s * 1000)
            cut = self._last_seq_before(stream, cutoff)
            if cut is None:
                continue
            before = st.count
            if sc.on_full == "drop_oldest" and stream != NEVER_DROPPED:
                self._delete(stream, 1, cut)
            else:
                for a, b in list(self.delivered.get(stream, RangeSet())):
                    if a <= cut:
                        self._delete(stream, a, min(b, cut))
            if before != st.count:
                removed[stream] = before - st.count
        return removed

    def _last_seq_before(self, stream: str, cutoff_ms: int) -> int | None:
        last = None
        lo = 1
        while True:
            rows = self._conn.execute(
                "SELECT seq, recv_ms FROM records WHERE stream = ? AND seq >= ? ORDER BY seq LIMIT ?",
                [stream, lo, SCAN_CHUNK],
            ).fetchall()
            for seq, recv_ms in rows:
                if recv_ms >= cutoff_ms:
                    return last
                last = seq
            if len(rows) < SCAN_CHUNK:
                return last
            lo = rows[-1][0] + 1
