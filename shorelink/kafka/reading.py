"""Small Kafka helpers shared by the deployables, tools and tests."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator

from confluent_kafka import (
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka.admin import OffsetSpec

from shorelink.kafka.admin import Admin
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.errors import classify, kafka_errors

__all__ = ["Headers", "read_to_end", "written_ms"]

Headers = list[tuple[str, str | bytes | None]]


def written_ms(msg: Message) -> int | None:
    """A record's Kafka timestamp (epoch ms), None when it has none."""
    kind, ms = msg.timestamp()  # kind 0: TIMESTAMP_NOT_AVAILABLE
    return ms if kind else None


def read_to_end(
    kafka: KafkaEndpoint,
    topics: Iterable[str],
    *,
    isolation: str = "read_committed",
    timeout: float = 60.0,
    extra: dict[str, object] | None = None,
    settled: bool = False,
) -> Iterator[Message]:
    """Yield every message of ``topics`` at ``kafka`` from the beginning up to their
    current end (the last stable offset under read_committed), then stop.

    ``settled``: up to the high watermark each partition had when the read began, that
    is, until every transaction written before the read is committed or aborted. A
    producer's commit returns before the broker has written its markers to each
    partition, so a plain read_committed read right after a commit can end at an
    older last stable offset and miss a partition's part of it (a test read so once).
    A transaction left open then costs the read its ``timeout``.

    Uses partition EOF events, so it needs no consumer group and never waits on an idle
    poll. Raises :class:`~shorelink.kafka.errors.KafkaClientError` on a consumer error
    (:class:`~shorelink.kafka.errors.UnknownTopic` for a topic that does not exist), or
    :class:`~shorelink.kafka.errors.KafkaUnavailable` if the end is not reached within
    ``timeout`` seconds.
    """
    topics = list(topics)
    with kafka_errors(f"reading {', '.join(topics)} at {kafka.bootstrap}"):
        yield from _read_to_end(kafka, topics, isolation, timeout, extra, settled)


def _read_to_end(
    kafka: KafkaEndpoint,
    topics: list[str],
    isolation: str,
    timeout: float,
    extra: dict[str, object] | None,
    settled: bool,
) -> Iterator[Message]:
    conf: dict[str, object] = {
        **kafka.client_config(),
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
        deadline = time.monotonic() + timeout
        ends = (
            _high_watermarks(kafka, parts, deadline) if settled else dict.fromkeys(_keys(parts), 0)
        )
        consumer.assign(parts)
        pending = set(ends)
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
                    tp = (msg.topic() or "", msg.partition() or 0)
                    if (msg.offset() or 0) >= ends[tp]:
                        pending.discard(tp)
                else:
                    raise KafkaException(err)
    finally:
        consumer.close()


def _keys(parts: list[TopicPartition]) -> list[tuple[str, int]]:
    return [(p.topic, p.partition) for p in parts]


def _high_watermarks(
    kafka: KafkaEndpoint, parts: list[TopicPartition], deadline: float
) -> dict[tuple[str, int], int]:
    """Each partition's high watermark (a read_committed consumer is told the last
    stable offset instead: asked as read_uncommitted), by the admin client, which finds
    a partition's new leader itself (a consumer's watermark request kept asking a
    broker that had lost it for a minute after a broker was killed), asked again while
    the answer is a retriable error and ``deadline`` is not past."""
    admin = Admin(kafka).client
    while True:
        found = admin.list_offsets(
            {p: OffsetSpec.latest() for p in parts},
            isolation_level=IsolationLevel.READ_UNCOMMITTED,
            request_timeout=max(1.0, min(10.0, deadline - time.monotonic())),
        )
        try:
            return {(tp.topic, tp.partition): f.result().offset for tp, f in found.items()}
        except KafkaException as exc:
            if not classify(exc).retryable or time.monotonic() > deadline:
                raise
            time.sleep(0.1)
