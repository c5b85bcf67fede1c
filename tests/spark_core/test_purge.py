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
from local_stack.kafka import CLIENT_COMPILER, KafkaBroker, start_kafka
from shorelink.contract import ingress_topic
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.reading import read_to_end, written_ms
from spark_core.merge import Merger, SourceRow, start_merge
from tests.helpers import eventually, unique
from tests.spark_core.helpers import (
    assert_exactly_once,
    canonical,
    create_ingress,
    make_site,
    produce,
    record,
)

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
        jvm_opts=CLIENT_COMPILER,
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


@pytest.mark.spark
def test_the_purge_never_passes_the_spark_querys_own_position(
    spark: Any, kafka: KafkaBroker, tmp_path: Path
) -> None:
    """The ingest puller (here: its rows handed to the merge as it does) commits ahead
    of the Spark query; the next Spark batches (40 records each) still find every
    record of their planned ranges, so the query neither fails (``failOnDataLoss``)
    nor writes anything twice, and the ingress topic is freed only below where the
    query has passed."""
    b = kafka.bootstrap
    s = unique("s")
    create_ingress(b, [s], partitions=1)
    site, _ = make_site(b, tmp_path, [s], max_offsets=40)
    produce(b, [record("ship1", s, q) for q in range(1, 11)])
    first = Merger(site)
    start_merge(spark, first, available_now=True).awaitTermination(120)  # batch 0: 1-10
    produce(b, [record("ship1", s, q) for q in range(11, 111)])
    ahead = [
        SourceRow(
            m.topic() or "",
            m.partition() or 0,
            m.offset() or 0,
            m.key(),
            m.value(),
            list(m.headers() or []),
            written_ms(m),
        )
        for m in read_to_end(KafkaEndpoint.plaintext(b), [ingress_topic(s)], settled=True)
    ]
    first.write_pulled(ahead)  # as the ingest puller does: 11-110, cursor past them
    first.close()
    # the Spark query goes on from batch 0's end, 40 at a time; stopped after a batch,
    # then started again: a new consumer reads the next range from Kafka itself
    second = Merger(site)
    q = start_merge(spark, second, available_now=False)
    eventually(lambda: second.totals.batches >= 1, within=60, what="a Spark batch", interval=0.1)
    q.stop()
    second.close()
    third = Merger(site)
    q = start_merge(spark, third, available_now=True)
    q.awaitTermination(120)
    third.close()
    assert q.exception() is None
    assert second.totals.written == third.totals.written == 0
    assert_exactly_once(canonical(b, s), {("ship1", s): 110})
    # what was purged is below where the Spark query had got to, not the cursor (110+)
    eventually(
        lambda: 0 < _watermarks(b, ingress_topic(s))[0][0] < 110,
        within=20,
        what="ingress purged below the Spark query's position",
        interval=0.2,
    )
