"""Kafka lag and the status file from a query's progress report (spark_core/progress.py),
on the JSON shape Spark writes (offsets as topic -> partition -> offset)."""

from __future__ import annotations

import json
from pathlib import Path

from spark_core.progress import ProgressReporter, kafka_lag, summarize

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
