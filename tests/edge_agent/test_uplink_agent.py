"""The agent with gateways configured: sensor messages go MQTT -> log -> uplink ->
gateway without waiting for the timer, the agent stops cleanly, and ``status`` shows
each link's state, today's bytes and the backlog."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
from aiohttp import web
from prometheus_client import generate_latest

from edge_agent.agent import Agent
from edge_agent.config import load_config
from local_stack.mosquitto import MosquittoBroker
from local_stack.process import free_port
from shorelink.ranges import RangeSet
from tests.edge_agent.api_server import TOKEN, api_app
from tests.edge_agent.helpers import Publisher, edge_config_doc
from tests.edge_agent.memory_gateway import MemoryGateway
from tests.helpers import eventually_async, run_process, write_toml

EDGE = [sys.executable, "-m", "edge_agent.cli"]


def _agent_config(
    tmp_path: Path,
    mosquitto: MosquittoBroker,
    port: int,
    *,
    interval: str = "30s",
    metrics_port: int = 0,
) -> Path:
    """The agent's config with one gateway: ``tokyo`` over ``port_wifi``, at ``port``."""
    return write_toml(
        tmp_path / "edge.toml",
        {
            **edge_config_doc(tmp_path, mosquitto),
            "metrics": {"port": metrics_port},
            "uplink": {
                "token": TOKEN,
                "interval": interval,
                "linger": "10ms",
                "retry_min": "50ms",
                "retry_max": "500ms",
            },
            "gateways": [{"site": "tokyo", "url": f"http://127.0.0.1:{port}", "link": "port_wifi"}],
        },
    )


async def test_agent_with_gateways_sends_on_new_data_and_stops_cleanly(
    tmp_path: Path, mosquitto: MosquittoBroker, publisher: Publisher
) -> None:
    """New records wake the uplink (the timer is 30 s here), and stopping the agent
    stops the uplink too: no task left behind, the gateway closed, the log closed."""
    cfg = load_config(_agent_config(tmp_path, mosquitto, 9))
    gw = MemoryGateway("tokyo", "port_wifi")
    agent = Agent(cfg, gateways=[gw])
    task = asyncio.create_task(agent.run(install_signals=False))
    await asyncio.wait_for(agent.ingest.connected.wait(), 20)
    await asyncio.to_thread(publisher.readings, 1, 40)
    await eventually_async(lambda: gw.held("containers") == RangeSet([(1, 40)]), within=10)
    await asyncio.to_thread(publisher.readings, 41, 50)
    await eventually_async(lambda: gw.held("containers") == RangeSet([(1, 50)]), within=10)
    # the uplink counts a batch once the gateway's answer is back: a moment after it holds it
    sent = 'shorelink_edge_uplink_records_sent_total{site="tokyo",stream="containers"} 50.0'
    await eventually_async(
        lambda: sent in generate_latest(agent.metrics.registry).decode(), within=10
    )
    metrics = generate_latest(agent.metrics.registry).decode()
    assert 'shorelink_edge_link_up{link="port_wifi",site="tokyo"} 1.0' in metrics
    assert 'shorelink_edge_uplink_bytes_sent_total{link="port_wifi"}' in metrics
    agent.stop.set()
    await asyncio.wait_for(task, 15)
    assert gw.closed
    assert max(gw.arrivals.values()) == 1
    names = {t.get_name() for t in asyncio.all_tasks()}
    assert not names & {"uplink", "ingest", "housekeeping", "watchdog"}


async def _status(cfg: Path) -> dict[str, object]:
    argv = [*EDGE, "status", "--config", str(cfg), "--json"]
    res = await asyncio.to_thread(subprocess.run, argv, capture_output=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return dict(json.loads(res.stdout))


async def test_agent_process_uploads_over_http_once_the_gateway_comes_up(
    tmp_path: Path, mosquitto: MosquittoBroker, publisher: Publisher
) -> None:
    """The whole ship side for real: records wait on board while the gateway is down
    (status says so), and go once it answers."""
    port, metrics_port = free_port(), free_port()
    cfg = _agent_config(tmp_path, mosquitto, port, interval="200ms", metrics_port=metrics_port)
    agent = run_process("edge-agent", [*EDGE, "run", "--config", str(cfg)], tmp_path / "agent.log")
    assert agent.popen is not None
    site = MemoryGateway("tokyo", "port_wifi")
    runner = web.AppRunner(api_app(site))
    try:
        async with aiohttp.ClientSession() as http:

            async def connected() -> bool:
                try:
                    async with http.get(f"http://127.0.0.1:{metrics_port}/metrics") as r:
                        return "shorelink_edge_mqtt_connected 1.0" in await r.text()
                except aiohttp.ClientError:
                    return False

            for _ in range(200):
                if await connected():
                    break
                await asyncio.sleep(0.1)
        await asyncio.to_thread(publisher.readings, 1, 30)

        def down(report: dict[str, object]) -> bool:
            links = report["links"]
            assert isinstance(links, list)
            return bool(links[0]["state"] == "down" and links[0]["last_error"])

        def waiting(report: dict[str, object]) -> int:
            return int(report["streams"]["containers"]["backlog_records"])  # type: ignore[index]

        # the broker acknowledged all 30; the agent stores them moments later (a loaded
        # machine: 27 of 30 at the first status, seen)
        report = await _status(cfg)
        for _ in range(100):
            if down(report) and waiting(report) == 30:
                break
            await asyncio.sleep(0.1)
            report = await _status(cfg)
        assert down(report)
        assert waiting(report) == 30

        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        await eventually_async(lambda: site.held("containers") == RangeSet([(1, 30)]), within=20)
        await asyncio.sleep(0.3)
        report = await _status(cfg)
        link = report["links"][0]  # type: ignore[index]
        assert link["state"] == "up" and link["today_bytes"] > 0
        assert report["streams"]["containers"]["backlog_records"] == 0  # type: ignore[index]
        assert report["streams"]["containers"]["held"] == {"tokyo": "1-30"}  # type: ignore[index]
    finally:
        agent.popen.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(agent.popen.wait, 20) == 0
        await runner.cleanup()
