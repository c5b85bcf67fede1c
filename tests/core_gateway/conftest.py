"""The gateway as a real server on loopback against the session's real Kafka."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from core_gateway.auth import Credentials
from local_stack.kafka import KafkaBroker
from tests.core_gateway.helpers import RunningGateway, gateway_config, start_gateway
from tests.helpers import unique


@pytest.fixture(scope="session")
def kafka(kafka_sites: Callable[..., dict[str, KafkaBroker]]) -> KafkaBroker:
    """The gateway tests' own site broker: the tens of thousands of ``containers``
    records they upload (kill -9 tests, pipelining) must not become the backlog of the
    Spark tests, whose merge reads ``sl.ingress.containers`` from the beginning."""
    return kafka_sites("gateway-tests")["gateway-tests"]


@pytest.fixture
async def gateway(tmp_path: Path, kafka: KafkaBroker) -> AsyncIterator[RunningGateway]:
    cfg = gateway_config(tmp_path, kafka)
    ship = unique("ship")
    token = Credentials(cfg.credentials_file).add(ship)
    stop = asyncio.Event()
    task = await start_gateway(cfg, stop)
    yield RunningGateway(cfg, f"http://127.0.0.1:{cfg.port}", ship, token)
    stop.set()
    await task
