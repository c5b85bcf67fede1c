"""Latest-value snapshots: each key's newest reading ashore before a long backlog.

Why: after a month dark the newest reading of every container is the last record of a
stream of 1.8 million, and a stream goes in seq order (a site admits a batch only
contiguous with what it settled: docs/edge-agent.md, "Newest first?"), so the port
learns a container's state only when the whole backlog arrived. Sending the newest
first within the stream would take holes the ship promises to fill; a copy does not.

What: a stream with ``latest_stream`` set (``[streams.<s>]``) has, when a link that
carries that other stream comes up and its oldest unsent record is older than
``latest_after``, each key's newest unsent reading copied into ``latest_stream``, in one
transaction of the log with the copies' seqs and the time of the snapshot
(:meth:`EdgeLog.commit_made`), the backlog read a stretch at a time before it. The
uplink takes it in a thread as the link's session starts, and the session holds back
the source stream (not alerts) until it is committed. The copies are records of their
own stream with their own identities; the originals go later in their own stream, in
order: every identity is still sent and stored once. ``latest_stream`` has a lower priority number than its
source, so a session sends it first (edge_agent/session.py), over the links whose
``streams`` name it, charged to their budgets like any byte.

Bounds: at most one snapshot per stream per ``latest_after`` (the time of the last one
is kept in the log, so a restart does not take it again); at most
:data:`MAX_LATEST_KEYS` records and :data:`MAX_LATEST_BYTES` of payload each, the
newest keys first (the rest counted as left out, among the keys the scan keeps in
view: twice the bound).

A copy's value says which record it copies (shorelink/snapshot.py: the original's
stream and seq, and its payload); key, event time and MQTT topic are the original's.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Container
from dataclasses import dataclass, replace

from edge_agent.config import EdgeConfig, LinkConfig, StreamConfig
from edge_agent.errors import LogError
from edge_agent.log import EdgeLog, Incoming, newest_per_key, read_meta
from edge_agent.metrics import EdgeMetrics
from shorelink.contract import MAX_INT64, MAX_RECORD_BYTES, record_bytes
from shorelink.logs import get_logger
from shorelink.ranges import RangeSet
from shorelink.snapshot import encode_copy

__all__ = [
    "MAX_LATEST_BYTES",
    "MAX_LATEST_KEYS",
    "Snapshot",
    "Snapshots",
    "due",
]

log = get_logger(__name__)

#: the most records one snapshot holds (one per key, the newest keys first): a ship's
#: reefers are a few thousand; a stream keyed by something unbounded is cut here
MAX_LATEST_KEYS = 20_000
#: the most payload bytes one snapshot copies (what a port link sends in seconds)
MAX_LATEST_BYTES = 16 * 1024 * 1024
#: seqs of the backlog read at once, under the log's lock (about 0.1 s here)
SCAN_SEQS = 100_000
#: the log's ``meta`` key of a stream's last snapshot: "<taken ms> <seq it reached>"
_META = "latest:"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One snapshot taken: ``records`` copies of ``source`` into ``target`` (payload
    ``bytes``), up to ``source``'s seq ``upto``; keys past the bounds ``left_out``."""

    source: str
    target: str
    records: int
    bytes: int
    upto: int
    left_out: int
    taken_ms: int


def due(
    st: StreamConfig, link: LinkConfig, oldest_recv_ms: int | None, last_ms: int | None, now_ms: int
) -> bool:
    """Pure: whether ``st`` takes a snapshot now that ``link`` came up, its oldest
    unsent record received at ``oldest_recv_ms`` (None: nothing unsent) and its last
    snapshot taken at ``last_ms`` (None: never)."""
    if not st.latest_stream or not link.carries(st.latest_stream) or oldest_recv_ms is None:
        return False
    after_ms = st.latest_after_s * 1000
    return now_ms - oldest_recv_ms >= after_ms and (last_ms is None or now_ms - last_ms >= after_ms)


class Snapshots:
    """The agent's snapshots: :meth:`take_due` when a link comes up (edge_agent/uplink.py)."""

    def __init__(
        self,
        cfg: EdgeConfig,
        edge_log: EdgeLog,
        metrics: EdgeMetrics | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cfg = cfg
        self.log = edge_log
        self.metrics = metrics
        self.clock = clock

    def due_streams(
        self, link: LinkConfig, taken: Container[str] | None = None
    ) -> list[StreamConfig]:
        """The streams whose snapshot may be due now that ``link`` came up to a site
        that takes the streams ``taken`` (None: all), their backlog being old (whether
        the last snapshot was recent is :meth:`take`'s to tell): cheap, no scan. A
        snapshot the site would not take is not taken: it would wait on board."""
        out = []
        for st in self.cfg.by_priority():
            wanted = st.latest_stream and (taken is None or st.latest_stream in taken)
            _n, _b, oldest = self.log.backlog(st.name) if wanted else (0, 0, None)
            if due(st, link, oldest, None, int(self.clock() * 1000)):
                out.append(st)
        return out

    def take_due(self, link: LinkConfig, taken: Container[str] | None = None) -> list[Snapshot]:
        """Take the snapshots due now that ``link`` came up to a site that takes the
        streams ``taken`` (None: all); blocking: call off the loop."""
        out = []
        for st in self.due_streams(link, taken):
            try:
                snap = self.take(st, link, int(self.clock() * 1000))
            except LogError as exc:  # a snapshot is a favour: the link goes on without
                log.warning("latest_snapshot_failed", stream=st.name, error=str(exc))
                continue
            if snap is not None:
                out.append(snap)
        return out

    def take(self, st: StreamConfig, link: LinkConfig, now_ms: int) -> Snapshot | None:
        """Copy each key's newest unsent record of ``st`` into ``st.latest_stream``, if
        :func:`due`; None if not, or if nothing unsent is newer than what the last
        snapshot copied. The backlog is read a stretch at a time (:data:`SCAN_SEQS`,
        the log's lock held for one: ingest goes on meanwhile), then what came since
        and the copies with the snapshot's time are one transaction, which checks the
        last snapshot again (a restart or a second link coming up does not take it
        twice)."""
        started = time.monotonic()
        last = self.log.meta(_META + st.name)
        _n, _b, oldest = self.log.backlog(st.name)
        if not due(st, link, oldest, _taken(last)[0], now_ms):
            return None
        epoch = self.log.numbering_epoch
        newest = _Newest(self.log.delivered(st.name))
        # keys whose newest reading the last snapshot copied already: not again
        lo = max(self.log.first_seq(st.name), _taken(last)[1] + 1)
        end = self.log.stream_state(st.name).next_seq - 1
        for at in range(lo, end + 1, SCAN_SEQS):
            newest.add(self.log.newest_per_key(st.name, at, min(end, at + SCAN_SEQS - 1)))
        snap: list[Snapshot] = []

        def make(conn: sqlite3.Connection) -> list[Incoming]:
            if read_meta(conn, _META + st.name) != last or self.log.numbering_epoch != epoch:
                return []  # a snapshot was taken meanwhile, or the seqs moved
            newest.add(newest_per_key(conn, st.name, max(lo, end + 1), MAX_INT64))
            copies, upto, left_out = _copies(conn, st, newest.choose(), now_ms)
            if not copies:
                return []
            conn.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                [_META + st.name, f"{now_ms} {upto}"],
            )
            size = sum(len(c.payload) for c in copies)
            snap.append(
                Snapshot(st.name, st.latest_stream, len(copies), size, upto, left_out, now_ms)
            )
            return copies

        stored = self.log.commit_made(make)
        if not snap:
            return None
        s = snap[0]
        if len(stored) < s.records:  # the budget refused some: say what was stored
            size = sum(len(r.payload) for r in stored)
            left_out = s.left_out + s.records - len(stored)
            s = replace(s, records=len(stored), bytes=size, left_out=left_out)
        log.info(
            "latest_snapshot",
            stream=s.source,
            to=s.target,
            records=s.records,
            bytes=s.bytes,
            upto_seq=s.upto,
            left_out=s.left_out,
            took_ms=round((time.monotonic() - started) * 1000),
        )
        if self.metrics is not None:
            self.metrics.latest_snapshots.labels(s.source).inc()
            self.metrics.latest_records.labels(s.source).inc(s.records)
            self.metrics.latest_bytes.labels(s.source).inc(s.bytes)
        return s


def _taken(last: str | None) -> tuple[int | None, int]:
    """When the last snapshot was taken (None: never) and the seq it reached."""
    if last is None:
        return None, 0
    taken, upto = last.split()
    return int(taken), int(upto)


class _Newest:
    """Each key's newest seq no site holds, gathered a stretch of the backlog at a
    time; at most twice :data:`MAX_LATEST_KEYS` keys kept (those beyond the newest
    :data:`MAX_LATEST_KEYS` can never be chosen: a key's seq only grows)."""

    def __init__(self, delivered: RangeSet) -> None:
        self.delivered = delivered
        #: key -> (seq, payload bytes)
        self.keys: dict[str, tuple[int, int]] = {}

    def add(self, rows: list[tuple[str, int, int]]) -> None:
        for key, seq, size in rows:
            if seq in self.delivered:
                self.keys.pop(key, None)  # its newest so far is ashore
            else:
                self.keys[key] = (seq, size)
        if len(self.keys) > 2 * MAX_LATEST_KEYS:
            self.keys = dict(self._newest_first()[:MAX_LATEST_KEYS])

    def _newest_first(self) -> list[tuple[str, tuple[int, int]]]:
        return sorted(self.keys.items(), key=lambda kv: kv[1][0], reverse=True)

    def choose(self) -> tuple[list[int], int]:
        """The seqs a snapshot copies (the newest keys first, within the bounds), and
        how many keys the bounds left out."""
        chosen: list[int] = []
        total = 0
        for _key, (seq, size) in self._newest_first():
            if len(chosen) == MAX_LATEST_KEYS or total + size > MAX_LATEST_BYTES:
                break
            chosen.append(seq)
            total += size
        return chosen, len(self.keys) - len(chosen)


def _copies(
    conn: sqlite3.Connection, st: StreamConfig, chosen: tuple[list[int], int], now_ms: int
) -> tuple[list[Incoming], int, int]:
    """The copies of the ``chosen`` seqs of ``st`` in seq order (one that retention
    removed meanwhile, or that would pass the record size limit, left out); the seq
    they reach; how many keys were left out."""
    seqs, left_out = chosen
    copies = []
    for seq in sorted(seqs):
        row = conn.execute(
            "SELECT key, ts_ms, topic, payload FROM records WHERE stream = ? AND seq = ?",
            [st.name, seq],
        ).fetchone()
        if row is None:
            continue
        key, ts_ms, topic, payload = row
        value = encode_copy(st.name, seq, payload)
        if record_bytes(key, value, topic) <= MAX_RECORD_BYTES:
            copies.append(Incoming(st.latest_stream, key, ts_ms, now_ms, topic, value))
    return copies, max(seqs, default=0), left_out + len(seqs) - len(copies)
