"""The local stack: one Kafka per site, one Mosquitto per ship, one toxiproxy with a proxy
per ship->site link, all on loopback, described by ``DIR/stack.json``.

A site's Kafka is one node, or with ``brokers=3`` (``stack up --brokers 3``) a KRaft
cluster of three as a data centre runs it (local_stack/kafka.py
``start_kafka_cluster``): the site's ``kafka`` in stack.json then lists the three
bootstrap addresses, and ``nodes`` each node's address, pid and log.

Each Kafka runs as a site's does in production (local_stack/kafka.py): SASL/SCRAM over
TLS with ACLs, its certificate from the CA made under ``DIR/tls/`` at the first ``up``,
the super user's password in ``DIR/secrets.env`` (mode 0600; the same at every ``up`` of
the directory: it was written into the brokers' storage when they were formatted).
``--insecure`` starts plain brokers instead.

Used by ``shorelink stack up|status|down``, by the pytest fixtures, the demo and the
benchmarks, so all of them run the same real components the same way.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from local_stack.errors import StackError
from local_stack.kafka import (
    BrokerSecurity,
    KafkaBroker,
    KafkaCluster,
    start_kafka,
    start_kafka_cluster,
)
from local_stack.mosquitto import start_mosquitto
from local_stack.process import Proc, free_port, pid_alive, port_open, stop_pids, stop_procs
from local_stack.tls import make_authority
from local_stack.toxiproxy import start_toxiproxy
from shorelink.config import Secret
from shorelink.files import write_atomic, write_json_atomic
from shorelink.kafka.auth import KafkaAuth

__all__ = ["Component", "StackInfo", "down", "link_name", "load", "status", "up"]

HOST = "127.0.0.1"
STACK_FILE = "stack.json"
SECRETS_FILE = "secrets.env"
#: the variable of ``secrets.env`` holding the brokers' super user's password
ADMIN_PASSWORD_VAR = "SL_KAFKA_ADMIN_PASSWORD"


def link_name(ship: str, site: str) -> str:
    return f"{ship}-to-{site}"


@dataclass
class Component:
    name: str
    pid: int
    log: str
    address: str  # host:port it listens on; "" for a process that serves no port

    def state(self) -> str:
        if not pid_alive(self.pid):
            return "dead"
        if not self.address:
            return "up"
        host, port = self.address.rsplit(":", 1)
        return "up" if port_open(host, int(port)) else "not-listening"


@dataclass
class StackInfo:
    dir: Path
    sites: dict[str, dict[str, Any]] = field(default_factory=dict)
    ships: dict[str, dict[str, Any]] = field(default_factory=dict)
    links: dict[str, dict[str, Any]] = field(default_factory=dict)
    toxiproxy: dict[str, Any] = field(default_factory=dict)
    started_s: float = 0.0
    #: further processes started on top of the stack (the demo's gateways, Spark
    #: applications, edge agents): name -> {"pid", "log", "address"}; stopped by `down`
    processes: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: the brokers' security: {"ca_file", "admin_user"} ({} for plain brokers); the
    #: admin's password is in secrets.env, never here
    security: dict[str, str] = field(default_factory=dict)

    def admin_auth(self) -> KafkaAuth:
        """How a super user connects to the stack's brokers."""
        if not self.security:
            return KafkaAuth()
        password = read_secrets(self.dir).get(ADMIN_PASSWORD_VAR, "")
        if not password:
            raise StackError(f"no {ADMIN_PASSWORD_VAR} in {self.dir / SECRETS_FILE}")
        return KafkaAuth(
            self.security["admin_user"], Secret(password), Path(self.security["ca_file"])
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "dir": str(self.dir),
            "started_s": round(self.started_s, 2),
            "sites": self.sites,
            "ships": self.ships,
            "links": self.links,
            "toxiproxy": self.toxiproxy,
            "processes": self.processes,
            "security": self.security,
        }

    def components(self) -> list[Component]:
        out: list[Component] = []
        for n, s in self.sites.items():
            if "nodes" in s:  # a cluster: each node on its own
                out += [
                    Component(f"kafka:{n}/{k['node']}", k["pid"], k["log"], k["kafka"])
                    for k in s["nodes"]
                ]
            else:
                out.append(Component(f"kafka:{n}", s["pid"], s["log"], s["kafka"]))
        out += [
            Component(f"mosquitto:{n}", s["pid"], s["log"], s["mqtt"])
            for n, s in self.ships.items()
        ]
        if self.toxiproxy:
            t = self.toxiproxy
            out.append(Component("toxiproxy", t["pid"], t["log"], t["api"].removeprefix("http://")))
        out += [
            Component(n, p["pid"], p["log"], p.get("address", ""))
            for n, p in self.processes.items()
        ]
        return out

    def save(self) -> None:
        write_json_atomic(self.dir / STACK_FILE, self.to_json(), indent=2, newline=True)


def parse_ships(spec: str | int) -> list[str]:
    """``2`` -> ``ship1, ship2``; ``"bigblue,redstar"`` -> those names."""
    text = str(spec).strip()
    if text.isdigit():
        return [f"ship{i}" for i in range(1, int(text) + 1)]
    return [s.strip() for s in text.split(",") if s.strip()]


def read_secrets(dir: Path) -> dict[str, str]:
    """``DIR/secrets.env`` as a dict ({} when there is none)."""
    try:
        lines = (dir / SECRETS_FILE).read_text().splitlines()
    except FileNotFoundError:
        return {}
    return dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))


def write_secrets(dir: Path, values: dict[str, str]) -> None:
    """Add ``values`` to ``DIR/secrets.env`` (mode 0600)."""
    merged = {**read_secrets(dir), **values}
    text = "".join(f"{k}={v}\n" for k, v in sorted(merged.items()))
    write_atomic(dir / SECRETS_FILE, text, mode=0o600)


def broker_security(dir: Path) -> BrokerSecurity:
    """The stack's CA and super user (made at the first call, kept after)."""
    password = read_secrets(dir).get(ADMIN_PASSWORD_VAR)
    if not password:
        password = secrets.token_urlsafe(18)
        write_secrets(dir, {ADMIN_PASSWORD_VAR: password})
    return BrokerSecurity(make_authority(dir / "tls"), password)


def up(
    dir: Path,
    sites: list[str],
    ships: list[str],
    *,
    kafka_heap: str = "512m",
    secure: bool = True,
    brokers: int = 1,
) -> StackInfo:
    """Start every component, wait until each is ready, write ``stack.json``;
    ``brokers``: nodes of each site's Kafka (more than one: a KRaft cluster).

    If anything fails, whatever was started is stopped again and the error names the
    component and its log file.
    """
    dir = dir.resolve()
    if (dir / STACK_FILE).exists() and any(c.state() != "dead" for c in load(dir).components()):
        raise StackError(
            f"a stack is already running in {dir}: `shorelink stack down --dir {dir}` first"
        )
    if not sites:
        raise StackError("at least one site is needed")
    if brokers < 1:
        raise StackError(f"brokers: at least one per site, not {brokers}")
    logs = dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    info = StackInfo(dir)
    security = broker_security(dir) if secure else None
    if security is not None:
        info.security = {
            "ca_file": str(security.authority.ca_cert),
            "admin_user": security.admin_user,
        }
    started: list[Proc] = []
    try:
        # JVMs start slowly: launch every broker first, then wait for all of them.
        kafkas: list[KafkaBroker | KafkaCluster] = []
        for site in sites:
            k: KafkaBroker | KafkaCluster
            if brokers > 1:
                k = start_kafka_cluster(
                    site,
                    dir / "sites" / site,
                    logs,
                    nodes=brokers,
                    wait=False,
                    heap=kafka_heap,
                    security=security,
                )
                started += k.procs
            else:
                k = start_kafka(
                    site, dir / "sites" / site, logs, wait=False, heap=kafka_heap, security=security
                )
                started.append(k.proc)
            kafkas.append(k)
        for ship in ships:
            m = start_mosquitto(ship, dir / "ships" / ship, logs)
            started.append(m.proc)
            info.ships[ship] = {
                "mqtt": f"{HOST}:{m.port}",
                "pid": m.proc.pid,
                "log": str(m.proc.log),
            }
        tp = start_toxiproxy(logs)
        started.append(tp.proc)
        info.toxiproxy = {"api": tp.api, "pid": tp.proc.pid, "log": str(tp.proc.log)}
        for k in kafkas:
            info.sites[k.site] = _wait_kafka(k, logs)
            # where this site's gateway listens (reserved here; the stack does not start one)
            info.sites[k.site]["gateway"] = f"{HOST}:{free_port(HOST)}"
        client = tp.client()
        for ship in ships:
            for site in sites:
                name = link_name(ship, site)
                listen = f"{HOST}:{free_port(HOST)}"
                upstream = info.sites[site]["gateway"]
                client.create_proxy(name, listen, upstream)
                info.links[name] = {
                    "ship": ship,
                    "site": site,
                    "listen": listen,
                    "upstream": upstream,
                }
    except BaseException:
        stop_procs(started, grace=5)
        raise
    info.started_s = time.monotonic() - t0
    info.save()
    return info


def _wait_kafka(k: KafkaBroker | KafkaCluster, logs: Path) -> dict[str, Any]:
    """Wait until a site's Kafka is ready; its entry in stack.json."""
    if isinstance(k, KafkaBroker):
        k.proc.wait_ready(k.ready, timeout=120)
        return {
            "kafka": k.bootstrap,
            "pid": k.proc.pid,
            "log": str(logs / f"kafka-{k.site}" / "kafka.log"),
        }
    for n in k.nodes:
        n.proc.wait_ready(k.ready, timeout=180)
    nodes = [
        {
            "node": n.node_id,
            "kafka": n.bootstrap,
            "pid": n.proc.pid,
            "log": str(logs / f"kafka-{k.site}-{n.node_id}" / "kafka.log"),
        }
        for n in k.nodes
    ]
    return {"kafka": k.bootstrap, "nodes": nodes}


def load(dir: Path) -> StackInfo:
    path = dir.resolve() / STACK_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise StackError(f"no stack in {dir} ({path} not found)") from None
    except json.JSONDecodeError as exc:
        raise StackError(f"{path} is corrupt: {exc}") from exc
    return StackInfo(
        Path(data["dir"]),
        data["sites"],
        data["ships"],
        data["links"],
        data["toxiproxy"],
        data.get("started_s", 0.0),
        data.get("processes", {}),
        data.get("security", {}),
    )


def status(dir: Path) -> list[tuple[Component, str]]:
    return [(c, c.state()) for c in load(dir).components()]


def down(dir: Path) -> list[str]:
    """Stop every component of the stack in ``dir`` (by pid); return what was stopped.
    Raises if something is still listening afterwards."""
    info = load(dir)
    running = [c for c in info.components() if pid_alive(c.pid)]
    stop_pids([c.pid for c in running], grace=15)
    stopped = [c.name for c in running]
    leftover = [c.name for c in info.components() if pid_alive(c.pid)]
    if leftover:
        raise StackError(f"still running after stop: {', '.join(leftover)}")
    (info.dir / STACK_FILE).rename(info.dir / "stack.stopped.json")
    return stopped
