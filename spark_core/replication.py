"""Replication: a site pulls other sites' records from its neighbours.

The :class:`Replicator` keeps the site's link state and routes (spark_core/routing.py:
each entry site's records come through one neighbour, the first hop of a shortest path
over the links that are up) and runs one puller per (neighbour, merge)
(spark_core/pull.py): the urgent merge's streams and the rest, so an alert never waits
behind a containers catch-up. A puller reads the relay topics of the entries routed
through its neighbour and hands them to the merge, which writes what the site lacks in
one transaction with its cursor. So a site runs ``n`` neighbours x ``m`` merges (1 or
2) pullers, whatever the number of sites, and a hop between two sites is one read and
one transaction, no Spark micro-batch. ``<state_dir>/replication.status.json``
shows it: per neighbour the link and per stream the state and lag.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any

from shorelink.contract import relay_topic
from shorelink.files import write_json_atomic
from shorelink.fleet.follow import RegistryFollower
from shorelink.kafka.errors import KafkaClientError
from shorelink.logs import get_logger
from spark_core.config import SiteConfig
from spark_core.feed import FEED_BATCHES, ByteBudget, Feed, feed_prefetch
from spark_core.feed_loop import FeedLoop
from spark_core.ingest_pull import IngestPuller, write_through
from spark_core.merge import Merger
from spark_core.merge_state import MergeError
from spark_core.neighbour_admin import SharedAdmin
from spark_core.pull import Puller
from spark_core.repair import Repairer, SelfCheck
from spark_core.routing import LinkState

__all__ = ["BULK_POOL", "URGENT_POOL", "Replicator", "history_sources", "quarantine_of"]

log = get_logger(__name__)

#: the fleet registry's newest refused entries the status file shows
REGISTRY_QUARANTINE_SHOWN = 20

#: Spark's scheduler pools (spark.scheduler.mode=FAIR): urgent streams' queries and
#: merge in one, everything else in the other, so neither waits for the other's jobs
URGENT_POOL = "urgent"
BULK_POOL = "bulk"


def quarantine_of(mergers: Iterable[Merger]) -> dict[str, Any]:
    """What ``mergers`` quarantined since they started, per stream and cause
    (``quarantined``), and of the dead letters tried again, how many were written per
    cause (``taken_again``; one held already, a copy that came another way, was not
    taken: review 9, finding 21): spark_core/quarantine.py, spark_core/redrive.py."""
    quarantined: dict[str, dict[str, int]] = {}
    taken: dict[str, int] = {}
    for m in mergers:
        for where, n in m.totals.quarantined.items():
            stream, _, cause = where.rpartition(":")
            counts = quarantined.setdefault(stream, {})
            counts[cause] = counts.get(cause, 0) + n
        for key, n in m.totals.redriven.items():
            cause, _, outcome = key.partition(":")
            if outcome == "written":
                taken[cause] = taken.get(cause, 0) + n
    return {"quarantined": quarantined, "taken_again": taken}


def history_sources(cfg: Any, site: SiteConfig) -> dict[str, str]:
    """Per stream of ``site``: the neighbour a site that starts with nothing reads the
    stream's history from (spark_core/pull.py), the one whose canonical topic keeps it
    longest (for ever first; ties: by name). A stream no neighbour carries has none."""
    out = {}
    for stream in site.streams:
        carriers = [cfg.site(n) for n in site.neighbours if stream in cfg.site(n).streams]
        if carriers:
            kept = min(carriers, key=lambda s: (-(s.policy(stream).retention_ms or 2**63), s.name))
            out[stream] = kept.name
    return out


class Replicator:
    """The site's replication: its link state (probed in a thread of its own every
    ``probe_interval``), the routes, its pullers (one thread each), and
    ``<state_dir>/replication.status.json``."""

    def __init__(self, cfg: Any, site: SiteConfig, mergers: Sequence[Merger] = ()) -> None:
        self.cfg = cfg
        self.site = site
        self.links = LinkState(cfg, site)
        self.mergers = list(mergers)
        self.routes: dict[str, str | None] = {}
        #: how often the routes changed (the first routes count)
        self.route_changes = 0
        history = history_sources(cfg, site)
        #: one admin client per neighbour for its link probe, pullers and repairers (a
        #: client each was 2m + 1 of them a neighbour: docs/data-centre.md, "A site's
        #: costs as neighbours grow")
        self.admins: dict[str, SharedAdmin] = {
            n: link.admin for n, link in self.links.links.items()
        }
        self.pullers = [
            Puller(
                site,
                n,
                site.reach(cfg.site(n)),
                tuple(s for s in m.streams if s in site.streams),
                urgent=bool(m.streams) and all(s in site.urgent_streams for s in m.streams),
                merger=m,
                routes=lambda: self.routes,
                history=tuple(s for s, n2 in history.items() if n2 == n and s in m.streams),
                sites=tuple(cfg.sites),
                shared_admin=self.admins[n],
            )
            for n in site.neighbours
            for m in mergers
        ]
        #: each merge's own ingress, read as a neighbour's relay is: no Spark batch
        #: between the gateway and the merge on a record's way (the merge's Spark query
        #: reads the same topics and writes what this has not, spark_core/merge.py)
        self.ingest = [
            IngestPuller.of(m) for m in mergers if m.streams and not site.merge.source_pattern
        ]
        for m in mergers:  # a Spark batch too big for the driver: in slices, pulled
            m.write_through = partial(write_through, m)
        for p in self.ingest:  # the merge's Spark query is then the backstop
            p.merger.ingest_puller = True
        #: what the site's feeds hold at once (replication review N12): the rows read
        #: and not yet written, and librdkafka's prefetch, per driver, not per feed
        self.budget = ByteBudget(FEED_BATCHES * site.merge.max_batch_bytes)
        feeds = self.all_pullers
        prefetch = feed_prefetch(site.merge.max_batch_bytes, len(feeds))
        for feed in feeds:
            feed.reader_config = {**prefetch, **feed.reader_config}
            if not feed.urgent:  # an alert's small batch never waits for a catch-up's
                feed.budget = self.budget
        #: the neighbours' pullers of each merge, read in turn in one thread, a
        #: neighbour whose link the probes found down left until it is up again
        self.loops = [
            FeedLoop(feeds, ready=lambda p: self.links.links[p.neighbour].up)
            for m in mergers
            if (feeds := [p for p in self.pullers if p.merger is m])
        ]
        #: each neighbour's holdings against the site's, per merge (spark_core/repair.py)
        self.repairers = [
            Repairer(p.neighbour, p.kafka, p.merger, self.admins[p.neighbour])
            for p in self.pullers
            if p.streams
        ]
        #: each merge's own canonical topics against its ledger (what they lost early
        #: is forgotten, then repaired from the neighbours)
        self.checks = [SelfCheck(m) for m in mergers if m.streams] if self.repairers else []
        self._stop = threading.Event()
        self._pulling = threading.Event()
        self._thread: threading.Thread | None = None
        self._threads: list[threading.Thread] = []
        self.status_path = site.state_path / "replication.status.json"
        self._status_lock = threading.Lock()

    # -- the routing loop ---------------------------------------------------------------
    def start(self) -> None:
        """Probe once (so the first routes are known), then keep probing in a thread;
        a fresh site's pullers note where its own relay topics at each neighbour that
        answers end (:meth:`Puller.begin`); then start the pullers."""
        if self.site.neighbours:
            self.tick()
            self._thread = threading.Thread(target=self._run, name="replication-links", daemon=True)
            self._thread.start()
        for p in self.pullers:  # before the merges write: what recovery reads up to
            if self.links.links[p.neighbour].up:
                try:
                    p.begin()
                except (MergeError, KafkaClientError) as exc:  # its thread retries
                    log.warning("pull_begin_failed", puller=p.name, error=str(exc))
        if self.repairers:
            t = threading.Thread(target=self._repair, name="replication-repair", daemon=True)
            t.start()
            self._threads.append(t)
        # the ingest pullers a thread each (one per merge); the neighbours' pullers one
        # thread per merge (spark_core/feed_loop.py): threads flat in the neighbours
        runs: list[tuple[str, Callable[[threading.Event], None]]] = [
            *((feed.name, feed.run) for feed in self.ingest),
            *((loop.name, loop.run) for loop in self.loops),
        ]
        for name, run in runs:
            t = threading.Thread(
                target=run, args=(self._pulling,), name=f"{name}@{self.site.name}", daemon=True
            )
            t.start()
            self._threads.append(t)

    def tick(self) -> None:
        for m in self.mergers:  # a merge no ingest puller's loop drives: its relay index
            if not m.ingest_puller:
                try:
                    m.write_index()
                except (MergeError, KafkaClientError) as exc:  # its next batch retries
                    log.warning("relay_index_failed", site=self.site.name, error=str(exc))
        self.links.probe()
        self.links.note_pulls(self.failing())
        routes = self.links.routes()
        if routes != self.routes:
            log.info(
                "routes",
                site=self.site.name,
                routes=",".join(f"{e}<-{n or '-'}" for e, n in sorted(routes.items())),
            )
            self.routes = routes
            self.route_changes += 1
        self.write_status()

    def _run(self) -> None:
        while not self._stop.wait(self.site.replication.probe_interval_s):
            try:
                self.tick()
            except Exception:  # never let the routing thread die: log and go on
                log.exception("replication_tick_failed", site=self.site.name)

    def _repair(self) -> None:
        """Every ``repair_interval``, each repairer of a neighbour that answers, one
        after the other (one thread, whatever the number of neighbours)."""
        while not self._pulling.wait(self.site.replication.repair_interval_s):
            self.repair_round()

    def repair_round(self) -> int:
        """One round of every repairer whose neighbour answers; returns the records
        repaired. A repairer's failure is its status's error, and the next round tries
        again."""
        written = 0
        for check in self.checks:
            try:
                check.round()
            except (KafkaClientError, MergeError) as exc:
                log.warning("self_check_failed", site=self.site.name, error=str(exc))
        for r in self.repairers:
            if self._pulling.is_set():
                break
            if not self.links.links[r.neighbour].up:
                continue
            try:
                written += r.round()
            except (KafkaClientError, MergeError) as exc:
                r.error = str(exc)
                log.warning("repair_failed", site=self.site.name, repairer=r.name, error=str(exc))
        return written

    def holds_all(self) -> bool | None:
        """Does the site hold everything its neighbours hold (as their last round
        found)? None before every repairer has compared once."""
        if any(r.rounds == 0 for r in self.repairers):
            return None
        return not any(sum(r.lacking.values()) for r in self.repairers)

    def failing(self) -> dict[str, tuple[float, str]]:
        """Per neighbour with a failing puller: since when the earliest has failed, and
        its error (routing.LinkState.note_pulls holds such a link)."""
        out: dict[str, tuple[float, str]] = {}
        for p in self.pullers:
            if p.failing_since is not None and (
                p.neighbour not in out or p.failing_since < out[p.neighbour][0]
            ):
                out[p.neighbour] = (p.failing_since, p.error or "")
        return out

    def stop_pulling(self) -> None:
        """Stop the pullers (each ends its round: a batch in flight commits or fails)."""
        self._pulling.set()
        for t in self._threads:
            t.join(timeout=self.site.kafka.timeout_s * 2)
        self._threads = []

    @property
    def all_pullers(self) -> list[Feed]:
        """The pullers from neighbours and from the site's own ingress."""
        return [*self.ingest, *self.pullers] if self.site.neighbours else list(self.ingest)

    def caught_up(self) -> bool:
        """Every puller's last round read nothing and found its partitions at their end."""
        return all(p.idle for p in self.all_pullers)

    def stop(self) -> None:
        self.stop_pulling()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.site.replication.probe_timeout_s * 3)
        self.links.close()

    # -- status ---------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """Per neighbour: the link, and per stream the state (``up``: caught up;
        ``catching_up``; ``down``: routed here but failing; ``idle``: nothing routed
        here), records and seconds behind, the last batch pulled, the entries."""
        now = time.time()
        routes = dict(self.routes)
        neighbours: dict[str, Any] = {}
        for name, link in self.links.status().items():
            streams: dict[str, Any] = {}
            for stream in self.site.streams:
                pullers = [p for p in self.pullers if p.neighbour == name and stream in p.streams]
                entries = sorted(e for e, n in routes.items() if n == name and e != self.site.name)
                topics = [relay_topic(e, stream) for e in entries]
                lags = [p.lag.get(t) for p in pullers for t in topics]
                counted = [n for n in lags if n is not None]
                # .get: a puller thread may drop a topic from behind_since meanwhile
                since = [
                    s for p in pullers for t in topics if (s := p.behind_since.get(t)) is not None
                ]
                ok = [p.last_success for p in pullers if p.last_success]
                if not entries:
                    state = "idle"
                elif link["state"] == "down" or any(p.error for p in pullers):
                    state = "down"
                elif counted and not any(counted) and len(counted) == len(lags):
                    state = "up"
                else:
                    state = "catching_up"
                streams[stream] = {
                    "state": state,
                    "lag_records": sum(counted) if counted else None,
                    "lag_s": round(now - min(since), 1) if since else (0.0 if counted else None),
                    "last_success": max(ok) if ok else None,
                    "entries": entries,
                    "error": next((p.error for p in pullers if p.error), None),
                }
            repair = [r for r in self.repairers if r.neighbour == name]
            neighbours[name] = {
                **link,
                "streams": streams,
                "repair": {r.merger.query: r.status() for r in repair},
            }
        return {
            "site": self.site.name,
            "updated_at": now,
            "routes": routes,
            "holds_all": self.holds_all(),
            # per stream: seqs the site's canonical topics lost before their retention,
            # forgotten to be repaired (spark_core/repair.py SelfCheck)
            "lost_here": {
                stream: n for c in self.checks for stream, n in sorted(c.forgotten.items())
            },
            "neighbours": neighbours,
            "registry": self.registry(),
            "quarantine": self.quarantine(),
            "pullers": {
                p.name: {
                    "read": p.read,
                    "read_history": p.read_history,
                    "read_back": p.read_back,
                    "batches": p.batches,
                    "gaps": p.gaps,
                    "skipped_held": p.skipped_held,
                    "unproved": p.guard.unproved,
                    "parks": p.guard.parks,
                    "history": p.reading_history,
                    "last_success": p.last_success,
                    "error": p.error,
                }
                for p in self.all_pullers
            },
        }

    def quarantine(self) -> dict[str, Any]:
        """:func:`quarantine_of` this site's merges."""
        return quarantine_of(self.mergers)

    def registry(self) -> dict[str, Any] | None:
        """The fleet registry the merges enforce (``fleet_pub_file``; None without):
        its version, the entries refused per reason and the newest of them."""
        follower = next(
            (m.ship_keys for m in self.mergers if isinstance(m.ship_keys, RegistryFollower)), None
        )
        if follower is None:
            return None
        return {
            "version": follower.version,
            "refused": dict(follower.refused),
            # the newest refused: what, why, when (the status file stays small)
            "quarantine": follower.quarantined(REGISTRY_QUARANTINE_SHOWN),
        }

    def write_status(self) -> None:
        """Rewrite ``replication.status.json`` (one writer at a time: the routing thread
        and a caller may both ask, and they share the temporary file)."""
        with self._status_lock:
            write_json_atomic(self.status_path, self.status(), indent=1, sort_keys=True)
