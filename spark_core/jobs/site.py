"""The site's Spark application: ``spark-submit ... spark_core/jobs/site.py --site NAME
--config sites.toml`` (``shorelink-spark site`` builds that line).

A small supervisor runs the site's streaming queries: the merge (two when some streams
are urgent: one for those, one for the rest) and, with ``tables = true``, one query per
Delta table; beside them the replication (spark_core/replication.py): the link probes
and one puller thread per (neighbour, merge), which writes what it pulls through that
merge (spark_core/pull.py). A query that fails is restarted with exponential backoff without
touching the others; SIGTERM/SIGINT stop every query between batches, then Spark. Every
query's progress (rows, rate, batch duration, Kafka lag) is logged per batch and kept in
``<state_dir>/queries.status.json`` (spark_core/progress.py); the links, routes and
per neighbour and stream replication lag in ``<state_dir>/replication.status.json``.

``--site a,b,c`` runs several sites' supervisors in one application (one JVM), each in a
thread, as the tests do: for several sites that share one small machine (the voyage on
two cores), where one JVM per site would spend the cores on JIT compiling the same Spark
code four times. Each site keeps its own queries, checkpoints and status files.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shorelink.errors import ConfigError, ShorelinkError
from shorelink.fleet.follow import RegistryFollower
from shorelink.fleet.log import read_anchor
from shorelink.fleet.state import FleetState
from shorelink.kafka.endpoint import name_clients
from shorelink.kafka.registry import RegistryFeed
from shorelink.logs import configure_logging, get_logger
from shorelink.proof import signature_mode
from shorelink.retry import Backoff
from shorelink.shards import Shard
from spark_core.config import SiteConfig, SitesConfig, load_config, shard_site
from spark_core.merge import Merger, fence_predecessors, reset_changed_checkpoints, start_merge
from spark_core.metrics import serve_metrics
from spark_core.progress import ProgressReporter, last_progress
from spark_core.redrive import Redriver
from spark_core.replication import BULK_POOL, URGENT_POOL, Replicator
from spark_core.session import SCHEDULER_CONF, scheduler_pool
from spark_core.tables import TABLES, TableKeeper, start_table

__all__ = ["QueryRunner", "Supervisor", "build_supervisor", "main"]

log = get_logger("spark_core.site")


def _always() -> bool:
    return True


@dataclass
class QueryRunner:
    """One supervised query: how to start it, how to stop it gracefully, and whether it
    should run now (a query may be wanted only at times: it is parked meanwhile)."""

    name: str
    start: Callable[[], Any]
    stop_gracefully: Callable[[Any], None]
    on_failure: Callable[[str], None]
    wanted: Callable[[], bool] = _always
    on_progress: Callable[[dict[str, Any] | None, str], None] | None = None
    #: called with the running query and its last progress at every report (counters)
    on_query: Callable[[Any, dict[str, Any] | None], None] | None = None
    query: Any = None
    failures: int = 0
    next_start: float = 0.0
    done: bool = False


#: waits before a failed query is started again (failures in a row; reset once it
#: makes progress)
QUERY_BACKOFF = Backoff(first_s=1.0, cap_s=60.0)


class Supervisor:
    def __init__(
        self,
        runners: list[QueryRunner],
        *,
        backoff: Backoff = QUERY_BACKOFF,
        progress: ProgressReporter | None = None,
        on_exit: list[Callable[[], None]] | None = None,
    ) -> None:
        self.runners = runners
        self.on_exit = list(on_exit or [])
        self.replicator: Replicator | None = None
        self.progress = progress
        self.backoff = backoff
        self._stop = threading.Event()

    def request_stop(self, *_: object) -> None:
        self._stop.set()

    def _failed(self, r: QueryRunner, error: str) -> None:
        r.query = None
        r.failures += 1
        delay = self.backoff.delay(r.failures)
        r.next_start = time.monotonic() + delay
        log.error(
            "query_failed",
            query=r.name,
            failures=r.failures,
            restart_in_s=round(delay, 1),
            error=error[:2000],
        )
        r.on_failure(error)

    def run(self, *, until_done: bool = False) -> int:
        """Supervise until stopped (or, with ``until_done``, until every query finished
        without error: Trigger.AvailableNow)."""
        while not self._stop.is_set():
            for r in self.runners:
                if r.done:
                    continue
                wanted = r.wanted()
                if r.query is not None and not wanted:
                    r.stop_gracefully(r.query)
                    r.query, r.failures, r.next_start = None, 0, 0.0
                    log.info("query_parked", query=r.name)
                    continue  # parked until wanted again (was restarted at once: a cycle)
                if r.query is None and not wanted:
                    if until_done:
                        r.done = True  # not routed: nothing to catch up from there
                    continue
                if r.query is None:
                    if time.monotonic() >= r.next_start:
                        try:
                            r.query = r.start()
                            log.info("query_started", query=r.name)
                        except Exception as exc:  # a neighbour down, Kafka away, ...
                            self._failed(r, f"start: {exc}")
                elif not r.query.isActive:
                    error = r.query.exception()
                    if error is None:
                        r.done = True
                        log.info("query_finished", query=r.name)
                    else:
                        self._failed(r, str(error))
                elif r.failures and last_progress(r.query) is not None:
                    r.failures = 0  # healthy again: next failure starts from a short backoff
            self._report()
            if until_done and all(r.done for r in self.runners) and self._caught_up():
                break
            self._stop.wait(0.5)
        if self.replicator is not None:
            self.replicator.stop_pulling()  # before the merges they write through
        for r in self.runners:
            if r.query is not None:
                r.stop_gracefully(r.query)
                self._report(r, "stopped")
        for close in self.on_exit:
            close()
        return 0

    def _caught_up(self) -> bool:
        return self.replicator is None or self.replicator.caught_up()

    def _report(self, only: QueryRunner | None = None, state: str = "") -> None:
        """Each query's last progress to the log and the status file (see progress.py)."""
        if self.progress is None:
            return
        for r in [only] if only is not None else self.runners:
            try:
                progress = last_progress(r.query) if r.query is not None else None
            except Exception:  # the query is going away under us: report next time
                continue
            self.progress.update(r.name, progress, state or _state(r))
            if r.on_progress is not None:
                r.on_progress(progress, state or _state(r))
            if r.on_query is not None and r.query is not None:
                try:
                    r.on_query(r.query, progress)
                except Exception:  # the query is going away under us: next time
                    log.debug("query_report_skipped", query=r.name)

    def wait_idle(self, timeout: float) -> None:
        self._stop.wait(timeout)


def _state(r: QueryRunner) -> str:
    if r.done:
        return "finished"
    if r.query is not None:
        return "running"
    if r.failures:
        return "failed"
    return "starting" if r.wanted() else "idle"


def mergers(
    site: SiteConfig, sites: SitesConfig | None = None, shard: Shard | None = None
) -> list[Merger]:
    """The site's merge; two when some of its streams are urgent and others are not
    (``merge-urgent`` for those, in the FAIR scheduler's urgent pool) and the sources
    are the default ones. With ``shard``, this application's shard of each."""
    if site.merge.source_pattern or not site.urgent_streams or not site.bulk_streams:
        return [Merger(site, sites=sites, shard=shard)]
    return [
        Merger(site, query="merge-urgent", streams=site.urgent_streams, sites=sites, shard=shard),
        Merger(site, streams=site.bulk_streams, sites=sites, shard=shard),
    ]


def merge_runners(spark: Any, merges: list[Merger], *, available_now: bool) -> list[QueryRunner]:
    """One supervised query per merge, the urgent one in the urgent pool."""
    split = len(merges) > 1
    return [
        merge_runner(
            spark,
            m,
            available_now=available_now,
            pool=(URGENT_POOL if m.query.startswith("merge-urgent") else BULK_POOL)
            if split
            else None,
        )
        for m in merges
    ]


def merge_runner(
    spark: Any, merger: Merger, *, available_now: bool, pool: str | None = None
) -> QueryRunner:
    site = merger.site

    def start() -> Any:
        with scheduler_pool(spark, pool):
            return start_merge(spark, merger, available_now=available_now)

    def stop(query: Any) -> None:
        merger.stopping.set()
        # let a batch in flight commit (or fail) before the query is interrupted
        if merger.busy.acquire(timeout=site.kafka.timeout_s * 2):
            merger.busy.release()
        query.stop()
        merger.write_status("stopped")
        merger.close()
        log.info("query_stopped", query=merger.query)

    return QueryRunner(
        name=merger.query,
        start=start,
        stop_gracefully=stop,
        on_failure=lambda error: merger.write_status("failed", error[:2000]),
    )


def table_runners(spark: Any, site: SiteConfig, *, available_now: bool) -> list[QueryRunner]:
    """One supervised query per Delta table whose stream the site carries (``tables =
    true``). Stopping between batches is safe: every table write is idempotent."""

    def runner(table: str) -> QueryRunner:
        def stop(query: Any) -> None:
            query.stop()
            log.info("query_stopped", query=f"table-{table}")

        return QueryRunner(
            name=f"table-{table}",
            start=lambda: start_table(spark, site, table, available_now=available_now),
            stop_gracefully=stop,
            on_failure=lambda error: None,  # logged by the supervisor
        )

    if not site.tables:
        return []
    return [runner(t) for t, stream in TABLES.items() if stream in site.streams]


def _log_signature_mode(site: SiteConfig, cfg: SitesConfig, merges: list[Merger]) -> None:
    """Say at start how the site's merges check what they pull (review N10): one line,
    and a warning where signatures are not enforced on a site that pulls."""
    watched = next((m.ship_keys for m in merges if m.ship_keys is not None), None)
    keys = None if watched is None else watched.current()
    mode, unenforced = signature_mode(keys, cfg.ship_keys_file, checks="pulled records")
    log.info(
        "signature_mode", site=site.name, signatures=mode, ship_keys_file=cfg.ship_keys_file or "-"
    )
    if site.neighbours:
        for why in unenforced:
            log.warning("signatures_not_enforced", site=site.name, message=why)


def follow_registry(
    cfg: SitesConfig, site: SiteConfig, merges: list[Merger]
) -> RegistryFeed | None:
    """With ``fleet_pub_file``: the site's ``sl.registry`` followed from the pinned root
    key, and every merge's ship keys the registry's (docs/fleet-registry.md, "How it
    travels"); the feed, started. None without."""
    if cfg.fleet_pub_file is None:
        return None

    def enforced(state: FleetState) -> None:
        log.info("registry_enforced", site=site.name, version=state.version)

    follower = RegistryFollower(read_anchor(cfg.fleet_pub_file), on_change=enforced)
    for m in merges:
        m.ship_keys = follower
    feed = RegistryFeed(site.kafka, follower)
    feed.start()
    return feed


def build_supervisor(
    spark: Any,
    cfg: SitesConfig,
    site_name: str,
    *,
    available_now: bool = False,
    shard: Shard | None = None,
) -> Supervisor:
    """Everything a site runs (merges, pullers, tables), supervised: call ``run()``
    (blocks until ``request_stop()`` from another thread or a signal). The link state is
    probed once here, so the first routes are known before any puller starts. Several
    sites may share one Spark session (tests, benchmarks). With ``shard`` (a site whose
    merge is split by origin), this application's shard: its merges and ingest pullers;
    the tables run in shard 0 only, the metrics at ``metrics.port`` + its index."""
    site = shard_site(cfg.site(site_name), shard)
    reached = [("kafka", site.kafka), *((n, site.reach(cfg.site(n))) for n in site.neighbours)]
    for link, kafka in reached:
        if (why := kafka.in_clear()) is not None:
            log.warning("kafka_without_tls", site=site.name, link=link, message=why)
    merges = mergers(site, cfg, shard)
    registry = follow_registry(cfg, site, merges)
    _log_signature_mode(site, cfg, merges)
    reset_changed_checkpoints(site, merges, spark)
    fence_predecessors(site, shard)  # whatever layout an earlier run had (urgent, shards)
    replicator = Replicator(cfg, site, merges)
    replicator.start()
    # dead letters the ship keys caused, tried again when the keys change
    redriver = Redriver(merges)
    redriver.start()
    on_exit = [redriver.stop, replicator.stop]
    if registry is not None:
        on_exit.append(registry.stop)
    progress = ProgressReporter(site.state_path / "queries.status.json")
    first = shard is None or shard.index == 0  # what stays one per site: the tables
    keeper = TableKeeper(spark, site) if site.tables and first and not available_now else None
    if site.metrics.port:
        server = serve_metrics(
            site.metrics.host,
            site.metrics.port + (0 if shard is None else shard.index),
            replicator,
            merges,
            progress,
            keeper,
            spark_version=spark.version,
        )
        log.info(
            "metrics_listening", site=site.name, address=f"{site.metrics.host}:{server.server_port}"
        )
        on_exit.append(server.shutdown)
    if keeper is not None:
        keeper.start()
        on_exit.insert(0, keeper.stop)
    sup = Supervisor(
        [
            *merge_runners(spark, merges, available_now=available_now),
            *(table_runners(spark, site, available_now=available_now) if first else []),
        ],
        progress=progress,
        on_exit=on_exit,
    )
    sup.replicator = replicator
    return sup


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="site.py", description=__doc__)
    p.add_argument(
        "--site",
        required=True,
        help="this site's name in the sites file (several, comma-separated: one application)",
    )
    p.add_argument("--config", required=True, help="sites.toml")
    p.add_argument(
        "--available-now",
        action="store_true",
        help="process what is there now, then exit (catch-up runs, tests)",
    )
    p.add_argument("--log-json", action="store_true", help="JSON log lines")
    p.add_argument(
        "--shard",
        type=_shard,
        default=None,
        help="k/N: shard k (from 0) of the site's merge split by origin (merge.shards = N)",
    )
    return p.parse_args(argv)


def _shard(text: str) -> Shard:
    try:
        return Shard.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = [n.strip() for n in args.site.split(",") if n.strip()]
    try:
        cfg = load_config(args.config)
        sites = [cfg.site(n) for n in names]
        if args.shard is not None and len(sites) != 1:
            raise ConfigError("--shard", "a shard's application runs one site")
        for s in sites:
            shard_site(s, args.shard)
    except ShorelinkError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not sites or len(set(names)) != len(names):
        print(f"error: --site: distinct site names wanted, got {args.site!r}", file=sys.stderr)
        return 2
    configure_logging(cfg.log_level, as_json=args.log_json)
    name_clients("shorelink-spark-" + "-".join(names))
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.appName(
            "shorelink-" + "-".join(names) + ("" if args.shard is None else args.shard.suffix)
        )
        .config(map=dict[str, Any](SCHEDULER_CONF))
        .getOrCreate()
    )
    # the JVM's log: warnings and worse unless asked (spark_core/conf/log4j2.properties)
    spark.sparkContext.setLogLevel(os.environ.get("SHORELINK_SPARK_LOG_LEVEL", "WARN").upper())
    sups = [
        build_supervisor(spark, cfg, s.name, available_now=args.available_now, shard=args.shard)
        for s in sites
    ]

    def stop_all(*_: object) -> None:
        for sup in sups:
            sup.request_stop()

    signal.signal(signal.SIGTERM, stop_all)
    signal.signal(signal.SIGINT, stop_all)
    for s in sites:
        log.info("site_started", site=s.name, pid=os.getpid())
    for reader, missing in cfg.unreached().items():
        log.warning(
            "topology_unreached",
            site=reader,
            never_gets=",".join(missing),
            error="no chain of neighbours leads there: those sites' records never reach it",
        )
    codes = [0] * len(sups)

    def run(i: int) -> None:
        try:
            codes[i] = sups[i].run(until_done=args.available_now)
        except Exception:
            log.exception("site_failed", site=sites[i].name)
            codes[i] = 1
            stop_all()

    threads = [
        threading.Thread(target=run, args=(i,), name=f"site-{s.name}", daemon=True)
        for i, s in enumerate(sites)
    ]
    try:
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            for t in threads:
                t.join(timeout=0.5)
        return max(codes)
    finally:
        spark.stop()
        for s in sites:
            log.info("site_stopped", site=s.name)


if __name__ == "__main__":
    sys.exit(main())
