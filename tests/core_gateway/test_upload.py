"""The WebSocket upload (core_gateway/upload.py) against real Kafka: holdings first,
pipelined batches answered in order and written once, refusals that are answers (the
connection goes on), and the writer's rule that a batch built on a failed one fails."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from core_gateway import ingress
from core_gateway.auth import Credentials
from core_gateway.errors import KafkaWriteError
from core_gateway.ingress import IngressWriter, Write
from local_stack.kafka import KafkaBroker
from shorelink.ranges import RangeSet
from tests.core_gateway.helpers import (
    RunningGateway,
    assert_exactly_once,
    batch,
    gateway_config,
    ingress_seqs,
    records,
    start_gateway,
)
from tests.helpers import unique


async def _connect(
    s: aiohttp.ClientSession, gw: RunningGateway
) -> tuple[aiohttp.ClientWebSocketResponse, dict[str, Any]]:
    ws = await s.ws_connect(
        f"{gw.url}/v1/ships/{gw.ship}/upload",
        headers={"Authorization": f"Bearer {gw.token}"},
    )
    hello = json.loads((await ws.receive(timeout=10)).data)
    return ws, hello


async def _answer(ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
    msg = await ws.receive(timeout=30)
    assert msg.type is aiohttp.WSMsgType.TEXT, msg
    data = json.loads(msg.data)
    assert isinstance(data, dict)
    return data


async def test_upload_starts_with_holdings_and_pipelined_batches_are_written_once(
    gateway: RunningGateway, kafka: KafkaBroker
) -> None:
    """Twelve batches sent without waiting (one overlapping the one before, as a resend
    after a lost answer would): twelve answers in order, each seq in Kafka once."""
    async with aiohttp.ClientSession() as s:
        ws, hello = await _connect(s, gateway)
        assert hello == {
            "type": "holdings",
            "ship": gateway.ship,
            "site": "tokyo",
            "streams": {"alerts": "", "nav": "", "containers": ""},
        }
        ranges = [(100 * i + 1, 100 * i + 100) for i in range(10)]
        ranges.insert(5, (450, 520))  # overlaps 401-500 (maybe not committed yet) and 501-600
        ranges.append((990, 1010))
        for lo, hi in ranges:
            await ws.send_bytes(batch(gateway.ship, lo, hi))
        answers = [await _answer(ws) for _ in ranges]
        assert [(a["status"], a["first_seq"], a["last_seq"]) for a in answers] == [
            (200, lo, hi) for lo, hi in ranges
        ]
        assert answers[5]["written"] == "501-520"  # 450-500 were already on their way
        assert answers[6]["written"] == "521-600"
        assert answers[-1]["held"] == "1-1010"
        await ws.close()
        ws, hello = await _connect(s, gateway)
        assert hello["streams"]["containers"] == "1-1010"
        await ws.close()
    assert_exactly_once(kafka, gateway.ship, 1010)


async def test_upload_refusals_are_answers_and_the_connection_goes_on(
    gateway: RunningGateway, kafka: KafkaBroker
) -> None:
    other = "not-" + gateway.ship
    async with aiohttp.ClientSession() as s:
        ws, _ = await _connect(s, gateway)
        bad = [
            (batch(gateway.ship, 50, 60), 409, "gap"),
            (b"\x00" * 64, 400, "bad_magic"),
            (batch(other, 1, 5), 403, "wrong_origin"),
            (batch(gateway.ship, 1, 5, stream="weather"), 404, "unknown_stream"),
        ]
        for body, _, _ in bad:
            await ws.send_bytes(body)
        await ws.send_bytes(batch(gateway.ship, 1, 10))
        for _, status, code in bad:
            a = await _answer(ws)
            assert (a["status"], a["error"]) == (status, code), a
            assert a["message"]
        assert (await _answer(ws))["held"] == "1-10"
        gap = bad[0]
        await ws.send_bytes(gap[0])
        assert (await _answer(ws))["held"] == "1-10"  # a 409 says what the site holds
        await ws.send_str("hello?")  # batches are binary: the gateway closes
        msg = await ws.receive(timeout=10)
        assert msg.type is aiohttp.WSMsgType.CLOSE and ws.close_code == 1003
    assert_exactly_once(kafka, gateway.ship, 10)
    assert not ingress_seqs(kafka, other)


async def test_upload_of_a_revoked_ship_is_closed_and_cannot_open_again(
    gateway: RunningGateway, kafka: KafkaBroker
) -> None:
    """A connection opened before ``ships revoke`` is closed by the gateway (1008)
    within about a second, with nothing sent on it (review M2: it stayed open, its slot
    held, every batch answered 401), and no new connection opens."""
    async with aiohttp.ClientSession() as s:
        ws, _ = await _connect(s, gateway)
        await ws.send_bytes(batch(gateway.ship, 1, 10))
        assert (await _answer(ws))["status"] == 200
        Credentials(gateway.cfg.credentials_file).revoke(gateway.ship)
        msg = await ws.receive(timeout=15)
        assert (msg.type, msg.data) == (aiohttp.WSMsgType.CLOSE, 1008), msg
        async with s.get(
            f"{gateway.url}/v1/ships/{gateway.ship}/upload",
            headers={"Authorization": f"Bearer {gateway.token}"},
        ) as r:
            assert r.status == 401
    assert_exactly_once(kafka, gateway.ship, 10)


async def test_writer_refuses_a_write_built_on_one_that_was_not_written(
    tmp_path: Path, kafka: KafkaBroker
) -> None:
    """The rule that keeps a cursor honest under pipelining: a write admitted on top of
    seqs still being written is itself written only if those were."""
    cfg = gateway_config(tmp_path, kafka)
    writer = IngressWriter(cfg)
    await asyncio.to_thread(writer.ensure_topics)
    await asyncio.to_thread(writer.start)
    ship = unique("ship")
    try:
        orphan = Write(
            ship,
            "containers",
            records(11, 20),
            RangeSet([(11, 20)]),
            RangeSet(),
            depends=RangeSet([(1, 10)]),  # never written
        )
        with pytest.raises(KafkaWriteError, match="was not written"):
            await asyncio.wrap_future(writer.submit(orphan))
        first = Write(ship, "containers", records(1, 10), RangeSet([(1, 10)]), RangeSet())
        second = Write(
            ship,
            "containers",
            records(11, 20),
            RangeSet([(11, 20)]),
            RangeSet(),
            depends=RangeSet([(1, 10)]),
        )
        done = [writer.submit(first), writer.submit(second)]
        await asyncio.gather(*(asyncio.wrap_future(f) for f in done))
    finally:
        await asyncio.to_thread(writer.close)
    assert_exactly_once(kafka, ship, 20)


def _fifty(ship: str, lo: int) -> Write:
    """A bulk write of ``ship``'s seqs lo..lo+49, on top of its seqs before lo."""
    return Write(
        ship,
        "containers",
        records(lo, lo + 49),
        RangeSet([(lo, lo + 49)]),
        RangeSet(),
        depends=RangeSet([(1, lo - 1)]) if lo > 1 else RangeSet(),
    )


async def test_an_alert_is_written_ahead_of_every_bulk_write_waiting(
    tmp_path: Path, kafka: KafkaBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fleet's backlog queued at the writer (bench/fleet.py: 700 ships uploading at
    once put an alert 4-6 s behind it) does not hold an alert back: the alert goes into
    the next transaction, ahead of the bulk writes queued before it; each ship's own
    writes keep their order."""
    monkeypatch.setattr(ingress, "MAX_GROUP_RECORDS", 100)  # many transactions
    cfg = gateway_config(tmp_path, kafka)
    assert cfg.urgent_streams == ("alerts",)
    writer = IngressWriter(cfg)
    await asyncio.to_thread(writer.ensure_topics)
    await asyncio.to_thread(writer.start)
    ships = [unique("ship") for _ in range(3)]
    order: list[str] = []

    def submit(w: Write, name: str) -> Future[None]:
        w.done.add_done_callback(lambda _f: order.append(name))
        return writer.submit(w)

    bulk = [(_fifty(ship, lo), f"{ship}:{lo}") for lo in range(1, 501, 50) for ship in ships]
    alert = Write(ships[0], "alerts", records(1, 1), RangeSet([(1, 1)]), RangeSet())
    try:
        done = [submit(w, name) for w, name in bulk]
        written_before = len(order)  # the writer thread runs meanwhile (a loaded machine)
        done.append(submit(alert, "alert"))
        await asyncio.gather(*(asyncio.wrap_future(f) for f in done))
    finally:
        await asyncio.to_thread(writer.close)
    # 30 bulk writes of 50 records, two a transaction: the alert queued last is written
    # in the first transaction after the one under way when it came (at most two more
    # bulk writes, and two of a transaction begun as it was queued)
    assert order.index("alert") <= written_before + 4, order
    assert written_before < len(bulk), "the bulk was written before the alert came"
    for ship in ships:
        mine = [int(n.rsplit(":", 1)[1]) for n in order if n.startswith(ship + ":")]
        assert mine == sorted(mine)
        assert_exactly_once(kafka, ship, 500)
    assert ingress_seqs(kafka, ships[0], "alerts") == {1: 1}


async def test_an_alerts_transaction_carries_no_bulk_write(
    tmp_path: Path, kafka: KafkaBroker
) -> None:
    """The alert's transaction is small: a fleet's backlog waiting at the writer goes
    into the transactions after it, not into the alert's (at 700 ships that backlog
    was up to MAX_GROUP_RECORDS records, produced before the alert's commit)."""
    commits: list[tuple[int, int]] = []
    cfg = gateway_config(tmp_path, kafka)
    writer = IngressWriter(cfg, on_commit=lambda b, r, _s: commits.append((b, r)))
    await asyncio.to_thread(writer.ensure_topics)
    await asyncio.to_thread(writer.start)
    ship = unique("ship")
    alert_in: list[int] = []
    try:
        done = [writer.submit(_fifty(ship, lo)) for lo in range(1, 1001, 50)]
        alert = Write(ship, "alerts", records(1, 1), RangeSet([(1, 1)]), RangeSet())
        alert.done.add_done_callback(lambda _f: alert_in.append(len(commits) - 1))
        done.append(writer.submit(alert))
        await asyncio.gather(*(asyncio.wrap_future(f) for f in done))
    finally:
        await asyncio.to_thread(writer.close)
    assert commits[alert_in[0]] == (1, 1), commits
    assert sum(b for b, _ in commits) == 21
    assert_exactly_once(kafka, ship, 1000)


async def test_stopping_gateway_closes_uploads_and_writes_what_it_received(
    tmp_path: Path, kafka: KafkaBroker
) -> None:
    """A gateway told to stop does not wait for ships to hang up: it closes their upload
    connections (1001) and still commits the batches it had taken in."""
    cfg = gateway_config(tmp_path, kafka)
    ship = unique("ship")
    token = Credentials(cfg.credentials_file).add(ship)
    stop = asyncio.Event()
    task = await start_gateway(cfg, stop)
    gw = RunningGateway(cfg, f"http://127.0.0.1:{cfg.port}", ship, token)
    async with aiohttp.ClientSession() as s:
        ws, _ = await _connect(s, gw)
        for lo in range(1, 2001, 500):
            await ws.send_bytes(batch(ship, lo, lo + 499))
        assert (await _answer(ws))["status"] == 200
        stop.set()
        closing = await ws.receive(timeout=20)
        while closing.type is aiohttp.WSMsgType.TEXT:  # answers still on their way
            closing = await ws.receive(timeout=20)
        assert closing.type is aiohttp.WSMsgType.CLOSE and ws.close_code == 1001
    await asyncio.wait_for(task, 30)  # not the 60 s aiohttp would wait for handlers
    # what it had taken in is written once, without a gap (a batch still unread when
    # the connection closed is simply not taken: the ship resends it)
    seqs = ingress_seqs(kafka, ship)
    assert len(seqs) >= 500 and sorted(seqs) == list(range(1, len(seqs) + 1))
    assert max(seqs.values()) == 1
