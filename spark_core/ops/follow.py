"""What the operations page knows from the site's Kafka, kept current by one thread.

:class:`SiteFollower` reads, read_committed and without a consumer group's offsets
(it assigns partitions itself, so every page process starts from what the site holds):

- ``sl.ledger``: per ``(origin, stream)`` the seqs the site holds, whole (compacted);
- the report stream's canonical topic (``sl.agent``): each ship's last report
  (shorelink/ship_report.py), whole;
- ``sl.alerts``: the newest alerts; ``sl.nav``: each ship's own positions (its JSON
  position reports; AIS sentences are other vessels) for the map's tracks. Both from
  the last ``tail`` records of each partition: a site that keeps years of them does
  not replay years at start;
- ``sl.dead.*``: how many records each stream dead-lettered.

Whatever it reads came from ships and other sites: a record that breaks the contract
is counted (``Facts.bad``) and logged, rate-limited, and never stops the thread. A
topic that does not exist yet is looked for again every ``rescan_s``.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Message

from shorelink import strict_json
from shorelink.boundary import boundary
from shorelink.contract import (
    DEAD_UNKNOWN_TOPIC,
    LEDGER_TOPIC,
    Record,
    canonical_topic,
    dead_topic,
    entered_ms,
)
from shorelink.errors import ContractError
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.errors import KafkaClientError
from shorelink.kafka.reading import BEGINNING, PartitionReader, written_ms
from shorelink.ledger import decode_entry
from shorelink.logs import RateLimitedLog, get_logger
from shorelink.ranges import RangeSet
from shorelink.ship_report import ShipReport, decode_report
from spark_core.ais import NavRecord, decode_nav
from spark_core.quarantine import CONTRACT, H_DEAD_SOURCE, REDRIVE, dead_cause

__all__ = ["Facts", "Heard", "SiteFollower"]

log = get_logger(__name__)
_limited = RateLimitedLog(log)

ALERTS = "alerts"
NAV = "nav"
#: the most alerts and track points per ship the page keeps
MAX_ALERTS = 200
MAX_TRACK = 500
#: an alert's payload shown up to this many characters
MAX_ALERT_TEXT = 400


@dataclass
class Heard:
    """When this site last got a record of a ship, and through which site's gateway."""

    at_ms: int
    site: str


@dataclass
class Facts:
    """The follower's state; read it under :attr:`lock`. :attr:`version` grows with
    every change, so the page pushes only when something changed."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    version: int = 0
    ledger: dict[tuple[str, str], RangeSet] = field(default_factory=dict)
    #: ship -> (its last report, the report record's event time, the site it entered at)
    reports: dict[str, tuple[ShipReport, int, str]] = field(default_factory=dict)
    heard: dict[str, Heard] = field(default_factory=dict)
    alerts: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=MAX_ALERTS))
    #: ship -> its own positions, oldest first: (event time ms, lat, lon)
    tracks: dict[str, deque[tuple[int, float, float]]] = field(default_factory=dict)
    #: (dead-letter topic, cause) -> records quarantined there (spark_core/quarantine.py;
    #: a re-drive's refusal again is the same record, not counted twice)
    dead: dict[tuple[str, str], int] = field(default_factory=dict)
    #: records that broke the contract, per topic
    bad: dict[str, int] = field(default_factory=dict)
    #: topics being followed, and the last Kafka error ("" when none since)
    topics: list[str] = field(default_factory=list)
    error: str = ""
    #: time of the last poll that reached the broker (epoch s)
    polled_at: float = 0.0


class SiteFollower:
    """Follows a site's topics into :class:`Facts` on its own thread (:meth:`start`)."""

    def __init__(
        self,
        site: str,
        kafka: KafkaEndpoint,
        streams: tuple[str, ...],
        *,
        report_stream: str = "agent",
        tail: int = 2000,
        rescan_s: float = 10.0,
        facts: Facts | None = None,
    ) -> None:
        self.site = site
        self.facts = facts or Facts()
        self.kafka = kafka
        # the site application's principal may use groups named shorelink-*; no
        # offsets are committed (partitions are assigned, not subscribed)
        self.group = f"shorelink-ops-{site}"
        self.report_topic = canonical_topic(report_stream) if report_stream in streams else None
        self.alerts_topic = canonical_topic(ALERTS) if ALERTS in streams else None
        self.nav_topic = canonical_topic(NAV) if NAV in streams else None
        self.dead_topics = {dead_topic(s) for s in streams} | {DEAD_UNKNOWN_TOPIC}
        self.wanted = [
            t
            for t in (LEDGER_TOPIC, self.report_topic, self.alerts_topic, self.nav_topic)
            if t is not None
        ] + sorted(self.dead_topics)
        self._tailed = {t for t in (self.alerts_topic, self.nav_topic) if t is not None}
        self.tail = tail
        self.rescan_s = rescan_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the thread --------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(
            target=self.run, name=f"ops-follow-{self.site}", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def run(self) -> None:
        reader = PartitionReader(
            self.kafka, group=self.group, what=f"site {self.site}", on_error=self._on_error
        )
        assigned: set[tuple[str, int]] = set()
        next_scan = 0.0
        try:
            while not self._stop.is_set():
                if time.monotonic() >= next_scan:
                    next_scan = time.monotonic() + self.rescan_s
                    self._assign_new(reader, assigned)
                if not assigned:
                    self._stop.wait(0.5)
                    continue
                got = reader.poll(500, timeout=0.5)
                self.facts.polled_at = time.time()
                for problem in [*got.errors, *got.gaps]:
                    self._on_error(problem)
                for msg in got.records:
                    self._apply(msg)
        finally:
            reader.close()

    def _on_error(self, err: Exception) -> None:
        with self.facts.lock:
            self.facts.error = str(err)
            self.facts.version += 1
        _limited.warning("kafka", "ops_kafka_error", site=self.site, error=str(err))

    def _assign_new(self, reader: PartitionReader, assigned: set[tuple[str, int]]) -> None:
        try:
            self._assign_more(reader, assigned)
        except KafkaClientError as exc:  # broker unreachable: retried next scan
            self._on_error(exc)

    def _assign_more(self, reader: PartitionReader, assigned: set[tuple[str, int]]) -> None:
        """Assign the wanted partitions not assigned yet (all or none of them)."""
        found = reader.partitions(self.wanted, timeout=5)
        new: dict[tuple[str, int], int] = {}
        for topic in self.wanted:
            for p in found.get(topic, ()):
                if (topic, p) in assigned:
                    continue
                start = BEGINNING
                if topic in self._tailed:
                    low, high = reader.watermarks(topic, p, timeout=5)
                    start = max(low, high - self.tail)
                new[(topic, p)] = start
        if new:
            reader.add(new)
            assigned.update(new)
            with self.facts.lock:
                self.facts.topics = sorted({t for t, _ in assigned})
                self.facts.version += 1
            log.info(
                "ops_following",
                site=self.site,
                partitions=len(assigned),
                topics=",".join(sorted({t for t, _ in assigned})),
            )

    # -- one record --------------------------------------------------------------------
    @boundary
    def _apply(self, msg: Message) -> None:
        topic = msg.topic() or ""
        try:
            with self.facts.lock:
                self._apply_locked(topic, msg)
                self.facts.version += 1
        except Exception as exc:  # whatever a record does, the follower goes on: counted
            with self.facts.lock:
                self.facts.bad[topic] = self.facts.bad.get(topic, 0) + 1
                self.facts.version += 1
            _limited.warning(
                f"bad:{topic}", "ops_bad_record", site=self.site, topic=topic, error=str(exc)
            )

    def _apply_locked(self, topic: str, msg: Message) -> None:
        f = self.facts
        if topic == LEDGER_TOPIC:
            origin, stream, held = decode_entry(msg.key(), msg.value())
            f.ledger[(origin, stream)] = held
            return
        if topic in self.dead_topics:
            headers = msg.headers() or []
            source = next((v for k, v in reversed(headers) if k == H_DEAD_SOURCE), None)
            if not (isinstance(source, bytes) and source.startswith(REDRIVE.encode() + b"/")):
                where = (topic, dead_cause(headers) or CONTRACT)
                f.dead[where] = f.dead.get(where, 0) + 1
            return
        rec = Record.from_kafka(msg.key(), msg.value(), msg.headers())
        origin = rec.identity.origin
        if topic == self.report_topic:
            report = decode_report(rec.value)
            last = f.reports.get(origin)
            if last is None or report.at_ms >= last[0].at_ms:
                f.reports[origin] = (report, rec.ts_ms, rec.site)
        elif topic == self.alerts_topic:
            f.alerts.append(_alert(rec, entered_ms(msg.headers()), written_ms(msg)))
        elif topic == self.nav_topic:
            text = rec.value.decode("utf-8", "replace").strip()
            # AIS sentences are other vessels, not the ship's own track
            if text.startswith("{"):
                positions, broken = decode_nav(
                    [NavRecord(origin, rec.identity.seq, rec.ts_ms, text)]
                )
                if broken:  # not JSON a browser reads (NaN, nesting too deep, ...)
                    raise ContractError("a nav record's JSON is not strict JSON")
                if positions:
                    track = f.tracks.setdefault(origin, deque(maxlen=MAX_TRACK))
                    track.extend((p.ts_ms, round(p.lat, 4), round(p.lon, 4)) for p in positions)
        # a record that followed the contract: the site heard of its ship, by the
        # time the merge wrote it here (the record's Kafka timestamp)
        _, kafka_ts = msg.timestamp()
        heard = f.heard.get(origin)
        if heard is None or kafka_ts >= heard.at_ms:
            f.heard[origin] = Heard(kafka_ts, rec.site)


def _alert(rec: Record, entered: int | None, merged: int | None) -> dict[str, Any]:
    """An alert as the page lists it, with its way here: when its entry site's gateway
    wrote it (``entered_ms``) and when this site's merge did (``merged_ms``)."""
    text = rec.value.decode("utf-8", "replace")
    body: Any = text[:MAX_ALERT_TEXT]
    try:
        doc = strict_json.loads(text)
        if isinstance(doc, dict) and len(text) <= MAX_ALERT_TEXT:
            body = doc
    except ValueError:  # not JSON, or JSON no browser reads (NaN, too deep): its text
        pass
    return {
        "origin": rec.identity.origin,
        "seq": rec.identity.seq,
        "key": rec.key.decode("utf-8", "replace")[:64],
        "ts_ms": rec.ts_ms,
        "site": rec.site,
        "entered_ms": entered,
        "merged_ms": merged,
        "body": body,
    }
