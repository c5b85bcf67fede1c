"""Deleting from the merge's source topics what the merge has committed past.

``sl.ingress.<stream>`` has no time retention (core_gateway/ingress.py): what a gateway
told a ship it holds must stay in Kafka until it is in the canonical topic, however long
the merge is stopped. The merge frees it instead: after each batch it deletes
(``DeleteRecords``, the admin API) every record of ``sl.ingress.*`` (never of a
neighbour's relay topic the pullers read) below the offsets the batch *before* it
committed in ``sl.merge.marker``.

Why one batch behind: Spark re-reads a batch from its start offsets if the driver dies
after the Kafka transaction committed but before Spark logged the batch as done (the
replay the merge recognises by its batch id). Once batch N+1 runs, Spark has logged batch
N, so nothing below N's end offsets is read again: not by a replay, not after a lost
checkpoint (the query then starts from the earliest offset still there, and the marker
skips what was handled). A replayed batch purges nothing.

And never past the Spark query's own position (:func:`spark_position`, where its
current batch starts): the merge's ingest puller (spark_core/pull.py) reads the same
topics and commits ahead of the Spark query, and a record deleted below a Spark batch's
planned range fails that batch (Spark's ``failOnDataLoss``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from concurrent.futures import Future
from functools import partial
from pathlib import Path
from typing import Any

from confluent_kafka import TopicPartition

from shorelink.kafka.admin import Admin
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.errors import KafkaClientError, kafka_errors
from shorelink.logs import RateLimitedLog, get_logger
from spark_core.location import Location, read_text
from spark_core.merge_state import topic_stream

__all__ = ["SourcePurger", "below", "spark_position"]

log = get_logger(__name__)


def spark_position(
    checkpoint: Location | Path, batch_id: int, spark: Any = None
) -> dict[tuple[str, int], int]:
    """Where Spark batch ``batch_id`` of the query checkpointed at ``checkpoint`` starts,
    per source partition: the end of the batch before it, in the query's offset log
    (``offsets/<id>``: a version line, the batch's metadata, then each source's offsets
    as ``{"topic": {"partition": offset}}``). Nothing below it is read by the query
    again. Empty when that entry is missing or unreadable (purge nothing then). A
    checkpoint at a URL is read through ``spark``'s Hadoop filesystem."""
    at = checkpoint if isinstance(checkpoint, Location) else Location(str(checkpoint))
    try:
        lines = read_text(spark, at / "offsets" / str(batch_id - 1)).splitlines()
        out = {}
        for line in lines[2:]:
            for topic, parts in json.loads(line).items():
                out.update({(topic, int(p)): int(o) for p, o in parts.items()})
        return out
    except (OSError, ValueError, AttributeError, TypeError):
        return {}


def below(
    committed: Mapping[tuple[str, int], int], position: Mapping[tuple[str, int], int]
) -> dict[tuple[str, int], int]:
    """Per source partition in both: the lower of the two offsets."""
    return {tp: min(o, position[tp]) for tp, o in committed.items() if tp in position}


class SourcePurger:
    def __init__(self, kafka: KafkaEndpoint) -> None:
        self._admin = Admin(kafka)
        self._timeout = kafka.timeout_s
        #: per source partition, the offset below which deletion was last requested
        self._purged: dict[tuple[str, int], int] = {}
        self._limited = RateLimitedLog(log)
        #: records of the source topics deleted so far (by offset arithmetic)
        self.requested = 0
        self.failures = 0

    def forget(self, topics: Iterable[str]) -> None:
        """``topics`` were deleted and created again: their offsets start at 0 again."""
        gone = set(topics)
        self._purged = {tp: o for tp, o in self._purged.items() if tp[0] not in gone}

    def purge(self, committed: Mapping[tuple[str, int], int]) -> int:
        """Delete records below ``committed`` (next offset not handled, per source
        partition) where that moved on; returns how many partitions were asked. Does not
        wait: a failure is logged and counted, and the next batch asks again."""
        todo = [
            TopicPartition(topic, part, off)
            for (topic, part), off in committed.items()
            if off > self._purged.get((topic, part), 0) and topic_stream(topic) is not None
        ]
        if not todo:
            return 0
        try:
            with kafka_errors():
                futures = self._admin.client.delete_records(todo, request_timeout=self._timeout)
        except (KafkaClientError, ValueError) as exc:
            self._failed("request", exc)
            return 0
        for tp in todo:
            key = (tp.topic, tp.partition)
            self.requested += tp.offset - self._purged.get(key, 0)
            self._purged[key] = tp.offset
        for tp, fut in futures.items():
            fut.add_done_callback(partial(self._done, tp))
        return len(todo)

    def _done(self, tp: TopicPartition, fut: Future[object]) -> None:
        exc = fut.exception()
        if exc is not None:
            self._purged.pop((tp.topic, tp.partition), None)  # ask again next time
            self._failed(f"{tp.topic}/{tp.partition}", exc)

    def _failed(self, what: str, exc: BaseException) -> None:
        self.failures += 1
        self._limited.warning("merge_purge", "merge_purge_failed", what=what, error=str(exc))
