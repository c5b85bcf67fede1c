"""The on-ship log's schema, as numbered migrations applied once each (sqlite-utils).

Add a migration at the end; never edit one that has shipped: ships upgrade in place.

An upgrade can be rolled back (docs/edge-agent.md, "Upgrades and rollbacks"): before the
first migration a log has not had, :func:`migrate` takes a consistent copy of it beside
it (``VACUUM INTO`` a temporary name, fsynced, renamed: ``<log>.schema-<N>.bak``, N the
schema it had), keeping only the newest ``KEEP_COPIES`` such copies; a log that is
already current, or new, is never copied. An agent that meets a log a newer agent
migrated (a migration it does not know) refuses it (:class:`LogFromNewerAgent`) before
writing anything, naming that copy: the older agent's way back.
"""

from __future__ import annotations

import glob
import os
import re
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import sqlite_utils

from edge_agent import systemd
from edge_agent.errors import LogError, LogFromNewerAgent
from shorelink.logs import get_logger

__all__ = ["KEEP_COPIES", "MIGRATIONS", "copies_of", "copy_path", "migrate", "schema_of"]

log = get_logger(__name__)

#: copies of the log taken before a migration kept beside it (the newest ones): one is
#: the way back of the last upgrade; each is as large as the log, on a ship's small disk
KEEP_COPIES = 1


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


def copy_path(log_path: Path, schema: int) -> Path:
    """Where the copy of the log at ``log_path`` taken before it left ``schema`` is."""
    return log_path.with_name(f"{log_path.name}.schema-{schema}.bak")


def schema_of(db: sqlite_utils.Database) -> dict[int, str]:
    """The migrations applied to the log: number -> name (empty: a new log)."""
    if not db["_migrations"].exists():
        return {}
    return {row["id"]: row["name"] for row in db.query("SELECT id, name FROM _migrations")}


def migrate(db: sqlite_utils.Database, *, keep_copies: int = KEEP_COPIES) -> list[int]:
    """Apply the migrations not applied yet, each in its own transaction (schema and
    bookkeeping together: a crash mid-migration leaves the old schema); return them.
    Before the first, a log that has a schema already is copied (:func:`copy_path`);
    a log with a migration this agent does not know is refused
    (:class:`LogFromNewerAgent`), untouched. ``db.conn`` must be in autocommit mode
    (``isolation_level=None``)."""
    done = schema_of(db)
    known = len(MIGRATIONS)
    path = _main_file(db.conn)
    newer = sorted(n for n in done if n > known)
    if newer:
        copies = copies_of(path)
        back = copies.get(max((n for n in copies if n <= known), default=-1))
        raise LogFromNewerAgent(
            str(path),
            max(newer),
            known,
            [f"{n} {done[n]}" for n in newer],
            None if back is None else str(back),
        )
    if done and path is not None and any(n not in done for n in range(1, known + 1)):
        _copy_before_migrating(db.conn, path, max(done), keep_copies)
    db.create_table(
        "_migrations", {"id": int, "name": str, "applied_ms": int}, pk="id", if_not_exists=True
    )
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


def _main_file(conn: sqlite3.Connection) -> Path | None:
    """The file of the connection's main database (None: in memory)."""
    for _seq, name, file in conn.execute("PRAGMA database_list"):
        if name == "main":
            return Path(file) if file else None
    return None


def _copy_before_migrating(conn: sqlite3.Connection, path: Path, schema: int, keep: int) -> Path:
    """A consistent copy of the log (one read transaction: ``VACUUM INTO``) at
    :func:`copy_path`, written to a temporary name, fsynced and renamed; then only the
    newest ``keep`` copies are left. Failing to take it stops the migration: an upgrade
    without its way back is not made."""
    dst = copy_path(path, schema)
    tmp = dst.with_name(dst.name + ".tmp")
    size = path.stat().st_size
    # a large log on a slow card takes minutes; systemd waits for READY=1 (Type=notify)
    systemd.notify(f"STATUS=copying the log before migrating it: {dst}")
    systemd.notify(f"EXTEND_TIMEOUT_USEC={int((60 + size / 5e6) * 1e6)}")
    t0 = time.monotonic()
    try:
        tmp.unlink(missing_ok=True)
        conn.execute("VACUUM INTO ?", [str(tmp)])
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, dst)
        dir_fd = os.open(dst.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except (sqlite3.Error, OSError) as exc:
        tmp.unlink(missing_ok=True)
        raise LogError(
            f"cannot copy the log {path} to {dst} before migrating it (nothing was migrated;"
            f" the copy is the way back to this schema): {exc}"
        ) from exc
    log.info(
        "log_copied_before_migration",
        copy=str(dst),
        schema=schema,
        bytes=dst.stat().st_size,
        seconds=round(time.monotonic() - t0, 3),
    )
    _prunecopies_of(path, keep)
    return dst


_COPY = re.compile(r"\.schema-(\d+)\.bak\Z")


def copies_of(path: Path | None) -> dict[int, Path]:
    """The copies taken before a migration beside the log at ``path``: schema -> file."""
    copies = {}
    if path is not None:
        for p in path.parent.glob(f"{glob.escape(path.name)}.schema-*.bak"):
            m = _COPY.search(p.name)
            if m and p.name == copy_path(path, int(m.group(1))).name:
                copies[int(m.group(1))] = p
    return copies


def _prunecopies_of(path: Path, keep: int) -> None:
    """Remove all but the ``keep`` copies of the highest schemas."""
    for _schema, p in sorted(copies_of(path).items(), reverse=True)[keep:]:
        p.unlink(missing_ok=True)
        log.info("log_copy_removed", copy=str(p))
