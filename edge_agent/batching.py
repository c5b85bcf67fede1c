"""Building the next batch of a stream: frame a sealed segment, or read and encode.

:func:`build` sends a sealed segment (records encoded ahead of any link by
edge_agent/sealing.py) when one starts where the site's holdings end and fits the link
(records, bytes, today's budget): only its header is new. Otherwise it reads the records
and encodes them, stopping where the next segment starts so later batches line up with
segments again. It is a pure function of a :class:`BuildSpec` (a snapshot of the session's
cursor) and a log: it changes nothing and returns a :class:`Built`. That lets it run
away from the agent's event loop:

- ``uplink.encode_workers = 1`` (the default): in a child process with its own
  read-only connection to the log (SQLite WAL: readers do not block the writer).
  Encoding a 50,000-record batch takes a few hundred milliseconds of CPU; in a thread it
  would hold the GIL the MQTT ingest needs, and on a port link it bounds the upload
  (bench/link_drain.py: ``agent_build_bound_bytes_s``). A child process uses the ship
  computer's second core.
- ``uplink.encode_workers = 0``: in a worker thread of the agent (no extra process; for
  small ships with satellite links only, where batches are small).

A child that dies (killed, out of memory) is replaced at the next batch; the error is
raised to the session as a :class:`BuildFailed` (the batch is simply built again).

With a signing key (``uplink.signing_key_file``) every batch built and every segment
sealed is signed (shorelink/proof.py): :func:`build` and :func:`seal` take the key.
The key is loaded once, when the :class:`BatchBuilder` is made (the agent's start); a
child process cannot be handed it (a key object does not pickle), so it loads the same
file when it starts and refuses to run if that is no longer the key the agent started
with (the child is then replaced, and after a few tries the agent builds in a thread
with its own key): every batch of a run is signed by one key.

With dictionaries (``uplink.dictionaries_dir``, shorelink/wire_dict.py) a batch encoded
when sent is compressed with the dictionary its :class:`BuildSpec` names (the session
chooses: the stream's newest, or none for a gateway that lacks it). The builder and its
child each load the directory once, when they start. Sealed segments are not: they are
port links' batches (50,000 records), where a dictionary saves little, and a segment
must be framable for any gateway.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

from edge_agent.config import LogConfig, StreamConfig, load_dictionaries, load_signing_key
from edge_agent.errors import UplinkError
from edge_agent.log import EdgeLog, LogRecord
from shorelink.errors import ConfigError
from shorelink.proof import ShipKey
from shorelink.ranges import RangeSet
from shorelink.wire import (
    FLAG_AIS,
    Batch,
    Body,
    WireRecord,
    encode_batch,
    encode_body,
    frame_batch,
)
from shorelink.wire_dict import Dictionaries, Dictionary
from shorelink.workers import WorkerDied, WorkerPool, WorkersUnavailable

__all__ = ["BatchBuilder", "BuildFailed", "BuildSpec", "Built", "SealSpec", "build", "seal"]

_Spec = TypeVar("_Spec")
_T = TypeVar("_T")


@dataclass(frozen=True)
class BuildSpec:
    stream: str
    #: the stream's last committed seq (a child's read-only view does not follow it)
    last: int
    #: next seq to consider (None: the log's lowest)
    pos: int | None
    #: first_available so far (None: the log's lowest seq)
    floor: int | None
    #: what the site holds of the stream
    held: RangeSet
    #: batches of the stream are in flight (first_available must not move past them)
    busy: bool
    max_records: int
    #: payload bytes read, and the most the encoded batch may take
    max_bytes: int
    #: what today's link budget still allows (None: no budget)
    budget_left: int | None
    #: compress with this dictionary (0: none; one the builder does not hold: none)
    dict_id: int = 0
    #: code AIS sentences as fields (false: the gateway predates it; the builder's
    #: ``uplink.ais_fields`` can only turn it off)
    ais: bool = True


@dataclass(frozen=True)
class Built:
    #: the encoded batch, or None (nothing to send now, or the budget is spent)
    body: bytes | None
    first: int
    last: int
    count: int
    #: the cursor's next pos and floor
    pos: int | None
    floor: int | None
    #: not even one record fits today's budget
    spent: bool = False
    #: framed from a sealed segment (nothing encoded now)
    sealed: bool = False


def build(
    edge_log: EdgeLog,
    spec: BuildSpec,
    key: ShipKey | None = None,
    dictionaries: Dictionaries | None = None,
) -> Built:
    """The next batch of ``spec.stream`` the site lacks, from ``spec.pos`` on; signed
    with ``key`` (the ship's) if given; compressed with ``spec.dict_id`` if it is one of
    ``dictionaries``."""
    first = edge_log.first_seq(spec.stream)
    pos = max(spec.pos or first, first)
    floor = max(spec.floor or first, first)
    while pos <= spec.last:
        todo = spec.held.missing(pos, spec.last)
        if not todo:
            break
        lo, hi = next(iter(todo))
        sealed = _sealed(edge_log, spec, lo, hi, floor, key)
        if sealed is not None:
            return sealed
        nxt = edge_log.segments.next(spec.stream, lo)
        if nxt is not None and nxt <= hi:
            hi = nxt - 1  # line up with the segment: the batch after it can be sent as is
        recs = edge_log.read(
            spec.stream, lo, hi, max_records=spec.max_records, max_bytes=spec.max_bytes
        )
        start = recs[0].seq if recs else hi + 1
        if start > lo and floor < start:
            # seqs lo..start-1 are gone from the log and the site lacks them: the site
            # must be told not to wait for them, but only once nothing earlier of this
            # stream is in flight (or it would abandon those too)
            if spec.busy:
                return Built(None, 0, 0, 0, pos, floor)
            floor = start
        if not recs:
            pos = hi + 1
            continue
        held = None if dictionaries is None else dictionaries.get(spec.dict_id)
        return _encode(edge_log.origin, spec, _contiguous(recs), pos, floor, key, held)
    return Built(None, 0, 0, 0, pos, floor)


def _sealed(
    edge_log: EdgeLog, spec: BuildSpec, lo: int, hi: int, floor: int, key: ShipKey | None
) -> Built | None:
    """The sealed segment starting at ``lo``, framed, if the link can take it whole and
    it was sealed with ``key`` (or unsigned, without one). A segment sealed unsigned or
    with another key is left alone: its records are encoded now, signed with ``key``
    (simpler than re-signing a body, and the sealer drops such segments at its start
    and seals those records again)."""
    signer = "" if key is None else key.public()
    seg = edge_log.segments.get(spec.stream, lo, signer=signer)
    if seg is None or seg.count > spec.max_records or lo + seg.count - 1 > hi:
        return None
    if seg.flags & FLAG_AIS and not spec.ais:
        return None  # AIS as fields, for a gateway that predates it (or uplink.ais_fields off)
    body = frame_batch(edge_log.origin, spec.stream, seg, first_available=floor)
    if len(body) > spec.max_bytes or (
        spec.budget_left is not None and len(body) > spec.budget_left
    ):
        return None  # built from the records instead (fewer of them)
    last = lo + seg.count - 1
    return Built(body, lo, last, seg.count, last + 1, floor, sealed=True)


def _encode(
    origin: str,
    spec: BuildSpec,
    recs: list[LogRecord],
    pos: int,
    floor: int,
    key: ShipKey | None,
    dictionary: Dictionary | None = None,
) -> Built:
    """Encode ``recs`` (signed with ``key`` if given, compressed with ``dictionary``);
    fewer of them if the encoded batch
    would be larger than ``max_bytes`` (records that do not compress: a gateway refuses
    batches over its limit, 8 MiB by default) or than today's budget."""
    n = len(recs)
    while n:
        body = encode_batch(
            Batch(
                origin,
                spec.stream,
                tuple(WireRecord(r.seq, r.key, r.ts_ms, r.topic, r.payload) for r in recs[:n]),
                first_available=floor,
            ),
            key=key,
            dictionary=dictionary,
            ais=spec.ais,
        )
        if len(body) > spec.max_bytes and n > 1:
            n = max(1, min(n - 1, int(n * spec.max_bytes / len(body) * 0.9)))
            continue
        left = spec.budget_left
        if left is None or len(body) <= left:
            return Built(body, recs[0].seq, recs[n - 1].seq, n, recs[n - 1].seq + 1, floor)
        n = min(n - 1, int(n * left / len(body) * 0.97))
    return Built(None, 0, 0, 0, pos, floor, spent=True)


def _contiguous(recs: list[LogRecord]) -> list[LogRecord]:
    """The leading run of consecutive seqs (a batch's seqs are contiguous)."""
    for i in range(1, len(recs)):
        if recs[i].seq != recs[i - 1].seq + 1:
            return recs[:i]
    return recs


@dataclass(frozen=True)
class SealSpec:
    stream: str
    #: seal from here (or the first seq still on board after it)
    start: int
    #: the stream's last committed seq
    last: int
    #: a segment is this many records, or as many as ``max_bytes`` of payload hold
    max_records: int
    max_bytes: int
    #: code AIS sentences as fields (``uplink.ais_fields``; set by the builder)
    ais: bool = True


def seal(edge_log: EdgeLog, spec: SealSpec, key: ShipKey | None = None) -> Body | None:
    """The next segment of ``spec.stream`` from ``spec.start`` on, encoded (and signed
    with ``key`` if given); None while the records there are not yet a whole segment:
    ``max_records`` of them, or a run that can grow no more (cut by ``max_bytes`` of
    payload, or by a gap retention left)."""
    recs = _contiguous(
        edge_log.read(
            spec.stream,
            spec.start,
            spec.last,
            max_records=spec.max_records,
            max_bytes=spec.max_bytes,
        )
    )
    if not recs or (len(recs) < spec.max_records and recs[-1].seq >= spec.last):
        return None
    return encode_body(
        tuple(WireRecord(r.seq, r.key, r.ts_ms, r.topic, r.payload) for r in recs),
        signer=None if key is None else (key, edge_log.origin, spec.stream),
        ais=spec.ais,
    )


# -- where build runs ------------------------------------------------------------------------
class BuildFailed(UplinkError):
    """The child process building a batch died; it is replaced at the next batch (the
    uplink retries with its backoff)."""

    retryable = True


_CHILD_LOG: EdgeLog | None = None
_CHILD_KEY: ShipKey | None = None
_CHILD_DICTIONARIES: Dictionaries | None = None


def _child_open(
    path: Path,
    origin: str,
    streams: dict[str, StreamConfig],
    cfg: LogConfig,
    key_file: Path | None,
    signer: str,
    dictionaries_dir: Path | None = None,
) -> None:
    """The child's log, key and dictionaries: the key in ``key_file``, which must still
    be the one whose public half is ``signer`` (the agent's, loaded at its start)."""
    global _CHILD_LOG, _CHILD_KEY, _CHILD_DICTIONARIES
    key = load_signing_key(key_file)
    if ("" if key is None else key.public()) != signer:
        raise ConfigError(
            "uplink.signing_key_file",
            f"{key_file} holds another key than when the agent started: restart the agent",
        )
    _CHILD_KEY = key
    _CHILD_DICTIONARIES = load_dictionaries(dictionaries_dir)
    _CHILD_LOG = EdgeLog(path, origin, streams, cfg, readonly=True)


def _child_build(spec: BuildSpec) -> Built:
    assert _CHILD_LOG is not None
    return build(_CHILD_LOG, spec, _CHILD_KEY, _CHILD_DICTIONARIES)


def _child_seal(spec: SealSpec) -> Body | None:
    assert _CHILD_LOG is not None
    return seal(_CHILD_LOG, spec, _CHILD_KEY)


class BatchBuilder:
    """Runs :func:`build` and :func:`seal` in a child process (``workers = 1``) or a
    thread (0). Sending comes first: a seal starts only while no build is waiting or
    running (a build that arrives during a seal waits for it, a few hundred ms)."""

    def __init__(
        self,
        edge_log: EdgeLog,
        *,
        workers: int,
        signing_key_file: Path | None = None,
        dictionaries_dir: Path | None = None,
        ais_fields: bool = True,
    ) -> None:
        """``signing_key_file``: the ship's key (``uplink.signing_key_file``), loaded
        now; every batch and segment is signed with it. None: unsigned.
        ``dictionaries_dir``: the dictionaries a batch may be compressed with, loaded
        now. ``ais_fields``: AIS sentences coded as fields in what it builds and seals
        (``uplink.ais_fields``)."""
        self.log = edge_log
        self.ais_fields = ais_fields
        self.dictionaries = load_dictionaries(dictionaries_dir)
        #: the ship's key (None: batches go unsigned) and its public half ("": none),
        #: which the segments it seals are stored under
        self.key = load_signing_key(signing_key_file)
        self.signer = "" if self.key is None else self.key.public()
        # (a child's read-only view of the log: SQLite WAL readers never block the writer)
        self.pool = WorkerPool(
            "batch_builder",
            workers,
            initializer=_child_open,
            initargs=(
                edge_log.path,
                edge_log.origin,
                edge_log.streams,
                edge_log.cfg,
                signing_key_file,
                self.signer,
                dictionaries_dir,
            ),
        )
        self._builds = 0
        self._no_builds = asyncio.Event()
        self._no_builds.set()

    @property
    def workers(self) -> int:
        """1: builds in a child process; 0: in a thread (asked for, or no child possible)."""
        return self.pool.workers

    async def build(self, spec: BuildSpec) -> Built:
        self._builds += 1
        self._no_builds.clear()
        try:
            return await self._run(
                _child_build, self._build_here, replace(spec, ais=spec.ais and self.ais_fields)
            )
        finally:
            self._builds -= 1
            if not self._builds:
                self._no_builds.set()

    def _build_here(self, edge_log: EdgeLog, spec: BuildSpec, key: ShipKey | None) -> Built:
        return build(edge_log, spec, key, self.dictionaries)

    async def seal(self, spec: SealSpec) -> Body | None:
        while self._builds:
            await self._no_builds.wait()
        return await self._run(_child_seal, seal, replace(spec, ais=spec.ais and self.ais_fields))

    async def _run(
        self,
        in_child: Callable[[_Spec], _T],
        here: Callable[[EdgeLog, _Spec, ShipKey | None], _T],
        spec: _Spec,
    ) -> _T:
        if self.pool.workers:
            try:
                return await self.pool.run(in_child, spec)
            except WorkerDied as exc:
                raise BuildFailed(str(exc)) from exc
            except WorkersUnavailable:
                pass  # (logged by the pool) a thread from now on rather than never upload
        return await asyncio.to_thread(here, self.log, spec, self.key)

    def pids(self) -> list[int]:
        """The child processes building batches now (none before the first batch)."""
        return self.pool.pids()

    def close(self) -> None:
        self.pool.close()
