"""Kafka lag and the status file from a query's progress report (spark_core/progress.py),
on the JSON shape Spark writes (offsets as topic -> partition -> offset), and that report
read from a real query."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from spark_core.metrics import serve_metrics
from spark_core.progress import (
    ProgressReporter,
    kafka_lag,
    last_progress,
    progress_since,
    summarize,
)
from tests.helpers import build_info_line, eventually

PROGRESS = {
    "batchId": 7,
    "timestamp": "2026-11-21T16:00:00.000Z",
    "numInputRows": 120,
    "inputRowsPerSecond": 40.0,
    "processedRowsPerSecond": 80.5,
    "durationMs": {"triggerExecution": 1490},
    "sources": [
        {
            "description": "KafkaV2[SubscribePattern[sl\\.ingress\\..*]]",
            "endOffset": {"sl.ingress.containers": {"0": 100, "1": 90}},
            "latestOffset": {"sl.ingress.containers": {"0": 130, "1": 90}},
        },
        {
            "description": "KafkaV2[Subscribe[sl.inbox.hq.containers]]",
            "endOffset": json.dumps({"sl.inbox.hq.containers": {"0": 5}}),
            "latestOffset": json.dumps({"sl.inbox.hq.containers": {"0": 17}}),
        },
    ],
}


def test_lag_sums_what_is_behind_the_latest_offsets_over_sources_and_partitions() -> None:
    assert kafka_lag(PROGRESS) == 30 + 0 + 12
    assert kafka_lag({"sources": [{"description": "rate"}]}) is None
    assert summarize("merge", PROGRESS) == {
        "query": "merge",
        "batch_id": 7,
        "timestamp": "2026-11-21T16:00:00.000Z",
        "input_rows": 120,
        "input_rows_per_s": 40.0,
        "processed_rows_per_s": 80.5,
        "batch_duration_ms": 1490,
        "lag_records": 42,
    }


def test_status_file_keeps_each_querys_last_report(tmp_path: Path) -> None:
    path = tmp_path / "queries.status.json"
    rep = ProgressReporter(path)
    rep.update("merge", None, "starting")
    rep.update("table-alerts", PROGRESS, "running")
    rep.update("merge", PROGRESS, "running")
    rep.update("merge", None, "failed")  # keeps the last figures, says it failed
    queries = {q["query"]: q for q in json.loads(path.read_text())["queries"]}
    assert queries["merge"]["state"] == "failed" and queries["merge"]["lag_records"] == 42
    assert queries["table-alerts"]["batch_id"] == 7


def test_the_metrics_endpoint_shows_each_querys_figures(tmp_path: Path) -> None:
    """Issue 25 (metrics): the site application's Prometheus endpoint carried
    replication, pullers and merges, not what ``shorelink-spark status`` shows per
    query. Served by the real exporter on a free port and scraped over HTTP."""
    rep = ProgressReporter(tmp_path / "queries.status.json")
    rep.update("merge", PROGRESS, "running")
    rep.update("table-alerts", None, "failed")
    server = serve_metrics("127.0.0.1", 0, None, [], rep, spark_version="4.2.0")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/metrics") as r:
            text = r.read().decode()
    finally:
        server.shutdown()
    got = {
        (m.name, tuple(sorted(m.labels.items()))): m.value
        for fam in text_string_to_metric_families(text)
        for m in fam.samples
    }
    assert got[("shorelink_spark_query_state", (("query", "merge"), ("state", "running")))] == 1
    assert got[("shorelink_spark_query_state", (("query", "table-alerts"), ("state", "failed")))]
    assert got[("shorelink_spark_query_lag_records", (("query", "merge"),))] == 42
    assert got[("shorelink_spark_query_batch_seconds", (("query", "merge"),))] == 1.49
    assert got[("shorelink_spark_query_rows_per_second", (("query", "merge"),))] == 80.5
    assert ("shorelink_spark_query_lag_records", (("query", "table-alerts"),)) not in got
    assert got[("process_open_fds", ())] > 0
    # the build the application runs, and the Spark it runs on
    assert build_info_line("spark", spark="4.2.0") in text


def test_last_and_recent_progress_are_the_querys_own_reports(spark: Any) -> None:
    """On a real query: None before the first batch, then the reports pyspark's own
    ``lastProgress`` and ``recentProgress`` give (all, or those newer than a time), as plain JSON data."""
    query = (
        spark.readStream.format("rate")  # type: ignore[attr-defined]
        .option("rowsPerSecond", 50)
        .load()
        .writeStream.format("noop")
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        first = last_progress(query)
        assert first is None or first["batchId"] == 0
        eventually(lambda: (last_progress(query) or {}).get("batchId", -1) >= 2, 60, "batches")
        query.stop()
        mine, theirs = last_progress(query), json.loads(query.lastProgress.json)
        assert mine == theirs and isinstance(mine["numInputRows"], int)
        theirs_all = [json.loads(p.json) for p in query.recentProgress]
        assert progress_since(query, "") == theirs_all
        assert progress_since(query, theirs_all[0]["timestamp"]) == theirs_all[1:]
        assert progress_since(query, mine["timestamp"]) == []
    finally:
        query.stop()
