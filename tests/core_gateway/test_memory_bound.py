"""The gateway's memory is bounded however many ships upload at once: a port where
twenty ships come into Wi-Fi range together must not have its gateway killed by the
OOM killer (every ship's uploads would then fail until it is back)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sys
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest

from core_gateway.auth import Credentials
from core_gateway.config import GatewayConfig, parse_config
from edge_agent.config import GatewayEndpoint, LinkConfig
from edge_agent.errors import LinkError
from edge_agent.gateway import HttpGateway
from local_stack.kafka import KafkaBroker
from local_stack.process import free_port
from shorelink.config import Secret
from shorelink.contract import H_ORIGIN, H_SEQ, ingress_topic
from shorelink.errors import ConfigError
from shorelink.kafka.reading import read_to_end
from shorelink.ranges import RangeSet
from shorelink.wire import Body, WireRecord, encode_body, frame_batch
from tests.core_gateway.helpers import (
    STREAMS,
    assert_exactly_once,
    batch,
    gateway_config,
    metrics_url,
    run_gateway,
    start_gateway,
    wait_ready,
)
from tests.helpers import unique, write_toml

#: eight batches of ~68 MiB charged each against the 128 MiB budget: one fits at a time,
#: so seven wait for it, as twenty would (twenty: 1.2 GB into Kafka, twice the time)
SHIPS = 8
RECORDS = 50_000  # limits.max_records
#: the documented bound (docs/gateway-api.md, "Memory") for the gateway process with
#: the default limits
RSS_BOUND = 1024 * 1024 * 1024


def _max_size_body() -> Body:
    """One batch body at the default limits' edge: 50,000 records, ~60 MiB decoded,
    ~7.5 MiB compressed (framed for each ship with its own origin)."""
    rnd = random.Random(7)
    words = [f"w{i:02d}" for i in range(12)]
    payloads = [
        json.dumps({"c": rnd.choices(words, k=300)}).encode()[:1250] for _ in range(RECORDS)
    ]
    records = tuple(
        WireRecord(
            seq,
            f"C{seq % 50}",
            1_700_000_000_000 + seq,
            f"ship/d1/containers/C{seq % 50}/env",
            payloads[seq % len(payloads)],
        )
        for seq in range(1, RECORDS + 1)
    )
    return encode_body(records, level=6)


def _vm_hwm(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for {pid}")


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


async def _ship(url: str, ship: str, token: str, body: bytes) -> tuple[int, int]:
    """What the edge agent's uplink does, on the real edge client: send, and on a
    retryable error (503 busy is one) back off and start again from the holdings.
    Returns (attempts, busy answers)."""
    gw = HttpGateway(
        GatewayEndpoint("tokyo", url, "port_wifi"),
        LinkConfig("port_wifi", timeout_s=120.0, in_flight=1),
        ship,
        Secret(token),
    )
    attempts = busy = 0
    delay = 0.1
    try:
        while True:
            attempts += 1
            try:
                held = (await gw.holdings()).get("containers", RangeSet())
                if held.contains_all(RangeSet([(1, RECORDS)])):
                    return attempts, busy
                await gw.send("containers", body)
            except LinkError as exc:
                busy += "busy" in str(exc)
                await gw.reset()
                await asyncio.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 1.5, 2.0)
            assert attempts < 200, f"{ship} never got its batch written"
    finally:
        await gw.close()


def _rss(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * 4096
    return total


async def _all_ships(
    url: str, ships: list[str], tokens: list[str], bodies: list[bytes]
) -> list[tuple[int, int]]:
    return await asyncio.gather(
        *(_ship(url, s, t, b) for s, t, b in zip(ships, tokens, bodies, strict=True))
    )


def test_ships_sending_max_size_batches_at_once_keep_the_gateway_under_its_bound(
    tmp_path: Path, kafka: KafkaBroker
) -> None:
    """Eight ships upload a maximum-size batch (limits.max_records, ~60 MiB decoded) at
    once over the real edge client to `shorelink-gateway run`: its peak RSS (VmHWM)
    stays under the documented bound, the batches that do not fit are answered 503
    busy, and every ship's batch is eventually written exactly once."""
    port, metrics_port = free_port(), free_port()
    creds = tmp_path / "ships.json"
    config = tmp_path / "gateway.toml"
    write_toml(
        config,
        {
            "site": "tokyo",
            "credentials_file": str(creds),
            "streams": list(STREAMS),
            "decode_workers": 0,
            "listen": {"host": "127.0.0.1", "port": port},
            "metrics": {"port": metrics_port},
            "kafka": {
                "bootstrap": kafka.bootstrap,
                "transactional_id": unique("gw"),
                "ingress_partitions": 2,
                "timeout": "30s",
            },
        },
    )
    ships = [unique(f"ship{i}") for i in range(SHIPS)]
    tokens = [Credentials(creds).add(s) for s in ships]
    body = _max_size_body()
    bodies = [frame_batch(s, "containers", body, 1) for s in ships]
    gateway_log = tmp_path / "gateway.log"
    gateway = run_gateway(config, gateway_log)
    url = f"http://127.0.0.1:{port}"
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.2):
            with contextlib.suppress(OSError):
                peak[0] = max(peak[0], _rss([gateway.pid, *_children(gateway.pid)]))

    sampler = threading.Thread(target=sample)
    try:
        wait_ready(gateway, port)
        sampler.start()
        t0 = time.monotonic()
        results = asyncio.run(_all_ships(url, ships, tokens, bodies))
        seconds = time.monotonic() - t0
        hwm = _vm_hwm(gateway.pid)
        workers = [_vm_hwm(pid) for pid in _children(gateway.pid)]
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics") as r:
            metrics = r.read().decode()
        assert gateway.alive(), "the gateway died"
    finally:
        done.set()
        if sampler.is_alive():
            sampler.join()
        gateway.stop(grace=60)
    busy = sum(b for _, b in results)
    refused_busy = sum(
        float(ln.split()[-1])
        for ln in metrics.splitlines()
        if ln.startswith("shorelink_gateway_rejected_batches_total") and 'reason="busy"' in ln
    )
    print(
        f"\n{SHIPS} ships x {len(bodies[0]) / 2**20:.1f} MiB ({RECORDS} records) in "
        f"{seconds:.1f}s: gateway VmHWM {hwm / 2**20:.0f} MiB, decode workers "
        f"{[round(v / 2**20) for v in workers]} MiB, sampled peak with workers "
        f"{peak[0] / 2**20:.0f} MiB, busy answers {busy} (gateway: {refused_busy:.0f}), attempts "
        f"{sum(a for a, _ in results)}",
        file=sys.stderr,
    )
    assert hwm < RSS_BOUND, f"gateway peaked at {hwm / 2**20:.0f} MiB"
    assert refused_busy > 0 and busy > 0, "the memory budget never refused a batch"
    # every batch written exactly once (read sl.ingress once, read_committed)
    counts: Counter[tuple[bytes, int]] = Counter()
    for m in read_to_end(kafka.endpoint, [ingress_topic("containers")], timeout=120, settled=True):
        h = dict(m.headers() or [])
        counts[(h[H_ORIGIN], int(h[H_SEQ]))] += 1
    for ship in ships:
        seqs = [n for (o, _), n in counts.items() if o == ship.encode()]
        assert len(seqs) == RECORDS and max(seqs) == 1, f"{ship}: not exactly once"


async def test_uploads_beyond_max_uploads_are_answered_busy_with_retry_after(
    tmp_path: Path, kafka: KafkaBroker
) -> None:
    """Each open upload can hold a batch being received: their number is bounded too."""
    cfg = replace(gateway_config(tmp_path, kafka), max_uploads=1, decode_workers=0)
    ship = unique("ship")
    token = Credentials(cfg.credentials_file).add(ship)
    stop = asyncio.Event()
    task = await start_gateway(cfg, stop)
    url = f"http://127.0.0.1:{cfg.port}/v1/ships/{ship}/upload"
    headers = {"Authorization": f"Bearer {token}"}
    try:
        async with aiohttp.ClientSession() as s:
            first = await s.ws_connect(url, headers=headers)
            assert (await first.receive_json())["type"] == "holdings"
            async with s.get(url, headers={**headers, "Upgrade": "websocket"}) as r:
                assert r.status == 503 and r.headers["Retry-After"] == "1"
                assert (await r.json())["error"] == "busy"
            await first.close()
            await asyncio.sleep(0.2)
            second = await s.ws_connect(url, headers=headers)  # a slot is free again
            assert (await second.receive_json())["type"] == "holdings"
            await second.close()
    finally:
        stop.set()
        await task


async def test_a_batch_holds_what_it_decodes_to_not_what_it_decompressed_to(
    tmp_path: Path, kafka: KafkaBroker
) -> None:
    """A templated body decompresses to a few KiB and decodes to 1.2 MB: the budget
    holds the 1.2 MB from the moment it is decoded. Three such batches at once against
    a 1 MiB budget: each goes only alone, the others are answered busy and sent again,
    and every one is written once (charged by their decompressed bytes, all three went
    at once)."""
    limits = {"max_batch_bytes": "256KiB", "max_inflight_bytes": "1MiB"}
    cfg = replace(gateway_config(tmp_path, kafka, **limits), decode_workers=0)
    credentials = Credentials(cfg.credentials_file)
    ships = [unique("ship") for _ in range(3)]
    tokens = {ship: credentials.add(ship) for ship in ships}
    pad = "x" * 3000

    def body(ship: str) -> bytes:
        recs = tuple(
            WireRecord(q, "C1", 1_700_000_000_000 + q, "t", f'{{"q":{q},"p":"{pad}"}}'.encode())
            for q in range(1, RECORDS_EACH + 1)
        )
        return frame_batch(ship, "containers", encode_body(recs), 1)

    bodies = {ship: body(ship) for ship in ships}
    stop = asyncio.Event()
    task = await start_gateway(cfg, stop)
    busy = 0
    try:
        async with aiohttp.ClientSession() as s:

            async def send(ship: str) -> None:
                nonlocal busy
                url = f"http://127.0.0.1:{cfg.port}/v1/ships/{ship}/streams/containers/batches"
                headers = {"Authorization": f"Bearer {tokens[ship]}"}
                for _ in range(60):  # bounded
                    async with s.post(url, data=bodies[ship], headers=headers) as r:
                        if r.status == 200:
                            return
                        assert (r.status, (await r.json())["error"]) == (503, "busy")
                        busy += 1
                        wait = float(r.headers["Retry-After"])
                    await asyncio.sleep(wait)  # as the edge agent does
                raise AssertionError(f"{ship}: busy 60 times")

            await asyncio.gather(*map(send, ships))
    finally:
        stop.set()
        await task
    assert busy >= 1, "three batches of 1.2 MB each went at once into a 1 MiB budget"
    for ship in ships:
        assert_exactly_once(kafka, ship, RECORDS_EACH)


#: records of each batch in the decoded-size test (3 KB payloads: 1.2 MB decoded)
RECORDS_EACH = 400


async def _headers_only(port: int, ship: str, token: str, size: int = 256 * 1024) -> int:
    """A POST of a ``size``-byte batch whose body never comes (a slow sender's): the
    status of the answer it gets, busy at once or cut at body_timeout once read."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"POST /v1/ships/{ship}/streams/containers/batches HTTP/1.1\r\nHost: gw\r\n"
        f"Authorization: Bearer {token}\r\nContent-Length: {size}\r\n\r\n".encode()
    )
    await writer.drain()
    status = int((await reader.readline()).split()[1])
    writer.close()
    return status


async def test_post_bodies_are_charged_to_the_budget_before_they_are_read(
    tmp_path: Path, kafka: KafkaBroker
) -> None:
    """Ten POSTs of the largest batch from ten ships, their bodies never sent, into a
    budget that holds four: four are read (and cut at body_timeout), six are answered
    busy at once, before a byte of their body is read (review M1: every one was read,
    however many). Then the budget is whole again: a batch goes."""
    limits = {"max_batch_bytes": "256KiB", "max_inflight_bytes": "1MiB"}
    cfg = replace(gateway_config(tmp_path, kafka, **limits), decode_workers=0)
    credentials = Credentials(cfg.credentials_file)
    tokens = {ship: credentials.add(ship) for ship in [unique("ship") for _ in range(10)]}
    stop = asyncio.Event()
    task = await start_gateway(cfg, stop)
    try:
        answers = await asyncio.gather(*(_headers_only(cfg.port, *t) for t in tokens.items()))
        assert Counter(answers) == Counter({503: 6, 408: 4})
        ship, token = next(iter(tokens.items()))
        url = f"http://127.0.0.1:{cfg.port}/v1/ships/{ship}/streams/containers/batches"
        async with (
            aiohttp.ClientSession() as s,
            s.post(url, data=batch(ship, 1, 10), headers={"Authorization": f"Bearer {token}"}) as r,
        ):
            assert r.status == 200
    finally:
        stop.set()
        await task


async def test_one_ship_holds_at_most_its_share_of_uploads_and_memory(
    tmp_path: Path, kafka: KafkaBroker
) -> None:
    """Review M2: one ship (a stolen token, a buggy client) could hold every upload
    slot and the whole budget. Now it holds at most ``max_uploads_per_ship``
    connections and half the budget besides the batch at hand, and another ship still
    connects and is read."""
    limits = {"max_batch_bytes": "256KiB", "max_inflight_bytes": "1MiB"}
    cfg = replace(
        gateway_config(tmp_path, kafka, **limits), max_uploads_per_ship=2, decode_workers=0
    )
    credentials = Credentials(cfg.credentials_file)
    greedy, other = unique("greedy"), unique("other")
    tokens = {greedy: credentials.add(greedy), other: credentials.add(other)}
    stop = asyncio.Event()
    task = await start_gateway(cfg, stop)
    try:
        async with aiohttp.ClientSession() as s:

            def upload(ship: str) -> tuple[str, dict[str, str]]:
                url = f"http://127.0.0.1:{cfg.port}/v1/ships/{ship}/upload"
                return url, {"Authorization": f"Bearer {tokens[ship]}"}

            async def connect(ship: str) -> aiohttp.ClientWebSocketResponse:
                url, headers = upload(ship)
                return await s.ws_connect(url, headers=headers)

            held = [await connect(greedy) for _ in range(2)]
            url, headers = upload(greedy)
            async with s.get(url, headers={**headers, "Upgrade": "websocket"}) as r:
                assert (r.status, (await r.json())["error"]) == (503, "busy")
            theirs = await connect(other)
            assert (await theirs.receive_json())["type"] == "holdings"
            await theirs.send_bytes(batch(other, 1, 10))
            assert (await theirs.receive_json(timeout=30))["status"] == 200
            for ws in [*held, theirs]:
                await ws.close()
        # four bodies of the greedy ship and one of the other at once: the budget holds
        # four, the greedy ship half of it (two); the other is read
        greedy_answers = [_headers_only(cfg.port, greedy, tokens[greedy]) for _ in range(4)]
        answers = await asyncio.gather(
            *greedy_answers, _headers_only(cfg.port, other, tokens[other])
        )
        assert Counter(answers[:4]) == Counter({408: 2, 503: 2}) and answers[4] == 408
    finally:
        stop.set()
        await task


def test_max_inflight_bytes_below_one_batch_names_the_field() -> None:
    data = {
        "site": "tokyo",
        "credentials_file": "ships.json",
        "streams": ["nav"],
        "kafka": {"bootstrap": "127.0.0.1:9092"},
        "limits": {"max_batch_bytes": "8MiB", "max_inflight_bytes": "1MiB"},
    }
    with pytest.raises(ConfigError) as exc:
        parse_config(data)
    assert exc.value.field == "limits.max_inflight_bytes"


def _empty_records(ship: str, first: int, count: int) -> bytes:
    """A batch of ``count`` records with empty keys, topics and payloads: a few hundred
    bytes on the wire, whatever ``count``."""
    recs = tuple(WireRecord(q, "", 1_700_000_000_000, "", b"") for q in range(first, first + count))
    return frame_batch(ship, "containers", encode_body(recs), first)


async def _metric(s: aiohttp.ClientSession, cfg: GatewayConfig, name: str) -> float:
    async with s.get(f"{metrics_url(cfg)}/metrics") as r:
        for line in (await r.text()).splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"no {name}")


async def _inflight_bytes(s: aiohttp.ClientSession, cfg: GatewayConfig) -> float:
    return await _metric(s, cfg, "shorelink_gateway_inflight_bytes")


async def _released(s: aiohttp.ClientSession, cfg: GatewayConfig) -> None:
    """Until nothing holds the budget (a held body's connection closed)."""
    for _ in range(1000):
        if await _inflight_bytes(s, cfg) == 0:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the budget was never released")


async def _hold_body(
    s: aiohttp.ClientSession, cfg: GatewayConfig, ship: str, token: str, size: int
) -> asyncio.StreamWriter:
    """A POST of ``size`` bytes announced and never sent, once the gateway charged it:
    it holds that much of the budget until its connection closes."""
    _, holder = await asyncio.open_connection("127.0.0.1", cfg.port)
    holder.write(
        f"POST /v1/ships/{ship}/streams/containers/batches HTTP/1.1\r\nHost: gw\r\n"
        f"Authorization: Bearer {token}\r\nContent-Length: {size}\r\n\r\n".encode()
    )
    await holder.drain()
    for _ in range(1000):  # until the gateway has taken the body's charge
        if await _inflight_bytes(s, cfg) >= size:
            return holder
        await asyncio.sleep(0.02)
    raise AssertionError("the body in progress was never charged")


async def test_a_batch_refused_for_what_it_decoded_to_is_not_decoded_again_to_be_refused(
    tmp_path: Path, kafka: KafkaBroker
) -> None:
    """A batch that decodes to 1.2 MB is refused busy once decoded while another
    ship's body holds part of a 1 MiB budget; sent again while that body still holds
    it, it is refused before decoding (charged what it decoded to), not decoded each
    time to be refused again: at 700 ships with a tenth docking, 50,000-record batches
    were decoded, refused and sent again in turn, and nothing was written for minutes.
    Once the budget is free it goes, decoded once more, written once."""
    limits = {"max_batch_bytes": "256KiB", "max_inflight_bytes": "1MiB"}
    cfg = replace(gateway_config(tmp_path, kafka, **limits), decode_workers=0, body_timeout_s=120.0)
    credentials = Credentials(cfg.credentials_file)
    ship, other = unique("ship"), unique("ship")
    token, other_token = credentials.add(ship), credentials.add(other)
    pad = "x" * 3000
    recs = tuple(
        WireRecord(q, "C1", 1_700_000_000_000 + q, "t", f'{{"q":{q},"p":"{pad}"}}'.encode())
        for q in range(1, RECORDS_EACH + 1)
    )
    body = frame_batch(ship, "containers", encode_body(recs), 1)
    url = f"http://127.0.0.1:{cfg.port}/v1/ships/{ship}/streams/containers/batches"
    headers = {"Authorization": f"Bearer {token}"}
    decoded_busy = "shorelink_gateway_decoded_busy_total"
    stop = asyncio.Event()
    task = await start_gateway(cfg, stop)
    try:
        async with aiohttp.ClientSession() as s:
            holder = await _hold_body(s, cfg, other, other_token, 256 * 1024)
            for _ in range(3):
                async with s.post(url, data=body, headers=headers) as r:
                    assert (r.status, (await r.json())["error"]) == (503, "busy")
            assert await _metric(s, cfg, decoded_busy) == 1, "decoded again to be refused"
            holder.close()
            await _released(s, cfg)
            async with s.post(url, data=body, headers=headers) as r:
                assert r.status == 200, await r.text()
            assert await _metric(s, cfg, decoded_busy) == 1
    finally:
        stop.set()
        await task
    assert_exactly_once(kafka, ship, RECORDS_EACH)


async def test_a_batch_of_empty_records_is_charged_for_its_records_not_its_bytes(
    tmp_path: Path, kafka: KafkaBroker
) -> None:
    """Review N3: 50,000 empty records are 115 bytes on the wire but hold megabytes
    decoded; charged by their bytes, one token's pipelined uploads held gigabytes
    against the 1 GiB the gateway promises. Now each record is charged
    (DECODE_RECORD_BYTES) from the header before decoding: with half of a ship's share
    held by a body in progress, a batch of 100 empty records goes and one of 2,000
    (640 KB charged, under 4 KiB on the wire) is answered busy; alone it goes."""
    limits = {"max_batch_bytes": "256KiB", "max_inflight_bytes": "1MiB"}
    cfg = replace(gateway_config(tmp_path, kafka, **limits), decode_workers=0, body_timeout_s=120.0)
    ship = unique("ship")
    token = Credentials(cfg.credentials_file).add(ship)
    url = f"http://127.0.0.1:{cfg.port}/v1/ships/{ship}/streams/containers/batches"
    headers = {"Authorization": f"Bearer {token}"}
    big = _empty_records(ship, 101, 2000)
    assert len(big) < 4096
    stop = asyncio.Event()
    task = await start_gateway(cfg, stop)
    try:
        async with aiohttp.ClientSession() as s:
            # a body of 256 KiB announced and never sent holds half the ship's share
            holder = await _hold_body(s, cfg, ship, token, 256 * 1024)
            async with s.post(url, data=_empty_records(ship, 1, 100), headers=headers) as r:
                assert r.status == 200, await r.text()
            async with s.post(url, data=big, headers=headers) as r:
                assert (r.status, (await r.json())["error"]) == (503, "busy")
            holder.close()
            await _released(s, cfg)
            async with s.post(url, data=big, headers=headers) as r:
                assert r.status == 200, await r.text()
    finally:
        stop.set()
        await task
    assert_exactly_once(kafka, ship, 2100)
