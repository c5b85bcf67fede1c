"""The uplink's one seam: a shore gateway that says what it holds and takes batches.

:class:`Gateway` is the protocol the uplink talks to; :class:`HttpGateway` speaks the
gateway's API (``docs/gateway-api.md``) with one aiohttp session per gateway and one
WebSocket upload connection (``GET .../upload``): the gateway's first message on it is
the site's holdings (so asking for them is opening the connection: one round trip
less after every outage), then batches cross the link one after the other and are
answered in order. Several batches may be
in flight at once (the session's window): each ``send`` waits for its own answer. The
tests drive the uplink through an in-memory implementation of the same protocol.

An ``https://`` gateway is verified against its entry's ``ca_file`` (or the system's
trust store), and the ship presents ``client_cert_file`` when it has one (mutual TLS);
the context is built from the config (``GatewayEndpoint.ssl_context``) once.

Every failure becomes an edge_agent error at this boundary:
- no reply, a broken connection, a timeout, 5xx, 408, 429 or a reply that is not the
  API's JSON: :class:`LinkError` (retryable; whether the batch arrived is unknown);
- a TLS handshake that fails (the gateway's certificate does not verify or does not
  name the host, the gateway refused our certificate, TLS spoken to plain HTTP): a
  :class:`LinkError` too, logged as ``event=gateway_tls_failed`` (rate-limited): it is
  the link's, never a refusal of the batch, and it is retried like any link failure (a
  certificate may be renewed, an intercepting proxy may go);
- 409: :class:`GatewayGap` with what the site holds;
- other 4xx: :class:`GatewayRejected` (not retryable).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

from edge_agent.config import GatewayEndpoint, LinkConfig
from edge_agent.errors import GatewayGap, GatewayRejected, LinkError
from shorelink import strict_json
from shorelink.boundary import boundary
from shorelink.config import Secret
from shorelink.fleet.shipconfig import ConfigOffer, parse_offer
from shorelink.logs import RateLimitedLog, get_logger
from shorelink.ranges import RangeSet

__all__ = ["Gateway", "HttpGateway", "SendResult"]

#: a WebSocket message may hold a batch of up to this many bytes (the gateway's cap)
MAX_MESSAGE = 16 * 1024 * 1024

USER_AGENT = "shorelink-edge/0.1"
#: how long closing an upload connection waits for the gateway's close frame (then
#: the connection is dropped): over a stalled link it never comes, and a stop waits
UPLOAD_CLOSE_S = 1.0

log = get_logger(__name__)


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
    """A gateway over HTTP(S): ``GET .../holdings``; batches on a WebSocket upload."""

    def __init__(self, cfg: GatewayEndpoint, link: LinkConfig, ship: str, token: Secret) -> None:
        self._cfg = cfg
        self._link = link
        self._ship = ship
        self._token = token
        self._session: aiohttp.ClientSession | None = None
        self._upload: _Upload | None = None
        self._connecting = asyncio.Lock()
        #: https: verify the gateway (ca_file or the system's), present our certificate
        self._ssl: ssl.SSLContext | bool = cfg.ssl_context() or True
        self._tls_log = RateLimitedLog(log)

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
                raise_for_status=False,
            )
        return self._session

    async def holdings(self) -> dict[str, RangeSet]:
        """What the site holds now: the first message of a fresh upload connection
        (an open one is replaced; the session that used it is over)."""
        if self._upload is not None:
            await self._upload.close()
            self._upload = None
        return (await self._open_upload()).held

    async def send(self, stream: str, body: bytes) -> SendResult:
        """Send one batch on the upload connection (opened if needed) and wait for its
        answer, at most ``link.timeout`` (then the connection is dropped: whether the
        batch arrived is unknown, the holdings will say)."""
        upload = await self._open_upload()
        answer = await upload.send(body, self._link.timeout_s)
        return self._result(stream, answer, len(body))

    @boundary
    def _result(self, stream: str, data: dict[str, Any], nbytes: int) -> SendResult:
        status = data.get("status", 200)
        if not isinstance(status, int):
            raise LinkError(f"upload: answer without a status: {data!r:.200}", site=self.site)
        if status != 200:
            self._raise_for(status, data, "upload", stream)
        try:
            held = RangeSet.parse(str(data["held"]))
            written = RangeSet.parse(str(data.get("written", "")))
        except (KeyError, AttributeError, TypeError, ValueError) as exc:
            raise LinkError(f"upload: unexpected answer {data!r:.200}", site=self.site) from exc
        return SendResult(held, nbytes, written)

    async def _open_upload(self) -> _Upload:
        async with self._connecting:
            if self._upload is not None and not self._upload.broken:
                return self._upload
            path = f"/v1/ships/{self._ship}/upload"
            try:
                ws = await self._client().ws_connect(
                    self.url + path,
                    max_msg_size=MAX_MESSAGE,
                    heartbeat=self._link.timeout_s,
                    compress=0,
                    autoping=True,
                    ssl=self._ssl,
                )
            except aiohttp.WSServerHandshakeError as exc:
                # refused before the upgrade: the API's JSON error is not at hand here,
                # but its status is (401/403/404/5xx)
                self._raise_for(exc.status, {"error": f"http_{exc.status}"}, f"GET {path}", "")
                raise  # not reached
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                tls = _tls_failure(exc)
                if tls:
                    self._tls_log.warning(
                        "tls",
                        "gateway_tls_failed",
                        site=self.site,
                        link=self.link,
                        url=self.url,
                        error=tls,
                    )
                    raise LinkError(
                        f"GET {path}: TLS handshake failed: {tls}", site=self.site
                    ) from exc
                raise LinkError(f"GET {path}: {type(exc).__name__}: {exc}", site=self.site) from exc
            try:
                async with asyncio.timeout(self._link.timeout_s):
                    hello = await ws.receive()
                held, offer, registry = _parse_hello(hello)
            except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
                await ws.close()
                raise LinkError(
                    f"GET {path}: no holdings from the gateway: {type(exc).__name__}: {exc}",
                    site=self.site,
                ) from exc
            self._upload = _Upload(ws, self.site, held)
            self._upload.config_offer, self._upload.registry_version = offer, registry
            return self._upload

    @property
    def config_offer(self) -> ConfigOffer | None:
        """The fleet configuration the gateway offered on the open upload connection
        (None: none, or no connection)."""
        return self._upload.config_offer if self._upload is not None else None

    @property
    def config_registry(self) -> int | None:
        """The version of the registry the gateway enforced when it last offered (None:
        a gateway from before, or no connection): a ship goes back from what it holds
        only on the word of a gateway that is not behind it."""
        return self._upload.registry_version if self._upload is not None else None

    async def fetch_config(self, request: str) -> bytes:
        """Send a configuration request on the upload connection; its binary answer
        (a :class:`LinkError` if the link fails meanwhile, a :class:`GatewayRejected`
        if the gateway refuses it)."""
        upload = await self._open_upload()
        answer = await upload.send(request, self._link.timeout_s)
        if isinstance(answer, bytes):
            return answer
        self._raise_for(int(answer.get("status", 500)), answer, "config", "")
        raise LinkError(f"config: unexpected answer {answer!r:.200}", site=self.site)

    def _raise_for(self, status: int, data: dict[str, Any], what: str, stream: str) -> None:
        """Raise the edge_agent error for a non-200 answer (see the module docstring)."""
        code = str(data.get("error", "")) or f"http_{status}"
        message = str(data.get("message", ""))
        if status == 409:
            try:
                held = RangeSet.parse(str(data.get("held", "")))
            except ValueError as exc:
                raise LinkError(f"{what}: 409 with bad held", site=self.site) from exc
            raise GatewayGap(held, message, site=self.site, stream=stream)
        if status in (408, 429) or status >= 500 or status < 400:
            raise LinkError(f"{what}: HTTP {status} {code}: {message}", site=self.site)
        raise GatewayRejected(status, code, message, site=self.site, stream=stream)

    async def reset(self) -> None:
        await self.close()

    async def close(self) -> None:
        upload, self._upload = self._upload, None
        session, self._session = self._session, None
        try:
            if upload is not None:
                await upload.close()
        finally:
            if session is not None:
                await session.close()


class _Upload:
    """One WebSocket upload connection: batches out in order, answers matched in order."""

    def __init__(
        self, ws: aiohttp.ClientWebSocketResponse, site: str, held: dict[str, RangeSet]
    ) -> None:
        self._ws = ws
        self._site = site
        #: what the site held when the connection opened (its first message)
        self.held = held
        #: the fleet configuration offered in the first message, or since in a batch's
        #: answer (shipconfig.py), and the registry's version at the gateway then
        self.config_offer: ConfigOffer | None = None
        self.registry_version: int | None = None
        #: offers that batches' answers carried (the registry moved meanwhile)
        self.offers_heard = 0
        self._waiting: deque[asyncio.Future[Any]] = deque()
        self._sending = asyncio.Lock()
        self.broken: str = ""
        self._reader = asyncio.create_task(self._read(), name=f"upload-answers:{site}")

    async def send(self, body: bytes | str, answer_within: float) -> Any:
        """A batch (bytes) or a configuration request (text): its answer, a JSON
        object, or the bytes of a binary message."""
        if self.broken:
            raise LinkError(f"upload connection broken: {self.broken}", site=self._site)
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(answer_within):
                async with self._sending:  # whole messages, in the order of the answers
                    self._waiting.append(answer)
                    try:
                        if isinstance(body, str):
                            await self._ws.send_str(body)
                        else:
                            await self._ws.send_bytes(body)
                    except (aiohttp.ClientError, ConnectionError, RuntimeError, OSError) as exc:
                        self._break(f"{type(exc).__name__}: {exc}")
                return await asyncio.shield(answer)
        except TimeoutError:
            self._break(f"no answer within {answer_within:g}s")
            await self.close()
            raise LinkError(
                f"upload: no answer within {answer_within:g}s (link stalled?)", site=self._site
            ) from None

    async def _read(self) -> None:
        try:
            async for msg in self._ws:
                if msg.type is aiohttp.WSMsgType.BINARY and self._waiting:
                    waiter = self._waiting.popleft()  # a configuration's answer
                    if not waiter.done():
                        waiter.set_result(bytes(msg.data))
                    continue
                if msg.type is not aiohttp.WSMsgType.TEXT:
                    self._break(f"unexpected {msg.type.name} message")
                    break
                try:
                    data = strict_json.loads(msg.data)
                except ValueError:
                    data = None
                if not isinstance(data, dict) or not self._waiting:
                    self._break(f"unexpected answer {msg.data!r:.200}")
                    break
                if "config" in data:
                    self._offered(data)
                waiter = self._waiting.popleft()
                if not waiter.done():
                    waiter.set_result(data)
            close = self._ws.close_code
            if close == aiohttp.WSCloseCode.MESSAGE_TOO_BIG and self._waiting:
                # the batch it was reading (the oldest unanswered) is over its limit:
                # resending it would only fail again
                waiter = self._waiting.popleft()
                if not waiter.done():
                    waiter.set_result(
                        {
                            "status": 413,
                            "error": "too_large",
                            "message": "the gateway closed the upload: batch over its limit",
                        }
                    )
            self._break(f"closed by the gateway (code {close})" if close else "connection lost")
        except (aiohttp.ClientError, ConnectionError, OSError) as exc:
            self._break(f"{type(exc).__name__}: {exc}")
        finally:
            self._break("connection closed")

    def _offered(self, data: dict[str, Any]) -> None:
        """A batch's answer that carries a new offer (the registry moved while the
        connection stays open); a malformed one is logged and ignored."""
        try:
            offer, registry = parse_offer(data["config"]), _registry(data.get("registry"))
        except ValueError as exc:
            log.warning("fleet_config_offer_malformed", site=self._site, error=str(exc))
            return
        self.config_offer, self.registry_version = offer, registry
        self.offers_heard += 1

    def _break(self, why: str) -> None:
        """The connection is unusable: every batch still waiting gets a LinkError (it
        may or may not have arrived; the site's holdings will tell)."""
        if not self.broken:
            self.broken = why
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_exception(LinkError(f"upload: {self.broken}", site=self._site))

    async def close(self) -> None:
        self._break("closed")
        with contextlib.suppress(Exception):  # TimeoutError: aiohttp drops the connection
            async with asyncio.timeout(UPLOAD_CLOSE_S):
                await self._ws.close()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._reader


def _tls_failure(exc: BaseException) -> str:
    """What failed in the TLS handshake, if ``exc`` (or what caused it) is a TLS
    failure: the gateway's certificate, or the gateway's refusal of ours; "" if not."""
    seen: BaseException | None = exc
    for _ in range(5):  # aiohttp wraps the ssl module's error, at most a few levels
        if seen is None:
            break
        if isinstance(seen, aiohttp.ClientConnectorCertificateError):
            return f"certificate not trusted: {seen.certificate_error}"
        if isinstance(seen, ssl.SSLCertVerificationError):
            return f"certificate not trusted: {seen.verify_message or seen}"
        if isinstance(seen, aiohttp.ClientConnectorError) and isinstance(
            seen.os_error, ssl.SSLError
        ):
            seen = seen.os_error  # e.g. TLS spoken to a plain HTTP port
            continue
        if isinstance(seen, ssl.SSLError):
            return str(seen)
        seen = seen.__cause__ or seen.__context__
    return ""


def _registry(value: object) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"registry version: {value!r:.40}")
    return value


@boundary
def _parse_hello(
    msg: aiohttp.WSMessage,
) -> tuple[dict[str, RangeSet], ConfigOffer | None, int | None]:
    """The gateway's first upload message: stream -> held seqs, the configuration
    offered (None: none) and the registry's version (None: none said). ValueError if it
    is not."""
    if msg.type is not aiohttp.WSMsgType.TEXT:
        raise ValueError(f"first message is {msg.type.name}, not the holdings")
    data = strict_json.loads(msg.data)
    if not isinstance(data, dict) or data.get("type") != "holdings":
        raise ValueError(f"first message is not the holdings: {msg.data!r:.200}")
    streams = data.get("streams")
    if not isinstance(streams, dict):
        raise ValueError(f"holdings without streams: {msg.data!r:.200}")
    held = {str(s): RangeSet.parse(str(r)) for s, r in streams.items()}
    return held, parse_offer(data.get("config")), _registry(data.get("registry"))
