"""The gateway's dictionaries (``dictionaries_dir``): every one in the directory
decodes, in the decode worker processes too (each loads them as it starts), a batch
naming one the gateway lacks is a 422 ``unknown_dictionary`` that writes nothing, and
a directory that holds something else fails the config naming the key."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import aiohttp
import pytest

from core_gateway.auth import Credentials
from core_gateway.config import parse_config
from local_stack.kafka import KafkaBroker
from shorelink.errors import ConfigError
from shorelink.wire import Batch, encode_batch
from shorelink.wire_dict import Dictionary, train, training_samples
from tests.core_gateway.helpers import (
    assert_exactly_once,
    gateway_config,
    ingress_seqs,
    records,
    start_gateway,
)
from tests.helpers import unique


def _dictionary(dict_id: int) -> Dictionary:
    samples = training_samples(records(20_000, 21_000), 200)
    return train("containers", samples, dict_id=dict_id, size=8 * 1024)


async def _post(port: int, ship: str, token: str, body: bytes) -> tuple[int, dict[str, object]]:
    async with (
        aiohttp.ClientSession() as s,
        s.post(
            f"http://127.0.0.1:{port}/v1/ships/{ship}/streams/containers/batches",
            data=body,
            headers={
                "Authorization": f"Bearer {token}",
                "Content-Type": "application/x-shorelink-batch",
            },
        ) as r,
    ):
        return r.status, await r.json()


async def test_every_dictionary_held_decodes_in_threads_and_workers_and_others_are_refused(
    tmp_path: Path, kafka: KafkaBroker
) -> None:
    """An old dictionary and the newest both decode (ships update at their own pace),
    small batches in a thread and large ones in a decode worker; one the gateway lacks
    is refused from its header and nothing of it is written."""
    old, new, unknown = _dictionary(60_001), _dictionary(60_002), _dictionary(60_003)
    (tmp_path / "dicts").mkdir()
    old.write(tmp_path / "dicts")
    new.write(tmp_path / "dicts")
    cfg = dataclasses.replace(
        gateway_config(tmp_path, kafka), dictionaries_dir=tmp_path / "dicts", decode_workers=1
    )
    ship = unique("ship")
    token = Credentials(cfg.credentials_file).add(ship)
    stop = asyncio.Event()
    task = await start_gateway(cfg, stop)
    try:

        def body(lo: int, hi: int, d: Dictionary) -> bytes:
            return encode_batch(Batch(ship, "containers", records(lo, hi)), dictionary=d)

        status, answer = await _post(cfg.port, ship, token, body(1, 100, unknown))
        assert (status, answer["error"]) == (422, "unknown_dictionary")
        assert "60003" in str(answer["message"])
        assert (await _post(cfg.port, ship, token, body(1, 100, old)))[0] == 200  # a thread
        big = body(101, 5_100, new)  # body and decompressed bytes past 64 KiB: a worker
        assert (await _post(cfg.port, ship, token, big))[0] == 200
    finally:
        stop.set()
        await task
    assert_exactly_once(kafka, ship, 5_100)
    assert max(ingress_seqs(kafka, ship).values()) == 1


def test_a_gateway_config_whose_dictionaries_dir_holds_no_dictionary_is_refused(
    tmp_path: Path, kafka: KafkaBroker
) -> None:
    (tmp_path / "dicts").mkdir()
    (tmp_path / "dicts" / "containers-60001.zdict").write_bytes(b"\x37\xa4\x30\xec" + b"x" * 64)
    data = {
        "site": "tokyo",
        "credentials_file": "ships.json",
        "streams": ["containers"],
        "dictionaries_dir": "dicts",
        "kafka": {"bootstrap": kafka.bootstrap},
    }
    with pytest.raises(ConfigError) as info:
        parse_config(data, base=tmp_path)
    assert info.value.field == "dictionaries_dir"
    assert "containers-60001.zdict" in str(info.value)


async def test_a_dictionary_copied_to_the_directory_is_taken_without_a_restart(
    tmp_path: Path, kafka: KafkaBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Headquarters (or, later, the fleet registry) copies a new dictionary to a running
    gateway: the next batch naming it makes the gateway read its directory again."""
    monkeypatch.setattr("core_gateway.decoding.RESCAN_EVERY_S", 0.0)
    d = _dictionary(60_004)
    (tmp_path / "dicts").mkdir()
    cfg = dataclasses.replace(gateway_config(tmp_path, kafka), dictionaries_dir=tmp_path / "dicts")
    ship = unique("ship")
    token = Credentials(cfg.credentials_file).add(ship)
    stop = asyncio.Event()
    task = await start_gateway(cfg, stop)
    try:
        data = encode_batch(Batch(ship, "containers", records(1, 100)), dictionary=d)
        status, answer = await _post(cfg.port, ship, token, data)
        assert (status, answer["error"]) == (422, "unknown_dictionary")
        d.write(tmp_path / "dicts")
        assert (await _post(cfg.port, ship, token, data))[0] == 200
    finally:
        stop.set()
        await task
    assert_exactly_once(kafka, ship, 100)
