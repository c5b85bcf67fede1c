"""A listening socket for a server that faces a network it does not trust (the
gateway's, the operations page's): aiohttp's server behind a connection limit and a TLS
handshake timeout.

aiohttp bounds neither how many connections are open nor (before a request begins) how
long one may take: every accepted socket holds a file descriptor, and a peer that opens
many and sends nothing could use them all, so that ``accept()`` fails for everyone
else. :class:`CappedSite` closes a connection as soon as it is accepted when ``limit``
are open, counted from the moment each is accepted: a TLS connection still in its
handshake (before which asyncio does not hand it to aiohttp) counts as much as one
being served (review N7: only served ones were counted, so silent TLS sockets were
not). A handshake gets :data:`TLS_HANDSHAKE_TIMEOUT_S`; a request's headers, the
``keepalive_timeout`` the caller gives aiohttp's runner (the gateway's
``listen.idle_timeout``).

Why the TLS is done here (``loop.start_tls`` on each accepted plain connection) and not
by ``create_server(ssl=...)``: there, asyncio hands a connection to the protocol only
after its handshake, so a connection past the limit could not be closed before it; here
it is closed the moment it is accepted, and one within the limit is handed to aiohttp
once its handshake is done (the same ``SSLProtocol`` transport ``create_server`` makes,
so the peer's certificate and the rest read as before). The count is asyncio's own: its
server attaches each accepted socket's transport when it is made and detaches it when
it is closed, whatever happened to the handshake (``asyncio.Server._active_count``,
CPython 3.11 onwards; where a Python lacks it, the connections aiohttp serves are
counted instead, as before). The tests that hold it:
``tests/core_gateway/test_api.py`` (silent TLS sockets past the limit, then a ship) and
``tests/spark_core/test_ops.py`` (the same on the page).

Shared by the deployables that listen: they import no one but this kernel.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from ssl import SSLContext

from aiohttp import web

from shorelink.logs import get_logger

__all__ = ["TLS_HANDSHAKE_TIMEOUT_S", "CappedSite"]

log = get_logger(__name__)

#: seconds a client has to complete its TLS handshake (asyncio's default: 60)
TLS_HANDSHAKE_TIMEOUT_S = 10.0
#: a refusal is logged at most this often (seconds); each one is counted
_LOG_EVERY_S = 60.0


class _Refused(asyncio.Protocol):
    """One connection past the limit: closed as soon as it is made."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


class _TlsHandshake(asyncio.Protocol):
    """An accepted connection until its TLS handshake is done; then aiohttp's request
    handler's (``handler``), over the TLS transport. A handshake that fails or takes
    longer than :data:`TLS_HANDSHAKE_TIMEOUT_S` closes the connection."""

    def __init__(
        self, handler: asyncio.BaseProtocol, ctx: SSLContext, pending: set[asyncio.Task[None]]
    ) -> None:
        self.handler, self.ctx, self.pending = handler, ctx, pending

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.pause_reading()  # the hello waits for the TLS protocol
        task = asyncio.get_running_loop().create_task(self._handshake(transport))
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    async def _handshake(self, raw: asyncio.Transport) -> None:
        try:
            tls = await asyncio.get_running_loop().start_tls(
                raw,
                self.handler,
                self.ctx,
                server_side=True,
                ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S,
            )
        except BaseException as exc:  # a failed or silent handshake, or the server stops
            raw.close()
            if not isinstance(exc, Exception):
                raise
            log.debug("tls_handshake_failed", error=str(exc))
            return
        if tls is None:  # the peer went during the handshake
            raw.close()
            return
        self.handler.connection_made(tls)


class _Connections:
    """The protocol factory asyncio calls for each accepted connection (before its
    transport, and for TLS its handshake): aiohttp's request handler while fewer than
    ``limit`` connections are open, else :class:`_Refused`."""

    def __init__(
        self,
        server: web.Server,
        limit: int,
        refused: Callable[[], None],
        what: str,
        ctx: SSLContext | None,
    ) -> None:
        self.server = server
        self.limit = limit
        self.refused = refused
        self.what = what
        self.ctx = ctx
        #: handshakes in progress (cancelled when the site stops)
        self.pending: set[asyncio.Task[None]] = set()
        #: asyncio's server, once listening: its count of accepted sockets still open
        self.listening: asyncio.AbstractServer | None = None
        self._logged = 0.0

    def open(self) -> int:
        """Connections open now, handshakes included (this one not yet)."""
        active = getattr(self.listening, "_active_count", None)
        return active if isinstance(active, int) else len(self.server.connections)

    def __call__(self) -> asyncio.BaseProtocol:
        if self.open() >= self.limit:
            self.refused()
            now = time.monotonic()
            if now - self._logged >= _LOG_EVERY_S:
                self._logged = now
                log.warning(
                    "connections_refused",
                    limit=self.limit,
                    message=f"{self.what} reached: new connections are closed at once",
                )
            return _Refused()
        if self.ctx is not None:
            return _TlsHandshake(self.server(), self.ctx, self.pending)
        return self.server()


class CappedSite(web.BaseSite):
    """A TCP site like aiohttp's ``TCPSite`` whose connections are capped at ``limit``
    from the moment each is accepted (see the module's doc); ``what`` names the limit
    in the log (a config key)."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        *,
        limit: int,
        refused: Callable[[], None],
        ssl_context: SSLContext | None = None,
        what: str = "listen.max_connections",
    ) -> None:
        super().__init__(runner, ssl_context=ssl_context)
        self._host, self._port = host, port
        self._limit, self._refused, self._what = limit, refused, what
        self._factory: _Connections | None = None

    @property
    def name(self) -> str:
        scheme = "https" if self._ssl_context else "http"
        return f"{scheme}://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        factory = _Connections(server, self._limit, self._refused, self._what, self._ssl_context)
        # plain TCP: the handshake is _TlsHandshake's, after the limit is checked
        self._server = await asyncio.get_running_loop().create_server(
            factory, self._host, self._port, backlog=self._backlog
        )
        factory.listening = self._server
        self._factory = factory

    async def stop(self) -> None:
        if self._factory is not None:  # handshakes in progress: their sockets closed
            for task in list(self._factory.pending):
                task.cancel()
        await super().stop()
