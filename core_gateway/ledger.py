"""Follows the site's ``sl.ledger`` (written by the Spark merge) so the gateway knows
what arrived by replication and ships are not asked to resend it."""

from __future__ import annotations

import threading
import uuid

from confluent_kafka import Message

from core_gateway.holdings import Holdings
from shorelink.contract import LEDGER_TOPIC
from shorelink.errors import ContractError
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.reading import follow_topic
from shorelink.ledger import decode_entry
from shorelink.logs import RateLimitedLog, get_logger

__all__ = ["LedgerFollower"]

log = get_logger(__name__)


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
        try:
            follow_topic(
                self.kafka,
                LEDGER_TOPIC,
                self._take,
                self._stop,
                group=f"shorelink-gateway-ledger-{uuid.uuid4().hex}",
            )
        except Exception:  # the follower must never take the gateway down
            log.exception("ledger_follower_crashed")

    def _take(self, records: list[Message]) -> None:
        for msg in records:
            try:
                origin, stream, held = decode_entry(msg.key(), msg.value())
            except ContractError as exc:
                self._limited.warning("ledger_bad", "ledger_bad_entry", error=str(exc))
                continue
            self.holdings.set_replicated(origin, stream, held)
            self.entries += 1
