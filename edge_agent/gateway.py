"""The uplink's one seam: a shore gateway that says what it holds and takes batches.

:class:`Gateway` is the protocol the uplink talks to; :class:`HttpGateway` speaks the
gateway's HTTP API (``docs/gateway-api.md``) with one aiohttp session per gateway. The
tests drive the uplink through an in-memory implementation of the same protocol.

Every failure becomes an edge_agent error at this boundary:
- no reply, a broken connection, a timeout, 5xx, 408, 429 or a reply that is not the
  API's JSON: :class:`LinkError` (retryable; whether the batch arrived is unknown);
- 409: :class:`GatewayGap` with what the site holds;
- other 4xx: :class:`GatewayRejected` (not retryable).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

from edge_agent.config import GatewayConfig, LinkConfig
from edge_agent.errors import GatewayGap, GatewayRejected, LinkError
from shorelink.config import Secret
from shorelink.ranges import RangeSet
from shorelink.wire import CONTENT_TYPE

__all__ = ["Gateway", "HttpGateway", "SendResult"]

USER_AGENT = "shorelink-edge/0.1"


@dataclass(frozen=True, slots=True)
class SendResult:
    """The site's answer to one batch: what it now holds of the stream, and the bytes
    of the request body that went out."""

    held: RangeSet
    sent_bytes: int
    written: RangeSet = field(default_factory=RangeSet)


class Gateway(Protocol):
    """A shore site's gateway as the uplink sees it."""

    @property
    def site(self) -> str: ...

    @property
    def link(self) -> str:
        """The link class this gateway is reached over (``satellite``, ...)."""
        ...

    @property
    def url(self) -> str: ...

    async def holdings(self) -> dict[str, RangeSet]:
        """stream -> seqs of this ship the site holds; only the streams the site takes.
        (The uplink bounds a probe with ``asyncio.timeout``.)"""
        ...

    async def send(self, stream: str, body: bytes) -> SendResult:
        """Send one encoded batch; return only once the site has stored it."""
        ...

    async def reset(self) -> None:
        """Drop connections: the next request connects afresh (explicit reconnect)."""
        ...

    async def close(self) -> None: ...


class HttpGateway:
    """A gateway over HTTP(S): ``GET .../holdings``, ``POST .../batches``."""

    def __init__(self, cfg: GatewayConfig, link: LinkConfig, ship: str, token: Secret) -> None:
        self._cfg = cfg
        self._link = link
        self._ship = ship
        self._token = token
        self._session: aiohttp.ClientSession | None = None

    @property
    def site(self) -> str:
        return self._cfg.site

    @property
    def link(self) -> str:
        return self._cfg.link

    @property
    def url(self) -> str:
        return self._cfg.url

    def __repr__(self) -> str:
        return f"HttpGateway(site={self.site!r}, url={self.url!r}, link={self.link!r})"

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            headers = {"User-Agent": USER_AGENT}
            if self._token:
                headers["Authorization"] = f"Bearer {self._token.value}"
            self._session = aiohttp.ClientSession(
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=self._link.timeout_s),
                connector=aiohttp.TCPConnector(limit=self._link.in_flight + 1),
                raise_for_status=False,
            )
        return self._session

    async def holdings(self) -> dict[str, RangeSet]:
        path = f"/v1/ships/{self._ship}/holdings"
        data = await self._request("GET", path)
        try:
            streams = data["streams"]
            return {str(s): RangeSet.parse(str(r)) for s, r in streams.items()}
        except (KeyError, AttributeError, TypeError, ValueError) as exc:
            raise LinkError(f"GET {path}: unexpected reply {data!r:.200}", site=self.site) from exc

    async def send(self, stream: str, body: bytes) -> SendResult:
        path = f"/v1/ships/{self._ship}/streams/{stream}/batches"
        data = await self._request(
            "POST",
            path,
            stream=stream,
            data=body,
            headers={"Content-Type": CONTENT_TYPE},
        )
        try:
            held = RangeSet.parse(str(data["held"]))
            written = RangeSet.parse(str(data.get("written", "")))
        except (KeyError, AttributeError, TypeError, ValueError) as exc:
            raise LinkError(f"POST {path}: unexpected reply {data!r:.200}", site=self.site) from exc
        return SendResult(held, len(body), written)

    async def _request(
        self,
        method: str,
        path: str,
        *,
        stream: str = "",
        **kwargs: Any,
    ) -> dict[str, Any]:
        try:
            async with self._client().request(method, self.url + path, **kwargs) as resp:
                status = resp.status
                raw = await resp.read()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise LinkError(
                f"{method} {path}: {type(exc).__name__}: {exc}", site=self.site
            ) from exc
        try:
            data = json.loads(raw) if raw else {}
        except ValueError:
            data = None
        if not isinstance(data, dict):
            # e.g. a captive portal or proxy answering in HTML: not the gateway
            raise LinkError(f"{method} {path}: HTTP {status}, not the API's JSON", site=self.site)
        if status == 200:
            return data
        code = str(data.get("error", "")) or f"http_{status}"
        message = str(data.get("message", ""))
        if status == 409:
            try:
                held = RangeSet.parse(str(data.get("held", "")))
            except ValueError as exc:
                raise LinkError(f"{method} {path}: 409 with bad held", site=self.site) from exc
            raise GatewayGap(held, message, site=self.site, stream=stream)
        if status in (408, 429) or status >= 500 or status < 400:
            raise LinkError(f"{method} {path}: HTTP {status} {code}: {message}", site=self.site)
        raise GatewayRejected(status, code, message, site=self.site, stream=stream)

    async def reset(self) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
