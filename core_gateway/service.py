"""The gateway's service behind its two transports (the HTTP routes of app.py and the
WebSocket upload of upload.py): credentials, holdings, admission of batches and their
writes to ``sl.ingress.*`` (ingress.py).

Every batch is checked whole before anything is written: credential, origin, stream,
size, checksum, version, decompressed size, seq range. A refused batch raises
:class:`ApiError` (a 4xx with a JSON body ``{"error": code, "message": ...}`` and a
counter); nothing is written. A batch is answered only after Kafka committed it.

Memory is bounded globally: a batch holds ``len(body) + declared decoded size`` plus
:data:`~shorelink.wire.DECODE_RECORD_BYTES` a record (and, signed,
:data:`~shorelink.proof.PROOF_HELD_BYTES` a record), all read from its header, of
``limits.max_inflight_bytes`` from the moment its body is in hand until its write is
done (plus what its records' keys, topics and payloads decode to beyond the decompressed
bytes, once decoded: a templated body); a batch of many empty records is charged for
its records, not its few bytes (review N3). One that does not fit is
answered ``503 busy`` with ``Retry-After`` (the ship retries later), and at most
``limits.max_uploads`` upload connections are open. No one ship holds more than its
share: :data:`SHIP_SHARE` of the budget, ``limits.max_uploads_per_ship`` connections.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from tenacity import RetryCallState

from core_gateway.admission import Refused, plan_admission
from core_gateway.auth import Credentials
from core_gateway.config import GatewayConfig
from core_gateway.decoding import BatchDecoder
from core_gateway.errors import ApiError, KafkaWriteError
from core_gateway.holdings import Holdings, SourceHoldings
from core_gateway.ingress import IngressWriter, Write
from core_gateway.ledger import LedgerFollower
from core_gateway.metrics import GatewayMetrics
from shorelink.errors import ShorelinkError
from shorelink.fleet.follow import RegistryFollower
from shorelink.fleet.log import read_anchor
from shorelink.fleet.shipconfig import (
    ConfigOffer,
    ConfigRequest,
    answer_lines,
    encode_delta,
    offer_for,
)
from shorelink.fleet.state import FleetState
from shorelink.kafka.registry import RegistryFeed
from shorelink.logs import get_logger
from shorelink.proof import PROOF_HELD_BYTES, SignatureError, WatchedShipKeys
from shorelink.ranges import RangeSet
from shorelink.retry import Backoff, retry_fields, retrying
from shorelink.wire import DECODE_RECORD_BYTES, Batch, Header, WireError, peek_header

__all__ = ["RETRY_AFTER_S", "SHIP_SHARE", "GatewayService", "busy"]

log = get_logger(__name__)

#: waits between tries to reach Kafka, at start and when re-creating the producer
KAFKA_BACKOFF = Backoff(first_s=1.0, cap_s=30.0)

#: the most of ``limits.max_inflight_bytes`` one ship holds besides the batch at hand
SHIP_SHARE = 0.5
#: /readyz asks Kafka at most this often (seconds)
READINESS_EVERY_S = 1.0

#: the HTTP status of each reason admission refuses a batch for
_REFUSED_STATUS = {"gap": 409, "too_many_holes": 422}
_WIRE_STATUS = {
    "too_large": 413,
    "decompressed_too_large": 413,
    "too_many_records": 413,
    "record_too_large": 413,
    "bad_seq_range": 422,
    "unknown_dictionary": 422,
}


class GatewayService:
    """Everything behind the HTTP API and the upload: credentials, holdings, admission,
    the ingress writer."""

    def __init__(self, cfg: GatewayConfig) -> None:
        self.cfg = cfg
        self.credentials = Credentials(cfg.credentials_file)
        #: the fleet registry followed at the site (``fleet_pub_file``): the ships'
        #: tokens and keys; None: the files of a site run alone
        self.registry: RegistryFollower | None = None
        self._registry_feed: RegistryFeed | None = None
        self.holdings = Holdings()
        self.metrics = GatewayMetrics()
        self.writer = IngressWriter(cfg, on_commit=self.metrics.committed)
        self.metrics.commit_retries.source = lambda: self.writer.retries
        self.decoder = BatchDecoder(
            cfg.limits, workers=cfg.decode_workers, dictionaries_dir=cfg.dictionaries_dir
        )
        #: the ships' public keys (shorelink/proof.py); None: batches taken unproved
        self.ship_keys: WatchedShipKeys | RegistryFollower | None = (
            None if cfg.ship_keys_file is None else WatchedShipKeys(cfg.ship_keys_file)
        )
        if cfg.fleet_pub_file is not None:
            follower = RegistryFollower(
                read_anchor(cfg.fleet_pub_file), on_change=self._registry_changed
            )
            self.registry = self.ship_keys = follower
            self._registry_feed = RegistryFeed(cfg.kafka, follower)
            self.metrics.registry_version.set_function(lambda: float(follower.version))
            self.metrics.registry_refused.source = lambda: dict(follower.refused)
        if self.ship_keys is not None:
            watched = self.ship_keys
            # a scrape looks at the file too (at most once a second): stale is known
            # without traffic
            self.metrics.ship_keys_stale.set_function(
                lambda: float(watched.current() is not None and watched.stale)
            )
            self.metrics.ship_keys_failures.source = lambda: watched.failures
        self.ledger = LedgerFollower(cfg.kafka, self.holdings)
        self.ready = asyncio.Event()
        #: seqs of each (ship, stream) admitted but not committed yet, one set per write
        self._inflight: dict[tuple[str, str], list[RangeSet]] = {}
        #: why the gateway is not ready (starting, recovering its producer, fenced)
        self.startup_error: str | None = None
        #: bytes of batches taken in and not written yet (limits.max_inflight_bytes)
        self.inflight_bytes = 0
        #: upload connections open or being opened (limits.max_uploads)
        self.upload_slots = 0
        #: the same per ship (limits.max_uploads_per_ship), and each ship's bytes of
        #: the budget (at most SHIP_SHARE of it)
        self.uploads_by_ship: Counter[str] = Counter()
        self.inflight_by_ship: Counter[str] = Counter()
        #: what a batch refused busy after its decode decoded to beyond its decompressed
        #: bytes, by the batch (:func:`_batch_id`): sent again, it is charged that up
        #: front, so it is refused before decoding or decoded once more for good
        self._surplus: OrderedDict[tuple[object, ...], int] = OrderedDict()
        #: the last answer to "is Kafka reachable" (when, whether), and the question
        #: in flight (kafka_reachable)
        self._readiness: tuple[float, bool] | None = None
        self._asking: asyncio.Future[bool] | None = None
        self._recovering: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Create topics, start the transactional producer (its ``init_transactions``
        fences an older gateway of this site), then restore holdings from the cursor,
        and start the ledger follower; then the gateway is ready. The cursor is read
        only after the fence: before it, an older gateway could still commit behind
        the read, and its batches would be taken again."""
        started = False

        def blocking() -> int:
            nonlocal started
            self.writer.ensure_topics()
            if not started:
                self.writer.start()
                started = True
            return self.writer.restore(self.holdings)

        def retryable(exc: BaseException) -> bool:
            # Kafka not up yet: keep trying, stay unready; refused credentials: waiting
            # does not help
            return not (isinstance(exc, ShorelinkError) and not exc.retryable)

        def waiting(state: RetryCallState) -> None:
            fields = retry_fields(state)
            self.startup_error = str(fields["error"])
            log.warning("gateway_start_retry", **fields)

        try:
            async for attempt in retrying(KAFKA_BACKOFF, retry_on=retryable, on_retry=waiting):
                with attempt:
                    n = await asyncio.to_thread(blocking)
        except ShorelinkError as exc:
            log.error("gateway_start_failed", error=str(exc))
            raise
        self.startup_error = None
        self.ledger.start()
        if self._registry_feed is not None:
            self._registry_feed.start()
        self.ready.set()
        self.metrics.ready.set(1)
        log.info("gateway_ready", site=self.cfg.site, cursors=n, kafka=self.cfg.kafka.bootstrap)

    async def stop(self) -> None:
        if self._recovering is not None:
            self._recovering.cancel()
        self.ledger.stop()
        if self._registry_feed is not None:
            self._registry_feed.stop()
        await asyncio.to_thread(self.writer.close)
        await asyncio.to_thread(self.decoder.close)

    def _registry_changed(self, state: FleetState) -> None:
        """The registry moved (on its follower's thread): the ships' tokens swapped in
        whole; the keys the follower gives (``ship_keys``) moved with it."""
        self.credentials.take_registry(state)
        log.info("registry_enforced", site=self.cfg.site, version=state.version)

    # -- the ships' configuration (shorelink/fleet/shipconfig.py) -------------------------
    def config_offer(self, ship: str) -> ConfigOffer | None:
        """What the registry says ``ship``'s configuration is (None: no registry
        followed here, or nothing for it)."""
        try:
            return self.config_offer_now(ship)
        except RuntimeError:
            return None

    def config_offer_now(self, ship: str) -> ConfigOffer | None:
        """:meth:`config_offer`, or RuntimeError if the registry moved under it (the
        follower's thread applies entries meanwhile): asked again, never taken as no
        configuration."""
        if self.registry is None:
            return None
        for _ in range(3):
            try:
                return offer_for(self.registry.state, ship)
            except (KeyError, RuntimeError):
                continue
        raise RuntimeError("the registry moved while the offer was read")

    @property
    def registry_version(self) -> int | None:
        """The registry's version this gateway enforces (None: it follows none)."""
        return self.registry.version if self.registry is not None else None

    def config_answer(self, ship: str, request: ConfigRequest) -> bytes:
        """The entries ``request`` asks for, as a delta from the versions the ship holds
        (:func:`answer_lines`, :func:`encode_delta`); 404 if a scope is not the ship's
        (nor one whose end is kept here)."""
        offer = self.config_offer(ship) or {}
        state = self.registry.state if self.registry is not None else None
        try:
            if state is None:
                raise ValueError("no registry followed here")
            new, bases = answer_lines(state, offer, request, ship)
        except ValueError as exc:
            raise ApiError(404, "no_config", f"{ship}: {exc}") from None
        except (KeyError, RuntimeError):  # the follower's thread moved it under us
            raise ApiError(503, "registry_moving", "the registry moved: ask again") from None
        answer = encode_delta(new, bases)
        self.metrics.config_bytes.inc(len(answer))
        log.info("config_served", ship=ship, scopes=",".join(request.have), bytes=len(answer))
        return answer

    # -- the two operations ----------------------------------------------------------------
    def holdings_for(self, ship: str) -> dict[str, str]:
        return {s: str(r) for s, r in self.holdings.for_ship(ship, self.cfg.streams).items()}

    def admit(
        self, ship: str, batch: Batch, proofs: Sequence[bytes] | None = None
    ) -> asyncio.Future[dict[str, Any]]:
        """Check ``batch`` against what the site holds plus what is being written, and
        reserve its seqs; return what completes its write (await it for the reply).
        What the batch adds is decided by :func:`~core_gateway.admission.plan_admission`.

        Synchronous up to the returned awaitable, so batches admitted one after another
        build on each other (pipelining: batch N+1 of a stream is admitted while batch
        N is still being written, and both may share a transaction). Raises ApiError
        409 when the batch does not start where the site's holdings (and the batches
        in flight) end, 422 when it would abandon seqs past the bound on holes.
        ``proofs``: each record's ``sl.proof`` (its ship signs), written with it."""
        stream = batch.stream
        h = self.holdings.get(ship, stream)
        inflight = self._inflight.setdefault((ship, stream), [])
        pending = RangeSet()
        for seqs in inflight:
            pending.update(seqs)
        plan = plan_admission(ship, batch, h, pending)
        if isinstance(plan, Refused):
            if plan.reason == "gap":  # counted here: refused() does not count routine 409s
                self.metrics.rejected.labels("gap").inc()
            status = _REFUSED_STATUS[plan.reason]
            raise ApiError(status, plan.reason, plan.message, held=str(plan.held))
        new, written, abandoned = plan.new, plan.written, plan.abandoned
        self.metrics.skipped.labels(stream).inc(batch.count - len(new))
        if plan.nothing:
            self.metrics.batches.labels(stream).inc()
            answered: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
            answered.set_result(self._reply(ship, batch, h, written))
            return answered
        write = Write(ship, stream, new, written, abandoned, depends=pending)
        if proofs is not None:
            write.proofs, write.proof_base = proofs, batch.first_seq
        seqs = write.seqs
        inflight.append(seqs)
        done = asyncio.wrap_future(self.writer.submit(write))

        settled = False

        def settle(f: asyncio.Future[None]) -> None:
            # runs even if the request that waits for it went away: what Kafka
            # committed is always added to the holdings (or a resend would double it).
            # Also called by _finish before it replies: a write that completed before
            # _finish first ran is awaited without yielding, ahead of this callback
            nonlocal settled
            if settled:
                return
            settled = True
            inflight.remove(seqs)
            if f.cancelled() or f.exception() is not None:
                return
            h.written.update(written)
            self.metrics.batches.labels(stream).inc()
            self.metrics.records.labels(stream).inc(len(new))
            if abandoned:
                h.abandoned.update(abandoned)
                self.metrics.abandoned.labels(stream).inc(abandoned.count())
                log.warning("seqs_abandoned", ship=ship, stream=stream, seqs=abandoned)

        done.add_done_callback(settle)
        return asyncio.ensure_future(self._finish(ship, batch, h, written, done, settle))

    async def _finish(
        self,
        ship: str,
        batch: Batch,
        h: SourceHoldings,
        written: RangeSet,
        done: asyncio.Future[None],
        settle: Callable[[asyncio.Future[None]], None],
    ) -> dict[str, Any]:
        try:
            await asyncio.shield(done)
        except KafkaWriteError as exc:
            settle(done)
            self.metrics.kafka_errors.inc()
            if exc.fenced:
                self._unready(str(exc))
            elif exc.fatal:
                self._recover()
            raise ApiError(503, "kafka_unavailable", str(exc)) from exc
        settle(done)  # the reply says what the site holds with this batch in it
        return self._reply(ship, batch, h, written)

    def _unready(self, why: str) -> None:
        self.startup_error = why
        self.ready.clear()
        self.metrics.ready.set(0)

    def _recover(self) -> None:
        """The producer is unusable (not fenced): stop accepting, re-create it
        (``init_transactions`` settles the transaction it left) and re-read the cursor
        (a commit whose outcome was unknown may have happened), then accept again."""
        if self._recovering is not None and not self._recovering.done():
            return
        self._unready(f"recovering the Kafka producer: {self.writer.broken}")
        self._recovering = asyncio.create_task(self._recovery(), name="kafka-recovery")

    async def _recovery(self) -> None:
        def blocking() -> None:
            self.writer.reinit()
            self.writer.restore(self.holdings)
            self.writer.resume()

        def waiting(state: RetryCallState) -> None:
            log.warning("kafka_recovery_retry", **retry_fields(state))

        if self.writer.fatal:
            self._unready(self.writer.fatal)
            return
        try:
            async for attempt in retrying(
                KAFKA_BACKOFF, retry_on=lambda _e: not self.writer.fatal, on_retry=waiting
            ):
                with attempt:
                    await asyncio.to_thread(blocking)
        except Exception:
            self._unready(self.writer.fatal or "the Kafka producer could not be recovered")
            return
        self.startup_error = None
        self.ready.set()
        self.metrics.ready.set(1)
        log.info("kafka_recovered", site=self.cfg.site)

    def _reply(
        self, ship: str, batch: Batch, h: SourceHoldings, written: RangeSet
    ) -> dict[str, Any]:
        return {
            "ship": ship,
            "site": self.cfg.site,
            "stream": batch.stream,
            "first_seq": batch.first_seq,
            "last_seq": batch.last_seq,
            "held": str(h.held()),
            "written": str(written),
        }

    async def receive(
        self, ship: str, stream: str | None, body: bytes, *, held: int = 0
    ) -> asyncio.Future[dict[str, Any]]:
        """One encoded batch from ``ship``: checked, decoded and admitted (see
        :meth:`admit`); returns the future of its reply. ``stream`` is the one the URL
        names (None: the batch's own); ``held`` of the budget in progress is the
        caller's for this same batch (its body while it was read). Raises ApiError when
        the batch is refused."""
        cfg = self.cfg
        self.metrics.bytes_in.inc(len(body))
        self.check_ready()
        try:
            header = peek_header(body, cfg.limits)
            if header.origin != ship:
                raise ApiError(
                    403,
                    "wrong_origin",
                    f"ship {ship!r} may write only its own origin, not {header.origin!r}",
                )
            if stream is not None and header.stream != stream:
                raise ApiError(
                    400,
                    "stream_mismatch",
                    f"batch is for stream {header.stream!r}, URL says {stream!r}",
                )
            self.check_stream(header.stream)
        except WireError as exc:
            raise _refusal(exc) from None
        keys = None if self.ship_keys is None else self.ship_keys.current()
        # charged from the header, before decoding: the bytes, and what every record
        # costs however small its body makes it (its objects, decoded and held until
        # written) and, signed, its proof
        per_record = DECODE_RECORD_BYTES + (PROOF_HELD_BYTES if keys and header.signatures else 0)
        known = self._surplus.get(_batch_id(header), 0)
        cost = len(body) + header.raw_len + per_record * header.count + known
        self.reserve(ship, cost, held=held)
        try:
            try:
                batch, proved = await self.decoder.decode_proved(
                    body, keys, urgent=header.stream in cfg.urgent_streams
                )
            except WireError as exc:
                raise _refusal(exc) from None
            except SignatureError as exc:
                log.warning("batch_unproved", ship=ship, reason=exc.reason, error=str(exc))
                raise ApiError(403, exc.reason, str(exc)) from None
            # templated payloads decode to more than their decompressed bytes: the
            # batch holds what it decoded to from now on, or is answered busy
            more = batch.decoded_size - header.raw_len - known
            if more > 0:
                try:
                    self.reserve(ship, more, held=held + cost)
                except ApiError:
                    self.metrics.decoded_busy.inc()
                    self._remember_surplus(header, known + more)
                    raise
                cost += more
            self._surplus.pop(_batch_id(header), None)
            answer = self.admit(ship, batch, proved)
        except BaseException:
            self.release(ship, cost)
            raise
        answer.add_done_callback(lambda _f: self.release(ship, cost))
        return answer

    def authorize(self, ship: str, token: str) -> None:
        """401 unless ``token`` is a current credential, 403 unless it is ``ship``'s."""
        self.credentials.maybe_reload()
        owner = self.credentials.ship_for_token(token)
        if owner is None:
            raise ApiError(401, "unauthorized", "unknown or revoked token")
        if owner != ship:
            # the answer names no ship: a stolen token does not say whose it is
            raise ApiError(403, "forbidden", f"this token is not ship {ship!r}'s")

    async def kafka_reachable(self) -> bool:
        """Is Kafka reachable, for ``/readyz``: asked of Kafka at most once every
        :data:`READINESS_EVERY_S` however many probes come (one question in flight at
        a time, its answer shared), so an unauthenticated flood of probes loads neither
        the brokers nor the thread pool."""
        if (
            self._readiness is not None
            and time.monotonic() - self._readiness[0] < READINESS_EVERY_S
        ):
            return self._readiness[1]
        if self._asking is None or self._asking.done():
            self.metrics.readiness_checks.inc()
            self._asking = asyncio.ensure_future(asyncio.to_thread(self.writer.ping))
        ok = await asyncio.shield(self._asking)
        self._readiness = (time.monotonic(), ok)
        return ok

    def check_ready(self) -> None:
        """503 not_ready while starting, recovering the producer or fenced."""
        if not self.ready.is_set():
            raise ApiError(
                503, "not_ready", f"gateway not ready: {self.startup_error or 'starting'}"
            )

    def has_room(self, nbytes: int) -> bool:
        """Would ``nbytes`` more fit in ``limits.max_inflight_bytes``? (Always when
        nothing is in progress, so a batch larger than the budget still goes.)"""
        return self.inflight_bytes == 0 or (
            self.inflight_bytes + nbytes <= self.cfg.max_inflight_bytes
        )

    def reserve(self, ship: str, nbytes: int, *, held: int = 0) -> None:
        """Take ``nbytes`` of the memory budget for ``ship``, or raise 503 busy (retry
        later); ``held`` of what is in progress is the same batch's (alone, a batch
        always fits). A ship holds at most :data:`SHIP_SHARE` of the budget besides the
        batch at hand, so no one ship, however many batches it sends at once, keeps
        the others out."""
        alone = self.inflight_bytes == held
        if not alone and not self.has_room(nbytes):
            raise busy(
                f"gateway busy: {self.inflight_bytes} bytes of batches in progress "
                f"(limits.max_inflight_bytes {self.cfg.max_inflight_bytes}); retry later"
            )
        mine = self.inflight_by_ship[ship]
        if mine > held and mine + nbytes > self.cfg.max_inflight_bytes * SHIP_SHARE:
            raise busy(
                f"gateway busy: ship {ship} holds {mine} bytes of batches in progress, its "
                f"share ({SHIP_SHARE:.0%} of limits.max_inflight_bytes); retry later"
            )
        self.inflight_bytes += nbytes
        self.inflight_by_ship[ship] += nbytes
        self.metrics.inflight_bytes.set(self.inflight_bytes)

    def _remember_surplus(self, header: Header, surplus: int) -> None:
        """A batch decoded for nothing (refused busy for what it decoded to): decoded
        again each time it came back, a port call's batches of tens of thousands of
        records kept the decode workers busy refusing each other while the budget stayed
        full (bench/fleet.py, 700 ships, a tenth of them docking: nothing written for
        minutes). Kept for :data:`SURPLUS_KEPT` batches, the oldest forgotten first."""
        self._surplus[_batch_id(header)] = surplus
        self._surplus.move_to_end(_batch_id(header))
        while len(self._surplus) > SURPLUS_KEPT:
            self._surplus.popitem(last=False)

    def release(self, ship: str, nbytes: int) -> None:
        self.inflight_bytes -= nbytes
        self.inflight_by_ship[ship] -= nbytes
        if not self.inflight_by_ship[ship]:
            del self.inflight_by_ship[ship]
        self.metrics.inflight_bytes.set(self.inflight_bytes)

    def open_upload(self, ship: str) -> None:
        """Take an upload connection for ``ship``, or raise 503 busy: at most
        ``limits.max_uploads`` in all and ``limits.max_uploads_per_ship`` a ship."""
        if self.upload_slots >= self.cfg.max_uploads:
            raise busy(
                f"gateway busy: {self.upload_slots} upload connections open "
                f"(limits.max_uploads); retry later"
            )
        if self.uploads_by_ship[ship] >= self.cfg.max_uploads_per_ship:
            raise busy(
                f"gateway busy: ship {ship} has {self.uploads_by_ship[ship]} upload "
                f"connections open (limits.max_uploads_per_ship); retry later"
            )
        self.upload_slots += 1
        self.uploads_by_ship[ship] += 1

    def close_upload(self, ship: str) -> None:
        self.upload_slots -= 1
        self.uploads_by_ship[ship] -= 1
        if not self.uploads_by_ship[ship]:
            del self.uploads_by_ship[ship]

    def refused(self, exc: ApiError, route: str) -> None:
        """Count and log a refused request or batch (409s are routine: not logged;
        busy ones are counted, not logged)."""
        if exc.status == 409:
            return
        self.metrics.rejected.labels(exc.code).inc()
        if exc.code == "busy":
            return
        log.info(
            "request_refused", route=route, status=exc.status, error=exc.code, message=str(exc)
        )

    def check_stream(self, stream: str) -> None:
        if stream not in self.cfg.streams:
            raise ApiError(
                404,
                "unknown_stream",
                f"this site takes no stream {stream!r} (it takes {', '.join(self.cfg.streams)})",
            )


def _refusal(exc: WireError) -> ApiError:
    """A batch the wire format refuses, as the client sees it (413, 422 or 400)."""
    return ApiError(_WIRE_STATUS.get(exc.reason, 400), exc.reason, str(exc))


#: batches whose decoded surplus the gateway remembers (a few dozen bytes each)
SURPLUS_KEPT = 4096


def _batch_id(header: Header) -> tuple[object, ...]:
    """The same batch sent again: its ship, stream, seqs, lengths and CRC."""
    return (
        header.origin,
        header.stream,
        header.first_seq,
        header.count,
        header.raw_len,
        header.compressed_len,
        header.crc32,
    )


#: seconds a busy gateway asks a client to wait (``Retry-After``)
RETRY_AFTER_S = 1


def busy(message: str) -> ApiError:
    return ApiError(503, "busy", message, retry_after=RETRY_AFTER_S)
