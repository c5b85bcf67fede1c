"""The on-ship log: SQLite in WAL mode, the single source of truth on the ship.

A message is acknowledged to the broker only after :meth:`EdgeLog.commit` returned, so
everything acknowledged survives ``kill -9`` and (with ``synchronous=full``) power cuts.
Seqs are assigned inside the commit transaction: gapless per ``(origin, stream)``.

Thread-safety: one connection behind a lock; the ingest thread writes, the uplink and
status read. Other processes (``shorelink-edge status``) open their own read-only log.

:class:`EdgeLog` keeps the records (commit, retention, reads, numbering) and what the
sites hold. Two other concepts live in the same file and share its connection and lock:
sealed segments (``EdgeLog.segments``, edge_agent/segments.py), the uplink's link
spend and gateway states (``EdgeLog.links``, edge_agent/linkstate.py) and the
quarantine (``EdgeLog.quarantine``, edge_agent/quarantine.py).
"""

from __future__ import annotations

import hashlib
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import sqlite_utils

from edge_agent import numbering
from edge_agent.config import LogConfig, StreamConfig
from edge_agent.errors import LogError, LogFullError
from edge_agent.linkstate import Links
from edge_agent.migrations import migrate, schema_of
from edge_agent.numbering import StreamState
from edge_agent.quarantine import Quarantine, Quarantined
from edge_agent.redelivery import Redelivery
from edge_agent.retention import Retention
from edge_agent.segments import Segments
from shorelink.logs import get_logger
from shorelink.ranges import RangeSet

__all__ = ["CommitResult", "EdgeLog", "Incoming", "LogRecord", "LogSizes", "message_digest"]

log = get_logger(__name__)

#: bytes a record costs besides payload, key and topic (row header, seq, times)
ROW_OVERHEAD = 32


def message_digest(topic: bytes, payload: bytes) -> bytes:
    return hashlib.blake2b(topic + b"\0" + payload, digest_size=16).digest()


@dataclass(frozen=True, slots=True)
class Incoming:
    """A mapped MQTT message on its way into the log."""

    stream: str
    key: str
    ts_ms: int
    recv_ms: int
    topic: str
    payload: bytes
    mid: int = 0  # MQTT packet id (0: none, QoS 0)
    dup: bool = False
    digest: bytes = b""
    #: the MQTT connection it arrived on (0: unknown, the DUP rule alone) and whether
    #: that connection resumed a session the broker kept (edge_agent/redelivery.py)
    conn: int = 0
    resumed: bool = False

    @property
    def size(self) -> int:
        return len(self.payload) + len(self.key) + len(self.topic) + ROW_OVERHEAD


@dataclass(frozen=True, slots=True)
class LogRecord:
    stream: str
    seq: int
    key: str
    ts_ms: int
    recv_ms: int
    topic: str
    payload: bytes


@dataclass(frozen=True, slots=True)
class LogSizes:
    #: bytes of the records held (payload, key, topic and row overhead), what budgets count
    records: int
    #: bytes of the log's files on disk (database, WAL, shared memory)
    files: int


@dataclass
class CommitResult:
    #: per incoming message, in order: "stored", "duplicate" or "rejected"
    outcomes: list[str]
    #: per incoming message: its seq when stored, else 0
    seqs: list[int]
    #: undelivered records dropped by a drop_oldest policy to make room, per stream
    dropped: dict[str, int]
    #: delivered records removed to make room, per stream
    retired: dict[str, int]
    #: alerts accepted beyond the budget (never dropped, never rejected)
    over_budget: int = 0
    #: records ``derive`` added to the transaction (alerts raised by alarms), stored
    derived: list[LogRecord] = field(default_factory=list)


class EdgeLog:
    #: packet ids seen, for recognising redeliveries (loaded by the first commit)
    _redelivery: Redelivery | None = None

    def __init__(
        self,
        path: Path,
        origin: str,
        streams: dict[str, StreamConfig],
        cfg: LogConfig,
        *,
        readonly: bool = False,
    ) -> None:
        self.path = Path(path)
        self.origin = origin
        self.streams = streams
        self.cfg = cfg
        self._lock = threading.Lock()
        try:
            if readonly:
                if not self.path.exists():
                    raise LogError(f"no log at {self.path}")
                self._conn = sqlite3.connect(
                    f"file:{self.path}?mode=ro",
                    uri=True,
                    isolation_level=None,
                    check_same_thread=False,
                )
            else:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._conn = sqlite3.connect(
                    self.path, isolation_level=None, check_same_thread=False
                )
            self._conn.execute("PRAGMA busy_timeout = 10000")
            if not readonly:
                self._conn.execute("PRAGMA journal_mode = WAL")
                self._conn.execute(f"PRAGMA synchronous = {cfg.synchronous.upper()}")
                migrate(sqlite_utils.Database(self._conn))
                self._check_origin()
        except sqlite3.Error as exc:
            self._close_if_open()
            raise LogError(f"cannot open log {self.path}: {exc}") from exc
        except LogError:  # a log from a newer agent, or its copy could not be taken
            self._close_if_open()
            raise
        self._retention = Retention(self._conn, streams, cfg)
        #: bumped whenever seqs are moved (:meth:`reconcile`): work built before is stale
        self.numbering_epoch = 0
        #: sealed segments (edge_agent/segments.py), on this connection and lock
        self.segments = Segments(self._conn, self._lock, self._txn, lambda: self.numbering_epoch)
        #: link spend and gateway states (edge_agent/linkstate.py), on this connection and lock
        self.links = Links(self._conn, self._lock, self._txn)
        #: unusable messages kept for a person (edge_agent/quarantine.py)
        self.quarantine = Quarantine(self._conn, self._lock, cfg.quarantine_max)
        #: called after every commit that stored records, with their streams (from the
        #: committing thread): an alert wakes a session waiting on answers (session.py)
        self._listeners: list[Callable[[frozenset[str]], None]] = []
        self._load_state()
        if not readonly:
            with self._txn() as conn:
                numbering.mark_open(
                    conn, [(n, st.next_seq) for n, st in self._retention.state.items()]
                )

    def _close_if_open(self) -> None:
        conn = self.__dict__.get("_conn")
        if conn is not None:
            conn.close()

    # -- state ---------------------------------------------------------------------------
    def _check_origin(self) -> None:
        row = self._conn.execute("SELECT value FROM meta WHERE key = 'origin'").fetchone()
        if row is None:
            self._conn.execute("INSERT INTO meta (key, value) VALUES ('origin', ?)", [self.origin])
        elif row[0] != self.origin:
            raise LogError(f"log {self.path} belongs to ship {row[0]!r}, not {self.origin!r}")

    def _load_state(self) -> None:
        state: dict[str, StreamState] = {}
        for name, next_seq, count, nbytes, dropped, retired, rejected in self._conn.execute(
            "SELECT name, next_seq, count, bytes, dropped, retired, rejected FROM streams"
        ):
            state[name] = StreamState(next_seq, count, nbytes, dropped, retired, rejected)
        for name in self.streams:
            state.setdefault(name, StreamState())
        self._retention.state = state
        self._inflight: dict[int, bytes] = dict(
            self._conn.execute("SELECT mid, digest FROM inflight")
        )
        held: dict[str, RangeSet] = {}
        for _site, stream, text in self._conn.execute("SELECT site, stream, ranges FROM holdings"):
            held.setdefault(stream, RangeSet()).update(RangeSet.parse(text))
        self._retention.delivered = held
        self._sent = {
            key.removeprefix("sent_upto:"): int(value)
            for key, value in self._conn.execute(
                "SELECT key, value FROM meta WHERE key LIKE 'sent_upto:%'"
            )
        }

    @contextmanager
    def _txn(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                raise LogError(f"log {self.path}: cannot begin: {exc}", retryable=True) from exc
            try:
                yield self._conn
                self._conn.execute("COMMIT")
            except BaseException as exc:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                self._load_state()  # the in-memory counters followed the rolled-back txn
                if isinstance(exc, sqlite3.OperationalError) and _is_full(exc):
                    raise LogFullError(f"disk full writing {self.path}: {exc}") from exc
                if isinstance(exc, sqlite3.Error):
                    raise LogError(f"log {self.path}: {exc}", retryable=True) from exc
                raise

    # -- writing -------------------------------------------------------------------------
    def commit(
        self,
        batch: Sequence[Incoming],
        quarantine: Sequence[Quarantined] = (),
        *,
        derive: Callable[[sqlite3.Connection, list[Incoming]], Sequence[Incoming]] | None = None,
    ) -> CommitResult:
        """Store ``batch`` in one transaction: assign seqs, skip redelivered duplicates,
        apply the disk budget per stream policy, quarantine the unusable. Returns what
        happened to each message; raises :class:`LogError` (nothing stored) on failure.

        ``derive`` (alarms, edge_agent/alarms.py) is called inside the transaction with
        the messages stored (not the redeliveries); the records it returns are stored in
        the same transaction, and it may write its own state on the connection."""
        outcomes: list[str] = []
        seqs: list[int] = []
        derived: list[LogRecord] = []
        now_ms = int(time.time() * 1000)
        with self._txn() as conn:
            rows: list[tuple[object, ...]] = []
            flush = partial(_insert, conn, rows)
            ret = self._retention
            ret.begin(flush)
            if self._redelivery is None:
                self._redelivery = Redelivery.load(conn)
            redelivery = self._redelivery.begin()
            for m in batch:
                if redelivery.is_redelivery(m):
                    outcomes.append("duplicate")
                    seqs.append(0)
                    continue
                redelivery.record(m)
                if not ret.make_room(m.stream, m.size, now_ms):
                    outcomes.append("rejected")
                    seqs.append(0)
                    continue
                seq = ret.admit(m.stream, m.size).mint()
                rows.append((m.stream, seq, m.key, m.ts_ms, m.recv_ms, m.topic, m.payload, m.size))
                outcomes.append("stored")
                seqs.append(seq)
            if derive is not None:
                stored = [m for m, o in zip(batch, outcomes, strict=True) if o == "stored"]
                derived = self._store(derive(conn, stored) if stored else (), rows, now_ms)
            flush()
            redelivery.write(conn)
            if quarantine:
                self.quarantine.add(conn, quarantine)
            ret.save()
            result = CommitResult(
                outcomes, seqs, ret.dropped_now, ret.retired_now, ret.over_budget_now, derived
            )
        redelivery.apply()
        grown = frozenset(
            [m.stream for m, o in zip(batch, outcomes, strict=True) if o == "stored"]
            + [r.stream for r in derived]
        )
        if grown:
            for listener in list(self._listeners):
                listener(grown)
        return result

    def _store(
        self, records: Iterable[Incoming], rows: list[tuple[object, ...]], now_ms: int
    ) -> list[LogRecord]:
        """Records the agent made itself, numbered into ``rows`` inside the caller's
        transaction as far as the budget makes room (alerts of alarms, snapshots)."""
        ret = self._retention
        out = []
        for m in records:
            if ret.make_room(m.stream, m.size, now_ms):
                seq = ret.admit(m.stream, m.size).mint()
                rows.append((m.stream, seq, m.key, m.ts_ms, m.recv_ms, m.topic, m.payload, m.size))
                out.append(LogRecord(m.stream, seq, m.key, m.ts_ms, m.recv_ms, m.topic, m.payload))
        return out

    def commit_made(
        self, make: Callable[[sqlite3.Connection], Sequence[Incoming]]
    ) -> list[LogRecord]:
        """Store the records ``make`` returns in one transaction: ``make`` reads the log
        and writes its own state on the connection inside it (a latest-value snapshot,
        edge_agent/latest.py), so the records, their seqs and that state commit together
        or not at all. Returns the records stored."""
        now_ms = int(time.time() * 1000)
        with self._txn() as conn:
            rows: list[tuple[object, ...]] = []
            self._retention.begin(partial(_insert, conn, rows))
            made = self._store(make(conn), rows, now_ms)
            _insert(conn, rows)
            self._retention.save()
        if made:
            for listener in list(self._listeners):
                listener(frozenset(r.stream for r in made))
        return made

    def listen(self, listener: Callable[[frozenset[str]], None]) -> Callable[[], None]:
        """Call ``listener`` with the streams of every commit that stores records, on
        the committing thread, until the returned function is called."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def expire(self, now_ms: int | None = None) -> dict[str, int]:
        """Age-based retention sweep (run periodically): returns records removed per stream."""
        now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
        with self._txn():
            self._retention.begin()
            removed = self._retention.expire(now_ms)
            self._retention.save()
        return removed

    def set_holdings(self, site: str, stream: str, ranges: RangeSet) -> None:
        """Record what ``site`` confirmed it holds of ``stream``; those records become
        eligible for retention on the ship."""
        with self._txn() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO holdings (site, stream, ranges, updated_ms) VALUES (?, ?, ?, ?)",
                [site, stream, str(ranges), int(time.time() * 1000)],
            )
        with self._lock:
            self._load_state()

    # -- a log that starts again (edge_agent/numbering.py) --------------------------------
    def note_sent(self, stream: str, last: int) -> None:
        """Seqs up to ``last`` of ``stream`` are about to go out on a link."""
        with self._lock:
            if last <= self._sent.get(stream, 0):
                return
        with self._txn() as conn:
            numbering.note_sent(conn, stream, last)
            self._sent[stream] = max(last, self._sent.get(stream, 0))

    def reconcile(self, site: str, stream: str, held: RangeSet) -> int:
        """Check this log's numbering of ``stream`` against what ``site`` holds; if the
        site holds seqs this log never sent (the log started again), move the records
        that may collide past the site's last seq. Returns the records moved."""
        site_last = held.last or 0
        with self._lock:
            if site_last <= self._sent.get(stream, 0):
                return 0
        with self._txn() as conn:
            sent = numbering.sent_upto(conn, stream)
            st = self.stream_state(stream)
            plan = numbering.plan_renumber(
                site_last, sent, numbering.renumber_from(conn, stream), st.next_seq
            )
            if plan is None:
                return 0
            ret = self._retention
            ret.begin()
            moved = numbering.renumber(conn, stream, ret.touch(stream), plan, site_last)
            ret.save()
            self._sent[stream] = site_last
        with self._lock:
            self.numbering_epoch += 1
            self._load_state()
        if not plan.delta:
            # nothing collides (a log from before sent_upto was kept, or a backup that
            # had more than the site ever got): the site's seqs are simply known now
            log.info("log_sent_upto_learned", site=site, stream=stream, sent_upto=site_last)
            return 0
        log.error(
            "log_numbering_diverged",
            site=site,
            stream=stream,
            site_last=site_last,
            log_sent_upto=sent,
            moved=moved,
            from_seq=plan.first,
            to_seq=plan.first + plan.delta,
            message="the log started again (re-flashed, restored or lost its tail); its records since keep their order under new seqs",
        )
        return moved

    # -- reading -------------------------------------------------------------------------
    def read(
        self, stream: str, lo: int, hi: int, *, max_records: int = 10_000, max_bytes: int = 1 << 30
    ) -> list[LogRecord]:
        """Records of ``stream`` with ``lo <= seq <= hi`` in seq order, stopping at
        ``max_records`` or once ``max_bytes`` of payload are reached (at least one)."""
        out: list[LogRecord] = []
        total = 0
        with self._lock:
            cur = self._conn.execute(
                "SELECT seq, key, ts_ms, recv_ms, topic, payload FROM records"
                " WHERE stream = ? AND seq BETWEEN ? AND ? ORDER BY seq LIMIT ?",
                [stream, lo, hi, max_records],
            )
            for seq, key, ts_ms, recv_ms, topic, payload in cur:
                if out and total + len(payload) > max_bytes:
                    break
                out.append(LogRecord(stream, seq, key, ts_ms, recv_ms, topic, payload))
                total += len(payload)
        return out

    def newest_per_key(self, stream: str, lo: int, hi: int) -> list[tuple[str, int, int]]:
        """``(key, seq, payload bytes)`` of each key's newest record of ``stream`` with
        ``lo <= seq <= hi`` (read a stretch at a time: the lock is held for one)."""
        with self._lock:
            return newest_per_key(self._conn, stream, lo, hi)

    def meta(self, key: str) -> str | None:
        """The value of ``key`` in the log's ``meta`` table (None: not set)."""
        with self._lock:
            return read_meta(self._conn, key)

    def tail(self, stream: str, n: int) -> list[LogRecord]:
        st = self.stream_state(stream)
        return self.read(stream, max(1, st.next_seq - n), st.next_seq - 1, max_records=n)

    def stream_names(self) -> list[str]:
        """Streams the log has state for (configured now, or seen before)."""
        return sorted(self._retention.state)

    def stream_state(self, stream: str) -> StreamState:
        return self._retention.state.get(stream, StreamState())

    def first_seq(self, stream: str) -> int:
        """Lowest seq still in the log (``next_seq`` when the stream is empty)."""
        with self._lock:
            row = self._conn.execute(
                "SELECT min(seq) FROM records WHERE stream = ?", [stream]
            ).fetchone()
        return int(row[0]) if row[0] is not None else self.stream_state(stream).next_seq

    def holdings(self) -> dict[str, dict[str, RangeSet]]:
        """site -> stream -> seqs that site confirmed."""
        out: dict[str, dict[str, RangeSet]] = {}
        with self._lock:
            for site, stream, text in self._conn.execute(
                "SELECT site, stream, ranges FROM holdings"
            ):
                out.setdefault(site, {})[stream] = RangeSet.parse(text)
        return out

    def delivered(self, stream: str) -> RangeSet:
        """Seqs of ``stream`` held by at least one shore site."""
        return self._retention.delivered.get(stream, RangeSet()).copy()

    def backlog(self, stream: str) -> tuple[int, int, int | None]:
        """(records, bytes, oldest receive time ms) of records no site holds yet.

        Cheap (no scan): every undelivered record at or above the lowest seq still in
        the log is present (retention only removes delivered records or a prefix), so
        the count is range arithmetic; bytes are estimated from the stream's mean
        record size; the oldest is one primary-key lookup."""
        st = self.stream_state(stream)
        last = st.next_seq - 1
        first = self.first_seq(stream)
        if last < first:
            return 0, 0, None
        gaps = self.delivered(stream).missing(first, last)
        n = gaps.count()
        if not n:
            return 0, 0, None
        mean = st.bytes / st.count if st.count else 0
        with self._lock:
            row = self._conn.execute(
                "SELECT recv_ms FROM records WHERE stream = ? AND seq = ?", [stream, gaps.first]
            ).fetchone()
        return n, int(n * mean), (row[0] if row else None)

    def sizes(self) -> LogSizes:
        return LogSizes(
            self._retention.total_bytes(),
            sum(
                p.stat().st_size for p in self.path.parent.glob(self.path.name + "*") if p.is_file()
            ),
        )

    def schema(self) -> dict[int, str]:
        """The migrations applied to the log (edge_agent/migrations.py): number -> name."""
        with self._lock:
            return schema_of(sqlite_utils.Database(self._conn))

    def close(self) -> None:
        with self._lock:
            self._conn.close()


def read_meta(conn: sqlite3.Connection, key: str) -> str | None:
    """:meth:`EdgeLog.meta` on ``conn`` (inside a transaction)."""
    row = conn.execute("SELECT value FROM meta WHERE key = ?", [key]).fetchone()
    return None if row is None else str(row[0])


def newest_per_key(
    conn: sqlite3.Connection, stream: str, lo: int, hi: int
) -> list[tuple[str, int, int]]:
    """:meth:`EdgeLog.newest_per_key` on ``conn`` (inside a transaction)."""
    return conn.execute(
        "SELECT key, max(seq), length(payload) FROM records"
        " WHERE stream = ? AND seq BETWEEN ? AND ? GROUP BY key",
        [stream, lo, hi],
    ).fetchall()


def _insert(conn: sqlite3.Connection, rows: list[tuple[object, ...]]) -> None:
    """Insert the numbered ``rows`` and forget them (the budget's flush)."""
    conn.executemany(
        "INSERT INTO records (stream, seq, key, ts_ms, recv_ms, topic, payload, size)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        rows,
    )
    rows.clear()


def _is_full(exc: sqlite3.OperationalError) -> bool:
    return getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL or "full" in str(exc)
