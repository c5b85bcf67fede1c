"""What a gateway told a ship it holds stays in Kafka until the merge has it in the
canonical topic, however long the merge is stopped (ships delete what a site holds);
the merge then frees the ingress topic itself, one batch behind what it committed."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from core_gateway.config import parse_config as gateway_config
from core_gateway.ingress import IngressWriter
from local_stack.kafka import KafkaBroker, start_kafka
from shorelink.contract import ingress_topic
from spark_core.merge import Merger, start_merge
from tests.helpers import eventually, unique
from tests.spark_core.helpers import assert_exactly_once, canonical, make_site, produce, record

#: the broker expires anything without a retention of its own after one second
SHORT_RETENTION = {
    "log.retention.ms": "1000",
    "log.retention.check.interval.ms": "300",
    "log.roll.ms": "200",  # segments roll quickly: only closed segments expire
}


@pytest.fixture
def short_broker(stack_root: Path) -> Iterator[KafkaBroker]:
    broker = start_kafka(
        "short-retention",
        stack_root / "sites" / unique("short"),
        stack_root / "logs",
        heap="256m",
        properties=SHORT_RETENTION,
    )
    yield broker
    broker.proc.stop(grace=5)


def _watermarks(bootstrap: str, topic: str) -> list[tuple[int, int]]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("wm")})
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        return [c.get_watermark_offsets(TopicPartition(topic, p), timeout=10) for p in parts]
    finally:
        c.close()


@pytest.mark.spark
def test_ingress_outlives_a_stopped_merge_and_is_purged_once_merged(
    spark: Any, short_broker: KafkaBroker, tmp_path: Path
) -> None:
    b = short_broker.bootstrap
    s = unique("s")
    # the ingress topic exactly as a gateway creates it
    gw = gateway_config(
        {
            "site": "tokyo",
            "credentials_file": str(tmp_path / "ships.json"),
            "streams": [s],
            "kafka": {"bootstrap": b, "ingress_partitions": 2},
        }
    )
    IngressWriter(gw).ensure_topics()
    produce(b, [record("ship1", s, q, key=f"c{q % 7}") for q in range(1, 51)])
    time.sleep(1.5)
    produce(b, [record("ship1", s, q, key=f"c{q % 7}") for q in range(51, 101)])
    time.sleep(2.5)  # several retention sweeps, each far past the broker's retention
    assert all(low == 0 for low, _ in _watermarks(b, ingress_topic(s))), "ingress expired"

    site, _ = make_site(b, tmp_path, [s])
    first = Merger(site)
    start_merge(spark, first, available_now=True).awaitTermination(120)
    first.close()
    assert_exactly_once(canonical(b, s), {("ship1", s): 100})
    # next offset per partition the first run committed (its transaction markers after)
    merged = [first.state.offsets[(ingress_topic(s), p)] for p in (0, 1)]
    assert sum(merged) >= 100

    # the next batch frees what the first one committed (and only that)
    produce(b, [record("ship1", s, q, key=f"c{q % 7}") for q in range(101, 111)])
    second = Merger(site)
    start_merge(spark, second, available_now=True).awaitTermination(120)
    second.close()
    assert_exactly_once(canonical(b, s), {("ship1", s): 110})
    eventually(
        lambda: [low for low, _ in _watermarks(b, ingress_topic(s))] == merged,
        within=20,
        what=f"purged to {merged}",
        interval=0.2,
    )
    assert second._purger.requested == sum(merged) and second._purger.failures == 0
