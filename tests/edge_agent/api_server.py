"""A tiny gateway API server (docs/gateway-api.md) for tests of the HTTP client side:
aiohttp.web on loopback, checking the bearer token, with the in-memory gateway's rules
behind it. Not core_gateway: no Kafka, so edge tests stay fast and self-contained."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import WSMsgType, web

from edge_agent.errors import GatewayGap, GatewayRejected
from shorelink.wire import CONTENT_TYPE, peek_header
from tests.edge_agent.memory_gateway import MemoryGateway

TOKEN = "tok-bigblue"


def api_app(site: MemoryGateway, override: dict[str, Any] | None = None) -> web.Application:
    """The gateway API (docs/gateway-api.md) in front of ``site``'s rules; ``override``
    answers a path with a fixed (status, body) or a coroutine instead."""
    override = {} if override is None else override

    @web.middleware
    async def auth(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.path in override:
            o = override[request.path]
            if callable(o):
                return await o(request)
            status, payload = o
            if isinstance(payload, str):
                return web.Response(status=status, text=payload, content_type="text/html")
            return web.json_response(payload, status=status)
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return web.json_response({"error": "unauthorized", "message": "no"}, status=401)
        if request.match_info.get("ship") != "bigblue":
            return web.json_response({"error": "forbidden", "message": "other"}, status=403)
        return await handler(request)

    async def holdings(request: web.Request) -> web.Response:
        held = await site.holdings()
        return web.json_response(
            {"ship": "bigblue", "site": site.site, "streams": {s: str(r) for s, r in held.items()}}
        )

    async def answer(stream: str | None, body: bytes) -> tuple[int, dict[str, Any]]:
        if stream is None:  # an upload message: the batch names its stream
            stream = peek_header(body).stream
        try:
            res = await site.send(stream, body)
        except GatewayGap as gap:
            return 409, {"error": "gap", "message": str(gap), "held": str(gap.held)}
        except GatewayRejected as exc:
            return exc.status, {"error": exc.error_code, "message": str(exc)}
        return 200, {
            "ship": "bigblue",
            "site": site.site,
            "stream": stream,
            "held": str(res.held),
            "written": str(res.written),
        }

    async def batches(request: web.Request) -> web.Response:
        if request.headers.get("Content-Type") != CONTENT_TYPE:
            return web.json_response({"error": "bad_type", "message": "?"}, status=415)
        status, payload = await answer(request.match_info["stream"], await request.read())
        return web.json_response(payload, status=status)

    async def upload(request: web.Request) -> web.WebSocketResponse:
        """Batches as binary messages, one JSON answer each, in order; ``override``
        key ``"answer"`` replaces every answer: (status, dict) or raw text."""
        ws = web.WebSocketResponse(max_msg_size=override.get("max_msg_size", 4 * 1024 * 1024))
        await ws.prepare(request)
        held = await site.holdings()
        await ws.send_json(
            {
                "type": "holdings",
                "ship": "bigblue",
                "site": site.site,
                "streams": {s: str(r) for s, r in held.items()},
            }
        )
        async for msg in ws:
            if msg.type is not WSMsgType.BINARY:
                break
            fixed = override.get("answer")
            if fixed is not None:
                if callable(fixed):
                    fixed = await fixed()
                status, payload = fixed
                if isinstance(payload, str):
                    await ws.send_str(payload)
                else:
                    await ws.send_json({"status": status, **payload})
                continue
            status, payload = await answer(None, msg.data)
            await ws.send_json({"status": status, **payload})
        return ws

    app = web.Application(middlewares=[auth])
    app.router.add_get("/v1/ships/{ship}/holdings", holdings)
    app.router.add_post("/v1/ships/{ship}/streams/{stream}/batches", batches)
    app.router.add_get("/v1/ships/{ship}/upload", upload)
    return app
