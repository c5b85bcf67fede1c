"""Prometheus metrics of the edge agent (one registry per agent, served on
``metrics.host:metrics.port``)."""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Sequence
from typing import TYPE_CHECKING

from prometheus_client import (
    Counter,
    Gauge,
    Histogram,
)

from shorelink.metrics import process_registry

if TYPE_CHECKING:
    from edge_agent.log import CommitResult, Incoming

__all__ = ["EdgeMetrics"]

_LATENCY = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class EdgeMetrics:
    def __init__(self) -> None:
        # the process's own figures first: RSS, CPU seconds, open files, Python
        r = self.registry = process_registry("edge")
        p = "shorelink_edge_"
        self.ingested = Counter(
            p + "ingested_records", "Records committed to the log", ["stream"], registry=r
        )
        self.duplicates = Counter(
            p + "duplicates", "Redelivered messages recognised and not stored again", registry=r
        )
        self.quarantined = Counter(
            p + "quarantined_messages", "Unusable messages quarantined", ["reason"], registry=r
        )
        self.reports = Counter(
            p + "ship_reports",
            "Ship reports (edge_agent/report.py) by outcome: written, refused, failed",
            ["outcome"],
            registry=r,
        )
        self.rejected = Counter(
            p + "rejected_records",
            "Records refused because their stream's budget is full",
            ["stream"],
            registry=r,
        )
        self.renumbered = Counter(
            p + "renumbered_records",
            "Records moved to new seqs because a site held their seqs from a log that "
            "started again (re-flashed, restored, lost its tail)",
            ["stream"],
            registry=r,
        )
        self.dropped = Counter(
            p + "dropped_records",
            "Undelivered records dropped by a drop_oldest policy",
            ["stream"],
            registry=r,
        )
        self.retired = Counter(
            p + "retired_records", "Delivered records removed by retention", ["stream"], registry=r
        )
        self.over_budget = Counter(
            p + "alerts_over_budget", "Alerts accepted beyond the log budget", registry=r
        )
        self.event_time_unusable = Counter(
            p + "event_time_unusable",
            "Records stored with their receive time because the payload's event time was"
            " missing, not a time or outside 1970..2200",
            ["reason"],
            registry=r,
        )
        self.alarms = Counter(
            p + "alarms",
            "Alerts raised by the agent's alarm rules ([[alarms]]), committed to the alerts stream",
            ["alarm"],
            registry=r,
        )
        self.ingest_errors = Counter(
            p + "ingest_errors",
            "Unexpected errors committing a group (the group is retried message by message;"
            " a message that keeps failing is quarantined as commit_error)",
            registry=r,
        )
        self.clock_skew = Gauge(
            p + "clock_skew_seconds",
            "How far the wall clock jumped while the agent ran (forward positive); budget"
            " days and record ages follow monotonic time across jumps",
            registry=r,
        )
        self.log_errors = Counter(
            p + "log_errors", "Failed log commits (retried; nothing acknowledged)", registry=r
        )
        self.commit_seconds = Histogram(
            p + "commit_seconds", "Time to commit one group", buckets=_LATENCY, registry=r
        )
        self.receive_to_ack_seconds = Histogram(
            p + "receive_to_ack_seconds",
            "From receiving a message to its PUBACK",
            buckets=_LATENCY,
            registry=r,
        )
        self.batch_size = Histogram(
            p + "commit_group_messages",
            "Messages per group commit",
            buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000),
            registry=r,
        )
        self.backlog_records = Gauge(
            p + "backlog_records", "Records no shore site holds yet", ["stream"], registry=r
        )
        self.backlog_bytes = Gauge(
            p + "backlog_bytes", "Bytes of records no shore site holds yet", ["stream"], registry=r
        )
        self.oldest_undelivered_age = Gauge(
            p + "oldest_undelivered_age_seconds",
            "Age of the oldest record no site holds",
            ["stream"],
            registry=r,
        )
        self.last_seq = Gauge(p + "last_seq", "Last seq committed", ["stream"], registry=r)
        self.log_bytes = Gauge(
            p + "log_record_bytes",
            "Bytes of records in the log (what the budget counts)",
            registry=r,
        )
        self.disk_bytes = Gauge(p + "log_file_bytes", "Size of the log's files on disk", registry=r)
        self.log_full = Gauge(
            p + "log_full", "1 while the disk is full and commits fail", registry=r
        )
        self.mqtt_connected = Gauge(
            p + "mqtt_connected", "1 while connected to the ship's broker", registry=r
        )
        self.quarantine_size = Gauge(
            p + "quarantine_rows", "Messages kept in the quarantine table", registry=r
        )
        # -- uplink (edge_agent/uplink.py, edge_agent/session.py) --
        self.uplink_build_seconds = Histogram(
            p + "uplink_batch_build_seconds",
            "Time to build a batch: read and encode, or frame a sealed segment",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=r,
        )
        self.uplink_sealed_batches = Counter(
            p + "uplink_sealed_batches",
            "Batches framed from a sealed segment (encoded before they were due)",
            ["site", "stream"],
            registry=r,
        )
        # -- sealing (edge_agent/sealing.py) --
        self.sealed_records = Counter(
            p + "sealed_records", "Records sealed into encoded segments", ["stream"], registry=r
        )
        self.seal_seconds = Histogram(
            p + "seal_seconds",
            "Time to seal one segment (read and encode)",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=r,
        )
        self.segment_records = Gauge(
            p + "segment_records",
            "Records on board in sealed segments (retention removes segments with them)",
            ["stream"],
            registry=r,
        )
        self.uplink_bytes = Counter(
            p + "uplink_bytes_sent",
            "Request body bytes sent to gateways (what link budgets count)",
            ["link"],
            registry=r,
        )
        self.uplink_batches = Counter(
            p + "uplink_batches_sent",
            "Batches a site accepted (reply received)",
            ["site", "stream"],
            registry=r,
        )
        self.uplink_records = Counter(
            p + "uplink_records_sent",
            "Records in batches a site accepted",
            ["site", "stream"],
            registry=r,
        )
        self.uplink_dictionary_fallbacks = Counter(
            p + "uplink_dictionary_fallbacks",
            "Streams a gateway refused a dictionary for (unknown_dictionary): sent without"
            " one to that gateway from then on, until the agent restarts",
            ["site", "stream"],
            registry=r,
        )
        self.uplink_failed = Counter(
            p + "uplink_batches_failed",
            "Batches without an accepting reply (reason: link or the gateway's error code)",
            ["site", "stream", "reason"],
            registry=r,
        )
        self.latest_snapshots = Counter(
            p + "latest_snapshots",
            "Latest-value snapshots taken of a stream (edge_agent/latest.py)",
            ["stream"],
            registry=r,
        )
        self.latest_records = Counter(
            p + "latest_records",
            "Records copied into a stream's latest-value snapshots",
            ["stream"],
            registry=r,
        )
        self.latest_bytes = Counter(
            p + "latest_bytes",
            "Payload bytes copied into a stream's latest-value snapshots",
            ["stream"],
            registry=r,
        )
        self.uplink_gaps = Counter(
            p + "uplink_gaps",
            "409 replies: the site held less than we thought; resent from its holdings",
            ["site", "stream"],
            registry=r,
        )
        self.link_up = Gauge(
            p + "link_up",
            "1 while the gateway answers over this link",
            ["site", "link"],
            registry=r,
        )
        self.budget_used = Gauge(
            p + "link_budget_used_bytes",
            "Bytes sent today (UTC) per link class",
            ["link"],
            registry=r,
        )
        self.budget_limit = Gauge(
            p + "link_budget_bytes",
            "Daily budget per link class (0: unlimited)",
            ["link"],
            registry=r,
        )

    def observe_commit(self, incoming: Sequence[Incoming], result: CommitResult) -> None:
        stored: Tally[str] = Tally()
        rejected: Tally[str] = Tally()
        for m, outcome in zip(incoming, result.outcomes, strict=True):
            if outcome == "stored":
                stored[m.stream] += 1
            elif outcome == "rejected":
                rejected[m.stream] += 1
            else:
                self.duplicates.inc()
        for stream, n in stored.items():
            self.ingested.labels(stream).inc(n)
        for stream, n in rejected.items():
            self.rejected.labels(stream).inc(n)
        for stream, n in result.dropped.items():
            self.dropped.labels(stream).inc(n)
        for stream, n in result.retired.items():
            self.retired.labels(stream).inc(n)
        if result.over_budget:
            self.over_budget.inc(result.over_budget)
