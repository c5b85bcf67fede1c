"""The Gateway seam. One contract suite runs over every implementation: the in-memory
one the uplink tests use, HttpGateway against the API server in front of it
(tests/edge_agent/api_server.py), and HttpGateway against the real gateway (core_gateway
on loopback, real Kafka), so neither the in-memory one nor the client can drift from
what the gateway really does; then HttpGateway's mapping of statuses to exceptions,
against the API server, whose answers a test can set."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from core_gateway.auth import Credentials
from edge_agent.config import DEFAULT_LINKS, GatewayEndpoint, LinkConfig
from edge_agent.errors import GatewayGap, GatewayRejected, LinkError
from edge_agent.gateway import Gateway, HttpGateway
from local_stack.kafka import KafkaBroker
from local_stack.process import free_port
from shorelink.config import Secret
from shorelink.ranges import RangeSet
from shorelink.wire import Batch, WireRecord, encode_batch
from shorelink.wire_dict import train, training_samples
from tests.core_gateway.helpers import gateway_config, start_gateway
from tests.edge_agent.api_server import TOKEN, api_app
from tests.edge_agent.memory_gateway import MemoryGateway
from tests.helpers import unique


def body(
    lo: int,
    hi: int,
    *,
    stream: str = "containers",
    first_available: int = 1,
    ship: str = "bigblue",
) -> bytes:
    recs = tuple(
        WireRecord(s, f"C{s % 3}", 1_700_000_000_000 + s, f"bigblue/d1/c/C{s % 3}/env", b"{}")
        for s in range(lo, hi + 1)
    )
    return encode_batch(Batch(ship, stream, recs, first_available=first_available))


class Server:
    def __init__(self) -> None:
        self.site = MemoryGateway("tokyo", "port_wifi")
        self.override: dict[str, Any] = {}
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"

    def client(
        self,
        *,
        token: str = TOKEN,
        ship: str = "bigblue",
        url: str = "",
        link: LinkConfig = DEFAULT_LINKS["port_wifi"],
    ) -> HttpGateway:
        cfg = GatewayEndpoint("tokyo", url or self.url, "port_wifi")
        return HttpGateway(cfg, link, ship, Secret(token))


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    srv = Server()
    runner = web.AppRunner(api_app(srv.site, srv.override))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", srv.port).start()
    yield srv
    await runner.cleanup()


@pytest.fixture(params=["memory", "http", "gateway"])
def kind(request: pytest.FixtureRequest) -> str:
    """Which implementation: in-memory, HttpGateway + API server, HttpGateway + the real
    gateway."""
    return str(request.param)


@pytest.fixture
def ship(kind: str) -> str:
    """The real gateway's holdings outlive a test (cursors in the session's Kafka): a
    ship of its own there."""
    return unique("bigblue") if kind == "gateway" else "bigblue"


@asynccontextmanager
async def real_gateway(tmp_path: Path, kafka: KafkaBroker, ship: str) -> AsyncIterator[HttpGateway]:
    """core_gateway served on loopback against ``kafka``, HttpGateway as its client."""
    cfg = gateway_config(tmp_path, kafka, site="tokyo")
    token = Credentials(cfg.credentials_file).add(ship)
    stop = asyncio.Event()
    task = await start_gateway(cfg, stop)
    edge = GatewayEndpoint("tokyo", f"http://127.0.0.1:{cfg.port}", "port_wifi")
    try:
        yield HttpGateway(edge, DEFAULT_LINKS["port_wifi"], ship, Secret(token))
    finally:
        stop.set()
        await task


@pytest.fixture
async def gateway(
    kind: str,
    ship: str,
    server: Server,
    tmp_path: Path,
    kafka_sites: Callable[..., dict[str, KafkaBroker]],
) -> AsyncIterator[Gateway]:
    if kind == "gateway":
        # the gateway tests' broker (tests/core_gateway/conftest.py), started on first use
        kafka = kafka_sites("gateway-tests")["gateway-tests"]
        async with real_gateway(tmp_path, kafka, ship) as gw:
            yield gw
            await gw.close()
        return
    seam: Gateway = MemoryGateway("tokyo", "port_wifi") if kind == "memory" else server.client()
    yield seam
    await seam.close()


# -- the contract: every Gateway behaves like this ----------------------------------------
async def test_contract_holdings_start_empty_for_every_stream_the_site_takes(
    gateway: Gateway,
) -> None:
    assert await gateway.holdings() == {s: RangeSet() for s in ("alerts", "nav", "containers")}
    assert (gateway.site, gateway.link) == ("tokyo", "port_wifi")


async def test_contract_accepted_batch_answers_what_the_site_holds(
    gateway: Gateway, ship: str
) -> None:
    b = body(1, 10, ship=ship)
    res = await gateway.send("containers", b)
    assert (res.held, res.written, res.sent_bytes) == (
        RangeSet([(1, 10)]),
        RangeSet([(1, 10)]),
        len(b),
    )
    again = await gateway.send("containers", body(5, 12, ship=ship))  # held seqs are skipped
    assert (again.held, again.written) == (RangeSet([(1, 12)]), RangeSet([(11, 12)]))
    assert (await gateway.holdings())["containers"] == RangeSet([(1, 12)])


async def test_contract_batch_beyond_held_plus_one_is_a_gap_with_held(
    gateway: Gateway, ship: str
) -> None:
    await gateway.send("containers", body(1, 10, ship=ship))
    with pytest.raises(GatewayGap) as exc:
        await gateway.send("containers", body(20, 30, ship=ship))
    assert exc.value.held == RangeSet([(1, 10)]) and exc.value.retryable


async def test_contract_first_available_lets_the_site_skip_dropped_seqs(
    gateway: Gateway, ship: str
) -> None:
    res = await gateway.send("containers", body(15, 20, first_available=15, ship=ship))
    assert res.held == RangeSet([(15, 20)])
    res = await gateway.send("containers", body(21, 22, first_available=15, ship=ship))
    assert res.held == RangeSet([(15, 22)])


async def test_contract_a_dictionary_the_site_lacks_is_rejected_not_retryable(
    gateway: Gateway, ship: str
) -> None:
    """The ship's cue to send that stream without a dictionary: 422, its own code, and
    nothing of the batch held."""
    recs = tuple(WireRecord(s, f"C{s % 3}", s, f"t/C{s % 3}", b"{}") for s in range(1, 40))
    d = train("containers", training_samples(recs, 5), dict_id=70_001, size=1024)
    data = encode_batch(Batch(ship, "containers", recs[:10]), dictionary=d)
    with pytest.raises(GatewayRejected) as exc:
        await gateway.send("containers", data)
    assert (exc.value.status, exc.value.error_code, exc.value.retryable) == (
        422,
        "unknown_dictionary",
        False,
    )
    assert (await gateway.holdings())["containers"] == RangeSet()


async def test_contract_unknown_stream_is_rejected_not_retryable(
    gateway: Gateway, ship: str
) -> None:
    with pytest.raises(GatewayRejected) as exc:
        await gateway.send("weather", body(1, 1, stream="weather", ship=ship))
    assert (exc.value.status, exc.value.error_code, exc.value.retryable) == (
        404,
        "unknown_stream",
        False,
    )


# -- HttpGateway: statuses -> exceptions --------------------------------------------------
async def test_http_sends_bearer_token_and_maps_401_403(server: Server) -> None:
    """The token proves which ship this is; a wrong one must not look like a flaky link."""
    for client, status in ((server.client(token="wrong"), 401), (server.client(ship="other"), 403)):
        with pytest.raises(GatewayRejected) as exc:
            await client.holdings()
        assert exc.value.status == status and exc.value.link_wide and not exc.value.retryable
        await client.close()


@pytest.mark.parametrize(
    ("status", "payload", "error"),
    [
        (422, {"error": "bad_seq_range", "message": "no"}, GatewayRejected),
        (413, {"error": "too_large", "message": "no"}, GatewayRejected),
        (400, {"error": "bad_checksum", "message": "no"}, GatewayRejected),
        (503, {"error": "kafka_unavailable", "message": "later"}, LinkError),
        (500, "<html>oops</html>", LinkError),
        (429, {"error": "slow_down", "message": "later"}, LinkError),
        (408, {"error": "body_timeout", "message": "later"}, LinkError),
        (200, "<html>captive portal: accept our terms</html>", LinkError),
        (200, {"ship": "bigblue"}, LinkError),
    ],
)
async def test_http_status_becomes_the_right_exception(
    server: Server, status: int, payload: Any, error: type[Exception]
) -> None:
    server.override["answer"] = (status, payload)
    client = server.client()
    with pytest.raises(error) as exc:
        await client.send("containers", body(1, 3))
    if isinstance(exc.value, GatewayRejected):
        assert exc.value.error_code == payload["error"] and exc.value.stream == "containers"
    await client.close()


@pytest.mark.parametrize(
    ("status", "error", "link_wide"),
    [(401, GatewayRejected, True), (403, GatewayRejected, True), (503, LinkError, False)],
)
async def test_http_upload_refused_before_the_upgrade(
    server: Server, status: int, error: type[Exception], link_wide: bool
) -> None:
    """The upload connection is refused (bad token, gateway not ready): the same
    exceptions as for a refused request."""
    server.override["/v1/ships/bigblue/upload"] = (status, {"error": "x", "message": "no"})
    client = server.client()
    with pytest.raises(error) as exc:
        await client.send("containers", body(1, 3))
    assert getattr(exc.value, "link_wide", False) == link_wide
    await client.close()


async def test_http_batch_over_the_gateways_message_limit_is_rejected_not_retried(
    server: Server,
) -> None:
    """A gateway closes the upload (1009) on a message over its limit: that batch is a
    413 (resending it would fail again), not a flaky link."""
    server.override["max_msg_size"] = 2000
    big = encode_batch(
        Batch(
            "bigblue",
            "containers",
            tuple(
                WireRecord(s, "C1", 1_700_000_000_000 + s, "t/C1", os.urandom(200))
                for s in range(1, 51)
            ),
        )
    )
    client = server.client()
    with pytest.raises(GatewayRejected) as exc:
        await client.send("containers", big)
    assert (exc.value.status, exc.value.error_code, exc.value.retryable) == (
        413,
        "too_large",
        False,
    )
    await client.close()


async def test_http_pipelined_batches_are_answered_in_order(server: Server) -> None:
    """Several sends in flight on the one upload connection: each gets its own answer
    (matched by order), and the site took them in the order they were sent."""
    client = server.client()
    results = await asyncio.gather(
        *(client.send("containers", body(10 * i + 1, 10 * i + 10)) for i in range(8))
    )
    assert [r.written for r in results] == [RangeSet([(10 * i + 1, 10 * i + 10)]) for i in range(8)]
    assert results[-1].held == RangeSet([(1, 80)])
    await client.close()


async def test_http_timeout_and_refused_connection_are_link_errors(server: Server) -> None:
    async def slow() -> tuple[int, dict[str, Any]]:
        await asyncio.sleep(1)
        return 200, {}

    server.override["answer"] = slow
    client = server.client(link=LinkConfig("port_wifi", timeout_s=0.3))
    with pytest.raises(LinkError, match="no answer within"):
        await client.send("containers", body(1, 3))
    await client.close()
    dead = server.client(url=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(LinkError) as exc:
        await dead.holdings()
    assert exc.value.retryable and exc.value.site == "tokyo"
    await dead.reset()
    with pytest.raises(LinkError):  # a reset client connects afresh
        await dead.holdings()
    await dead.close()


async def test_a_gateway_answering_json_nested_too_deep_is_a_link_error() -> None:
    """Review N15 (its JSON part, on the ship's side): the agent read the gateway's
    upload messages with plain json.loads, whose RecursionError on deep nesting is no
    ValueError: it escaped the agent's handling instead of failing the link (retried
    with backoff). A hostile or broken gateway's hello (and its answers) are read as
    strict JSON: anything else is a LinkError."""
    deep = "[" * 100_000 + "]" * 100_000

    async def upload(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.send_str(deep)  # the hello
        await ws.receive()
        return ws

    app = web.Application()
    app.router.add_get("/v1/ships/bigblue/upload", upload)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        gw = HttpGateway(
            GatewayEndpoint("tokyo", f"http://127.0.0.1:{port}", "port_wifi"),
            DEFAULT_LINKS["port_wifi"],
            "bigblue",
            Secret(TOKEN),
        )
        with pytest.raises(LinkError, match="no holdings"):
            await gw.holdings()
        await gw.close()
    finally:
        await runner.cleanup()
