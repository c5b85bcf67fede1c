"""Helpers for edge agent tests: configs pointing at a real Mosquitto, the agent run
as a real subprocess, and a QoS 1 publisher with a persistent session."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from local_stack.mosquitto import MosquittoBroker
from local_stack.process import Proc
from tests.helpers import grows_to, kill9, run_process, write_toml

if TYPE_CHECKING:
    from edge_agent.agent import Agent


def status_of(cfg: Any, stream: str) -> dict[str, Any]:
    """What ``shorelink-edge status`` of this version reports of ``stream`` in the log of
    ``cfg``, read only (an old log, the agent not restarted yet, included)."""
    from edge_agent.status import collect_status, open_log

    reader = open_log(cfg, readonly=True)
    try:
        report: dict[str, Any] = collect_status(cfg, reader)["streams"][stream]
        return report
    finally:
        reader.close()


def edge_config_doc(tmp_path: Path, broker: MosquittoBroker, **overrides: Any) -> dict[str, Any]:
    """The agent's config on ``broker``, its log in ``tmp_path``: three streams and their
    rules. ``overrides`` replace ``port``, ``client_id``, ``log_path``, ``max_bytes``,
    ``reserve``, ``max_payload``, ``containers_policy`` or ``synchronous``, or add the
    agent's MQTT ``username`` and ``password``."""
    values: dict[str, Any] = {
        "port": broker.port,
        "client_id": f"edge-{tmp_path.name}"[:60],
        "log_path": tmp_path / "edge.db",
        "max_bytes": 2_000_000_000,
        "reserve": 10_000_000,
        "max_payload": "256KiB",
        "containers_policy": "drop_oldest",
        "synchronous": "full",
    }
    values.update(overrides)
    login = {k: values[k] for k in ("username", "password") if k in values}
    return {
        "ship": "bigblue",
        "log_level": "info",
        "mqtt": {
            "host": "127.0.0.1",
            "port": values["port"],
            "client_id": values["client_id"],
            "max_payload_bytes": values["max_payload"],
            **login,
        },
        "log": {
            "path": str(values["log_path"]),
            "group_commit": "2ms",
            "max_bytes": values["max_bytes"],
            "alerts_reserve_bytes": values["reserve"],
            "quarantine_max": 50,
            "synchronous": values["synchronous"],
        },
        "metrics": {"port": 0},
        "streams": {
            "alerts": {"priority": 0},
            "nav": {"priority": 10, "max_age": "30d"},
            "containers": {"priority": 50, "on_full": values["containers_policy"]},
        },
        "rules": [
            {"filter": "bigblue/+/containers/+/alert", "stream": "alerts", "key": "{4}"},
            {
                "filter": "bigblue/+/containers/+/env",
                "stream": "containers",
                "key": "{4}",
                "ts_field": "ts",
            },
            {"filter": "bigblue/nav/ais", "stream": "nav", "key": "position"},
        ],
    }


def write_config(tmp_path: Path, broker: MosquittoBroker, **overrides: Any) -> Path:
    """:func:`edge_config_doc` written to ``tmp_path/edge.toml``."""
    return write_toml(tmp_path / "edge.toml", edge_config_doc(tmp_path, broker, **overrides))


async def start_agent(cfg_path: Path) -> tuple[Agent, asyncio.Task[None]]:
    """The agent of ``cfg_path`` run in this process's event loop (stopped by setting
    its ``stop``), once it is connected to its broker."""
    from edge_agent.agent import Agent
    from edge_agent.config import load_config

    agent = Agent(load_config(cfg_path))
    task = asyncio.create_task(agent.run(install_signals=False))
    await asyncio.wait_for(agent.ingest.connected.wait(), 10)
    return agent, task


class AgentProcess:
    """The agent as a real process (``shorelink-edge run``), for crash tests."""

    def __init__(self, config: Path, log_file: Path) -> None:
        self.config = config
        self.log_file = log_file
        self.proc: Proc | None = None

    def start(self) -> None:
        argv = [sys.executable, "-m", "edge_agent.cli", "run", "--config", str(self.config)]
        self.proc = run_process("edge-agent", argv, self.log_file)

    def kill9(self) -> None:
        assert self.proc is not None
        kill9(self.proc)

    def terminate(self) -> None:
        """SIGTERM to the agent (it stops its own workers), SIGKILL after 15 s."""
        if self.proc is None or self.proc.popen is None or not self.proc.alive():
            return
        self.proc.popen.send_signal(signal.SIGTERM)
        try:
            self.proc.popen.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.stop(grace=0)


class Publisher:
    """A QoS 1 publisher with a persistent session, like a sensor gateway on the ship.
    :attr:`acked` is the payloads the broker acknowledged (PUBACK received)."""

    def __init__(self, broker: MosquittoBroker, client_id: str) -> None:
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=client_id, protocol=MQTTProtocolVersion.MQTTv5
        )
        self.client.max_inflight_messages_set(100)
        self.client.max_queued_messages_set(0)
        self._sent: list[tuple[bytes, mqtt.MQTTMessageInfo]] = []
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 3600
        self.client.connect(broker.host, broker.port, clean_start=False, properties=props)
        self.client.loop_start()

    def publish(self, topic: str, payload: bytes, qos: int = 1) -> None:
        self._sent.append((payload, self.client.publish(topic, payload, qos=qos)))

    @property
    def acked(self) -> list[bytes]:
        return [p for p, info in self._sent if info.is_published()]

    def wait_all_acked(self) -> None:
        """Wait until the broker acknowledged every message published (failing when no
        acknowledgement came for 30 s)."""
        grows_to(
            lambda: sum(info.is_published() for _, info in self._sent),
            len(self._sent),
            "messages acknowledged by the broker",
        )

    def readings(self, lo: int, hi: int, topic: str = "containers", keys: int = 3) -> None:
        """Readings ``lo``..``hi`` (``"i"`` in the payload) of ``keys`` containers on
        ``bigblue/d1/<topic>/C<n>/env``, then wait until the broker acknowledged them."""
        for i in range(lo, hi + 1):
            self.publish(
                f"bigblue/d1/{topic}/C{i % keys}/env", f'{{"ts": 1700000000, "i": {i}}}'.encode()
            )
        self.wait_all_acked()

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


class Sensors:
    """Sensors that publish on (QoS 1, about 1000 messages a second) in a thread until
    :meth:`end`; :attr:`count` is how many they published."""

    def __init__(self, pub: Publisher) -> None:
        self.pub = pub
        self.count = 0
        self._end = threading.Event()
        self._thread = threading.Thread(target=self._run)
        self._thread.start()

    def _run(self) -> None:
        while not self._end.is_set():
            self.count += 1
            topic = f"bigblue/d1/containers/C{self.count % 3}/env"
            self.pub.publish(topic, f'{{"ts": 1, "live": {self.count}}}'.encode())
            if self.count % 50 == 0:
                self._end.wait(0.05)

    async def end(self) -> None:
        self._end.set()
        await asyncio.to_thread(self._thread.join)
        await asyncio.to_thread(self.pub.wait_all_acked)
