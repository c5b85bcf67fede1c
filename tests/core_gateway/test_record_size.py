"""One record size limit at the gateway: a batch holding one record over
MAX_RECORD_BYTES is refused alone (413 ``record_too_large``) and never fails the Kafka
transaction it would have shared with other ships' batches; a record at the limit goes
into sl.ingress (topic and producer limits above the record limit)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp

from core_gateway.auth import Credentials
from local_stack.kafka import KafkaBroker
from shorelink.contract import H_ORIGIN, MAX_RECORD_BYTES, ingress_topic
from shorelink.kafka.reading import read_to_end
from shorelink.wire import Batch, WireRecord, encode_batch
from tests.core_gateway.helpers import (
    assert_exactly_once,
    batch,
    gateway_config,
    records,
    start_gateway,
)
from tests.helpers import unique
from tests.shorelink.test_contract import crafted_batch


def _record(seq: int, size: int) -> WireRecord:
    key, topic = f"C{seq}", f"bigblue/d1/containers/C{seq}/image"
    return WireRecord(
        seq, key, 1_700_000_000_000 + seq, topic, b"j" * (size - len(key) - len(topic))
    )


async def _upload(
    s: aiohttp.ClientSession, url: str, ship: str, token: str, bodies: list[bytes]
) -> list[dict[str, object]]:
    """Send ``bodies`` pipelined over one WebSocket upload; the answers, in order."""
    ws = await s.ws_connect(
        f"{url}/v1/ships/{ship}/upload", headers={"Authorization": f"Bearer {token}"}
    )
    await ws.receive(timeout=10)  # holdings
    for b in bodies:
        await ws.send_bytes(b)
    answers = [json.loads((await ws.receive(timeout=60)).data) for _ in bodies]
    await ws.close()
    return answers


async def test_an_oversized_record_is_refused_alone_while_other_ships_upload(
    tmp_path: Path, kafka: KafkaBroker
) -> None:
    """A hostile or broken ship's batch must not cost the ships sharing its moment
    anything: it is refused before admission, the others' batches are written once."""
    cfg = gateway_config(tmp_path, kafka)
    creds = Credentials(cfg.credentials_file)
    bad, good = unique("bad"), unique("good")
    bad_token, good_token = creds.add(bad), creds.add(good)
    stop = asyncio.Event()
    task = await start_gateway(cfg, stop)
    url = f"http://127.0.0.1:{cfg.port}"
    try:
        hostile = crafted_batch(
            bad, "containers", (*records(1, 3), _record(4, MAX_RECORD_BYTES + 1))
        )
        async with aiohttp.ClientSession() as s:
            bad_answers, good_answers = await asyncio.gather(
                _upload(s, url, bad, bad_token, [batch(bad, 1, 3), hostile]),
                _upload(
                    s, url, good, good_token, [batch(good, lo, lo + 99) for lo in (1, 101, 201)]
                ),
            )
            assert bad_answers[0]["status"] == 200
            assert (bad_answers[1]["status"], bad_answers[1]["error"]) == (413, "record_too_large")
            assert "seq 4" in str(bad_answers[1]["message"])
            assert [a["status"] for a in good_answers] == [200, 200, 200]
            # the refused ship goes on from where it was: the record at the limit fits
            at_limit = encode_batch(Batch(bad, "containers", (_record(4, MAX_RECORD_BYTES),)))
            (answer,) = await _upload(s, url, bad, bad_token, [at_limit])
            assert (answer["status"], answer["held"]) == (200, "1-4")
    finally:
        stop.set()
        await task
    assert_exactly_once(kafka, good, 300)
    assert_exactly_once(kafka, bad, 4)
    sizes = [
        len(m.value() or b"")
        for m in read_to_end(kafka.endpoint, [ingress_topic("containers")], settled=True)
        if dict(m.headers() or [])[H_ORIGIN] == bad.encode() and m.key() == b"C4"
    ]
    assert sizes == [MAX_RECORD_BYTES - len("C4") - len("bigblue/d1/containers/C4/image")]
