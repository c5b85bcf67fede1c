"""Fixtures for edge agent tests: the agent as a real process, a QoS 1 publisher on
the test's Mosquitto (helpers in tests/edge_agent/helpers.py), the fleet's shore
(tests/edge_agent/fleet_helpers.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from local_stack.kafka import KafkaBroker
from local_stack.mosquitto import MosquittoBroker
from tests.core_gateway.helpers import metrics_url, registry_gateway
from tests.edge_agent.fleet_helpers import Shore
from tests.edge_agent.helpers import AgentProcess, Publisher


@pytest.fixture
def agent_process(tmp_path: Path) -> Iterator[type[AgentProcess]]:
    started: list[AgentProcess] = []

    class _Tracked(AgentProcess):
        def start(self) -> None:
            super().start()
            started.append(self)

    yield _Tracked
    for a in started:
        a.terminate()


@pytest.fixture
def publisher(mosquitto: MosquittoBroker, tmp_path: Path) -> Iterator[Publisher]:
    p = Publisher(mosquitto, f"pub-{tmp_path.name}"[:60])
    yield p
    p.close()


@pytest.fixture
async def shore(
    tmp_path: Path, kafka_sites: Callable[..., dict[str, KafkaBroker]]
) -> AsyncIterator[Shore]:
    """Headquarters' registry and a gateway following it (tests/edge_agent/fleet_helpers.py)."""
    # tokyo's broker: no test there follows or counts sl.registry; the gateway tests'
    # broker's (tests/core_gateway/test_registry.py) counts every entry it refuses, and
    # each test here writes the entries of a fleet of its own
    kafka = kafka_sites("tokyo")["tokyo"]
    async with registry_gateway(tmp_path, kafka) as (cfg, reg):
        yield Shore(reg, kafka, cfg.port, metrics_url(cfg))
