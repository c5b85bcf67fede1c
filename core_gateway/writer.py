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

from confluent_kafka import KafkaError, KafkaException, Producer

from core_gateway.config import GatewayConfig
from core_gateway.errors import KafkaWriteError
from core_gateway.holdings import Holdings, SourceHoldings
from shorelink.contract import GATEWAY_CURSOR_TOPIC, contract_headers, ingress_topic
from shorelink.kafka_io import Headers, read_to_end
from shorelink.ledger import ledger_key
from shorelink.ranges import RangeSet
from shorelink.topics import TopicSpec, ensure_topics
from shorelink.wire import WireRecord

__all__ = ["MAX_GROUP_RECORDS", "KafkaWriter", "Write"]

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


class KafkaWriter:
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
        self.fatal: str | None = None

    def ensure_topics(self) -> None:
        specs = [
            TopicSpec(
                ingress_topic(s),
                partitions=self.cfg.ingress_partitions,
                retention_ms=self.cfg.ingress_retention_ms,
            )
            for s in self.cfg.streams
        ]
        specs.append(TopicSpec(GATEWAY_CURSOR_TOPIC, partitions=1, compacted=True))
        ensure_topics(self.cfg.kafka_bootstrap, specs, timeout=self.cfg.kafka_timeout_s)

    def restore(self, holdings: Holdings) -> int:
        """Load the committed cursors into ``holdings`` (and the writer's own copy);
        returns how many."""
        n = 0
        for msg in read_to_end(
            self.cfg.kafka_bootstrap, [GATEWAY_CURSOR_TOPIC], timeout=self.cfg.kafka_timeout_s
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
        p = Producer(
            {
                "bootstrap.servers": self.cfg.kafka_bootstrap,
                "transactional.id": self.cfg.transactional_id,
                "transaction.timeout.ms": int(self.cfg.kafka_timeout_s * 2000),
                "linger.ms": 5,
                "compression.type": "lz4",
                "message.max.bytes": 8 * 1024 * 1024,
                "queue.buffering.max.messages": 500_000,
            }
        )
        try:
            p.init_transactions(self.cfg.kafka_timeout_s)
        except KafkaException as exc:
            raise KafkaWriteError(
                f"cannot init transactions at {self.cfg.kafka_bootstrap}: {exc}"
            ) from exc
        self._producer = p
        self._thread = threading.Thread(target=self._run, name="kafka-writer", daemon=True)
        self._thread.start()

    def submit(self, write: Write) -> Future[None]:
        """Queue ``write``; its future completes once Kafka committed it (or raises
        :class:`KafkaWriteError`: then nothing of it is visible)."""
        if self.fatal or self._thread is None:
            write.done.set_exception(
                KafkaWriteError(self.fatal or "writer not started", fatal=bool(self.fatal))
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
        if self.fatal:
            for w in group:
                _fail(w, KafkaWriteError(self.fatal, fatal=True))
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
            p.commit_transaction(self.cfg.kafka_timeout_s)
        except KafkaException as exc:
            self._fail(p, exc)

    def _fail(self, p: Producer, exc: KafkaException) -> None:
        err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
        if err is not None and err.fatal():
            self.fatal = (
                f"Kafka producer fatal error (fenced by another gateway of this site?): {err}"
            )
            log.error("event=kafka_fatal error=%r", str(err))
            raise KafkaWriteError(self.fatal, fatal=True) from exc
        try:
            p.abort_transaction(self.cfg.kafka_timeout_s)
        except KafkaException as abort_exc:
            self.fatal = f"cannot abort transaction: {abort_exc}"
            raise KafkaWriteError(self.fatal, fatal=True) from exc
        raise KafkaWriteError(f"Kafka write failed, transaction aborted: {exc}") from exc

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
        if self._thread is not None:
            self._queue.put(_STOP)
            self._thread.join(self.cfg.kafka_timeout_s * 2)
            self._thread = None
        if self._producer is not None:
            self._producer.flush(5)
            self._producer = None


def _fail(w: Write, exc: KafkaWriteError) -> None:
    if not w.done.done():
        w.done.set_exception(exc)
