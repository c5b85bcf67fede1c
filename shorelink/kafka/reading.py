"""Small Kafka helpers shared by the deployables, tools and tests."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from shorelink.kafka.auth import KafkaAuth, client_config

__all__ = ["Headers", "produce", "read_to_end"]

Headers = list[tuple[str, str | bytes | None]]


def read_to_end(
    bootstrap: str,
    topics: Iterable[str],
    *,
    isolation: str = "read_committed",
    timeout: float = 60.0,
    extra: dict[str, object] | None = None,
    auth: KafkaAuth | None = None,
) -> Iterator[Message]:
    """Yield every message of ``topics`` from the beginning up to their current end
    (the last stable offset under read_committed), then stop.

    Uses partition EOF events, so it needs no consumer group and never waits on an idle
    poll. Raises ``KafkaException`` on a consumer error or if the end is not reached
    within ``timeout`` seconds.
    """
    conf: dict[str, object] = {
        **client_config(bootstrap, auth),
        "group.id": "shorelink-read-to-end",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "isolation.level": isolation,
        "auto.offset.reset": "earliest",
    }
    conf.update(extra or {})
    consumer = Consumer(conf)
    try:
        md = consumer.list_topics(timeout=10)
        parts: list[TopicPartition] = []
        for t in topics:
            tmd = md.topics.get(t)
            if tmd is None or tmd.error is not None:
                raise KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART, f"no topic {t}"))
            parts += [TopicPartition(t, p, 0) for p in sorted(tmd.partitions)]
        if not parts:
            return
        consumer.assign(parts)
        pending = {(p.topic, p.partition) for p in parts}
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise KafkaException(
                    KafkaError(KafkaError._TIMED_OUT, f"end not reached: {sorted(pending)}")
                )
            # a short wait: a small topic must not cost half a second per read
            for msg in consumer.consume(500, timeout=0.05):
                err = msg.error()
                if err is None:
                    yield msg
                elif err.code() == KafkaError._PARTITION_EOF:
                    pending.discard((msg.topic(), msg.partition()))
                else:
                    raise KafkaException(err)
    finally:
        consumer.close()


def produce(
    p: Producer, topic: str, key: bytes | None, value: bytes | None, headers: Headers | None = None
) -> None:
    """``p.produce`` that waits for room when the producer's local queue is full
    (a large transaction can outgrow it) instead of failing."""
    while True:
        try:
            p.produce(topic, value=value, key=key, headers=headers)
            return
        except BufferError:
            p.poll(0.05)  # local queue full: let it drain
