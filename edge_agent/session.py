"""One uplink session: what one site lacks, sent over one gateway.

A session starts from the site's answer to ``holdings()`` (authoritative: it includes
what replication brought the site) and then learns only from the site's replies, which
never shrink what the site holds. It sends, batch by batch, the highest-priority stream
with something missing first (so an alert overtakes a bulk backlog at the next batch),
reading from the log in seq order, in batches sized for the link, keeping at most
``link.in_flight`` batches in flight, and charging the link's budget and rate limit.
An alert does not wait for a window full of bulk batches to be answered: a batch of
alerts may go beyond ``in_flight``, one at a time, the moment the alert is committed,
and takes none of the window's slots while it waits for its answer
(the site pipelines per (origin, stream): the alerts' own batches still go in seq
order, one stream's position as before).

What a failure costs:
- a broken connection (:class:`LinkError`): the batches in flight, at most
  ``link.in_flight`` and a batch of alerts; the session ends and the next one asks the
  site again, so nothing a reply confirmed is ever resent;
- a 409 (our view of the site was stale): that stream restarts from the site's holdings
  once its batches in flight are answered;
- a 422 ``unknown_dictionary`` (the gateway lacks the dictionary the batch was
  compressed with): that stream goes without a dictionary to that gateway from then on
  (``no_dictionary``, kept by the uplink across sessions), restarting from the site's
  holdings once its batches in flight are answered (counted, logged once);
- a 400 ``bad_version`` (a gateway from before AIS sentences as fields, ``FLAG_AIS``):
  that stream goes to that gateway with the sentences as text from then on
  (``no_ais``, kept the same way; logged once);
- another 4xx: that stream waits for the next session (counted, logged); a 401/403
  ends the session (no request to that gateway can succeed).

``first_available`` tells the site the lowest seq from which the ship can still send
everything the site lacks. It starts at the log's lowest seq and moves up only past
seqs that are no longer on board (removed after another site confirmed them, or
dropped by policy), and only when no earlier batch of the stream is in flight: the
site records the seqs below it as abandoned and would never take them afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from edge_agent.alarms import ALERTS_STREAM
from edge_agent.batching import BatchBuilder, BuildSpec
from edge_agent.budget import LinkBudget
from edge_agent.config import LinkConfig
from edge_agent.errors import GatewayGap, GatewayRejected, LinkError
from edge_agent.gateway import Gateway, SendResult
from edge_agent.log import EdgeLog
from edge_agent.metrics import EdgeMetrics
from shorelink.logs import RateLimitedLog, get_logger
from shorelink.ranges import RangeSet
from shorelink.wire import WireError

__all__ = ["Session"]

log = get_logger(__name__)

#: consecutive 409s on a stream without progress before it waits for the next session
MAX_GAPS = 3


@dataclass
class _Cursor:
    stream: str
    held: RangeSet
    #: next seq to consider (seqs below were sent in this session); None: log start
    pos: int | None = None
    #: first_available of the next batch; None: the log's lowest seq
    floor: int | None = None
    in_flight: int = 0
    rewind: bool = False
    #: bumped on every rewind: a batch built before it is stale
    epoch: int = 0
    gaps: int = 0
    stalled: str = ""


@dataclass
class _Outgoing:
    cursor: _Cursor
    first: int
    last: int
    count: int
    body: bytes
    epoch: int = 0
    task: asyncio.Task[SendResult] | None = None
    #: the alerts' last seq when it was built (None: it is an alerts batch, or the
    #: ship has no alerts stream)
    alerts_last: int | None = None

    @property
    def urgent(self) -> bool:
        """An alerts batch: it overtakes a batch built ahead (``Session._overtaken``)
        and may take one slot beyond ``link.in_flight``."""
        return self.cursor.stream == ALERTS_STREAM


def _ready(out: _Outgoing) -> asyncio.Future[_Outgoing | None]:
    """``out``, built and kept for the next free slot, as a build ahead that is done."""
    done: asyncio.Future[_Outgoing | None] = asyncio.get_running_loop().create_future()
    done.set_result(out)
    return done


class Session:
    def __init__(
        self,
        gateway: Gateway,
        link: LinkConfig,
        budget: LinkBudget,
        edge_log: EdgeLog,
        streams: list[str],
        held: dict[str, RangeSet],
        metrics: EdgeMetrics,
        builder: BatchBuilder,
        *,
        no_dictionary: set[str] | None = None,
        no_ais: set[str] | None = None,
        on_success: Callable[[], None] = lambda: None,
        stopping: Callable[[], bool] = lambda: False,
        hold: Mapping[str, asyncio.Future[Any]] | None = None,
    ) -> None:
        self.gateway = gateway
        self.link = link
        self.budget = budget
        self.log = edge_log
        self.metrics = metrics
        self.builder = builder
        #: streams this gateway refused a dictionary for: sent without one
        self.no_dictionary = set() if no_dictionary is None else no_dictionary
        #: streams this gateway refused AIS sentences as fields for: sent as text
        self.no_ais = set() if no_ais is None else no_ais
        self._on_success = on_success
        self._stopping = stopping
        #: streams that wait for a future (their latest-value snapshot being taken,
        #: edge_agent/latest.py: the copies go first); the others go meanwhile
        self._hold = dict(hold or {})
        self._limited = RateLimitedLog(log)
        self.cursors = [
            _Cursor(s, held[s].copy()) for s in streams if link.carries(s) and s in held
        ]
        for s in streams:
            if link.carries(s) and s not in held:
                self._limited.warning(
                    f"not_taken:{gateway.site}:{s}", "stream_not_taken", site=gateway.site, stream=s
                )

    @property
    def site(self) -> str:
        return self.gateway.site

    async def adopt(self) -> None:
        """Store what the site said it holds (makes those records retention-eligible)."""
        for c in self.cursors:
            # a site holding seqs this log never sent: the log started again (re-flashed,
            # restored, lost its tail); its new records move past them (numbering.py)
            moved = await asyncio.to_thread(self.log.reconcile, self.site, c.stream, c.held)
            if moved:
                self.metrics.renumbered.labels(c.stream).inc(moved)
            await asyncio.to_thread(self.log.set_holdings, self.site, c.stream, c.held)

    # -- the send loop -------------------------------------------------------------------
    async def sync(self) -> int:
        """Send until the site lacks nothing we can send (or today's budget is spent,
        or ``stopping()``); return the batches the site accepted. Raises
        :class:`LinkError` (the link broke) or a link-wide :class:`GatewayRejected`
        (401/403)."""
        window: deque[_Outgoing] = deque()
        accepted = 0
        #: the next batch, built (in a worker thread) while the window waits for answers
        ahead: asyncio.Future[_Outgoing | None] | None = None
        #: set when an alert is committed (by whichever thread commits it)
        alerted = asyncio.Event()
        unlisten = self._listen_for_alerts(alerted)
        try:
            while True:
                alert = alerted.is_set()
                alerted.clear()  # (what _next reads from now on includes the alert)
                while not self._stopping():
                    spare = self._taken(window) < self.link.in_flight
                    if not spare and not (alert and self._urgent_slot_free(window)):
                        break
                    out, ahead = await self._take(ahead), None
                    if out is None:
                        break
                    if not spare and not out.urgent:
                        ahead = _ready(out)  # the extra slot is an alert's only
                        break
                    await self._launch(out)
                    window.append(out)
                if not window:
                    holding = [f for f in self._hold.values() if not f.done()]
                    if not holding or self._stopping():
                        return accepted
                    await asyncio.wait(holding, timeout=1.0)
                    continue
                if ahead is None and not self._stopping():
                    ahead = asyncio.create_task(self._next(), name=f"build:{self.site}")
                if await self._answered(window, alerted):
                    accepted += await self._settle(window.popleft())
        except asyncio.CancelledError:
            for o in window:
                if o.task is not None:
                    o.task.cancel()
            window.clear()
            raise
        finally:
            unlisten()
            if ahead is not None:
                ahead.cancel()
                await asyncio.wait([ahead])  # (does not raise what the build raised)
                if not ahead.cancelled() and ahead.exception() is None:
                    # (retrieved: a build nobody sends is no error either)
                    unsent = ahead.result()
                    if unsent is not None:
                        self._give_back(unsent)
            # the rest of the window: take what the site confirmed, ignore the rest
            while window:
                with contextlib.suppress(Exception):
                    accepted += await self._settle(window.popleft())

    async def _take(self, ahead: asyncio.Future[_Outgoing | None] | None) -> _Outgoing | None:
        """The next batch to launch: the one built ahead, unless its stream was rewound
        since or an alert came since (then it gives its seqs back); else a new one."""
        out = None if ahead is None else await ahead
        if out is not None and out.epoch != out.cursor.epoch:
            out = None  # built before its stream was rewound: stale
        elif out is not None and self._overtaken(out):
            self._give_back(out)  # an alert came while it was built ahead: the alert first
            out = None
        if out is None:
            # (also when the build ahead found nothing: it looked while batches were in
            # flight, and a stream rewound by a 409 waits for those; they may have
            # settled since, a slow link, so look again before giving up)
            out = await self._next()
        return out

    def _listen_for_alerts(self, alerted: asyncio.Event) -> Callable[[], None]:
        """Set ``alerted`` whenever an alert is committed (the log calls from the
        committing thread); returns the function that stops it."""
        if not any(c.stream == ALERTS_STREAM for c in self.cursors):
            return lambda: None
        loop = asyncio.get_running_loop()

        def committed(streams: frozenset[str]) -> None:
            if ALERTS_STREAM in streams:
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                    loop.call_soon_threadsafe(alerted.set)

        return self.log.listen(committed)

    def _held(self, stream: str) -> bool:
        hold = self._hold.get(stream)
        return hold is not None and not hold.done()

    @staticmethod
    def _urgent_slot_free(window: deque[_Outgoing]) -> bool:
        """An alert may go beyond ``link.in_flight``: one batch of alerts at a time."""
        return not any(o.urgent for o in window)

    def _taken(self, window: deque[_Outgoing]) -> int:
        """The slots of ``link.in_flight`` taken: one batch of alerts takes none (the
        site answers in the order batches came, so an alert sent behind a full window
        is answered after it, and would otherwise hold the next bulk batch back)."""
        return len(window) - (0 if self._urgent_slot_free(window) else 1)

    async def _answered(self, window: deque[_Outgoing], alerted: asyncio.Event) -> bool:
        """Wait for the answer to the oldest batch in ``window`` (True), or, while an
        alert could go at once, for an alert to be committed (False): an alert then
        waits for no answer (on a satellite, a round trip plus the batch's transfer)."""
        first = window[0].task
        assert first is not None
        if self._stopping() or not self._urgent_slot_free(window):
            await asyncio.wait([first])
            return True
        waiter = asyncio.ensure_future(alerted.wait())
        try:
            await asyncio.wait([first, waiter], return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        return first.done()

    def _overtaken(self, out: _Outgoing) -> bool:
        """An alert came since ``out`` was built (it would wait one more batch behind
        it). Only alerts overtake a batch built ahead: were every stream of higher
        priority to (positions come all the time), a bulk backlog in port would go as
        a trickle of small batches, each a round trip."""
        last = out.alerts_last
        return last is not None and self.log.stream_state(ALERTS_STREAM).next_seq - 1 > last

    @staticmethod
    def _give_back(out: _Outgoing) -> None:
        """``out`` was built but will not be sent (the session breaks off, say, to
        probe a cheaper link): its stream's position moved past it when it was built,
        so move it back, or the next batch would start beyond what the site holds (a
        409, and a satellite round trip, for nothing)."""
        c = out.cursor
        if out.epoch == c.epoch and c.pos is not None and c.pos > out.first:
            c.pos = out.first

    async def _launch(self, out: _Outgoing) -> None:
        """Charge the budget (before the bytes go out: a crash must not hand out free
        bytes) and start sending ``out``."""
        await self.budget.pace(len(out.body))
        await self.budget.charge(len(out.body))
        # before the bytes go out: a site must never hold a seq this log thinks unsent
        await asyncio.to_thread(self.log.note_sent, out.cursor.stream, out.last)
        self.metrics.uplink_bytes.labels(self.link.name).inc(len(out.body))
        self.metrics.budget_used.labels(self.link.name).set(self.budget.spent)
        out.cursor.in_flight += 1
        out.task = asyncio.create_task(
            self.gateway.send(out.cursor.stream, out.body),
            name=f"send:{self.site}:{out.cursor.stream}:{out.first}",
        )

    async def _settle(self, out: _Outgoing) -> int:
        c = out.cursor
        assert out.task is not None
        try:
            result = await out.task
        except GatewayGap as gap:
            c.in_flight -= 1
            self.metrics.uplink_gaps.labels(self.site, c.stream).inc()
            if not c.rewind:  # count one gap per window, not each batch behind it
                c.gaps += 1
            log.info(
                "batch_gap",
                site=self.site,
                stream=c.stream,
                seqs=f"{out.first}-{out.last}",
                held=gap.held,
            )
            # the site's word, not our union: it holds less than we thought
            c.held = gap.held.copy()
            await asyncio.to_thread(self.log.set_holdings, self.site, c.stream, c.held)
            c.pos, c.floor, c.rewind = None, None, True
            c.epoch += 1
            if c.gaps >= MAX_GAPS:
                c.stalled = "gap"
                self._limited.warning(
                    f"gaps:{self.site}:{c.stream}",
                    "stream_stalled",
                    site=self.site,
                    stream=c.stream,
                    reason="repeated_409",
                    held=c.held,
                )
            return 0
        except GatewayRejected as exc:
            c.in_flight -= 1
            self.metrics.uplink_failed.labels(self.site, c.stream, exc.error_code).inc()
            if exc.error_code == "unknown_dictionary":
                if self._fall_back(c, self.no_dictionary):
                    log.warning(
                        "dictionary_refused",
                        site=self.site,
                        stream=c.stream,
                        fallback="no_dictionary",
                        message=str(exc),
                    )
                    self.metrics.uplink_dictionary_fallbacks.labels(self.site, c.stream).inc()
                return 0
            if exc.error_code == "bad_version" and (
                c.stream not in self.no_ais or out.epoch != c.epoch
            ):
                # AIS as fields is the one coding a gateway refuses so; a batch built as
                # text since (this epoch) refused again stalls like any other 4xx
                if self._fall_back(c, self.no_ais):
                    log.warning(
                        "ais_fields_refused",
                        site=self.site,
                        stream=c.stream,
                        fallback="ais_as_text",
                        message=str(exc),
                    )
                return 0
            self._limited.warning(
                f"rejected:{self.site}:{c.stream}:{exc.status}",
                "batch_rejected",
                site=self.site,
                stream=c.stream,
                seqs=f"{out.first}-{out.last}",
                status=exc.status,
                error=exc.error_code,
                message=str(exc),
            )
            if exc.held is not None:
                await self._learn(c, exc.held)
            c.stalled = exc.error_code
            if exc.link_wide:
                raise
            return 0
        except LinkError:
            c.in_flight -= 1
            self.metrics.uplink_failed.labels(self.site, c.stream, "link").inc()
            raise
        c.in_flight -= 1
        c.gaps = 0
        self.metrics.uplink_batches.labels(self.site, c.stream).inc()
        self.metrics.uplink_records.labels(self.site, c.stream).inc(out.count)
        if not result.held.contains_range(out.first, out.last):
            self._limited.warning(
                f"not_held:{self.site}:{c.stream}",
                "batch_not_held",
                site=self.site,
                stream=c.stream,
                seqs=f"{out.first}-{out.last}",
                held=result.held,
            )
        await self._learn(c, result.held)
        self._on_success()
        log.debug(
            "batch_sent",
            site=self.site,
            stream=c.stream,
            seqs=f"{out.first}-{out.last}",
            bytes=len(out.body),
            held=c.held,
        )
        return 1

    def _fall_back(self, c: _Cursor, refused: set[str]) -> bool:
        """The gateway cannot read how ``c``'s stream was coded (a dictionary it lacks,
        AIS as fields it predates): send that stream without it to that gateway (``c``'s
        stream joins ``refused``), from what the site holds (the refused batch and those
        behind it were not written). True the first time (the caller logs it then)."""
        c.pos, c.floor, c.rewind = None, None, True
        c.epoch += 1
        if c.stream in refused:
            return False
        refused.add(c.stream)
        return True

    async def _learn(self, c: _Cursor, held: RangeSet) -> None:
        """Merge an accepting reply (what a site holds only grows, and replies may be
        settled in another order than the site processed them); persist if it grew."""
        merged = c.held.copy()
        merged.update(held)
        if merged != c.held:
            c.held = merged
            await asyncio.to_thread(self.log.set_holdings, self.site, c.stream, merged)

    # -- choosing and building the next batch ---------------------------------------------
    def _dictionary(self, stream: str) -> int:
        """The id of the dictionary ``stream``'s next batch is compressed with (its
        newest; 0: none, or a gateway that lacks it)."""
        if stream in self.no_dictionary:
            return 0
        d = self.builder.dictionaries.newest(stream)
        return 0 if d is None else d.dict_id

    async def _next(self) -> _Outgoing | None:
        alerts_last = None  # the alerts' last seq, if looked at and nothing to send
        for c in self.cursors:
            if self.budget.spent_out:
                return None
            if c.stalled or (c.rewind and c.in_flight) or self._held(c.stream):
                continue
            c.rewind = False
            epoch = c.epoch
            t0 = time.monotonic()
            last = self.log.stream_state(c.stream).next_seq - 1
            spec = BuildSpec(
                c.stream,
                last,
                c.pos,
                c.floor,
                c.held,
                c.in_flight > 0,
                self.link.batch_max_records,
                self.link.batch_max_bytes,
                self.budget.remaining(),
                self._dictionary(c.stream),
                ais=c.stream not in self.no_ais,
            )
            try:
                built = await self.builder.build(spec)
            except WireError as exc:  # a record the wire format cannot carry
                c.stalled = exc.reason
                self.metrics.uplink_failed.labels(self.site, c.stream, exc.reason).inc()
                self._limited.warning(
                    f"wire:{c.stream}",
                    "batch_unencodable",
                    stream=c.stream,
                    pos=c.pos,
                    error=str(exc),
                )
                continue
            if c.epoch != epoch:  # rewound (a 409) while building: build again later
                continue
            c.pos, c.floor = built.pos, built.floor
            if built.spent:
                self.budget.mark_spent_out()
                log.info(
                    "link_budget_spent",
                    link=self.link.name,
                    day=self.budget.day,
                    spent=self.budget.spent,
                    budget=self.budget.limit,
                )
                return None
            if built.body is not None:
                self.metrics.uplink_build_seconds.observe(time.monotonic() - t0)
                if built.sealed:
                    self.metrics.uplink_sealed_batches.labels(self.site, c.stream).inc()
                out = _Outgoing(c, built.first, built.last, built.count, built.body, epoch)
                out.alerts_last = alerts_last
                return out
            if c.stream == ALERTS_STREAM:
                alerts_last = last
        return None
