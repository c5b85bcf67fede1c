"""A consumer of a site's canonical topics whose position moves between sites.

:class:`PortableConsumer` reads ``sl.<stream>`` (``read_committed``, as the record
contract asks) at one site and keeps its position as identities, ``(origin, stream) ->
seqs seen`` (:class:`~shorelink.kafka.position.Position`), not as Kafka offsets. Identities
are the same at every site while offsets are not, so the same position resumes at any
other site: what it holds is skipped, everything else is delivered (docs/consumers.md).

Why it reads a topic it has never read from the beginning: at another site there is no
cheap way to know from which offset on a partition holds only unseen identities. Record
timestamps are the merge's write time *at that site* (and ``sl.ts`` is event time, in
no order a site keeps), and a record that reached the new site late (a link was down)
sits after records the consumer has not seen. So a failover reads the new site's
retained topic once and skips by identity (a header parse and a range lookup per
record: about 230,000 a second on one core, before fetching the bytes); from then on the position's *offset hints*
(per Kafka topic id and partition: everything below was handled) let a restart at the
same site start where it stopped. A hint is used only at the topic it was made at. A
hint below what retention kept, or records deleted while the consumer read, is a gap
its :class:`~shorelink.kafka.reading.PartitionReader` reports (``PortableConsumer.
gaps``, ``event=consumer_data_loss``: records this consumer did not read here are gone,
though it may have had their identities at another site); it reads on from the oldest
record left.

Delivery: :meth:`PortableConsumer.poll` hands over records; :meth:`~PortableConsumer.
commit` records everything handed over so far as processed and saves the position.
A crash between the two hands the uncommitted records over again (at least once to the
caller); a committed identity is never handed over again, at this site or any other
(exactly once per position). Within a run an identity is handed over once even if a
site held it twice.

Order: each partition in offset order, partitions interleaved. The merge keys a record
by its logical key (``murmur2_random``), so one ``(origin, stream)`` spans partitions,
while one key's records share a partition: per ``(origin, stream, key)`` a consumer gets
the site's merge order, which is seq order except where a source's seqs reached the
site out of order (part of a stream through another site, later).
"""

from __future__ import annotations

import base64
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from confluent_kafka import Message, TopicCollection

from shorelink.contract import Record, canonical_topic, customer_topic, entered_ms
from shorelink.errors import ContractError, ShorelinkError
from shorelink.identity import Identity
from shorelink.kafka.admin import Admin
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.errors import DataLoss, KafkaClientError, KafkaNotAuthorized
from shorelink.kafka.position import Position, PositionStore
from shorelink.kafka.reading import BEGINNING, PartitionReader, written_ms
from shorelink.logs import RateLimitedLog, get_logger

__all__ = ["Consumed", "ConsumerError", "PortableConsumer"]

log = get_logger(__name__)

#: how often a consumer looks for partitions added to its topics (``shorelink-spark
#: topics apply`` grows a canonical topic); a new partition is read from its beginning
PARTITION_REFRESH_S = 10.0


class ConsumerError(ShorelinkError):
    """The site's Kafka cannot be reached or does not have the topic asked for; caused
    by the Kafka error tree's error (``retryable`` as it says), if any."""


@dataclass(frozen=True, slots=True)
class Consumed:
    """A record as the consumer hands it over, with where it was read at this site."""

    record: Record
    topic: str
    partition: int
    offset: int
    #: when this site's merge wrote it (the record's Kafka timestamp, epoch ms)
    merged_ms: int | None = None
    #: when the gateway of the site it entered at wrote it (``sl.entered``, epoch ms)
    entered_ms: int | None = None

    @property
    def identity(self) -> Identity:
        return self.record.identity

    def to_json(self) -> dict[str, Any]:
        """One JSON object (``shorelink consume``'s line): key and value as text when
        they are UTF-8, else base64 under ``key_b64``/``value_b64``."""
        r = self.record
        out: dict[str, Any] = {
            "origin": r.identity.origin,
            "stream": r.identity.stream,
            "seq": r.identity.seq,
        }
        out.update(_text("key", r.key))
        out.update(_text("value", r.value))
        out.update(
            ts=r.ts_ms,
            site=r.site,
            mqtt_topic=r.mqtt_topic,
            entered_ms=self.entered_ms,
            merged_ms=self.merged_ms,
            topic=self.topic,
            partition=self.partition,
            offset=self.offset,
        )
        return out


def _text(name: str, raw: bytes) -> dict[str, str]:
    try:
        return {name: raw.decode()}
    except UnicodeDecodeError:
        return {f"{name}_b64": base64.b64encode(raw).decode()}


class PortableConsumer:
    """Reads the canonical topics of ``streams`` at the site whose Kafka is ``kafka``
    (as its principal there), skipping every identity in its position.

    ``store`` loads the position at start and saves it on :meth:`commit`; ``position``
    starts from a given one instead (and is then not loaded). The endpoint's timeout:
    how long the site's Kafka may take to answer at start (:class:`ConsumerError`
    after it).
    """

    def __init__(
        self,
        kafka: KafkaEndpoint,
        streams: Sequence[str],
        *,
        store: PositionStore | None = None,
        position: Position | None = None,
        batch_size: int = 500,
        extra: dict[str, object] | None = None,
        customer: str | None = None,
    ) -> None:
        if not streams:
            raise ValueError("name at least one stream")
        self.kafka = kafka
        self.bootstrap = kafka.bootstrap
        #: a customer reads its own streams (``sl.customer.<name>.<stream>``), with a
        #: consumer group under its own prefix, as its ACLs allow
        self.topics = [
            customer_topic(customer, s) if customer else canonical_topic(s) for s in streams
        ]
        self.group = f"{customer}.portable-consumer" if customer else "shorelink-portable-consumer"
        self.store = store
        self.position = (
            position if position is not None else (store.load() if store else Position())
        )
        self.timeout = kafka.timeout_s
        self.batch_size = batch_size
        self._extra = extra or {}
        self._reader: PartitionReader | None = None
        self._topic_ids: dict[str, str] = {}
        self._pending = Position()  # handed over, not committed
        self._next: dict[tuple[str, int], int] = {}  # next offset to take, per partition
        self._buffer: deque[Message] = deque()
        self._refresh_at = 0.0
        self._errors = RateLimitedLog(log)
        #: records skipped because the position (or this run) had their identity
        self.skipped = 0
        #: records that break the record contract (never handed over)
        self.malformed = 0
        #: records deleted at this site (retention) before this consumer read them:
        #: each jump as the reader reported it (logged, ``event=consumer_data_loss``)
        self.gaps: list[DataLoss] = []

    # -- life cycle ----------------------------------------------------------------------
    def open(self) -> None:
        """Connect and assign every partition (at its offset hint, or the beginning)."""
        if self._reader is not None:
            return
        reader = PartitionReader(
            self.kafka,
            group=self.group,  # partitions are assigned, not joined
            what=f"Kafka at {self.bootstrap}",
            extra={"logger": log, **self._extra},
        )
        try:
            self._assign(reader)
        except BaseException:
            reader.close()
            raise
        self._reader = reader

    def _assign(self, reader: PartitionReader) -> None:
        found: dict[str, list[int]] = {}
        refused = []
        try:
            # each topic asked for by name: one this principal may not describe comes
            # back with the broker's refusal (the whole listing would just leave it out)
            for t in self.topics:
                try:
                    found.update(reader.partitions([t], timeout=self.timeout))
                except KafkaNotAuthorized:
                    refused.append(t)
        except KafkaClientError as exc:
            raise ConsumerError(
                f"Kafka at {self.bootstrap} did not answer within {self.timeout:g}s: {exc}",
                retryable=exc.retryable,
            ) from exc
        if refused:
            raise ConsumerError(
                f"not authorized to read {', '.join(refused)} at {self.bootstrap}"
                f" as {self.kafka.auth.username or 'anonymous'}"
            )
        missing = [t for t in self.topics if t not in found]
        if missing:
            raise ConsumerError(
                f"no topic {', '.join(missing)} at {self.bootstrap}: not a stream of this site?"
            )
        self._topic_ids = self._describe()
        # at its hint, or from the beginning; a hint below what retention kept is a
        # gap the reader reports (records this consumer never had were deleted)
        starts: dict[tuple[str, int], int] = {}
        for t in self.topics:
            hints = self.position.hints(self._topic_ids.get(t, ""))
            for p in found[t]:
                hint = hints.get(p)
                starts[(t, p)] = BEGINNING if hint is None else hint
        try:
            reader.assign(starts)
        except KafkaClientError as exc:
            raise ConsumerError(str(exc), retryable=exc.retryable) from exc
        self._refresh_at = time.monotonic() + PARTITION_REFRESH_S
        log.info(
            "consumer_assigned",
            bootstrap=self.bootstrap,
            partitions=len(starts),
            from_hint=sum(1 for at in starts.values() if at != BEGINNING),
        )

    def _describe(self) -> dict[str, str]:
        """topic -> its Kafka topic id (a UUID: one topic at one cluster, never reused)."""
        out: dict[str, str] = {}
        try:
            admin = Admin(self.kafka)
            futures = admin.client.describe_topics(
                TopicCollection(self.topics), request_timeout=self.timeout
            )
            for name, fut in futures.items():
                out[name] = str(
                    admin.wait(fut, f"cannot describe {name} at {self.bootstrap}").topic_id
                )
        except KafkaClientError as exc:
            raise ConsumerError(str(exc), retryable=exc.retryable) from exc
        return out

    def close(self) -> None:
        """Close the Kafka consumer; uncommitted records are not recorded."""
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def __enter__(self) -> PortableConsumer:
        self.open()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- reading -------------------------------------------------------------------------
    @property
    def caught_up(self) -> bool:
        """Every partition has been read to its end (the last stable offset)."""
        return not self._buffer and self._reader is not None and self._reader.caught_up

    def poll(self, max_records: int | None = None, timeout: float = 1.0) -> list[Consumed]:
        """Up to ``max_records`` records not seen before, in partition order; returns
        early (maybe with none) when caught up or after ``timeout`` seconds."""
        self.open()
        limit = max_records or self.batch_size
        deadline = time.monotonic() + timeout
        out: list[Consumed] = []
        while len(out) < limit:
            if not self._buffer:
                if out:
                    break
                self._fill(max(0.0, min(deadline - time.monotonic(), 0.1)), limit)
                if not self._buffer and (self.caught_up or time.monotonic() >= deadline):
                    break
                continue
            self._take(self._buffer.popleft(), out)
        return out

    def batches(self, *, follow: bool = False, timeout: float = 1.0) -> Iterator[list[Consumed]]:
        """Batches of new records; without ``follow``, stop at the end of the topics.
        Call :meth:`commit` after processing each one."""
        while True:
            batch = self.poll(timeout=timeout)
            if batch:
                yield batch
            elif self.caught_up and not follow:
                return

    def _fill(self, timeout: float, n: int) -> None:
        assert self._reader is not None
        if time.monotonic() >= self._refresh_at:
            self._refresh()
        got = self._reader.poll(max(n, 100), timeout=timeout)
        self._buffer.extend(got.records)
        for gap in got.gaps:
            self.gaps.append(gap)
            log.warning(
                "consumer_data_loss",
                bootstrap=self.bootstrap,
                topic=gap.topic,
                partition=gap.partition,
                consumed_to=gap.consumed_to,
                reset_to=gap.reset_to,
            )
        for error in got.errors:
            if not error.retryable:
                raise ConsumerError(str(error)) from error
            # librdkafka recovers by itself (a broker restarting, a link down for a
            # while): logged, and the consumer keeps going
            self._errors.warning(
                f"kafka:{error.code}",
                "consumer_kafka_error",
                bootstrap=self.bootstrap,
                error=str(error),
            )

    def _refresh(self) -> None:
        """Assign partitions added since the start, from their beginning."""
        assert self._reader is not None
        self._refresh_at = time.monotonic() + PARTITION_REFRESH_S
        try:
            found = self._reader.partitions(self.topics, timeout=1.0)
            known = self._reader.assigned
            new = {(t, p): BEGINNING for t, ps in found.items() for p in ps if (t, p) not in known}
            self._reader.add(new)
        except KafkaClientError:
            return  # the site is unreachable for now: the next refresh tries again
        if new:
            log.info("consumer_partitions_added", bootstrap=self.bootstrap, added=len(new))

    def _take(self, msg: Message, out: list[Consumed]) -> None:
        topic, part = msg.topic() or "", msg.partition() or 0
        offset = msg.offset() or 0
        self._next[(topic, part)] = offset + 1
        try:
            rec = Record.from_kafka(msg.key(), msg.value(), msg.headers())
        except ContractError as exc:
            self.malformed += 1
            log.warning(
                "consumer_malformed", topic=topic, partition=part, offset=offset, error=str(exc)
            )
            return
        i = rec.identity
        if self.position.seen(i) or self._pending.seen(i):
            self.skipped += 1
            return
        self._pending.add(i)
        out.append(Consumed(rec, topic, part, offset, written_ms(msg), entered_ms(msg.headers())))

    # -- position ------------------------------------------------------------------------
    def commit(self) -> None:
        """Record every record handed over so far as processed, and save the position
        (through the store, durably, before returning)."""
        self.position.update(self._pending)
        for (topic, part), nxt in self._next.items():
            tid = self._topic_ids.get(topic)
            if tid:
                self.position.hint((tid, topic, part), nxt)
        self._pending = Position()
        if self.store is not None:
            self.store.save(self.position)
