"""The admin client's failures leave as the Kafka error tree, never as librdkafka's
exception or a bare ``TimeoutError``: every caller (topics, access, the consumer, audit,
routing) catches the tree's types and reads ``retryable`` from them, so a failure
mapped nowhere would escape each of them as a stack trace."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import ConfigResource, ResourceType

from shorelink.kafka.admin import Admin
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.errors import KafkaUnavailable


def test_an_unreachable_cluster_and_an_unanswered_future_are_kafka_unavailable() -> None:
    """Nothing listens on port 1: the metadata call fails, and a request's future is
    never answered within the timeout (librdkafka would wait its own 30 s)."""
    admin = Admin(KafkaEndpoint.plaintext("127.0.0.1:1", timeout_s=0.5), {"log_level": 0})
    with pytest.raises(KafkaUnavailable, match=r"at 127\.0\.0\.1:1") as listed:
        admin.metadata(what="Kafka at 127.0.0.1:1")
    assert listed.value.retryable and listed.value.code is not None
    futures = admin.client.describe_configs([ConfigResource(ResourceType.TOPIC, "t")])
    (future,) = futures.values()
    with pytest.raises(KafkaUnavailable, match=r"describing t: no answer within 0.5s") as waited:
        admin.wait(future, "describing t")
    assert waited.value.retryable and isinstance(waited.value.__cause__, TimeoutError)
