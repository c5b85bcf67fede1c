"""Prometheus metrics of the gateway."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import (
    Counter,
    Gauge,
    Histogram,
)
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from shorelink.metrics import process_registry

__all__ = ["GatewayMetrics"]


class _CountedElsewhere(Collector):
    """A counter whose count another object keeps (the Kafka writer's retries)."""

    def __init__(self, name: str, doc: str) -> None:
        self.name, self.doc = name, doc
        self.source: Callable[[], int] = lambda: 0

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(self.name, self.doc, value=float(self.source()))


class _RefusedEntries(Collector):
    """The fleet registry's entries its follower refused, per reason
    (shorelink/fleet/follow.py keeps the counts)."""

    def __init__(self, name: str, doc: str) -> None:
        self.name, self.doc = name, doc
        self.source: Callable[[], Mapping[str, int]] = dict

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(self.name, self.doc, labels=["reason"])
        for reason, n in sorted(self.source().items()):
            family.add_metric([reason], float(n))
        yield family


class GatewayMetrics:
    def __init__(self) -> None:
        # the process's own figures first: RSS, CPU seconds, open files, Python
        r = self.registry = process_registry("gateway")
        p = "shorelink_gateway_"
        self.requests = Counter(p + "requests", "HTTP requests", ["route", "status"], registry=r)
        self.rejected = Counter(
            p + "rejected_batches", "Batches refused, by reason", ["reason"], registry=r
        )
        self.decoded_busy = Counter(
            p + "decoded_busy",
            "Batches refused busy after their decode, for what they decoded to beyond "
            "their decompressed bytes (charged that before decoding when sent again)",
            registry=r,
        )
        self.batches = Counter(
            p + "batches_written", "Batches committed to Kafka", ["stream"], registry=r
        )
        self.records = Counter(
            p + "records_written", "Records committed to sl.ingress", ["stream"], registry=r
        )
        self.skipped = Counter(
            p + "records_already_held",
            "Records in a batch the site already held",
            ["stream"],
            registry=r,
        )
        self.abandoned = Counter(
            p + "seqs_abandoned", "Seqs a ship declared dropped on board", ["stream"], registry=r
        )
        self.bytes_in = Counter(p + "batch_bytes", "Compressed batch bytes received", registry=r)
        self.write_seconds = Histogram(
            p + "kafka_write_seconds",
            "Time to write and commit one Kafka transaction (one or more batches)",
            registry=r,
        )
        self.transaction_batches = Histogram(
            p + "transaction_batches",
            "Batches sharing one Kafka transaction (group commit)",
            buckets=(1, 2, 4, 8, 16, 32, 64),
            registry=r,
        )
        self.uploads = Gauge(
            p + "upload_connections", "Open WebSocket upload connections", registry=r
        )
        self.kafka_errors = Counter(
            p + "kafka_errors", "Failed Kafka transactions (aborted)", registry=r
        )
        self.inflight_bytes = Gauge(
            p + "inflight_bytes",
            "Bytes of batches taken in and not yet written (limits.max_inflight_bytes)",
            registry=r,
        )
        #: a count, so a counter (``..._total``); ``.source`` is set to the writer's
        self.commit_retries = _CountedElsewhere(
            p + "kafka_retries",
            "Kafka transaction calls retried after a retriable error (commit timeouts)",
        )
        r.register(self.commit_retries)
        self.ready = Gauge(
            p + "ready", "1 when holdings are loaded and Kafka reachable", registry=r
        )
        self.connections_refused = Counter(
            p + "connections_refused",
            "Connections closed at once: listen.max_connections were open",
            registry=r,
        )
        #: the ship keys file (``ship_keys_file``): 1 while the file on disk does not
        #: read (the keys read before are in force), and how often a read failed
        self.ship_keys_stale = Gauge(
            p + "ship_keys_stale",
            "1 while the ship keys file does not read and the keys read before are in force",
            registry=r,
        )
        self.ship_keys_failures = _CountedElsewhere(
            p + "ship_keys_read_failures", "Reads of a changed ship keys file that failed"
        )
        r.register(self.ship_keys_failures)
        #: the fleet registry (``fleet_pub_file``): the version of the newest entry
        #: enforced, and the entries refused (forged, replayed, ...)
        self.registry_version = Gauge(
            p + "registry_version",
            "Version of the newest fleet registry entry this gateway enforces",
            registry=r,
        )
        self.registry_refused = _RefusedEntries(
            p + "registry_entries_refused", "Fleet registry entries refused, by reason"
        )
        r.register(self.registry_refused)
        self.config_bytes = Counter(
            p + "config_bytes",
            "Bytes of fleet configuration answers sent to ships (deltas, compressed)",
            registry=r,
        )
        self.readiness_checks = Counter(
            p + "readiness_checks",
            "Kafka asked whether it is reachable, for /readyz (at most one a second)",
            registry=r,
        )

    def committed(self, batches: int, records: int, seconds: float) -> None:
        """One Kafka transaction committed (called from the writer thread)."""
        del records  # counted per stream when each batch is answered
        self.write_seconds.observe(seconds)
        self.transaction_batches.observe(batches)
