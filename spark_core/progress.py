"""Every supervised query's progress, for operators: one log line per new batch and one
JSON status file for the site (``<state_dir>/queries.status.json``).

From Spark's ``StreamingQuery.lastProgress`` (a dict): batch id, input rows, rows/s in
and processed, the batch's duration, and the **lag**: Kafka records in the query's
source topics that are not processed yet, summed over partitions from each source's
``latestOffset`` minus its ``endOffset`` (what the batch read up to). The merge adds
its own figures (rows written, duplicates dropped, dead letters) in
``merge.status.json``; this file is the same for every query.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from shorelink.files import write_json_atomic
from shorelink.logs import get_logger

__all__ = [
    "ProgressReporter",
    "kafka_lag",
    "last_progress",
    "progress_since",
    "summarize",
    "topic_lags",
]

log = get_logger("spark_core.progress")


def last_progress(query: Any) -> dict[str, Any] | None:
    """A running query's ``lastProgress`` as plain JSON data (None before its first
    batch), in two calls to the JVM. pyspark's own ``lastProgress`` builds its object
    field by field over py4j, tens of calls (64 ms a call measured on 2 cores), and
    ``recentProgress`` does that for up to 100 reports (1.6 s): asked for every query
    twice a second, they kept a core of a site's driver busy."""
    report = query._jsq.lastProgress()
    return None if report is None else _parsed(report.json())


def progress_since(query: Any, after: str) -> list[dict[str, Any]]:
    """A running query's recent progress reports newer than timestamp ``after`` (as
    Spark writes them: fixed-width UTC text, so they compare as strings), oldest first,
    as plain JSON data: walked back from the newest, two JVM calls per report returned."""
    reports = query._jsq.recentProgress()
    newer: list[dict[str, Any]] = []
    for i in range(len(reports) - 1, -1, -1):
        report = _parsed(reports[i].json())
        if report is None:
            continue
        if str(report.get("timestamp") or "") <= after:
            break
        newer.append(report)
    return newer[::-1]


def _parsed(text: str) -> dict[str, Any] | None:
    data = json.loads(text)
    return data if isinstance(data, dict) else None


def kafka_lag(progress: dict[str, Any]) -> int | None:
    """Records behind the latest offsets over every Kafka source of the batch (None when
    no source reports offsets: not a Kafka query, or no batch yet)."""
    lags = topic_lags(progress)
    return sum(lags.values()) if lags else None


def topic_lags(progress: dict[str, Any]) -> dict[str, int]:
    """Records behind the latest offsets per source topic."""
    out: dict[str, int] = {}
    for source in progress.get("sources") or ():
        latest = _offsets(source.get("latestOffset"))
        end = _offsets(source.get("endOffset"))
        if latest is None or end is None:
            continue
        for (topic, part), last in latest.items():
            out[topic] = out.get(topic, 0) + max(0, last - end.get((topic, part), 0))
    return out


def _offsets(value: Any) -> dict[tuple[str, str], int] | None:
    """A Kafka source offset (JSON text or dict: topic -> partition -> offset)."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if not isinstance(value, dict):
        return None
    out: dict[tuple[str, str], int] = {}
    for topic, parts in value.items():
        if not isinstance(parts, dict):
            return None
        for part, offset in parts.items():
            if isinstance(offset, int) and offset >= 0:
                out[(str(topic), str(part))] = offset
    return out


def summarize(name: str, progress: dict[str, Any]) -> dict[str, Any]:
    """The figures an operator looks at, from one ``lastProgress``."""
    durations = progress.get("durationMs") or {}
    return {
        "query": name,
        "batch_id": progress.get("batchId"),
        "timestamp": progress.get("timestamp"),
        "input_rows": progress.get("numInputRows", 0),
        "input_rows_per_s": round(float(progress.get("inputRowsPerSecond") or 0.0), 1),
        "processed_rows_per_s": round(float(progress.get("processedRowsPerSecond") or 0.0), 1),
        "batch_duration_ms": durations.get("triggerExecution"),
        "lag_records": kafka_lag(progress),
    }


class ProgressReporter:
    """Called by the supervisor every loop with the active queries; logs each new batch
    once and rewrites the status file when something changed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._last_batch: dict[str, Any] = {}
        self._state: dict[str, dict[str, Any]] = {}

    def update(self, name: str, progress: dict[str, Any] | None, state: str) -> None:
        """``progress``: the query's ``lastProgress`` (None before its first batch);
        ``state``: running, failed, finished, stopped."""
        entry = dict(self._state.get(name) or {"query": name})
        entry["state"] = state
        if progress is not None:
            summary = summarize(name, progress)
            if self._last_batch.get(name) != summary["batch_id"]:
                self._last_batch[name] = summary["batch_id"]
                log.info(
                    "query_progress",
                    query=name,
                    batch=summary["batch_id"],
                    input_rows=summary["input_rows"],
                    rows_per_s=summary["processed_rows_per_s"],
                    batch_ms=summary["batch_duration_ms"],
                    lag_records=summary["lag_records"],
                )
            entry.update(summary)
        if entry != self._state.get(name):
            self._state[name] = entry
            self._write()

    def queries(self) -> list[dict[str, Any]]:
        """Each query's last entry (what the status file holds), for the metrics."""
        return [dict(e) for e in self._state.values()]

    def _write(self) -> None:
        write_json_atomic(
            self.path,
            {"updated_ms": int(time.time() * 1000), "queries": list(self._state.values())},
            indent=1,
        )
