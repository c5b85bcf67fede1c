"""The WebSocket upload: a ship's batches pipelined on one connection.

``GET /v1/ships/{ship}/upload`` (bearer token, as every API call) upgrades to a
WebSocket. The gateway's first message is what the site holds of the ship (the body of
``GET .../holdings`` plus ``"type": "holdings"``), so a ship starts sending one round
trip after connecting, without a request of its own. Then the ship sends each encoded batch (``shorelink.wire``, any of its streams)
as one binary message; the gateway answers every batch with one JSON text message, in
the order the batches came: ``{"status": 200, "stream", "first_seq", "last_seq",
"held", "written", ...}`` once Kafka committed it, or ``{"status": 4xx/503, "error",
"message", ...}`` (a 409 carries ``held``) exactly as ``POST .../batches`` would have
answered (docs/gateway-api.md). A gateway following the fleet registry adds to its
first message the ship's configuration offer (``"config"``), and answers a text message
``{"type": "config", ...}`` with one binary message, in its turn among the batches'
answers (shorelink/fleet/shipconfig.py).

Why a WebSocket beside the POST: on a link with a long round trip, one request per
batch leaves the link idle for a round trip per batch, and parallel requests run on
parallel connections, which then all break in the same outage. On one connection the
batches cross the link one after the other while the earlier ones are being written,
so the link stays busy, and an outage cuts only what was still on the wire.

The gateway admits batches in the order they arrive (a batch may build on the ones
before it that are still being written, see ``GatewayService.admit``) and keeps at most
:data:`UPLOAD_WINDOW` of them in progress per connection (then it stops reading: TCP
flow control holds the ship back). A batch received whole is written even if the
connection breaks before its answer leaves: the ship finds it in the holdings. A
connection whose token is revoked is closed within a second (1008), batch or none.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web

from core_gateway.errors import ApiError
from core_gateway.service import GatewayService
from shorelink.fleet.shipconfig import ConfigOffer, offer_json, parse_request
from shorelink.logs import get_logger

__all__ = ["ROUTE", "UPLOADS", "UPLOAD_WINDOW", "close_uploads", "serve_upload"]

log = get_logger(__name__)

ROUTE = "/v1/ships/{ship}/upload"
#: batches in progress (received, not answered yet) per connection
UPLOAD_WINDOW = 16
#: seconds between checks that an open upload's token still holds
CREDENTIALS_CHECK_S = 1.0
#: an app's open upload connections (closed on shutdown)
UPLOADS: web.AppKey[set[web.WebSocketResponse]] = web.AppKey("uploads")


async def serve_upload(
    service: GatewayService,
    request: web.Request,
    ship: str,
    token: str,
) -> web.WebSocketResponse:
    """Serve one upload connection of ``ship`` (already authenticated with ``token``,
    which is checked again for every batch: a revoked token is refused from then on)."""
    cfg = service.cfg
    ws = web.WebSocketResponse(
        max_msg_size=cfg.limits.max_compressed_bytes,
        heartbeat=cfg.upload_heartbeat_s,
        compress=False,
    )
    await ws.prepare(request)
    open_uploads = request.app[UPLOADS]
    open_uploads.add(ws)
    hello: dict[str, Any] = {
        "type": "holdings",
        "ship": ship,
        "site": cfg.site,
        "streams": service.holdings_for(ship),
    }
    offers = _Offers(service, ship)
    hello.update(offers.first())
    await ws.send_json(hello)
    service.metrics.uploads.inc()
    replies: asyncio.Queue[asyncio.Future[Any] | None] = asyncio.Queue(UPLOAD_WINDOW)
    answering = asyncio.create_task(_answer(service, ws, replies, offers), name=f"upload:{ship}")
    watching = asyncio.create_task(_watch(service, ws, ship, token), name=f"revoked:{ship}")
    batches = 0
    log.info("upload_open", ship=ship, peer=request.remote)
    try:
        async for msg in ws:
            if msg.type is WSMsgType.BINARY:
                batches += 1
                await replies.put(await _receive(service, ship, token, msg.data))
            elif msg.type is WSMsgType.TEXT and (answer := _config(service, ship, msg.data)):
                await replies.put(answer)
            elif msg.type is WSMsgType.TEXT:
                await ws.close(
                    code=WSCloseCode.UNSUPPORTED_DATA,
                    message=b"send batches as binary messages",
                )
                break
    finally:
        watching.cancel()
        await replies.put(None)
        await answering
        open_uploads.discard(ws)
        service.metrics.uploads.dec()
        log.info("upload_closed", ship=ship, batches=batches, close_code=ws.close_code)
    return ws


async def _watch(service: GatewayService, ws: web.WebSocketResponse, ship: str, token: str) -> None:
    """Close the connection (1008, policy violation) once its token is revoked or
    given to another ship: checked every :data:`CREDENTIALS_CHECK_S`, batch or none,
    so a revoked ship keeps no upload slot (each batch is also checked on its own)."""
    while not ws.closed:
        await asyncio.sleep(CREDENTIALS_CHECK_S)
        try:
            service.authorize(ship, token)
        except ApiError as exc:
            log.warning("upload_closed_revoked", ship=ship, reason=exc.code)
            await ws.close(code=WSCloseCode.POLICY_VIOLATION, message=b"credential revoked")
            return


class _Offers:
    """The configuration offered on one connection: in the first message, then in the
    answer to a batch whenever it changed since (a registry entry arrived while the
    connection stays open), and never again while it has not: no byte more."""

    def __init__(self, service: GatewayService, ship: str) -> None:
        self.service, self.ship = service, ship
        self.version = service.registry_version
        self.offer: ConfigOffer | None
        try:
            self.offer = service.config_offer_now(ship) or {}
        except RuntimeError:  # no offer this time: the ship hears at its next batch
            self.version, self.offer = None, None

    def first(self) -> dict[str, Any]:
        """The first message's: the offer (possibly empty) and the registry's version
        (nothing from a gateway that follows no registry)."""
        if self.version is None or self.offer is None:
            return {}
        return {"config": offer_json(self.offer), "registry": self.version}

    def changed(self) -> dict[str, Any]:
        """What a batch's answer adds: the offer if it changed, else nothing."""
        version = self.service.registry_version
        if version == self.version:
            return {}
        try:
            offer = self.service.config_offer_now(self.ship) or {}
        except RuntimeError:
            return {}  # moving: the next answer tells
        self.version = version
        if offer == self.offer:
            return {}
        self.offer = offer
        return {"config": offer_json(offer), "registry": version}


def _config(service: GatewayService, ship: str, data: str) -> asyncio.Future[Any] | None:
    """A ship's request for its configuration, answered in turn with the batches (None:
    not a request: the connection is closed as for any text message)."""
    try:
        request = parse_request(data)
    except ValueError:
        return None
    answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    try:
        answer.set_result(service.config_answer(ship, request))
    except ApiError as exc:
        answer.set_exception(exc)
    return answer


async def _receive(
    service: GatewayService, ship: str, token: str, body: bytes
) -> asyncio.Future[dict[str, Any]]:
    """Admit one batch (in arrival order); a refusal becomes an answered future."""
    try:
        service.authorize(ship, token)
        return await service.receive(ship, None, body)
    except ApiError as exc:
        refused: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        refused.set_exception(exc)
        return refused


async def _answer(
    service: GatewayService,
    ws: web.WebSocketResponse,
    replies: asyncio.Queue[asyncio.Future[Any] | None],
    offers: _Offers,
) -> None:
    """Send each batch's answer, in order. Runs to the end of the queue even when the
    connection is gone, so every write is waited for (and its holdings recorded). A
    configuration's answer is bytes, sent as one binary message; a batch's carries the
    configuration offered if it changed since the connection's last offer."""
    while (pending := await replies.get()) is not None:
        try:
            done = await pending
            if isinstance(done, bytes):
                if not ws.closed:
                    with contextlib.suppress(ConnectionError, RuntimeError):
                        await ws.send_bytes(done)
                continue
            reply = {"status": 200, **done, **offers.changed()}
        except ApiError as exc:
            service.refused(exc, ROUTE)
            reply = {"status": exc.status, **exc.body()}
        service.metrics.requests.labels(ROUTE, str(reply["status"])).inc()
        if not ws.closed:
            with contextlib.suppress(ConnectionError, RuntimeError):
                await ws.send_json(reply)


async def close_uploads(app: web.Application) -> None:
    """On shutdown: close every upload connection (1001, going away) so that a stopping
    gateway does not wait for ships to hang up; batches already received are still
    written and answered before the Kafka writer stops."""
    open_uploads = app[UPLOADS]
    for ws in list(open_uploads):
        with contextlib.suppress(Exception):
            await ws.close(code=WSCloseCode.GOING_AWAY, message=b"gateway stopping")
