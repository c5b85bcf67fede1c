"""Follows the site's ``sl.ledger`` (written by the Spark merge) so the gateway knows
what arrived by replication and ships are not asked to resend it."""

from __future__ import annotations

from confluent_kafka import Message

from core_gateway.holdings import Holdings
from shorelink.contract import LEDGER_TOPIC
from shorelink.errors import ContractError
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.reading import TopicFollower
from shorelink.ledger import decode_entry
from shorelink.logs import RateLimitedLog, get_logger

__all__ = ["LedgerFollower"]

log = get_logger(__name__)


class LedgerFollower(TopicFollower):
    def __init__(self, kafka: KafkaEndpoint, holdings: Holdings) -> None:
        super().__init__(kafka, LEDGER_TOPIC, "gateway-ledger")
        self.holdings = holdings
        self.entries = 0
        self._limited = RateLimitedLog(log)

    def take(self, records: list[Message]) -> None:
        for msg in records:
            try:
                origin, stream, held = decode_entry(msg.key(), msg.value())
            except ContractError as exc:
                self._limited.warning("ledger_bad", "ledger_bad_entry", error=str(exc))
                continue
            self.holdings.set_replicated(origin, stream, held)
            self.entries += 1
