"""How the agent stops: within a bound, whatever it is doing, and with everything it
acknowledged stored. A stop that hangs leaves a ship's sensors unheard: systemd's
restart and a fleet configuration's controlled restart (the Supervisor) wait on it."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from core_gateway.auth import Credentials
from edge_agent import agent as agent_module
from edge_agent.agent import INGEST_STOP_S, UPLINK_STOP_GRACE_S, Agent
from edge_agent.config import load_config
from edge_agent.gateway import UPLOAD_CLOSE_S, SendResult
from edge_agent.uplink import GATEWAY_CLOSE_S
from local_stack.mosquitto import MosquittoBroker
from local_stack.process import free_port
from local_stack.toxiproxy import Toxiproxy
from tests.core_gateway.helpers import gateway_config, start_gateway
from tests.edge_agent.helpers import (
    Publisher,
    Sensors,
    edge_config_doc,
    start_agent,
    write_config,
)
from tests.edge_agent.memory_gateway import MemoryGateway
from tests.edge_agent.uplink_helpers import fill
from tests.helpers import eventually_async, unique, write_toml


async def _stop(agent: Agent, task: asyncio.Task[None], within: float) -> float:
    t0 = time.monotonic()
    agent.stop.set()
    await asyncio.wait_for(task, within + 30)  # the test fails rather than hangs
    return time.monotonic() - t0


# the broker saves its store every 10,000 changes, not at each: a backlog of 20,000
# messages is queued in about 3 s rather than 2 minutes (its own power cuts are not
# what this test is about)
@pytest.mark.parametrize("mosquitto", [10_000], indirect=True, ids=["saves_per_10000"])
async def test_a_stop_during_a_burst_of_queued_messages_ends_in_time_and_loses_nothing(
    tmp_path: Path, mosquitto: MosquittoBroker
) -> None:
    """The voyage's case: an agent just restarted onto a backlog the broker queued
    for it is stopped while the burst streams in and the sensors publish on; the stop
    commits what was received and ends (it stops reading at once, so the drain ends
    with what was received, whatever keeps arriving), and the next run stores every
    message once (none acknowledged and lost)."""
    cfg_path = write_config(tmp_path, mosquitto)
    agent, task = await start_agent(cfg_path)  # the session and its subscriptions
    await _stop(agent, task, INGEST_STOP_S)
    pub = Publisher(mosquitto, unique("sensors"))
    backlog = 20_000
    await asyncio.to_thread(pub.readings, 1, backlog)
    sensors = Sensors(pub)
    try:
        agent = Agent(load_config(cfg_path))
        task = asyncio.create_task(agent.run(install_signals=False))
        await asyncio.wait_for(agent.ingest.committed.wait(), 10)
        took = await _stop(agent, task, INGEST_STOP_S)
        assert agent.log.stream_state("containers").count < backlog  # stopped mid-burst
        assert took < 3
        await sensors.end()
        agent, task = await start_agent(cfg_path)
        total = backlog + sensors.count
        await eventually_async(
            lambda: agent.log.stream_state("containers").count == total, 30, "every message"
        )
        await _stop(agent, task, INGEST_STOP_S)
    finally:
        await sensors.end()
        pub.close()


async def test_a_stop_while_an_upload_stalls_on_the_link_ends_in_time(
    tmp_path: Path,
    kafka_sites: Any,
    mosquitto: MosquittoBroker,
    toxiproxy: Toxiproxy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A real gateway over a link that stops carrying anything mid-upload (toxiproxy's
    timeout toxic): the batch in flight is given its grace, then abandoned, and the
    connection's close does not wait for the gateway's close frame (aiohttp: 10 s)."""
    grace = 2.0  # UPLINK_STOP_GRACE_S is 10 s: the same path, shorter
    monkeypatch.setattr(agent_module, "UPLINK_STOP_GRACE_S", grace)
    kafka = kafka_sites("tokyo")["tokyo"]
    gw_cfg = gateway_config(tmp_path / "shore", kafka, site="tokyo")
    ship = unique("ship")
    token = Credentials(gw_cfg.credentials_file).add(ship)
    gw_stop = asyncio.Event()
    gw_task = await start_gateway(gw_cfg, gw_stop)
    proxy, proxy_port = unique(f"{ship}-link"), free_port()
    toxiproxy.create_proxy(proxy, f"127.0.0.1:{proxy_port}", f"127.0.0.1:{gw_cfg.port}")
    doc = edge_config_doc(tmp_path, mosquitto)
    doc["ship"] = ship
    doc["streams"]["containers"]["max_age"] = "3650d"  # fill's records are from 2023
    doc["uplink"] = {"token": token, "interval": "200ms", "linger": "20ms"}
    doc["gateways"] = [
        {"site": "tokyo", "url": f"http://127.0.0.1:{proxy_port}", "link": "port_wifi"}
    ]
    agent = Agent(load_config(write_toml(tmp_path / "edge.toml", doc)))
    n = 30000
    fill(agent.log, "containers", n, size=400, random=True)
    task = asyncio.create_task(agent.run(install_signals=False))
    try:
        assert agent.uplink is not None
        await eventually_async(agent.uplink.reached.is_set, 20, "the gateway reached")
        await eventually_async(lambda: agent.log.holdings(), 20, "a batch through")
        toxiproxy.add_toxic(proxy, "timeout", stream="upstream", timeout=0)
        took = await _stop(agent, task, UPLINK_STOP_GRACE_S)
        assert took < grace + UPLOAD_CLOSE_S + 1.5
    finally:
        agent.stop.set()
        gw_stop.set()
        await gw_task


@dataclass
class _StuckGateway(MemoryGateway):
    """A gateway whose send never answers and whose close never returns; with
    ``deaf``, its close ignores cancellation too (until ``released``)."""

    deaf: bool = False
    released: threading.Event | None = None

    sending: bool = False

    async def send(self, stream: str, body: bytes) -> SendResult:
        self.sending = True
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def close(self) -> None:
        while True:
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                if not self.deaf:
                    raise
            if self.released is not None and self.released.is_set():
                return


@pytest.mark.parametrize("deaf", [False, True], ids=["close_hangs", "close_ignores_cancel"])
async def test_a_gateway_that_never_answers_nor_closes_does_not_hold_the_stop(
    tmp_path: Path, mosquitto: MosquittoBroker, monkeypatch: pytest.MonkeyPatch, deaf: bool
) -> None:
    """Whatever the uplink waits on, the stop goes on after its bounds: the batch in
    flight after its grace, a close after GATEWAY_CLOSE_S, a task that ignores its
    cancel after TASK_CANCEL_S (left behind, logged)."""
    monkeypatch.setattr(agent_module, "UPLINK_STOP_GRACE_S", 0.5)
    monkeypatch.setattr(agent_module, "TASK_CANCEL_S", 1.0)
    doc = edge_config_doc(tmp_path, mosquitto)
    doc["uplink"] = {"interval": "200ms", "linger": "20ms"}
    doc["streams"]["containers"]["max_age"] = "3650d"  # fill's records are from 2023
    released = threading.Event()
    gw = _StuckGateway("tokyo", "port_wifi", deaf=deaf, released=released)
    agent = Agent(load_config(write_toml(tmp_path / "edge.toml", doc)), gateways=[gw])
    fill(agent.log, "containers", 100)
    task = asyncio.create_task(agent.run(install_signals=False))
    try:
        await eventually_async(lambda: gw.sending, 20, "a batch in flight")
        took = await _stop(agent, task, 5)
        bound = 0.5 + (1.0 if deaf else GATEWAY_CLOSE_S) + 1.0
        assert took < bound
    finally:
        released.set()
        await asyncio.sleep(0.2)  # the deaf close sees it and returns


async def test_a_restart_asked_from_a_worker_thread_ends_the_run(
    tmp_path: Path, mosquitto: MosquittoBroker
) -> None:
    """A fleet configuration is taken in a worker thread, which asks the run to end
    (FleetConfig.on_applied): an asyncio.Event set off its loop's thread is not seen
    for sure (in debug mode it raises in that thread and the run waits for good)."""
    asyncio.get_running_loop().set_debug(True)
    try:
        agent, task = await start_agent(write_config(tmp_path, mosquitto))
        t = threading.Thread(target=agent._restart)
        t.start()
        await asyncio.to_thread(t.join)
        await asyncio.wait_for(task, INGEST_STOP_S + 5)
        assert agent.restart
    finally:
        asyncio.get_running_loop().set_debug(False)
