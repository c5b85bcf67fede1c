"""Follows the site's ``sl.ledger`` (written by the Spark merge) so the gateway knows
what arrived by replication and ships are not asked to resend it."""

from __future__ import annotations

import logging
import threading
import uuid

from confluent_kafka import Consumer, KafkaError, TopicPartition

from core_gateway.holdings import Holdings
from shorelink.contract import LEDGER_TOPIC
from shorelink.errors import ContractError
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.errors import KafkaClientError, kafka_errors
from shorelink.ledger import decode_entry
from shorelink.logs import RateLimitedLog

__all__ = ["LedgerFollower"]

log = logging.getLogger(__name__)


class LedgerFollower:
    def __init__(self, kafka: KafkaEndpoint, holdings: Holdings) -> None:
        self.kafka = kafka
        self.holdings = holdings
        self.entries = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ledger", daemon=True)
        self._limited = RateLimitedLog(log)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def _run(self) -> None:
        consumer = Consumer(
            {
                **self.kafka.client_config(),
                "group.id": f"shorelink-gateway-ledger-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
            }
        )
        assigned = False
        try:
            while not self._stop.is_set():
                if not assigned:
                    try:
                        with kafka_errors():
                            md = consumer.list_topics(timeout=5)
                            t = md.topics.get(LEDGER_TOPIC)
                            if t is not None and t.error is None:
                                consumer.assign(
                                    [TopicPartition(LEDGER_TOPIC, p, 0) for p in t.partitions]
                                )
                                assigned = True
                    except KafkaClientError as exc:  # Kafka away: the next look may find it
                        self._limited.warning("ledger", "event=ledger_error error=%r", str(exc))
                    if not assigned:
                        self._stop.wait(2)  # the merge creates it; wait for it to exist
                        continue
                for msg in consumer.consume(500, timeout=0.5):
                    err = msg.error()
                    if err is not None:
                        if err.code() != KafkaError._PARTITION_EOF:
                            self._limited.warning("ledger", "event=ledger_error error=%r", str(err))
                        continue
                    try:
                        origin, stream, held = decode_entry(msg.key(), msg.value())
                    except ContractError as exc:
                        self._limited.warning(
                            "ledger_bad", "event=ledger_bad_entry error=%r", str(exc)
                        )
                        continue
                    self.holdings.set_replicated(origin, stream, held)
                    self.entries += 1
        except Exception:  # the follower must never take the gateway down
            log.exception("event=ledger_follower_crashed")
        finally:
            consumer.close()
