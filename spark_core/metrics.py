"""Prometheus metrics of a site's application (``[sites.S.metrics]``, off unless
``listen.port`` is set): replication per neighbour and stream (the same figures as
``replication.status.json``, read from memory at each scrape), the pullers, the merges.

Names start ``shorelink_spark_``; a counter's name gets ``_total`` from the client:

- ``build_info{version,python,spark}``: 1, the build the application runs and the
  Spark it runs on;
- ``link_up{neighbour}``: 1 while the neighbour's Kafka answers the link probe;
- ``link_failing{neighbour}``: 1 while the site routes around the neighbour because its
  pullers from it kept failing (spark_core/routing.py, ``LinkState.note_pulls``);
- ``replication_lag_records{neighbour,stream}`` and ``replication_lag_seconds``: what
  the site has not read yet of the relay topics routed through the neighbour, and for
  how long it has been behind (absent while not known);
- ``replication_state{neighbour,stream,state}``: 1 for the stream's state (``up``,
  ``catching_up``, ``down``, ``idle``), so an alert rule can say "down for 5 minutes";
- ``pulled_records_total{puller}``, ``pulled_batches_total``, ``pull_gap_records_total``
  (records lost to a neighbour's retention before they were read), ``puller_failing``,
  ``pull_unproved_records_total{puller}`` and ``pull_parks_total{puller}`` (a feed parked
  for bringing too many unproved records: spark_core/feed_guard.py);
- ``merged_records_total{merge,outcome}`` (written, duplicate, dead, unproved: pulled
  records whose ship's proof failed, dead-lettered too; skipped; foreign: of another
  shard's origins, in a topic every shard of a merge split by origin reads whole),
  ``merge_batches_total{merge}``, ``merge_failures_total{merge}``,
  ``redriven_records_total{merge,cause,outcome}`` (dead letters whose cause changed,
  tried again: written, duplicate, refused; spark_core/redrive.py),
  ``quarantined_records_total{merge,stream,cause}`` (what the merge's batches
  dead-lettered, per cause: spark_core/quarantine.py),
  ``merge_batches_sliced_total{merge}`` and ``merge_largest_fetch_bytes{merge}`` (a
  Spark batch over ``merge.max_batch_bytes`` is written in slices);
- repair by identity (spark_core/repair.py): ``holds_all`` (1 when the site held
  everything each neighbour held at the last round, 0 when not; absent before every
  neighbour was compared once), ``repair_lacking{neighbour,stream}`` (seqs the
  neighbour holds and the site does not), ``repaired_records_total{neighbour,stream}``;
- per Spark query (merges, tables: what ``shorelink-spark status`` shows, from the
  supervisor's :class:`~spark_core.progress.ProgressReporter`): ``query_state{query,
  state}`` (1 for running, failed, finished or stopped), ``query_batch{query}``,
  ``query_lag_records{query}``, ``query_rows_per_second{query}``,
  ``query_batch_seconds{query}`` (absent until the query's first batch);
- table maintenance (spark_core/tables.py, ``TableKeeper``; absent when its interval is
  0): ``table_maintenance_interval_seconds``, ``table_compacted_timestamp_seconds{table}``
  (when the table was last compacted and vacuumed; the keeper's start until its first
  round that did, so a table never compacted is overdue too),
  ``table_files{table}`` (its data files after that round),
  ``table_maintenance_failures_total{table}``.

Every family is served from the first scrape, without samples while nothing is known,
so a dashboard or an alert rule names only what the application serves
(tests/test_monitoring.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client import (
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from shorelink.fleet.follow import RegistryFollower
from shorelink.metrics import process_registry

__all__ = ["STATES", "SiteCollector", "serve_metrics", "site_registry"]

P = "shorelink_spark_"
#: a replicated stream's states (spark_core/replication.py, ``Replicator.status``)
STATES = ("up", "catching_up", "down", "idle")


class SiteCollector(Collector):
    """Reads the replicator and the merges at each scrape (no state of its own)."""

    def __init__(
        self, replicator: Any, mergers: Sequence[Any], progress: Any = None, keeper: Any = None
    ) -> None:
        self.replicator = replicator
        self.mergers = list(mergers)
        self.progress = progress
        self.keeper = keeper

    def collect(self) -> Iterator[Metric]:
        yield from self._replication()
        yield from self._registry()
        yield from self._merges()
        yield from self._queries()
        yield from self._tables()

    def _registry(self) -> Iterator[Metric]:
        """The fleet registry the merges enforce (``fleet_pub_file``)."""
        follower = next(
            (m.ship_keys for m in self.mergers if isinstance(m.ship_keys, RegistryFollower)), None
        )
        if follower is None:
            return
        yield GaugeMetricFamily(
            P + "registry_version",
            "Version of the newest fleet registry entry this site's merges enforce",
            value=follower.version,
        )
        refused = CounterMetricFamily(
            P + "registry_entries_refused",
            "Fleet registry entries refused, by reason",
            labels=["reason"],
        )
        for reason, n in sorted(follower.refused.items()):
            refused.add_metric([reason], n)
        yield refused

    def _tables(self) -> Iterator[Metric]:
        keeper = self.keeper
        if keeper is None:
            return
        interval = GaugeMetricFamily(
            P + "table_maintenance_interval_seconds",
            "How often the tables are compacted and vacuumed (table_maintenance.interval)",
        )
        compacted = GaugeMetricFamily(
            P + "table_compacted_timestamp_seconds",
            "When the table was last compacted and vacuumed (the keeper's start before that)",
            labels=["table"],
        )
        files = GaugeMetricFamily(
            P + "table_files", "The table's data files after its last compaction", labels=["table"]
        )
        failures = CounterMetricFamily(
            P + "table_maintenance_failures",
            "Compaction rounds of the table that failed (tried again next interval)",
            labels=["table"],
        )
        if keeper.config.interval_s:
            interval.add_metric([], keeper.config.interval_s)
            # copies: the keeper's thread adds tables meanwhile
            for table, at in sorted(dict(keeper.compacted_at).items()):
                compacted.add_metric([table], at)
            for table, n in sorted(dict(keeper.files).items()):
                files.add_metric([table], float(n))
            for table, n in sorted(dict(keeper.failures).items()):
                failures.add_metric([table], float(n))
        yield from (interval, compacted, files, failures)

    def _queries(self) -> Iterator[Metric]:
        if self.progress is None:
            return
        state = GaugeMetricFamily(
            P + "query_state", "1 for the Spark query's state", labels=["query", "state"]
        )
        figures = {
            "batch_id": GaugeMetricFamily(
                P + "query_batch", "The query's last batch id", labels=["query"]
            ),
            "lag_records": GaugeMetricFamily(
                P + "query_lag_records", "Records the query has not read yet", labels=["query"]
            ),
            "processed_rows_per_s": GaugeMetricFamily(
                P + "query_rows_per_second", "Rows processed per second", labels=["query"]
            ),
        }
        seconds = GaugeMetricFamily(
            P + "query_batch_seconds", "How long the last batch took", labels=["query"]
        )
        for q in self.progress.queries():
            state.add_metric([q["query"], q.get("state", "")], 1.0)
            for key, family in figures.items():
                if isinstance(q.get(key), (int, float)):
                    family.add_metric([q["query"]], float(q[key]))
            if isinstance(q.get("batch_duration_ms"), (int, float)):
                seconds.add_metric([q["query"]], q["batch_duration_ms"] / 1000)
        yield from (state, *figures.values(), seconds)

    def _replication(self) -> Iterator[Metric]:
        rep = self.replicator
        if rep is None:
            return
        status = rep.status()
        up = GaugeMetricFamily(P + "link_up", "Neighbour's Kafka answers", labels=["neighbour"])
        failing = GaugeMetricFamily(
            P + "link_failing",
            "Routed around: the pullers from the neighbour kept failing",
            labels=["neighbour"],
        )
        lag_r = GaugeMetricFamily(
            P + "replication_lag_records",
            "Records of the relay topics routed through the neighbour not read yet",
            labels=["neighbour", "stream"],
        )
        lag_s = GaugeMetricFamily(
            P + "replication_lag_seconds",
            "Seconds since the site fell behind on what the neighbour offers (0: caught up)",
            labels=["neighbour", "stream"],
        )
        state = GaugeMetricFamily(
            P + "replication_state",
            "1 for the stream's replication state from the neighbour",
            labels=["neighbour", "stream", "state"],
        )
        for n, info in sorted(status["neighbours"].items()):
            up.add_metric([n], 1.0 if info["state"] == "up" else 0.0)
            failing.add_metric([n], 0.0 if info.get("failing_until") is None else 1.0)
            for stream, st in sorted(info["streams"].items()):
                if st["lag_records"] is not None:
                    lag_r.add_metric([n, stream], float(st["lag_records"]))
                if st["lag_s"] is not None:
                    lag_s.add_metric([n, stream], float(st["lag_s"]))
                for s in STATES:
                    state.add_metric([n, stream, s], 1.0 if st["state"] == s else 0.0)
        yield from (up, failing, lag_r, lag_s, state)
        yield from _repair(status)
        read = CounterMetricFamily(P + "pulled_records", "Records pulled", labels=["puller"])
        batches = CounterMetricFamily(
            P + "pulled_batches", "Batches handed to the merge", labels=["puller"]
        )
        gaps = CounterMetricFamily(
            P + "pull_gap_records",
            "Records a neighbour's retention deleted before they were read",
            labels=["puller"],
        )
        skipped = CounterMetricFamily(
            P + "pull_skipped_held_offsets",
            "Relay offsets a first read skipped, the neighbour's relay index proving them held",
            labels=["puller"],
        )
        failing = GaugeMetricFamily(
            P + "puller_failing", "1 while the puller's last round failed", labels=["puller"]
        )
        unproved = CounterMetricFamily(
            P + "pull_unproved_records",
            "Pulled records the merge found unproved (spark_core/feed_guard.py)",
            labels=["puller"],
        )
        parks = CounterMetricFamily(
            P + "pull_parks",
            "Times a neighbour's feed was parked for bringing too many unproved records",
            labels=["puller"],
        )
        for name, p in sorted(status["pullers"].items()):
            read.add_metric([name], float(p["read"]))
            batches.add_metric([name], float(p["batches"]))
            gaps.add_metric([name], float(p["gaps"]))
            skipped.add_metric([name], float(p.get("skipped_held", 0)))
            failing.add_metric([name], 1.0 if p["error"] else 0.0)
            unproved.add_metric([name], float(p.get("unproved", 0)))
            parks.add_metric([name], float(p.get("parks", 0)))
        yield from (read, batches, gaps, skipped, failing, unproved, parks)

    def _merges(self) -> Iterator[Metric]:
        merged = CounterMetricFamily(
            P + "merged_records", "Records the merge handled", labels=["merge", "outcome"]
        )
        batches = CounterMetricFamily(P + "merge_batches", "Merge batches", labels=["merge"])
        failures = CounterMetricFamily(
            P + "merge_failures", "Merge batches that failed (retried)", labels=["merge"]
        )
        sliced = CounterMetricFamily(
            P + "merge_batches_sliced",
            "Spark batches over merge.max_batch_bytes, written in slices",
            labels=["merge"],
        )
        largest = GaugeMetricFamily(
            P + "merge_largest_fetch_bytes",
            "The most the driver took of one Spark batch (Arrow bytes)",
            labels=["merge"],
        )
        redriven = CounterMetricFamily(
            P + "redriven_records",
            "Dead letters tried again after a change of the ship keys (spark_core/redrive.py)",
            labels=["merge", "cause", "outcome"],
        )
        quarantined = CounterMetricFamily(
            P + "quarantined_records",
            "Records a merge quarantined in sl.dead.<stream>, per cause (spark_core/quarantine.py)",
            labels=["merge", "stream", "cause"],
        )
        for m in self.mergers:
            t = m.totals
            for key, n in sorted(t.quarantined.items()):
                stream, _, cause = key.rpartition(":")
                quarantined.add_metric([m.query, stream, cause], float(n))
            for key, n in sorted(t.redriven.items()):
                cause, _, outcome = key.partition(":")
                redriven.add_metric([m.query, cause, outcome], float(n))
            sliced.add_metric([m.query], float(t.sliced))
            largest.add_metric([m.query], float(t.largest_fetch_bytes))
            for outcome, n in (
                ("written", t.written),
                ("duplicate", t.duplicates),
                ("dead", t.dead - t.unproved),
                ("unproved", t.unproved),
                ("skipped", t.skipped),
                ("foreign", t.foreign),
            ):
                merged.add_metric([m.query, outcome], float(n))
            batches.add_metric([m.query], float(t.batches))
            failures.add_metric([m.query], float(t.failures))
        yield from (merged, batches, failures, sliced, largest, redriven, quarantined)


def site_registry(
    replicator: Any,
    mergers: Sequence[Any],
    progress: Any = None,
    keeper: Any = None,
    *,
    spark_version: str = "",
) -> CollectorRegistry:
    """What a site's application serves: the driver's own figures (RSS, CPU seconds,
    open files, Python, this build and ``spark_version``, the Spark the application runs
    on: ``shorelink_spark_build_info``), then the site's."""
    registry = process_registry("spark", spark=spark_version)
    registry.register(SiteCollector(replicator, mergers, progress, keeper))
    return registry


def serve_metrics(
    host: str,
    port: int,
    replicator: Any,
    mergers: Sequence[Any],
    progress: Any = None,
    keeper: Any = None,
    *,
    spark_version: str = "",
) -> Any:
    """Serve the site's metrics (:func:`site_registry`) on ``host:port`` (0: a free
    port) in a thread of its own; returns the server (``server_port``, ``shutdown()``)."""
    registry = site_registry(replicator, mergers, progress, keeper, spark_version=spark_version)
    server, _thread = start_http_server(port, host, registry=registry)
    return server


def _repair(status: dict[str, Any]) -> Iterator[Metric]:
    """Repair by identity, from the replication status (spark_core/repair.py)."""
    lacking = GaugeMetricFamily(
        P + "repair_lacking",
        "Seqs the neighbour holds and this site does not (at the last comparison)",
        labels=["neighbour", "stream"],
    )
    repaired = CounterMetricFamily(
        P + "repaired_records",
        "Records this site took from the neighbour's canonical topic by identity",
        labels=["neighbour", "stream"],
    )
    for n, info in sorted(status["neighbours"].items()):
        totals: dict[str, list[float]] = {}
        for r in (info.get("repair") or {}).values():
            for stream, count in r["lacking"].items():
                totals.setdefault(stream, [0.0, 0.0])[0] += count
            for stream, count in r["repaired"].items():
                totals.setdefault(stream, [0.0, 0.0])[1] += count
        for stream, (lack, done) in sorted(totals.items()):
            lacking.add_metric([n, stream], lack)
            repaired.add_metric([n, stream], done)
    holds = GaugeMetricFamily(
        P + "holds_all", "1 when the site holds everything its neighbours hold"
    )
    if status.get("holds_all") is not None:  # no sample before every neighbour was compared
        holds.add_metric([], 1.0 if status["holds_all"] else 0.0)
    yield from (lacking, repaired, holds)
