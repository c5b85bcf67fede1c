"""Benchmark: what a fleet configuration change costs a ship on the wire (issue 41's
goal: a one-key change at most 1 KB over the satellite; docs/fleet-registry.md,
"Configuration to the ships").

A registry made by the registry's own code gives a group a configuration of the size a
fleet would run (``--alarms`` alarm rules, per-stream budgets, the satellite's budget),
then changes one key (one alarm's threshold). The ship holds the first version; the
exchange runs over loopback between the agent's real client (``HttpGateway``:
``config_offer``, ``fetch_config``) and an aiohttp WebSocket endpoint that answers as
``core_gateway/upload.py`` does, with the kernel's ``offer_for``, ``parse_request`` and
``encode_delta`` over the registry's state (the gateway's Kafka and admission play no
part in these bytes). A TCP relay between them counts every byte each way.

Figures, each on the same upload connection the ship opens anyway:

- **hello_offer_bytes**: what the offer adds to the gateway's first message;
- **exchange_bytes**: the request and the answer as TCP payload (WebSocket frames with
  their headers and the client's masks), measured at the relay;
- **one_key_change_bytes**: the two together: what the change costs the ship's link
  beyond the connection it opens anyway; beside **goal_bytes** (1,000);
- **full_fetch_bytes**: the same exchange for a ship that holds nothing (its first
  configuration), for comparison;
- **offer_in_a_batch_answer_bytes**: what the gateway adds to its answer to a batch
  once the offer changes while the upload connection stays open (0 while it does not);
- **tls_and_tcp_estimate_bytes**: what TLS 1.3 records (22 bytes each) and TCP/IP
  headers (52 bytes a segment, an ACK each way) add on a real link, by rule.

    .venv/bin/python bench/fleet_config.py
    .venv/bin/python bench/fleet_config.py --alarms 200

One JSON object goes to stdout.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import bench_parser
from aiohttp import WSMsgType, web

from edge_agent.config import DEFAULT_LINKS, GatewayEndpoint
from edge_agent.gateway import HttpGateway
from shorelink.config import Secret
from shorelink.fleet.log import Registry
from shorelink.fleet.shipconfig import (
    answer_lines,
    encode_delta,
    offer_for,
    offer_json,
    parse_request,
    request_json,
)
from shorelink.fleet.state import FleetState

GOAL_BYTES = 1000
SHIP = "bigblue"


def document(alarms: int, changed: bool) -> str:
    lines = [
        '[links.satellite]\ndaily_budget = "20MB"\n',
        '[streams.nav]\nmax_age = "30d"\n',
        '[streams.containers]\nmax_age = "14d"\non_full = "drop_oldest"\n',
    ]
    for i in range(alarms):
        above = 28 if changed and i == alarms // 2 else 30
        lines.append(
            f'[[alarms]]\nname = "reefer_{i:03d}_hot"\nstream = "containers"\n'
            f'key = "C{i:05d}"\nfield = "temp_c"\nabove = {above}\nfor = "5m"\n'
        )
    return "".join(lines)


class Counting:
    """A TCP relay that counts the bytes each way."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.up = 0
        self.down = 0

    async def _pipe(self, r: asyncio.StreamReader, w: asyncio.StreamWriter, up: bool) -> None:
        try:
            while data := await r.read(65536):
                if up:
                    self.up += len(data)
                else:
                    self.down += len(data)
                w.write(data)
                await w.drain()
        finally:
            w.close()

    async def handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        ur, uw = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        await asyncio.gather(self._pipe(r, uw, True), self._pipe(ur, w, False))


def gateway_app(state: FleetState, offering: list[bool]) -> web.Application:
    """The upload route's configuration part, as core_gateway/upload.py answers it
    (the offer in the hello while ``offering[0]``)."""

    async def upload(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(compress=False)
        await ws.prepare(request)
        hello: dict[str, Any] = {"type": "holdings", "ship": SHIP, "site": "tokyo"}
        hello["streams"] = {"alerts": "1-5000", "nav": "1-900", "containers": "1-250000"}
        offer = offer_for(state, SHIP)
        if offering[0] and offer is not None:
            hello["config"] = offer_json(offer)
            hello["registry"] = state.version
        await ws.send_json(hello)
        async for msg in ws:
            if msg.type is WSMsgType.TEXT and offer is not None:
                new, bases = answer_lines(state, offer, parse_request(msg.data), SHIP)
                await ws.send_bytes(encode_delta(new, bases))
        return ws

    app = web.Application()
    app.router.add_get("/v1/ships/{ship}/upload", upload)
    return app


async def _settle(relay: Counting) -> int:
    """The relay's count once it stops moving."""
    last = -1
    while (now := relay.up + relay.down) != last:
        last = now
        await asyncio.sleep(0.05)
    return now


async def exchange(state: FleetState, held: dict[str, int | None]) -> dict[str, int]:
    """Bytes of an upload connection opened without the offer, with it, and of the
    request and answer on it, at a counting relay."""
    offering = [False]
    runner = web.AppRunner(gateway_app(state, offering))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    relay = Counting(port)
    server = await asyncio.start_server(relay.handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    out: dict[str, int] = {}
    try:
        for offered in (False, True):
            offering[0] = offered
            relay.up = relay.down = 0
            gw = HttpGateway(
                GatewayEndpoint("tokyo", url, "satellite"),
                DEFAULT_LINKS["satellite"],
                SHIP,
                Secret("a-token-of-the-size-fleet-provision-makes-0123456789abcdef"),
            )
            await gw.holdings()
            opened = await _settle(relay)
            if offered:
                assert gw.config_offer is not None
                request = request_json(held, since=0)  # as the agent asks
                answer = await gw.fetch_config(request)
                out["request_payload_bytes"] = len(request)
                out["answer_payload_bytes"] = len(answer)
                out["exchange_bytes"] = await _settle(relay) - opened
            out["opened_with_offer" if offered else "opened_without_offer"] = opened
            await gw.close()
    finally:
        server.close()
        await runner.cleanup()
    out["hello_offer_bytes"] = out["opened_with_offer"] - out["opened_without_offer"]
    return out


def batch_answer_offer_bytes(state: FleetState) -> int:
    """What the gateway adds to its answer to a batch when the offer changed while the
    upload stays open (``json.dumps`` as aiohttp's ``send_json`` writes it), in the
    WebSocket frame's payload; nothing while it has not."""
    offer = offer_for(state, SHIP)
    assert offer is not None
    added = {"config": offer_json(offer), "registry": state.version}
    return len(json.dumps(added)) - 2 + len(", ")


def main() -> None:
    p = bench_parser("fleet_config.py", __doc__)
    p.add_argument("--alarms", type=int, default=20, help="alarm rules in the document")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        reg = Registry.init(Path(tmp) / "registry")
        reg.append([("ship_added", {"ship": SHIP, "groups": ["north"]})])
        for changed in (False, True):
            body = {
                "scope": "group",
                "name": "north",
                "format": "toml",
                "document": document(a.alarms, changed),
                "port_links_only": False,
            }
            reg.append([("config_set", body)])
        reg.refresh()
        state = reg.state
        first, second = sorted(state.config_lines)
        delta = asyncio.run(exchange(state, {"g:north": first}))
        full = asyncio.run(exchange(state, {"g:north": None}))
    change = delta["hello_offer_bytes"] + delta["exchange_bytes"]
    # TLS 1.3: 22 bytes a record (header 5, type 1, tag 16), one record a message;
    # TCP/IP: 52 bytes a segment (IPv4 20, TCP 20 + timestamps 12), one segment each
    # way for messages this small, and an ACK for each
    tls_tcp = 2 * 22 + 4 * 52
    out = {
        "document_bytes": len(document(a.alarms, True)),
        "entry_line_bytes": len(state.config_lines[second]),
        "versions": [first, second],
        "hello_offer_bytes": delta["hello_offer_bytes"],
        "request_payload_bytes": delta["request_payload_bytes"],
        "answer_payload_bytes": delta["answer_payload_bytes"],
        "exchange_bytes": delta["exchange_bytes"],
        "one_key_change_bytes": change,
        "tls_and_tcp_estimate_bytes": tls_tcp,
        "one_key_change_with_tls_tcp_bytes": change + tls_tcp,
        "goal_bytes": GOAL_BYTES,
        "within_goal": change + tls_tcp <= GOAL_BYTES,
        "full_fetch_bytes": full["hello_offer_bytes"] + full["exchange_bytes"],
        "offer_in_a_batch_answer_bytes": batch_answer_offer_bytes(state),
    }
    json.dump(out, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
