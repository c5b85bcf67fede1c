"""The gateway's boundaries over the whole input space (docs/boundaries.md): any body,
frame, ship name or Authorization header is answered with a JSON 4xx (or taken), never a
500, and the gateway serves on; its own files and cursor records are read or refused
with their documented error, within their bound. The server tests run the real gateway
on loopback against the session's Kafka, a few dozen examples each: a hostile ship's
one request must not take the port's gateway down for every other ship."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import aiohttp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core_gateway.auth import Credentials
from core_gateway.errors import GatewayError
from core_gateway.holdings import Holdings
from shorelink import strict_json
from tests import wire_bombs
from tests.bounds import KIB, Bound, within
from tests.core_gateway.helpers import RunningGateway, batch
from tests.strategies import any_bytes, any_text, deep_json, header_text, json_values, mutated

PURE = settings(
    max_examples=60,
    deadline=2000,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
#: a real server per example: few, each answered within the deadline
SERVED = settings(
    max_examples=50, deadline=10_000, database=None, suppress_health_check=list(HealthCheck)
)


@PURE
@given(
    st.one_of(
        any_bytes(300),
        deep_json(),
        mutated(b'{"written": "1-5,9", "abandoned": "6-8"}'),
        json_values().map(lambda d: strict_json.dumps({"written": d}).encode()),
    )
)
def test_a_gateway_cursor_is_restored_or_refused_with_a_value_error(value: bytes) -> None:
    holdings = Holdings()
    out = within(
        Bound(256 * KIB, 16, cpu_s=0.5, cpu_per_mib=2),
        (ValueError,),
        holdings.restore_cursor,
        "ship-1",
        "containers",
        value,
        size=len(value),
    )
    if isinstance(out, ValueError):  # nothing half-restored
        assert not holdings.get("ship-1", "containers").held()


_SHIPS = b'{"ships": {"ship-1": {"token_hash": "ab", "created": "x", "revoked": false}}}'


@PURE
@given(
    st.one_of(
        any_bytes(300),
        deep_json(),
        mutated(_SHIPS, 6),
        json_values().map(lambda d: strict_json.dumps({"ships": {"s": d}}).encode()),
        json_values().map(lambda d: strict_json.dumps({"ships": d}).encode()),
    )
)
def test_a_credentials_file_is_read_or_refused_with_a_gateway_error(
    tmp_path: Path, data: bytes
) -> None:
    path = tmp_path / "ships.json"
    path.unlink(missing_ok=True)
    creds = Credentials(path)  # no file: no ships
    path.write_bytes(data)
    within(
        Bound(256 * KIB, 32, cpu_s=0.5, cpu_per_mib=4),
        (GatewayError,),
        creds.reload,
        size=len(data),
    )


def _request(
    gw: RunningGateway,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, object]]:
    req = urllib.request.Request(
        gw.url + path,
        data=body,
        method="POST" if body is not None else "GET",
        headers={"Content-Type": "application/octet-stream", **(headers or gw.headers())},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _bodies(gw: RunningGateway) -> st.SearchStrategy[bytes]:
    good = batch(gw.ship, 1, 20)
    return st.one_of(
        any_bytes(400),
        mutated(good, 6),
        st.builds(
            lambda n, slots: wire_bombs.batch(wire_bombs.many_templates(n, slots), n),
            st.integers(1, 3000),
            st.integers(0, 200),
        ),
        st.builds(
            lambda slots, n: wire_bombs.batch(wire_bombs.number_columns(slots, n), n),
            st.integers(1, 60),
            st.integers(1, 20_000),
        ),
    )


def _served_and_answered(status: int, doc: dict[str, object]) -> None:
    assert status < 500 or doc.get("error") == "busy", (status, doc)
    assert status == 200 or isinstance(doc.get("error"), str), (status, doc)


async def test_any_upload_body_is_answered_4xx_and_the_gateway_keeps_serving(
    gateway: RunningGateway,
) -> None:
    @SERVED
    @given(body=_bodies(gateway))
    def one(body: bytes) -> None:
        path = f"/v1/ships/{gateway.ship}/streams/containers/batches"
        _served_and_answered(*_request(gateway, path, body))

    await asyncio.to_thread(one)
    status, _ = await asyncio.to_thread(
        _request,
        gateway,
        f"/v1/ships/{gateway.ship}/streams/containers/batches",
        batch(gateway.ship, 1, 20),
    )
    assert status == 200


async def test_any_upload_frame_is_answered_and_the_gateway_keeps_serving(
    gateway: RunningGateway,
) -> None:
    url = gateway.url.replace("http", "ws") + f"/v1/ships/{gateway.ship}/upload"

    async def frames(bodies: list[bytes]) -> list[dict[str, object]]:
        async with aiohttp.ClientSession() as s, s.ws_connect(url, headers=gateway.headers()) as ws:
            hello = await ws.receive_json(timeout=10)
            assert hello["type"] == "holdings"
            for body in bodies:
                await ws.send_bytes(body)
            return [await ws.receive_json(timeout=10) for _ in bodies]

    @SERVED
    @given(bodies=st.lists(_bodies(gateway), min_size=1, max_size=3))
    def one(bodies: list[bytes]) -> None:
        for reply in asyncio.run(frames(bodies)):
            status = reply.pop("status")
            assert isinstance(status, int)
            _served_and_answered(status, reply)

    await asyncio.to_thread(one)
    [reply] = await frames([batch(gateway.ship, 1, 5)])
    assert reply["status"] == 200


async def test_any_ship_name_or_authorization_header_is_refused_with_a_json_answer(
    gateway: RunningGateway,
) -> None:

    @SERVED
    @given(
        ship=st.one_of(any_text(40), st.just(gateway.ship)),
        auth=st.one_of(
            header_text(80),
            header_text(80).map(lambda t: "Bearer " + t),
            st.just(f"Bearer {gateway.token}"),
        ),
    )
    def one(ship: str, auth: str) -> None:
        quoted = urllib.parse.quote(ship.encode("utf-8", "surrogatepass"), safe="")
        for path in (
            f"/v1/ships/{quoted}/holdings",
            f"/v1/ships/{quoted}/streams/containers/batches",
        ):
            body = b"" if path.endswith("batches") else None
            status, doc = _request(
                gateway, path, body, {"Authorization": auth.encode("latin-1").decode("latin-1")}
            )
            _served_and_answered(status, doc)
            authorized = ship == gateway.ship and auth == f"Bearer {gateway.token}"
            if not authorized:
                assert status in (401, 403, 404), (status, doc)

    await asyncio.to_thread(one)
