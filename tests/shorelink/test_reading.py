"""Reading a topic to its end, on a real broker: the end a read_committed read stops
at, and the settled end a test or an audit can wait for."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer

from local_stack.kafka import KafkaBroker
from shorelink.kafka.errors import KafkaUnavailable
from shorelink.kafka.reading import read_to_end
from shorelink.kafka.topics import TopicSpec, ensure_topics
from tests.helpers import unique


def _values(broker: KafkaBroker, topic: str, **kw: object) -> list[bytes]:
    return [m.value() for m in read_to_end(broker.endpoint, [topic], **kw)]  # type: ignore[arg-type]


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
