"""Writing accepted batches into Kafka exactly once, several batches per transaction.

Choice: Kafka transactions with a cursor. A transaction holds the new records of one or
more batches (to ``sl.ingress.<stream>``, in the record contract of docs/design.md) and
the updated cursor of every ``(origin, stream)`` among them (to the compacted
``sl.gateway.cursor``). Either all of it becomes visible to read_committed consumers or
none does, so:
- a gateway killed mid-write leaves an aborted transaction (invisible) and unchanged
  cursors; the ship resends and the batch is written once;
- a batch retried after a lost reply finds its seqs in the cursor and is not rewritten;
- on start-up the cursor topic (read to its end, read_committed) restores exactly what
  was committed.
The transactional.id is per site: a second gateway with the same id fences the first
(its commits fail with a fatal error and it stops), so there is one writer per site.

Kafka's transaction errors are handled the way librdkafka defines them by
:class:`~shorelink.kafka.transactions.TransactionalProducer` (a retriable commit is
retried, an abortable transaction aborted, a fatal error ends the producer); the writer
keeps only its reaction to each outcome:
- :class:`~shorelink.kafka.errors.TransactionAborted`: the transaction's batches fail
  (503; the ship resends from the holdings);
- :class:`~shorelink.kafka.errors.Fenced`: another gateway of this site took over; this
  one stops writing for good (:attr:`IngressWriter.fatal`) and never re-initialises by
  itself, so two gateways never fence each other in a loop;
- :class:`~shorelink.kafka.errors.ProducerBroken` (another fatal error, an abort that
  failed) or :class:`~shorelink.kafka.errors.CommitUnknown` (a commit whose outcome
  stays unknown): :attr:`IngressWriter.broken`; the service re-creates the producer
  (``init_transactions`` settles the open transaction) and re-reads the cursor before
  it accepts batches again (``GatewayService`` in service.py).

An idempotent producer alone would not do: it removes duplicates from producer retries
within one session, not from a gateway restart or a ship's resend.

Group commit: one thread owns the producer. It takes every write that is waiting when
it is free (up to :data:`MAX_GROUP_RECORDS` records) into one transaction, so the commit
round trips are shared by the batches of many ships and by a ship's pipelined batches
(the HTTP handlers wait on a future; the event loop keeps decoding the next batches
meanwhile). A write may build on earlier writes of its ``(origin, stream)`` that were
not committed yet when it was accepted (``depends``): if one of those failed, it fails
too (the ship resends from the site's holdings), so a cursor never claims seqs that are
not in Kafka.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

from core_gateway.config import GatewayConfig
from core_gateway.errors import KafkaWriteError
from core_gateway.holdings import Holdings, SourceHoldings
from shorelink.contract import (
    GATEWAY_CURSOR_TOPIC,
    H_PROOF,
    contract_headers,
    ingress_topic,
)
from shorelink.kafka.admin import Admin
from shorelink.kafka.errors import (
    CommitUnknown,
    Fenced,
    KafkaClientError,
    ProducerBroken,
    TransactionAborted,
)
from shorelink.kafka.reading import Headers, read_to_end
from shorelink.kafka.topics import ensure_topics, gateway_cursor_spec, ingress_spec, producer_config
from shorelink.kafka.transactions import TransactionalProducer
from shorelink.ledger import ledger_key
from shorelink.logs import get_logger
from shorelink.ranges import RangeSet
from shorelink.shards import origin_partition
from shorelink.wire import WireRecord

__all__ = ["MAX_GROUP_RECORDS", "IngressWriter", "Write"]

log = get_logger(__name__)

#: a transaction takes the waiting writes up to about this many records
MAX_GROUP_RECORDS = 200_000


@dataclass
class Write:
    """One accepted batch's share of a transaction."""

    origin: str
    stream: str
    #: the batch's records this site does not hold yet
    records: Sequence[WireRecord]
    #: the seqs of ``records``
    written: RangeSet
    #: seqs the ship declared gone (recorded as abandoned)
    abandoned: RangeSet
    #: seqs of earlier, not yet committed writes of the same (origin, stream) this one
    #: was accepted on top of
    depends: RangeSet = field(default_factory=RangeSet)
    done: Future[None] = field(default_factory=Future)
    #: each record's ``sl.proof`` by seq - ``proof_base`` (its ship signs), else None
    proofs: Sequence[bytes] | None = None
    proof_base: int = 0

    @property
    def seqs(self) -> RangeSet:
        out = self.written.copy()
        out.update(self.abandoned)
        return out


_STOP = object()
#: the writer's lanes: an urgent stream's write (``urgent``: alerts) goes into the next
#: transaction ahead of every bulk write waiting, however many ships queued theirs; the
#: stop comes after both. Within a lane, writes keep their order, and a write only ever
#: builds on earlier writes of its own (origin, stream), which share its lane
URGENT, BULK, STOP_LANE = 0, 1, 2


class IngressWriter:
    def __init__(
        self,
        cfg: GatewayConfig,
        on_commit: Callable[[int, int, float], None] = lambda _b, _r, _s: None,
    ) -> None:
        """``on_commit(batches, records, seconds)`` is called (in the writer thread)
        after each committed transaction, for metrics."""
        self.cfg = cfg
        self._on_commit = on_commit
        #: (lane, order, write): urgent streams' writes first (:data:`URGENT`), then the
        #: rest, each lane in the order submitted; the stop after everything queued
        self._queue: queue.PriorityQueue[tuple[int, int, Write | object]] = queue.PriorityQueue()
        self._order = itertools.count()
        self._thread: threading.Thread | None = None
        #: committed cursor per (origin, stream): owned by the writer thread after start
        self._committed: dict[tuple[str, str], SourceHoldings] = {}
        #: fenced by another gateway of this site: this one never writes again
        self.fatal: str | None = None
        #: the producer is unusable (not fenced): :meth:`reinit` before writing again
        self.broken: str | None = None
        self._closing = threading.Event()
        #: partitions per ingress topic, with ``kafka.ingress_by_origin`` (set by
        #: :meth:`ensure_topics`); empty: each record goes to its key's partition
        self._partitions: dict[str, int] = {}
        self._txn = TransactionalProducer(
            producer_config(
                self.cfg.kafka,
                {
                    "transactional.id": self.cfg.transactional_id,
                    "linger.ms": 5,
                    "compression.type": "lz4",
                    "queue.buffering.max.messages": 500_000,
                },
            ),
            timeout=self.cfg.kafka.timeout_s,
            closing=self._closing,
        )

    def _partition(self, topic: str, origin: str) -> int | None:
        """The ingress partition of ``origin``'s records with ``kafka.ingress_by_origin``
        (shorelink/shards.py); None (the key's partition) without."""
        n = self._partitions.get(topic)
        return None if n is None else origin_partition(origin, n)

    @property
    def retries(self) -> int:
        """Retriable errors retried (commit and abort timeouts), for metrics."""
        return self._txn.retries

    def ensure_topics(self) -> None:
        # ingress is kept until the merge has committed past it: the merge deletes
        # what it merged (spark_core/merge.py), nothing expires it by time (what a ship
        # was told is held must stay held until it is in the canonical topic)
        specs = [ingress_spec(s, self.cfg.ingress_partitions) for s in self.cfg.streams]
        specs.append(gateway_cursor_spec())
        ensure_topics(self.cfg.kafka, specs, self.cfg.durability)
        if self.cfg.ingress_by_origin:
            # the partitions each ingress topic has (created here or before, perhaps
            # with another count): an origin's records go to crc32(origin) mod that
            described = Admin(self.cfg.kafka).describe(ingress_topic(s) for s in self.cfg.streams)
            self._partitions = {t: len(d.partitions) for t, d in described.items()}

    def restore(self, holdings: Holdings) -> int:
        """Load the committed cursors into ``holdings`` (and the writer's own copy);
        returns how many. Call it after :meth:`start` (or :meth:`reinit`): only once
        ``init_transactions`` has fenced an older instance can nothing commit behind
        the cursor read here."""
        n = 0
        for msg in read_to_end(
            self.cfg.kafka,
            [GATEWAY_CURSOR_TOPIC],
            timeout=self.cfg.kafka.timeout_s,
            # a group the gateway's principal may use (its ACLs: shorelink-gateway-*)
            extra={"group.id": f"shorelink-gateway-cursor-{self.cfg.site}"},
        ):
            origin, _, stream = (msg.key() or b"").decode().partition("/")
            holdings.restore_cursor(origin, stream, msg.value() or b"{}")
            h = holdings.get(origin, stream)
            self._committed[(origin, stream)] = SourceHoldings(h.written.copy(), h.abandoned.copy())
            n += 1
        return n

    def start(self) -> None:
        """Create the transactional producer (fences any older gateway of this site) and
        the thread that writes."""
        self._init()
        self._thread = threading.Thread(target=self._run, name="kafka-writer", daemon=True)
        self._thread.start()

    def reinit(self) -> None:
        """After :attr:`broken`: a new producer (``init_transactions`` aborts or
        completes the transaction the old one left). The caller then re-reads the
        cursor (:meth:`restore`) and calls :meth:`resume`."""
        if self.fatal:
            raise KafkaWriteError(self.fatal, fatal=True, fenced=True)
        self._init()

    def resume(self) -> None:
        """The cursor was re-read after :meth:`reinit`: accept writes again."""
        self.broken = None

    def _init(self) -> None:
        try:
            self._txn.init()
        except KafkaClientError as exc:
            raise KafkaWriteError(
                f"cannot init transactions at {self.cfg.kafka.bootstrap}: {exc}"
            ) from exc

    def submit(self, write: Write) -> Future[None]:
        """Queue ``write``; its future completes once Kafka committed it (or raises
        :class:`KafkaWriteError`: then nothing of it is visible)."""
        if self.fatal or self._thread is None:
            write.done.set_exception(
                KafkaWriteError(
                    self.fatal or "writer not started",
                    fatal=bool(self.fatal),
                    fenced=bool(self.fatal),
                )
            )
        else:
            lane = URGENT if write.stream in self.cfg.urgent_streams else BULK
            self._queue.put((lane, next(self._order), write))
        return write.done

    # -- the writer thread ---------------------------------------------------------------
    def _run(self) -> None:
        while True:
            lane, _, item = self._queue.get()
            if item is _STOP:
                return
            assert isinstance(item, Write)
            group, stop = [item], False
            size = len(item.records)
            while size < MAX_GROUP_RECORDS:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more[2] is _STOP:
                    stop = True
                    break
                if more[0] != lane:
                    # an urgent group holds urgent writes only: its transaction is
                    # small and commits in one round trip, instead of carrying every
                    # bulk write waiting behind it (up to MAX_GROUP_RECORDS)
                    self._queue.put(more)
                    break
                assert isinstance(more[2], Write)
                group.append(more[2])
                size += len(more[2].records)
            self._commit_group(group)
            if stop:
                return

    def _commit_group(self, group: list[Write]) -> None:
        if self.fatal or self.broken:
            exc = KafkaWriteError(
                self.fatal or f"Kafka writer recovering: {self.broken}",
                fatal=True,
                fenced=bool(self.fatal),
            )
            for w in group:
                _fail(w, exc)
            return
        staged: dict[tuple[str, str], SourceHoldings] = {}
        taken: list[Write] = []
        for w in group:
            key = (w.origin, w.stream)
            base = staged.get(key) or self._committed.get(key) or SourceHoldings()
            if not base.settled().contains_all(w.depends):
                # an earlier write it built on failed: the ship resends from holdings
                _fail(
                    w,
                    KafkaWriteError(
                        f"an earlier batch of {w.origin}/{w.stream} was not written; resend"
                    ),
                )
                continue
            nxt = SourceHoldings(base.written.copy(), base.abandoned.copy())
            nxt.written.update(w.written)
            nxt.abandoned.update(w.abandoned)
            staged[key] = nxt
            taken.append(w)
        if not taken:
            return
        t0 = time.monotonic()
        try:
            self._transaction(taken, staged)
        except KafkaWriteError as exc:
            for w in taken:
                _fail(w, exc)
            return
        self._committed.update(staged)
        self._on_commit(len(taken), sum(len(w.records) for w in taken), time.monotonic() - t0)
        for w in taken:
            w.done.set_result(None)

    def _transaction(
        self, writes: list[Write], cursors: dict[tuple[str, str], SourceHoldings]
    ) -> None:
        """One transaction; its outcome, the writer's reaction (module docstring)."""
        site = self.cfg.site.encode()
        try:
            with self._txn.transaction() as txn:
                for w in writes:
                    topic = ingress_topic(w.stream)
                    origin, stream = w.origin.encode(), w.stream.encode()
                    # by origin (a merge split by origin): one partition for the batch
                    part = self._partition(topic, w.origin)
                    proofs, base = w.proofs, w.proof_base
                    for r in w.records:
                        headers: Headers = contract_headers(  # type: ignore[assignment]
                            origin, stream, r.seq, r.ts_ms, site, r.topic.encode()
                        )
                        if proofs is not None:
                            headers.append((H_PROOF, proofs[r.seq - base]))
                        txn.produce(topic, r.key.encode(), r.payload, headers, part)
                for (origin_, stream_), h in cursors.items():
                    txn.produce(
                        GATEWAY_CURSOR_TOPIC, ledger_key(origin_, stream_), h.cursor_value()
                    )
        except Fenced as exc:
            self._fenced(exc)
            raise KafkaWriteError(self.fatal or str(exc), fatal=True, fenced=True) from exc
        except CommitUnknown as exc:
            self._break(str(exc))
            raise KafkaWriteError(
                f"Kafka commit outcome unknown: {exc}; the site's holdings will tell",
                fatal=True,
            ) from exc
        except ProducerBroken as exc:
            self._break(str(exc))
            raise KafkaWriteError(f"Kafka write failed: {exc}", fatal=True) from exc
        except TransactionAborted as exc:
            raise KafkaWriteError(f"Kafka write failed, {exc}") from exc

    def _fenced(self, exc: Fenced) -> None:
        if not self.fatal:
            self.fatal = (
                f"fenced: another gateway of site {self.cfg.site} took over "
                f"(transactional.id {self.cfg.transactional_id}); this one no longer "
                f"writes. Keep one gateway per site; restart this one only to make it "
                f"the active one again ({exc})"
            )
            log.error("kafka_fenced", site=self.cfg.site, error=str(exc))

    def _break(self, why: str) -> None:
        if not self.broken and not self.fatal:
            log.error("kafka_producer_broken", error=why)
        self.broken = self.broken or why

    def ping(self) -> bool:
        """Is Kafka reachable (for /readyz)?"""
        return not self.fatal and self._txn.reachable(timeout=2)

    def close(self) -> None:
        """Finish the writes queued so far, then stop the thread and the producer."""
        self._closing.set()
        if self._thread is not None:
            self._queue.put((STOP_LANE, next(self._order), _STOP))
            self._thread.join(self.cfg.kafka.timeout_s * 2)
            self._thread = None
        self._txn.close(5)


def _fail(w: Write, exc: KafkaWriteError) -> None:
    if not w.done.done():
        w.done.set_exception(exc)
