"""The gateway's HTTP API (docs/gateway-api.md): the routes, their authentication and
the JSON error bodies. What a request does is the service's (service.py); the WebSocket
upload is upload.py's.

Two applications: the ships' (:func:`create_app`, on ``[listen]``, reached from outside)
and the operators' (:func:`create_metrics_app`, on ``[metrics]``: Prometheus and the
probes, plain HTTP, loopback by default). The ships' port answers ``/metrics`` only with
``metrics.on_ships_port``: unauthenticated figures about every ship's traffic are not for
whoever can reach the port ships upload to.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from core_gateway import upload
from core_gateway.errors import ApiError
from core_gateway.service import GatewayService
from shorelink.boundary import boundary
from shorelink.tls import common_name

__all__ = ["create_app", "create_metrics_app"]

SERVICE = web.AppKey("service", GatewayService)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def create_app(service: GatewayService) -> web.Application:
    cfg = service.cfg
    app = web.Application(
        client_max_size=cfg.limits.max_compressed_bytes + 64 * 1024,
        middlewares=[_error_middleware(service)],
    )
    app[SERVICE] = service
    app[upload.UPLOADS] = set()
    app.on_shutdown.append(upload.close_uploads)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    app.router.add_get("/metrics", _metrics if cfg.metrics_on_ships_port else _metrics_moved)
    if cfg.metrics_on_ships_port:
        app.router.add_get("/registry", _registry)
    app.router.add_get("/v1/ships/{ship}/holdings", _holdings)
    app.router.add_post("/v1/ships/{ship}/streams/{stream}/batches", _batch)
    app.router.add_get(upload.ROUTE, _upload)
    return app


def create_metrics_app(service: GatewayService) -> web.Application:
    """``/metrics``, ``/healthz`` and ``/readyz`` for Prometheus and a platform's probes
    (``[metrics]``): no ship route, no body taken."""
    app = web.Application(client_max_size=1024)
    app[SERVICE] = service
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/registry", _registry)
    return app


def _json_error(status: int, code: str, message: str, **extra: object) -> web.Response:
    return web.json_response({"error": code, "message": message, **extra}, status=status)


def _error_middleware(service: GatewayService) -> Any:
    @web.middleware
    async def mw(request: web.Request, handler: Handler) -> web.StreamResponse:
        route = (
            request.match_info.route.resource.canonical
            if request.match_info.route.resource
            else "unmatched"
        )
        try:
            resp = await handler(request)
        except ApiError as exc:
            service.refused(exc, route)
            resp = web.json_response(exc.body(), status=exc.status)
            if "retry_after" in exc.extra:
                resp.headers["Retry-After"] = str(exc.extra["retry_after"])
        except web.HTTPRequestEntityTooLarge as exc:
            service.metrics.rejected.labels("too_large").inc()
            resp = _json_error(413, "too_large", str(exc.text))
        except web.HTTPException as exc:
            resp = _json_error(
                exc.status, exc.reason.lower().replace(" ", "_"), exc.text or exc.reason
            )
        service.metrics.requests.labels(route, str(resp.status)).inc()
        return resp

    return mw


async def _healthz(request: web.Request) -> web.Response:
    service: GatewayService = request.app[SERVICE]
    body: dict[str, object] = {"status": "ok"}
    if (reg := service.registry) is not None:  # what it enforces (fleet_pub_file)
        body["registry"] = {"version": reg.version, "refused": sum(reg.refused.values())}
    return web.json_response(body)


async def _registry(request: web.Request) -> web.Response:
    """The fleet registry this gateway follows: the version it enforces, the entries
    refused per reason and the newest refused (version, reason, why, when), as an
    operator reads them (operator's listener only: the ships' port serves it only where
    it serves /metrics). 404 without ``fleet_pub_file``."""
    service: GatewayService = request.app[SERVICE]
    reg = service.registry
    if reg is None:
        return _json_error(404, "no_registry", "this gateway follows no fleet registry")
    return web.json_response(
        {"version": reg.version, "refused": dict(reg.refused), "quarantine": reg.quarantined()}
    )


async def _readyz(request: web.Request) -> web.Response:
    service: GatewayService = request.app[SERVICE]
    ok = service.ready.is_set() and await service.kafka_reachable()
    body = {"ready": ok, "site": service.cfg.site}
    if service.startup_error:
        body["error"] = service.startup_error
    return web.json_response(body, status=200 if ok else 503)


async def _metrics(request: web.Request) -> web.Response:
    service: GatewayService = request.app[SERVICE]
    return web.Response(
        body=generate_latest(service.metrics.registry),
        headers={"Content-Type": CONTENT_TYPE_LATEST},
    )


async def _metrics_moved(_request: web.Request) -> web.Response:
    """A scraper still pointed at the ships' port learns where the figures went."""
    return _json_error(
        404,
        "not_found",
        "metrics are served on the gateway's metrics listener ([metrics] host and port), "
        'not on the ships\' port (docs/gateway-api.md, "Metrics and probes")',
    )


@boundary
def bearer_token(request: web.Request) -> str:
    """The request's bearer token; 401 without one. A token is printable ASCII (what
    ``ships add`` makes): a header byte that is not UTF-8 reaches here as a lone
    surrogate, which no token holds and which hashing it would raise on (a 500)."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise ApiError(401, "unauthorized", "missing bearer token")
    if not (token.isascii() and token.isprintable()):
        raise ApiError(401, "unauthorized", "unknown or revoked token")
    return token


def client_cert_name(request: web.Request) -> str | None:
    """The common name of the client certificate the peer presented on this TLS
    connection (verified against ``listen.client_ca_file`` in the handshake), or None."""
    transport = request.transport
    if transport is None:
        return None
    return common_name(transport.get_extra_info("peercert"))


def check_client_cert(service: GatewayService, request: web.Request, ship: str) -> None:
    """A client certificate, when presented, must name the ship (403 otherwise: the
    certificate of one ship never vouches for another); a ship whose credential says
    ``require_client_cert`` must present one (401 without)."""
    name = client_cert_name(request)
    if name is not None and name != ship:
        raise ApiError(
            403,
            "client_cert_mismatch",
            f"the client certificate names {name!r}, not ship {ship!r}",
        )
    if name is None and service.credentials.requires_client_cert(ship):
        why = (
            "present the client certificate issued for it"
            if service.cfg.client_ca_file is not None
            else "this gateway asks for none (listen.client_ca_file is not set)"
        )
        raise ApiError(
            401, "client_cert_required", f"ship {ship!r} needs a client certificate: {why}"
        )


def _authenticate(request: web.Request) -> tuple[str, str]:
    """The ship the URL names and its bearer token, once the token is its own, the
    client certificate (if any, or if the ship needs one) names it, and the gateway is
    ready (what every ``/v1/ships/{ship}/...`` route checks first)."""
    service: GatewayService = request.app[SERVICE]
    ship = request.match_info["ship"]
    token = bearer_token(request)
    service.authorize(ship, token)
    check_client_cert(service, request, ship)
    service.check_ready()
    return ship, token


@boundary
async def _holdings(request: web.Request) -> web.Response:
    service: GatewayService = request.app[SERVICE]
    ship, _token = _authenticate(request)
    return web.json_response(
        {"ship": ship, "site": service.cfg.site, "streams": service.holdings_for(ship)}
    )


@boundary
async def _batch(request: web.Request) -> web.Response:
    service: GatewayService = request.app[SERVICE]
    cfg = service.cfg
    ship, _token = _authenticate(request)
    stream = request.match_info["stream"]
    service.check_stream(stream)
    if (
        request.content_length is not None
        and request.content_length > cfg.limits.max_compressed_bytes
    ):
        raise ApiError(
            413,
            "too_large",
            f"batch of {request.content_length} bytes > {cfg.limits.max_compressed_bytes}",
        )
    # the body is charged to the budget before it is read (the most it may be, when
    # chunked), and its charge held until the batch's own is taken
    reading = request.content_length or cfg.limits.max_compressed_bytes
    service.reserve(ship, reading)
    try:
        try:
            async with asyncio.timeout(cfg.body_timeout_s):
                body = await request.read()
        except TimeoutError:
            raise ApiError(
                408, "body_timeout", f"request body not received within {cfg.body_timeout_s:.0f}s"
            ) from None
        answer = await service.receive(ship, stream, body, held=reading)
    finally:
        service.release(ship, reading)
    return web.json_response(await answer)


@boundary
async def _upload(request: web.Request) -> web.StreamResponse:
    service: GatewayService = request.app[SERVICE]
    ship, token = _authenticate(request)
    service.open_upload(ship)
    try:
        return await upload.serve_upload(service, request, ship, token)
    finally:
        service.close_upload(ship)
