"""Inbox queries: a site pulls other sites' records from its neighbours.

For each neighbour N, each entry site E routed through N (spark_core/routing.py) and
each class of streams (urgent, bulk), one Spark query reads N's
``sl.relay.<E>.<stream>`` (read_committed, at most ``max_offsets_per_trigger`` records
a batch), drops in Spark what the local ``sl.ledger`` already holds (a broadcast
anti-join on ``(origin, stream)`` and the seq ranges) and appends the rest, headers
and all, to the local ``sl.inbox.<N>.<stream>``, which the merge reads. The inbox is
at-least-once: a batch replayed after a crash appends again, and the merge writes each
identity once whatever it reads (docs/exactly-once.md).

A query runs only while its route points at it; each keeps its own checkpoint, so a
route that comes back resumes where it stopped (it re-reads what came by the other path
meanwhile; the anti-join drops it: it crosses the link, it is not written again).
Urgent streams have their own queries in the FAIR scheduler's ``urgent`` pool, so an
alert never waits behind a containers batch.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from shorelink.contract import LEDGER_TOPIC, relay_topic
from shorelink.errors import ContractError
from shorelink.files import write_json_atomic
from shorelink.kafka.admin import Admin
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.errors import KafkaClientError, UnknownTopic
from shorelink.kafka.topics import ensure_topics
from shorelink.ledger import decode_entry
from shorelink.ranges import RangeSet
from spark_core.config import SiteConfig
from spark_core.contract_sql import IDENTITY_COLUMNS, read_contract
from spark_core.progress import topic_lags
from spark_core.routing import LinkState
from spark_core.session import scheduler_pool, trigger
from spark_core.topics import inbox_specs

__all__ = [
    "BULK_POOL",
    "URGENT_POOL",
    "InboxQuery",
    "LedgerView",
    "Replicator",
    "ensure_inboxes",
    "inbox_queries",
    "start_inbox",
]

log = logging.getLogger(__name__)

#: Spark's scheduler pools (spark.scheduler.mode=FAIR): urgent streams' queries and
#: merge in one, everything else in the other, so neither waits for the other's jobs
URGENT_POOL = "urgent"
BULK_POOL = "bulk"


class LedgerView:
    """The local ``sl.ledger`` (what the canonical topics hold), kept current by one
    consumer; shared by the site's inbox queries. A view a little behind only lets a
    few more records into the inbox, which the merge drops."""

    def __init__(self, kafka: KafkaEndpoint) -> None:
        self.kafka = kafka
        self.timeout = kafka.timeout_s
        self.held: dict[tuple[str, str], RangeSet] = {}
        #: grows each time ``held`` changes (the inbox queries rebuild their broadcast)
        self.version = 0
        self._consumer: Consumer | None = None
        self._lock = threading.Lock()

    def refresh(self) -> int:
        """Read what the ledger got since the last call (at most ``timeout`` s)."""
        with self._lock:
            if self._consumer is None:
                self._consumer = Consumer(
                    {
                        **self.kafka.client_config(),
                        "group.id": "shorelink-ledger-view",
                        "enable.auto.commit": False,
                        "isolation.level": "read_committed",
                        "enable.partition.eof": True,
                        "fetch.wait.max.ms": 10,
                    }
                )
                self._consumer.assign([TopicPartition(LEDGER_TOPIC, 0, -2)])
            changed = False
            deadline = time.monotonic() + self.timeout
            while time.monotonic() < deadline:
                msg = self._consumer.poll(0.2)
                if msg is None:
                    break
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:  # up to date
                        break
                    continue
                if msg.value() is None:
                    continue
                try:
                    origin, stream, held = decode_entry(msg.key(), msg.value())
                except ContractError:
                    continue
                self.held[(origin, stream)] = held
                changed = True
            if changed:
                self.version += 1
            return self.version

    def ranges(self, streams: Sequence[str]) -> list[tuple[str, str, int, int]]:
        with self._lock:
            return [
                (origin, stream, lo, hi)
                for (origin, stream), held in self.held.items()
                if stream in streams
                for lo, hi in held
            ]

    def close(self) -> None:
        with self._lock:
            if self._consumer is not None:
                self._consumer.close()
                self._consumer = None


@dataclass
class InboxQuery:
    """One inbox query: the relay topics of ``entry``'s ``streams`` at ``neighbour``."""

    site: SiteConfig
    neighbour: str
    #: the neighbour's Kafka as this site reaches it (its neighbour principal there)
    kafka: KafkaEndpoint
    entry: str
    streams: tuple[str, ...]
    urgent: bool
    ledger: LedgerView
    #: batches appended, records read from the neighbour
    batches: int = 0
    read: int = 0
    _counted_at: str = field(default="", repr=False)
    last_success: float | None = None
    _broadcast: tuple[int, Any] = field(default=(-1, None), repr=False)

    @property
    def name(self) -> str:
        return f"inbox-{self.neighbour}-{self.entry}-{'urgent' if self.urgent else 'bulk'}"

    @property
    def topics(self) -> list[str]:
        return [relay_topic(self.entry, s) for s in self.streams]

    def process_batch(self, df: Any, batch_id: int) -> None:
        """``foreachBatch``: anti-join against the ledger, append to the inboxes."""
        spark = df.sparkSession
        # the anti-join keys: the identity as Record.from_kafka reads it
        rows = read_contract(df, "key", "value", "headers", "topic").selectExpr(
            "key",
            "value",
            "headers",
            *IDENTITY_COLUMNS,
            # sl.relay.<entry>.<stream> -> sl.inbox.<neighbour>.<stream>
            f"concat('sl.inbox.{self.neighbour}.', substring_index(topic, '.', -1)) AS topic",
        )
        held = self._held_frame(spark)
        if held is not None:
            from pyspark.sql.functions import broadcast

            rows = rows.alias("r").join(
                broadcast(held).alias("h"),
                on=(
                    (rows["origin"] == held["h_origin"])
                    & (rows["stream"] == held["h_stream"])
                    & (rows["seq"] >= held["lo"])
                    & (rows["seq"] <= held["hi"])
                ),
                how="left_anti",
            )
        # one Spark job per batch: read, filter and append in one pass (no counts;
        # the records read come from the query's progress: :meth:`count_read`)
        (
            rows.select("key", "value", "headers", "topic")
            .write.format("kafka")
            .options(**self.site.kafka.spark_options())
            .option("kafka.acks", "all")
            .option("kafka.enable.idempotence", "true")
            .option("kafka.compression.type", "lz4")
            .option("kafka.linger.ms", "5")
            .save()
        )
        self.batches += 1
        self.last_success = time.time()
        log.debug(
            "event=inbox_batch site=%s query=%s batch=%d", self.site.name, self.name, batch_id
        )

    def count_read(
        self, last: dict[str, Any] | None, since: Callable[[str], Sequence[dict[str, Any]]]
    ) -> None:
        """Add the input rows of the batches not counted yet (records read across the
        link). ``last`` is the query's last progress report; ``since(t)`` fetches its
        reports newer than timestamp ``t``, asked only when ``last`` is new. Reports are
        told apart by their timestamps (Spark writes them as fixed-width UTC text), not
        by batch ids: an idle report may carry the id its next batch runs under."""
        stamp = str((last or {}).get("timestamp") or "")
        if stamp <= self._counted_at:
            return
        for p in since(self._counted_at):
            stamp = str(p.get("timestamp") or "")
            if stamp > self._counted_at:
                self._counted_at = stamp
                self.read += int(p.get("numInputRows") or 0)

    def _held_frame(self, spark: Any) -> Any:
        """The ledger's ranges of this query's streams as a small DataFrame, rebuilt
        only when the ledger changed."""
        version = self.ledger.refresh()
        if self._broadcast[0] != version:
            ranges = self.ledger.ranges(self.streams)
            frame = (
                spark.createDataFrame(
                    ranges, "h_origin string, h_stream string, lo bigint, hi bigint"
                )
                if ranges
                else None
            )
            self._broadcast = (version, frame)
        return self._broadcast[1]


def inbox_queries(
    site: SiteConfig, neighbour: SiteConfig, entries: Sequence[str], ledger: LedgerView
) -> list[InboxQuery]:
    """Every inbox query this site may run against ``neighbour``: per entry site, one
    for the urgent streams and one for the rest (classes without streams left out)."""
    kafka = site.reach(neighbour)
    out = []
    for entry in entries:
        if entry == site.name:
            continue  # what entered here is never pulled back
        for urgent, streams in ((True, site.urgent_streams), (False, site.bulk_streams)):
            if streams:
                out.append(InboxQuery(site, neighbour.name, kafka, entry, streams, urgent, ledger))
    return out


def ensure_inboxes(site: SiteConfig) -> None:
    """The site's ``sl.inbox.<neighbour>.<stream>`` topics (spark_core/topics.py)."""
    ensure_topics(site.kafka, inbox_specs(site), site.durability)


def start_inbox(spark: Any, q: InboxQuery, *, available_now: bool = False) -> Any:
    """Start one inbox query in its scheduler pool; returns the StreamingQuery. Fails
    (the supervisor retries with backoff) when the neighbour's Kafka does not answer."""
    r = q.site.replication
    with scheduler_pool(spark, URGENT_POOL if q.urgent else BULK_POOL):
        df = (
            spark.readStream.format("kafka")
            .options(**q.kafka.spark_options())
            .option("subscribe", ",".join(q.topics))
            .option("includeHeaders", "true")
            .option("startingOffsets", "earliest")
            .option("kafka.isolation.level", "read_committed")
            .option("maxOffsetsPerTrigger", str(r.max_offsets_per_trigger))
            .option("failOnDataLoss", str(r.fail_on_data_loss).lower())
            .option("kafka.default.api.timeout.ms", str(int(r.probe_timeout_s * 1000)))
            .option("kafka.request.timeout.ms", str(int(r.probe_timeout_s * 1000)))
            .load()
        )
        writer = (
            df.writeStream.queryName(f"{q.name}@{q.site.name}")
            .foreachBatch(q.process_batch)
            .option("checkpointLocation", str(q.site.query_checkpoint(q.name)))
        )
        return trigger(writer, q.site.trigger_interval_s, available_now).start()


def relay_missing(kafka: KafkaEndpoint, topics: Sequence[str], timeout: float) -> list[str]:
    """The ``topics`` the neighbour does not have yet (its merge creates them)."""
    try:
        md = Admin(kafka).metadata(timeout=timeout)
    except KafkaClientError:
        return list(topics)
    return [t for t in topics if t not in md.topics]


@dataclass
class StreamLag:
    """Per neighbour and stream: records behind, since when, last batch that worked."""

    lag_records: int | None = None
    behind_since: float | None = None
    last_success: float | None = None
    state: str = "idle"


class Replicator:
    """The site's replication: its link state (probed in a thread of its own every
    ``probe_interval``), the routes, every inbox query it may run, and
    ``<checkpoint_dir>/replication.status.json``."""

    def __init__(self, cfg: Any, site: SiteConfig) -> None:
        self.cfg = cfg
        self.site = site
        self.links = LinkState(cfg, site)
        self.ledger = LedgerView(site.kafka.with_timeout(min(5.0, site.kafka.timeout_s)))
        self.queries = [
            q
            for n in site.neighbours
            for q in inbox_queries(site, cfg.site(n), sorted(cfg.sites), self.ledger)
        ]
        self.routes: dict[str, str | None] = {}
        self.lags: dict[tuple[str, str], dict[str, StreamLag]] = {}  # (nbr, stream) -> query
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.status_path = site.checkpoint_dir / "replication.status.json"

    # -- the routing loop ---------------------------------------------------------------
    def start(self) -> None:
        """Ensure the inbox topics, probe once (so the first routes are known), then
        keep probing in a thread."""
        if not self.site.neighbours:
            return
        ensure_inboxes(self.site)
        self.tick()
        self._thread = threading.Thread(target=self._run, name="replication-links", daemon=True)
        self._thread.start()

    def tick(self) -> None:
        self.links.probe()
        routes = self.links.routes()
        if routes != self.routes:
            log.info(
                "event=routes site=%s routes=%s",
                self.site.name,
                ",".join(f"{e}<-{n or '-'}" for e, n in sorted(routes.items())),
            )
            self.routes = routes
        self.write_status()

    def _run(self) -> None:
        while not self._stop.wait(self.site.replication.probe_interval_s):
            try:
                self.tick()
            except Exception:  # never let the routing thread die: log and go on
                log.exception("event=replication_tick_failed site=%s", self.site.name)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.site.replication.probe_timeout_s * 3)
        self.links.close()
        self.ledger.close()

    # -- per query -----------------------------------------------------------------------
    def wanted(self, q: InboxQuery) -> bool:
        return self.routes.get(q.entry) == q.neighbour

    def start_query(self, spark: Any, q: InboxQuery, *, available_now: bool = False) -> Any:
        missing = relay_missing(q.kafka, q.topics, self.site.replication.probe_timeout_s)
        if missing:
            raise UnknownTopic(
                f"{q.neighbour} has no {', '.join(missing)} yet (its merge creates them)",
                retryable=True,
            )
        return start_inbox(spark, q, available_now=available_now)

    def progress(self, q: InboxQuery, progress: dict[str, Any] | None, state: str) -> None:
        """The supervisor's report of one inbox query: per stream lag and state."""
        now = time.time()
        lags = topic_lags(progress) if progress is not None else {}
        for stream in q.streams:
            lag = self.lags.setdefault((q.neighbour, stream), {}).setdefault(q.entry, StreamLag())
            n = lags.get(relay_topic(q.entry, stream))
            if state == "running" and n is not None:
                lag.lag_records = n
                if n == 0:
                    lag.behind_since = None
                elif lag.behind_since is None:
                    lag.behind_since = now
                lag.state = "up" if n == 0 else "catching_up"
            elif state in ("failed", "starting") and self.wanted(q):
                lag.state = "down"
            elif not self.wanted(q):
                lag.state, lag.lag_records, lag.behind_since = "idle", None, None
            lag.last_success = q.last_success

    def status(self) -> dict[str, Any]:
        now = time.time()
        neighbours: dict[str, Any] = {}
        for name, link in self.links.status().items():
            streams: dict[str, Any] = {}
            for stream in self.site.streams:
                per_entry = self.lags.get((name, stream), {})
                active = [lg for lg in per_entry.values() if lg.state != "idle"]
                states = {lg.state for lg in active}
                state = next((s for s in ("down", "catching_up", "up") if s in states), "idle")
                if link["state"] == "down" and active:
                    state = "down"
                counted = [lg.lag_records for lg in active if lg.lag_records is not None]
                since = [lg.behind_since for lg in active if lg.behind_since is not None]
                ok = [lg.last_success for lg in per_entry.values() if lg.last_success]
                streams[stream] = {
                    "state": state,
                    "lag_records": sum(counted) if counted else None,
                    "lag_s": round(now - min(since), 1) if since else (0.0 if counted else None),
                    "last_success": max(ok) if ok else None,
                    "entries": sorted(e for e, lg in per_entry.items() if lg.state != "idle"),
                }
            neighbours[name] = {**link, "streams": streams}
        return {
            "site": self.site.name,
            "updated_at": now,
            "routes": dict(self.routes),
            "neighbours": neighbours,
        }

    def write_status(self) -> None:
        write_json_atomic(self.status_path, self.status(), indent=1, sort_keys=True)
