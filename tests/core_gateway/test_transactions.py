"""Kafka transaction errors handled as librdkafka defines them: a commit that times out
is retried (not aborted, not fatal), a fenced gateway stops for good without fencing
back, and the cursor is read only after the fence. Each of these, done wrong, writes a
ship's records twice or loses them."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest
from confluent_kafka import KafkaException, Producer

from core_gateway.auth import Credentials
from core_gateway.config import GatewayConfig
from core_gateway.ingress import IngressWriter, Write
from core_gateway.service import GatewayService
from local_stack.kafka import KafkaBroker
from local_stack.process import free_port
from shorelink.contract import GATEWAY_CURSOR_TOPIC, contract_headers, ingress_topic
from shorelink.kafka.reading import read_to_end
from shorelink.ledger import ledger_key
from shorelink.ranges import RangeSet
from tests.core_gateway.helpers import (
    assert_exactly_once,
    batch,
    gateway_config,
    ingress_seqs,
    metrics_url,
    start_gateway,
)
from tests.helpers import unique

#: a broker of its own: it is paused (SIGSTOP), which must not stall other tests
PAUSED_SITE = "txn-pause"


async def _post(
    s: aiohttp.ClientSession, cfg: GatewayConfig, ship: str, token: str, lo: int, hi: int
) -> tuple[int, dict[str, object]]:
    body = batch(ship, lo, hi)
    async with s.post(
        f"http://127.0.0.1:{cfg.port}/v1/ships/{ship}/streams/containers/batches",
        data=io.BytesIO(body),
        headers={
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/x-shorelink-batch",
            "Content-Length": str(len(body)),
        },
    ) as r:
        return r.status, await r.json()


async def _readyz(s: aiohttp.ClientSession, cfg: GatewayConfig) -> tuple[int, dict[str, object]]:
    async with s.get(f"http://127.0.0.1:{cfg.port}/readyz") as r:
        return r.status, await r.json()


async def _metric(s: aiohttp.ClientSession, cfg: GatewayConfig, name: str) -> float:
    async with s.get(f"{metrics_url(cfg)}/metrics") as r:
        text = await r.text()
    return sum(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith(name + " "))


async def test_commit_timing_out_while_kafka_is_paused_is_retried_and_written_once(
    tmp_path: Path, kafka_sites: Callable[..., dict[str, KafkaBroker]]
) -> None:
    """librdkafka: a commit that timed out goes on in the background and may only be
    retried; aborting it then conflicts (and used to stop the gateway). The broker is
    paused across the commit: the batch is answered 200 once Kafka is back, once."""
    broker = kafka_sites(PAUSED_SITE)[PAUSED_SITE]
    cfg = gateway_config(tmp_path, broker)
    cfg = replace(cfg, kafka=cfg.kafka.with_timeout(3.0), decode_workers=0)
    ship = unique("ship")
    token = Credentials(cfg.credentials_file).add(ship)
    stop = asyncio.Event()
    task = await start_gateway(cfg, stop)
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=90)) as s:
            assert (await _post(s, cfg, ship, token, 1, 100))[0] == 200
            broker.proc.pause()
            try:
                pending = asyncio.create_task(_post(s, cfg, ship, token, 101, 200))
                # longer than one commit timeout, shorter than the transaction timeout
                await asyncio.sleep(cfg.kafka.timeout_s * 1.6)
                assert not pending.done(), "answered while Kafka was paused"
            finally:
                broker.proc.resume()
            status, body = await pending
            assert status == 200, body
            assert body["written"] == "101-200"
            assert await _metric(s, cfg, "shorelink_gateway_kafka_retries_total") >= 1
            assert not task.done(), "the gateway stopped"
            assert (await _readyz(s, cfg))[0] == 200
            # the ship's resend (had it lost the answer) writes nothing new
            status, body = await _post(s, cfg, ship, token, 101, 200)
            assert (status, body["written"]) == (200, "")
    finally:
        broker.proc.resume()
        stop.set()
        await task
    assert_exactly_once(broker, ship, 200)


async def test_a_fenced_gateway_stops_accepting_and_never_fences_back(
    tmp_path: Path, kafka: KafkaBroker, caplog: pytest.LogCaptureFixture
) -> None:
    """Two gateways of one site (same transactional.id): the one started last takes
    over; the older one's commit fails, none of its records become visible, it answers
    503 not_ready saying it was fenced and keeps running without re-initialising (an
    exit would have its supervisor restart it, fencing the new one: a loop)."""
    caplog.set_level(logging.ERROR, logger="core_gateway.ingress")
    cfg_a = replace(gateway_config(tmp_path, kafka), decode_workers=0)
    cfg_b = replace(cfg_a, port=free_port(), metrics_port=free_port())
    ship = unique("ship")
    token = Credentials(cfg_a.credentials_file).add(ship)
    stop_a, stop_b = asyncio.Event(), asyncio.Event()
    task_a = await start_gateway(cfg_a, stop_a)
    task_b: asyncio.Task[None] | None = None
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
            assert (await _post(s, cfg_a, ship, token, 1, 50))[0] == 200
            task_b = await start_gateway(cfg_b, stop_b)  # fences A
            assert (await _readyz(s, cfg_b))[0] == 200
            status, body = await _post(s, cfg_a, ship, token, 51, 100)
            assert status == 503 and "fenced" in str(body["message"]), body
            assert 51 not in ingress_seqs(kafka, ship), "a fenced commit became visible"
            status, ready = await _readyz(s, cfg_a)
            assert status == 503 and "fenced" in str(ready.get("error")), ready
            status, body = await _post(s, cfg_a, ship, token, 51, 100)
            assert (status, body["error"]) == (503, "not_ready")
            assert "fenced" in str(body["message"])
            # B goes on writing; A never re-initialised (which would fence B)
            assert (await _post(s, cfg_b, ship, token, 51, 100))[0] == 200
            await asyncio.sleep(2)
            status, body = await _post(s, cfg_b, ship, token, 101, 150)
            assert status == 200, body
            assert (await _readyz(s, cfg_b))[0] == 200
            assert not task_a.done(), "the fenced gateway exited (its restart would fence B)"
            assert not task_b.done()
    finally:
        stop_a.set()
        stop_b.set()
        await task_a
        if task_b is not None:
            await task_b
    assert_exactly_once(kafka, ship, 150)
    fenced_logs = [r for r in caplog.records if "event=kafka_fenced" in r.getMessage()]
    assert len(fenced_logs) == 1, "the fence is logged once"


def _zombie(cfg: GatewayConfig, ship: str, committed: list[int], stop: threading.Event) -> None:
    """An older gateway of the site: commits one record and its cursor per
    transaction, as fast as it can, until it is fenced."""
    p = Producer(
        {"bootstrap.servers": cfg.kafka.bootstrap, "transactional.id": cfg.transactional_id}
    )
    p.init_transactions(20)
    seq = 0
    try:
        while not stop.is_set():
            seq += 1
            p.begin_transaction()
            p.produce(
                ingress_topic("containers"),
                key=b"C1",
                value=b"{}",
                headers=contract_headers(  # type: ignore[arg-type]
                    ship.encode(), b"containers", seq, 1, b"tokyo", b"t/C1"
                ),
            )
            cursor = json.dumps({"written": f"1-{seq}", "abandoned": ""}).encode()
            p.produce(GATEWAY_CURSOR_TOPIC, key=ledger_key(ship, "containers"), value=cursor)
            p.commit_transaction(20)
            committed.append(seq)
    except KafkaException:
        pass  # fenced


def _committed_cursor(cfg: GatewayConfig, ship: str) -> RangeSet:
    value = b'{"written": ""}'
    for m in read_to_end(cfg.kafka, [GATEWAY_CURSOR_TOPIC], settled=True):
        if m.key() == ledger_key(ship, "containers"):
            value = m.value() or value
    return RangeSet.parse(json.loads(value)["written"])


async def test_the_cursor_is_read_only_after_an_older_gateway_is_fenced(
    tmp_path: Path, kafka: KafkaBroker
) -> None:
    """Read before the fence, the cursor can miss a transaction the older gateway
    commits in between: the new gateway would then take those seqs again (twice in
    Kafka). Read after it, it holds everything the older one ever committed."""
    for _ in range(3):
        cfg = replace(gateway_config(tmp_path, kafka), decode_workers=0)
        IngressWriter(cfg).ensure_topics()
        ship = unique("ship")
        committed: list[int] = []
        stop = threading.Event()
        zombie = threading.Thread(target=_zombie, args=(cfg, ship, committed, stop))
        zombie.start()
        try:
            for _ in range(200):
                if len(committed) >= 3:
                    break
                await asyncio.sleep(0.05)
            assert committed, "the older gateway never committed"
            service = GatewayService(cfg)
            # before the fix the cursor read could not even finish while the older
            # gateway kept a transaction open (it was read before fencing it)
            await asyncio.wait_for(service.start(), 60)
            try:
                held = service.holdings.get(ship, "containers").written
                await asyncio.to_thread(zombie.join, 30)
                assert not zombie.is_alive(), "the older gateway was not fenced"
                assert held == _committed_cursor(cfg, ship), (
                    "the cursor was read before the fence: the older gateway committed behind it"
                )
            finally:
                await service.stop()
        finally:
            stop.set()
            zombie.join(30)


async def test_a_write_kafka_commits_before_its_reply_is_awaited_is_in_the_reply(
    tmp_path: Path, kafka: KafkaBroker
) -> None:
    """Under load the event loop's thread can be descheduled right after it queued a
    write, while the writer thread commits it: the write is then done before the reply
    is first awaited. The reply awaited it without yielding, ahead of the callback that
    adds it to the holdings, and said ``held`` without the batch (seen once in CI as
    1-4130 for a batch of 4131-4140). Played here by letting ``submit`` return only
    once Kafka committed: every reply names its own batch as held."""
    cfg = replace(gateway_config(tmp_path, kafka), decode_workers=0)
    ship = unique("ship")
    Credentials(cfg.credentials_file).add(ship)
    service = GatewayService(cfg)
    await asyncio.wait_for(service.start(), 60)
    submit = service.writer.submit

    def committed_first(write: Write) -> Future[None]:
        done = submit(write)
        with contextlib.suppress(Exception):
            done.result(timeout=30)  # the loop's thread waits as if descheduled
        return done

    service.writer.submit = committed_first  # type: ignore[method-assign]
    try:
        for lo in range(1, 31, 10):
            reply = await (await service.receive(ship, "containers", batch(ship, lo, lo + 9)))
            assert reply["held"] == f"1-{lo + 9}", reply
    finally:
        await service.stop()
    assert_exactly_once(kafka, ship, 30)
