"""Writing accepted batches into Kafka exactly once.

Choice: Kafka transactions with a cursor. Each batch is one transaction holding its new
records (to ``sl.ingress.<stream>``, record contract of DESIGN.md) and the updated
cursor of its ``(origin, stream)`` (to the compacted ``sl.gateway.cursor``). Either both
become visible to read_committed consumers or neither does, so:
- a gateway killed mid-write leaves an aborted transaction (invisible) and an unchanged
  cursor; the ship resends and the batch is written once;
- a batch retried after a lost reply finds its seqs in the cursor and is not rewritten;
- on start-up the cursor topic (read to its end, read_committed) restores exactly what
  was committed.
The transactional.id is per site: a second gateway with the same id fences the first
(its commits fail with a fatal error and it stops), so there is one writer per site.

An idempotent producer alone would not do: it removes duplicates from producer retries
within one session, not from a gateway restart or a ship's resend.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from confluent_kafka import KafkaError, KafkaException, Producer

from core_gateway.config import GatewayConfig
from core_gateway.errors import KafkaWriteError
from core_gateway.holdings import Holdings
from shorelink.contract import GATEWAY_CURSOR_TOPIC, Record, ingress_topic
from shorelink.identity import Identity
from shorelink.kafka_io import produce, read_to_end
from shorelink.ledger import ledger_key
from shorelink.topics import TopicSpec, ensure_topics
from shorelink.wire import WireRecord

__all__ = ["KafkaWriter"]

log = logging.getLogger(__name__)


class KafkaWriter:
    def __init__(self, cfg: GatewayConfig) -> None:
        self.cfg = cfg
        self._lock = threading.Lock()  # one transaction at a time
        self._producer: Producer | None = None
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
        """Load the committed cursors into ``holdings``; returns how many."""
        n = 0
        for msg in read_to_end(
            self.cfg.kafka_bootstrap, [GATEWAY_CURSOR_TOPIC], timeout=self.cfg.kafka_timeout_s
        ):
            origin, _, stream = (msg.key() or b"").decode().partition("/")
            holdings.restore_cursor(origin, stream, msg.value() or b"{}")
            n += 1
        return n

    def start(self) -> None:
        """Create the transactional producer; fences any older gateway of this site."""
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

    def write(self, origin: str, stream: str, records: Sequence[WireRecord], cursor: bytes) -> None:
        """Write ``records`` and the new ``cursor`` of ``(origin, stream)`` in one
        transaction. Blocking (run it in a thread). Raises KafkaWriteError; then nothing
        of the batch is visible."""
        p = self._producer
        if p is None or self.fatal:
            raise KafkaWriteError(self.fatal or "writer not started", fatal=bool(self.fatal))
        topic = ingress_topic(stream)
        site = self.cfg.site
        t = self.cfg.kafka_timeout_s
        with self._lock:
            try:
                p.begin_transaction()
                for r in records:
                    rec = Record(
                        Identity(origin, stream, r.seq),
                        r.key.encode(),
                        r.payload,
                        r.ts_ms,
                        site,
                        r.topic,
                    )
                    produce(p, topic, rec.key, rec.value, list(rec.headers()))
                produce(p, GATEWAY_CURSOR_TOPIC, ledger_key(origin, stream), cursor, None)
                p.commit_transaction(t)
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
        if self._producer is not None:
            self._producer.flush(5)
            self._producer = None
