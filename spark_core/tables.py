"""Delta Lake tables built from the site's canonical topics (docs/tables.md).

- ``container_readings`` (from ``sl.containers``) and ``alerts`` (from ``sl.alerts``):
  plain Spark SQL over the Kafka rows, written by Delta's streaming sink; each commit
  carries the query's (id, batch id) transaction, the checkpoint the Kafka offsets.
- ``ship_positions`` (from ``sl.nav``): ``foreachBatch`` decodes AIS/JSON on the driver
  (``spark_core.ais``) and appends with Delta's idempotent writes (``txnAppId`` = the
  query id, ``txnVersion`` = the batch id); multi-part AIS fragments are kept in the
  small ``ais_fragments`` table so a message split across batches is still decoded.

Every table has the identity columns ``origin``, ``stream``, ``seq`` and is partitioned
by ``day`` (UTC date of the event time ``ts``).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

from shorelink.contract import canonical_topic
from shorelink.logs import get_logger
from spark_core.ais import WINDOW, NavRecord, decode_nav, fragment_info
from spark_core.config import SiteConfig
from spark_core.contract_sql import read_contract
from spark_core.location import Location, exists, read_text
from spark_core.session import trigger

__all__ = [
    "FRAGMENTS",
    "TABLES",
    "PositionsWriter",
    "TableKeeper",
    "start_table",
    "start_tables",
    "table_path",
]

log = get_logger("spark_core.tables")

#: table name -> the stream it is built from
TABLES = {"container_readings": "containers", "alerts": "alerts", "ship_positions": "nav"}
FRAGMENTS = "ais_fragments"

#: a reading's fields, read from its JSON payload (null where the payload is not JSON, a
#: field is missing or of another type)
CONTAINER_FIELDS = (
    ("temperature", "DOUBLE"),
    ("humidity", "DOUBLE"),
    ("door", "STRING"),
    ("shock", "DOUBLE"),
    ("battery", "DOUBLE"),
)
_CONTAINER_SCHEMA = ", ".join(f"{n} {t}" for n, t in CONTAINER_FIELDS)
#: strict JSON, as shorelink/strict_json.py reads it: no NaN or Infinity tokens, and a
#: number beyond a double (``1e999``) is no number either: every field null, never a
#: non-finite value a reader of the table would have to guard against
_CONTAINER_COLUMNS = tuple(
    f"IF(abs(p.{n}) < double('Infinity'), p.{n}, NULL) AS {n}" if t == "DOUBLE" else f"p.{n}"
    for n, t in CONTAINER_FIELDS
)

TopicFor = Callable[[str], str]


def table_path(site: SiteConfig, table: str) -> Location:
    """Where ``table`` is kept: under the site's table_dir, a path or a URL."""
    return site.table_dir / table


#: Kafka row -> identity and contract columns (shared by every table; the contract's
#: columns as ``Record.from_kafka`` reads them: spark_core/contract_sql.py)
BASE_COLUMNS = (
    "origin",
    "stream",
    "seq",
    "CAST(key AS STRING) AS key",
    "ts",
    "site",
    "mqtt_topic",
    "CAST(value AS STRING) AS payload",
    "topic AS kafka_topic",
    "partition AS kafka_partition",
    "offset AS kafka_offset",
)


def _source(spark: Any, site: SiteConfig, topic: str) -> Any:
    df = (
        spark.readStream.format("kafka")
        .options(**site.kafka.spark_options(), **site.merge.source_options())
        # its consumers' group and client ids name the application and site
        .option("groupIdPrefix", f"shorelink-spark-{site.name}")
        .option("subscribe", topic)
        .option("includeHeaders", "true")
        .option("startingOffsets", "earliest")
        .option("kafka.isolation.level", "read_committed")
        .option("maxOffsetsPerTrigger", str(site.merge.max_offsets_per_trigger))
        .option("failOnDataLoss", "true")
        .load()
    )
    return read_contract(df, "key", "value", "topic", "partition", "offset").selectExpr(
        *BASE_COLUMNS
    )


def _query_id(spark: Any, checkpoint: Location) -> str:
    """The streaming query's id, kept in its checkpoint (a new checkpoint, a new id)."""
    meta = json.loads(read_text(spark, checkpoint / "metadata"))
    return str(meta["id"])


class PositionsWriter:
    """``foreachBatch`` of ``ship_positions``: decode on the driver, idempotent appends."""

    def __init__(self, spark: Any, site: SiteConfig) -> None:
        self.spark = spark
        self.site = site
        self.checkpoint = site.query_checkpoint("table-ship_positions")
        self.positions = table_path(site, "ship_positions")
        self.fragments = table_path(site, FRAGMENTS)

    def _lookup(self, need: dict[str, int]) -> list[NavRecord]:
        """Stored fragments of each origin in ``[first - WINDOW, first)``."""
        from functools import reduce

        from pyspark.sql import functions as F

        if not exists(self.spark, self.fragments / "_delta_log"):
            return []
        cond = reduce(
            lambda a, b: a | b,
            [
                (F.col("origin") == o) & (F.col("seq") >= first - WINDOW) & (F.col("seq") < first)
                for o, first in need.items()
            ],
        )
        rows = (
            self.spark.read.format("delta")
            .load(str(self.fragments))
            .where(cond)
            .selectExpr("origin", "seq", "unix_millis(ts) AS ts_ms", "payload")
            .collect()
        )
        return [NavRecord(r.origin, r.seq, r.ts_ms, r.payload) for r in rows]

    def _append(
        self, rows: list[tuple[Any, ...]], schema: str, path: Location, batch_id: int
    ) -> None:
        df = (
            self.spark.createDataFrame(rows, schema)
            .selectExpr("*", "timestamp_millis(ts_ms) AS ts")
            .drop("ts_ms")
            .selectExpr("*", "to_date(ts) AS day")
        )
        (
            df.write.format("delta")
            .mode("append")
            .partitionBy("day")
            .option("txnAppId", self.app_id)
            .option("txnVersion", batch_id)
            .save(str(path))
        )

    def process_batch(self, batch: Any, batch_id: int) -> None:
        start = time.monotonic()
        self.app_id = f"shorelink-ship_positions-{_query_id(self.spark, self.checkpoint)}"
        recs = [
            NavRecord(r.origin, r.seq, int(r.ts_ms or 0), r.payload or "")
            for r in batch.where("origin IS NOT NULL AND seq IS NOT NULL")
            .selectExpr("origin", "seq", "unix_millis(ts) AS ts_ms", "payload")
            .collect()
        ]
        # 1. the multi-part fragments, so a later batch can complete their messages
        frags = []
        for r in recs:
            f = fragment_info(r.payload)
            if f is not None and f.count > 1:
                frags.append((r.origin, r.seq, r.ts_ms, r.payload))
        if frags:
            self._append(
                frags,
                "origin STRING, seq BIGINT, ts_ms BIGINT, payload STRING",
                self.fragments,
                batch_id,
            )
        # 2. the positions (a replay of this batch finds both writes already committed)
        positions, errors = decode_nav(recs, self._lookup)
        if positions:
            self._append(
                [
                    (p.origin, "nav", p.seq, p.ts_ms, p.mmsi, p.lat, p.lon, p.sog, p.cog, p.heading)
                    for p in positions
                ],
                "origin STRING, stream STRING, seq BIGINT, ts_ms BIGINT, mmsi BIGINT, lat DOUBLE,"
                " lon DOUBLE, sog DOUBLE, cog DOUBLE, heading DOUBLE",
                self.positions,
                batch_id,
            )
        log.info(
            "table_batch",
            table="ship_positions",
            site=self.site.name,
            batch=batch_id,
            input=len(recs),
            positions=len(positions),
            fragments=len(frags),
            undecodable=errors,
            duration_ms=(time.monotonic() - start) * 1000,
        )


def start_table(
    spark: Any,
    site: SiteConfig,
    table: str,
    *,
    available_now: bool = False,
    topic_for: TopicFor = canonical_topic,
) -> Any:
    """Start the streaming query that builds ``table``; returns the StreamingQuery."""
    stream = TABLES[table]
    checkpoint = site.query_checkpoint(f"table-{table}")
    df = _source(spark, site, topic_for(stream))
    name = f"table-{table}-{site.name}"
    if table == "ship_positions":
        writer = PositionsWriter(spark, site)
        w = (
            df.writeStream.queryName(name)
            .foreachBatch(writer.process_batch)
            .option("checkpointLocation", str(checkpoint))
        )
        return trigger(w, site.trigger_interval_s, available_now).start()
    cols = ["origin", "stream", "seq", "key", "ts", "site", "mqtt_topic", "payload"]
    if table == "container_readings":
        df = (
            df.selectExpr(
                *cols[:3],
                "key AS container",
                *cols[4:],
                f"from_json(payload, '{_CONTAINER_SCHEMA}',"
                " map('allowNonNumericNumbers', 'false')) AS p",
            )
            .selectExpr("*", *_CONTAINER_COLUMNS)
            .drop("p")
        )
    else:
        df = df.selectExpr(*cols)
    df = df.selectExpr("*", "to_date(ts) AS day")
    w = (
        df.writeStream.queryName(name)
        .format("delta")
        .outputMode("append")
        .partitionBy("day")
        .option("checkpointLocation", str(checkpoint))
    )
    return trigger(w, site.trigger_interval_s, available_now).start(str(table_path(site, table)))


def start_tables(
    spark: Any,
    site: SiteConfig,
    *,
    available_now: bool = False,
    topic_for: TopicFor = canonical_topic,
) -> dict[str, Any]:
    """Every table whose stream the site carries."""
    return {
        t: start_table(spark, site, t, available_now=available_now, topic_for=topic_for)
        for t, s in TABLES.items()
        if s in site.streams
    }


#: Delta's own shortest retention without its check (``retentionDurationCheck``)
_DELTA_MIN_RETENTION_S = 7 * 86400


class TableKeeper:
    """Compacts and vacuums the site's Delta tables every ``table_maintenance.interval``
    on a thread of its own, beside the queries that write them: Delta's own ``OPTIMIZE``
    (small files into few, a commit that conflicts with no append) then ``VACUUM`` (the
    files no version newer than ``retention`` needs). A table that fails (a conflict, a
    full disk) is logged and tried again next time; the queries never wait for it."""

    def __init__(self, spark: Any, site: SiteConfig) -> None:
        self.spark, self.site = spark, site
        self.config = site.table_maintenance
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: per table, for the site's metrics (spark_core/metrics.py): when it was last
        #: compacted (the keeper's start until its first round that did), its data
        #: files after that round, and its rounds that failed
        self.started = time.time()
        self.compacted_at: dict[str, float] = {}
        self.files: dict[str, int] = {}
        self.failures: dict[str, int] = {}
        if self.config.retention_s < _DELTA_MIN_RETENTION_S:
            spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
            log.warning(
                "table_retention_short",
                site=site.name,
                retention_s=self.config.retention_s,
                message="below Delta's 7 days: a reader of an older table version may lose its files",
            )

    def tables(self) -> list[Location]:
        """The site's tables that exist (a Delta log), fragments included."""
        names = [*TABLES, FRAGMENTS]
        return [
            p
            for p in (table_path(self.site, t) for t in names)
            if exists(self.spark, p / "_delta_log")
        ]

    def run_once(self) -> dict[str, tuple[int, int]]:
        """Compact and vacuum each table now: table -> (files before, files after)."""
        from delta.tables import DeltaTable

        out: dict[str, tuple[int, int]] = {}
        hours = self.config.retention_s / 3600
        for path in self.tables():
            start = time.monotonic()
            self.compacted_at.setdefault(path.name, self.started)
            self.failures.setdefault(path.name, 0)
            try:
                table = DeltaTable.forPath(self.spark, str(path))
                before = int(table.detail().collect()[0]["numFiles"])
                table.optimize().executeCompaction()
                table.vacuum(hours)
                after = int(table.detail().collect()[0]["numFiles"])
            except Exception as exc:  # a conflict, a full disk: next time
                self.failures[path.name] += 1
                log.warning(
                    "table_maintenance_failed",
                    site=self.site.name,
                    table=path.name,
                    error=str(exc)[:500],
                )
                continue
            out[path.name] = (before, after)
            self.compacted_at[path.name] = time.time()
            self.files[path.name] = after
            log.info(
                "table_maintained",
                site=self.site.name,
                table=path.name,
                files_before=before,
                files_after=after,
                duration_ms=(time.monotonic() - start) * 1000,
            )
        return out

    def start(self) -> None:
        """Every ``interval`` until :meth:`stop` (not at all when it is 0)."""
        if not self.config.interval_s:
            return
        for path in self.tables():  # overdue from now on, not from their first round
            self.compacted_at.setdefault(path.name, self.started)
            self.failures.setdefault(path.name, 0)
        self._thread = threading.Thread(
            target=self._loop, name=f"table-keeper-{self.site.name}", daemon=True
        )
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.config.interval_s):
            self.run_once()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
