"""The site's Spark application: ``spark-submit ... spark_core/jobs/site.py --site NAME
--config sites.toml`` (``shorelink-spark site`` builds that line).

A small supervisor runs the site's streaming queries (the merge and, with ``tables =
true``, one query per Delta table; replication plugs in as more runners): a query that
fails is restarted with exponential backoff without touching the others; SIGTERM/SIGINT
stop every query between batches, then Spark. Every query's progress (rows, rate, batch
duration, Kafka lag) is logged per batch and kept in
``<checkpoint_dir>/queries.status.json`` (spark_core/progress.py).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file by spark-submit: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from shorelink.errors import ShorelinkError
from shorelink.logs import configure_logging
from spark_core.config import SiteConfig, load_config
from spark_core.merge import Merger, start_merge
from spark_core.progress import ProgressReporter, as_dict
from spark_core.tables import TABLES, start_table

__all__ = ["QueryRunner", "Supervisor", "main"]

log = logging.getLogger("spark_core.site")


@dataclass
class QueryRunner:
    """One supervised query: how to start it, how to stop it gracefully."""

    name: str
    start: Callable[[], Any]
    stop_gracefully: Callable[[Any], None]
    on_failure: Callable[[str], None]
    query: Any = None
    failures: int = 0
    next_start: float = 0.0
    done: bool = False


class Supervisor:
    def __init__(
        self,
        runners: list[QueryRunner],
        *,
        backoff_s: float = 1.0,
        backoff_cap_s: float = 60.0,
        progress: ProgressReporter | None = None,
    ) -> None:
        self.runners = runners
        self.progress = progress
        self.backoff_s = backoff_s
        self.backoff_cap_s = backoff_cap_s
        self._stop = threading.Event()

    def request_stop(self, *_: object) -> None:
        self._stop.set()

    def _failed(self, r: QueryRunner, error: str) -> None:
        r.query = None
        r.failures += 1
        delay = min(self.backoff_cap_s, self.backoff_s * 2 ** (r.failures - 1))
        r.next_start = time.monotonic() + delay
        log.error(
            "event=query_failed query=%s failures=%d restart_in_s=%.1f error=%r",
            r.name,
            r.failures,
            delay,
            error[:2000],
        )
        r.on_failure(error)

    def run(self, *, until_done: bool = False) -> int:
        """Supervise until stopped (or, with ``until_done``, until every query finished
        without error: Trigger.AvailableNow)."""
        while not self._stop.is_set():
            for r in self.runners:
                if r.done:
                    continue
                if r.query is None:
                    if time.monotonic() >= r.next_start:
                        try:
                            r.query = r.start()
                            log.info("event=query_started query=%s", r.name)
                        except Exception as exc:  # a neighbour down, Kafka away, ...
                            self._failed(r, f"start: {exc}")
                elif not r.query.isActive:
                    error = r.query.exception()
                    if error is None:
                        r.done = True
                        log.info("event=query_finished query=%s", r.name)
                    else:
                        self._failed(r, str(error))
                elif r.failures and r.query.lastProgress is not None:
                    r.failures = 0  # healthy again: next failure starts from a short backoff
            self._report()
            if until_done and all(r.done for r in self.runners):
                break
            self._stop.wait(0.5)
        for r in self.runners:
            if r.query is not None:
                r.stop_gracefully(r.query)
                self._report(r, "stopped")
        return 0

    def _report(self, only: QueryRunner | None = None, state: str = "") -> None:
        """Each query's last progress to the log and the status file (see progress.py)."""
        if self.progress is None:
            return
        for r in [only] if only is not None else self.runners:
            try:
                progress = as_dict(r.query.lastProgress) if r.query is not None else None
            except Exception:  # the query is going away under us: report next time
                continue
            self.progress.update(r.name, progress, state or _state(r))


def _state(r: QueryRunner) -> str:
    if r.done:
        return "finished"
    if r.query is not None:
        return "running"
    return "failed" if r.failures else "starting"


def merge_runner(spark: Any, site: SiteConfig, *, available_now: bool) -> QueryRunner:
    merger = Merger(site)

    def stop(query: Any) -> None:
        merger.stopping.set()
        # let a batch in flight commit (or fail) before the query is interrupted
        if merger.busy.acquire(timeout=site.kafka_timeout_s * 2):
            merger.busy.release()
        query.stop()
        merger.write_status("stopped")
        merger.close()
        log.info("event=query_stopped query=merge")

    return QueryRunner(
        name="merge",
        start=lambda: start_merge(spark, merger, available_now=available_now),
        stop_gracefully=stop,
        on_failure=lambda error: merger.write_status("failed", error[:2000]),
    )


def table_runners(spark: Any, site: SiteConfig, *, available_now: bool) -> list[QueryRunner]:
    """One supervised query per Delta table whose stream the site carries (``tables =
    true``). Stopping between batches is safe: every table write is idempotent."""

    def runner(table: str) -> QueryRunner:
        def stop(query: Any) -> None:
            query.stop()
            log.info("event=query_stopped query=table-%s", table)

        return QueryRunner(
            name=f"table-{table}",
            start=lambda: start_table(spark, site, table, available_now=available_now),
            stop_gracefully=stop,
            on_failure=lambda error: None,  # logged by the supervisor
        )

    if not site.tables:
        return []
    return [runner(t) for t, stream in TABLES.items() if stream in site.streams]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="site.py", description=__doc__)
    p.add_argument("--site", required=True, help="this site's name in the sites file")
    p.add_argument("--config", required=True, help="sites.toml")
    p.add_argument(
        "--available-now",
        action="store_true",
        help="process what is there now, then exit (catch-up runs, tests)",
    )
    p.add_argument("--log-json", action="store_true", help="JSON log lines")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        cfg = load_config(args.config)
        site = cfg.site(args.site)
    except ShorelinkError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    configure_logging(cfg.log_level, as_json=args.log_json)
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName(f"shorelink-{site.name}").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    sup = Supervisor(
        [
            merge_runner(spark, site, available_now=args.available_now),
            *table_runners(spark, site, available_now=args.available_now),
        ],
        progress=ProgressReporter(site.checkpoint_dir / "queries.status.json"),
    )
    signal.signal(signal.SIGTERM, sup.request_stop)
    signal.signal(signal.SIGINT, sup.request_stop)
    log.info("event=site_started site=%s pid=%s", site.name, os.getpid())
    try:
        return sup.run(until_done=args.available_now)
    finally:
        spark.stop()
        log.info("event=site_stopped site=%s", site.name)


if __name__ == "__main__":
    sys.exit(main())
