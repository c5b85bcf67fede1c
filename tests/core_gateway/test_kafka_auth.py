"""The gateway against a site's Kafka with SASL/SCRAM over TLS and ACLs: it writes as
its own principal (docs/access-control.md), exactly once; with a wrong password it
does not become ready and writes nothing."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from pathlib import Path

import aiohttp
import pytest

from core_gateway.auth import Credentials
from core_gateway.config import GatewayConfig
from core_gateway.service import GatewayService
from local_stack.kafka import KafkaBroker
from shorelink.config import Secret
from shorelink.contract import H_ORIGIN, H_SEQ, ingress_topic
from shorelink.kafka.auth import KafkaAuthError
from shorelink.kafka.reading import read_to_end
from tests.access_helpers import apply_secure_access, principal
from tests.core_gateway.helpers import batch, gateway_config, start_gateway
from tests.helpers import unique


def _config(tmp_path: Path, broker: KafkaBroker, password: str | None = None) -> GatewayConfig:
    apply_secure_access(broker)
    auth = principal(broker, "gateway-tokyo")
    if password is not None:
        auth = auth.as_user(auth.username, Secret(password))
    cfg = gateway_config(tmp_path, broker)
    # the transactional.id the gateway's ACLs name
    return dataclasses.replace(
        cfg, kafka=cfg.kafka.with_auth(auth), transactional_id="shorelink-gateway-tokyo"
    )


def _seqs(broker: KafkaBroker, ship: str) -> Counter[int]:
    out: Counter[int] = Counter()
    for m in read_to_end(broker.endpoint, [ingress_topic("containers")], settled=True):
        h = dict(m.headers() or [])
        if h.get(H_ORIGIN) == ship.encode():
            out[int(h[H_SEQ])] += 1
    return out


async def test_the_gateway_writes_as_its_principal_exactly_once(
    tmp_path: Path, secure_kafka: KafkaBroker
) -> None:
    cfg = _config(tmp_path, secure_kafka)
    ship = unique("ship")
    token = Credentials(cfg.credentials_file).add(ship)
    stop = asyncio.Event()
    task = await start_gateway(cfg, stop)
    try:
        url = f"http://127.0.0.1:{cfg.port}/v1/ships/{ship}/streams/containers/batches"
        headers = {
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/x-shorelink-batch",
        }
        async with aiohttp.ClientSession() as s:
            for lo, hi in ((1, 50), (1, 50), (41, 80)):  # a resend, an overlap
                async with s.post(url, data=batch(ship, lo, hi), headers=headers) as r:
                    assert r.status == 200, await r.text()
    finally:
        stop.set()
        await task
    seqs = _seqs(secure_kafka, ship)
    assert sorted(seqs) == list(range(1, 81)) and set(seqs.values()) == {1}


async def test_a_gateway_with_a_wrong_password_never_writes(
    tmp_path: Path, secure_kafka: KafkaBroker
) -> None:
    cfg = _config(tmp_path, secure_kafka, password="not-the-password")
    cfg = dataclasses.replace(cfg, kafka=cfg.kafka.with_timeout(5.0))
    service = GatewayService(cfg)
    with pytest.raises(KafkaAuthError, match="gateway-tokyo"):
        await asyncio.wait_for(service.start(), 60)
    await service.stop()
    assert not service.ready.is_set()
