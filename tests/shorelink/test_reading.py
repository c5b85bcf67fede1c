"""Reading Kafka on a real broker: the room's PartitionReader (ends as data, every
jump a gap, errors as the room's tree), the end a read_committed read stops at, and the
settled end a test or an audit can wait for."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from confluent_kafka import KafkaError, Producer, TopicPartition

from local_stack.kafka import KafkaBroker
from local_stack.process import free_port
from shorelink.kafka.admin import Admin
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.errors import DataLoss, KafkaClientError, KafkaUnavailable, UnknownTopic
from shorelink.kafka.reading import BEGINNING, PartitionReader, Polled, read_to_end
from shorelink.kafka.topics import TopicSpec, ensure_topics
from tests.helpers import eventually, unique


def _values(broker: KafkaBroker, topic: str, **kw: object) -> list[bytes]:
    return [m.value() or b"" for m in read_to_end(broker.endpoint, [topic], **kw)]  # type: ignore[arg-type]


def test_a_settled_read_waits_for_open_transactions_and_a_plain_one_stops_before_them(
    kafka: KafkaBroker,
) -> None:
    topic = unique("settle")
    ensure_topics(kafka.endpoint, [TopicSpec(topic, partitions=3)])
    p = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": unique("tx")})
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(30):
        p.produce(topic, value=f"v{i}".encode(), partition=i % 3)
    p.flush(30)
    # the transaction is open: read_committed ends at the last stable offset, before it
    assert _values(kafka, topic) == []
    with pytest.raises(KafkaUnavailable, match="end not reached"):
        _values(kafka, topic, settled=True, timeout=2)
    p.commit_transaction(30)
    # committed: the settled read has every partition's part, whenever the markers land
    assert sorted(_values(kafka, topic, settled=True)) == sorted(
        f"v{i}".encode() for i in range(30)
    )
    assert len(_values(kafka, topic, settled=True, isolation="read_uncommitted")) == 30


# -- the room's one reader ----------------------------------------------------------------
def _fill(broker: KafkaBroker, topic: str, n: int, partition: int = 0) -> None:
    p = Producer(broker.endpoint.client_config({"enable.idempotence": True}))
    for i in range(n):
        p.produce(topic, value=f"v{i}".encode(), partition=partition)
    assert p.flush(30) == 0


def _delete_below(broker: KafkaBroker, topic: str, partition: int, offset: int) -> None:
    """Delete the partition's records below ``offset``, as retention would."""
    admin = Admin(broker.endpoint)
    (future,) = admin.client.delete_records([TopicPartition(topic, partition, offset)]).values()
    admin.wait(future, f"delete records of {topic} below {offset}")


def _read_until(reader: PartitionReader, done: Callable[[Polled], bool]) -> Polled:
    """Poll, gathering everything, until ``done`` holds for what was gathered."""
    seen = Polled()

    def more() -> bool:
        got = reader.poll(100, timeout=0.2)
        seen.records += got.records
        seen.ends += got.ends
        seen.gaps += got.gaps
        seen.errors += got.errors
        return done(seen)

    eventually(more, within=30, what="the reader's events")
    return seen


def test_the_reader_hands_over_each_partitions_end_as_data(kafka: KafkaBroker) -> None:
    """Every consumer used to compare librdkafka's partition-EOF code by hand: the end of
    a partition is an event of the reader, with the offset everything below was read."""
    topic = unique("ends")
    ensure_topics(kafka.endpoint, [TopicSpec(topic, partitions=2)])
    _fill(kafka, topic, 5, partition=0)
    with PartitionReader(kafka.endpoint, what="test") as reader:
        assert reader.partitions([topic, unique("absent")]) == {topic: [0, 1]}
        reader.assign({(topic, 0): BEGINNING, (topic, 1): BEGINNING})
        assert not reader.caught_up
        seen = _read_until(reader, lambda s: reader.caught_up)
        assert [m.value() for m in seen.records] == [f"v{i}".encode() for i in range(5)]
        assert {(e.topic, e.partition, e.offset) for e in seen.ends} >= {
            (topic, 0, 5),
            (topic, 1, 0),
        }
        assert reader.assigned == {(topic, 0): 5, (topic, 1): 0}
        assert reader.watermarks(topic, 0) == (0, 5)
        assert reader.known_end(topic, 0) == 5
        assert not seen.gaps and not seen.errors
        # a record written later: not caught up until it is read and the end found again
        _fill(kafka, topic, 1, partition=1)
        seen = _read_until(reader, lambda s: bool(s.records) and reader.caught_up)
        assert [m.value() for m in seen.records] == [b"v0"]
        assert reader.at_end(topic, 1) == 1


def test_records_deleted_before_they_were_read_are_a_gap_not_a_silent_skip(
    kafka: KafkaBroker,
) -> None:
    """A reader whose next offset retention (here ``delete_records``) removed used to
    jump to the oldest record left (``auto.offset.reset=earliest``) and say nothing;
    replication counted a gap only at assignment, so a reset mid-read lost records
    silently. Every jump is reported as DataLoss(topic, partition, consumed_to,
    reset_to), and reading goes on from where the partition now starts."""
    topic = unique("gap")
    ensure_topics(kafka.endpoint, [TopicSpec(topic)])
    _fill(kafka, topic, 10)
    _delete_below(kafka, topic, 0, 4)
    with PartitionReader(kafka.endpoint, what="test") as reader:
        # a start (a cursor) below what retention kept
        reader.assign({(topic, 0): 2})
        seen = _read_until(reader, lambda s: reader.caught_up)
        (gap,) = seen.gaps
        assert isinstance(gap, DataLoss) and isinstance(gap, KafkaClientError)
        assert (gap.topic, gap.partition, gap.consumed_to, gap.reset_to, gap.lost) == (
            topic,
            0,
            2,
            4,
            2,
        )
        assert gap.code == KafkaError._AUTO_OFFSET_RESET and not gap.retryable
        assert [m.offset() for m in seen.records] == list(range(4, 10))

        # mid-read: the reader is at 10, more is written and deleted before it is fetched
        reader.pause([(topic, 0)])
        _fill(kafka, topic, 10)
        _delete_below(kafka, topic, 0, 15)
        reader.resume([(topic, 0)])
        seen = _read_until(reader, lambda s: bool(s.gaps) and reader.caught_up)
        (gap,) = seen.gaps
        assert (gap.consumed_to, gap.reset_to, gap.lost) == (10, 15, 5)
        assert [m.offset() for m in seen.records] == list(range(15, 20))

        # BEGINNING asks for whatever is oldest: no gap
        reader.assign({(topic, 0): BEGINNING})
        seen = _read_until(reader, lambda s: reader.caught_up)
        assert not seen.gaps and [m.offset() for m in seen.records] == list(range(15, 20))


def test_the_readers_errors_are_the_rooms_tree(kafka: KafkaBroker) -> None:
    """No caller outside shorelink/kafka/ sees a librdkafka error: a missing topic and a
    cluster that does not answer (asked, or told the client-wide error) come as the
    tree's errors; a setting the reader owns, or a start that would go through a reset,
    is refused."""
    with PartitionReader(kafka.endpoint, what="test") as reader, pytest.raises(UnknownTopic):
        reader.watermarks(unique("absent"), 0)

    told: list[KafkaClientError] = []
    nowhere = KafkaEndpoint.plaintext(f"127.0.0.1:{free_port()}", timeout_s=1)
    with PartitionReader(nowhere, what="nowhere", on_error=told.append) as reader:
        with pytest.raises(KafkaUnavailable, match="nowhere"):
            reader.watermarks("any", 0)
        reader.assign({("any", 0): BEGINNING})
        eventually(lambda: reader.poll(10, timeout=0.2) is not None and told, within=30)
        assert all(isinstance(e, KafkaUnavailable) for e in told), told

    with pytest.raises(ValueError, match=r"auto\.offset\.reset"):
        PartitionReader(kafka.endpoint, extra={"auto.offset.reset": "earliest"})
    with pytest.raises(ValueError, match="BEGINNING or END"):
        PartitionReader(kafka.endpoint).assign({("t", 0): -1000})  # the stored offset


def test_a_waking_poll_returns_with_the_first_record_not_at_its_timeout(
    kafka: KafkaBroker,
) -> None:
    """librdkafka's batch consume waits out its whole timeout unless ``max_records``
    events come first: a feed waiting at the end of its partitions held every record
    that arrived meanwhile for the rest of its wait (0.2 s a hop, four hops between two
    sites). A waking poll returns with the first event, and with what is queued behind
    it."""
    topic = unique("wake")
    ensure_topics(kafka.endpoint, [TopicSpec(topic)])
    _fill(kafka, topic, 3)
    with PartitionReader(kafka.endpoint, what="test") as reader:
        reader.assign({(topic, 0): BEGINNING})
        _read_until(reader, lambda s: reader.caught_up)
        got: list[Polled] = []
        waiting = threading.Thread(
            target=lambda: got.append(reader.poll(5000, timeout=600, wake=True)), daemon=True
        )
        waiting.start()
        _fill(kafka, topic, 2)
        waiting.join(60)  # bounded far below the poll's own 600 s
        assert not waiting.is_alive(), "the poll waited for its timeout"
        (polled,) = got
        # the first record, and whatever had arrived with it
        assert [m.value() for m in polled.records] == [b"v0", b"v1"][: len(polled.records)]
        assert polled.records
