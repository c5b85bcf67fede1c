"""Read the site's Delta tables: one container's whole history, the latest position of
every ship (``shorelink-spark query ...``; docs/tables.md has the same as SQL)."""

from __future__ import annotations

import json
from typing import Any

from spark_core.config import SiteConfig
from spark_core.tables import table_path

__all__ = [
    "HISTORY_COLUMNS",
    "POSITION_COLUMNS",
    "container_history",
    "format_rows",
    "json_rows",
    "latest_positions",
]

HISTORY_COLUMNS = (
    "ts",
    "origin",
    "seq",
    "site",
    "mqtt_topic",
    "temperature",
    "humidity",
    "door",
    "shock",
    "battery",
    "payload",
)
POSITION_COLUMNS = ("mmsi", "ts", "lat", "lon", "sog", "cog", "heading", "origin", "seq")


def container_history(spark: Any, site: SiteConfig, container: str) -> list[Any]:
    """Every reading of ``container`` at this site, from every ship and port it was on,
    in event-time order (ties: origin, seq)."""
    from pyspark.sql import functions as F

    path = table_path(site, "container_readings")
    return (
        spark.read.format("delta")
        .load(str(path))
        .where(F.col("container") == F.lit(container))  # a value, never SQL text
        .orderBy("ts", "origin", "seq")
        .select(*HISTORY_COLUMNS)
        .collect()
    )


def latest_positions(spark: Any, site: SiteConfig) -> list[Any]:
    """The newest position (event time; ties: seq) of every MMSI in ``ship_positions``."""
    spark.read.format("delta").load(
        str(table_path(site, "ship_positions"))
    ).createOrReplaceTempView("sl_ship_positions")
    return spark.sql(
        f"""
        SELECT {", ".join(POSITION_COLUMNS)} FROM (
          SELECT *, row_number() OVER (PARTITION BY mmsi ORDER BY ts DESC, seq DESC) AS rn
          FROM sl_ship_positions WHERE mmsi IS NOT NULL
        ) WHERE rn = 1 ORDER BY mmsi
        """
    ).collect()


def json_rows(rows: list[Any], columns: tuple[str, ...]) -> list[str]:
    """One JSON object per row (times as ISO 8601 strings), for ``--json``."""
    out = []
    for r in rows:
        obj = {c: (r[c].isoformat() if hasattr(r[c], "isoformat") else r[c]) for c in columns}
        out.append(json.dumps(obj, separators=(",", ":")))
    return out


def format_rows(rows: list[Any], columns: tuple[str, ...]) -> list[str]:
    """Tab-separated lines, header first."""
    out = ["\t".join(columns)]
    for r in rows:
        out.append("\t".join("" if r[c] is None else str(r[c]) for c in columns))
    return out
