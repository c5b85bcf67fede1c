"""Where a stream's seqs come from, and why a log never hands one out twice.

A seq is minted here (:meth:`StreamState.mint`): each stream's counter ``next_seq`` gives
the next record one past the last, in commit order, and is saved in the same transaction
as the record it numbered, so a committed record's seq is never handed out again by this
log. Only a renumbering (below) moves the counter otherwise.

A log that starts again (re-flashed empty, restored
from a backup, or short of its tail after a power cut with ``synchronous = normal``)
would otherwise assign seqs that the shore already holds with other records, and a site
would take the new records for old ones: never stored, then deleted by retention.

Two facts per stream, in the log's ``meta`` table, in the same transactions as the rest:
- ``sent_upto``: the highest seq this log ever put on a link (raised before a batch
  goes out). A site that holds a seq above it holds records of another log of this
  ship: the numbering diverged. No other case makes a site hold such a seq, so the rule
  has no false alarm, and it holds for every site, not just the first one asked.
- ``renumber_from``: the log's next seq when it was opened, kept until a batch at or
  past it goes out. Records below it were in the log before it last started, so they
  are the same records, under the same seqs, that this log (or the log it was restored
  from) had: they keep their seqs. Records from it on were assigned since, and may
  collide.

On a divergence (:func:`plan_renumber`), the records from ``max(sent_upto + 1,
renumber_from)`` on are moved past the site's last seq, in one transaction, keeping their
order and gaplessness; new records are assigned after them. Nothing the shore holds is
overwritten (no seq it holds is sent again with other bytes) and every new record reaches
the shore under a seq no site holds. What stays out of reach: a site that holds even more
of the old numbering than the one that triggered the move, if the ship delivered moved
records elsewhere first (docs/edge-agent.md, "A log that starts again").
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass

from shorelink.ranges import RangeSet

__all__ = [
    "Renumbering",
    "StreamState",
    "mark_open",
    "note_sent",
    "plan_renumber",
    "renumber",
    "sent_upto",
]

_SENT = "sent_upto:"
_FROM = "renumber_from:"


@dataclass
class StreamState:
    """A stream's row in the log's ``streams`` table: its seq counter (``next_seq``, the
    seq the next record gets) and the counts the disk budget keeps
    (edge_agent/retention.py): records and bytes in the log, records dropped undelivered,
    retired once delivered, rejected."""

    next_seq: int = 1
    count: int = 0
    bytes: int = 0
    dropped: int = 0
    retired: int = 0
    rejected: int = 0

    def mint(self) -> int:
        """The next record's seq: one past the last (gapless, in commit order)."""
        seq = self.next_seq
        self.next_seq += 1
        return seq


@dataclass(frozen=True)
class Renumbering:
    """Move the records of a stream from ``first`` on by ``delta`` seqs."""

    first: int
    delta: int


def mark_open(conn: sqlite3.Connection, next_seqs: Iterable[tuple[str, int]]) -> None:
    """At open: remember each stream's next seq, unless an earlier open's is still kept
    (that one covers more)."""
    conn.executemany(
        "INSERT OR IGNORE INTO meta (key, value) VALUES (?, ?)",
        [(_FROM + stream, str(n)) for stream, n in next_seqs],
    )


def _get(conn: sqlite3.Connection, key: str) -> int | None:
    row = conn.execute("SELECT value FROM meta WHERE key = ?", [key]).fetchone()
    return int(row[0]) if row else None


def sent_upto(conn: sqlite3.Connection, stream: str) -> int:
    return _get(conn, _SENT + stream) or 0


def note_sent(conn: sqlite3.Connection, stream: str, last: int) -> bool:
    """``last`` is about to go out: raise ``sent_upto``; False if it was there already."""
    if last <= sent_upto(conn, stream):
        return False
    conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", [_SENT + stream, last])
    start = _get(conn, _FROM + stream)
    if start is not None and start <= last:
        conn.execute("DELETE FROM meta WHERE key = ?", [_FROM + stream])
    return True


def plan_renumber(
    site_last: int, sent: int, renumber_from: int | None, next_seq: int
) -> Renumbering | None:
    """Pure: None while the site holds nothing above what this log sent; otherwise what
    to move (``delta`` 0: nothing to move, but seqs from ``site_last + 1`` on only)."""
    if site_last <= sent:
        return None
    first = max(sent + 1, renumber_from or 0)
    if first >= next_seq:  # nothing assigned there yet: allocation just starts past the site
        first = next_seq
    return Renumbering(first, max(0, site_last + 1 - first))


def renumber(
    conn: sqlite3.Connection, stream: str, st: StreamState, r: Renumbering, site_last: int
) -> int:
    """Apply ``r`` inside the caller's transaction; return the records moved. Sealed
    segments from ``r.first`` on go (they hold the old seqs); every site's holdings are
    cut below ``r.first`` (what they said of those seqs was of the other numbering);
    ``sent_upto`` becomes ``site_last`` (the seqs up to it are the shore's); the counter
    ``st.next_seq`` moves by ``r.delta`` (the caller saves ``st``)."""
    st.next_seq += r.delta
    moved = 0
    if r.delta:
        moved = conn.execute(
            "SELECT count(*) FROM records WHERE stream = ? AND seq >= ?", [stream, r.first]
        ).fetchone()[0]
        # two steps: a shift in place would collide with the primary key on the way
        conn.execute(
            "UPDATE records SET seq = -(seq + ?) WHERE stream = ? AND seq >= ?",
            [r.delta, stream, r.first],
        )
        conn.execute("UPDATE records SET seq = -seq WHERE stream = ? AND seq < 0", [stream])
    conn.execute("DELETE FROM segments WHERE stream = ? AND last_seq >= ?", [stream, r.first])
    for site, text in conn.execute(
        "SELECT site, ranges FROM holdings WHERE stream = ?", [stream]
    ).fetchall():
        kept = RangeSet(
            (lo, min(hi, r.first - 1)) for lo, hi in RangeSet.parse(text) if lo < r.first
        )
        conn.execute(
            "UPDATE holdings SET ranges = ? WHERE site = ? AND stream = ?",
            [str(kept), site, stream],
        )
    conn.execute(
        "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", [_SENT + stream, site_last]
    )
    conn.execute("DELETE FROM meta WHERE key = ?", [_FROM + stream])
    return int(moved)


def renumber_from(conn: sqlite3.Connection, stream: str) -> int | None:
    return _get(conn, _FROM + stream)
