"""What the voyage watches while it runs, from the outside, as any client could:

- :class:`SiteWatch`: per site, a read_committed consumer of the canonical topics that
  notes when each identity arrived (wall clock), where it entered (``sl.site``), its
  event time, and every identity seen twice;
- :func:`edge_metrics`: a ship's agent's Prometheus endpoint (last seq per stream,
  backlog, satellite spend and budget, which gateway answers over which link);
- the toxiproxy byte counters of each link (:meth:`Toxiproxy.link_bytes`).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import TIMESTAMP_CREATE_TIME
from prometheus_client.parser import text_string_to_metric_families

from shorelink.contract import (
    H_MQTT_TOPIC,
    H_ORIGIN,
    H_SEQ,
    H_SITE,
    H_STREAM,
    H_TS,
    canonical_topic,
    entered_ms,
)
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.errors import KafkaClientError, UnknownTopic
from shorelink.kafka.reading import BEGINNING, PartitionReader
from voyage.topology import STREAMS

__all__ = ["Arrival", "EdgeSample", "SiteWatch", "edge_metrics", "query_level_with"]

Ident = tuple[str, str, int]

#: how often a watch looks for canonical topics (and partitions) made since
_RESCAN_S = 2.0


@dataclass(frozen=True)
class Arrival:
    at_s: float  # wall seconds since the run started, when the site's merge wrote it
    entry: str  # the site the record entered at
    ts_ms: int  # event time
    key: str
    mqtt_topic: str
    payload: bytes
    #: wall seconds since the run started, when the gateway of its entry site wrote it
    #: (``sl.entered``; None for a record without it)
    entered_s: float | None = None


class SiteWatch(threading.Thread):
    """Follows one site's canonical topics until :meth:`close`. ``payloads_of`` names
    the streams whose payloads are kept (the others only their identity and times)."""

    def __init__(
        self,
        site: str,
        kafka: KafkaEndpoint,
        t0: float,
        payloads_of: tuple[str, ...] = ("alerts", "cargo"),
    ) -> None:
        super().__init__(name=f"watch-{site}", daemon=True)
        self.site = site
        self.t0 = t0
        self.payloads_of = payloads_of
        self.arrivals: dict[Ident, Arrival] = {}
        self.duplicates: Counter[tuple[str, str]] = Counter()
        self.unreadable = 0
        self.error: str | None = None
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self.reader = PartitionReader(
            kafka, group=f"voyage-watch-{site}-{time.time_ns()}", what=f"site {site}"
        )

    def run(self) -> None:
        try:
            self._follow()
        except KafkaClientError as exc:
            self.error = str(exc)
        finally:
            self.reader.close()

    def _follow(self) -> None:
        topics = [canonical_topic(s) for s in STREAMS]
        assigned: set[tuple[str, int]] = set()
        rescan = 0.0
        while not self._halt.is_set():
            if time.monotonic() >= rescan:  # a topic its merge has not made yet
                rescan = time.monotonic() + _RESCAN_S
                try:
                    found = self.reader.partitions(topics, timeout=5)
                except KafkaClientError as exc:
                    self.error = str(exc)
                    found = {}
                new = {(t, p): BEGINNING for t, ps in found.items() for p in ps}
                self.reader.add({tp: at for tp, at in new.items() if tp not in assigned})
                assigned |= set(new)
            got = self.reader.poll(2000, timeout=0.5)
            now = time.time() - self.t0
            with self._lock:
                for problem in [*got.errors, *got.gaps]:
                    if not isinstance(problem, UnknownTopic):
                        self.error = str(problem)
                for m in got.records:
                    self._note(m, now)

    def _note(self, m: object, now: float) -> None:
        headers = {k: (v or b"").decode(errors="replace") for k, v in (m.headers() or [])}  # type: ignore[attr-defined]
        try:
            ident = (headers[H_ORIGIN], headers[H_STREAM], int(headers[H_SEQ]))
            ts = int(headers.get(H_TS, "0"))
        except (KeyError, ValueError):
            self.unreadable += 1
            return
        if ident in self.arrivals:
            self.duplicates[(ident[0], ident[1])] += 1
            return
        key = m.key()  # type: ignore[attr-defined]
        # when the site's merge wrote it (the canonical record's own timestamp, set at
        # the merge's produce), not when this watcher's poll came round (up to a second
        # later, and in a different order at each site)
        kind, stamp = m.timestamp()  # type: ignore[attr-defined]
        at = min(now, stamp / 1000 - self.t0) if kind == TIMESTAMP_CREATE_TIME else now
        self.arrivals[ident] = Arrival(
            at,
            headers.get(H_SITE, ""),
            ts,
            key.decode(errors="replace") if key else "",
            headers.get(H_MQTT_TOPIC, ""),
            (m.value() or b"") if ident[1] in self.payloads_of else b"",  # type: ignore[attr-defined]
            None if (entered := entered_ms(m.headers())) is None else entered / 1000 - self.t0,  # type: ignore[attr-defined]
        )

    def count(self) -> int:
        return len(self.arrivals)

    def snapshot(self) -> dict[Ident, Arrival]:
        with self._lock:
            return dict(self.arrivals)

    def close(self) -> None:
        self._halt.set()
        self.join(timeout=10)


@dataclass
class EdgeSample:
    """One read of a ship agent's metrics."""

    ok: bool = False
    last_seq: dict[str, int] = field(default_factory=dict)
    backlog: dict[str, int] = field(default_factory=dict)
    budget_used: dict[str, int] = field(default_factory=dict)
    budget_limit: dict[str, int] = field(default_factory=dict)
    uplink_bytes: dict[str, int] = field(default_factory=dict)
    links_up: list[tuple[str, str]] = field(default_factory=list)  # (site, link) answering

    @property
    def backlog_total(self) -> int:
        return sum(self.backlog.values())


def edge_metrics(address: str) -> EdgeSample:
    """Read ``http://address/metrics`` of a ship's agent; ``ok`` False if it did not
    answer."""
    try:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=2) as resp:
            text = resp.read().decode()
    except OSError:
        return EdgeSample()
    s = EdgeSample(ok=True)
    by_label = {
        "last_seq": (s.last_seq, "stream"),
        "backlog_records": (s.backlog, "stream"),
        "link_budget_used_bytes": (s.budget_used, "link"),
        "link_budget_bytes": (s.budget_limit, "link"),
        "uplink_bytes_sent_total": (s.uplink_bytes, "link"),
    }
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            metric = sample.name.removeprefix("shorelink_edge_")
            if metric in by_label:
                into, label = by_label[metric]
                into[sample.labels.get(label, "")] = int(sample.value)
            elif metric == "link_up" and sample.value >= 1:
                s.links_up.append((sample.labels.get("site", ""), sample.labels.get("link", "")))
    return s


def _committed_offsets(checkpoint: Path) -> dict[str, dict[str, int]] | None:
    """The Kafka offsets up to which a streaming query has committed its last batch
    (the third line of ``offsets/<last committed batch>`` in its checkpoint)."""
    try:
        done = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
        lines = (checkpoint / "offsets" / str(done)).read_text().splitlines()
        offsets: dict[str, dict[str, int]] = json.loads(lines[2])
    except (OSError, ValueError, IndexError):
        return None
    return offsets


def query_level_with(checkpoint: Path, kafka: KafkaEndpoint, topic: str) -> bool:
    """True when the streaming query at ``checkpoint`` has committed a batch that ends
    at the end of every partition of ``topic`` (so a Delta table it writes holds every
    record the topic holds)."""
    done = _committed_offsets(checkpoint)
    if done is None:
        return False
    reader = PartitionReader(kafka, group="voyage-level")
    try:
        for p in reader.partitions([topic], timeout=10).get(topic, ()):
            _low, high = reader.watermarks(topic, p, timeout=10)
            if done.get(topic, {}).get(str(p), 0) < high:
                return False
    except KafkaClientError:
        return False
    finally:
        reader.close()
    return True
