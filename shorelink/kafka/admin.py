"""A site's Kafka admin client whose every answer is the kernel's error tree.

confluent-kafka's ``AdminClient`` fails in two ways a caller would otherwise classify
by hand: a call raises ``KafkaException`` (``list_topics``), and most calls answer with
futures, one per resource, each of which fails with a ``KafkaException`` or, waited for
too long, with ``TimeoutError``. :class:`Admin` takes both to the tree
(:mod:`shorelink.kafka.errors`): :meth:`~Admin.metadata` and :meth:`~Admin.wait` raise
:class:`~shorelink.kafka.errors.KafkaClientError` (a future not answered in time is
:class:`~shorelink.kafka.errors.KafkaUnavailable`), so callers catch the tree's types
and read ``retryable`` from them. The requests themselves go to :attr:`Admin.client`
(their futures through :meth:`~Admin.wait`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable
from concurrent.futures import Future
from typing import Any, TypeVar

from confluent_kafka import IsolationLevel, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, ClusterMetadata, OffsetSpec

from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.errors import LEADER_MOVING, KafkaUnavailable, UnknownTopic, kafka_errors

__all__ = ["Admin"]

T = TypeVar("T")

#: how long :meth:`Admin.offsets` waits before it asks a partition whose leader was
#: moving again (librdkafka refreshes its metadata meanwhile)
LEADER_MOVING_WAIT_S = 0.2


class Admin:
    """An ``AdminClient`` of the Kafka ``kafka`` reaches (as its principal); ``extra``
    adds client settings (``error_cb``, ``logger``, ``socket.timeout.ms``). Each call
    waits up to the endpoint's timeout unless told otherwise."""

    def __init__(self, kafka: KafkaEndpoint, extra: dict[str, object] | None = None) -> None:
        self.kafka = kafka
        self.timeout = kafka.timeout_s
        with kafka_errors(f"Kafka at {kafka.bootstrap}"):
            self.client = AdminClient(kafka.client_config(extra))

    def metadata(
        self, topic: str | None = None, *, timeout: float | None = None, what: str = ""
    ) -> ClusterMetadata:
        """The cluster's metadata (brokers, topics and their partitions; only ``topic``
        if given). Raises the tree's error (``what`` prefixes its message),
        :class:`KafkaUnavailable` when no broker answered in time."""
        with kafka_errors(what):
            return self.client.list_topics(
                topic, timeout=self.timeout if timeout is None else timeout
            )

    def wait(self, future: Future[T], what: str = "", *, timeout: float | None = None) -> T:
        """The result of one of :attr:`client`'s futures; raises the tree's error
        (``what`` prefixes its message), :class:`KafkaUnavailable` if no answer came
        within ``timeout`` (default: the endpoint's)."""
        t = self.timeout if timeout is None else timeout
        with kafka_errors(what):
            try:
                return future.result(timeout=t)
            except TimeoutError as exc:
                no_answer = f"no answer within {t:g}s"
                raise KafkaUnavailable(f"{what}: {no_answer}" if what else no_answer) from exc

    def describe(self, topics: Iterable[str], where: str = "") -> dict[str, Any]:
        """One request: the ``TopicDescription`` (id, partitions) of each of ``topics``
        that exists; one that does not is left out. ``where`` ends each error's
        message (" at tokyo")."""
        out = {}
        futures = self.client.describe_topics(TopicCollection(sorted(set(topics))))
        for topic, future in futures.items():
            with contextlib.suppress(UnknownTopic):
                out[topic] = self.wait(future, f"describe {topic}{where}")
        return out

    def offsets(
        self,
        parts: Iterable[tuple[str, int]],
        spec: OffsetSpec,
        *,
        committed: bool = False,
        where: str = "",
    ) -> dict[tuple[str, int], Any]:
        """One request: ``spec``'s answer (``ListOffsetsResultInfo``: offset,
        timestamp) per partition; ``committed``: under read_committed (the latest is
        then the last stable offset: a transaction still open is not counted). A
        partition whose leader is moving (:data:`~shorelink.kafka.errors.LEADER_MOVING`:
        a topic just created whose partition the broker has not made yet, a leader
        elected) is asked again until the endpoint's timeout: CI met
        NOT_LEADER_FOR_PARTITION from a topic made a moment before."""
        todo = [TopicPartition(t, p) for t, p in parts]
        level = IsolationLevel.READ_COMMITTED if committed else IsolationLevel.READ_UNCOMMITTED
        deadline = time.monotonic() + self.timeout
        out: dict[tuple[str, int], Any] = {}
        while todo:
            futures = self.client.list_offsets({tp: spec for tp in todo}, isolation_level=level)
            again = []
            for tp in todo:
                left = max(0.0, deadline - time.monotonic())
                try:
                    out[(tp.topic, tp.partition)] = self.wait(
                        futures[tp], f"offsets of {tp.topic}{where}", timeout=left
                    )
                except KafkaUnavailable as exc:
                    if exc.code not in LEADER_MOVING or time.monotonic() >= deadline:
                        raise
                    again.append(tp)
            if again:
                time.sleep(LEADER_MOVING_WAIT_S)
            todo = again
        return out

    def spans(
        self, parts: Iterable[tuple[str, int]], where: str = ""
    ) -> dict[tuple[str, int], tuple[int, int]]:
        """Per partition of ``parts`` that holds committed records: its oldest offset and
        its last stable offset (a transaction still open there is not counted). Two
        requests."""
        tps = [TopicPartition(t, p) for t, p in parts]
        if not tps:
            return {}
        first = self.client.list_offsets({tp: OffsetSpec.earliest() for tp in tps})
        stable = self.client.list_offsets(
            {tp: OffsetSpec.latest() for tp in tps}, isolation_level=IsolationLevel.READ_COMMITTED
        )
        out = {}
        for tp in tps:
            what = f"offsets of {tp.topic}{where}"
            lo = self.wait(first[tp], what).offset
            hi = self.wait(stable[tp], what).offset
            if hi > lo:
                out[(tp.topic, tp.partition)] = (lo, hi)
        return out
