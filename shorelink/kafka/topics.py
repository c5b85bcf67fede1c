"""Creating topics on purpose, with the durability and size limits every hop shares.

Every stack broker runs with ``auto.create.topics.enable=false``, as production should:
whoever writes a topic creates it first with the partitions and retention it needs, by
calling :func:`ensure_topics`. Creating a topic that exists is not an error.

Durability is a site's setting (:class:`Durability`: the gateway's ``[kafka]`` and each
site's ``[sites.NAME.kafka]`` in sites.toml). Its defaults are right for a production
cluster of three or more brokers (replication factor 3, ``min.insync.replicas`` 2) and
shrink to what a smaller cluster can hold (a one-broker local stack: 1 and 1), with a
warning, so a development stack needs no setting and a production cluster no care.
Every producer writes with ``acks=all`` (:func:`producer_config`; :func:`producer`
builds a plain one, :class:`~shorelink.kafka.transactions.TransactionalProducer` a
transactional one), so a record is acknowledged only once ``min.insync.replicas``
brokers have it.

Every topic gets ``max.message.bytes`` = :data:`~shorelink.contract.KAFKA_MAX_MESSAGE_BYTES`,
whatever the broker's default (1 MiB), so a record of
:data:`~shorelink.contract.MAX_RECORD_BYTES` fits every hop.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic

from shorelink.config import Section, key, read
from shorelink.contract import GATEWAY_CURSOR_TOPIC, KAFKA_MAX_MESSAGE_BYTES, ingress_topic
from shorelink.errors import ConfigError
from shorelink.kafka.admin import Admin
from shorelink.kafka.auth import AuthWatch
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.errors import KafkaClientError, TopicExists
from shorelink.logs import get_logger

__all__ = [
    "Durability",
    "PlainProducer",
    "TopicError",
    "TopicSpec",
    "ensure_topics",
    "gateway_cursor_spec",
    "ingress_spec",
    "producer",
    "producer_config",
    "segment_ms",
]

log = get_logger(__name__)

#: replicas per partition in a production cluster (three brokers or more)
PRODUCTION_REPLICATION_FACTOR = 3
#: of which must have a record before it is acknowledged
PRODUCTION_MIN_INSYNC = 2


class TopicError(KafkaClientError):
    """A topic could not be created or checked (in the Kafka error tree: a caller of
    :func:`ensure_topics` catches it with every other Kafka client failure)."""

    retryable = True


@dataclass(frozen=True)
class Durability:
    """How many brokers hold each partition of the topics a site creates.

    ``None`` is "as production wants, as far as the cluster allows": a replication
    factor of ``min(3, brokers)`` and ``min.insync.replicas`` of ``min(2, factor)``."""

    replication_factor: int | None = field(default=None, metadata=key(min=1, max=16))
    min_insync_replicas: int | None = field(default=None, metadata=key(min=1, max=16))

    @classmethod
    def from_section(cls, kafka: Section) -> Durability:
        """``replication_factor`` and ``min_insync_replicas`` of a ``[kafka]`` table
        (each left out: as production wants, as far as the cluster allows); the table's
        other keys are its owner's."""
        d = read(cls, kafka, done=False)
        rf, isr = d.replication_factor, d.min_insync_replicas
        if rf and isr and isr > rf:
            raise ConfigError(
                kafka.field("min_insync_replicas"), f"{isr} > replication_factor {rf}"
            )
        return d

    def resolve(self, brokers: int) -> tuple[int, int]:
        """(replication factor, min.insync.replicas) for a cluster of ``brokers``."""
        if brokers == 0:
            raise TopicError(
                "no broker of this Kafka cluster is available (starting, or fenced)",
                retryable=True,
            )
        rf = self.replication_factor or min(PRODUCTION_REPLICATION_FACTOR, brokers)
        if rf > brokers:
            raise TopicError(
                f"replication_factor {rf} > the {brokers} broker(s) of this Kafka cluster",
                retryable=False,
            )
        isr = self.min_insync_replicas or min(PRODUCTION_MIN_INSYNC, rf)
        if isr > rf:
            raise TopicError(
                f"min_insync_replicas {isr} > replication_factor {rf}", retryable=False
            )
        return rf, isr


#: a time-bounded topic's segments roll at an eighth of its retention, between a minute
#: and a day: Kafka deletes a whole segment once its newest record is past retention, so
#: with the broker's default (7 days) a relay kept 3 days held about 10, and its
#: partitions were cut days apart (replication review N14, which fed N3)
SEGMENT_MS_MIN, SEGMENT_MS_MAX = 60_000, 24 * 3600 * 1000


#: a compacted topic's segments roll hourly: the active segment is never compacted, so
#: with the broker's default (7 days or 1 GiB) a merge's marker and ledger, rewritten in
#: every transaction, kept days of stale copies that every load read (review N9)
COMPACTED_SEGMENT_MS = 3600 * 1000


def segment_ms(retention_ms: int) -> int:
    """``segment.ms`` for a topic kept ``retention_ms``: what is kept past its
    retention is at most an eighth of it (or a day)."""
    return max(SEGMENT_MS_MIN, min(retention_ms // 8, SEGMENT_MS_MAX))


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int = 1
    #: ``None`` keeps the broker default; ``-1`` keeps forever.
    retention_ms: int | None = None
    compacted: bool = False
    config: dict[str, str] = field(default_factory=dict)

    def topic_config(self, min_insync: int = 1) -> dict[str, str]:
        """The topic-level configs this spec sets (``retention.ms`` only when it has a
        retention; ``cleanup.policy`` only when compacted): what a new topic gets, and
        what ``shorelink-spark topics apply`` compares an existing one against."""
        cfg = {
            "max.message.bytes": str(KAFKA_MAX_MESSAGE_BYTES),
            "min.insync.replicas": str(min_insync),
            **self.config,
        }
        if self.retention_ms is not None:
            cfg["retention.ms"] = str(self.retention_ms)
            if self.retention_ms > 0 and not self.compacted:
                cfg.setdefault("segment.ms", str(segment_ms(self.retention_ms)))
        if self.compacted:
            cfg["cleanup.policy"] = "compact"
            cfg.setdefault("segment.ms", str(COMPACTED_SEGMENT_MS))
        return cfg

    def new_topic(self, replication_factor: int = 1, min_insync: int = 1) -> NewTopic:
        return NewTopic(
            self.name,
            num_partitions=self.partitions,
            replication_factor=replication_factor,
            config=self.topic_config(min_insync),
        )


def ingress_spec(stream: str, partitions: int) -> TopicSpec:
    """``sl.ingress.<stream>``, written by a site's gateway(s): no time retention, only
    the merge deletes from it, below what it committed (what a ship was told is held
    stays held until it is in the canonical topic)."""
    return TopicSpec(ingress_topic(stream), partitions=partitions, retention_ms=-1)


def gateway_cursor_spec() -> TopicSpec:
    """:data:`~shorelink.contract.GATEWAY_CURSOR_TOPIC`: compacted, one partition."""
    return TopicSpec(GATEWAY_CURSOR_TOPIC, partitions=1, compacted=True)


def producer_config(kafka: KafkaEndpoint, extra: dict[str, object] | None = None) -> dict[str, Any]:
    """What every shorelink producer sets: the cluster and how to authenticate there,
    ``acks=all`` (a record is acknowledged once ``min.insync.replicas`` brokers hold
    it) and the size limit of every hop; ``extra`` adds the rest (``transactional.id``)."""
    return {
        **kafka.client_config(),
        "acks": "all",
        "message.max.bytes": KAFKA_MAX_MESSAGE_BYTES,
        **(extra or {}),
    }


#: what :func:`producer` returns, for annotations (build one with :func:`producer`)
PlainProducer = Producer


def producer(kafka: KafkaEndpoint, extra: dict[str, object] | None = None) -> Producer:
    """A plain (not transactional) producer at ``kafka`` with :func:`producer_config`:
    the only way a producer is made outside shorelink/kafka/ (ruff's banned-API rule,
    pyproject.toml), so none is built from a bare ``bootstrap.servers``."""
    return Producer(producer_config(kafka, extra))


def ensure_topics(
    kafka: KafkaEndpoint, specs: Iterable[TopicSpec], durability: Durability | None = None
) -> list[str]:
    """Create the topics that do not exist yet at ``kafka`` (each step within its
    timeout); return the names that were created."""
    specs = list(specs)
    if not specs:
        return []
    bootstrap, timeout = kafka.bootstrap, kafka.timeout_s
    watch = AuthWatch()
    admin = Admin(kafka, {"error_cb": watch})
    deadline = time.monotonic() + timeout
    while True:
        try:
            md = admin.metadata()
        except KafkaClientError as exc:
            watch.check(admin.client, f"Kafka at {bootstrap} refused {kafka.auth}")
            raise TopicError(
                f"cannot list topics at {bootstrap}: {exc}", code=exc.code, retryable=exc.retryable
            ) from exc
        # no broker in the answer: the one asked is starting, or fenced a moment (a
        # heartbeat to its controller missed on a busy machine; CI met it): asked again
        # within the timeout, as a cluster of none is never what it is
        if md.brokers or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    existing = set(md.topics)
    todo = [s for s in specs if s.name not in existing]
    created: list[str] = []
    if not todo:
        return created
    rf, isr = (durability or Durability()).resolve(len(md.brokers))
    if rf < PRODUCTION_REPLICATION_FACTOR:
        log.warning(
            "topics_under_replicated",
            bootstrap=bootstrap,
            brokers=len(md.brokers),
            replication_factor=rf,
            min_insync_replicas=isr,
            message=f"production wants {PRODUCTION_REPLICATION_FACTOR} and {PRODUCTION_MIN_INSYNC}",
        )
    futures = admin.client.create_topics(
        [s.new_topic(rf, isr) for s in todo], operation_timeout=timeout
    )
    for name, fut in futures.items():
        try:
            admin.wait(fut, f"cannot create topic {name} at {bootstrap}")
        except TopicExists:
            continue  # created meanwhile (another client, or an earlier call timed out)
        except KafkaClientError as exc:
            # retryable whatever the broker said: a create refused now may be granted
            # later (``access apply``), and a writer waits for its topics
            raise TopicError(str(exc), code=exc.code) from exc
        created.append(name)
        log.info("topic_created", topic=name, bootstrap=bootstrap)
    _await_visible(admin, [s.name for s in todo], timeout)
    return created


def _await_visible(admin: Admin, names: list[str], timeout: float) -> None:
    """Until the broker's metadata shows each of ``names`` with a leader for every
    partition: a created topic is known to the controller first and to the brokers a
    moment later (longer on a loaded machine), and a reader that comes in between is
    told the topic does not exist. Past ``timeout`` the caller goes on and its own
    reads say what is missing."""
    deadline = time.monotonic() + timeout
    pending = set(names)
    while pending and time.monotonic() < deadline:
        with contextlib.suppress(KafkaClientError):
            topics = admin.metadata(timeout=max(0.1, deadline - time.monotonic())).topics
            pending = {n for n in pending if not _led(topics.get(n))}
        if pending:
            time.sleep(0.05)


def _led(tmd: Any) -> bool:
    return (
        tmd is not None
        and tmd.error is None
        and bool(tmd.partitions)
        and all(p.leader >= 0 for p in tmd.partitions.values())
    )
