"""Headquarters' registry loop (``shorelink fleet run``; docs/fleet-registry.md, "Who
publishes and ticks"): every entry written to the registry is published to HQ's
``sl.ingress.registry`` within a check interval of its writing, and every
``tick_every`` the ships' newest reports decide each active rollout (``fleet rollout
tick``), whose entry is published at once; in the same turn, each ship whose newest
report names the newer token of a pending rotation has the older one retired
(``token_retired``, shorelink/fleet/tokens.py), published at once too.

Why a loop and not a timer alone: a registry change travels like an alert (goal: every
site enforces it within 10 s of its writing), and a timer that starts a Python process
and reads Kafka every few seconds would cost more than a loop that stats one file a
second. The file's stat is the whole cost between changes (``Registry.refresh`` reads
only what was appended).

A Kafka that does not answer, a registry that cannot be read: logged (rate-limited),
retried after a wait that doubles to ``MAX_BACKOFF_S``, never the end of the loop. Every
wait is bounded (a check, a Kafka call's timeout), so a stop is seen within a check or
one Kafka call.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from shorelink.errors import ShorelinkError
from shorelink.fleet.entry import token_id
from shorelink.fleet.health import heard_from
from shorelink.fleet.log import Registry
from shorelink.fleet.rollout_cli import tick
from shorelink.fleet.tokens import retire_used
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.registry import publish
from shorelink.kafka.ship_reports import newest_reports
from shorelink.kafka.topics import Durability
from shorelink.logs import RateLimitedLog, get_logger

__all__ = ["MAX_BACKOFF_S", "HeadquartersLoop"]

log = get_logger(__name__)

#: the longest wait after failures in a row
MAX_BACKOFF_S = 60.0


@dataclass
class HeadquartersLoop:
    """Publish what is new in ``directory``'s registry to ``site`` (at ``kafka``) and
    tick its rollouts on the reports of ``report_stream``, until ``stop`` is set."""

    directory: Path
    kafka: KafkaEndpoint
    site: str
    durability: Durability | None = None
    report_stream: str = "agent"
    #: seconds between two ticks of the rollouts (0: never tick)
    tick_every: float = 30.0
    #: seconds between two looks at the registry's log
    check_every: float = 1.0
    stop: threading.Event = field(default_factory=threading.Event)
    #: the newest version published (None: not known yet, asked of the site's Kafka)
    published: int | None = None
    ticks: int = 0
    #: older tokens retired on the ships' reports since the loop started
    tokens_retired: int = 0
    _reg: Registry | None = field(default=None, repr=False)
    _next_tick: float = 0.0

    def step(self) -> None:
        """One turn: publish what is new, tick if due, publish what the tick wrote."""
        if self._reg is None:
            self._reg = Registry.open(self.directory)
        else:
            self._reg.refresh()
        self._publish()
        if self.tick_every > 0 and time.monotonic() >= self._next_tick:
            self._next_tick = time.monotonic() + self.tick_every
            self._tick()
            self._publish()

    def _publish(self) -> None:
        assert self._reg is not None
        version = self._reg.state.version
        if self.published is not None and version <= self.published:
            return
        t0 = time.monotonic()
        versions = publish(self._reg, self.kafka, self.site, self.durability, self.published)
        self.published = version
        if versions:
            log.info(
                "registry_published",
                site=self.site,
                first=versions[0],
                last=versions[-1],
                version=version,
                seconds=round(time.monotonic() - t0, 3),
            )

    def _tick(self) -> None:
        assert self._reg is not None
        timeout = min(30.0, max(5.0, self.tick_every))
        found = newest_reports(self.kafka, self.report_stream, timeout=timeout)
        self.ticks += 1
        for line in tick(self._reg, heard_from(found.reports)):
            rollout, _, outcome = line.partition(": ")
            action, _, reason = outcome.partition(": ")
            (log.debug if action == "held" else log.info)(
                "rollout_ticked",
                rollout=rollout.removeprefix("rollout "),
                action=action,
                reason=reason,
            )
        for r in retire_used(self._reg, {s: rep.token for s, rep in found.reports.items()}):
            self.tokens_retired += 1
            log.info(
                "token_retired",
                ship=r.ship,
                token=token_id(r.old),
                used=r.used,
                retired=self.tokens_retired,
            )

    def run(self) -> None:
        """Turn until ``stop``; a failure waits ``check_every`` doubled per failure in
        a row (at most :data:`MAX_BACKOFF_S`), logged at most once a minute per kind."""
        limited = RateLimitedLog(log, 60.0)
        failures = 0
        log.info(
            "fleet_loop_started",
            registry=self.directory,
            site=self.site,
            tick_every=self.tick_every,
            check_every=self.check_every,
        )
        while not self.stop.is_set():
            try:
                self.step()
                failures = 0
            except ShorelinkError as exc:
                failures += 1
                limited.warning(
                    type(exc).__name__, "fleet_loop_failed", error=str(exc), failures=failures
                )
            wait = self.check_every * (2 ** min(failures, 16) if failures else 1)
            self.stop.wait(min(wait, MAX_BACKOFF_S))
        log.info(
            "fleet_loop_stopped",
            published=self.published,
            ticks=self.ticks,
            tokens_retired=self.tokens_retired,
        )
