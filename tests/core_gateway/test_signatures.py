"""A ship that signs (shorelink/proof.py) against a real gateway and real Kafka: its
signed batches are written with a ``sl.proof`` per record that proves the record alone
at any site; a batch not signed, signed by another key, or changed after signing is
refused (403, named) and writes nothing; with ``require_signatures`` a ship without a
key is refused; a ship's key added to the file is taken without a restart; a large
batch is proved in a decode worker exactly as a small one in a thread."""

from __future__ import annotations

import asyncio
import io
import zlib
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest

from core_gateway.auth import Credentials
from local_stack.kafka import KafkaBroker
from shorelink.contract import H_PROOF, Record, ingress_topic
from shorelink.kafka.reading import read_to_end
from shorelink.proof import ShipKey, ShipKeys
from shorelink.wire import FLAG_SIGNED, Batch, encode_batch, peek_header
from tests.core_gateway.helpers import (
    RunningGateway,
    gateway_config,
    records,
    settled_ingress_seqs,
    start_gateway,
)
from tests.helpers import unique

KEY = ShipKey.generate()


@pytest.fixture
async def signing_gateway(
    tmp_path: Path, kafka: KafkaBroker
) -> AsyncIterator[tuple[RunningGateway, Path]]:
    ship = unique("ship")
    keys_file = tmp_path / "ship_keys.toml"
    keys_file.write_text(ShipKeys.render({ship: KEY.public()}, require_signatures=False))
    cfg = replace(gateway_config(tmp_path, kafka), ship_keys_file=keys_file)
    token = Credentials(cfg.credentials_file).add(ship)
    stop = asyncio.Event()
    task = await start_gateway(cfg, stop)
    yield RunningGateway(cfg, f"http://127.0.0.1:{cfg.port}", ship, token), keys_file
    stop.set()
    await task


async def _post(
    s: aiohttp.ClientSession, gw: RunningGateway, body: bytes, ship: str | None = None
) -> tuple[int, dict[str, object]]:
    url = f"{gw.url}/v1/ships/{ship or gw.ship}/streams/containers/batches"
    async with s.post(url, data=io.BytesIO(body), headers=gw.headers()) as r:
        return r.status, await r.json()


def _splice(signed: bytes, forged: bytes) -> bytes:
    """``forged``'s records under ``signed``'s signatures, with a valid CRC: what a
    hostile site that took a genuine batch could send on."""
    sh, fh = peek_header(signed), peek_header(forged)
    names = signed[40 : sh.header_len]  # origin, stream, signatures
    fixed = bytearray(forged[:40])
    fixed[5] = fh.flags | FLAG_SIGNED
    crc = zlib.crc32(forged[fh.header_len :], zlib.crc32(names, zlib.crc32(bytes(fixed[:36]))))
    fixed[36:40] = crc.to_bytes(4, "little")
    return bytes(fixed) + names + forged[fh.header_len :]


def _signed(ship: str, lo: int, hi: int, key: ShipKey = KEY) -> bytes:
    return encode_batch(Batch(ship, "containers", records(lo, hi)), key=key)


async def test_signed_batches_carry_a_proof_per_record_and_forgeries_are_refused(
    signing_gateway: tuple[RunningGateway, Path], kafka: KafkaBroker
) -> None:
    gw, keys_file = signing_gateway
    keys = ShipKeys.load(keys_file)
    async with aiohttp.ClientSession() as s:
        st, body = await _post(s, gw, _signed(gw.ship, 1, 70))
        assert (st, body["written"]) == (200, "1-70")
        # not signed, signed by another key, changed after signing: refused, named
        st, body = await _post(s, gw, encode_batch(Batch(gw.ship, "containers", records(71, 80))))
        assert (st, body["error"]) == (403, "unsigned")
        st, body = await _post(s, gw, _signed(gw.ship, 71, 80, ShipKey.generate()))
        assert (st, body["error"]) == (403, "bad_signature")
        genuine = Batch(gw.ship, "containers", records(71, 80))
        signed = encode_batch(genuine, key=KEY)
        forged = encode_batch(
            Batch(
                gw.ship,
                "containers",
                (*records(71, 79), records(80, 80)[0]._replace(payload=b"{}")),
            ),
        )
        # the genuine signatures on a forged body (the header spliced, CRC made good)
        st, body = await _post(s, gw, _splice(signed, forged))
        assert (st, body["error"]) == (403, "bad_signature")
        st, body = await _post(s, gw, _signed(gw.ship, 71, 80))
        assert (st, body["written"]) == (200, "71-80")
        # a resend overlapping what the site holds: only the new records are written,
        # each with its own proof (of the batch it came in)
        st, body = await _post(s, gw, _signed(gw.ship, 75, 100))
        assert (st, body["written"]) == (200, "81-100")
    seqs = settled_ingress_seqs(kafka, gw.ship, range(1, 101))
    assert sorted(seqs) == list(range(1, 101)) and set(seqs.values()) == {1}
    proved = 0
    for m in read_to_end(kafka.endpoint, [ingress_topic("containers")], settled=True):
        headers = m.headers() or []
        r = Record.from_kafka(m.key(), m.value(), headers)
        if r.identity.origin != gw.ship:
            continue
        proof = dict(headers)[H_PROOF]
        args = (
            r.identity.origin,
            "containers",
            r.identity.seq,
            r.ts_ms,
            r.key,
            r.mqtt_topic,
            r.value,
        )
        assert keys.check(*args, proof) is None
        assert keys.check(*args[:-1], r.value + b" ", proof) is not None
        proved += 1
    assert proved == 100


async def test_required_signatures_refuse_a_ship_without_key_until_its_key_is_added(
    signing_gateway: tuple[RunningGateway, Path], kafka: KafkaBroker
) -> None:
    gw, keys_file = signing_gateway
    other = unique("ship")
    token = Credentials(gw.cfg.credentials_file).add(other)
    other_key = ShipKey.generate()
    async with aiohttp.ClientSession() as s:
        url = f"{gw.url}/v1/ships/{other}/streams/containers/batches"
        unsigned = encode_batch(Batch(other, "containers", records(1, 5)))
        async with s.post(url, data=unsigned, headers=gw.headers(token)) as r:
            assert r.status == 200  # no key, not required: taken (a fleet moving over)
        keys_file.write_text(ShipKeys.render({gw.ship: KEY.public()}, require_signatures=True))
        for _ in range(50):  # the gateway looks at the file once a second
            async with s.post(url, data=unsigned, headers=gw.headers(token)) as r:
                if r.status == 403:
                    assert (await r.json())["error"] == "unknown_ship"
                    break
            await asyncio.sleep(0.1)
        else:
            pytest.fail("require_signatures was not taken from the changed file")
        keys_file.write_text(
            ShipKeys.render({gw.ship: KEY.public(), other: other_key.public()}, True)
        )
        signed = encode_batch(Batch(other, "containers", records(1, 5)), key=other_key)
        for _ in range(50):
            async with s.post(url, data=signed, headers=gw.headers(token)) as r:
                if r.status == 200:
                    break
            await asyncio.sleep(0.1)
        else:
            pytest.fail("the ship's new key was not taken from the changed file")


async def test_a_batch_is_proved_in_a_decode_worker(
    signing_gateway: tuple[RunningGateway, Path], kafka: KafkaBroker
) -> None:
    gw, keys_file = signing_gateway
    keys = ShipKeys.load(keys_file)
    big = _signed(gw.ship, 1, 20_000)
    async with aiohttp.ClientSession() as s:
        st, body = await _post(s, gw, big)
        assert (st, body["written"]) == (200, "1-20000")
        bad = _signed(gw.ship, 20_001, 40_000, ShipKey.generate())
        st, body = await _post(s, gw, bad)
        assert (st, body["error"]) == (403, "bad_signature")
    settled_ingress_seqs(kafka, gw.ship, range(1, 20_001))
    n = 0
    for m in read_to_end(kafka.endpoint, [ingress_topic("containers")], settled=True):
        headers = m.headers() or []
        r = Record.from_kafka(m.key(), m.value(), headers)
        if r.identity.origin == gw.ship and r.identity.seq % 997 == 0:
            args = (gw.ship, "containers", r.identity.seq, r.ts_ms, r.key, r.mqtt_topic, r.value)
            assert keys.check(*args, dict(headers)[H_PROOF]) is None
            n += 1
    assert n == 20_000 // 997


async def _metric(s: aiohttp.ClientSession, gw: RunningGateway, name: str) -> float:
    async with s.get(f"{gw.metrics_url}/metrics") as r:
        for line in (await r.text()).splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"no {name}")


async def test_a_keys_file_that_stops_parsing_keeps_the_old_keys_and_says_so(
    caplog: pytest.LogCaptureFixture, signing_gateway: tuple[RunningGateway, Path]
) -> None:
    """Review N10: a ship keys file that no longer parses keeps the keys read before (a
    revoked key among them still counts): said loudly in the log at every look and in
    ``shorelink_gateway_ship_keys_stale`` until it is mended; the gateway's start warned
    of signatures not enforced. A file others may write is refused the same way."""
    gw, keys_file = signing_gateway
    # its start warned: require_signatures = false here (a ship without a key is taken)
    started = [r.getMessage() for r in caplog.get_records("setup")]
    assert any("event=signatures_not_enforced" in m for m in started), started
    good = keys_file.read_text()
    async with aiohttp.ClientSession() as s:
        assert await _metric(s, gw, "shorelink_gateway_ship_keys_stale") == 0
        for broken in ("[ships\nnot toml", None):
            if broken is None:  # parses, but anyone may write it
                keys_file.write_text(good)
                keys_file.chmod(0o666)
            else:
                keys_file.write_text(broken)
            for _ in range(50):  # the gateway looks at the file once a second
                status, _ = await _post(s, gw, _signed(gw.ship, 1, 2, ShipKey.generate()))
                assert status == 403  # the old key still in force
                if await _metric(s, gw, "shorelink_gateway_ship_keys_stale") == 1:
                    break
                await asyncio.sleep(0.1)
            else:
                pytest.fail("a broken keys file was not reported")
            assert await _metric(s, gw, "shorelink_gateway_ship_keys_read_failures_total") >= 1
            keys_file.chmod(0o644)
            keys_file.write_text(good)
            for _ in range(50):
                if await _metric(s, gw, "shorelink_gateway_ship_keys_stale") == 0:
                    break
                await asyncio.sleep(0.1)
            else:
                pytest.fail("the mended keys file was not taken")
    assert any("event=ship_keys_unreadable" in r.getMessage() for r in caplog.records)
