"""Batches are decoded in worker processes: the same batch (or the same refusal) as
decoding in the gateway's own process, a worker that dies costs no request, a machine
without worker processes decodes in threads, small batches have workers of their own, never
behind a large one, and an urgent stream's small batch a thread of its own, never behind
bulk. Real processes, real Kafka for the
end-to-end case."""

from __future__ import annotations

import asyncio
import io
import os
import signal
from pathlib import Path

import aiohttp
import pytest

from core_gateway.auth import Credentials
from core_gateway.config import parse_config
from core_gateway.decoding import PROCESS_DECODE_BYTES, BatchDecoder
from local_stack.kafka import KafkaBroker
from shorelink.wire import (
    DEFAULT_LIMITS,
    Batch,
    Limits,
    WireError,
    WireRecord,
    decode_batch,
    encode_batch,
)
from shorelink.workers import MAX_BROKEN
from tests import wire_bombs
from tests.core_gateway.helpers import (
    assert_exactly_once,
    batch,
    gateway_config,
    start_gateway,
)
from tests.helpers import unique


def _large(ship: str, lo: int, hi: int) -> bytes:
    """A batch over PROCESS_DECODE_BYTES: payloads that do not compress."""
    recs = tuple(
        WireRecord(
            seq,
            f"C{seq % 7}",
            1_700_000_000_000 + seq,
            f"{ship}/d1/c/C{seq % 7}/env",
            os.urandom(200),
        )
        for seq in range(lo, hi + 1)
    )
    body = encode_batch(Batch(ship, "containers", recs, first_available=lo))
    assert len(body) >= PROCESS_DECODE_BYTES
    return body


def _flip(data: bytes, index: int) -> bytes:
    return data[:index] + bytes([data[index] ^ 0x55]) + data[index + 1 :]


async def test_worker_decodes_exactly_what_the_process_would() -> None:
    body = _large("bigblue", 11, 600)
    decoder = BatchDecoder(DEFAULT_LIMITS, workers=1)
    try:
        got = await decoder.decode(body)
        assert decoder.pids(), "a large batch goes to a worker process"
        assert got == decode_batch(body)
        assert (got.first_seq, got.last_seq, got.first_available) == (11, 600, 11)
    finally:
        decoder.close()


@pytest.mark.parametrize("workers", [1, 0])
async def test_refusals_are_the_same_from_a_worker(workers: int) -> None:
    body = _large("bigblue", 1, 500)
    limits = Limits(max_records=400)
    decoder = BatchDecoder(DEFAULT_LIMITS, workers=workers)
    strict = BatchDecoder(limits, workers=workers)
    try:
        for bad, reason in [
            (_flip(body, len(body) - 5), "bad_checksum"),
            (body[:-1] + b"", "truncated"),
        ]:
            with pytest.raises(WireError) as local:
                decode_batch(bad)
            with pytest.raises(WireError) as remote:
                await decoder.decode(bad)
            assert remote.value.reason == local.value.reason == reason
            assert str(remote.value) == str(local.value)
        with pytest.raises(WireError) as too_many:
            await strict.decode(body)
        assert too_many.value.reason == "too_many_records"
        assert bool(decoder.pids()) is bool(workers)
    finally:
        decoder.close()
        strict.close()


async def test_an_urgent_batch_is_decoded_while_the_workers_decode_bulk() -> None:
    """A small batch of a bulk stream goes to a worker process, out of the gateway's
    GIL; a small urgent one is decoded in its own thread at once, however many bulk
    batches wait for the workers."""
    decoder = BatchDecoder(DEFAULT_LIMITS, workers=1)
    small = encode_batch(Batch("bigblue", "containers", (WireRecord(1, "C1", 1, "t", b"{}"),)))
    alert = encode_batch(Batch("bigblue", "alerts", (WireRecord(1, "C1", 1, "t", b"{}"),)))
    try:
        assert (await decoder.decode(small)).last_seq == 1
        assert decoder.small.pids(), "a small bulk batch goes to a worker too"
        bulk = [
            asyncio.ensure_future(decoder.decode(_large("bigblue", 1 + 2000 * i, 2000 * (i + 1))))
            for i in range(8)
        ]
        await asyncio.sleep(0)  # queued at the worker
        got, _ = await decoder.decode_proved(alert, None, urgent=True)
        waiting = sum(not b.done() for b in bulk)
        assert got == decode_batch(alert)
        assert waiting >= 4, f"the alert waited for {8 - waiting} of 8 bulk batches"
        assert [b.last_seq for b in await asyncio.gather(*bulk)] == [
            2000 * (i + 1) for i in range(8)
        ]
    finally:
        decoder.close()


async def test_a_worker_that_dies_costs_no_batch() -> None:
    decoder = BatchDecoder(DEFAULT_LIMITS, workers=1)
    try:
        first = _large("bigblue", 1, 400)
        assert (await decoder.decode(first)).last_seq == 400
        (pid,) = decoder.pids()
        os.kill(pid, signal.SIGKILL)
        await asyncio.sleep(0.2)
        second = _large("bigblue", 401, 800)
        assert await decoder.decode(second) == decode_batch(second)  # decoded in a thread
        third = _large("bigblue", 801, 1200)
        assert await decoder.decode(third) == decode_batch(third)
        assert decoder.pids() and pid not in decoder.pids(), "a new worker replaced it"
    finally:
        decoder.close()


async def test_no_worker_processes_falls_back_to_threads(tmp_path: Path) -> None:
    """Where no worker can start (here: the worker's interpreter is missing, so every
    new worker dies at once), the gateway still decodes every batch, and after
    MAX_BROKEN tries in threads only."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    python = multiprocessing.spawn.get_executable()
    decoder = BatchDecoder(DEFAULT_LIMITS, workers=1)
    ctx.set_executable(str(tmp_path / "no-such-python"))
    try:
        for i in range(MAX_BROKEN + 1):
            body = _large("bigblue", 1 + 400 * i, 400 * (i + 1))
            assert await decoder.decode(body) == decode_batch(body)
        assert decoder.pool.workers == 0 and not decoder.pids()
    finally:
        ctx.set_executable(python)
        decoder.close()


def test_decode_workers_config() -> None:
    base = {
        "site": "tokyo",
        "credentials_file": "ships.json",
        "streams": ["containers"],
        "kafka": {"bootstrap": "127.0.0.1:9092"},
    }
    assert parse_config(base).decode_workers == 1
    assert parse_config({**base, "decode_workers": 0}).decode_workers == 0
    with pytest.raises(Exception, match="decode_workers"):
        parse_config({**base, "decode_workers": -1})


async def test_large_batches_through_the_gateway_exactly_once(
    tmp_path: Path, kafka: KafkaBroker
) -> None:
    """End to end: large batches (decoded by the worker) are written once; a corrupt
    one is refused with the same answer as a small one; the gateway keeps serving."""
    cfg = gateway_config(tmp_path, kafka)
    assert cfg.decode_workers == 1
    ship = unique("ship")
    token = Credentials(cfg.credentials_file).add(ship)
    stop = asyncio.Event()
    task = await start_gateway(cfg, stop)
    url = f"http://127.0.0.1:{cfg.port}/v1/ships/{ship}/streams/containers/batches"
    headers = {"Authorization": f"Bearer {token}"}
    try:
        async with aiohttp.ClientSession() as s:

            async def post(body: bytes) -> tuple[int, dict[str, object]]:
                async with s.post(url, data=io.BytesIO(body), headers=headers) as r:
                    return r.status, await r.json()

            first, second = _large(ship, 1, 400), _large(ship, 401, 800)
            assert (await post(_flip(second, len(second) - 9)))[1]["error"] == "bad_checksum"
            st, out = await post(first)
            assert (st, out["held"]) == (200, "1-400")
            assert (await post(first))[1]["written"] == ""  # a resend: not written again
            st, out = await post(second)
            assert (st, out["held"]) == (200, "1-800")
    finally:
        stop.set()
        await task
    assert_exactly_once(kafka, ship, 800)


async def test_a_batch_that_decompresses_to_the_limit_is_refused_while_other_ships_write(
    tmp_path: Path, kafka: KafkaBroker
) -> None:
    """The security review's H1 batch at full size: a body of a few KiB whose 1,300
    number columns decompress to 64 MiB. It is decoded away from the event loop (it
    used to be decoded in place, stalling every ship for tens of seconds while it took
    gigabytes), refused as too large, and another ship's batches are answered, and
    written once, while it decodes."""
    cfg = gateway_config(tmp_path, kafka)
    bomber, ship = unique("bomber"), unique("ship")
    credentials = Credentials(cfg.credentials_file)
    tokens = {bomber: credentials.add(bomber), ship: credentials.add(ship)}
    raw = wire_bombs.number_columns(1300)
    bomb = wire_bombs.batch(raw, 50_000, origin=bomber)
    assert len(bomb) < 16 * 1024 and len(raw) <= DEFAULT_LIMITS.max_decompressed_bytes
    stop = asyncio.Event()
    task = await start_gateway(cfg, stop)
    base = f"http://127.0.0.1:{cfg.port}/v1/ships"
    seq = 1
    try:
        async with aiohttp.ClientSession() as s:

            async def post(who: str, body: bytes) -> tuple[int, dict[str, object]]:
                url = f"{base}/{who}/streams/containers/batches"
                headers = {"Authorization": f"Bearer {tokens[who]}"}
                async with s.post(url, data=io.BytesIO(body), headers=headers) as r:
                    return r.status, await r.json()

            refused = asyncio.create_task(post(bomber, bomb))
            answered = 0
            while not refused.done() and seq < 5000:  # bounded: 500 batches at most
                st, out = await post(ship, batch(ship, seq, seq + 9))
                assert (st, out["held"]) == (200, f"1-{seq + 9}")
                seq += 10
                answered += 0 if refused.done() else 1
            st, out = await refused
            assert (st, out["error"]) == (413, "decompressed_too_large")
            assert answered >= 3, f"only {answered} answers to another ship while it decoded"
    finally:
        stop.set()
        await task
    assert_exactly_once(kafka, ship, seq - 1)
