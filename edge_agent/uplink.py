"""The uplink: send what shore lacks over whichever link is up.

A calm loop (``run``):
1. wake on new committed records (after ``uplink.linger``, to gather a few more), on
   the timer (``uplink.interval``) or on stop;
2. without a session, probe the gateways (``holdings()``, ``uplink.probe_timeout``)
   concurrently and open a :class:`~edge_agent.session.Session` with the cheapest link
   that answered and still has budget today; with one, probe only cheaper gateways on
   the timer and switch if one answers, and ask the current site again every
   ``uplink.refresh``;
3. ``session.sync()``: send until the site lacks nothing (see session.py);
   meanwhile, and while no link is up, the :class:`~edge_agent.sealing.Sealer`
   encodes whole segments of the backlog ahead of time (sealing.py);
4. on a link error: mark the link down, drop the session and its connections
   (explicit reconnect), back off (:mod:`shorelink.retry`: exponential from
   ``uplink.retry_min``, growing by :data:`BACKOFF_GROWTH`, with jitter, capped at
   ``uplink.retry_max``, from the start again after progress) and start again at 2.
   A 401/403 puts that gateway aside for ``retry_max`` and the next attempt tries the
   others.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any

from tenacity import RetryCallState

from edge_agent.batching import BatchBuilder
from edge_agent.budget import LinkBudget
from edge_agent.config import EdgeConfig, LinkConfig
from edge_agent.errors import GatewayRejected, LinkError, UplinkError
from edge_agent.fleet_config import ConfigSource, FleetConfig
from edge_agent.gateway import Gateway, HttpGateway
from edge_agent.latest import Snapshot, Snapshots
from edge_agent.log import EdgeLog
from edge_agent.metrics import EdgeMetrics
from edge_agent.sealing import Sealer
from edge_agent.session import Session
from shorelink.logs import RateLimitedLog, get_logger
from shorelink.ranges import RangeSet
from shorelink.retry import Backoff, retry_fields, retrying

__all__ = ["Uplink"]

log = get_logger(__name__)

#: growth of the retry wait per failed attempt: much gentler than doubling, so the end
#: of a short outage (a port's Wi-Fi dropping for seconds) is noticed within a couple of
#: hundred ms (the wait t seconds into an outage is about 0.15 t), while a long one still
#: reaches retry_max within minutes (0.1 s x 1.15^n: 60 s after ~46 attempts, ~7 min).
#: A failed attempt is a refused or timed-out connect: no budget is spent on it.
BACKOFF_GROWTH = 1.15


#: on stop, how long each gateway's connections may take to close
GATEWAY_CLOSE_S = 3.0
#: on stop, how long a latest-value snapshot being taken may take to end
SNAPSHOT_STOP_S = 10.0


class Uplink:
    def __init__(
        self,
        cfg: EdgeConfig,
        edge_log: EdgeLog,
        metrics: EdgeMetrics,
        new_data: asyncio.Event,
        *,
        gateways: Sequence[Gateway] | None = None,
        clock: Callable[[], float] = time.time,
        fleet: FleetConfig | None = None,
    ) -> None:
        self.cfg = cfg
        #: the fleet configuration: asked for at each session's offer
        self.fleet = fleet
        #: set once a gateway answered (the fleet configuration's health check)
        self.reached = asyncio.Event()
        self.log = edge_log
        self.metrics = metrics
        self.new_data = new_data
        if gateways is None:
            gateways = [
                HttpGateway(g, cfg.links[g.link], cfg.ship, cfg.uplink.token) for g in cfg.gateways
            ]
        # cheapest link first; config order breaks ties
        self.gateways = sorted(gateways, key=lambda g: cfg.links[g.link].cost)
        self.budgets = {
            name: LinkBudget(cfg.links[name], edge_log.links, clock=clock)
            for name in sorted({g.link for g in self.gateways})
        }
        for name, b in self.budgets.items():
            metrics.budget_limit.labels(name).set(b.limit)
            metrics.budget_used.labels(name).set(b.spent)
        self.session: Session | None = None
        self._refresh_at = 0.0
        self._probe_cheaper_at = 0.0
        self._blocked: dict[int, float] = {}
        #: batches accepted so far (resets the retry backoff after progress)
        self._accepted = 0
        self._stop = asyncio.Event()
        self._limited = RateLimitedLog(log)
        self._streams = [s.name for s in cfg.by_priority()] + _unconfigured(cfg, edge_log)
        self.builder = BatchBuilder(
            edge_log,
            workers=cfg.uplink.encode_workers,
            signing_key_file=cfg.uplink.signing_key_file,
            dictionaries_dir=cfg.uplink.dictionaries_dir,
            ais_fields=cfg.uplink.ais_fields,
        )
        #: per gateway (its URL), the streams it refused a dictionary for: sent
        #: without one to it for the rest of this run (edge_agent/session.py)
        self._no_dictionary: dict[str, set[str]] = {}
        #: per gateway, the streams it refused AIS sentences as fields for (a gateway
        #: from before FLAG_AIS): sent as text to it for the rest of this run
        self._no_ais: dict[str, set[str]] = {}
        self.sealer = Sealer(cfg, edge_log, self.builder, metrics)
        #: latest-value snapshots, taken as a link comes up (edge_agent/latest.py)
        self.snapshots = Snapshots(cfg, edge_log, metrics, clock=clock)
        self._snapshots_task: asyncio.Future[list[Snapshot]] | None = None

    # -- the loop ------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        """Send until ``stop`` is set. The batch in flight when it is set is finished
        (or abandoned by the caller's cancel; the site's holdings say what arrived)."""
        self._stop = stop
        log.info("uplink_started", gateways=",".join(f"{g.site}/{g.link}" for g in self.gateways))
        sealing = asyncio.create_task(self.sealer.run(stop), name="sealer")
        try:
            while not stop.is_set():
                try:
                    await self._pass_with_retry()
                except UplinkError as exc:
                    if not stop.is_set():  # not retryable: wait for the timer
                        self._limited.warning("uplink_pass", "uplink_pass_failed", error=str(exc))
                except Exception:  # a bug must not end the uplink: log it, go on calmly
                    log.exception("uplink_pass_crashed")
                    self.session = None
                    await self._sleep(self.cfg.uplink.retry_max_s)
                if stop.is_set():
                    break
                await self._idle()
        finally:
            sealing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sealing
            if self._snapshots_task is not None:  # a thread: let it end before the log does
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(SNAPSHOT_STOP_S):
                        await asyncio.shield(self._snapshots_task)
            self.session = None
            for g in self.gateways:
                # a connection's close waits for the gateway's close frame: over a
                # stalled link, for good without a bound
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(GATEWAY_CLOSE_S):
                        await g.close()
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.log.links.flush, force=True)
            await asyncio.to_thread(self.close)
            log.info("uplink_stopped")

    def close(self) -> None:
        """Stop the batch builder's child process (if one was started)."""
        self.builder.close()

    async def _pass_with_retry(self) -> None:
        u = self.cfg.uplink
        backoff = Backoff(u.retry_min_s, u.retry_max_s, BACKOFF_GROWTH, jitter_s=u.retry_min_s)
        # One pass can last a whole drain across many outages: the backoff starts again
        # once a batch got through since the previous failure, or each 2 s outage would
        # cost a longer and longer wait (up to retry_max).
        async for attempt in retrying(
            backoff,
            retry_on=lambda e: isinstance(e, UplinkError) and e.retryable,
            stop=self._stop,
            on_retry=self._before_sleep,
            progress=lambda: self._accepted,
        ):
            with attempt:
                await self.sync_once()

    def _before_sleep(self, state: RetryCallState) -> None:
        self._limited.warning("uplink_retry", "uplink_retry", **retry_fields(state))

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)

    async def _idle(self) -> None:
        """Until new data (plus linger), the next timer event, or stop."""
        now = time.monotonic()
        due = now + self.cfg.uplink.interval_s
        if self.session is not None:
            due = min(self._refresh_at, self._probe_cheaper_at if self._cheaper() else due)
        timeout = max(0.0, due - now)
        waiters = [
            asyncio.ensure_future(self.new_data.wait()),
            asyncio.ensure_future(self._stop.wait()),
        ]
        try:
            await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()
        if self.new_data.is_set() and not self._stop.is_set():
            await self._sleep(self.cfg.uplink.linger_s)
        self.new_data.clear()

    # -- one pass --------------------------------------------------------------------------
    async def sync_once(self) -> None:
        """Open or refresh the session as due, then send until the site lacks nothing."""
        if self._stop.is_set():
            return
        now = time.monotonic()
        for name, b in self.budgets.items():
            self.metrics.budget_used.labels(name).set(b.spent)
        if self.session is None or now >= self._refresh_at:
            self.session = None
            self.session = await self._connect(self.gateways)
        elif now >= self._probe_cheaper_at and self._cheaper():
            self._probe_cheaper_at = now + self.cfg.uplink.interval_s
            with contextlib.suppress(LinkError):
                self.session = await self._connect(self._cheaper()) or self.session
        session = self.session
        if session is None:
            return  # every reachable link has spent today's budget
        gw = session.gateway
        fleet, source = self.fleet, gw if isinstance(gw, ConfigSource) else None
        try:
            while True:
                if fleet is not None and source is not None:
                    await fleet.offered(source, self.cfg.links[gw.link], session.budget)
                await session.sync()
                # broken off for an offer a batch's answer brought: taken now, then on
                if self._stop.is_set() or not self._offer_waiting():
                    break
        except LinkError as exc:
            self.session = None
            await self._mark(gw, up=False, error=str(exc))
            await gw.reset()
            raise
        except GatewayRejected as exc:
            self.session = None
            if not exc.link_wide:
                raise
            self._block(gw, exc)
            await self._mark(gw, up=False, error=str(exc))
            raise LinkError(f"gateway refused us: {exc}", site=gw.site) from exc
        finally:
            await asyncio.to_thread(self.log.links.flush)
        if session.budget.spent_out:
            self.session = None  # another link may still have budget today

    def _break_off(self) -> bool:
        """The session stops launching batches when the agent stops, when a batch's
        answer brought a configuration offer not looked at yet, or when a cheaper link
        is due a probe: a session kept busy by new records (positions at sea come all
        the time, a backlog drains for minutes) would otherwise take the offer, or let
        the ship see port Wi-Fi come up, only once it ends."""
        if self._stop.is_set():
            return True
        if self._offer_waiting():
            return True
        return time.monotonic() >= self._probe_cheaper_at and bool(self._cheaper())

    def _offer_waiting(self) -> bool:
        """Did the session's gateway offer a configuration not looked at yet?"""
        gw = self.session.gateway if self.session is not None else None
        return self.fleet is not None and isinstance(gw, ConfigSource) and self.fleet.unseen(gw)

    def _cheaper(self) -> list[Gateway]:
        if self.session is None:
            return []
        cost = self.cfg.links[self.session.gateway.link].cost
        return [g for g in self.gateways if self.cfg.links[g.link].cost < cost]

    async def _connect(self, candidates: Sequence[Gateway]) -> Session | None:
        """Probe ``candidates`` at once; a session with the cheapest that answered and
        has budget left today (None if only spent-out links answered)."""
        now = time.monotonic()
        usable = [
            g
            for g in candidates
            if self._blocked.get(id(g), 0.0) <= now and not self.budgets[g.link].spent_out
        ]
        if not usable:
            if any(self._blocked.get(id(g), 0.0) > now for g in candidates):
                raise LinkError("every gateway refused our credentials; retrying later")
            return None
        answers = await asyncio.gather(*(self._probe(g) for g in usable), return_exceptions=True)
        errors = []
        for g, answer in zip(usable, answers, strict=True):
            if isinstance(answer, BaseException):
                if isinstance(answer, asyncio.CancelledError):
                    raise answer
                errors.append(f"{g.site}/{g.link}: {answer}")
                continue
            return await self._open(g, answer)
        raise LinkError("no gateway reachable: " + "; ".join(errors))

    async def _probe(self, g: Gateway) -> dict[str, RangeSet]:
        timeout = self.cfg.uplink.probe_timeout_s
        try:
            try:
                async with asyncio.timeout(timeout):
                    return await g.holdings()
            except TimeoutError:
                raise LinkError(f"no holdings within {timeout:g}s", site=g.site) from None
        except GatewayRejected as exc:
            if exc.link_wide:
                self._block(g, exc)
            await self._mark(g, up=False, error=str(exc))
            raise
        except LinkError as exc:
            await self._mark(g, up=False, error=str(exc))
            await g.reset()
            raise

    async def _open(self, g: Gateway, held: dict[str, RangeSet]) -> Session:
        previous = self.session.gateway if self.session is not None else None
        link = self.cfg.links[g.link]
        session = Session(
            g,
            link,
            self.budgets[g.link],
            self.log,
            self._streams,
            held,
            self.metrics,
            self.builder,
            no_dictionary=self._no_dictionary.setdefault(g.url, set()),
            no_ais=self._no_ais.setdefault(g.url, set()),
            on_success=lambda: self._success(g),
            stopping=self._break_off,
            hold=await self._snapshot(link, frozenset(held)),
        )
        await session.adopt()
        await self._mark(g, up=True)
        now = time.monotonic()
        self._refresh_at = now + self.cfg.uplink.refresh_s
        self._probe_cheaper_at = now + self.cfg.uplink.interval_s
        (log.info if previous is not g else log.debug)(
            "uplink_session",
            site=g.site,
            link=g.link,
            url=g.url,
            streams=",".join(c.stream for c in session.cursors),
        )
        return session

    async def _snapshot(
        self, link: LinkConfig, taken: frozenset[str]
    ) -> dict[str, asyncio.Future[Any]]:
        """Start the latest-value snapshots due now that ``link`` came up (in a
        thread: reading a month's backlog takes seconds); the streams they copy wait
        for them (the copies go first), alerts and the rest go meanwhile."""
        due = await asyncio.to_thread(self.snapshots.due_streams, link, taken)
        if not due:
            return {}
        task = self._snapshots_task
        if task is None or task.done():
            task = asyncio.ensure_future(asyncio.to_thread(self.snapshots.take_due, link, taken))
            task.add_done_callback(_log_crash)
            self._snapshots_task = task
        return {st.name: task for st in due}

    def _block(self, g: Gateway, exc: GatewayRejected) -> None:
        self._blocked[id(g)] = time.monotonic() + self.cfg.uplink.retry_max_s
        log.error(
            "gateway_refused",
            site=g.site,
            link=g.link,
            status=exc.status,
            error=exc.error_code,
            retry_in=f"{self.cfg.uplink.retry_max_s:.0f}s",
        )

    # -- link state (kept in edge_agent/linkstate.py; here: logs and metrics) ---------------
    def _success(self, g: Gateway) -> None:
        self._accepted += 1
        self.log.links.succeeded(g)

    async def _mark(self, g: Gateway, *, up: bool, error: str = "") -> None:
        was_up = self.log.links.mark(g, up=up, error=error)
        if up:
            self.reached.set()
        if not up:
            self._limited.warning(
                f"link_down:{g.site}:{g.link}", "link_down", site=g.site, link=g.link, error=error
            )
        if up and not was_up:
            log.info("link_up", site=g.site, link=g.link)
        self.metrics.link_up.labels(g.site, g.link).set(1 if up else 0)
        await asyncio.to_thread(self.log.links.flush, force=up != was_up or not up)


def _log_crash(task: asyncio.Future[list[Snapshot]]) -> None:
    """A snapshot's failure that is a bug (a log error is logged where it happens)."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("latest_snapshot_crashed", error=repr(exc))


def _unconfigured(cfg: EdgeConfig, edge_log: EdgeLog) -> list[str]:
    """Streams the log holds records of that the config no longer names (removed or
    renamed since they were committed): what no site has confirmed is still sent, after
    every configured stream, over the links that carry every stream (``"*"``); nothing
    that was acknowledged to the broker is left behind. Logged once at start."""
    out = []
    for name in sorted(n for n in edge_log.stream_names() if n not in cfg.streams):
        backlog, nbytes, _ = edge_log.backlog(name)
        log.warning(
            "stream_unconfigured",
            stream=name,
            backlog_records=backlog,
            backlog_bytes=nbytes,
            message="not in the config: its backlog is still sent (last, over links carrying '*')",
        )
        if backlog:
            out.append(name)
    return out
