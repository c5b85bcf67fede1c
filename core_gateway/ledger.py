"""Follows the site's ``sl.ledger`` (written by the Spark merge) so the gateway knows
what arrived by replication and ships are not asked to resend it."""

from __future__ import annotations

import threading
import uuid

from core_gateway.holdings import Holdings
from shorelink.contract import LEDGER_TOPIC
from shorelink.errors import ContractError
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.errors import KafkaClientError
from shorelink.kafka.reading import BEGINNING, PartitionReader
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
        reader = PartitionReader(
            self.kafka,
            group=f"shorelink-gateway-ledger-{uuid.uuid4().hex}",
            what=f"{LEDGER_TOPIC} at {self.kafka.bootstrap}",
        )
        assigned = False
        try:
            while not self._stop.is_set():
                if not assigned:
                    try:
                        parts = reader.partitions([LEDGER_TOPIC], timeout=5).get(LEDGER_TOPIC)
                        if parts is not None:
                            reader.assign({(LEDGER_TOPIC, p): BEGINNING for p in parts})
                            assigned = True
                    except KafkaClientError as exc:  # Kafka away: the next look may find it
                        self._limited.warning("ledger", "ledger_error", error=str(exc))
                    if not assigned:
                        self._stop.wait(2)  # the merge creates it; wait for it to exist
                        continue
                got = reader.poll(500, timeout=0.5)
                for problem in [*got.errors, *got.gaps]:
                    self._limited.warning("ledger", "ledger_error", error=str(problem))
                for msg in got.records:
                    try:
                        origin, stream, held = decode_entry(msg.key(), msg.value())
                    except ContractError as exc:
                        self._limited.warning("ledger_bad", "ledger_bad_entry", error=str(exc))
                        continue
                    self.holdings.set_replicated(origin, stream, held)
                    self.entries += 1
        except Exception:  # the follower must never take the gateway down
            log.exception("ledger_follower_crashed")
        finally:
            reader.close()
