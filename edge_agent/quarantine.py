"""Quarantine: messages the agent could not map or parse, kept for a person to look at.

A message that no rule maps, or whose payload a rule cannot read, is acknowledged to the
broker like any other (refusing it would only bring it back, forever) and kept here,
counted, with its reason, in the same transaction as the batch it arrived in. Only the
newest ``quarantine_max`` are kept, each payload cut to :data:`QUARANTINE_PAYLOAD_MAX`
bytes (its whole length is kept).

The table lives in the log's SQLite file: :class:`Quarantine` works on the log's
connection and lock (``EdgeLog.quarantine``); :meth:`EdgeLog.commit` adds to it.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["QUARANTINE_PAYLOAD_MAX", "Quarantine", "Quarantined"]

#: bytes of a quarantined payload kept (the rest is only counted)
QUARANTINE_PAYLOAD_MAX = 1024
#: characters of the reason's detail kept
DETAIL_MAX = 500


@dataclass(frozen=True, slots=True)
class Quarantined:
    recv_ms: int
    topic: bytes
    reason: str
    detail: str
    payload: bytes


class Quarantine:
    def __init__(self, conn: sqlite3.Connection, lock: threading.Lock, keep: int) -> None:
        self._conn = conn
        self._lock = lock
        self._keep = keep

    def add(self, conn: sqlite3.Connection, items: Sequence[Quarantined]) -> None:
        """Keep ``items`` (inside the caller's transaction on ``conn``), then drop the
        oldest beyond ``quarantine_max``."""
        conn.executemany(
            "INSERT INTO quarantine (recv_ms, topic, reason, detail, payload, payload_len)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            [
                (
                    q.recv_ms,
                    q.topic,
                    q.reason,
                    q.detail[:DETAIL_MAX],
                    q.payload[:QUARANTINE_PAYLOAD_MAX],
                    len(q.payload),
                )
                for q in items
            ],
        )
        conn.execute(
            "DELETE FROM quarantine WHERE id <= (SELECT max(id) FROM quarantine) - ?",
            [self._keep],
        )

    def count(self) -> int:
        with self._lock:
            return int(self._conn.execute("SELECT count(*) FROM quarantine").fetchone()[0])

    def newest(self, limit: int = 20) -> list[Quarantined]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT recv_ms, topic, reason, detail, payload FROM quarantine"
                " ORDER BY id DESC LIMIT ?",
                [limit],
            ).fetchall()
        return [Quarantined(*r) for r in rows]
