"""Reading Kafka partitions: the room's one consumer, and reading topics to their end.

Every shorelink process that reads Kafka assigns partitions itself (no consumer group
joins, no committed offsets: where to read is the reader's own state, a merge's cursor,
a position, the beginning). :class:`PartitionReader` is that consumer, with the rules
each of them used to write by hand:

- *the end of a partition is data*: :class:`EndOfPartition` beside the records (from
  librdkafka's partition-EOF events; under ``read_committed`` the end is the last
  stable offset, past any transaction markers), and :attr:`PartitionReader.caught_up`;
- *a jump is a gap, never silent*: the consumer runs with ``auto.offset.reset=error``,
  so an offset the partition no longer holds (retention, ``delete_records``, a
  partition truncated or recreated) stops that partition instead of moving it; the
  reader asks where the partition now starts or ends, goes on from there and reports a
  :class:`~shorelink.kafka.errors.DataLoss` (topic, partition, consumed_to, reset_to),
  like franz-go's ``ErrDataLoss``. A start at :data:`BEGINNING` reads whatever is
  oldest; a start at an offset (0 included) reports what retention took below it;
- *watermarks* (:meth:`PartitionReader.watermarks`, asked; :meth:`~PartitionReader.
  known_end`, from the last fetch);
- *errors as the room's tree* (shorelink/kafka/errors.py): a fatal error raises, the
  others (a broker restarting, a topic not created yet) are reported in
  :attr:`Polled.errors` and librdkafka keeps trying.

Records are confluent-kafka's ``Message`` objects (never an error): the hot paths read
them without a copy.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import TracebackType

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
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
from shorelink.kafka.errors import (
    DataLoss,
    KafkaClientError,
    KafkaUnavailable,
    UnknownTopic,
    classify,
    kafka_errors,
)
from shorelink.logs import RateLimitedLog, get_logger

__all__ = [
    "BEGINNING",
    "END",
    "READ_TO_END_GROUP",
    "EndOfPartition",
    "Headers",
    "PartitionReader",
    "Polled",
    "TopicFollower",
    "follow_topic",
    "read_to_end",
    "written_ms",
]

#: the consumer group :func:`read_to_end` names by default (never joined nor committed
#: to; a secured Kafka checks it: spark_core/access.py grants it)
READ_TO_END_GROUP = "shorelink-read-to-end"

log = get_logger(__name__)

Headers = list[tuple[str, str | bytes | None]]
#: a partition: (topic, partition)
Part = tuple[str, int]

#: start a partition at its oldest record, or at its end (what is written from now on)
BEGINNING = OFFSET_BEGINNING
END = OFFSET_END

#: settings the reader owns (a caller's ``extra`` may not change them)
_OWNED = frozenset({"auto.offset.reset", "enable.partition.eof", "enable.auto.commit", "error_cb"})


def written_ms(msg: Message) -> int | None:
    """A record's Kafka timestamp (epoch ms), None when it has none."""
    kind, ms = msg.timestamp()  # kind 0: TIMESTAMP_NOT_AVAILABLE
    return ms if kind else None


@dataclass(frozen=True, slots=True)
class EndOfPartition:
    """The reader found the end of a partition at ``offset``: every record below it
    has been handed over (under ``read_committed``: below the last stable offset)."""

    topic: str
    partition: int
    offset: int


@dataclass(slots=True)
class Polled:
    """What one :meth:`PartitionReader.poll` brought: records (each partition in
    offset order), ends found, gaps (each already stepped over), and passing errors
    (librdkafka retries by itself; a caller logs or shows them)."""

    records: list[Message] = field(default_factory=list)
    ends: list[EndOfPartition] = field(default_factory=list)
    gaps: list[DataLoss] = field(default_factory=list)
    errors: list[KafkaClientError] = field(default_factory=list)


class PartitionReader:
    """A consumer of assigned partitions at ``kafka``; see the module docstring.

    ``group``: the ``group.id`` (never joined nor committed, but a principal's ACLs may
    name the groups it may use); ``what`` prefixes error messages (``"ledger at
    site-a"``); ``on_error`` gets the client-wide errors (all brokers down, a failed
    login) as the room's tree; ``extra``: more librdkafka settings (not those the
    reader owns: resets, EOF events, commits). Not thread-safe: one thread polls.
    """

    def __init__(
        self,
        kafka: KafkaEndpoint,
        *,
        group: str = "shorelink-reader",
        isolation: str = "read_committed",
        what: str = "",
        on_error: Callable[[KafkaClientError], None] | None = None,
        extra: Mapping[str, object] | None = None,
    ) -> None:
        owned = _OWNED & set(extra or {})
        if owned:
            raise ValueError(f"the reader sets {', '.join(sorted(owned))} itself")
        self.kafka = kafka
        self.what = what or f"Kafka at {kafka.bootstrap}"
        conf = kafka.client_config(
            {
                "group.id": group,
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "enable.partition.eof": True,
                "isolation.level": isolation,
                # an offset the partition no longer holds stops it (an error event):
                # the reader reports the jump as DataLoss, never a silent reset
                "auto.offset.reset": "error",
                **dict(extra or {}),
            }
        )
        if on_error is not None:
            conf["error_cb"] = lambda err: on_error(classify(err, self.what))
        with kafka_errors(self.what):
            self._consumer = Consumer(conf)
        #: per assigned partition: the next offset to hand over (negative: a logical
        #: start not resolved yet)
        self._next: dict[Part, int] = {}
        #: per partition: where its end was last found
        self._ends: dict[Part, int] = {}
        #: partitions stopped at a vanished offset whose new start is not known yet
        self._resetting: dict[Part, int] = {}
        self._closed = False

    # -- topics and offsets --------------------------------------------------------------
    def topics(self, timeout: float | None = None) -> dict[str, list[int]]:
        """Every topic this principal may describe, with its partitions."""
        wait = self.kafka.timeout_s if timeout is None else timeout
        with kafka_errors(self.what):
            md = self._consumer.list_topics(timeout=wait)
        return {t: sorted(m.partitions) for t, m in md.topics.items() if m.error is None}

    def partitions(
        self, topics: Iterable[str], timeout: float | None = None
    ) -> dict[str, list[int]]:
        """The partitions of those of ``topics`` that exist; a topic not there is left
        out. One topic is asked for by name, so a refusal is told: the tree's error
        (:class:`~shorelink.kafka.errors.KafkaNotAuthorized`: this principal may not
        describe it); in the whole listing such a topic is just absent."""
        topics = list(topics)
        if len(topics) != 1:
            listed = self.topics(timeout)
            return {t: listed[t] for t in topics if t in listed}
        wait = self.kafka.timeout_s if timeout is None else timeout
        with kafka_errors(self.what):
            md = self._consumer.list_topics(topics[0], timeout=wait)
        tmd = md.topics.get(topics[0])
        if tmd is None:
            return {}
        if tmd.error is not None:
            error = classify(tmd.error, f"{self.what}: {topics[0]}")
            if isinstance(error, UnknownTopic):
                return {}
            raise error
        return {topics[0]: sorted(tmd.partitions)}

    def watermarks(
        self, topic: str, partition: int, timeout: float | None = None
    ) -> tuple[int, int]:
        """The partition's oldest offset and its end (the high watermark), asked of its
        leader now. Raises the tree's error (:class:`~shorelink.kafka.errors.
        KafkaUnavailable` when it does not answer within ``timeout``)."""
        wait = self.kafka.timeout_s if timeout is None else timeout
        with kafka_errors(f"{self.what}: offsets of {topic}[{partition}]"):
            low, high = self._consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=wait, cached=False
            )
        return low, high

    def known_end(self, topic: str, partition: int) -> int | None:
        """The partition's high watermark as the last fetch saw it (no request); None
        before its first fetch."""
        try:
            _, high = self._consumer.get_watermark_offsets(
                TopicPartition(topic, partition), cached=True
            )
        except KafkaException:
            return None
        return high if high >= 0 else None

    # -- assignment ----------------------------------------------------------------------
    def assign(self, starts: Mapping[Part, int]) -> None:
        """Read exactly these partitions, each from its start: an offset, or
        :data:`BEGINNING` / :data:`END`. Replaces the assignment."""
        parts = _starts(starts)
        with kafka_errors(self.what):
            self._consumer.assign(parts)
        self._next = {(p.topic, p.partition): p.offset for p in parts}
        self._ends, self._resetting = {}, {}

    def add(self, starts: Mapping[Part, int]) -> None:
        """Read these partitions too (partitions added to a topic, a topic created)."""
        parts = _starts(starts)
        if not parts:
            return
        with kafka_errors(self.what):
            self._consumer.incremental_assign(parts)
        self._next.update({(p.topic, p.partition): p.offset for p in parts})

    def unassign(self) -> None:
        with kafka_errors(self.what):
            self._consumer.unassign()
        self._next, self._ends, self._resetting = {}, {}, {}

    def seek(self, topic: str, partition: int, offset: int) -> None:
        """Read an assigned partition from ``offset`` on."""
        with kafka_errors(self.what):
            self._consumer.seek(TopicPartition(topic, partition, offset))
        self._next[(topic, partition)] = offset
        self._ends.pop((topic, partition), None)

    def pause(self, parts: Iterable[Part]) -> None:
        """Fetch nothing more of ``parts`` until :meth:`resume` (what was fetched is
        still handed over)."""
        with kafka_errors(self.what):
            self._consumer.pause([TopicPartition(t, p) for t, p in parts])

    def resume(self, parts: Iterable[Part]) -> None:
        with kafka_errors(self.what):
            self._consumer.resume([TopicPartition(t, p) for t, p in parts])

    @property
    def assigned(self) -> dict[Part, int]:
        """Each assigned partition and the next offset it hands over (negative: its
        logical start, before the first record or end)."""
        return dict(self._next)

    def at_end(self, topic: str, partition: int) -> int | None:
        """Where the partition's end was last found (None: not yet)."""
        return self._ends.get((topic, partition))

    @property
    def caught_up(self) -> bool:
        """Every assigned partition has been read to the end last found there."""
        return all(
            (end := self._ends.get(tp)) is not None and end >= nxt for tp, nxt in self._next.items()
        )

    # -- reading -------------------------------------------------------------------------
    def poll(self, max_records: int = 500, timeout: float = 0.5, *, wake: bool = False) -> Polled:
        """What arrived within ``timeout`` seconds (at most ``max_records`` events);
        raises the tree's error only for a fatal one (the client is unusable).

        librdkafka's batch consume returns when it has ``max_records`` events or when
        ``timeout`` has passed: a reader waiting at the end of its partitions holds a
        record that arrives meanwhile until the timeout is out. ``wake``: return as
        soon as an event arrives, with whatever is queued behind it (a feed's wait for
        new records, spark_core/feed.py)."""
        out = Polled()
        for tp, consumed_to in list(self._resetting.items()):
            self._reset(tp, consumed_to, out)
        with kafka_errors(self.what):
            msgs = self._consumer.consume(max_records, timeout=0 if wake else timeout)
            if wake and not msgs and timeout > 0:
                first = self._consumer.poll(timeout)  # the first event, as it comes
                if first is not None:
                    msgs = [first]
                    if max_records > 1:
                        msgs += self._consumer.consume(max_records - 1, timeout=0)
        for m in msgs:
            err = m.error()
            if err is None:
                tp = (m.topic() or "", m.partition() or 0)
                self._next[tp] = (m.offset() or 0) + 1
                out.records.append(m)
                continue
            code = err.code()
            tp = (m.topic() or "", m.partition() or 0)
            if code == KafkaError._PARTITION_EOF:
                at = m.offset() or 0
                self._ends[tp] = at
                if self._next.get(tp, 0) < at:  # markers, or a logical start resolved
                    self._next[tp] = at
                out.ends.append(EndOfPartition(*tp, at))
            elif code == KafkaError._AUTO_OFFSET_RESET:
                # the partition stopped at an offset it no longer holds (its offset, or
                # none after a truncation found by leader epoch: the reader's own)
                offset = m.offset()
                at = offset if offset is not None and offset >= 0 else self._next.get(tp, 0)
                if self._next.get(tp, -1) >= 0 and at < self._next[tp]:
                    continue  # an event queued before the partition was stepped over
                self._reset(tp, at, out)
            else:
                error = classify(err, self.what)
                if error.fatal:
                    raise error
                out.errors.append(error)
        return out

    def _reset(self, tp: Part, consumed_to: int, out: Polled) -> None:
        """Step a stopped partition over to where it now starts (or ends, when it was
        truncated below the reader), and report the jump."""
        try:
            low, high = self.watermarks(*tp)
        except KafkaClientError as exc:  # asked again at the next poll
            self._resetting[tp] = consumed_to
            out.errors.append(exc)
            return
        self._resetting.pop(tp, None)
        reset_to = low if consumed_to < low else high if consumed_to > high else consumed_to
        # a stopped partition takes no seek ("erroneous state"): assigned anew
        at = TopicPartition(*tp, reset_to)
        with kafka_errors(self.what):
            self._consumer.incremental_unassign([TopicPartition(*tp)])
            self._consumer.incremental_assign([at])
        self._next[tp] = reset_to
        self._ends.pop(tp, None)
        if reset_to != consumed_to:  # else: in range again (a leader that caught up)
            out.gaps.append(DataLoss(*tp, consumed_to, reset_to, self.what))

    # -- life cycle ----------------------------------------------------------------------
    def close(self) -> None:
        if not self._closed:
            self._closed = True
            with contextlib.suppress(KafkaException, RuntimeError):  # nothing to keep
                self._consumer.close()

    def __enter__(self) -> PartitionReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _starts(starts: Mapping[Part, int]) -> list[TopicPartition]:
    bad = {tp: o for tp, o in starts.items() if o < 0 and o not in (BEGINNING, END)}
    if bad:  # a stored or invalid offset would go through auto.offset.reset at once
        raise ValueError(f"a start is an offset, BEGINNING or END: {bad}")
    return [TopicPartition(t, p, o) for (t, p), o in sorted(starts.items())]


def read_to_end(
    kafka: KafkaEndpoint,
    topics: Iterable[str],
    *,
    isolation: str = "read_committed",
    timeout: float = 60.0,
    extra: dict[str, object] | None = None,
    settled: bool = False,
    starts: Mapping[Part, int] | None = None,
    group: str = READ_TO_END_GROUP,
) -> Iterator[Message]:
    """Yield every message of ``topics`` at ``kafka`` from the beginning (or from
    ``starts``, per partition, where given) up to their current end (the last stable
    offset under read_committed), then stop.

    ``settled``: up to the high watermark each partition had when the read began, that
    is, until every transaction written before the read is committed or aborted. A
    producer's commit returns before the broker has written its markers to each
    partition, so a plain read_committed read right after a commit can end at an
    older last stable offset and miss a partition's part of it (a test read so once).
    A transaction left open then costs the read its ``timeout``.

    A :class:`PartitionReader`'s ends, so it never waits on an idle poll. It reads what
    the topics hold: if retention deletes records ahead of it while it reads (a long
    audit of a busy topic), it goes on from the oldest record left and logs the jump
    (``event=read_overtaken``). ``group``: the ``group.id`` named (never joined nor
    committed; at a neighbour's Kafka, one its ACLs let this principal use). Raises
    :class:`~shorelink.kafka.errors.KafkaClientError` on a consumer error
    (:class:`~shorelink.kafka.errors.UnknownTopic` for a topic that does not exist), or
    :class:`~shorelink.kafka.errors.KafkaUnavailable` if the end is not reached within
    ``timeout`` seconds.
    """
    topics = list(topics)
    what = f"reading {', '.join(topics)} at {kafka.bootstrap}"
    with PartitionReader(kafka, group=group, isolation=isolation, what=what, extra=extra) as reader:
        found = reader.partitions(topics, timeout=10)
        missing = [t for t in topics if t not in found]
        if missing:
            raise UnknownTopic(f"{what}: no topic {', '.join(missing)}")
        parts = [(t, p) for t in topics for p in found[t]]
        if not parts:
            return
        deadline = time.monotonic() + timeout
        with kafka_errors(what):
            ends = _high_watermarks(kafka, parts, deadline) if settled else dict.fromkeys(parts, 0)
        reader.assign({p: (starts or {}).get(p, BEGINNING) for p in parts})
        pending = set(ends)
        while pending:
            if time.monotonic() > deadline:
                raise KafkaUnavailable(f"{what}: end not reached: {sorted(pending)}")
            # a short wait: a small topic must not cost half a second per read
            got = reader.poll(500, timeout=0.05)
            for gap in got.gaps:
                log.warning(
                    "read_overtaken",
                    topic=gap.topic,
                    partition=gap.partition,
                    consumed_to=gap.consumed_to,
                    reset_to=gap.reset_to,
                )
            if got.errors:
                raise got.errors[0]
            yield from got.records
            pending -= {
                (e.topic, e.partition) for e in got.ends if e.offset >= ends[(e.topic, e.partition)]
            }


def _high_watermarks(kafka: KafkaEndpoint, parts: list[Part], deadline: float) -> dict[Part, int]:
    """Each partition's high watermark (a read_committed consumer is told the last
    stable offset instead: asked as read_uncommitted), by the admin client, which finds
    a partition's new leader itself (a consumer's watermark request kept asking a
    broker that had lost it for a minute after a broker was killed), asked again while
    the answer is a retriable error and ``deadline`` is not past."""
    admin = Admin(kafka).client
    while True:
        found = admin.list_offsets(
            {TopicPartition(*p): OffsetSpec.latest() for p in parts},
            isolation_level=IsolationLevel.READ_UNCOMMITTED,
            request_timeout=max(1.0, min(10.0, deadline - time.monotonic())),
        )
        try:
            return {(tp.topic, tp.partition): f.result().offset for tp, f in found.items()}
        except KafkaException as exc:
            if not classify(exc).retryable or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def follow_topic(
    kafka: KafkaEndpoint,
    topic: str,
    take: Callable[[list[Message]], None],
    stop: threading.Event,
    *,
    group: str,
    wait_s: float = 2.0,
    poll_s: float = 0.5,
) -> None:
    """Read ``topic`` at ``kafka`` from its beginning (read_committed) until ``stop``,
    each poll's records to ``take``: a long-running follower's loop (the gateway's
    ledger, a site's registry). Until the topic exists (its writer creates it), looked
    for every ``wait_s``; Kafka's passing errors and gaps logged (``follow_error``,
    rate limited); what ``take`` raises ends the loop (its caller logs it)."""
    limited = RateLimitedLog(log)
    reader = PartitionReader(kafka, group=group, what=f"{topic} at {kafka.bootstrap}")
    assigned = False
    try:
        while not stop.is_set():
            if not assigned:
                try:
                    parts = reader.partitions([topic], timeout=5).get(topic)
                    if parts is not None:
                        reader.assign({(topic, p): BEGINNING for p in parts})
                        assigned = True
                except KafkaClientError as exc:  # Kafka away: the next look may find it
                    limited.warning(topic, "follow_error", topic=topic, error=str(exc))
                if not assigned:
                    stop.wait(wait_s)
                    continue
            got = reader.poll(500, timeout=poll_s)
            for problem in [*got.errors, *got.gaps]:
                limited.warning(topic, "follow_error", topic=topic, error=str(problem))
            if got.records:
                take(got.records)
    finally:
        reader.close()


class TopicFollower:
    """A long-running follower of one topic on a thread of its own (the gateway's
    ledger, a site's registry): :func:`follow_topic` into :meth:`take`, from the
    topic's beginning, read_committed; it never takes its process down (what ends its
    loop is logged, ``follower_crashed``)."""

    #: seconds between looks for a topic not created yet, and a poll's wait
    wait_s = 2.0
    poll_s = 0.5

    def __init__(self, kafka: KafkaEndpoint, topic: str, name: str) -> None:
        self.kafka = kafka
        self.topic = topic
        self.name = name
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def take(self, records: list[Message]) -> None:
        """One poll's records, in offset order per partition."""
        raise NotImplementedError

    def _run(self) -> None:
        try:
            follow_topic(
                self.kafka,
                self.topic,
                self.take,
                self._stop,
                group=f"shorelink-{self.name}-{uuid.uuid4().hex}",
                wait_s=self.wait_s,
                poll_s=self.poll_s,
            )
        except Exception:  # the follower must never take its process down
            log.exception("follower_crashed", follower=self.name, topic=self.topic)
