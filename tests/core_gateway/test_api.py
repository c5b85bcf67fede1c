"""The gateway against real Kafka: exactly once into sl.ingress, clear refusals that
write nothing, holdings that include replication."""

from __future__ import annotations

import asyncio
import contextlib
import io
import zlib
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest
from confluent_kafka import Producer

from core_gateway.auth import Credentials
from local_stack.kafka import KafkaBroker
from shorelink.contract import H_MQTT_TOPIC, H_SITE, H_STREAM, H_TS, LEDGER_TOPIC, ingress_topic
from shorelink.kafka.reading import read_to_end
from shorelink.kafka.topics import TopicSpec, ensure_topics
from shorelink.ledger import encode_entry
from shorelink.ranges import RangeSet
from shorelink.wire import WireRecord
from tests.core_gateway.helpers import (
    RunningGateway,
    assert_exactly_once,
    batch,
    gateway_config,
    ingress_seqs,
    records,
    settled_ingress_seqs,
    start_gateway,
)
from tests.helpers import build_info_line, unique
from tests.shorelink.test_contract import crafted_batch


async def _post(
    s: aiohttp.ClientSession,
    gw: RunningGateway,
    body: bytes,
    *,
    stream: str = "containers",
    ship: str | None = None,
    token: str | None = None,
) -> tuple[int, dict[str, object]]:
    url = f"{gw.url}/v1/ships/{ship or gw.ship}/streams/{stream}/batches"
    async with s.post(
        url, data=io.BytesIO(body), headers={**gw.headers(token), "Content-Length": str(len(body))}
    ) as r:
        return r.status, await r.json()


async def test_batches_are_written_once_with_the_record_contract(
    gateway: RunningGateway, kafka: KafkaBroker
) -> None:
    """A batch retried after a lost reply, or overlapping an earlier one, must not double
    an identity in sl.ingress."""
    async with aiohttp.ClientSession() as s:
        st, body = await _post(s, gateway, batch(gateway.ship, 1, 100))
        assert (st, body["held"], body["written"]) == (200, "1-100", "1-100")
        st, body = await _post(s, gateway, batch(gateway.ship, 1, 100))  # lost reply: resend
        assert (st, body["written"]) == (200, "")
        st, body = await _post(s, gateway, batch(gateway.ship, 51, 150))  # overlap
        assert (st, body["held"], body["written"]) == (200, "1-150", "101-150")
        async with s.get(
            f"{gateway.url}/v1/ships/{gateway.ship}/holdings", headers=gateway.headers()
        ) as r:
            assert (await r.json())["streams"] == {"alerts": "", "nav": "", "containers": "1-150"}
    seqs = settled_ingress_seqs(kafka, gateway.ship, range(1, 151))
    assert sorted(seqs) == list(range(1, 151)) and set(seqs.values()) == {1}
    msg = next(
        m
        for m in read_to_end(kafka.endpoint, [ingress_topic("containers")], settled=True)
        if dict(m.headers() or []).get("sl.origin") == gateway.ship.encode()
        and dict(m.headers() or [])["sl.seq"] == b"1"
    )
    h = dict(msg.headers() or [])
    rec = records(1, 1)[0]
    assert (msg.key(), msg.value()) == (rec.key.encode(), rec.payload)
    assert (h[H_STREAM], h[H_SITE], h[H_TS], h[H_MQTT_TOPIC]) == (
        b"containers",
        b"tokyo",
        str(rec.ts_ms).encode(),
        rec.topic.encode(),
    )


async def test_batch_beyond_holdings_gets_409_with_holdings(
    gateway: RunningGateway, kafka: KafkaBroker
) -> None:
    async with aiohttp.ClientSession() as s:
        await _post(s, gateway, batch(gateway.ship, 1, 10))
        st, body = await _post(s, gateway, batch(gateway.ship, 20, 30))
        assert (st, body["error"], body["held"]) == (409, "gap", "1-10")
    assert_exactly_once(kafka, gateway.ship, 10)


async def test_auth_failures_write_nothing(gateway: RunningGateway, kafka: KafkaBroker) -> None:
    other = unique("ship")
    other_token = Credentials(gateway.cfg.credentials_file).add(other)
    async with aiohttp.ClientSession() as s:
        url = f"{gateway.url}/v1/ships/{gateway.ship}/streams/containers/batches"
        async with s.post(url, data=batch(gateway.ship, 1, 5)) as r:
            assert (r.status, (await r.json())["error"]) == (401, "unauthorized")
        assert (await _post(s, gateway, batch(gateway.ship, 1, 5), token="slk_wrong"))[0] == 401
        # another ship's token on this ship's URL: refused, without saying whose it is
        st, body = await _post(s, gateway, batch(gateway.ship, 1, 5), token=other_token)
        assert st == 403 and other not in str(body)
        # this ship's token, but a batch claiming another origin
        st, body = await _post(s, gateway, batch(other, 1, 5))
        assert (st, body["error"]) == (403, "wrong_origin")
        # revoked: refused within a second
        Credentials(gateway.cfg.credentials_file).revoke(other)
        await asyncio.sleep(1.1)
        assert (await _post(s, gateway, batch(other, 1, 5), ship=other, token=other_token))[
            0
        ] == 401
    assert ingress_seqs(kafka, gateway.ship) == {} and ingress_seqs(kafka, other) == {}


def _flip(data: bytes, index: int) -> bytes:
    return data[:index] + bytes([data[index] ^ 0x55]) + data[index + 1 :]


async def test_bad_batches_get_4xx_write_nothing_and_the_gateway_keeps_serving(
    gateway: RunningGateway, kafka: KafkaBroker
) -> None:
    good = batch(gateway.ship, 1, 50)
    bomb_payload = b"\0" * 80_000_000
    cases: list[tuple[bytes, str, int, str]] = [
        (_flip(good, len(good) - 3), "containers", 400, "bad_checksum"),
        (b"NOPE" + good[4:], "containers", 400, "bad_magic"),
        (good[:20], "containers", 400, "truncated"),
        (b"", "containers", 400, "truncated"),
        (good, "weather", 404, "unknown_stream"),
        (good, "nav", 400, "stream_mismatch"),
        (
            # framed without the encoder's checks (it refuses such a record), as a
            # hostile ship could: the decoded-size budget refuses it before the record
            # size check would
            crafted_batch(gateway.ship, "containers", (WireRecord(1, "k", 1, "t", bomb_payload),)),
            "containers",
            413,
            "decompressed_too_large",
        ),
    ]
    async with aiohttp.ClientSession() as s:
        for body, stream, status, code in cases:
            st, out = await _post(s, gateway, body, stream=stream)
            assert (st, out["error"]) == (status, code), code
        # over the compressed size limit, by Content-Length, before reading the body
        big = zlib.compress(b"x") * 1
        st, out = await _post(s, gateway, big + b"\0" * (9 * 1024 * 1024))
        assert (st, out["error"]) == (413, "too_large")
        async with s.get(gateway.metrics_url + "/metrics") as r:
            metrics = await r.text()
        assert 'shorelink_gateway_rejected_batches_total{reason="bad_checksum"} 1.0' in metrics
        # the process's own figures, as every exporter has them; a count is a counter
        assert "process_resident_memory_bytes" in metrics and "process_open_fds" in metrics
        assert build_info_line("gateway") in metrics  # and the build it runs
        assert "# TYPE shorelink_gateway_kafka_retries_total counter" in metrics
        # still serving, and the good batch goes through
        assert (await _post(s, gateway, good))[0] == 200
    assert_exactly_once(kafka, gateway.ship, 50)


async def test_slow_body_is_cut_with_408(gateway: RunningGateway) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", gateway.cfg.port)
    head = (
        f"POST /v1/ships/{gateway.ship}/streams/containers/batches HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {gateway.token}\r\nContent-Length: 1000\r\n\r\n"
    )
    writer.write(head.encode() + b"SLB")
    await writer.drain()
    status_line = await asyncio.wait_for(reader.readline(), 10)  # body_timeout is 2 s
    assert b" 408 " in status_line
    writer.close()


async def test_a_peer_that_dribbles_header_bytes_is_cut_at_the_idle_timeout(
    tmp_path: Path, kafka: KafkaBroker
) -> None:
    """Review M3: a connection that never completes its headers (a byte now and then,
    a slowloris) was held for aiohttp's default hour; now for ``listen.idle_timeout``
    from when it opened, however it dribbles. A ship is served meanwhile."""
    cfg = replace(gateway_config(tmp_path, kafka), idle_timeout_s=1.0)
    ship = unique("ship")
    token = Credentials(cfg.credentials_file).add(ship)
    stop = asyncio.Event()
    task = await start_gateway(cfg, stop)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", cfg.port)
        writer.write(b"POST /v1/ships/")
        cut = False
        for _ in range(100):  # a byte every 0.1 s, for ten seconds at most
            with contextlib.suppress(ConnectionError):
                writer.write(b"x")
                await writer.drain()
            with contextlib.suppress(TimeoutError):
                if await asyncio.wait_for(reader.read(1024), 0.1) == b"":
                    cut = True
                    break
        writer.close()
        assert cut, "a connection dribbling header bytes was still open after 10 s"
        gw = RunningGateway(cfg, f"http://127.0.0.1:{cfg.port}", ship, token)
        async with aiohttp.ClientSession() as s:
            assert (await _post(s, gw, batch(ship, 1, 5)))[0] == 200
    finally:
        stop.set()
        await task


async def test_connections_past_the_limit_are_closed_and_a_freed_one_is_taken(
    tmp_path: Path, kafka: KafkaBroker
) -> None:
    """Review M3: no bound on open connections (each a file descriptor). With
    ``listen.max_connections`` 4, four silent connections are held, a fifth is closed
    at once (counted), and once one of the four goes a ship is served."""
    cfg = replace(gateway_config(tmp_path, kafka), max_connections=4, idle_timeout_s=60.0)
    ship = unique("ship")
    token = Credentials(cfg.credentials_file).add(ship)
    stop = asyncio.Event()
    task = await start_gateway(cfg, stop)
    held: list[asyncio.StreamWriter] = []
    try:
        for _ in range(4):
            held.append((await asyncio.open_connection("127.0.0.1", cfg.port))[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", cfg.port)
        assert await asyncio.wait_for(reader.read(1024), 10) == b"", "not closed at once"
        writer.close()
        held.pop().close()
        gw = RunningGateway(cfg, f"http://127.0.0.1:{cfg.port}", ship, token)
        async with aiohttp.ClientSession() as s:
            status = 0
            for _ in range(100):  # until the server has seen the freed one go
                with contextlib.suppress(aiohttp.ClientConnectionError):
                    status = (await _post(s, gw, batch(ship, 1, 5)))[0]
                    break
                await asyncio.sleep(0.1)
            assert status == 200
            async with s.get(f"{gw.metrics_url}/metrics") as r:
                text = await r.text()
        (line,) = [ln for ln in text.splitlines() if ln.startswith(REFUSED)]
        assert float(line.split()[1]) >= 1
    finally:
        for w in held:
            w.close()
        stop.set()
        await task


async def test_a_flood_of_readiness_probes_asks_kafka_about_once_a_second(
    gateway: RunningGateway,
) -> None:
    """Review L6: every ``/readyz`` (unauthenticated) was a Kafka metadata call in the
    thread pool. 200 probes at once are all answered, and Kafka is asked once or twice
    (once a second at most, one question in flight, its answer shared)."""

    async def checks(s: aiohttp.ClientSession) -> float:
        async with s.get(f"{gateway.metrics_url}/metrics") as r:
            text = await r.text()
        (line,) = [ln for ln in text.splitlines() if ln.startswith(READINESS_CHECKS)]
        return float(line.split()[1])

    async with aiohttp.ClientSession() as s:
        before = await checks(s)

        async def probe() -> int:
            async with s.get(f"{gateway.url}/readyz") as r:
                return r.status

        statuses = await asyncio.gather(*(probe() for _ in range(200)))
        after = await checks(s)
    assert statuses == [200] * 200
    assert 0 <= after - before <= 2, f"{after - before:.0f} Kafka checks for 200 probes"


READINESS_CHECKS = "shorelink_gateway_readiness_checks_total "
REFUSED = "shorelink_gateway_connections_refused_total "


async def test_holdings_include_the_ledger_and_first_available_abandons_dropped_seqs(
    gateway: RunningGateway, kafka: KafkaBroker
) -> None:
    """A port that already has a ship's records by replication must not be sent them again."""
    ensure_topics(kafka.endpoint, [TopicSpec(LEDGER_TOPIC, compacted=True)])
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    k, v = encode_entry(gateway.ship, "nav", RangeSet.parse("1-300"))
    p.produce(LEDGER_TOPIC, key=k, value=v)
    p.flush(10)
    async with aiohttp.ClientSession() as s:
        for _ in range(100):
            async with s.get(
                f"{gateway.url}/v1/ships/{gateway.ship}/holdings", headers=gateway.headers()
            ) as r:
                if (await r.json())["streams"]["nav"] == "1-300":
                    break
            await asyncio.sleep(0.1)
        else:
            pytest.fail("ledger never reached the holdings")
        st, body = await _post(
            s, gateway, batch(gateway.ship, 301, 310, stream="nav"), stream="nav"
        )
        assert (st, body["held"], body["written"]) == (200, "1-310", "301-310")
        # the ship dropped 1-40 of containers on board: it says so with first_available
        st, body = await _post(s, gateway, batch(gateway.ship, 41, 60, first_available=41))
        assert (st, body["held"]) == (200, "41-60")
        st, body = await _post(s, gateway, batch(gateway.ship, 61, 70, first_available=41))
        assert (st, body["held"]) == (200, "41-70")
    nav = settled_ingress_seqs(kafka, gateway.ship, range(301, 311), "nav")
    assert sorted(nav) == list(range(301, 311))


async def test_metrics_and_probes_are_on_their_own_listener_not_the_ships_port(
    gateway: RunningGateway,
) -> None:
    """Review (ecosystem, 7): ``/metrics`` was served, unauthenticated, on the port
    ships reach from outside. The ships' port now answers it 404 with where it went; the
    metrics listener serves it with the probes, and none of the ships' routes."""
    async with aiohttp.ClientSession() as s:
        async with s.get(gateway.url + "/metrics") as r:
            assert r.status == 404
            said = await r.json()
            assert said["error"] == "not_found" and "[metrics]" in said["message"]
        async with s.get(gateway.metrics_url + "/metrics") as r:
            assert r.status == 200
            assert "shorelink_gateway_requests_total" in await r.text()
        for path in ("/healthz", "/readyz"):
            async with s.get(gateway.metrics_url + path) as r:
                assert r.status == 200, path
        async with s.get(f"{gateway.metrics_url}/v1/ships/{gateway.ship}/holdings") as r:
            assert r.status == 404
        # the ships' port keeps its probes (the image's HEALTHCHECK, a load balancer)
        async with s.get(gateway.url + "/healthz") as r:
            assert r.status == 200


async def test_metrics_stay_on_the_ships_port_only_when_the_config_says_so(
    tmp_path: Path, kafka: KafkaBroker
) -> None:
    """An operator upgrading can keep scraping the ships' port for a while
    (``metrics.on_ships_port``), here with the metrics listener off (port 0)."""
    cfg = replace(gateway_config(tmp_path, kafka), metrics_on_ships_port=True, metrics_port=0)
    stop = asyncio.Event()
    task = await start_gateway(cfg, stop)
    try:
        async with (
            aiohttp.ClientSession() as s,
            s.get(f"http://127.0.0.1:{cfg.port}/metrics") as r,
        ):
            assert r.status == 200
            assert "shorelink_gateway_requests_total" in await r.text()
    finally:
        stop.set()
        await task
