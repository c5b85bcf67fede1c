"""The on-ship log's schema, as numbered migrations applied once each (sqlite-utils).

Add a migration at the end; never edit one that has shipped: ships upgrade in place.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import sqlite_utils

__all__ = ["MIGRATIONS", "migrate"]


def _m001_initial(db: sqlite_utils.Database) -> None:
    # One row per record; (stream, seq) is the identity within this ship's log (origin is
    # the ship, in meta). WITHOUT ROWID keeps rows in seq order: range reads are scans.
    db.execute(
        """CREATE TABLE records (
            stream TEXT NOT NULL,
            seq INTEGER NOT NULL,
            key TEXT NOT NULL,
            ts_ms INTEGER NOT NULL,
            recv_ms INTEGER NOT NULL,
            topic TEXT NOT NULL,
            payload BLOB NOT NULL,
            size INTEGER NOT NULL,
            PRIMARY KEY (stream, seq)
        ) WITHOUT ROWID"""
    )
    # Per stream counters, kept in the same transaction as the records, so start-up
    # never scans the records table.
    db.create_table(
        "streams",
        {
            "name": str,
            "next_seq": int,
            "count": int,
            "bytes": int,
            "dropped": int,
            "retired": int,
            "rejected": int,
        },
        pk="name",
        not_null={"next_seq", "count", "bytes", "dropped", "retired", "rejected"},
    )
    # What each shore site has confirmed it holds, per stream (RangeSet text form).
    db.create_table(
        "holdings",
        {"site": str, "stream": str, "ranges": str, "updated_ms": int},
        pk=("site", "stream"),
    )
    # Packet id -> digest of the last message committed under it: a message redelivered
    # with DUP after a crash between commit and PUBACK is recognised, not stored twice.
    db.create_table("inflight", {"mid": int, "digest": bytes}, pk="mid")
    db.create_table(
        "quarantine",
        {
            "id": int,
            "recv_ms": int,
            "topic": bytes,
            "reason": str,
            "detail": str,
            "payload": bytes,
            "payload_len": int,
        },
        pk="id",
    )
    db.create_table("meta", {"key": str, "value": str}, pk="key")


def _m002_uplink(db: sqlite_utils.Database) -> None:
    # Bytes of request bodies sent per link class per UTC day (YYYY-MM-DD): the daily
    # budget survives restarts.
    db.create_table(
        "link_budget",
        {"link": str, "day": str, "bytes": int},
        pk=("link", "day"),
        not_null={"bytes"},
    )
    # Last known state of each gateway, for `shorelink-edge status`.
    db.create_table(
        "link_state",
        {
            "site": str,
            "link": str,
            "url": str,
            "up": int,
            "last_success_ms": int,
            "last_error": str,
            "last_error_ms": int,
            "updated_ms": int,
        },
        pk=("site", "link"),
    )


def _m003_segments(db: sqlite_utils.Database) -> None:
    # Sealed segments: runs of a stream's records already encoded as a batch body (zstd
    # frame; the header is added when sent). Removed together with any of their records.
    db.execute(
        """CREATE TABLE segments (
            stream TEXT NOT NULL,
            first_seq INTEGER NOT NULL,
            last_seq INTEGER NOT NULL,
            flags INTEGER NOT NULL,
            raw_len INTEGER NOT NULL,
            decoded_len INTEGER NOT NULL,
            body BLOB NOT NULL,
            sealed_ms INTEGER NOT NULL
        )"""
    )
    db.execute("CREATE UNIQUE INDEX segments_by_seq ON segments (stream, first_seq)")


def _m004_redelivery(db: sqlite_utils.Database) -> None:
    # Per packet id also the MQTT connection the message came on and its place in commit
    # order: a broker restored from an older persistence file redelivers without DUP,
    # and packet ids wrap (edge_agent/redelivery.py).
    db.execute("ALTER TABLE inflight ADD COLUMN conn INTEGER NOT NULL DEFAULT 0")
    db.execute("ALTER TABLE inflight ADD COLUMN n INTEGER NOT NULL DEFAULT 0")


def _m005_alarm_state(db: sqlite_utils.Database) -> None:
    # Per alarm and key the reading that disarmed a threshold alarm or the shock a
    # silence alarm waits on (edge_agent/alarms.py); written in the transaction that
    # commits the readings and the alerts they raise.
    db.execute(
        """CREATE TABLE alarm_state (
            alarm TEXT NOT NULL,
            key TEXT NOT NULL,
            ts_ms INTEGER NOT NULL,
            value REAL NOT NULL,
            topic TEXT NOT NULL,
            PRIMARY KEY (alarm, key)
        ) WITHOUT ROWID"""
    )


def _m006_segment_signatures(db: sqlite_utils.Database) -> None:
    # A segment sealed by a ship with a signing key keeps its chunks' signatures (framed
    # into the header when sent: FLAG_SIGNED) and the public key they are by, so that a
    # segment sealed without the key now configured is never sent. Segments sealed
    # before this migration are unsigned (empty signatures, no signer).
    db.execute("ALTER TABLE segments ADD COLUMN signatures BLOB NOT NULL DEFAULT x''")
    db.execute("ALTER TABLE segments ADD COLUMN signer TEXT NOT NULL DEFAULT ''")


MIGRATIONS: list[Callable[[sqlite_utils.Database], None]] = [
    _m001_initial,
    _m002_uplink,
    _m003_segments,
    _m004_redelivery,
    _m005_alarm_state,
    _m006_segment_signatures,
]


def migrate(db: sqlite_utils.Database) -> list[int]:
    """Apply the migrations not applied yet, each in its own transaction (schema and
    bookkeeping together: a crash mid-migration leaves the old schema); return them.
    ``db.conn`` must be in autocommit mode (``isolation_level=None``)."""
    db.create_table(
        "_migrations", {"id": int, "name": str, "applied_ms": int}, pk="id", if_not_exists=True
    )
    done = {row["id"] for row in db.query("SELECT id FROM _migrations")}
    applied = []
    for number, fn in enumerate(MIGRATIONS, 1):
        if number in done:
            continue
        db.execute("BEGIN IMMEDIATE")
        try:
            fn(db)
            db.execute(
                "INSERT INTO _migrations (id, name, applied_ms) VALUES (?, ?, ?)",
                [number, fn.__name__, int(time.time() * 1000)],
            )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        applied.append(number)
    return applied
