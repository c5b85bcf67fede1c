"""Tables and checkpoints at a Hadoop filesystem URL: a site whose ``table_dir`` and
``checkpoint_dir`` are ``s3a://`` URLs writes its Delta table and its streaming
checkpoint to an S3-compatible server (moto's, on loopback) and reads both back, and the
driver's own look at them (a table's log, a checkpoint's id and offsets, a checkpoint
dropped) goes through Hadoop's filesystem, not the local disk. A data centre's site
keeps both in an object store: a path-only site could not."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from local_stack.kafka import KafkaBroker
from local_stack.process import free_ports
from shorelink.contract import Record
from shorelink.errors import ConfigError
from shorelink.identity import Identity
from shorelink.kafka.topics import TopicSpec, ensure_topics
from spark_core import location
from spark_core.config import parse_config
from spark_core.location import Location
from spark_core.packages import filesystem_packages, hadoop_version, spark_home
from spark_core.purge import spark_position
from spark_core.tables import TableKeeper, _query_id, start_table, table_path
from tests.helpers import unique
from tests.spark_core.helpers import make_site, produce_raw, site_doc

T0 = 1_700_000_000_000
KEY, SECRET = "shorelink-test", "shorelink-test-secret"


@pytest.fixture(scope="module")
def bucket(spark: Any) -> Iterator[tuple[str, Any]]:
    """A bucket on moto's S3 server on loopback, and the shared session's Hadoop told
    where it is (per-bucket keys: nothing else of the session changes); boto3's client
    to look at it from outside Spark."""
    import boto3
    from moto.server import ThreadedMotoServer

    # hadoop-aws and its AWS SDK (686 MB) into this session only: through Ivy, as
    # spark.jars.packages would, from the cache scripts/setup filled; local mode copies
    # every added jar, so the shared session does not carry them for every test
    for package in filesystem_packages(["s3a://"]):
        spark.sql(f"ADD JAR 'ivy://{package}?transitive=true'")

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per request
    (port,) = free_ports(1, "127.0.0.1")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    name = unique("sl").replace("_", "-").lower()
    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=KEY,
        aws_secret_access_key=SECRET,
        region_name="us-east-1",
    )
    s3.create_bucket(Bucket=name)
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    # Hadoop finds a filesystem's class through its configuration's class loader: the
    # session's, which holds the jars ADD JAR added
    hadoop.setClassLoader(spark._jsparkSession.sharedState().jarClassLoader())
    for k, v in {
        "endpoint": endpoint,
        "endpoint.region": "us-east-1",
        "path.style.access": "true",
        "connection.ssl.enabled": "false",
        "access.key": KEY,
        "secret.key": SECRET,
        "aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
    }.items():
        hadoop.set(f"fs.s3a.bucket.{name}.{k}", v)
    # tiny tables: Delta snapshots rebuilt with 2 tasks instead of 50 (test_tables.py)
    snapshot = "spark.databricks.delta.snapshotPartitions"
    old = spark.conf.get(snapshot, None)
    spark.conf.set(snapshot, "2")
    try:
        yield name, s3
    finally:
        if old is None:
            spark.conf.unset(snapshot)
        else:
            spark.conf.set(snapshot, old)
        s3.close()
        server.stop()


def _keys(s3: Any, bucket: str, prefix: str) -> list[str]:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return [o["Key"] for page in pages for o in page.get("Contents", [])]


def _reading(seq: int, temp: float) -> Record:
    return Record(
        Identity("ship-s3", "containers", seq),
        b"C1",
        json.dumps({"temperature": temp}).encode(),
        T0 + seq,
        "tokyo",
        "ship/ship-s3/C1",
    )


def _produce(bootstrap: str, topic: str, records: list[Record]) -> None:
    produce_raw(bootstrap, topic, [(r.key, r.value, r.headers()) for r in records])


@pytest.mark.spark
def test_delta_table_and_checkpoint_at_an_s3a_url_are_written_and_read_back(
    spark: Any, kafka: KafkaBroker, bucket: tuple[str, Any], tmp_path: Path
) -> None:
    name, s3 = bucket
    site, _ = make_site(kafka.bootstrap, tmp_path, ["containers"], tables=True)
    root = f"s3a://{name}/{site.name}"
    site = dataclasses.replace(
        site,
        checkpoint_dir=Location(f"{root}/checkpoints"),
        table_dir=Location(f"{root}/tables"),
        state_dir=tmp_path / "state",
    )
    topic = unique("s3.containers")
    ensure_topics(kafka.endpoint, [TopicSpec(topic, partitions=1)])

    def run() -> None:
        q = start_table(
            spark, site, "container_readings", available_now=True, topic_for=lambda _: topic
        )
        assert q.awaitTermination(120) and q.exception() is None

    _produce(kafka.bootstrap, topic, [_reading(s, 4.0 + s) for s in range(1, 4)])
    run()
    table = table_path(site, "container_readings")
    checkpoint = site.query_checkpoint("table-container_readings")
    # in the object store, not on this disk
    objects = _keys(s3, name, f"{site.name}/")
    assert any(k.startswith(f"{site.name}/tables/container_readings/_delta_log/") for k in objects)
    assert f"{site.name}/checkpoints/table-container_readings/commits/0" in objects
    assert not any(p.name in ("tables", "checkpoints") for p in tmp_path.iterdir())

    # the second run starts where the checkpoint in the store says: only the new records
    _produce(kafka.bootstrap, topic, [_reading(s, 4.0 + s) for s in range(4, 6)])
    run()
    rows = spark.read.format("delta").load(str(table)).orderBy("seq").collect()
    assert [(r.seq, r.container, r.temperature) for r in rows] == [
        (s, "C1", 4.0 + s) for s in range(1, 6)
    ]

    # the driver's own reads go through Hadoop's filesystem
    assert location.exists(spark, table / "_delta_log")
    assert TableKeeper(spark, site).tables() == [table]
    meta = json.loads(location.read_text(spark, checkpoint / "metadata"))
    assert _query_id(spark, checkpoint) == meta["id"]
    assert spark_position(checkpoint, 1, spark) == {(topic, 0): 3}
    with pytest.raises(FileNotFoundError):
        location.read_text(spark, checkpoint / "no-such-file")
    location.delete(spark, checkpoint)
    assert not location.exists(spark, checkpoint)
    assert not _keys(s3, name, f"{site.name}/checkpoints/table-container_readings/")


def test_a_url_checkpoint_dir_needs_a_local_state_dir(tmp_path: Path) -> None:
    """The status files `shorelink-spark status` reads are written locally with a
    rename: a site whose checkpoints are at a URL names where they go."""
    doc = site_doc("127.0.0.1:9092", tmp_path, ["containers"], name="tokyo")
    site = doc["sites"]["tokyo"]
    site["checkpoint_dir"] = "s3a://bucket/tokyo/checkpoints"
    site["table_dir"] = "abfss://c@account.dfs.core.windows.net/tokyo"
    with pytest.raises(ConfigError) as err:
        parse_config(doc, base=tmp_path)
    assert err.value.field == "sites.tokyo.state_dir"
    site["state_dir"] = "state"
    parsed = parse_config(doc, base=tmp_path).site("tokyo")
    assert parsed.state_path == tmp_path / "state"
    assert str(parsed.query_checkpoint("merge")) == "s3a://bucket/tokyo/checkpoints/merge"
    assert str(parsed.table_dir / "alerts") == "abfss://c@account.dfs.core.windows.net/tokyo/alerts"
    with pytest.raises(TypeError):
        Path(parsed.checkpoint_dir)


def test_site_packages_follow_the_urls_and_the_sparks_hadoop() -> None:
    """s3a:// adds hadoop-aws of the Hadoop the Spark carries (another Hadoop's module
    fails at its first call); abfss:// hadoop-azure; a path or hdfs:// nothing."""
    hadoop = hadoop_version(spark_home())
    assert filesystem_packages(["s3a://b/x", "/var/lib/x"]) == (
        f"org.apache.hadoop:hadoop-aws:{hadoop}",
    )
    assert filesystem_packages(["abfss://c@a.dfs.core.windows.net/x", "s3a://b"]) == (
        f"org.apache.hadoop:hadoop-aws:{hadoop}",
        f"org.apache.hadoop:hadoop-azure:{hadoop}",
    )
    assert filesystem_packages(["hdfs://nn/x", "/data", "file:///x"]) == ()
