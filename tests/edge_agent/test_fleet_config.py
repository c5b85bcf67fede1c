"""The fleet's configuration reaching a ship (docs/fleet-registry.md, "Configuration to
the ships"): a real gateway following a registry on real Kafka, the agent against it
(through toxiproxy where the link matters), its supervisor restarting it on a change.
What a ship runs is decided at headquarters and signed there: the gateway only carries
it, the ship checks it and keeps running what works."""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import urllib.request
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from edge_agent.agent import Agent, Supervisor
from edge_agent.fleet_config import load_effective
from local_stack.kafka import KafkaBroker
from local_stack.mosquitto import MosquittoBroker
from local_stack.process import free_port
from local_stack.toxiproxy import Toxiproxy
from shorelink.contract import canonical_topic
from shorelink.fleet.bundle import provision
from shorelink.fleet.entry import REGISTRY_STREAM, FleetKey, sign_entry
from shorelink.fleet.log import Registry
from shorelink.fleet.shipconfig import encode_delta
from shorelink.fleet.travel import entry_record
from shorelink.kafka.topics import producer
from shorelink.ship_report import decode_report
from tests.core_gateway.helpers import metrics_url, registry_gateway
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

    def config_bytes_served(self) -> float:
        """The gateway's ``shorelink_gateway_config_bytes_total``."""
        with urllib.request.urlopen(f"{self.metrics}/metrics", timeout=5) as r:
            text = r.read().decode()
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
        new = [e for e in self.registry.entries() if e.version > self.delivered]
        self.deliver(*(entry_record(e, key, "hq") for e in new))
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


@pytest.fixture
async def shore(
    tmp_path: Path, kafka_sites: Callable[..., dict[str, KafkaBroker]]
) -> AsyncIterator[Shore]:
    # tokyo's broker: no test there follows or counts sl.registry; the gateway tests'
    # broker's (tests/core_gateway/test_registry.py) counts every entry it refuses, and
    # each test here writes the entries of a fleet of its own
    kafka = kafka_sites("tokyo")["tokyo"]
    async with registry_gateway(tmp_path, kafka) as (cfg, reg):
        yield Shore(reg, kafka, cfg.port, metrics_url(cfg))


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


async def _ship(
    tmp_path: Path,
    shore: Shore,
    mosquitto: MosquittoBroker,
    *,
    port: int | None = None,
    link: str = "port_wifi",
    health: str = "5s",
) -> Ship:
    """A ship provisioned at headquarters (group ``north``), its agent supervised and
    running with a gateway at ``port`` (the gateway's own by default)."""
    name = unique("ship")
    bundle = provision(shore.registry, name, ["north"], out=tmp_path / name)
    shore.publish()
    doc = edge_config_doc(tmp_path, mosquitto)
    doc["ship"] = name
    doc["report"] = {"stream": "nav", "interval": "1s"}
    doc["uplink"] = {
        "token_file": str(bundle / "gateway.token"),
        "signing_key_file": str(bundle / "ship.key"),
        "fleet_pub_file": str(bundle / "fleet.pub"),
        "fleet_health": health,
        "interval": "200ms",
        "refresh": "500ms",
        "linger": "10ms",
        "retry_min": "50ms",
        "retry_max": "300ms",
    }
    doc["gateways"] = [
        {"site": "tokyo", "url": f"http://127.0.0.1:{port or shore.port}", "link": link}
    ]
    config = write_toml(tmp_path / "edge.toml", doc)
    sup = Supervisor(config)
    task = asyncio.create_task(sup.run(install_signals=False))
    await eventually_async(lambda: sup.agent is not None, 10, "the agent started")
    return Ship(name, config, sup, task)


def _reported(ship: Ship) -> dict[str, Any] | None:
    """The ``config`` of the newest ship report in the agent's log."""
    last = ship.agent.log.tail("nav", 1)
    if not last:
        return None
    cfg = decode_report(last[0].payload).config
    return None if cfg is None else {"version": cfg.version, "failure": cfg.failure}


async def test_a_new_configuration_reaches_the_ship_is_applied_and_reported(
    tmp_path: Path, shore: Shore, mosquitto: MosquittoBroker
) -> None:
    """One change at headquarters, and the ship runs it at its next exchange with a
    gateway: restarted once onto it, kept once healthy, and its report says the version
    (what a rollout reads)."""
    ship = await _ship(tmp_path, shore, mosquitto)
    try:
        await eventually_async(lambda: ship.agent.uplink and ship.agent.uplink.reached.is_set())
        version = shore.config_set('[streams.nav]\nmax_age = "7d"\n')
        await eventually_async(lambda: ship.supervisor.runs == 2, 20, "restarted onto it")
        assert ship.agent.cfg.streams["nav"].max_age_s == 7 * 86400
        await eventually_async(lambda: ship.held()["trial"] == "", 20, "kept once healthy")
        assert ship.held()["version"] == version
        await eventually_async(
            lambda: _reported(ship) == {"version": version, "failure": None}, 20, "reported"
        )
    finally:
        await ship.stop()


async def test_a_key_this_agent_does_not_know_is_kept_out_and_the_reason_reported(
    tmp_path: Path, shore: Shore, mosquitto: MosquittoBroker
) -> None:
    """An agent of an older schema in a mixed fleet keeps what it runs rather than
    choke on a key it cannot read, and says which key."""
    ship = await _ship(tmp_path, shore, mosquitto)
    try:
        version = shore.config_set('[streams.nav]\nmax_age = "7d"\nnew_in_next_release = 3\n')
        await eventually_async(
            lambda: "new_in_next_release" in (ship.held().get("failure") or ""), 20, "refused"
        )
        assert ship.held()["version"] == 0 and ship.supervisor.runs == 1
        assert ship.held()["refused"] == {"g:north": version}
        await eventually_async(
            lambda: (
                (r := _reported(ship)) is not None
                and r["version"] == 0
                and f"version {version} refused" in (r["failure"] or "")
            ),
            20,
            "reported",
        )
    finally:
        await ship.stop()


async def test_a_configuration_the_fleet_did_not_sign_is_refused(
    tmp_path: Path, shore: Shore, mosquitto: MosquittoBroker
) -> None:
    """Whoever gets an entry into a site's topic (or runs a gateway) cannot configure a
    ship: the ship checks the fleet's signature against the key it carries on board.
    Here the gateway takes the forged entry (it pins another root), the ship does not."""
    thief = FleetKey.generate()
    ship = await _ship(tmp_path, shore, mosquitto)
    try:
        reg = shore.registry
        reg.refresh()
        # what a gateway that served a forged entry (its site's registry taken over)
        # would hand the ship, at the version the ship is offered
        forged = sign_entry(
            thief,
            reg.state.version + 1,
            reg.state.head,
            "config_set",
            {
                "scope": "group",
                "name": "north",
                "format": "toml",
                "document": '[mqtt]\nhost = "evil.invalid"\n',
                "port_links_only": False,
            },
        )
        fleet = ship.agent.fleet
        assert fleet is not None
        offer = {"g:north": (forged.version, False)}
        applied = fleet.take(offer, {"g:north": None}, encode_delta([forged.raw], None))
        assert not applied and "forged" in (fleet.state.failure or "")
        assert ship.held()["version"] == 0 and ship.held()["lines"] == {}
        assert ship.supervisor.runs == 1
    finally:
        await ship.stop()


async def test_a_change_that_breaks_health_is_rolled_back(
    tmp_path: Path, shore: Shore, mosquitto: MosquittoBroker
) -> None:
    """A broker address that does not exist passes every check but the ship's own:
    ingest never connects, and the ship goes back to what worked and says why."""
    ship = await _ship(tmp_path, shore, mosquitto, health="2s")
    try:
        version = shore.config_set('[mqtt]\nhost = "broker.invalid"\n')
        await eventually_async(lambda: ship.supervisor.runs >= 3, 30, "applied, rolled back")
        await asyncio.wait_for(ship.agent.ingest.connected.wait(), 20)
        held = ship.held()
        assert held["version"] == 0 and held["lines"] == {}
        assert f"version {version} rolled back: ingest not connected" in held["failure"]
        assert held["refused"] == {"g:north": version}
        assert ship.agent.cfg.mqtt.host == "127.0.0.1"
        await eventually_async(
            lambda: (r := _reported(ship)) is not None and "rolled back" in (r["failure"] or ""),
            20,
            "reported",
        )
        runs = ship.supervisor.runs
        await eventually_async(lambda: ship.agent.uplink and ship.agent.uplink.reached.is_set())
        assert ship.supervisor.runs == runs  # not fetched again
    finally:
        await ship.stop()


async def test_a_port_links_only_entry_waits_for_a_port_link(
    tmp_path: Path, shore: Shore, mosquitto: MosquittoBroker
) -> None:
    """A large change marked for port links only costs the satellite nothing: the
    ship hears of it, and fetches it only once a port link carries the exchange."""
    ship = await _ship(tmp_path, shore, mosquitto, link="satellite")
    try:
        shore.config_set('[streams.nav]\nmax_age = "7d"\n', port_links_only=True)
        fleet = ship.agent.fleet
        assert fleet is not None
        # the ship heard of it over the satellite, and left it for a port link
        await eventually_async(lambda: fleet.waiting_for_port, 20, "offered")
        assert ship.held()["version"] == 0 and ship.supervisor.runs == 1
        assert ship.held()["failure"] is None
    finally:
        await ship.stop()


async def test_a_link_cut_while_fetching_leaves_the_old_configuration_then_fetches_again(
    tmp_path: Path, shore: Shore, mosquitto: MosquittoBroker, toxiproxy: Toxiproxy
) -> None:
    """The satellite drops mid-answer: the ship keeps running the configuration it had
    whole (nothing of the half-received one), and fetches the new one at a later
    exchange."""
    proxy, proxy_port = unique("cfg-link"), free_port()
    toxiproxy.create_proxy(proxy, f"127.0.0.1:{proxy_port}", f"127.0.0.1:{shore.port}")
    toxiproxy.set_enabled(proxy, False)
    ship = await _ship(tmp_path, shore, mosquitto, port=proxy_port)
    try:
        # a document that cannot compress below the cut
        filler = secrets.token_hex(6000)
        version = shore.config_set(f'[streams.nav]\nmax_age = "7d"\n# {filler}\n')
        toxiproxy.add_toxic(proxy, "limit_data", name="cut", bytes=3000)
        toxiproxy.set_enabled(proxy, True)
        # each connection is cut 3,000 bytes in: the answer never arrives whole
        await eventually_async(
            lambda: (
                (ship.agent.uplink is not None) and ship.agent.uplink.budgets["port_wifi"].spent > 0
            ),
            20,
            "a fetch tried",
        )
        assert ship.held()["version"] == 0 and ship.held()["lines"] == {}
        assert ship.supervisor.runs == 1
        toxiproxy.remove_toxic(proxy, "cut")
        await eventually_async(lambda: ship.supervisor.runs == 2, 30, "fetched again")
        assert ship.held()["version"] == version
        assert ship.agent.cfg.streams["nav"].max_age_s == 7 * 86400
    finally:
        await ship.stop()


def test_an_agent_that_died_during_its_trial_rolls_back_at_its_next_start(
    tmp_path: Path, mosquitto: MosquittoBroker
) -> None:
    """A configuration that kills the agent (a crash, the watchdog) before its health
    check ends must not be run again and again: the next start finds the trial still
    open, puts the state before back and says why."""
    reg = Registry.init(tmp_path / "registry")
    bundle = provision(reg, "bigblue", ["north"], out=tmp_path / "bundle")
    body = {
        "scope": "group",
        "name": "north",
        "format": "toml",
        "document": '[streams.nav]\nmax_age = "7d"\n',
        "port_links_only": False,
    }
    reg.append([("config_set", body)])
    reg.refresh()
    doc = edge_config_doc(tmp_path, mosquitto)
    doc["uplink"] = {"fleet_pub_file": str(bundle / "fleet.pub")}
    config = write_toml(tmp_path / "edge.toml", doc)
    cfg, fleet = load_effective(config)
    assert fleet is not None and cfg.streams["nav"].max_age_s == 30 * 86400
    line = reg.state.config_lines[reg.state.version]
    offer = {"g:north": (reg.state.version, False)}
    assert fleet.take(offer, {"g:north": None}, encode_delta([line], None))
    assert fleet.begin()  # the run on it starts its trial ... and dies

    cfg, fleet = load_effective(config)
    assert fleet is not None and cfg.streams["nav"].max_age_s == 30 * 86400
    assert fleet.state.version == 0 and fleet.state.trial == ""
    assert "stopped during its health check" in (fleet.state.failure or "")
    assert fleet.wanted(offer, cfg.links["port_wifi"]) is None  # not fetched again
