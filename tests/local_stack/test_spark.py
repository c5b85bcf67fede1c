"""Spark in local mode reads Kafka through spark-sql-kafka-0-10 with headers: the merge
job depends on exactly this (identity travels in headers)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from local_stack.kafka import KafkaBroker
from local_stack.spark import spark_cds_archive, spark_driver_conf
from local_stack.tools import cds_flags
from shorelink.contract import H_ORIGIN, H_SEQ
from shorelink.kafka.topics import TopicSpec, ensure_topics
from spark_core.cli import spark_submit_bin
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


def test_local_drivers_map_the_class_data_archive_setup_made(spark: Any, tmp_path: Path) -> None:
    """scripts/setup made this environment's archive (``install_spark_cds``); every
    local driver (the tests' session, the voyage's and the tests' site applications) is
    given it, and a driver that must map it (``-Xshare:on``) starts with it. A truncated
    copy is not given (the JVM would crash on it)."""
    archive = spark_cds_archive()
    assert archive is not None and archive.stat().st_size > 10_000_000
    flags = cds_flags(archive)
    options = spark_driver_conf()["spark.driver.extraJavaOptions"].split()
    assert flags and all(f in options for f in flags)
    jvm = spark.sparkContext._jvm
    args = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert all(f in args for f in flags), args
    out = subprocess.run(
        [
            str(spark_submit_bin()),
            *("--conf", "spark.driver.extraJavaOptions=-Xshare:on " + " ".join(flags)),
            "--version",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and "version 4." in out.stderr, out.stderr[-500:]
    truncated = tmp_path / "truncated.jsa"
    with archive.open("rb") as f:
        truncated.write_bytes(f.read(1_000_000))
    (tmp_path / "truncated.jsa.ok").write_text(f"{archive.stat().st_size}\n")
    assert cds_flags(truncated) == []
