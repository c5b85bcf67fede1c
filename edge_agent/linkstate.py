"""The uplink's own bookkeeping in the log: today's spend per link class (so a restart
does not reset the satellite budget) and the last known state of each gateway (for
``shorelink-edge status``). Plain SQL on the log's connection; :class:`EdgeLog` wraps
these in its lock and transactions."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

__all__ = ["LinkState", "add_spend", "read_link_states", "read_spend", "write_link_state"]


@dataclass(frozen=True, slots=True)
class LinkState:
    site: str
    link: str
    url: str
    up: bool
    last_success_ms: int | None
    last_error: str
    last_error_ms: int | None
    updated_ms: int


def read_spend(conn: sqlite3.Connection, link: str, day: str) -> int:
    try:
        row = conn.execute(
            "SELECT bytes FROM link_budget WHERE link = ? AND day = ?", [link, day]
        ).fetchone()
    except sqlite3.OperationalError:  # a read-only log not migrated yet: nothing spent
        return 0
    return int(row[0]) if row else 0


def add_spend(conn: sqlite3.Connection, link: str, day: str, nbytes: int) -> int:
    """Add ``nbytes`` to ``link``'s spend on ``day`` (inside the caller's transaction);
    forget days older than a week; return the new total."""
    conn.execute(
        "INSERT INTO link_budget (link, day, bytes) VALUES (?, ?, ?)"
        " ON CONFLICT (link, day) DO UPDATE SET bytes = bytes + excluded.bytes",
        [link, day, nbytes],
    )
    conn.execute("DELETE FROM link_budget WHERE link = ? AND day < date(?, '-7 days')", [link, day])
    return read_spend(conn, link, day)


def write_link_state(conn: sqlite3.Connection, s: LinkState) -> None:
    conn.execute(
        "INSERT OR REPLACE INTO link_state (site, link, url, up, last_success_ms, last_error,"
        " last_error_ms, updated_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [
            s.site,
            s.link,
            s.url,
            int(s.up),
            s.last_success_ms,
            s.last_error,
            s.last_error_ms,
            s.updated_ms,
        ],
    )


def read_link_states(conn: sqlite3.Connection) -> list[LinkState]:
    try:
        rows = conn.execute(
            "SELECT site, link, url, up, last_success_ms, last_error, last_error_ms, updated_ms"
            " FROM link_state ORDER BY site, link"
        ).fetchall()
    except sqlite3.OperationalError:
        return []
    return [
        LinkState(site, link, url or "", bool(up), ok_ms, err or "", err_ms, upd or 0)
        for site, link, url, up, ok_ms, err, err_ms, upd in rows
    ]
