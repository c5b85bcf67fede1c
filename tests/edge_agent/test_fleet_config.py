"""The fleet's configuration reaching a ship (docs/fleet-registry.md, "Configuration to
the ships"): a real gateway following a registry on real Kafka, the agent against it
(through toxiproxy where the link matters), its supervisor restarting it on a change.
What a ship runs is decided at headquarters and signed there: the gateway only carries
it, the ship checks it and keeps running what works."""

from __future__ import annotations

import asyncio
import json
import secrets
from pathlib import Path
from typing import Any

import aiohttp

from edge_agent.fleet_config import load_effective
from local_stack.mosquitto import MosquittoBroker
from local_stack.process import free_port
from local_stack.toxiproxy import Toxiproxy
from shorelink.fleet.bundle import provision
from shorelink.fleet.entry import FleetKey, sign_entry
from shorelink.fleet.log import Registry
from shorelink.fleet.shipconfig import encode_delta, request_json
from shorelink.ship_report import decode_report
from tests.edge_agent.fleet_helpers import Ship, Shore, fleet_ship
from tests.edge_agent.helpers import Publisher, Sensors, edge_config_doc
from tests.helpers import eventually_async, unique, write_toml


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
    (what a rollout reads). Its metrics listener is the restarted run's too (a restart
    that kept the old run's socket died on its port)."""
    port = free_port()
    ship = await fleet_ship(tmp_path, shore, mosquitto, metrics_port=port)
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
        assert not ship.task.done(), "the agent runs on after its restart"
        async with (
            aiohttp.ClientSession() as s,
            s.get(f"http://127.0.0.1:{port}/metrics") as r,
        ):
            assert "shorelink_edge_" in await r.text()
    finally:
        await ship.stop()


async def test_a_key_this_agent_does_not_know_is_kept_out_and_the_reason_reported(
    tmp_path: Path, shore: Shore, mosquitto: MosquittoBroker
) -> None:
    """An agent of an older schema in a mixed fleet keeps what it runs rather than
    choke on a key it cannot read, and says which key."""
    ship = await fleet_ship(tmp_path, shore, mosquitto)
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
    ship = await fleet_ship(tmp_path, shore, mosquitto)
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
    ship = await fleet_ship(tmp_path, shore, mosquitto, health="2s")
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
    ship = await fleet_ship(tmp_path, shore, mosquitto, link="satellite")
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
    ship = await fleet_ship(tmp_path, shore, mosquitto, port=proxy_port)
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
        fleet = ship.agent.fleet
        assert fleet is not None and fleet.received_bytes == 0  # nothing whole arrived
        for _ in range(200):  # an answer served, then cut
            if await shore.config_bytes_served() > 3000:
                break
            await asyncio.sleep(0.05)
        toxiproxy.remove_toxic(proxy, "cut")
        await eventually_async(lambda: ship.supervisor.runs == 2, 30, "fetched again")
        assert ship.held()["version"] == version
        assert ship.agent.cfg.streams["nav"].max_age_s == 7 * 86400
        # the answer that arrived whole is counted once against the budget; the ones cut
        # short were served (the gateway counts them) but never received whole
        served = await shore.config_bytes_served()
        assert fleet.received_bytes < served and served % fleet.received_bytes == 0
        requests = fleet.sent_bytes // len(request_json({"g:north": None}, 0))
        assert fleet.sent_bytes == requests * len(request_json({"g:north": None}, 0))
        assert 2 <= served // fleet.received_bytes <= requests  # at most one per request
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


async def test_a_ship_follows_a_fleet_key_rotation_and_refuses_a_forged_one(
    tmp_path: Path, shore: Shore, mosquitto: MosquittoBroker
) -> None:
    """Headquarters replaces its fleet key: the ship, which pins the root only, is
    served the rotation with the configuration the new key signed and follows it (and
    keeps it across its restart); a rotation signed by anyone else is refused, nothing
    applied."""
    ship = await fleet_ship(tmp_path, shore, mosquitto)
    try:
        await eventually_async(lambda: ship.agent.uplink and ship.agent.uplink.reached.is_set())
        new_key = shore.registry.rotate_fleet_key()
        rotation = shore.publish()
        version = shore.config_set('[streams.nav]\nmax_age = "7d"\n')
        assert shore.registry.entries()[-1].signer == new_key.id
        await eventually_async(lambda: ship.supervisor.runs == 2, 20, "restarted onto it")
        # the run after the restart read the entry back, checked by the rotated key
        assert ship.agent.cfg.streams["nav"].max_age_s == 7 * 86400
        held = ship.held()
        assert held["version"] == version and len(held["rotations"]) == 1
        assert f'"version":{rotation}' in held["rotations"][0]
        await eventually_async(lambda: ship.held()["trial"] == "", 20, "kept once healthy")

        # a gateway that serves a rotation to a thief's key, and what the thief signed
        thief, state = FleetKey.generate(), shore.registry.state
        fake = sign_entry(
            thief, version + 1, state.head, "fleet_key_rotated", {"fleet_key": thief.public}
        )
        body = {
            "scope": "group",
            "name": "north",
            "format": "toml",
            "document": '[mqtt]\nhost = "evil.invalid"\n',
            "port_links_only": False,
        }
        forged = sign_entry(thief, version + 2, fake.digest, "config_set", body)
        fleet = ship.agent.fleet
        assert fleet is not None
        base = state.config_lines[version]
        answer = encode_delta([forged.raw, fake.raw], [base])
        assert not fleet.take({"g:north": (version + 2, False)}, {"g:north": version}, answer)
        assert "forged" in (fleet.state.failure or "")
        assert ship.held()["version"] == version and len(ship.held()["rotations"]) == 1
        assert ship.supervisor.runs == 2
    finally:
        await ship.stop()


async def test_a_ship_hears_of_a_new_version_on_the_upload_it_keeps_open(
    tmp_path: Path, shore: Shore, mosquitto: MosquittoBroker
) -> None:
    """A ship at sea keeps one upload connection for hours: a change must reach it on
    that connection (in the answer to its next batch), and while nothing changes the
    answers carry not one byte more."""
    ship = await fleet_ship(tmp_path, shore, mosquitto, refresh="1h", heartbeat="1s")
    try:
        await eventually_async(lambda: ship.agent.uplink and ship.agent.uplink.reached.is_set())
        uplink = ship.agent.uplink
        assert uplink is not None
        upload = uplink.gateways[0]._upload  # type: ignore[attr-defined]
        assert upload is not None and upload.config_offer == {}
        # a report goes up every second: batches answered, no offer among them
        await eventually_async(lambda: uplink._accepted >= 3, 20, "batches answered")
        before = upload.offers_heard
        version = shore.config_set('[streams.nav]\nmax_age = "7d"\n')
        await eventually_async(lambda: ship.supervisor.runs == 2, 20, "applied")
        assert before == 0 and upload.offers_heard == 1
        assert upload.config_offer == {"g:north": (version, False)}
    finally:
        await ship.stop()


async def test_a_ship_whose_upload_never_runs_dry_takes_a_new_version_at_once(
    tmp_path: Path, shore: Shore, mosquitto: MosquittoBroker, toxiproxy: Toxiproxy
) -> None:
    """A ship draining a backlog, or at sea with readings arriving faster than a round
    trip, always has a batch to send: its session never ends by itself. An offer a
    batch's answer brings breaks it off, and the configuration is taken then (before,
    only once the session ran dry: here, never)."""
    proxy, proxy_port = unique("busy-link"), free_port()
    toxiproxy.create_proxy(proxy, f"127.0.0.1:{proxy_port}", f"127.0.0.1:{shore.port}")
    toxiproxy.add_toxic(proxy, "latency", name="rtt", latency=300)  # on every answer
    ship = await fleet_ship(tmp_path, shore, mosquitto, port=proxy_port, refresh="1h")
    pub = Publisher(mosquitto, unique("sensors"))
    sensors: Sensors | None = None
    try:
        uplink = ship.agent.uplink
        assert uplink is not None
        await eventually_async(lambda: uplink.reached.is_set(), 20, "the gateway reached")
        sensors = Sensors(pub)  # about 1,000 readings a second: 300 in every round trip
        await eventually_async(lambda: uplink._accepted >= 5, 20, "batches answered")
        version = shore.config_set('[streams.nav]\nmax_age = "7d"\n')
        await eventually_async(lambda: ship.supervisor.runs == 2, 20, "applied")
        assert ship.held()["version"] == version
        assert ship.agent.cfg.streams["nav"].max_age_s == 7 * 86400
    finally:
        if sensors is not None:
            await sensors.end()
        pub.close()
        await ship.stop()


async def test_a_scope_removed_from_a_ship_goes_back_to_what_applies_without_it(
    tmp_path: Path, shore: Shore, mosquitto: MosquittoBroker
) -> None:
    """Headquarters removes a group's configuration: its ships go back to edge.toml
    under what still applies (here the ship's own), on the signed entry that removed
    it, and report the version they then run."""
    ship = await fleet_ship(tmp_path, shore, mosquitto)
    try:
        shore.config_set('[streams.nav]\nmax_age = "7d"\n')
        own = shore.config_set('[streams.alerts]\nmax_age = "3d"\n', ship=ship.name)
        await eventually_async(lambda: ship.held()["version"] == own, 20, "both applied")
        await eventually_async(lambda: ship.held()["trial"] == "", 20, "kept")
        runs = ship.supervisor.runs
        removed = shore.config_remove()
        await eventually_async(lambda: ship.supervisor.runs == runs + 1, 20, "went back")
        cfg = ship.agent.cfg
        assert cfg.streams["nav"].max_age_s == 30 * 86400  # edge.toml's again
        assert cfg.streams["alerts"].max_age_s == 3 * 86400  # its own stays
        held = ship.held()
        assert list(held["lines"]) == [f"s:{ship.name}"] and held["version"] == own
        assert held["floor"]["g:north"] == removed
        await eventually_async(
            lambda: _reported(ship) == {"version": own, "failure": None}, 20, "reported"
        )
    finally:
        await ship.stop()


async def test_a_ship_moved_to_another_group_leaves_the_old_groups_configuration(
    tmp_path: Path, shore: Shore, mosquitto: MosquittoBroker
) -> None:
    """Headquarters moves a ship from one group to another: in one exchange it drops the
    configuration of the group it left (on the signed entry that set its groups) and
    takes the new group's."""
    ship = await fleet_ship(tmp_path, shore, mosquitto)
    try:
        north = shore.config_set('[streams.nav]\nmax_age = "7d"\n')
        await eventually_async(lambda: ship.held()["version"] == north, 20, "north's")
        await eventually_async(lambda: ship.held()["trial"] == "", 20, "kept")
        body = {
            "scope": "group",
            "name": "south",
            "format": "toml",
            "document": '[streams.alerts]\nmax_age = "3d"\n',
            "port_links_only": False,
        }
        shore.registry.append([("config_set", body)])
        south = shore.publish()
        runs = ship.supervisor.runs
        shore.registry.append([("ship_groups_set", {"ship": ship.name, "groups": ["south"]})])
        moved = shore.publish()
        await eventually_async(lambda: ship.supervisor.runs == runs + 1, 20, "moved")
        assert ship.held()["version"] == south  # one exchange, one restart for both
        assert list(ship.held()["lines"]) == ["g:south"]
        assert ship.held()["floor"]["g:north"] == moved
        cfg = ship.agent.cfg
        assert cfg.streams["nav"].max_age_s == 30 * 86400
        assert cfg.streams["alerts"].max_age_s == 3 * 86400
    finally:
        await ship.stop()


async def test_a_canary_goes_back_to_its_groups_configuration_when_its_rollout_stops(
    tmp_path: Path, shore: Shore, mosquitto: MosquittoBroker
) -> None:
    """A rollout reaches the ship, then is stopped: the group's configuration before it
    is older than what the ship runs, and the ship goes back to it on the signed stop
    the gateway serves with it (not on an older entry alone), and says so."""
    ship = await fleet_ship(tmp_path, shore, mosquitto)
    try:
        base = shore.config_set('[streams.nav]\nmax_age = "7d"\n')
        await eventually_async(lambda: ship.held()["version"] == base, 20, "the group's")
        await eventually_async(lambda: ship.held()["trial"] == "", 20, "kept")
        body = {
            "group": "north",
            "format": "toml",
            "document": '[streams.nav]\nmax_age = "9d"\n',
            "port_links_only": False,
            "stages": ["100%"],
            "healthy_s": 60,
            "stop_failure_percent": 10,
        }
        shore.registry.append([("rollout_started", body)])
        rollout = shore.publish()
        await eventually_async(lambda: ship.held()["version"] == rollout, 20, "the rollout's")
        await eventually_async(lambda: ship.held()["trial"] == "", 20, "kept")
        assert ship.agent.cfg.streams["nav"].max_age_s == 9 * 86400
        stop = {"rollout": rollout, "reason": "stopped by hand", "by": "operator"}
        shore.registry.append([("rollout_stopped", stop)])
        stopped = shore.publish()
        await eventually_async(lambda: ship.held()["version"] == base, 20, "back")
        await eventually_async(lambda: ship.held()["trial"] == "", 20, "kept")
        assert ship.agent.cfg.streams["nav"].max_age_s == 7 * 86400
        assert ship.held()["floor"]["g:north"] == stopped
        await eventually_async(
            lambda: _reported(ship) == {"version": base, "failure": None}, 20, "reported"
        )
    finally:
        await ship.stop()


async def test_a_scope_whose_end_no_gateway_keeps_stays_and_the_batches_go_on(
    tmp_path: Path, shore: Shore, mosquitto: MosquittoBroker
) -> None:
    """A ship holds a scope the registry no longer gives it, and the gateway keeps no
    signed end of it (here: a group the ship was never in): the request is refused,
    the ship keeps what it runs, its batches go on, and it does not ask again on each
    new connection until the registry moves."""
    body = {
        "scope": "group",
        "name": "south",
        "format": "toml",
        "document": '[streams.alerts]\nmax_age = "3d"\n',
        "port_links_only": False,
    }
    shore.registry.append([("config_set", body)])
    south = shore.publish()
    line = shore.registry.state.config_lines[south].decode()
    held = {"version": south, "lines": {"g:south": line}, "failure": None, "refused": {}}
    held |= {"trial": "", "previous": None}
    ship = await fleet_ship(tmp_path, shore, mosquitto, held=held, heartbeat="1s")
    try:
        uplink, fleet = ship.agent.uplink, ship.agent.fleet
        assert uplink is not None and fleet is not None
        assert ship.agent.cfg.streams["alerts"].max_age_s == 3 * 86400
        uploads: set[int] = set()

        def connections() -> int:
            up = uplink.gateways[0]._upload  # type: ignore[attr-defined]
            if up is not None:
                uploads.add(id(up))
            return len(uploads)

        await eventually_async(lambda: fleet.sent_bytes > 0, 20, "asked once")
        await eventually_async(lambda: connections() >= 4, 30, "connections after it")
        accepted = uplink._accepted
        await eventually_async(lambda: uplink._accepted > accepted, 20, "batches go on")
        assert fleet.sent_bytes == len(request_json({"g:south": south}, 0))  # once
        assert ship.held()["lines"] == {"g:south": line} and ship.supervisor.runs == 1
    finally:
        await ship.stop()


def _two_configurations(
    tmp_path: Path, mosquitto: MosquittoBroker
) -> tuple[Registry, int, int, dict[str, Any], Path]:
    """A registry whose group ``north`` had two configurations (their versions, older
    first) and a ship's edge.toml (its document and file) that pins its fleet key."""
    reg = Registry.init(tmp_path / "registry")
    bundle = provision(reg, "bigblue", ["north"], out=tmp_path / "bundle")
    body = {"scope": "group", "name": "north", "format": "toml", "port_links_only": False}
    reg.append([("config_set", {**body, "document": '[streams.nav]\nmax_age = "7d"\n'})])
    reg.append([("config_set", {**body, "document": '[streams.nav]\nmax_age = "9d"\n'})])
    reg.refresh()
    old, new = reg.state.version - 1, reg.state.version
    doc = edge_config_doc(tmp_path, mosquitto)
    doc["uplink"] = {"fleet_pub_file": str(bundle / "fleet.pub")}
    config = write_toml(tmp_path / "edge.toml", doc)
    return reg, old, new, doc, config


def test_an_older_entry_replayed_at_a_ship_or_an_end_it_does_not_hold_is_refused(
    tmp_path: Path, mosquitto: MosquittoBroker
) -> None:
    """A gateway (or whoever sits on the link) that hands a ship an entry the fleet
    signed long ago, to take it back to an old configuration, is refused: only a later
    entry that ended what the ship holds takes it back."""
    reg, old, new, _, config = _two_configurations(tmp_path, mosquitto)
    lines = reg.state.config_lines
    cfg, fleet = load_effective(config)
    assert fleet is not None
    assert fleet.take(
        {"g:north": (new, False)}, {"g:north": None}, encode_delta([lines[new]], None)
    )
    fleet.healthy()

    # the older entry, genuinely signed, offered as if it were the group's now
    replay = encode_delta([lines[old]], [lines[new]])
    assert not fleet.take({"g:north": (old, False)}, {"g:north": new}, replay)
    assert "replayed" in (fleet.state.failure or "")
    assert fleet.state.version == new and fleet.state.refused == {}  # asked again later
    # a ship's gateway behind it (registry older than what it holds) is not even asked
    assert fleet.wanted({"g:north": (old, False)}, cfg.links["port_wifi"], registry=new) is None
    assert fleet.wanted({}, cfg.links["port_wifi"], registry=None) is None

    # the group's removal, genuinely signed, ends it: the ship goes back to edge.toml
    reg.append([("config_removed", {"scope": "group", "name": "north"})])
    reg.refresh()
    end = reg.entries()[-1]
    want = fleet.wanted({}, cfg.links["port_wifi"], registry=end.version)
    assert want == {"g:north": new}
    assert fleet.take({}, want, encode_delta([end.raw], [lines[new]]))
    assert fleet.state.lines == {} and fleet.state.version == 0
    fleet.healthy()
    # ... and the entry before it cannot be replayed at the ship now it holds none
    assert not fleet.take(
        {"g:north": (new, False)}, {"g:north": None}, encode_delta([lines[new]], None)
    )
    assert "replayed" in (fleet.state.failure or "")
    assert (
        fleet.wanted({"g:north": (new, False)}, cfg.links["port_wifi"], registry=end.version)
        is None
    )


def test_a_ships_file_from_the_agent_before_rotations_reads_and_follows_on(
    tmp_path: Path, mosquitto: MosquittoBroker
) -> None:
    """An agent upgraded on board finds the file the agent before it wrote (no fleet
    key rotations, no newest entry per scope): it runs what that file holds, takes
    the newest entry of each scope from it, and refuses an older one replayed."""
    reg, old, new, doc, config = _two_configurations(tmp_path, mosquitto)
    lines = reg.state.config_lines
    before = {
        "version": new,
        "lines": {"g:north": lines[new].decode()},
        "failure": None,
        "refused": {},
        "trial": "",
        "previous": None,
    }
    Path(f"{doc['log']['path']}.fleet.json").write_text(json.dumps(before))
    cfg, fleet = load_effective(config)
    assert fleet is not None and cfg.streams["nav"].max_age_s == 9 * 86400
    assert fleet.keys.since == 0
    replay = encode_delta([lines[old]], [lines[new]])
    assert not fleet.take({"g:north": (old, False)}, {"g:north": new}, replay)
    assert "replayed" in (fleet.state.failure or "") and fleet.state.version == new
