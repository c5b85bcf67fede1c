"""A ship that keeps abandoning seqs (each a hole in what the site holds) must not make
the site's holdings grow without bound: every hole is rewritten with every batch, in the
gateway's cursor and, through the merge, in the ledger."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest

import core_gateway.admission
from core_gateway.auth import Credentials
from local_stack.kafka import KafkaBroker
from shorelink.contract import GATEWAY_CURSOR_TOPIC
from shorelink.kafka.reading import read_to_end
from shorelink.ledger import ledger_key
from shorelink.wire import Batch, encode_batch
from tests.core_gateway.helpers import gateway_config, records, start_gateway
from tests.helpers import unique

BOUND = 12


async def test_a_ship_that_keeps_abandoning_is_refused_past_the_bound(
    tmp_path: Path, kafka: KafkaBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        core_gateway.admission, "MAX_HOLDINGS_RANGES", BOUND
    )  # 10,000 in production
    cfg = gateway_config(tmp_path, kafka)
    ship = unique("holey")
    token = Credentials(cfg.credentials_file).add(ship)
    stop = asyncio.Event()
    task = await start_gateway(cfg, stop)
    try:
        async with aiohttp.ClientSession() as s:
            ws = await s.ws_connect(
                f"http://127.0.0.1:{cfg.port}/v1/ships/{ship}/upload",
                headers={"Authorization": f"Bearer {token}"},
            )
            await ws.receive(timeout=10)
            answers = []
            # one record, then skip one: every batch abandons one seq (a hole)
            for i in range(BOUND + 3):
                seq = 2 * i + 1
                body = encode_batch(
                    Batch(ship, "containers", records(seq, seq), first_available=seq)
                )
                await ws.send_bytes(body)
                answers.append(json.loads((await ws.receive(timeout=30)).data))
            statuses = [a["status"] for a in answers]
            assert statuses == [200] * (BOUND + 1) + [422, 422]
            assert answers[-1]["error"] == "too_many_holes"
            end = 2 * BOUND + 1
            assert answers[-1]["held"].endswith(f",{end}")
            # the ship can still send what does not abandon anything
            await ws.send_bytes(encode_batch(Batch(ship, "containers", records(end + 1, end + 5))))
            ok = json.loads((await ws.receive(timeout=30)).data)
            assert ok["status"] == 200 and ok["held"].endswith(f",{end}-{end + 5}")
            await ws.close()
    finally:
        stop.set()
        await task
    cursor = [
        m.value() or b""
        for m in read_to_end(kafka.endpoint, [GATEWAY_CURSOR_TOPIC], settled=True)
        if m.key() == ledger_key(ship, "containers")
    ][-1]
    value = json.loads(cursor)
    assert value["abandoned"].count(",") + 1 == BOUND
