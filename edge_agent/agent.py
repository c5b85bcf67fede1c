"""The edge agent process: wires the log, ingest, uplink, metrics and systemd together
and runs until SIGTERM/SIGINT, then stops cleanly (everything received is committed and
acknowledged first; the uplink finishes or abandons the batch in flight)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import start_http_server

from edge_agent import systemd
from edge_agent.clock import SHIP_CLOCK, SteadyClock
from edge_agent.config import EdgeConfig
from edge_agent.errors import LogError
from edge_agent.ingest import Ingest
from edge_agent.log import EdgeLog
from edge_agent.metrics import EdgeMetrics
from edge_agent.report import Reporter
from edge_agent.status import open_log
from shorelink.errors import ConfigError
from shorelink.logs import get_logger

if TYPE_CHECKING:
    from edge_agent.fleet_config import FleetConfig
    from edge_agent.gateway import Gateway
    from edge_agent.uplink import Uplink

__all__ = ["Agent", "Supervisor"]

log = get_logger(__name__)

GAUGE_INTERVAL_S = 5.0
EXPIRE_INTERVAL_S = 60.0
#: on stop, how long the uplink may take to finish the batch in flight before it is
#: cancelled (the site's holdings tell the next start whether it arrived)
UPLINK_STOP_GRACE_S = 10.0
#: on stop, how long ingest may take to commit and acknowledge what it received and
#: disconnect (its drain is bounded at 10 s, its disconnect at 2 s) before it is
#: cancelled: nothing is acknowledged before it is committed, so a cancel loses nothing
#: the broker was told is stored (the broker redelivers the rest)
INGEST_STOP_S = 15.0
#: once a task of the run is cancelled, how long it may take to end before the stop
#: goes on without it (logged as ``agent_task_abandoned``): every stop ends within
#: INGEST_STOP_S + UPLINK_STOP_GRACE_S + 4 * TASK_CANCEL_S at most
TASK_CANCEL_S = 5.0


class Agent:
    def __init__(
        self,
        cfg: EdgeConfig,
        *,
        gateways: Sequence[Gateway] | None = None,
        clock: SteadyClock = SHIP_CLOCK,
        fleet: FleetConfig | None = None,
    ) -> None:
        """``gateways`` replaces the configured ones (tests: an in-memory gateway);
        ``clock`` is the wall clock with its jumps taken out (budgets, retention);
        ``fleet`` the fleet configuration the ship holds (edge_agent/fleet_config.py)."""
        if gateways is None and cfg.gateways and not cfg.uplink.token:
            raise ConfigError(
                "uplink.token", "gateways are configured: set uplink.token or uplink.token_file"
            )
        self.cfg = cfg
        self.clock = clock
        self.metrics = EdgeMetrics()
        t0 = time.monotonic()
        self.log: EdgeLog = open_log(cfg)
        log.info(
            "log_opened",
            path=cfg.log.path,
            seconds=round(time.monotonic() - t0, 3),
            records=sum(self.log.stream_state(s).count for s in self.log.stream_names()),
        )
        self.ingest = Ingest(cfg, self.log, self.metrics)
        self.fleet = fleet
        self.reporter = Reporter(
            cfg, self.log, config=fleet.reported if fleet is not None else None
        )
        self.stop = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        #: set when the run ends to start again (a fleet configuration applied or
        #: rolled back): :class:`Supervisor` builds the agent again
        self.restart = False
        if fleet is not None:
            fleet.on_applied = self._restart
        #: None: no gateways configured, the agent only ingests
        self.uplink: Uplink | None = None
        if gateways or (gateways is None and cfg.gateways):
            # imported only when there is somewhere to upload: aiohttp alone costs a
            # ship that only ingests ~24 MB of RSS
            from edge_agent.uplink import Uplink

            self.uplink = Uplink(
                cfg,
                self.log,
                self.metrics,
                self.ingest.committed,
                gateways=gateways,
                clock=clock.now,
                fleet=fleet,
            )

    def _restart(self) -> None:
        """End the run to start again. Called from a worker thread too (the fleet
        configuration is taken in one): an asyncio.Event set off its loop's thread
        wakes nobody for sure (in debug mode it raises there and the run never ends)."""
        self.restart = True
        loop = self._loop
        if loop is None or _on_loop(loop):
            self.stop.set()
        else:
            loop.call_soon_threadsafe(self.stop.set)

    async def run(self, *, install_signals: bool = True) -> None:
        """Run until :attr:`stop` is set (by SIGTERM/SIGINT, or by the caller)."""
        loop = self._loop = asyncio.get_running_loop()
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.stop.set)
        server = None
        if self.cfg.metrics.port:
            server, _thread = start_http_server(
                self.cfg.metrics.port, self.cfg.metrics.host, registry=self.metrics.registry
            )
            log.info("metrics_listening", address=f"{self.cfg.metrics.host}:{server.server_port}")
        tasks = [
            asyncio.create_task(self.ingest.run(self.stop), name="ingest"),
            asyncio.create_task(self._housekeeping(), name="housekeeping"),
            asyncio.create_task(self._watchdog(), name="watchdog"),
            asyncio.create_task(self._reporting(), name="reporting"),
        ]
        if self.fleet is not None and self.fleet.begin():
            tasks.append(asyncio.create_task(self._trial(), name="fleet-trial"))
        uplink_task = (
            asyncio.create_task(self.uplink.run(self.stop), name="uplink")
            if self.uplink is not None
            else None
        )
        systemd.notify("READY=1")
        log.info(
            "agent_started",
            ship=self.cfg.ship,
            mqtt=f"{self.cfg.mqtt.host}:{self.cfg.mqtt.port}",
            gateways=len(self.cfg.gateways),
        )
        try:
            await self.stop.wait()
        finally:
            systemd.notify("STOPPING=1")
            log.info("agent_stopping")
            # ingest drains: commits and acknowledges what it received
            await _end(tasks[:1], INGEST_STOP_S)
            if uplink_task is not None:
                # the uplink sends no new batch once stop is set; give the one in
                # flight a moment, then cancel it
                await _end([uplink_task], UPLINK_STOP_GRACE_S)
            await _end(tasks[1:], 0)
            self.log.close()
            if server is not None:  # the port is the next run's (Supervisor's restart)
                # (the server's loop polls every 0.5 s)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.to_thread(server.shutdown), TASK_CANCEL_S)
                server.server_close()
            log.info("agent_stopped")

    async def _trial(self) -> None:
        """A fleet configuration just applied: kept once ingest is connected and a
        gateway was reached within ``uplink.fleet_health``, else rolled back."""
        assert self.fleet is not None
        within = self.cfg.uplink.fleet_health_s
        reached = self.uplink.reached if self.uplink is not None else asyncio.Event()
        if self.uplink is None:
            reached.set()
        try:
            async with asyncio.timeout(within):
                await self.ingest.connected.wait()
                await reached.wait()
        except TimeoutError:
            why = "ingest not connected" if not self.ingest.connected.is_set() else "no gateway"
            await asyncio.to_thread(self.fleet.rollback, f"{why} within {within:g}s")
            self._restart()
            return
        await asyncio.to_thread(self.fleet.healthy)
        self.report()

    async def _watchdog(self) -> None:
        interval = systemd.watchdog_interval()
        if interval is None:
            return
        while True:
            if self.ingest.healthy():
                systemd.notify("WATCHDOG=1")
            await asyncio.sleep(interval)

    async def _housekeeping(self) -> None:
        last_expire = 0.0
        while True:
            if time.monotonic() - last_expire > EXPIRE_INTERVAL_S:
                await asyncio.to_thread(self.expire)
                last_expire = time.monotonic()
            await asyncio.to_thread(self.update_gauges)
            await asyncio.sleep(GAUGE_INTERVAL_S)

    async def _reporting(self) -> None:
        """A ship report at start, then when the ship's state changed (looked at every
        ``report.interval``) and at least every ``report.heartbeat``."""
        if not self.cfg.report.stream:
            return
        while True:
            await asyncio.to_thread(self.report)
            await asyncio.sleep(self.cfg.report.interval_s)

    def report(self) -> int | None:
        """Write a ship report if one is due (edge_agent/report.py): its seq; 0 if it
        was not written (the stream's budget refused it, or the log could not take it:
        logged and counted, the next interval tries again); None if none was due."""
        try:
            seq = self.reporter.tick()
        except LogError as exc:
            self.metrics.reports.labels("failed").inc()
            log.warning("ship_report_failed", error=str(exc))
            return 0
        if seq is None:
            return None
        self.metrics.reports.labels("written" if seq else "refused").inc()
        if seq:
            self.ingest.committed.set()  # the uplink sends it with the next batch
        return seq

    def expire(self) -> dict[str, int]:
        """One age-retention sweep, on the clock with its forward jumps taken out: a
        clock set days ahead must not expire every undelivered record at once."""
        removed = self.log.expire(int(self.clock.retention_now() * 1000))
        if removed:
            log.info("retention_expired", removed=removed)
        self.metrics.clock_skew.set(self.clock.skew)
        return removed

    def update_gauges(self) -> None:
        m = self.metrics
        now_ms = time.time() * 1000
        for name in self.log.stream_names():
            n, nbytes, oldest = self.log.backlog(name)
            m.backlog_records.labels(name).set(n)
            m.backlog_bytes.labels(name).set(nbytes)
            m.oldest_undelivered_age.labels(name).set((now_ms - oldest) / 1000 if oldest else 0)
            m.last_seq.labels(name).set(self.log.stream_state(name).next_seq - 1)
        sizes = self.log.sizes()
        m.log_bytes.set(sizes.records)
        m.disk_bytes.set(sizes.files)
        m.quarantine_size.set(self.log.quarantine.count())


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


async def _end(tasks: list[asyncio.Task[None]], within: float) -> None:
    """Let ``tasks`` end by themselves for ``within`` seconds, then cancel those still
    running and give them :data:`TASK_CANCEL_S` more; a task still running then is left
    behind (logged): a stop never waits without a bound."""
    if within > 0:
        await asyncio.wait(tasks, timeout=within)
    running = [t for t in tasks if not t.done()]
    for t in running:
        t.cancel()
    if running:
        await asyncio.wait(running, timeout=TASK_CANCEL_S)
    for t in tasks:
        if not t.done():
            log.warning("agent_task_abandoned", task=t.get_name(), waited_s=within + TASK_CANCEL_S)
        elif not t.cancelled() and t.exception() is not None:
            log.error("agent_task_failed", task=t.get_name(), error=repr(t.exception()))


class Supervisor:
    """The agent's runs, one after the other: a fleet configuration applied or rolled
    back ends a run and the next is built from the config file and what the ship holds
    (edge_agent/fleet_config.py: a controlled restart in the same process)."""

    def __init__(self, config_path: Path, *, gateways: Sequence[Gateway] | None = None) -> None:
        self.config_path = config_path
        self.gateways = gateways
        self.stop = asyncio.Event()
        #: the agent of the run in progress
        self.agent: Agent | None = None
        self.runs = 0

    async def run(self, *, install_signals: bool = True) -> None:
        from edge_agent.fleet_config import load_effective

        while not self.stop.is_set():
            cfg, fleet = await asyncio.to_thread(load_effective, self.config_path)
            agent = self.agent = Agent(cfg, gateways=self.gateways, fleet=fleet)
            self.runs += 1
            relay = asyncio.create_task(self._relay(agent))
            try:
                await agent.run(install_signals=install_signals)
            finally:
                relay.cancel()
            if not agent.restart:
                return
            log.info("agent_restarting", reason="fleet configuration")

    async def _relay(self, agent: Agent) -> None:
        await self.stop.wait()
        agent.stop.set()
