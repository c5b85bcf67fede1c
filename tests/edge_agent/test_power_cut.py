"""A power cut on the ship takes the broker and the agent down together. Mosquitto
acknowledges a sensor's PUBLISH before it writes its persistence file, and a restored
file redelivers what the agent had already committed (without the DUP flag when the
message was still queued at the save): this measures what that loses and doubles with
the sample ``deploy/mosquitto/ship.conf``."""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import random
import re
import signal
import sqlite3
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from local_stack.process import Proc, free_port, port_open
from local_stack.tools import mosquitto_bin
from tests.edge_agent.helpers import AgentProcess, write_config
from tests.helpers import eventually, kill9, run_process

SHIP_CONF = Path(__file__).resolve().parents[2] / "deploy" / "mosquitto" / "ship.conf"
SHIP_ACL = SHIP_CONF.with_name("shorelink.acl")
#: the lines of ship.conf that only say where things are on a real ship
_LOCAL = re.compile(
    r"^(listener|persistence_location|log_dest|log_type|user|password_file|acl_file)\b"
)
#: the logins of the sample: the agent (its username is its client id, as the sample's
#: edge.toml and ACL name it) and a sensor gateway (any other user)
AGENT = ("shorelink-edge-bigblue", "agent-pw")
SENSOR = ("logger-deck1", "sensor-pw")
#: another device on the ship's network, with a login of its own
INTRUDER = ("logger-deck2", "intruder-pw")


class ShipBroker:
    """Mosquitto with the sample ship.conf (only listener, paths and logs replaced)."""

    def __init__(self, root: Path, overrides: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.host = "127.0.0.1"
        data = root / "data"
        data.mkdir(parents=True, exist_ok=True)
        overrides = overrides or {}
        kept = [
            ln
            for ln in SHIP_CONF.read_text().splitlines()
            if not _LOCAL.match(ln) and ln.split(" ")[0] not in overrides
        ]
        kept += [f"{k} {v}" for k, v in overrides.items()]
        # the sample's logins and its ACL as shipped, the password file made as the
        # sample says (mosquitto_passwd), readable by its owner only
        passwd = root / "shorelink.passwd"
        for i, (user, password) in enumerate((AGENT, SENSOR, INTRUDER)):
            create = ["-c"] if i == 0 else []
            subprocess.run(
                ["mosquitto_passwd", *create, "-b", str(passwd), user, password], check=True
            )
        passwd.chmod(0o600)
        acl = root / "shorelink.acl"
        acl.write_text(SHIP_ACL.read_text())
        self.conf = root / "mosquitto.conf"
        self.conf.write_text(
            "\n".join(
                [
                    f"listener {self.port} {self.host}",
                    f"user {getpass.getuser()}",
                    f"persistence_location {data}/",
                    f"password_file {passwd}",
                    f"acl_file {acl}",
                    f"log_dest file {root / 'mosquitto.log'}",
                    "log_type error",
                    "log_type warning",
                    *kept,
                    "",
                ]
            )
        )
        self.log = root / "mosquitto.out"
        self.proc: Proc | None = None

    def start(self) -> None:
        self.proc = run_process("mosquitto:ship", [mosquitto_bin(), "-c", str(self.conf)], self.log)
        self.proc.wait_ready(lambda: port_open(self.host, self.port), timeout=20)

    @property
    def db_file(self) -> Path:
        return self.conf.parent / "data" / "mosquitto.db"

    def save(self) -> None:
        """Have the broker write its persistence file now (SIGUSR1), and wait for it."""
        assert self.proc is not None
        before = self.db_file.stat().st_mtime_ns if self.db_file.exists() else 0
        os.kill(self.proc.pid, signal.SIGUSR1)
        eventually(
            lambda: self.db_file.exists() and self.db_file.stat().st_mtime_ns != before,
            within=10,
            what="mosquitto to save",
            interval=0.02,
        )

    def kill9(self) -> None:
        assert self.proc is not None
        kill9(self.proc)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop(grace=5)


def _agent_config(tmp_path: Path, broker: ShipBroker) -> Path:
    """The agent as the samples have it: its username its client id."""
    user, password = AGENT
    return write_config(
        tmp_path,
        broker,  # type: ignore[arg-type]
        client_id=user,
        username=user,
        password=password,
    )


@dataclass
class CountingSensor:
    """A QoS 1 sensor gateway that numbers its messages and counts the ones the broker
    acknowledged; it reconnects by itself (paho) when the broker comes back."""

    broker: ShipBroker
    client_id: str
    login: tuple[str, str] = SENSOR
    acked: set[int] = field(default_factory=set)
    sent: int = 0

    def __post_init__(self) -> None:
        self._infos: list[tuple[int, mqtt.MQTTMessageInfo]] = []
        self._lock = threading.Lock()
        c = self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=self.client_id,
            protocol=MQTTProtocolVersion.MQTTv5,
        )
        c.username_pw_set(*self.login)
        c.max_inflight_messages_set(50)
        c.max_queued_messages_set(0)
        # paho types the delays as int; fractions of a second work
        c.reconnect_delay_set(0.05, 0.2)  # type: ignore[arg-type]
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 3600
        c.connect(self.broker.host, self.broker.port, clean_start=False, properties=props)
        c.loop_start()

    def publish(self) -> None:
        n = self.sent
        self.sent += 1
        body = json.dumps({"seq": n, "t": 4.5}).encode()
        info = self.client.publish(f"bigblue/deck{n % 3}/containers/c{n % 40}/env", body, qos=1)
        self._infos.append((n, info))

    def settle(self, timeout: float = 30) -> int:
        """Wait until every message is acknowledged, at most ``timeout`` s; return how
        many are (after power cuts the caller counts the acknowledged ones, whatever
        their number, so running out of time is no failure here)."""
        with contextlib.suppress(AssertionError):
            eventually(lambda: not self.unacked_seqs(), within=timeout, what="every PUBACK")
        return len(self.acked_seqs())

    def unacked_seqs(self) -> set[int]:
        return {n for n, info in list(self._infos) if not _broker_acked(info)}

    def acked_seqs(self) -> set[int]:
        return {n for n, info in self._infos if _broker_acked(info)}

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def _broker_acked(info: mqtt.MQTTMessageInfo) -> bool:
    # is_published() raises for a message published while the broker was down (paho
    # queues it and sends it on reconnect); the PUBACK still marks it published
    return bool(info._published)


def _stored_seqs(db: Path) -> Counter[int]:
    with sqlite3.connect(db) as c:
        rows = c.execute("SELECT payload FROM records WHERE stream = 'containers'").fetchall()
    return Counter(json.loads(p)["seq"] for (p,) in rows if p.startswith(b'{"seq"'))


@dataclass
class PowerCutResult:
    kills: int
    acked: int
    stored: int
    lost: int
    #: stored twice although the sensor sent them once (the agent's side)
    doubled: int
    #: stored twice because the sensor sent them twice: the broker had them (saved)
    #: but its PUBACK had not reached the sensor when the power went (QoS 1)
    doubled_by_sensor: int
    #: messages the broker acknowledged per second of the steady publish
    rate: float


def run_power_cuts(
    tmp_path: Path, kills: int, seed: int = 11, overrides: dict[str, str] | None = None
) -> PowerCutResult:
    broker = ShipBroker(tmp_path / "mosquitto", overrides)
    broker.start()
    cfg = _agent_config(tmp_path, broker)
    db = tmp_path / "edge.db"
    agent = AgentProcess(cfg, tmp_path / "agent.log")
    sensor = CountingSensor(broker, f"sensor-{tmp_path.name}"[:60])
    rng = random.Random(seed)
    stop = threading.Event()
    resent: set[int] = set()

    def publish_steadily() -> None:
        while not stop.is_set() and sensor.sent < 60_000:  # bounded load
            # a sensor that publishes while the broker is down has paho queue the
            # message and, at times, send it twice on reconnect (a second PUBLISH:
            # QoS 1 between sensor and broker, not what this measures)
            if sensor.client.is_connected():
                sensor.publish()
            time.sleep(0.001)

    try:
        agent.start()
        _wait_subscribed(db, sensor)
        t = threading.Thread(target=publish_steadily, daemon=True)
        t.start()
        began = time.monotonic()
        for _ in range(kills):
            time.sleep(rng.uniform(0.8, 2.0))
            # the power cut: both at once
            broker.kill9()
            agent.kill9()
            resent |= sensor.unacked_seqs()  # paho sends these again on reconnect
            broker.start()
            agent.start()
        time.sleep(1.0)
        stop.set()
        t.join(10)
        published_s = time.monotonic() - began
        sensor.settle()
        acked = sensor.acked_seqs()
        # drain: the agent takes what the broker kept until nothing more arrives
        counts = [-1]

        def drained() -> bool:
            counts.append(sum(_stored_seqs(db).values()))
            return counts[-1] == counts[-2]

        with contextlib.suppress(AssertionError):  # then count what is stored by now
            eventually(drained, within=30, what="nothing more arriving", interval=1.5)
        stored = _stored_seqs(db)
    finally:
        stop.set()
        sensor.close()
        agent.terminate()
        broker.stop()
    return PowerCutResult(
        kills=kills,
        acked=len(acked),
        stored=len(stored),
        lost=len(acked - set(stored)),
        doubled=sum(c - 1 for n, c in stored.items() if c > 1 and n not in resent),
        doubled_by_sensor=sum(c - 1 for n, c in stored.items() if c > 1 and n in resent),
        rate=len(acked) / published_s,
    )


def _wait_subscribed(db: Path, sensor: CountingSensor) -> None:
    """The agent's session exists once its first message is stored: probe until then."""

    def subscribed() -> bool:
        if db.exists() and _table_ready(db) and _stored_seqs(db):
            return True
        sensor.publish()
        return False

    eventually(subscribed, within=30, what="the agent to subscribe", interval=0.2)


def _table_ready(db: Path) -> bool:
    with sqlite3.connect(db) as c:
        return (
            c.execute("SELECT 1 FROM sqlite_master WHERE name = 'records'").fetchone() is not None
        )


#: what a power cut may lose, in seconds of the sensor's rate: what the broker had passed
#: straight to the agent and the agent had not committed yet, a commit's latency (a few
#: ms on an idle machine; 25 ms with both cores busy; 130 ms under a whole CI run's
#: load, seen: 538 messages in 15 cuts at 275 a second). ship.conf's former 30 s
#: autosave lost 0.3 s of it per cut (docs/edge-agent.md, "Power cuts").
LOSS_WINDOW_S = 0.2


def test_power_cut_of_broker_and_agent_together_measured_with_ship_conf(tmp_path: Path) -> None:
    """15 power cuts (kill -9 of Mosquitto and the agent at once) during a steady
    publish lose no more than the window docs/edge-agent.md ("Power cuts") states, what
    the agent had not committed yet (:data:`LOSS_WINDOW_S`; with ship.conf's former 30 s
    autosave: thousands), and the agent stores nothing twice that the sensor sent once."""
    extra = os.environ.get("SHORELINK_POWER_CUT_CONF", "")  # measuring: "key value;key value"
    overrides = dict(kv.strip().split(" ", 1) for kv in extra.split(";") if kv.strip())
    r = run_power_cuts(tmp_path, kills=15, overrides=overrides)
    print(f"power cut: {r}")
    assert r.acked > 5000
    assert r.lost <= r.kills * r.rate * LOSS_WINDOW_S, r
    assert r.doubled == 0, r


def test_broker_restored_from_an_older_file_redelivers_nothing_the_agent_stores_twice(
    tmp_path: Path,
) -> None:
    """The broker saves while 50 messages wait for the agent; the agent commits and
    acknowledges them; a power cut comes before the next save. The restored broker
    sends the 50 again, without DUP (they were queued, not sent, at the save): the
    agent recognises them, and still stores what is published afterwards."""
    broker = ShipBroker(
        tmp_path / "mosquitto", {"autosave_interval": "0", "autosave_on_changes": "false"}
    )
    broker.start()
    cfg = _agent_config(tmp_path, broker)
    db = tmp_path / "edge.db"
    agent = AgentProcess(cfg, tmp_path / "agent.log")
    sensor = CountingSensor(broker, f"sensor-{tmp_path.name}"[:60])
    try:
        agent.start()
        _wait_subscribed(db, sensor)
        agent.terminate()
        first = sensor.sent  # probes before the subscription existed are not anyone's
        for _ in range(50):
            sensor.publish()
        assert sensor.settle() == sensor.sent
        broker.save()  # the 50 are queued for the agent in this file
        agent.start()
        eventually(
            lambda: set(range(first, sensor.sent)) <= set(_stored_seqs(db)),
            within=20,
            what="the agent to take the 50",
        )
        time.sleep(0.5)  # its PUBACKs reach the broker, which does not save again
        broker.kill9()
        agent.kill9()
        broker.start()
        agent.start()
        for _ in range(10):
            sensor.publish()
        assert sensor.settle() == sensor.sent
        eventually(
            lambda: set(range(first, sensor.sent)) <= set(_stored_seqs(db)),
            within=20,
            what="the messages after the cut",
        )
        time.sleep(1.0)  # the redeliveries came first; give any stray one time to land
        stored = _stored_seqs(db)
    finally:
        sensor.close()
        agent.terminate()
        broker.stop()
    assert sensor.sent == first + 60
    assert [n for n, c in stored.items() if c > 1] == [], "stored twice"
    assert set(range(first, sensor.sent)) <= set(stored)


def _client(broker: ShipBroker, client_id: str, login: tuple[str, str] | None) -> mqtt.Client:
    """A device on the ship's network: connects (reconnecting by itself), keeps a
    session, and records every CONNACK's reason and every message it is given."""
    c = mqtt.Client(
        CallbackAPIVersion.VERSION2, client_id=client_id, protocol=MQTTProtocolVersion.MQTTv5
    )
    if login is not None:
        c.username_pw_set(*login)
    c.user_data_set({"connacks": [], "got": []})
    c.on_connect = lambda cl, ud, fl, rc, pr: (
        ud["connacks"].append(str(rc)),
        rc.is_failure or cl.subscribe("#", qos=1),
    )
    c.on_message = lambda cl, ud, msg: ud["got"].append(msg.payload)
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 3600
    c.connect(broker.host, broker.port, clean_start=False, properties=props)
    c.loop_start()
    return c


def test_no_device_on_the_ships_network_takes_the_agents_session(tmp_path: Path) -> None:
    """Review M8: with the former sample (anonymous clients, any client id) a device
    connecting with the agent's client id took over its persistent session, and the
    readings it was given were acknowledged away from the agent's log. With the
    sample now: an anonymous client is refused; a device with a login of its own gets
    its username as client id (no takeover) and may not read; the agent stores every
    reading published meanwhile."""
    broker = ShipBroker(tmp_path / "mosquitto")
    broker.start()
    db = tmp_path / "edge.db"
    agent = AgentProcess(_agent_config(tmp_path, broker), tmp_path / "agent.log")
    sensor = CountingSensor(broker, "sensor")
    devices: list[mqtt.Client] = []
    try:
        agent.start()
        _wait_subscribed(db, sensor)
        first = sensor.sent
        devices += [_client(broker, AGENT[0], None), _client(broker, AGENT[0], INTRUDER)]
        anonymous, intruder = (d.user_data_get() for d in devices)
        eventually(
            lambda: anonymous["connacks"] and intruder["connacks"],
            within=10,
            what="both devices answered",
        )
        assert anonymous["connacks"][0] == "Not authorized"
        assert intruder["connacks"][0] == "Success"
        for _ in range(200):
            sensor.publish()
        assert sensor.settle() == sensor.sent
        eventually(
            lambda: set(range(first, sensor.sent)) <= set(_stored_seqs(db)),
            within=30,
            what="every reading in the agent's log",
        )
        assert intruder["got"] == [], "a device read the ship's readings"
    finally:
        for d in devices:
            d.loop_stop()
            d.disconnect()
        sensor.client.loop_stop()
        agent.terminate()
        broker.stop()
