"""Sealed segments: runs of a stream's records kept already encoded as a batch body.

The sealer (edge_agent/sealing.py) writes them at sea; the batch builder
(edge_agent/batching.py) frames one with a fresh header when a link can take it whole.
A segment is a cache, never the truth: :meth:`Segments.add` stores one only if every
one of its records is still in the log and the seqs did not move since it was built
(the log's ``numbering_epoch``); retention and renumbering delete segments with their
records (edge_agent/retention.py, edge_agent/numbering.py).

A ship with a signing key (``uplink.signing_key_file``) seals signed segments: each
keeps its chunks' signatures, framed into the header when sent (``FLAG_SIGNED``), and
its *signer*, the public key they are by ("" for an unsigned segment). A segment is
only ever framed for the signer of now (:meth:`Segments.get`): one sealed unsigned, or
with another key, is skipped (its records are encoded and signed when sent) and
dropped when the sealer starts (:meth:`Segments.keep_only`), so the sealer seals those
records again.

The table lives in the log's SQLite file: :class:`Segments` works on the log's
connection, behind the log's lock and in its transactions (``EdgeLog.segments``).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

from shorelink.wire import Body

__all__ = ["Segments"]


class Segments:
    def __init__(
        self,
        conn: sqlite3.Connection,
        lock: threading.Lock,
        txn: Callable[[], AbstractContextManager[sqlite3.Connection]],
        epoch: Callable[[], int],
    ) -> None:
        self._conn = conn
        self._lock = lock
        self._txn = txn
        self._epoch = epoch

    def add(self, stream: str, body: Body, epoch: int | None = None, *, signer: str = "") -> bool:
        """Keep ``body`` (records ``body.first_seq`` on, already encoded; signed by
        ``signer``'s key, or unsigned with ``signer`` "") as a sealed segment of
        ``stream``; False (nothing stored) if one starts there already, if retention
        removed any of its records meanwhile, or if seqs moved since ``epoch`` (the
        log's ``numbering_epoch`` when the body was built)."""
        if bool(body.signatures) != bool(signer):
            has = "with" if body.signatures else "without"
            raise ValueError(f"a body {has} signatures, and signer {signer!r}")
        last = body.first_seq + body.count - 1
        with self._txn() as conn:
            if epoch is not None and epoch != self._epoch():
                return False  # built before seqs moved: its records are others now
            present = conn.execute(
                "SELECT count(*) FROM records WHERE stream = ? AND seq BETWEEN ? AND ?",
                [stream, body.first_seq, last],
            ).fetchone()[0]
            if present != body.count:
                return False
            cur = conn.execute(
                "INSERT OR IGNORE INTO segments (stream, first_seq, last_seq, flags, raw_len,"
                " decoded_len, body, sealed_ms, signatures, signer)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    stream, body.first_seq, last, body.flags, body.raw_len, body.decoded_len,
                    body.data, int(time.time() * 1000), body.signatures, signer,
                ],
            )  # fmt: skip
            return cur.rowcount == 1

    def get(self, stream: str, first_seq: int, *, signer: str = "") -> Body | None:
        """The sealed segment of ``stream`` that starts at ``first_seq``, if there is one
        signed by ``signer`` (a public key; "": unsigned). One sealed otherwise is not
        returned: framed, it would go unsigned, or signed by a key the sites do not hold
        for this ship."""
        with self._lock:
            row = self._conn.execute(
                "SELECT last_seq, flags, raw_len, decoded_len, body, signatures FROM segments"
                " WHERE stream = ? AND first_seq = ? AND signer = ?",
                [stream, first_seq, signer],
            ).fetchone()
        if row is None:
            return None
        last, flags, raw_len, decoded_len, data, sigs = row
        return Body(flags, first_seq, last - first_seq + 1, raw_len, data, decoded_len, sigs)

    def keep_only(self, signer: str) -> int:
        """Delete the segments not signed by ``signer`` ("": the signed ones); return
        how many. The records stay: the sealer seals them again (or they are encoded
        when sent)."""
        with self._txn() as conn:
            return conn.execute("DELETE FROM segments WHERE signer != ?", [signer]).rowcount

    def next(self, stream: str, after: int) -> int | None:
        """The first seq of the first sealed segment of ``stream`` starting after ``after``."""
        with self._lock:
            row = self._conn.execute(
                "SELECT min(first_seq) FROM segments WHERE stream = ? AND first_seq > ?",
                [stream, after],
            ).fetchone()
        return row[0]

    def sealed_upto(self, stream: str) -> int:
        """The last seq of ``stream``'s last sealed segment (0: none)."""
        with self._lock:
            row = self._conn.execute(
                "SELECT max(last_seq) FROM segments WHERE stream = ?", [stream]
            ).fetchone()
        return row[0] or 0

    def totals(self) -> dict[str, tuple[int, int, int]]:
        """stream -> (segments, records, bytes) sealed and still on board (nothing for a
        log an older agent wrote and the new one has not opened yet: ``status``)."""
        with self._lock:
            if not self._conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'segments'"
            ).fetchone():
                return {}
            rows = self._conn.execute(
                "SELECT stream, count(*), sum(last_seq - first_seq + 1), sum(length(body))"
                " FROM segments GROUP BY stream"
            ).fetchall()
        return {stream: (n, recs, nbytes) for stream, n, recs, nbytes in rows}
