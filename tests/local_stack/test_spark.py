"""Spark in local mode reads Kafka through spark-sql-kafka-0-10 with headers: the merge
job depends on exactly this (identity travels in headers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from local_stack.kafka import KafkaBroker
from shorelink.contract import H_ORIGIN, H_SEQ
from shorelink.kafka.topics import TopicSpec, ensure_topics
from tests.helpers import unique

pytestmark = pytest.mark.spark


def _produce(bootstrap: str, topic: str, n: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(1, n + 1):
        p.produce(
            topic,
            key=f"c{i % 3}".encode(),
            value=f"v{i}".encode(),
            headers=[(H_ORIGIN, b"ship1"), (H_SEQ, str(i).encode())],
        )
    assert p.flush(10) == 0


def _header(row: Any, name: str) -> str:
    return next(bytes(h["value"]).decode() for h in row["headers"] if h["key"] == name)


def test_spark_batch_read_sees_kafka_headers(spark: Any, kafka: KafkaBroker) -> None:
    topic = unique("spark-batch")
    ensure_topics(kafka.endpoint, [TopicSpec(topic, partitions=2)])
    _produce(kafka.bootstrap, topic, 12)
    rows = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap)
        .option("subscribe", topic)
        .option("includeHeaders", "true")
        .load()
        .collect()
    )
    assert len(rows) == 12
    seqs = sorted(int(_header(r, H_SEQ)) for r in rows)
    assert seqs == list(range(1, 13))
    assert {_header(r, H_ORIGIN) for r in rows} == {"ship1"}
    assert {bytes(r["value"]) for r in rows} == {f"v{i}".encode() for i in range(1, 13)}


def test_spark_streaming_available_now_reads_everything_then_stops(
    spark: Any, kafka: KafkaBroker, tmp_path: Path
) -> None:
    topic = unique("spark-stream")
    ensure_topics(kafka.endpoint, [TopicSpec(topic)])
    _produce(kafka.bootstrap, topic, 7)
    seen: list[int] = []

    def collect(df: Any, _batch_id: int) -> None:
        seen.extend(int(_header(r, H_SEQ)) for r in df.collect())

    query = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("includeHeaders", "true")
        .load()
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert not query.isActive
    assert sorted(seen) == list(range(1, 8))

    # a second run from the same checkpoint sees only what is new
    _produce(kafka.bootstrap, topic, 2)
    seen.clear()
    q2 = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap)
        .option("subscribe", topic)
        .option("includeHeaders", "true")
        .load()
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    q2.awaitTermination(120)
    assert sorted(seen) == [1, 2]
