"""Fixtures for edge agent tests: the agent as a real process, a QoS 1 publisher on
the test's Mosquitto (helpers in tests/edge_agent/helpers.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from local_stack.mosquitto import MosquittoBroker
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
