"""Topics are made with the site's durability and the size limit of every hop: a
production cluster gets 3 replicas and min.insync.replicas 2 without a setting, a
one-broker stack what it can hold, and a setting the cluster cannot meet is a clear
error instead of a topic that silently holds less."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, OffsetSpec

from local_stack.kafka import KafkaBroker
from shorelink.config import Section
from shorelink.contract import KAFKA_MAX_MESSAGE_BYTES
from shorelink.errors import ConfigError
from shorelink.kafka.admin import Admin
from shorelink.kafka.reading import read_to_end
from shorelink.kafka.topics import Durability, TopicError, TopicSpec, ensure_topics
from tests.helpers import unique


@pytest.mark.parametrize(
    ("durability", "brokers", "expected"),
    [
        (Durability(), 1, (1, 1)),
        (Durability(), 2, (2, 2)),
        (Durability(), 3, (3, 2)),
        (Durability(), 9, (3, 2)),
        (Durability(2, None), 5, (2, 2)),
        (Durability(5, 3), 5, (5, 3)),
    ],
)
def test_durability_defaults_to_production_as_far_as_the_cluster_allows(
    durability: Durability, brokers: int, expected: tuple[int, int]
) -> None:
    assert durability.resolve(brokers) == expected


def test_durability_the_cluster_cannot_hold_is_an_error() -> None:
    with pytest.raises(TopicError, match="replication_factor 3 > the 1 broker"):
        Durability(3).resolve(1)
    with pytest.raises(ConfigError, match="min_insync_replicas"):
        Durability.from_section(Section({"replication_factor": 2, "min_insync_replicas": 3}))
    assert Durability.from_section(Section({})) == Durability()


def test_a_cluster_that_lists_no_broker_is_asked_again_not_refused() -> None:
    """CI: a metadata answer listed no broker (a broker fenced a moment, its heartbeat
    to the controller late on a loaded machine), and creating a topic failed with
    "replication_factor 1 > the 0 broker(s)", not retriable: a gateway's start, or a
    test, ended on it. No broker is a cluster not ready yet: ``ensure_topics`` asks
    again within its timeout, and what is left after it can be retried."""
    with pytest.raises(TopicError, match="no broker") as info:
        Durability().resolve(0)
    assert info.value.retryable
    with pytest.raises(TopicError, match="no broker"):
        Durability(1).resolve(0)


def test_topics_carry_the_size_limit_and_min_insync(kafka: KafkaBroker) -> None:
    topic = unique("t")
    assert ensure_topics(kafka.endpoint, [TopicSpec(topic, retention_ms=-1)]) == [topic]
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    (fut,) = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)]).values()
    cfg = {k: v.value for k, v in fut.result(timeout=10).items()}
    assert cfg["max.message.bytes"] == str(KAFKA_MAX_MESSAGE_BYTES)
    assert cfg["min.insync.replicas"] == "1"
    assert cfg["retention.ms"] == "-1"
    with pytest.raises(TopicError, match="broker"):
        ensure_topics(kafka.endpoint, [TopicSpec(unique("t"))], durability=Durability(3))


def test_created_topics_can_be_read_as_soon_as_ensure_topics_returns(
    kafka: KafkaBroker,
) -> None:
    """The controller knows a new topic before the broker's metadata does; a reader in
    between was told "no topic" (the merge's first load, under a loaded CI). Twenty
    topics in one round, then a read of all of them at once, with no wait between."""
    names = [unique("fresh") for _ in range(20)]
    specs = [TopicSpec(n, partitions=3) for n in names]
    assert sorted(ensure_topics(kafka.endpoint, specs)) == sorted(names)
    assert list(read_to_end(kafka.endpoint, names, timeout=30)) == []


def test_the_offsets_of_partitions_just_created_are_answered(kafka: KafkaBroker) -> None:
    """CI: a merge asked where its new topics end right after making them, and the
    broker answered NOT_LEADER_FOR_PARTITION for a partition it had not made yet (the
    controller had): the merge failed to start. ``Admin.offsets`` asks such a partition
    again (a leader moving) within its timeout. Twenty topics of three partitions, asked
    at once with no wait: every partition answers, at offset 0 (an idle machine met the
    race 8 times in 5 rounds of this)."""
    for _ in range(3):
        names = [unique("fresh") for _ in range(20)]
        ensure_topics(kafka.endpoint, [TopicSpec(n, partitions=3) for n in names])
        parts = [(n, p) for n in names for p in range(3)]
        got = Admin(kafka.endpoint).offsets(parts, OffsetSpec.latest())
        assert {tp: info.offset for tp, info in got.items()} == dict.fromkeys(parts, 0)
