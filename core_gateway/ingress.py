"""Writing accepted batches into Kafka exactly once, several batches per transaction.

Choice: Kafka transactions with a cursor. A transaction holds the new records of one or
more batches (to ``sl.ingress.<stream>``, record contract of DESIGN.md) and the updated
cursor of every ``(origin, stream)`` among them (to the compacted
``sl.gateway.cursor``). Either all of it becomes visible to read_committed consumers or
none does, so:
- a gateway killed mid-write leaves an aborted transaction (invisible) and unchanged
  cursors; the ship resends and the batch is written once;
- a batch retried after a lost reply finds its seqs in the cursor and is not rewritten;
- on start-up the cursor topic (read to its end, read_committed) restores exactly what
  was committed.
The transactional.id is per site: a second gateway with the same id fences the first
(its commits fail with a fatal error and it stops), so there is one writer per site.

Kafka's transaction errors are handled the way librdkafka defines them:
- *retriable* (``KafkaError.retriable()``, e.g. ``commit_transaction`` timed out while
  the broker is slow or paused): the same call is retried; the commit goes on in the
  background meanwhile, so aborting then would be wrong (``_CONFLICT``);
- *abortable* (``txn_requires_abort()``): the transaction is aborted, its batches fail
  (503; the ship resends from the holdings);
- *fatal* (``fatal()``): the producer is unusable. Fenced (``_FENCED``,
  ``PRODUCER_FENCED``): another gateway of this site took over; this one stops writing
  for good (:attr:`IngressWriter.fatal`) and never re-initialises by itself, so two
  gateways never fence each other in a loop. Any other fatal error, or a commit whose
  outcome stays unknown: :attr:`IngressWriter.broken`; the service re-creates the
  producer (``init_transactions`` settles the open transaction) and re-reads the
  cursor before it accepts batches again (``GatewayService`` in service.py).

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

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import NoReturn

from confluent_kafka import KafkaError, KafkaException, Producer

from core_gateway.config import GatewayConfig
from core_gateway.errors import KafkaWriteError
from core_gateway.holdings import Holdings, SourceHoldings
from shorelink.contract import GATEWAY_CURSOR_TOPIC, contract_headers, ingress_topic
from shorelink.kafka.reading import Headers, read_to_end
from shorelink.ledger import ledger_key
from shorelink.ranges import RangeSet
from shorelink.kafka.topics import ensure_topics, gateway_cursor_spec, ingress_spec, producer_config
from shorelink.wire import WireRecord

__all__ = ["MAX_GROUP_RECORDS", "IngressWriter", "Write"]

log = logging.getLogger(__name__)

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

    @property
    def seqs(self) -> RangeSet:
        out = self.written.copy()
        out.update(self.abandoned)
        return out


_STOP = object()


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
        self._producer: Producer | None = None
        self._queue: queue.SimpleQueue[Write | object] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        #: committed cursor per (origin, stream): owned by the writer thread after start
        self._committed: dict[tuple[str, str], SourceHoldings] = {}
        #: fenced by another gateway of this site: this one never writes again
        self.fatal: str | None = None
        #: the producer is unusable (not fenced): :meth:`reinit` before writing again
        self.broken: str | None = None
        #: retriable errors retried (commit timeouts, ...), for metrics
        self.retries = 0
        self._closing = threading.Event()

    def ensure_topics(self) -> None:
        # ingress is kept until the merge has committed past it: the merge deletes
        # what it merged (spark_core/merge.py), nothing expires it by time (what a ship
        # was told is held must stay held until it is in the canonical topic)
        specs = [ingress_spec(s, self.cfg.ingress_partitions) for s in self.cfg.streams]
        specs.append(gateway_cursor_spec())
        ensure_topics(
            self.cfg.kafka_bootstrap,
            specs,
            timeout=self.cfg.kafka_timeout_s,
            durability=self.cfg.durability,
            auth=self.cfg.kafka_auth,
        )

    def restore(self, holdings: Holdings) -> int:
        """Load the committed cursors into ``holdings`` (and the writer's own copy);
        returns how many. Call it after :meth:`start` (or :meth:`reinit`): only once
        ``init_transactions`` has fenced an older instance can nothing commit behind
        the cursor read here."""
        n = 0
        for msg in read_to_end(
            self.cfg.kafka_bootstrap,
            [GATEWAY_CURSOR_TOPIC],
            timeout=self.cfg.kafka_timeout_s,
            auth=self.cfg.kafka_auth,
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
        self._producer = self._new_producer()
        self._thread = threading.Thread(target=self._run, name="kafka-writer", daemon=True)
        self._thread.start()

    def reinit(self) -> None:
        """After :attr:`broken`: a new producer (``init_transactions`` aborts or
        completes the transaction the old one left). The caller then re-reads the
        cursor (:meth:`restore`) and calls :meth:`resume`."""
        if self.fatal:
            raise KafkaWriteError(self.fatal, fatal=True, fenced=True)
        self._producer = self._new_producer()

    def resume(self) -> None:
        """The cursor was re-read after :meth:`reinit`: accept writes again."""
        self.broken = None

    def _new_producer(self) -> Producer:
        p = Producer(
            producer_config(
                self.cfg.kafka_bootstrap,
                {
                    "transactional.id": self.cfg.transactional_id,
                    "transaction.timeout.ms": int(self.cfg.kafka_timeout_s * 2000),
                    "linger.ms": 5,
                    "compression.type": "lz4",
                    "queue.buffering.max.messages": 500_000,
                },
                auth=self.cfg.kafka_auth,
            )
        )
        try:
            p.init_transactions(self.cfg.kafka_timeout_s)
        except KafkaException as exc:
            raise KafkaWriteError(
                f"cannot init transactions at {self.cfg.kafka_bootstrap}: {exc}"
            ) from exc
        return p

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
            self._queue.put(write)
        return write.done

    # -- the writer thread ---------------------------------------------------------------
    def _run(self) -> None:
        while True:
            item = self._queue.get()
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
                if more is _STOP:
                    stop = True
                    break
                assert isinstance(more, Write)
                group.append(more)
                size += len(more.records)
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
        p = self._producer
        assert p is not None
        site = self.cfg.site.encode()
        try:
            p.begin_transaction()
            for w in writes:
                topic = ingress_topic(w.stream)
                origin, stream = w.origin.encode(), w.stream.encode()
                for r in w.records:
                    headers: Headers = contract_headers(  # type: ignore[assignment]
                        origin, stream, r.seq, r.ts_ms, site, r.topic.encode()
                    )
                    key = r.key.encode()
                    while True:
                        try:
                            p.produce(topic, value=r.payload, key=key, headers=headers)
                            break
                        except BufferError:
                            p.poll(0.05)  # local queue full (a large transaction): drain
            for (origin_, stream_), h in cursors.items():
                p.produce(
                    GATEWAY_CURSOR_TOPIC, value=h.cursor_value(), key=ledger_key(origin_, stream_)
                )
        except KafkaException as exc:
            self._fail(p, exc)
        self._commit(p)

    def _commit(self, p: Producer) -> None:
        """``commit_transaction``, retried while it fails with a retriable error (a
        timeout: the commit goes on in the background; aborting now would conflict
        with it). After the transaction timeout (the broker aborts it by then) the
        outcome is unknown: the producer is re-created and the cursor re-read."""
        give_up = time.monotonic() + self.cfg.kafka_timeout_s * 3
        while True:
            try:
                p.commit_transaction(self.cfg.kafka_timeout_s)
                return
            except KafkaException as exc:
                err = _error(exc)
                if err is None or not _only_retriable(err):
                    self._fail(p, exc)
                if time.monotonic() > give_up or self._closing.is_set():
                    self._break(f"commit outcome unknown after retries: {err}")
                    raise KafkaWriteError(
                        f"Kafka commit outcome unknown: {err}; the site's holdings will tell",
                        fatal=True,
                    ) from exc
                self.retries += 1
                log.warning("event=kafka_commit_retry error=%r", str(err))

    def _fail(self, p: Producer, exc: KafkaException) -> NoReturn:
        """Handle a failed transaction call (not a retriable commit): abort if Kafka
        allows it, else mark the writer fenced or broken. Always raises."""
        err = _error(exc)
        if err is not None and err.fatal():
            self._fatal(err)
            raise KafkaWriteError(
                self.fatal or f"Kafka producer fatal error: {err}",
                fatal=True,
                fenced=bool(self.fatal),
            ) from exc
        self._abort(p)
        if self.fatal or self.broken:
            raise KafkaWriteError(
                self.fatal or f"Kafka write failed: {exc}; {self.broken}",
                fatal=True,
                fenced=bool(self.fatal),
            ) from exc
        raise KafkaWriteError(f"Kafka write failed, transaction aborted: {exc}") from exc

    def _abort(self, p: Producer) -> None:
        """``abort_transaction``, retried while retriable; a fatal error marks the
        writer fenced or broken (``init_transactions`` aborts the transaction then)."""
        give_up = time.monotonic() + self.cfg.kafka_timeout_s * 3
        while True:
            try:
                p.abort_transaction(self.cfg.kafka_timeout_s)
                return
            except KafkaException as exc:
                err = _error(exc)
                if err is not None and err.fatal():
                    self._fatal(err)
                    return
                if (
                    err is None
                    or not err.retriable()
                    or time.monotonic() > give_up
                    or self._closing.is_set()
                ):
                    self._break(f"cannot abort transaction: {exc}")
                    return
                self.retries += 1
                log.warning("event=kafka_abort_retry error=%r", str(err))

    def _fatal(self, err: KafkaError) -> None:
        if err.code() in _FENCED:
            if not self.fatal:
                self.fatal = (
                    f"fenced: another gateway of site {self.cfg.site} took over "
                    f"(transactional.id {self.cfg.transactional_id}); this one no longer "
                    f"writes. Keep one gateway per site; restart this one only to make it "
                    f"the active one again ({err})"
                )
                log.error("event=kafka_fenced site=%s error=%r", self.cfg.site, str(err))
        else:
            self._break(f"Kafka producer fatal error: {err}")

    def _break(self, why: str) -> None:
        if not self.broken and not self.fatal:
            log.error("event=kafka_producer_broken error=%r", why)
        self.broken = self.broken or why

    def ping(self) -> bool:
        """Is Kafka reachable (for /readyz)?"""
        p = self._producer
        if p is None or self.fatal:
            return False
        try:
            p.list_topics(timeout=2)
        except KafkaException:
            return False
        return True

    def close(self) -> None:
        """Finish the writes queued so far, then stop the thread and the producer."""
        self._closing.set()
        if self._thread is not None:
            self._queue.put(_STOP)
            self._thread.join(self.cfg.kafka_timeout_s * 2)
            self._thread = None
        if self._producer is not None:
            self._producer.flush(5)
            self._producer = None


#: fatal errors that mean another producer with our transactional.id took over
_FENCED = (KafkaError._FENCED, KafkaError.PRODUCER_FENCED)


def _error(exc: KafkaException) -> KafkaError | None:
    return exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None


def _only_retriable(err: KafkaError) -> bool:
    """Retry the same call (neither abortable nor fatal)."""
    return bool(err.retriable()) and not err.fatal() and not err.txn_requires_abort()


def _fail(w: Write, exc: KafkaWriteError) -> None:
    if not w.done.done():
        w.done.set_exception(exc)
