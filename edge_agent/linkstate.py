"""The uplink's own bookkeeping in the log: today's spend per link class (so a restart
does not reset the satellite budget) and the state of each gateway (up or down, last
success, last error), kept as the uplink sees it and written for ``shorelink-edge
status``, at most every :data:`STATE_FLUSH_S` while nothing changes but the time of the
last success.

:class:`Links` (``EdgeLog.links``) works on the log's connection, behind the log's lock
and in its transactions; a read-only log (``status``) reads through it too."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import Protocol

__all__ = ["STATE_FLUSH_S", "Endpoint", "LinkState", "Links"]

#: persist a link's last success at most this often while it stays up
STATE_FLUSH_S = 5.0


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


class Endpoint(Protocol):
    """A gateway as its state knows it (:class:`~edge_agent.gateway.Gateway` is one)."""

    @property
    def site(self) -> str: ...

    @property
    def link(self) -> str: ...

    @property
    def url(self) -> str: ...


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
        #: per gateway (site, link, url): its state now, and when and as what it was
        #: last written
        self._now: dict[tuple[str, str, str], LinkState] = {}
        self._written: dict[tuple[str, str, str], tuple[float, LinkState]] = {}
        self._flushing = threading.Lock()  # flush runs in worker threads

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
    def state(self, g: Endpoint) -> LinkState:
        """``g``'s state as the uplink saw it last (never tried: down, no success)."""
        st = self._now.get((g.site, g.link, g.url))
        if st is None:
            st = LinkState(g.site, g.link, g.url, False, None, "", None, 0)
        return st

    def succeeded(self, g: Endpoint) -> None:
        """A batch got through ``g`` (written at the next :meth:`flush`)."""
        st = self.state(g)
        self._now[(g.site, g.link, g.url)] = replace(st, up=True, last_success_ms=_now_ms())

    def mark(self, g: Endpoint, *, up: bool, error: str = "") -> bool:
        """``g`` answered (``up``) or failed with ``error``; returns whether it was up
        before (then :meth:`flush` it)."""
        st = self.state(g)
        was_up = st.up
        now = _now_ms()
        if up:
            st = replace(st, up=True, last_success_ms=now)
        else:
            st = replace(st, up=False, last_error=error[:500], last_error_ms=now)
        self._now[(g.site, g.link, g.url)] = st
        return was_up

    def flush(self, *, force: bool = False) -> None:
        """Persist changed gateway states (for ``status``), at most every
        :data:`STATE_FLUSH_S` unless ``force``."""
        with self._flushing:
            now = time.monotonic()
            for key, st in list(self._now.items()):
                at, written = self._written.get(key, (0.0, None))
                if st == written or not (force or now - at >= STATE_FLUSH_S):
                    continue
                self._write_state(replace(st, updated_ms=_now_ms()))
                self._written[key] = (now, st)

    def _write_state(self, s: LinkState) -> None:
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


def _now_ms() -> int:
    return int(time.time() * 1000)


def _read_spend(conn: sqlite3.Connection, link: str, day: str) -> int:
    try:
        row = conn.execute(
            "SELECT bytes FROM link_budget WHERE link = ? AND day = ?", [link, day]
        ).fetchone()
    except sqlite3.OperationalError:  # a read-only log not migrated yet: nothing spent
        return 0
    return int(row[0]) if row else 0
