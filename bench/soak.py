"""Soak: three sites and two ships on loopback under a seeded schedule of faults; then
every identity the ships' logs hold must be at every site, once.

    .venv/bin/python bench/soak.py --seed 7 --minutes 5            # mesh, then line
    .venv/bin/python bench/soak.py --seed 7 --minutes 2 --topology line

Everything is real and started as an operator starts it, through the deployables' own
command lines: per site a Kafka broker (``local_stack.kafka``), a gateway
(``shorelink-gateway run``) and a site application (``shorelink-spark site``, one
spark-submit per site); per ship a Mosquitto and an edge agent (``shorelink-edge run``)
fed by a QoS 1 publisher in this process; one toxiproxy carrying every link between
sites and every ship's link to a gateway. Ships sign (docs/replication.md, "Ship
signatures"); each site reads its own copy of the ship keys file.

The schedule (``bench/_faults.py``) is a pure function of ``--seed``, ``--minutes`` and
the topology: printed at the start and in the result, the same seed replays the same
faults. The nemesis here applies each fault to the running processes: SIGKILL of a
process group then a restart; a toxiproxy link disabled or slowed; SIGSTOP/SIGCONT of a
broker; Kafka ``delete_records`` from the start of a relay or canonical topic (on a
canonical topic only up to the first record no other site holds at that moment: the
system promises nothing for a record whose only copy is deleted); a site application
killed, its checkpoint directory removed, restarted; a ship's key replaced with
``shorelink ship-key new --replace``, the agent restarted with the new key, the new
file copied to each site after its own delay. A process that exits on its own is
started again (as systemd would) and counted.

When the faults are over, the publishers stop, every link and broker is healed and
every process is running; the checker then reads each ship's log (its SQLite file: the
identities the ship holds) and each site's canonical topics (``shorelink.kafka.audit``)
until every site holds every identity and still does ``--settle`` seconds later (a late
duplicate is seen), bounded by ``--converge-timeout``. Verdict ``clean``: nothing missing, nothing doubled,
nothing extra at any site.

Progress goes to stderr; one JSON object goes to stdout (exit status 2 when a run is not
clean).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import heapq
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import paho.mqtt.client as mqtt
import tomli_w
from confluent_kafka import TopicPartition
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from bench._common import exit_on_signals, progress, work_dir
from bench._faults import KINDS, Fault, World, draw, kinds_of, world
from local_stack.kafka import (
    KafkaBroker,
    LinkListener,
    start_site_broker,
)
from local_stack.mosquitto import start_mosquitto
from local_stack.process import Proc, free_ports, group_alive, stop_procs
from local_stack.spark import spark_driver_conf
from local_stack.tools import mosquitto_bin
from local_stack.toxiproxy import Toxiproxy, start_toxiproxy
from shorelink.contract import Record, canonical_topic, ingress_topic
from shorelink.errors import ContractError, ShorelinkError
from shorelink.files import write_atomic
from shorelink.kafka.admin import Admin
from shorelink.kafka.audit import audit_site
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.reading import read_to_end
from shorelink.kafka.topics import TopicSpec, ensure_topics
from shorelink.proof import ShipKey, ShipKeys
from shorelink.ranges import RangeSet

say = progress("soak")

HOST = "127.0.0.1"
#: the faults start once the stack has run this long with data flowing
WARM_S = 10.0


def _python(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def site_link(source: str, reader: str) -> str:
    """The proxy ``reader`` reaches ``source``'s Kafka through."""
    return f"soak-{source}-for-{reader}"


def ship_link(ship: str, site: str) -> str:
    return f"soak-{ship}-to-{site}"


# -- the ship's sensors -----------------------------------------------------------------
class Publisher(threading.Thread):
    """A ship's sensors: ``rate`` container readings a second and an alert every 2 s,
    QoS 1 with a persistent session (paho reconnects after its Mosquitto restarts)."""

    def __init__(self, ship: str, port: int, rate: float) -> None:
        super().__init__(daemon=True, name=f"publish-{ship}")
        self.ship, self.rate = ship, rate
        self.stop = threading.Event()
        self.sent = 0
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"soak-sensors-{ship}",
            protocol=MQTTProtocolVersion.MQTTv5,
        )
        self.client.max_inflight_messages_set(100)
        self.client.max_queued_messages_set(0)
        self.client.reconnect_delay_set(1, 2)
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 3600
        self.client.connect_async(HOST, port, clean_start=False, properties=props)
        self.client.loop_start()

    def run(self) -> None:
        period = 1.0 / self.rate
        next_t = time.monotonic()
        while not self.stop.is_set():
            n = self.sent
            box = f"C{n % 50:03d}"
            body = json.dumps({"i": n, "t": 4.5 + (n % 7) / 10, "door": "closed"}).encode()
            self.client.publish(f"soak/{self.ship}/containers/{box}/env", body, qos=1)
            if n % max(1, int(2 * self.rate)) == 0:
                self.client.publish(f"soak/{self.ship}/alerts/{box}/alert", body, qos=1)
            self.sent += 1
            next_t += period
            self.stop.wait(max(0.0, next_t - time.monotonic()))

    def close(self) -> None:
        self.stop.set()
        self.join(5)
        with contextlib.suppress(Exception):
            self.client.loop_stop()
            self.client.disconnect()


# -- the world on loopback --------------------------------------------------------------
@dataclass
class Component:
    """A process the nemesis may kill: how to start it again, and its current one."""

    name: str
    argv: list[str]
    log: Path
    proc: Proc
    #: killed on purpose, not yet started again
    down: bool = False
    paused: bool = False
    #: times it exited on its own and was started again
    exits: int = 0


@dataclass
class Stack:
    work: Path
    w: World
    args: argparse.Namespace
    comps: dict[str, Component] = field(default_factory=dict)
    brokers: dict[str, KafkaBroker] = field(default_factory=dict)
    toxiproxy: Toxiproxy | None = None
    toxiproxy_proc: Proc | None = None
    publishers: dict[str, Publisher] = field(default_factory=dict)
    mqtt_ports: dict[str, int] = field(default_factory=dict)
    key_serial: Counter[str] = field(default_factory=Counter)

    @property
    def logs(self) -> Path:
        return self.work / "logs"

    @property
    def procs(self) -> list[Proc]:
        extra = [self.toxiproxy_proc] if self.toxiproxy_proc else []
        return [c.proc for c in self.comps.values()] + extra

    def endpoint(self, site: str) -> KafkaEndpoint:
        return KafkaEndpoint.plaintext(self.brokers[site].bootstrap, timeout_s=10.0)

    def site_dir(self, site: str) -> Path:
        return self.work / "sites" / site

    def ship_dir(self, ship: str) -> Path:
        return self.work / "ships" / ship

    def master_keys(self) -> Path:
        return self.work / "ship_keys.toml"

    def site_keys(self, site: str) -> Path:
        return self.site_dir(site) / "ship_keys.toml"

    # -- start ----------------------------------------------------------------------
    def start(self) -> None:
        w, a = self.w, self.args
        self.logs.mkdir(parents=True, exist_ok=True)
        say(f"{w.topology}: starting toxiproxy, a Kafka broker per site")
        tp = start_toxiproxy(self.logs)
        self.toxiproxy_proc, self.toxiproxy = tp.proc, tp.client()
        ships = [s for s, _ in w.ships]
        free = iter(free_ports(len(w.sites) * 10 + len(ships) * 8))
        listeners = {
            s: {r: LinkListener(next(free), next(free)) for r in w.neighbours(s)} for s in w.sites
        }
        for s in w.sites:
            b = start_site_broker(s, self.site_dir(s) / "kafka", self.logs, free, listeners[s])
            self.brokers[s] = b
            self.comps[f"kafka:{s}"] = Component(f"kafka:{s}", b.argv, b.proc.log, b.proc)
            for r, ln in listeners[s].items():
                self.toxiproxy.create_proxy(
                    site_link(s, r), f"{HOST}:{ln.advertised}", f"{HOST}:{ln.port}"
                )
        for b in self.brokers.values():
            b.proc.wait_ready(b.ready, timeout=180)

        # every ship's key; each site its own copy of the keys file
        for ship in ships:
            self.ship_dir(ship).mkdir(parents=True, exist_ok=True)
        keys = {ship: ShipKey.generate() for ship in ships}
        for ship, key in keys.items():
            key.save(self.key_file(ship))
        write_atomic(
            self.master_keys(),
            ShipKeys.render({s: k.public() for s, k in keys.items()}, require_signatures=True),
        )
        for s in w.sites:
            self.site_dir(s).mkdir(parents=True, exist_ok=True)
            self.copy_keys(s)

        gw_ports = {s: next(free) for s in w.sites}
        say(f"{w.topology}: starting a site application and a gateway per site")
        for s in w.sites:
            ensure_topics(
                self.endpoint(s), [TopicSpec(ingress_topic(x), partitions=1) for x in w.streams]
            )
            config = self.site_dir(s) / "sites.toml"
            config.write_text(tomli_w.dumps(self.sites_doc(s, listeners)))
            self.launch(
                f"site:{s}", _python("spark_core.cli", "site", "--site", s, "--config", str(config))
            )
        from core_gateway.auth import Credentials

        creds = Credentials(self.work / "ships.json")
        tokens = {ship: creds.add(ship) for ship in ships}
        for s in w.sites:
            config = self.site_dir(s) / "gateway.toml"
            config.write_text(tomli_w.dumps(self.gateway_doc(s, gw_ports[s], creds.path)))
            self.launch(f"gateway:{s}", _python("core_gateway.cli", "run", "--config", str(config)))
        say(f"{w.topology}: starting a Mosquitto and an edge agent per ship")
        for ship, sites in w.ships:
            port = next(free)
            m = start_mosquitto(ship, self.ship_dir(ship) / "mosquitto", self.logs, port=port)
            self.mqtt_ports[ship] = port
            self.comps[f"mosquitto:{ship}"] = Component(
                f"mosquitto:{ship}",
                [mosquitto_bin(), "-c", str(self.ship_dir(ship) / "mosquitto" / "mosquitto.conf")],
                m.proc.log,
                m.proc,
            )
            urls = {}
            for s in sites:
                listen = f"{HOST}:{next(free)}"
                self.toxiproxy.create_proxy(ship_link(ship, s), listen, f"{HOST}:{gw_ports[s]}")
                urls[s] = f"http://{listen}"
            self.write_edge_config(ship, port, next(free), urls, tokens[ship])
            self.launch(
                f"edge:{ship}",
                _python(
                    "edge_agent.cli", "run", "--config", str(self.ship_dir(ship) / "edge.toml")
                ),
            )
        for s in w.sites:
            url = f"http://{HOST}:{gw_ports[s]}/readyz"
            self.comps[f"gateway:{s}"].proc.wait_ready(functools.partial(_http_ok, url), 90)
        say(f"{w.topology}: waiting for the site applications' first batches")
        for s in w.sites:
            checkpoints = self.site_dir(s) / "checkpoints"
            self.comps[f"site:{s}"].proc.wait_ready(
                functools.partial(_warm, checkpoints), a.start_timeout
            )
        for ship in ships:
            self.publishers[ship] = Publisher(ship, self.mqtt_ports[ship], a.rate)
            self.publishers[ship].start()

    def launch(self, name: str, argv: list[str]) -> None:
        log = self.logs / f"{name.replace(':', '-')}.log"
        self.comps[name] = Component(name, argv, log, Proc.start(name, argv, log))

    def key_file(self, ship: str) -> Path:
        return self.ship_dir(ship) / f"key-{self.key_serial[ship]}.key"

    def copy_keys(self, site: str) -> None:
        write_atomic(self.site_keys(site), self.master_keys().read_text())

    def sites_doc(self, me: str, listeners: dict[str, dict[str, LinkListener]]) -> dict[str, Any]:
        w = self.w

        def site(s: str) -> dict[str, Any]:
            return {
                "streams": list(w.streams),
                "neighbours": w.neighbours(s),
                "checkpoint_dir": str(self.site_dir(s) / "checkpoints"),
                "table_dir": str(self.site_dir(s) / "tables"),
                "trigger_interval": "1s",
                "tables": False,
                "customer_topics": False,
                "kafka": {"bootstrap": self.brokers[s].bootstrap, "timeout": "20s"},
                "merge": {"canonical_partitions": 1},
                "replication": {
                    "probe_interval": "1s",
                    "probe_timeout": "2s",
                    "report_ttl": "6s",
                    "repair_interval": f"{self.args.repair_interval}s",
                    "via": {n: f"{HOST}:{listeners[n][s].advertised}" for n in w.neighbours(s)},
                },
                "topics": {x: {"partitions": 1} for x in w.streams},
            }

        return {
            "log_level": "info",
            "ship_keys_file": str(self.site_keys(me)),
            "spark": {
                "master": "local[2]",
                "driver_memory": "768m",
                "conf": {
                    "spark.ui.enabled": "false",
                    "spark.sql.shuffle.partitions": "1",
                    **spark_driver_conf(),
                },
            },
            "sites": {s: site(s) for s in w.sites},
        }

    def gateway_doc(self, s: str, port: int, credentials: Path) -> dict[str, Any]:
        return {
            "site": s,
            "log_level": "info",
            "decode_workers": 0,
            "credentials_file": str(credentials),
            "ship_keys_file": str(self.site_keys(s)),
            "streams": list(self.w.streams),
            "listen": {"host": HOST, "port": port},
            # several gateways on one host: the metrics listener is not read here
            "metrics": {"port": 0},
            "kafka": {
                "bootstrap": self.brokers[s].bootstrap,
                "ingress_partitions": 1,
                "transactional_id": f"soak-gateway-{s}",
                "timeout": "20s",
            },
        }

    def write_edge_config(
        self, ship: str, mqtt_port: int, metrics_port: int, urls: dict[str, str], token: str
    ) -> None:
        root = self.ship_dir(ship)
        doc = {
            "ship": ship,
            "log_level": "info",
            "mqtt": {"host": HOST, "port": mqtt_port, "client_id": f"shorelink-edge-{ship}"},
            "log": {
                "path": str(root / "edge.db"),
                "group_commit": "5ms",
                "max_bytes": "1GB",
                "alerts_reserve_bytes": "50MB",
            },
            "metrics": {"host": HOST, "port": metrics_port},
            "uplink": {
                "token": token,
                "signing_key_file": str(self.key_file(ship)),
                "interval": "2s",
                "refresh": "10s",
                "probe_timeout": "3s",
                "retry_min": "100ms",
                "retry_max": "3s",
                "encode_workers": 0,
                "seal_records": 0,
            },
            "links": {"port_wifi": {"streams": ["*"], "cost": 1, "timeout": "20s"}},
            "gateways": [{"site": s, "url": u, "link": "port_wifi"} for s, u in urls.items()],
            "streams": {
                "alerts": {"priority": 0, "on_full": "reject"},
                "containers": {"priority": 50},
            },
            "rules": [
                {"filter": "soak/+/containers/+/env", "stream": "containers", "key": "{4}"},
                {"filter": "soak/+/alerts/+/alert", "stream": "alerts", "key": "{4}"},
            ],
        }
        write_atomic(root / "edge.toml", tomli_w.dumps(doc), mode=0o600)

    # -- processes ----------------------------------------------------------------------
    def kill(self, name: str) -> None:
        """SIGKILL to the component's whole process group; returns once it is gone."""
        c = self.comps[name]
        c.down = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(c.proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while group_alive(c.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if c.proc.popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                c.proc.popen.wait(timeout=1)
        c.paused = False

    def stop(self, name: str) -> None:
        """A graceful stop (SIGTERM, then SIGKILL after a grace)."""
        c = self.comps[name]
        c.down = True
        c.proc.stop(grace=15)
        c.paused = False

    def revive(self, name: str) -> None:
        c = self.comps[name]
        if c.proc.alive():
            c.down = False
            return
        c.proc = Proc.start(name, c.argv, c.log)
        c.down = False
        if name.startswith("kafka:"):
            self.brokers[name.split(":", 1)[1]].proc = c.proc

    def signal(self, name: str, sig: signal.Signals) -> None:
        c = self.comps[name]
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(c.proc.pid, sig)
        c.paused = sig == signal.SIGSTOP

    def supervise(self) -> list[str]:
        """Start again what exited on its own (as systemd would); their names."""
        out = []
        for c in self.comps.values():
            if not c.down and not c.paused and not c.proc.alive():
                c.exits += 1
                out.append(c.name)
                say(f"{c.name} exited on its own (see {c.log}); starting it again")
                self.revive(c.name)
        return out

    def stop_publishers(self) -> dict[str, int]:
        for p in self.publishers.values():
            p.close()
        return {s: p.sent for s, p in self.publishers.items()}

    def cleanup(self) -> None:
        for p in self.publishers.values():
            p.close()
        for c in self.comps.values():  # a stopped group does not see SIGTERM
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(c.proc.pid, signal.SIGCONT)
        stop_procs(self.procs, grace=15)


def _http_ok(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def _warm(checkpoints: Path) -> bool:
    """Every query of the site's application has run its first batch."""
    try:
        queries = json.loads((checkpoints / "queries.status.json").read_text())["queries"]
    except (OSError, ValueError, KeyError):
        return False
    running = [q for q in queries if q.get("state") != "idle"]
    return bool(running) and all(q.get("batch_id") is not None for q in running)


# -- the nemesis ------------------------------------------------------------------------
class Nemesis:
    """Applies a schedule's faults to a running :class:`Stack` and heals them."""

    def __init__(self, stack: Stack) -> None:
        self.s = stack
        self.applied: Counter[str] = Counter()
        self.skipped: list[dict[str, Any]] = []
        self.deleted: list[dict[str, Any]] = []

    def plan(self, fault: Fault) -> list[tuple[float, str, Callable[[], None]]]:
        """The fault's steps: (seconds after the faults start, label, action)."""
        k, t = fault.kind, fault.target
        if k in ("kill", "wipe"):
            name = t
            first = (lambda: self.wipe(t)) if k == "wipe" else (lambda: self.s.kill(name))
            return [
                (fault.at, f"{k} {t}", first),
                (fault.end, f"restart {t}", lambda: self.s.revive(name)),
            ]
        if k == "pause":
            return [
                (fault.at, f"pause {t}", lambda: self.s.signal(t, signal.SIGSTOP)),
                (fault.end, f"resume {t}", lambda: self.s.signal(t, signal.SIGCONT)),
            ]
        if k == "cut":
            return [
                (fault.at, f"cut {t}", lambda: self.link(t, enabled=False)),
                (fault.end, f"mend {t}", lambda: self.link(t, enabled=True)),
            ]
        if k == "slow":
            d = fault.detail
            return [
                (fault.at, f"slow {t}", lambda: self.slow(t, d["latency_ms"], d["jitter_ms"])),
                (fault.end, f"speed {t}", lambda: self.slow(t, 0, 0)),
            ]
        if k == "retention":
            return [
                (fault.at, f"retention {t}", lambda: self.retention(t, fault.detail["fraction"]))
            ]
        if k == "ship_key":
            steps: list[tuple[float, str, Callable[[], None]]] = [
                (fault.at, f"new key {t}", lambda: self.new_key(t))
            ]
            for site, delay in sorted(fault.detail["reach"].items(), key=lambda x: x[1]):
                steps.append(
                    (
                        fault.at + delay,
                        f"keys file reaches {site}",
                        functools.partial(self.s.copy_keys, site),
                    )
                )
            return steps
        raise ValueError(f"unknown fault kind {k!r}")

    # -- links ------------------------------------------------------------------------
    def proxies(self, link: str) -> list[str]:
        kind, rest = link.split(":", 1)
        if kind == "site":
            a, b = rest.split("~")
            return [site_link(a, b), site_link(b, a)]
        ship, site = rest.split(">")
        return [ship_link(ship, site)]

    def link(self, link: str, enabled: bool) -> None:
        assert self.s.toxiproxy is not None
        for p in self.proxies(link):
            self.s.toxiproxy.set_enabled(p, enabled)

    def slow(self, link: str, latency_ms: int, jitter_ms: int) -> None:
        assert self.s.toxiproxy is not None
        for p in self.proxies(link):
            for stream in ("upstream", "downstream"):
                name = f"soak_latency_{stream}"
                with contextlib.suppress(ShorelinkError):
                    self.s.toxiproxy.remove_toxic(p, name)
                if latency_ms:
                    self.s.toxiproxy.add_toxic(
                        p, "latency", name=name, stream=stream, latency=latency_ms, jitter=jitter_ms
                    )

    # -- processes ----------------------------------------------------------------------
    def wipe(self, target: str) -> None:
        """The site's application killed and its checkpoint directory removed (it is
        started again at the fault's end)."""
        site = target.split(":", 1)[1]
        self.s.kill(target)
        shutil.rmtree(self.s.site_dir(site) / "checkpoints", ignore_errors=True)

    def new_key(self, ship: str) -> None:
        """``shorelink ship-key new --replace`` into the master file, the agent stopped
        and started with its new key; the sites' copies follow by the schedule."""
        s = self.s
        s.key_serial[ship] += 1
        key = s.key_file(ship)
        done = subprocess.run(
            _python(
                "shorelink.cli",
                "ship-key",
                "new",
                ship,
                "--replace",
                "--key-file",
                str(key),
                "--ship-keys",
                str(s.master_keys()),
            ),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"ship-key new {ship}: {done.stderr.strip()[-500:]}")
        config = s.ship_dir(ship) / "edge.toml"
        text = config.read_text()
        old = s.ship_dir(ship) / f"key-{s.key_serial[ship] - 1}.key"
        write_atomic(config, text.replace(str(old), str(key)), mode=0o600)
        s.stop(f"edge:{ship}")
        s.revive(f"edge:{ship}")

    # -- retention --------------------------------------------------------------------
    def retention(self, target: str, fraction: float) -> None:
        """Records deleted from the start of each partition of the topic up to
        ``fraction`` of its end; on a canonical topic no further than the first record
        that no other site's canonical topic holds now."""
        where, rest = target.split(":", 1)
        site, stream = rest.split("/")
        ep = self.s.endpoint(site)
        admin = Admin(ep)
        if where == "relay":
            topics = [
                t
                for t in admin.metadata(timeout=10).topics
                if t.startswith("sl.relay.") and t.endswith(f".{stream}")
            ]
        else:
            topics = [canonical_topic(stream)]
        parts = [
            (t, p)
            for t in topics
            for p in (admin.metadata(t, timeout=10).topics[t].partitions or {})
        ]
        spans = admin.spans(parts)
        cuts = {tp: lo + int((hi - lo) * fraction) for tp, (lo, hi) in spans.items()}
        if where == "canonical" and cuts:
            cuts = self._guard(site, stream, cuts)
        cuts = {tp: off for tp, off in cuts.items() if off > spans[tp][0]}
        if not cuts:
            self.skipped.append({"target": target, "why": "nothing to delete"})
            return
        futures = admin.client.delete_records(
            [TopicPartition(t, p, o) for (t, p), o in cuts.items()]
        )
        for f in futures.values():
            admin.wait(f, f"delete records at {site}", timeout=20)
        n = sum(off - spans[tp][0] for tp, off in cuts.items())
        self.deleted.append(
            {
                "target": target,
                "records_upto": {f"{t}/{p}": o for (t, p), o in cuts.items()},
                "about": n,
            }
        )
        say(f"  deleted about {n} records of {target}")

    def _guard(
        self, site: str, stream: str, cuts: dict[tuple[str, int], int]
    ) -> dict[tuple[str, int], int]:
        held: dict[str, RangeSet] = {}
        for other in self.s.w.sites:
            if other == site:
                continue
            try:
                for src in audit_site(self.s.endpoint(other), [stream], timeout=60)[0]:
                    held.setdefault(src.origin, RangeSet()).update(src.held)
            except ShorelinkError as exc:
                say(f"  retention guard: {other} unreadable ({exc}); its copies not counted")
        out = dict(cuts)
        for msg in read_to_end(self.s.endpoint(site), [canonical_topic(stream)], timeout=60):
            tp, off = (msg.topic(), msg.partition()), msg.offset()
            if tp not in out or off is None or off >= out[tp]:
                continue
            try:
                ident = Record.from_kafka(msg.key(), msg.value(), msg.headers()).identity
            except ContractError:
                continue
            if ident.seq not in held.get(ident.origin, RangeSet()):
                out[tp] = off  # the first record only this site holds
        return out


# -- the checker ------------------------------------------------------------------------
def ship_holds(db: Path) -> dict[str, RangeSet]:
    """stream -> the seqs the ship's log holds (read-only, beside a running agent)."""
    out: dict[str, RangeSet] = {}
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        for stream, seq in con.execute("SELECT stream, seq FROM records"):
            out.setdefault(stream, RangeSet()).add(int(seq))
    finally:
        con.close()
    return out


def check(stack: Stack) -> dict[str, Any]:
    """Per site: identities the ships hold that it lacks, records it holds twice or more,
    identities no ship holds; the ships' records per stream."""
    w = stack.w
    expected = {
        (ship, stream): seqs
        for ship, _ in w.ships
        for stream, seqs in ship_holds(stack.ship_dir(ship) / "edge.db").items()
    }
    sites: dict[str, Any] = {}
    for site in w.sites:
        try:
            audits, malformed = audit_site(stack.endpoint(site), list(w.streams), timeout=60)
        except ShorelinkError as exc:
            sites[site] = {"error": str(exc)}
            continue
        got = {(a.origin, a.stream): a for a in audits}
        missing, doubled, extra = {}, {}, {}
        for src, want in expected.items():
            a = got.get(src)
            lack = want.difference(a.held) if a else want.copy()
            if lack:
                missing[f"{src[0]}/{src[1]}"] = str(lack)
        for src, a in got.items():
            if a.duplicates:
                doubled[f"{src[0]}/{src[1]}"] = str(a.duplicated)
            more = a.held.difference(expected.get(src, RangeSet()))
            if more:
                extra[f"{src[0]}/{src[1]}"] = str(more)
        sites[site] = {
            "missing": sum(RangeSet.parse(v).count() for v in missing.values()),
            "duplicates": sum(a.duplicates for a in audits),
            "extra": sum(RangeSet.parse(v).count() for v in extra.values()),
            "malformed": malformed,
            **({"missing_seqs": missing} if missing else {}),
            **({"duplicated_seqs": doubled} if doubled else {}),
            **({"extra_seqs": extra} if extra else {}),
        }
    return {
        "records": {f"{o}/{s}": r.count() for (o, s), r in expected.items()},
        "sites": sites,
    }


def _clean(result: dict[str, Any]) -> bool:
    return all(
        "error" not in v and not v["missing"] and not v["duplicates"] and not v["extra"]
        for v in result["sites"].values()
    )


# -- one run ----------------------------------------------------------------------------
def run_once(work: Path, w: World, args: argparse.Namespace) -> dict[str, Any]:
    schedule = draw(args.seed, args.minutes, w, mean_gap=args.mean_gap)
    say(f"{w.topology}: seed {args.seed}, {args.minutes} min, {len(schedule)} faults:")
    for f in schedule:
        say(f"  {f}")
    stack = Stack(work, w, args)
    nemesis = Nemesis(stack)
    errors: list[str] = []
    aside: ThreadPoolExecutor | None = None
    out: dict[str, Any] = {
        "topology": w.topology,
        "world": w.to_json(),
        "schedule": [f.to_json() for f in schedule],
        "replay": f"bench/soak.py --seed {args.seed} --minutes {args.minutes} "
        f"--topology {w.topology} --mean-gap {args.mean_gap}",
    }
    try:
        t_start = time.monotonic()
        stack.start()
        out["start_s"] = round(time.monotonic() - t_start, 1)
        say(
            f"{w.topology}: up in {out['start_s']}s; data flowing for {WARM_S:.0f}s before the faults"
        )
        time.sleep(WARM_S)
        steps: list[tuple[float, int, str, Callable[[], None]]] = []
        for i, f in enumerate(schedule):
            for at, label, act in nemesis.plan(f):
                heapq.heappush(steps, (at, i, label, act))
        aside = ThreadPoolExecutor(max_workers=1, thread_name_prefix="retention")
        background: list[Future[bool]] = []
        t0 = time.monotonic()
        horizon = args.minutes * 60.0
        last_note = 0.0
        while steps or time.monotonic() - t0 < horizon:
            now = time.monotonic() - t0
            if steps and steps[0][0] <= now:
                at, i, label, act = heapq.heappop(steps)
                say(f"t={now:6.1f}s {label}")
                step = functools.partial(_step, act, label, f"t={now:.1f}s", errors)
                if schedule[i].kind == "retention":
                    # it reads the sites first (seconds, more with a broker paused):
                    # beside the schedule, which keeps its times
                    background.append(aside.submit(step))
                elif step() and (label.split()[0] in KINDS or label.startswith("new key")):
                    nemesis.applied[schedule[i].kind] += 1
                continue
            stack.supervise()
            if now - last_note > 30:
                last_note = now
                sent = {s: p.sent for s, p in stack.publishers.items()}
                say(f"t={now:6.1f}s published {sent}")
            wait = (steps[0][0] if steps else horizon) - now
            time.sleep(min(max(wait, 0.05), 1.0))
        for done in background:
            with contextlib.suppress(TimeoutError):
                if done.result(timeout=180):
                    nemesis.applied["retention"] += 1
        out["published"] = stack.stop_publishers()
        say(f"{w.topology}: faults over; healing every link, broker and process")
        assert stack.toxiproxy is not None
        stack.toxiproxy.reset()
        for name, c in stack.comps.items():
            if c.paused:
                stack.signal(name, signal.SIGCONT)
            if c.down or not c.proc.alive():
                stack.revive(name)
        for s in w.sites:
            stack.copy_keys(s)
        t_heal = time.monotonic()
        result: dict[str, Any] = {}
        converged: float | None = None  # clean since (s after the heal)
        while time.monotonic() - t_heal < args.converge_timeout:
            stack.supervise()
            result = check(stack)
            since = round(time.monotonic() - t_heal, 1)
            if not _clean(result):
                converged = None  # a record the agent logged late: not there yet
                lacking = {s: v.get("missing", v.get("error")) for s, v in result["sites"].items()}
                say(f"converging ({since:.0f}s): missing {lacking}")
            elif converged is None:
                converged = since
            elif since - converged >= args.settle:
                break  # clean, and still clean a while later (no late duplicate)
            time.sleep(min(5.0, args.settle))
        else:
            converged = None
        out.update(
            {
                "faults": kinds_of(schedule),
                "applied": {k: nemesis.applied.get(k, 0) for k in KINDS},
                "skipped": nemesis.skipped,
                "deleted": nemesis.deleted,
                "errors": errors,
                "exits": {c.name: c.exits for c in stack.comps.values() if c.exits},
                "records": result.get("records", {}),
                "sites": result.get("sites", {}),
                "convergence_s": converged,
                "verdict": "clean" if converged is not None and _clean(result) else "failed",
            }
        )
        say(f"{w.topology}: verdict {out['verdict']} (converged in {converged}s)")
    finally:
        if aside is not None:
            aside.shutdown(wait=True, cancel_futures=True)
        stack.cleanup()
    return out


def _step(act: Callable[[], None], label: str, when: str, errors: list[str]) -> bool:
    """Run one step of a fault; a failure is noted (the run goes on), not raised."""
    try:
        act()
    except (ShorelinkError, OSError, RuntimeError, subprocess.SubprocessError) as exc:
        errors.append(f"{when} {label}: {exc}")
        say(f"  {label} failed: {exc}")
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="bench/soak.py",
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Progress goes to stderr; one JSON object goes to stdout.",
    )
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--minutes", type=float, default=5.0, help="how long faults are drawn for")
    p.add_argument(
        "--topology",
        choices=["mesh", "line", "both"],
        default="both",
        help="the sites' links (both: a mesh, then a line, each its own run)",
    )
    p.add_argument("--ships", type=int, default=2)
    p.add_argument("--rate", type=float, default=5.0, help="container readings/s per ship")
    p.add_argument("--mean-gap", type=float, default=10.0, help="mean seconds between faults")
    p.add_argument("--repair-interval", type=float, default=10.0, help="sites' repair, s")
    p.add_argument("--converge-timeout", type=float, default=300.0)
    p.add_argument("--settle", type=float, default=10.0, help="s before the last check")
    p.add_argument("--start-timeout", type=float, default=400.0)
    p.add_argument("--print-schedule", action="store_true", help="print the schedule, run nothing")
    p.add_argument("--keep", type=Path, default=None, metavar="DIR")
    a = p.parse_args(argv)
    if a.minutes <= 0 or a.ships < 1 or a.rate <= 0:
        p.error("--minutes, --ships and --rate must be positive")
    topologies = ["mesh", "line"] if a.topology == "both" else [a.topology]
    if a.print_schedule:
        print(
            json.dumps(
                {
                    t: [
                        str(f)
                        for f in draw(a.seed, a.minutes, world(t, a.ships), mean_gap=a.mean_gap)
                    ]
                    for t in topologies
                },
                indent=2,
            )
        )
        return 0
    exit_on_signals(say)
    runs = []
    with work_dir(a.keep, "sl-soak-") as work:
        for t in topologies:
            try:
                runs.append(run_once(work / t, world(t, a.ships), a))
            except (ShorelinkError, OSError, RuntimeError, subprocess.SubprocessError) as exc:
                say(f"{t}: failed: {exc}; logs in {work / t / 'logs'}")
                runs.append({"topology": t, "verdict": "error", "error": str(exc)})
    verdict = "clean" if all(r["verdict"] == "clean" for r in runs) else "failed"
    print(
        json.dumps(
            {
                "benchmark": "soak",
                "seed": a.seed,
                "minutes": a.minutes,
                "verdict": verdict,
                "runs": runs,
            },
            indent=2,
        ),
        flush=True,
    )
    return 0 if verdict == "clean" else 2


if __name__ == "__main__":
    sys.exit(main())
