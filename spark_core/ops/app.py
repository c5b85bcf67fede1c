"""The operations page: an aiohttp application on one port (docs/operations.md).

- ``/``: the page (static HTML, CSS and JavaScript of this package: no build step, no
  resource from the internet); it follows ``/api/events`` and draws the map from
  ``/api/map`` and ``/api/coastlines``;
- ``/api/site``, ``/api/ships``, ``/api/alerts``, ``/api/fleet``, ``/api/map``, ``/api/coastlines``,
  ``/api/snapshot`` (site, ships and alerts in one): the facts as JSON;
- ``/api/events``: server-sent events, one ``snapshot`` event whenever the facts
  change (at most every ``ops.refresh``) and a comment every 15 s to keep proxies open;
- ``/healthz``: the process answers (no credentials needed).

Read-only: every route is a GET. Who may look: the logins of ``ops.users_file``, the
page's own (spark_core/ops/users.py: scrypt hashes, never Kafka passwords; HTTP Basic).
Without a users file the page is open, says so in its log at start, and ``shorelink
ops`` allows that on a loopback address only; a users file that names no one leaves it
closed, never open. With ``listen.tls_cert_file`` it is served over HTTPS.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import importlib.resources
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    generate_latest,
)

from shorelink import strict_json
from shorelink.boundary import boundary
from shorelink.fleet.follow import RegistryFollower
from shorelink.fleet.health import FleetView
from shorelink.fleet.log import read_anchor
from shorelink.fleet.state import FleetState
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.registry import RegistryFeed
from shorelink.logs import get_logger
from shorelink.metrics import process_registry
from shorelink.tls import TlsFile, client_context
from spark_core.config import SitesConfig
from spark_core.ops.coast import coastlines
from spark_core.ops.follow import SiteFollower
from spark_core.ops.users import LoginsBusy, OpsUsers
from spark_core.ops.view import (
    alerts_view,
    fleet_view,
    gateway_view,
    map_view,
    ships_view,
    site_view,
)
from spark_core.status import read_status

__all__ = ["OPS", "Ops", "make_app"]

log = get_logger(__name__)

HEARTBEAT_S = 15.0
GATEWAY_TIMEOUT_S = 3.0
_STATIC = {"index.html": "text/html", "ops.js": "text/javascript", "ops.css": "text/css"}


class Ops:
    """One site's facts for the page: the Kafka follower, the gateway's metrics, the
    status files, and the latest snapshot (rebuilt every ``refresh``)."""

    def __init__(self, sites: SitesConfig, site: str, follower: SiteFollower | None = None) -> None:
        self.cfg = sites.site(site)
        self.site = site
        c = self.cfg
        self.follower = follower or SiteFollower(
            site,
            self.kafka_endpoint(),
            c.streams,
            report_stream=c.ops.report_stream,
            tail=c.ops.tail,
        )
        f = c.ops.users_file
        self.users = OpsUsers(f, f"sites.{site}.ops.users_file") if f is not None else None
        #: open to whoever reaches it only without a users file: one that names no one
        #: lets no one in
        self.open = self.users is None
        if self.users is not None and not self.users.names:
            log.warning(
                "ops_no_users",
                site=site,
                path=f,
                message="the users file names no one: nobody can log in (shorelink ops-users add)",
            )
        self.gateway: dict[str, Any] | None = (
            gateway_view(c.ops.gateway, None, "not read yet") if c.ops.gateway else None
        )
        #: the fleet registry this site follows (``fleet_pub_file``), as the page shows
        #: it: a copy made on the feed's thread at each change
        self.fleet: FleetView | None = None
        self.registry_feed: RegistryFeed | None = None
        if sites.fleet_pub_file is not None:
            registry = RegistryFollower(read_anchor(sites.fleet_pub_file), on_change=self._fleet)
            self.registry_feed = RegistryFeed(self.follower.kafka, registry)
        self.snapshot: dict[str, Any] = {}
        self.snapshot_json = "{}"
        #: grows whenever the snapshot's facts change
        self.version = 0
        self._changed = asyncio.Event()

    def kafka_endpoint(self) -> KafkaEndpoint:
        """How the page reads Kafka: as its own read-only principal (``[sites.S.ops.kafka]``),
        else as the site application (said at start: the web-facing process then holds
        a password that may write)."""
        o, c = self.cfg.ops, self.cfg
        if o.kafka_username:
            return c.kafka.as_user(o.kafka_username, o.kafka_password)
        log.warning(
            "ops_reads_as_the_application",
            site=self.site,
            message="the page reads Kafka as the site application, a principal that may write: "
            "give it its own read-only one ([sites.S.ops.kafka] username and password, "
            "then access apply)",
        )
        return c.kafka

    def _fleet(self, state: FleetState) -> None:
        self.fleet = FleetView.of(state)

    # -- building ----------------------------------------------------------------------
    def build(self) -> dict[str, Any]:
        """Site, ships and alerts now (reads the status files: call off the loop)."""
        facts = self.follower.facts
        return {
            "site": site_view(
                self.site, self.cfg.streams, facts, read_status(self.cfg), self.gateway
            ),
            "ships": ships_view(facts),
            "alerts": alerts_view(facts),
            "fleet": fleet_view(self.fleet, facts),
        }

    async def refresh(self) -> bool:
        """Rebuild the snapshot; True (and wake the event streams) if a fact changed."""
        snap = await asyncio.to_thread(self.build)
        if _facts(snap) == _facts(self.snapshot):
            return False
        self.snapshot = snap
        self.snapshot_json = strict_json.dumps(snap)
        self.version += 1
        self._changed.set()
        self._changed = asyncio.Event()
        return True

    async def changed(self, within: float) -> None:
        """Return when the snapshot changes, or after ``within`` seconds."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), within)

    async def run(self, stop: asyncio.Event) -> None:
        """Keep the snapshot and the gateway's figures current until ``stop``."""
        ca = self.cfg.ops.gateway_ca_file
        ssl = client_context(TlsFile(ca, f"sites.{self.site}.ops.gateway_ca_file")) if ca else None
        timeout = aiohttp.ClientTimeout(total=GATEWAY_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            while not stop.is_set():
                if self.cfg.ops.gateway:
                    self.gateway = await _read_gateway(http, self.cfg.ops.gateway, ssl)
                await self.refresh()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.cfg.ops.refresh_s)


def _facts(snap: dict[str, Any]) -> Any:
    """A snapshot without the clock in it (what decides whether anything changed)."""
    site = dict(snap.get("site") or {})
    site.pop("generated_at", None)
    site.pop("kafka_polled_at", None)
    ships = [
        {k: v for k, v in s.items() if k != "last_heard_age_s"} for s in snap.get("ships") or ()
    ]
    fleet = dict(snap.get("fleet") or {})
    fleet["ships"] = [
        {k: v for k, v in s.items() if k != "heard_s_ago"} for s in fleet.get("ships") or ()
    ]
    return site, ships, snap.get("alerts"), fleet


#: the most of a gateway's ``/metrics`` the page reads (a gateway's is a few KiB; what
#: answers at its address is not trusted to end)
MAX_GATEWAY_METRICS_BYTES = 1024 * 1024


async def _read_capped(content: aiohttp.StreamReader, cap: int) -> bytes | None:
    """The body to its end, or None once it passed ``cap`` bytes. One ``read(n)``
    returns what has arrived so far, not ``n`` bytes: over a real network it cut a
    gateway's figures short (a last line ``..._total 12`` for ``..._total 1234``)."""
    parts: list[bytes] = []
    size = 0
    while chunk := await content.read(cap + 1 - size):
        parts.append(chunk)
        size += len(chunk)
        if size > cap:
            return None
    return b"".join(parts)


async def _read_gateway(http: aiohttp.ClientSession, url: str, ssl: Any) -> dict[str, Any]:
    try:
        async with http.get(f"{url}/metrics", ssl=ssl if ssl is not None else True) as r:
            if r.status != 200:
                return gateway_view(url, None, f"/metrics answered {r.status}")
            body = await _read_capped(r.content, MAX_GATEWAY_METRICS_BYTES)
            if body is None:
                return gateway_view(
                    url, None, f"/metrics larger than {MAX_GATEWAY_METRICS_BYTES} bytes"
                )
            # Prometheus's text format is UTF-8
            return gateway_view(url, body.decode("utf-8", "replace"))
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        return gateway_view(url, None, f"unreachable: {exc or type(exc).__name__}")


# -- HTTP ----------------------------------------------------------------------------

OPS = web.AppKey("ops", Ops)
_STOP = web.AppKey("ops_stop", asyncio.Event)
_TASK = web.AppKey("ops_task", asyncio.Task)


def make_app(ops: Ops, *, follow: bool = True) -> web.Application:
    """The page's application. ``follow``: start the Kafka follower with the app (and
    stop it with the app)."""
    app = web.Application(middlewares=[_headers, _auth])
    app[OPS] = ops
    app.router.add_get("/", _index)
    app.router.add_get("/static/{name}", _static)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/api", _api_index)
    app.router.add_get("/api/site", _json(lambda o: o.snapshot.get("site")))
    app.router.add_get("/api/ships", _json(lambda o: o.snapshot.get("ships")))
    app.router.add_get("/api/alerts", _json(lambda o: o.snapshot.get("alerts")))
    app.router.add_get("/api/fleet", _json(lambda o: o.snapshot.get("fleet")))
    app.router.add_get("/api/snapshot", _json(lambda o: o.snapshot))
    app.router.add_get("/api/map", _json(lambda o: map_view(o.follower.facts)))
    app.router.add_get("/api/coastlines", _coastlines)
    app.router.add_get("/api/events", _events)
    app.router.add_get("/metrics", _metrics)

    async def start(app: web.Application) -> None:
        if follow:
            ops.follower.start()
            if ops.registry_feed is not None:
                ops.registry_feed.start()
        await ops.refresh()
        app[_STOP] = asyncio.Event()
        app[_TASK] = asyncio.create_task(ops.run(app[_STOP]), name="ops-refresh")

    async def stop(app: web.Application) -> None:
        app[_STOP].set()
        ops._changed.set()  # event streams notice and end
        with contextlib.suppress(asyncio.CancelledError):
            await app[_TASK]
        if follow:
            await asyncio.to_thread(ops.follower.stop)
            if ops.registry_feed is not None:
                await asyncio.to_thread(ops.registry_feed.stop)

    app.on_startup.append(start)
    app.on_shutdown.append(stop)
    if ops.open:
        log.warning(
            "ops_open",
            site=ops.site,
            message="no ops.users_file: the page is open to whoever reaches it",
        )
    return app


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


#: what every answer says to the browser: nothing but this page's own files runs or
#: loads, no other site may frame it, no type is guessed, no address leaks onward
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}
#: the names an open page (no users file, loopback only) answers to: another name is a
#: web site's page that had its own name resolve to 127.0.0.1 (DNS rebinding)
_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")


@boundary
def _host_name(host: str) -> str:
    """The name of a ``Host`` header, without its port (``[::1]:8090`` -> ``[::1]``)."""
    if host.startswith("["):
        return host[: host.find("]") + 1]
    return host.rsplit(":", 1)[0].lower()


#: the page process's own figures (RSS, CPU seconds, open files, Python), as every
#: shorelink process has them; behind the page's logins like the rest
_REGISTRY = process_registry("ops")


async def _metrics(request: web.Request) -> web.Response:
    return web.Response(
        body=generate_latest(_REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST}
    )


@web.middleware
async def _headers(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        exc.headers.update(SECURITY_HEADERS)
        raise
    if not response.prepared:
        response.headers.update(SECURITY_HEADERS)
    return response


@web.middleware
@boundary
async def _auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    ops = request.app[OPS]
    if request.method != "GET" and request.method != "HEAD":
        return web.json_response(
            {"error": "read_only", "message": "the operations page is read-only"}, status=405
        )
    if request.path == "/healthz":
        return await handler(request)
    if ops.open:
        if _host_name(request.host) not in _LOOPBACK_NAMES:
            return web.json_response(
                {"error": "wrong_host", "message": "an open page answers to loopback names only"},
                status=421,
            )
        return await handler(request)
    login = _basic_login(request.headers.get("Authorization", ""))
    try:
        allowed = login is not None and ops.users is not None and await ops.users.check(*login)
    except LoginsBusy as exc:  # a flood of guesses: answered at once, never queued
        return web.json_response(
            {"error": "busy", "message": str(exc)}, status=503, headers={"Retry-After": "1"}
        )
    if not allowed:
        return web.json_response(
            {"error": "unauthorized", "message": "a login of the page (shorelink ops-users)"},
            status=401,
            headers={
                "WWW-Authenticate": f'Basic realm="shorelink ops {ops.site}", charset="UTF-8"'
            },
        )
    return await handler(request)


@boundary
def _basic_login(header: str) -> tuple[str, str] | None:
    """(name, password) of an HTTP Basic ``Authorization`` header."""
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "basic" or len(token) > 4096:
        return None
    try:
        user, sep, password = base64.b64decode(token.strip(), validate=True).decode().partition(":")
    except ValueError:  # not base64 (binascii.Error), not ASCII (a byte past 0x7f), not UTF-8
        return None
    return (user, password) if sep else None


def _json(get: Callable[[Ops], Any]) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.json_response(get(request.app[OPS]), dumps=strict_json.dumps)

    return handler


async def _healthz(_request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _api_index(request: web.Request) -> web.Response:
    ops = request.app[OPS]
    return web.json_response(
        {
            "site": ops.site,
            "endpoints": {
                "/api/site": "records per stream and origin, replication, queries, gateway, dead letters, problems",
                "/api/ships": "per ship: last heard, link, backlog at sea, satellite spend, position",
                "/api/alerts": "the newest alerts first",
                "/api/fleet": "the fleet registry's rollouts and each ship's configuration "
                "version, health and last heard (null: the site follows no registry)",
                "/api/map": "each ship's track: [ts_ms, lat, lon], oldest first",
                "/api/coastlines": "land outlines: lists of [lon, lat]",
                "/api/snapshot": "site, ships and alerts in one object",
                "/api/events": "server-sent events: a snapshot event whenever the facts change",
            },
            "docs": "docs/operations.md",
        }
    )


def _asset(name: str) -> bytes:
    return (importlib.resources.files("spark_core.ops") / "static" / name).read_bytes()


async def _index(_request: web.Request) -> web.Response:
    return web.Response(body=_asset("index.html"), content_type="text/html", charset="utf-8")


@boundary
async def _static(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in _STATIC:
        raise web.HTTPNotFound()
    return web.Response(body=_asset(name), content_type=_STATIC[name], charset="utf-8")


async def _coastlines(_request: web.Request) -> web.Response:
    return web.json_response(
        coastlines(), headers={"Cache-Control": "max-age=86400"}, dumps=strict_json.dumps
    )


async def _events(request: web.Request) -> web.StreamResponse:
    ops = request.app[OPS]
    stop = request.app[_STOP]
    resp = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
        }
    )
    resp.headers.update(SECURITY_HEADERS)
    await resp.prepare(request)
    sent = -1
    last_write = time.monotonic()
    try:
        while not stop.is_set():
            if ops.version != sent:
                sent = ops.version
                await resp.write(f"event: snapshot\ndata: {ops.snapshot_json}\n\n".encode())
                last_write = time.monotonic()
            elif time.monotonic() - last_write >= HEARTBEAT_S:
                await resp.write(b": keep-alive\n\n")
                last_write = time.monotonic()
            await ops.changed(HEARTBEAT_S)
    except ConnectionResetError:
        pass  # the page was closed
    return resp
