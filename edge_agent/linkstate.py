"""The uplink's own bookkeeping in the log: today's spend per link class (so a restart
does not reset the satellite budget) and the last known state of each gateway (for
``shorelink-edge status``).

:class:`Links` (``EdgeLog.links``) works on the log's connection, behind the log's lock
and in its transactions; a read-only log (``status``) reads through it too."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

__all__ = ["LinkState", "Links"]


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


class Links:
    def __init__(
        self,
        conn: sqlite3.Connection,
        lock: threading.Lock,
        txn: Callable[[], AbstractContextManager[sqlite3.Connection]],
    ) -> None:
        self._conn = conn
        self._lock = lock
        self._txn = txn

    # -- per link class: the day's spend ---------------------------------------------------
    def spend(self, link: str, day: str) -> int:
        """Request body bytes sent over link class ``link`` on UTC ``day`` (YYYY-MM-DD)."""
        with self._lock:
            return _read_spend(self._conn, link, day)

    def add_spend(self, link: str, day: str, nbytes: int) -> int:
        """Persist ``nbytes`` more spent on ``day``; forget days older than a week;
        return the day's total."""
        with self._txn() as conn:
            conn.execute(
                "INSERT INTO link_budget (link, day, bytes) VALUES (?, ?, ?)"
                " ON CONFLICT (link, day) DO UPDATE SET bytes = bytes + excluded.bytes",
                [link, day, nbytes],
            )
            conn.execute(
                "DELETE FROM link_budget WHERE link = ? AND day < date(?, '-7 days')", [link, day]
            )
            return _read_spend(conn, link, day)

    # -- per gateway: up or down, last success, last error ----------------------------------
    def write_state(self, s: LinkState) -> None:
        with self._txn() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO link_state (site, link, url, up, last_success_ms,"
                " last_error, last_error_ms, updated_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
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

    def states(self) -> list[LinkState]:
        """Every gateway's state as last written (for ``status``)."""
        with self._lock:
            try:
                rows = self._conn.execute(
                    "SELECT site, link, url, up, last_success_ms, last_error, last_error_ms,"
                    " updated_ms FROM link_state ORDER BY site, link"
                ).fetchall()
            except sqlite3.OperationalError:  # a read-only log not migrated yet
                return []
        return [
            LinkState(site, link, url or "", bool(up), ok_ms, err or "", err_ms, upd or 0)
            for site, link, url, up, ok_ms, err, err_ms, upd in rows
        ]


def _read_spend(conn: sqlite3.Connection, link: str, day: str) -> int:
    try:
        row = conn.execute(
            "SELECT bytes FROM link_budget WHERE link = ? AND day = ?", [link, day]
        ).fetchone()
    except sqlite3.OperationalError:  # a read-only log not migrated yet: nothing spent
        return 0
    return int(row[0]) if row else 0
