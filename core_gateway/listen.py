"""The gateway's listening socket: aiohttp's server behind a connection limit and a TLS
handshake timeout.

The gateway faces the internet. aiohttp bounds neither how many connections are open
nor (before a request begins) how long one may take: every accepted socket holds a file
descriptor, and a peer that opens many and sends nothing (or dribbles header bytes,
which ``listen.idle_timeout`` cuts) could use them all, so that ``accept()`` fails for
ships. :class:`CappedSite` closes a connection as soon as it is accepted when
``listen.max_connections`` are open (counted in
``shorelink_gateway_connections_refused_total``); a TLS handshake, before which asyncio
does not hand a connection to aiohttp, gets :data:`TLS_HANDSHAKE_TIMEOUT_S`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from ssl import SSLContext

from aiohttp import web

__all__ = ["TLS_HANDSHAKE_TIMEOUT_S", "CappedSite"]

log = logging.getLogger(__name__)

#: seconds a client has to complete its TLS handshake (asyncio's default: 60)
TLS_HANDSHAKE_TIMEOUT_S = 10.0
#: a refusal is logged at most this often (seconds); each one is counted
_LOG_EVERY_S = 60.0


class _Refused(asyncio.Protocol):
    """One connection past the limit: closed as soon as it is made."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


class _Connections:
    """The protocol factory asyncio calls for each accepted connection: aiohttp's
    request handler while fewer than ``limit`` of them live, else :class:`_Refused`."""

    def __init__(self, server: web.Server, limit: int, refused: Callable[[], None]) -> None:
        self.server = server
        self.limit = limit
        self.refused = refused
        self._logged = 0.0

    def __call__(self) -> asyncio.BaseProtocol:
        # aiohttp's server knows a connection once it is made (for TLS: handshake done;
        # one in its handshake is bounded by TLS_HANDSHAKE_TIMEOUT_S instead)
        if len(self.server.connections) >= self.limit:
            self.refused()
            now = time.monotonic()
            if now - self._logged >= _LOG_EVERY_S:
                self._logged = now
                log.warning(
                    "event=connections_refused limit=%d message=%r",
                    self.limit,
                    "listen.max_connections reached: new connections are closed at once",
                )
            return _Refused()
        return self.server()


class CappedSite(web.BaseSite):
    """A TCP site like aiohttp's ``TCPSite`` whose connections are capped at
    ``limit`` (see the module's doc)."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        *,
        limit: int,
        refused: Callable[[], None],
        ssl_context: SSLContext | None = None,
    ) -> None:
        super().__init__(runner, ssl_context=ssl_context)
        self._host, self._port = host, port
        self._limit, self._refused = limit, refused

    @property
    def name(self) -> str:
        scheme = "https" if self._ssl_context else "http"
        return f"{scheme}://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            _Connections(server, self._limit, self._refused),
            self._host,
            self._port,
            ssl=self._ssl_context,
            backlog=self._backlog,
            ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S if self._ssl_context else None,
        )
