"""Creating topics on purpose.

Every stack broker runs with ``auto.create.topics.enable=false``, as production should:
whoever writes a topic creates it first with the partitions and retention it needs, by
calling :func:`ensure_topics`. Creating a topic that exists is not an error.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from shorelink.errors import ShorelinkError

__all__ = ["TopicError", "TopicSpec", "ensure_topics"]

log = logging.getLogger(__name__)


class TopicError(ShorelinkError):
    """A topic could not be created or checked."""

    retryable = True


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int = 1
    #: ``None`` keeps the broker default; ``-1`` keeps forever.
    retention_ms: int | None = None
    compacted: bool = False
    config: dict[str, str] = field(default_factory=dict)

    def new_topic(self) -> NewTopic:
        cfg = dict(self.config)
        if self.retention_ms is not None:
            cfg["retention.ms"] = str(self.retention_ms)
        if self.compacted:
            cfg["cleanup.policy"] = "compact"
        return NewTopic(self.name, num_partitions=self.partitions, replication_factor=1, config=cfg)


def ensure_topics(bootstrap: str, specs: Iterable[TopicSpec], timeout: float = 30.0) -> list[str]:
    """Create the topics that do not exist yet; return the names that were created."""
    specs = list(specs)
    if not specs:
        return []
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        existing = set(admin.list_topics(timeout=timeout).topics)
    except KafkaException as exc:
        raise TopicError(f"cannot list topics at {bootstrap}: {exc}") from exc
    todo = [s for s in specs if s.name not in existing]
    created: list[str] = []
    if not todo:
        return created
    futures = admin.create_topics([s.new_topic() for s in todo], operation_timeout=timeout)
    for name, fut in futures.items():
        try:
            fut.result(timeout=timeout)
            created.append(name)
            log.info("event=topic_created topic=%s bootstrap=%s", name, bootstrap)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                continue
            raise TopicError(f"cannot create topic {name} at {bootstrap}: {exc}") from exc
    return created
