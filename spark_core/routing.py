"""Which neighbour a site pulls each entry site's records from, and how it knows which
links are up.

Every record entered the system at one site (its ``sl.site`` header, the *entry*). Each
site keeps, beside its canonical topics, ``sl.relay.<entry>.<stream>``: the records of
that entry it holds (spark_core/merge.py writes both in one transaction). A site pulls
entry E's relay from exactly one neighbour at a time: the first hop of a shortest path
to E over the links that are up (:func:`plan_routes`). In a full mesh with every link
up that is E itself, so each record crosses into each site once; when the direct link
is down, the next hop is a neighbour that has E's records (transit), in any connected
topology. docs/replication.md says why a route change can neither lose nor double a
record.

Link state (:class:`LinkState`): each site checks each neighbour's Kafka every
``probe_interval`` and writes its report (which neighbours it could read, a counter
that grows) to its own compacted ``sl.links``, together with the newest report it has
seen of every other site, read from its neighbours' ``sl.links``. So reports spread
along the replication links, and every site sees the same graph within a few probe
intervals. A report that has not changed for ``report_ttl`` (measured on this site's
own clock) counts as gone: no route goes through that site until it reports again. A
version starts at the clock but is no clock: a site that reads back a report of itself
with a version it has not reached (its clock was ahead before a restart and stepped
back, or a neighbour forged one) continues above it, so its own reports win again
within a probe interval.

Reports are not signed, so any neighbour can write one under another site's name, and
a version order is only as good as a site's ability to exceed what others hold. A
forged report at the highest version (2^63-1) would be kept by every site, and the
victim could never write above it: its reports would expire everywhere after
``report_ttl``, and transit through it would end for good (review N5). So versions are
bounded relative to time, with one generous margin (:data:`MAX_AHEAD_MS`, a day):

- every site, the victim included, refuses a report whose version is more than
  ``MAX_AHEAD_MS`` ahead of its own clock (in milliseconds, as versions start). A
  forgery must then stay within a day of the readers' clocks, and the victim, whose
  clock is as good as theirs, adopts it and continues above it at its next probe;
  what a forger wins is one probe interval of false content, as with any unsigned
  report. The cost: a site whose clock runs more than a day fast is not routed
  *through* (its own pulls go on); that is the one place clocks are compared, and
  the margin is far beyond any clock that NTP keeps;
- a report that has gone stale (unchanged for ``report_ttl``) is replaced by any other
  version of that site, lower ones included: a version a site accepted but the victim
  did not (their clocks differ, and the forgery fell between their bounds) holds for
  one TTL, not until the victim's clock reaches it.

A link that answers is not yet a link that carries data: a site whose pullers from a
neighbour keep failing (its merge cannot write what they read, the neighbour refuses
its relay topics, ...) holds that link for a while (:meth:`LinkState.note_pulls`) and
reports it ``failing``; every site then routes around it where another path exists and
uses it only as a last resort (:func:`plan_routes`). After the hold the link is tried
again; each hold in a row is twice as long, up to ``MAX_HOLD_TTLS`` report TTLs.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from shorelink import strict_json
from shorelink.boundary import boundary
from shorelink.contract import LINKS_TOPIC
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.errors import KafkaClientError, KafkaUnavailable, kafka_errors
from shorelink.kafka.reading import BEGINNING, PartitionReader
from shorelink.kafka.topics import PlainProducer, TopicSpec, ensure_topics, producer
from shorelink.logs import RateLimitedLog, get_logger
from spark_core.config import SiteConfig, SitesConfig
from spark_core.neighbour_admin import SharedAdmin

__all__ = [
    "DOWN_AFTER_PROBES",
    "FAIL_GRACE_PROBES",
    "MAX_AHEAD_MS",
    "MAX_HOLD_TTLS",
    "MAX_VERSION",
    "Edge",
    "LinkState",
    "Report",
    "plan_routes",
]

log = get_logger(__name__)

Edge = tuple[str, str]  # (site, neighbour it pulls from)
#: the highest report version (a Kafka long: what any other implementation can hold)
MAX_VERSION = 2**63 - 1
#: a report whose version (milliseconds, as versions start at the clock) is further than
#: this ahead of the reader's clock is refused, so no site is handed a version it cannot
#: exceed (module docstring)
MAX_AHEAD_MS = 24 * 3600 * 1000
#: a neighbour whose pullers have failed for this many probe intervals in a row is held
FAIL_GRACE_PROBES = 3
#: a neighbour is routed around once this many probes in a row found it down: one slow
#: answer of a loaded broker (or a neighbour starting a moment after this site) is no
#: outage, and a route moved for nothing costs the new route's first read
DOWN_AFTER_PROBES = 2
#: the longest hold of a failing link, in report TTLs (the first is one TTL, then 2, 4...)
MAX_HOLD_TTLS = 8


def plan_routes(
    site: str,
    graph: Mapping[str, Sequence[str]],
    up: Iterable[Edge],
    failing: Iterable[Edge] = (),
) -> dict[str, str | None]:
    """For every other site E of ``graph`` (site -> the sites it pulls from): the
    neighbour ``site`` pulls E's relay from, the first hop of a shortest path over the
    ``up`` edges that are not ``failing`` (ties: the first hop whose name sorts first);
    for an E reachable only through failing edges, a shortest path over all of them;
    None if E cannot be reached now. Pure: the same inputs give the same routes at
    every site. No route loops: a site on a path without failing edges has such a path
    itself, and along a last-resort path the distance over all edges falls."""
    live = set(up)
    healthy = _first_hops(site, graph, live - set(failing))
    last_resort = _first_hops(site, graph, live) if None in healthy.values() else healthy
    return {e: n if n is not None else last_resort[e] for e, n in healthy.items()}


def _first_hops(
    site: str, graph: Mapping[str, Sequence[str]], live: set[Edge]
) -> dict[str, str | None]:
    """Breadth-first over ``live``: each other site's first hop (None: unreachable)."""
    first: dict[str, str] = {}
    seen = {site}
    queue: deque[str] = deque()
    for n in sorted(graph.get(site, ())):
        if (site, n) in live and n not in seen:
            seen.add(n)
            first[n] = n
            queue.append(n)
    while queue:
        x = queue.popleft()
        for y in sorted(graph.get(x, ())):
            if (x, y) in live and y not in seen:
                seen.add(y)
                first[y] = first[x]
                queue.append(y)
    return {e: first.get(e) for e in sorted(graph) if e != site}


@dataclass
class Report:
    """One site's report: the neighbours it could read at its last probe, and those of
    them its pullers keep failing to pull from."""

    site: str
    up: tuple[str, ...]
    #: grows with every report of that site (its own counter, not a clock)
    version: int
    #: neighbours in ``up`` held as failing (:meth:`LinkState.note_pulls`)
    failing: tuple[str, ...] = ()
    #: when this site last saw ``version`` change (its monotonic clock)
    seen_at: float = field(default=0.0, compare=False)

    def encode(self) -> bytes:
        doc: dict[str, object] = {"up": list(self.up), "version": self.version}
        if self.failing:  # absent when empty: what a site without this field wrote
            doc["failing"] = list(self.failing)
        return json.dumps(doc).encode()

    @classmethod
    @boundary
    def decode(cls, site: str, value: bytes) -> Report:
        """Raises ValueError for anything but ``{"up": [names], "version": int}`` with
        an optional ``"failing": [names]``."""
        try:
            data = strict_json.loads(value)  # a neighbour's: nesting too deep is a ValueError
            up, version = data["up"], data["version"]
            failing = data.get("failing", [])
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a link report: {exc}") from None
        for name, names in (("up", up), ("failing", failing)):
            if not isinstance(names, list) or not all(isinstance(u, str) for u in names):
                raise ValueError(f"{name} is not a list of names")
        if not isinstance(version, int) or isinstance(version, bool):
            raise ValueError("version is not an integer")
        if not 0 <= version <= MAX_VERSION:
            raise ValueError(f"version {version} is outside 0..{MAX_VERSION}")
        return cls(site, tuple(up), version, tuple(failing))


@dataclass
class NeighbourLink:
    """What this site knows of its link to one neighbour."""

    name: str
    #: the neighbour's Kafka as this site reaches it (:meth:`SiteConfig.reach`)
    kafka: KafkaEndpoint
    #: the site's one admin client of that Kafka: the probe asks its metadata through
    #: it, and the neighbour's pullers and repairers their describes and offsets
    #: (:class:`~spark_core.replication.Replicator`)
    admin: SharedAdmin
    up: bool = False
    since: float = field(default_factory=time.time)
    last_ok: float | None = None
    error: str | None = None
    reader: PartitionReader | None = None
    #: held as failing until then (monotonic; 0: not held), and holds in a row
    held_until: float = 0.0
    strikes: int = 0
    #: failing pulls count from then on (the end of the last hold or of an outage)
    counted_from: float = 0.0
    #: the failing pullers' error that caused the hold
    pull_error: str | None = None
    #: probes in a row that found the neighbour down
    missed: int = 0

    def failing(self, now: float) -> bool:
        return now < self.held_until

    @property
    def routable(self) -> bool:
        """Up, or down for fewer than :data:`DOWN_AFTER_PROBES` probes in a row."""
        return self.up or 0 < self.missed < DOWN_AFTER_PROBES

    def status(self) -> dict[str, object]:
        now = time.monotonic()
        held = self.failing(now)
        return {
            "state": "up" if self.up else "down",
            "since": self.since,
            "last_ok": self.last_ok,
            "error": self.error,
            "bootstrap": self.kafka.bootstrap,
            # routed around until then (wall clock), the pullers' error
            "failing_until": time.time() + self.held_until - now if held else None,
            "pull_error": self.pull_error if held else None,
        }


class LinkState:
    """This site's view of the replication graph, refreshed by :meth:`probe` (the site
    application calls it every ``probe_interval`` from one thread; readers call
    :meth:`routes` from any thread)."""

    def __init__(self, cfg: SitesConfig, site: SiteConfig) -> None:
        self.cfg = cfg
        self.site = site
        self.graph = cfg.neighbours_of()
        r = site.replication
        self.links = {
            n: NeighbourLink(n, kafka, SharedAdmin.of_neighbour(site, kafka))
            for n in site.neighbours
            for kafka in (site.reach(cfg.site(n)),)
        }
        self.reports: dict[str, Report] = {}
        # grows with each report; starts at the clock (above the last run's, unless the
        # clock stepped back: then the first report of itself read back raises it)
        self._version = int(time.time() * 1000)
        self._published: dict[str, int] = {}
        self._lock = threading.Lock()
        self._producer: PlainProducer | None = None
        self._limited = RateLimitedLog(log)
        self._ttl = r.report_ttl_s
        self._timeout = r.probe_timeout_s
        self.probes = 0

    # -- the graph ----------------------------------------------------------------------
    def edges(self, now: float | None = None) -> tuple[set[Edge], set[Edge]]:
        """The edges up (this site's own from its probes, routable ones, every other
        site's from its report while that report is fresh) and those of them held as
        failing."""
        now = time.monotonic() if now is None else now
        me = self.site.name
        with self._lock:
            up = {(me, n) for n, link in self.links.items() if link.routable}
            failing = {(me, n) for n, link in self.links.items() if link.failing(now)}
            for name, rep in self.reports.items():
                if name == me or now - rep.seen_at > self._ttl:
                    continue
                known = self.graph.get(name, ())
                up.update((name, n) for n in rep.up if n in known)
                failing.update((name, n) for n in rep.failing if n in known)
        return up, failing & up

    def routes(self) -> dict[str, str | None]:
        up, failing = self.edges()
        return plan_routes(self.site.name, self.graph, up, failing)

    def note_pulls(
        self, failing: Mapping[str, tuple[float, str]], now: float | None = None
    ) -> None:
        """``failing``: for each neighbour some puller from which is failing, since when
        (monotonic) and its error. A neighbour failing ``FAIL_GRACE_PROBES`` probe
        intervals in a row (counted from the end of its last hold or of the last outage
        its probe found; failures while it is down count for nothing) is held: reported
        failing and routed around for one report TTL, twice that if it fails again
        right after, up to ``MAX_HOLD_TTLS``. A neighbour that then pulls without
        failing for a TTL starts again from one."""
        now = time.monotonic() if now is None else now
        grace = FAIL_GRACE_PROBES * self.site.replication.probe_interval_s
        with self._lock:
            for name, link in self.links.items():
                if not link.up:  # routed around already: no strike, and the grace
                    link.counted_from = now  # starts again when it is back up
                    continue
                if link.failing(now):
                    continue
                since, error = failing.get(name, (None, None))
                if since is not None and now - max(since, link.counted_from) >= grace:
                    hold = self._ttl * min(2**link.strikes, MAX_HOLD_TTLS)
                    link.strikes += 1
                    link.held_until, link.pull_error = now + hold, error
                    link.counted_from = link.held_until
                    log.warning(
                        "link_failing",
                        site=self.site.name,
                        neighbour=name,
                        hold_s=round(hold, 1),
                        error=error,
                    )
                elif since is None and link.strikes and now - link.held_until >= self._ttl:
                    log.info("link_pulls_again", site=self.site.name, neighbour=name)
                    link.strikes = 0

    # -- probing -----------------------------------------------------------------------
    def probe(self) -> None:
        """Check every neighbour, read its link reports, publish ours."""
        self.probes += 1
        for link in self.links.values():
            self._probe(link)
        self._publish()

    def _probe(self, link: NeighbourLink) -> None:
        now = time.time()
        try:
            # the shared admin's requests time out at the probe timeout (SharedAdmin)
            md = link.admin().metadata(LINKS_TOPIC, timeout=self._timeout)
            if not md.brokers:
                raise KafkaUnavailable("no broker answered")
            reports = self._read_reports(link)
        except (KafkaClientError, ValueError, RuntimeError) as exc:
            if link.up:
                log.warning("link_down", site=self.site.name, neighbour=link.name, error=str(exc))
                link.since = now
            link.up = False
            link.error = str(exc)[:500]
            link.missed += 1
            return
        if not link.up:
            log.info("link_up", site=self.site.name, neighbour=link.name)
            link.since = now
        link.up, link.last_ok, link.error, link.missed = True, now, None, 0
        self._learn(reports)

    def _read_reports(self, link: NeighbourLink) -> list[Report]:
        """The reports in the neighbour's ``sl.links`` that arrived since the last probe
        (the topic may not exist yet: the neighbour's application has not started)."""
        if link.reader is None:
            link.reader = PartitionReader(
                link.kafka,
                group=f"shorelink-links-{self.site.name}",
                what=f"{LINKS_TOPIC} at {link.name}",
                # Kafka's 500 ms fetch wait: the reader fetches in the background
                # between probes, and a fetch parked at the end returns as soon as
                # a report arrives; 10 ms had each link ask its neighbour about 100
                # times a second (the sites' brokers' busiest work in the voyage)
                extra={"socket.timeout.ms": int(self._timeout * 1000)},
            )
            link.reader.assign({(LINKS_TOPIC, 0): BEGINNING})
        out = []
        deadline = time.monotonic() + self._timeout
        while time.monotonic() < deadline:
            # unknown topic (not created yet) and the like come as errors: next probe
            got = link.reader.poll(500, timeout=0.05)
            for msg in got.records:
                key, value = msg.key(), msg.value()
                if key is None or value is None:
                    continue
                try:
                    out.append(Report.decode(key.decode(), value))
                except (ValueError, UnicodeDecodeError) as exc:
                    self._limited.warning(
                        "links_bad", "links_bad_report", neighbour=link.name, error=str(exc)
                    )
            if got.ends or not (got.records or got.gaps):
                break
        return out

    def _learn(self, reports: Iterable[Report], now: float | None = None) -> None:
        """Keep each report newer than the one held (or different from a stale one),
        refusing versions beyond :data:`MAX_AHEAD_MS` of this site's clock."""
        now = time.monotonic() if now is None else now
        bound = int(time.time() * 1000) + MAX_AHEAD_MS
        with self._lock:
            for rep in reports:
                if rep.version > bound:
                    self._limited.warning(
                        "links_ahead",
                        "links_version_ahead",
                        site=self.site.name,
                        of=rep.site,
                        version=rep.version,
                        bound=bound,
                    )
                    continue
                if rep.site == self.site.name:
                    # a report of this site with a version it has not reached (its clock
                    # was ahead before a restart, or a neighbour forged one): continue
                    # above it, or every site would keep that report and ignore ours
                    if rep.version > self._version:  # (ours, passed back: nothing to do)
                        log.warning(
                            "links_own_version_ahead",
                            site=self.site.name,
                            version=rep.version,
                            ours=self._version,
                        )
                        self._version = rep.version
                    continue
                if rep.site not in self.graph:
                    continue
                old = self.reports.get(rep.site)
                if (
                    old is None
                    or rep.version > old.version
                    or (rep.version != old.version and now - old.seen_at > self._ttl)
                ):
                    rep.seen_at = now
                    self.reports[rep.site] = rep

    def _publish(self) -> None:
        """Our own report (always: its version is what keeps it fresh elsewhere) and
        every newer report of another site we learned."""
        self._version = min(MAX_VERSION, max(self._version + 1, int(time.time() * 1000)))
        now = time.monotonic()
        own = Report(
            self.site.name,
            tuple(sorted(n for n, ln in self.links.items() if ln.up)),
            self._version,
            tuple(sorted(n for n, ln in self.links.items() if ln.up and ln.failing(now))),
        )
        with self._lock:
            todo = [own] + [
                r for r in self.reports.values() if self._published.get(r.site) != r.version
            ]
        try:
            if self._producer is None:
                ensure_topics(
                    self.site.kafka,
                    [TopicSpec(LINKS_TOPIC, partitions=1, compacted=True)],
                    self.site.durability,
                )
            with kafka_errors():
                if self._producer is None:
                    self._producer = producer(self.site.kafka, {"linger.ms": 5})
                for r in todo:
                    self._producer.produce(LINKS_TOPIC, key=r.site.encode(), value=r.encode())
                self._producer.flush(self._timeout)
        except KafkaClientError as exc:  # a TopicError of ensure_topics too: next probe
            self._limited.warning(
                "links_publish", "links_publish_failed", site=self.site.name, error=str(exc)
            )
            return
        for r in todo:
            self._published[r.site] = r.version

    def status(self) -> dict[str, dict[str, object]]:
        return {n: link.status() for n, link in self.links.items()}

    def close(self) -> None:
        for link in self.links.values():
            if link.reader is not None:
                link.reader.close()
                link.reader = None
        if self._producer is not None:
            self._producer.flush(1)
            self._producer = None
