"""The fleet's configuration tests' shore and ships (tests/edge_agent/test_fleet_config.py,
test_token_rotation.py): headquarters' registry with a real gateway following it on real
Kafka (``Shore``, the ``shore`` fixture in conftest.py), and ships provisioned there
whose agents run under their supervisor (``fleet_ship``)."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edge_agent.agent import Agent, Supervisor
from local_stack.kafka import KafkaBroker
from local_stack.mosquitto import MosquittoBroker
from shorelink.contract import canonical_topic
from shorelink.fleet.bundle import provision
from shorelink.fleet.entry import REGISTRY_STREAM, FleetKey
from shorelink.fleet.log import Registry
from shorelink.fleet.travel import entry_record
from shorelink.kafka.topics import producer
from tests.edge_agent.helpers import edge_config_doc
from tests.helpers import eventually_async, unique, write_toml

TOPIC = canonical_topic(REGISTRY_STREAM)


@dataclass
class Shore:
    """Headquarters' registry and a gateway that follows it on its site's Kafka."""

    registry: Registry
    kafka: KafkaBroker
    port: int
    metrics: str
    delivered: int = 0
    keys: dict[str, FleetKey] = field(default_factory=dict)

    async def config_bytes_served(self) -> float:
        """The gateway's ``shorelink_gateway_config_bytes_total`` (the gateway runs on
        this event loop: asked from a thread)."""

        def get() -> str:
            with urllib.request.urlopen(f"{self.metrics}/metrics", timeout=5) as r:
                return str(r.read().decode())

        text = await asyncio.to_thread(get)
        m = re.search(r"^shorelink_gateway_config_bytes_total (\S+)$", text, re.M)
        return float(m.group(1)) if m else 0.0

    def deliver(self, *raw: tuple[bytes, bytes, list[tuple[str, str | bytes | None]]]) -> None:
        p = producer(self.kafka.endpoint)
        for key, value, headers in raw:
            p.produce(TOPIC, value, key, headers=headers)
        assert p.flush(20) == 0

    def publish(self) -> int:
        """Every entry not yet delivered into the site's ``sl.registry``, as its merge
        writes what replication brought."""
        self.registry.refresh()
        key = self.registry.fleet_key()
        self.keys[key.id] = key  # a rotation's entry is proved by the key before it
        new = [e for e in self.registry.entries() if e.version > self.delivered]
        self.deliver(*(entry_record(e, self.keys[e.signer], "hq") for e in new))
        self.delivered = self.registry.state.version
        return self.delivered

    def config_set(self, document: str, *, ship: str = "", port_links_only: bool = False) -> int:
        scope, name = ("ship", ship) if ship else ("group", "north")
        body = {
            "scope": scope,
            "name": name,
            "format": "toml",
            "document": document,
            "port_links_only": port_links_only,
        }
        self.registry.append([("config_set", body)])
        return self.publish()

    def config_remove(self, *, ship: str = "") -> int:
        scope, name = ("ship", ship) if ship else ("group", "north")
        self.registry.append([("config_removed", {"scope": scope, "name": name})])
        return self.publish()


@dataclass
class Ship:
    name: str
    config: Path
    supervisor: Supervisor
    task: asyncio.Task[None]

    @property
    def agent(self) -> Agent:
        assert self.supervisor.agent is not None
        return self.supervisor.agent

    def held(self) -> dict[str, Any]:
        """What the ship holds on disk (``<log>.fleet.json``; none yet: edge.toml alone)."""
        assert self.agent.fleet is not None
        path = self.agent.fleet.path
        if not path.exists():
            return {"version": 0, "lines": {}, "failure": None, "refused": {}, "trial": ""}
        return json.loads(path.read_text())

    async def stop(self) -> None:
        self.supervisor.stop.set()
        await asyncio.wait_for(self.task, 30)


async def fleet_ship(
    tmp_path: Path,
    shore: Shore,
    mosquitto: MosquittoBroker,
    *,
    port: int | None = None,
    link: str = "port_wifi",
    health: str = "5s",
    refresh: str = "500ms",
    heartbeat: str = "1h",
    metrics_port: int = 0,
    held: dict[str, Any] | None = None,
) -> Ship:
    """A ship provisioned at headquarters (group ``north``), its agent supervised and
    running with a gateway at ``port`` (the gateway's own by default)."""
    name = unique("ship")
    bundle = provision(shore.registry, name, ["north"], out=tmp_path / name)
    shore.publish()
    doc = edge_config_doc(tmp_path, mosquitto)
    doc["ship"] = name
    doc["report"] = {"stream": "nav", "interval": "1s", "heartbeat": heartbeat}
    if metrics_port:
        doc["metrics"] = {"host": "127.0.0.1", "port": metrics_port}
    doc["uplink"] = {
        "token_file": str(bundle / "gateway.token"),
        "signing_key_file": str(bundle / "ship.key"),
        "fleet_pub_file": str(bundle / "fleet.pub"),
        "fleet_health": health,
        "interval": "200ms",
        "refresh": refresh,
        "linger": "10ms",
        "retry_min": "50ms",
        "retry_max": "300ms",
    }
    doc["gateways"] = [
        {"site": "tokyo", "url": f"http://127.0.0.1:{port or shore.port}", "link": link}
    ]
    config = write_toml(tmp_path / "edge.toml", doc)
    if held is not None:  # what the ship holds already (<log>.fleet.json)
        await asyncio.to_thread(
            Path(f"{doc['log']['path']}.fleet.json").write_text, json.dumps(held)
        )
    sup = Supervisor(config)
    task = asyncio.create_task(sup.run(install_signals=False))
    await eventually_async(lambda: sup.agent is not None, 10, "the agent started")
    return Ship(name, config, sup, task)
