"""Starting a voyage's components: per site a Kafka broker, a gateway and a Spark
application; per ship a Mosquitto and an edge agent; one toxiproxy that carries every
ship link and every link between sites. All real, all on loopback, each started the way
an operator starts it (the deployables' own command lines, with the config files of
:mod:`voyage.configs`).

Everything started is recorded in ``DIR/stack.json`` as it starts, so ``shorelink stack
down --dir DIR`` stops it (``--keep``), and a start that fails half-way stops what it
started.
"""

from __future__ import annotations

import contextlib
import functools
import json
import shutil
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from local_stack.errors import StackError
from local_stack.kafka import (
    KafkaBroker,
    LinkListener,
    start_site_broker,
)
from local_stack.mosquitto import start_mosquitto
from local_stack.process import Proc, free_ports, port_open, stop_procs
from local_stack.stack import HOST, StackInfo, down
from local_stack.toxiproxy import Toxiproxy, start_toxiproxy
from shorelink.files import write_atomic
from shorelink.fleet.log import Registry
from voyage.configs import (
    ShipEndpoints,
    SiteEndpoints,
    Tls,
    edge_config,
    gateway_config,
    sites_config,
)
from voyage.customers import CUSTOMERS, READER, client_config, customers_config
from voyage.fleet import TICK_EVERY_S, RegistryWatch, provision_fleet
from voyage.security import STAFF, VoyageSecurity, env_var
from voyage.topology import HQ, PORTS, SITES, neighbours, ship_link, site_link

__all__ = ["Launched", "launch"]

#: a geostationary hop each way, and a satellite terminal's modest rate (KB/s)
SATELLITE_LATENCY_MS = 300
SATELLITE_RATE_KBPS = 64
WIFI_LATENCY_MS = 5
SATELLITE_BUDGET = 2_000_000  # bytes per (UTC) day


@dataclass
class Launched:
    """What a voyage runs on: addresses, config files, processes."""

    dir: Path
    info: StackInfo
    toxiproxy: Toxiproxy
    sites: dict[str, SiteEndpoints] = field(default_factory=dict)
    ships: dict[str, ShipEndpoints] = field(default_factory=dict)
    procs: list[Proc] = field(default_factory=list)
    sites_toml: Path = Path()
    security: VoyageSecurity | None = None
    #: the file the followed customer's consumer reads HQ with (voyage/customers.py)
    customer_toml: Path = Path()
    gateway_toml: dict[str, Path] = field(default_factory=dict)
    edge_toml: dict[str, Path] = field(default_factory=dict)
    #: headquarters' fleet registry (voyage/fleet.py)
    registry: Path = Path()
    #: the registry version each site enforces, looked at as the voyage runs
    watch: RegistryWatch | None = None

    def record(self, proc: Proc, address: str = "") -> None:
        self.procs.append(proc)
        self.info.processes[proc.name] = {"pid": proc.pid, "log": str(proc.log), "address": address}
        self.info.save()

    def checkpoint_dir(self, site: str) -> Path:
        return self.dir / "sites" / site / "spark" / "checkpoints"

    @property
    def ops_url(self) -> str:
        """Headquarters' operations page (``shorelink ops``)."""
        return f"http://{HOST}:{self.sites[HQ].ops_port}/"

    def stop(self, grace: float = 20.0) -> None:
        if self.watch is not None:
            self.watch.stop()
        stop_procs(self.procs, grace)


def _python(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def _http_ok(url: str, context: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1, context=context) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def _warm(checkpoints: Path) -> bool:
    """Every query the site's application runs has run its first batch: ships meet a
    data centre that is up, not one still compiling its first plans."""
    try:
        queries = json.loads((checkpoints / "queries.status.json").read_text())["queries"]
    except (OSError, ValueError, KeyError):
        return False
    running = [q for q in queries if q.get("state") != "idle"]
    return bool(running) and all(q.get("batch_id") is not None for q in running)


def _run(argv: list[str], what: str, timeout: float = 120) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise StackError(f"{what}: no answer after {timeout:.0f}s") from exc
    if done.returncode != 0:
        raise StackError(f"{what} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return done.stdout


def _run_all(jobs: list[tuple[list[str], str]], timeout: float = 120) -> list[str]:
    """:func:`_run` for each ``(argv, what)`` at once (each mostly waits on a broker);
    the outputs in order, or the first failure."""
    with ThreadPoolExecutor(max_workers=max(1, len(jobs))) as pool:
        runs = [pool.submit(_run, argv, what, timeout) for argv, what in jobs]
        return [r.result() for r in runs]


def launch(
    dir: Path, ships: list[str], say: Callable[[str], None], *, spark_per_site: bool = False
) -> Launched:
    """Start every component of the voyage and wait until each is ready. On failure,
    whatever was started is stopped and the error names the component and its log."""
    logs = dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    info = StackInfo(dir)
    brokers: dict[str, KafkaBroker] = {}
    started: list[Proc] = []
    try:
        say("starting a Kafka broker per site, a Mosquitto per ship, toxiproxy")
        # per site, one listener per neighbour, reached through that link's proxy
        n_links = sum(len(neighbours(s)) for s in SITES)
        # every port at once: a port reserved but not yet bound must not be handed out again
        free = iter(free_ports(2 * n_links + 5 * len(SITES) + 4 + (len(SITES) + 2) * len(ships)))
        listeners = {
            s: {r: LinkListener(next(free), next(free)) for r in neighbours(s)} for s in SITES
        }
        info.save()  # stack.json from the first process on: `stack down` can stop a half start
        sec = VoyageSecurity.create(
            dir,
            [env_var(role, s) for s in SITES for role in ("spark", "gateway", "site")]
            + [env_var("customer", c) for c in CUSTOMERS]
            + [env_var("fleet", HQ)],
        )
        for s in SITES:
            brokers[s] = start_site_broker(
                s, dir / "sites" / s / "kafka", logs, free, listeners[s], sec.broker()
            )
            started.append(brokers[s].proc)
            info.sites[s] = {
                "kafka": brokers[s].bootstrap,
                "pid": brokers[s].proc.pid,
                "log": str(logs / f"kafka-{s}" / "kafka.log"),
            }
            info.save()
        mosquittos = {}
        for ship in ships:
            mosquittos[ship] = start_mosquitto(
                ship, dir / "ships" / ship / "mosquitto", logs, port=next(free)
            )
            started.append(mosquittos[ship].proc)
            info.ships[ship] = {
                "mqtt": f"{HOST}:{mosquittos[ship].port}",
                "pid": mosquittos[ship].proc.pid,
                "log": str(mosquittos[ship].proc.log),
            }
        tp = start_toxiproxy(logs, port=next(free), metrics=True)
        started.append(tp.proc)
        info.toxiproxy = {"api": tp.api, "pid": tp.proc.pid, "log": str(tp.proc.log)}
        info.save()
        launched = Launched(dir, info, tp.client(), security=sec)
        gateway_ports = {s: next(free) for s in SITES}
        gateway_metrics_ports = {s: next(free) for s in SITES}
        ops_port = next(free)
        for s in SITES:
            b = brokers[s]
            b.proc.wait_ready(b.ready, timeout=180)
            info.sites[s] = {
                "kafka": b.bootstrap,
                "pid": b.proc.pid,
                "log": str(logs / f"kafka-{s}" / "kafka.log"),
                "gateway": f"{HOST}:{gateway_ports[s]}",
            }
        info.save()
        client = launched.toxiproxy
        for s in SITES:
            for r, ln in listeners[s].items():
                client.create_proxy(site_link(s, r), f"{HOST}:{ln.advertised}", f"{HOST}:{ln.port}")
        for s in SITES:
            launched.sites[s] = SiteEndpoints(
                s,
                brokers[s].bootstrap,
                gateway_ports[s],
                {n: brokers[n].link_bootstrap(s) for n in neighbours(s)},
                # headquarters' operations page (one page: the machine's two cores
                # are shared by four data centres already)
                ops_port=ops_port if s == HQ else 0,
                gateway_metrics_port=gateway_metrics_ports[s],
            )
        for ship in ships:
            links = {}
            for s in SITES:
                listen = f"{HOST}:{next(free)}"
                name = ship_link(ship, s)
                client.create_proxy(name, listen, info.sites[s]["gateway"])
                latency = SATELLITE_LATENCY_MS if s == HQ else WIFI_LATENCY_MS
                for stream in ("upstream", "downstream"):
                    client.add_toxic(name, "latency", stream=stream, latency=latency)
                    if s == HQ:
                        client.add_toxic(name, "bandwidth", stream=stream, rate=SATELLITE_RATE_KBPS)
                # port Wi-Fi is down until the ship docks there; the satellite is always up
                client.set_enabled(name, s == HQ)
                links[s] = listen
                info.links[name] = {"ship": ship, "site": s, "listen": listen}
            launched.ships[ship] = ShipEndpoints(ship, mosquittos[ship].port, next(free), links)
        info.save()
        for p in started:
            launched.procs.append(p)
        started = []

        say("creating every site's principals and ACLs (SASL/SCRAM over TLS)")
        launched.sites_toml = dir / "sites" / "sites.toml"
        customers = dir / "sites" / "customers.toml"
        customers.write_text(customers_config())
        # headquarters provisions every ship in the fleet registry (its token, its
        # signing key, its client certificate required) and each carries its bundle on
        # board; every site follows the registry from its root key (fleet.pub): no
        # ships.json, no ship keys file (docs/fleet-registry.md, voyage/fleet.py)
        say("provisioning every ship in the fleet registry at headquarters")
        launched.registry = provision_fleet(dir, ships)
        fleet_pub = dir / "sites" / "fleet.pub"
        shutil.copyfile(launched.registry / "fleet.pub", fleet_pub)
        launched.sites_toml.write_text(
            sites_config(dir / "sites", launched.sites, sec.ca_file, customers, fleet_pub)
        )
        launched.customer_toml = dir / "customers" / f"{READER}.toml"
        launched.customer_toml.parent.mkdir(parents=True, exist_ok=True)
        launched.customer_toml.write_text(client_config(READER, brokers[HQ].bootstrap, sec.ca_file))
        site_cli = ("--config", str(launched.sites_toml))
        _run_all(
            [
                (
                    _python("spark_core.cli", "access", "apply", "--site", s, *site_cli),
                    f"shorelink-spark access apply --site {s}",
                )
                for s in SITES
            ]
        )

        # the Spark application first: its JVM's start is the longest, the rest starts
        # meanwhile
        say("creating every site's topics; starting a Spark application per site")
        _run_all(
            [
                (
                    _python("spark_core.cli", "topics", "apply", "--site", s, *site_cli),
                    f"shorelink-spark topics apply --site {s}",
                )
                for s in SITES
            ]
        )
        # headquarters' loop: publishes every entry (the ships' first) into HQ's
        # sl.ingress.registry and ticks the rollouts on the ships' reports
        launched.record(
            Proc.start(
                "fleet:hq",
                _python(
                    "shorelink.cli",
                    "fleet",
                    "run",
                    "--registry",
                    str(launched.registry),
                    "--sites",
                    # it logs in as its own principal, fleet-hq ([sites.hq.access]
                    # fleet_password), which `access apply` made above
                    str(launched.sites_toml),
                    "--site",
                    HQ,
                    "--tick-every",
                    f"{TICK_EVERY_S}s",
                    "--check-every",
                    "0.2s",
                ),
                logs / "fleet-hq.log",
            )
        )
        # one application per site as in production, or the four sites' supervisors in
        # one application (one JVM instead of four on a 2-core machine: docs/voyage.md)
        groups = [[s] for s in (HQ, *PORTS)] if spark_per_site else [[HQ, *PORTS]]
        for group in groups:
            name = ",".join(group)
            launched.record(
                Proc.start(
                    f"spark:{name}",
                    _python("spark_core.cli", "site", "--site", name, *site_cli),
                    logs / f"spark-{name.replace(',', '-')}.log",
                )
            )

        say("starting a gateway per site (HTTPS)")
        for s in SITES:
            path = dir / "sites" / s / "gateway.toml"
            path.parent.mkdir(parents=True, exist_ok=True)
            cert = sec.server(f"gateway-{s}")
            tls = Tls(sec.ca_file, cert.cert, cert.key)
            path.write_text(gateway_config(launched.sites[s], fleet_pub, tls))
            launched.gateway_toml[s] = path
        for s in SITES:
            launched.record(
                Proc.start(
                    f"gateway:{s}",
                    _python("core_gateway.cli", "run", "--config", str(launched.gateway_toml[s])),
                    logs / f"gateway-{s}.log",
                ),
                info.sites[s]["gateway"],
            )

        say(f"starting {HQ}'s operations page: {launched.ops_url}")
        login = _python("shorelink.cli", "ops-users", "add", STAFF, "--password-stdin")
        subprocess.run(
            [*login, "--site", HQ, "--config", str(launched.sites_toml)],
            input=sec.password("ops_login", STAFF) + "\n",
            text=True,
            capture_output=True,
            check=True,
            timeout=60,
        )
        launched.record(
            Proc.start(
                f"ops:{HQ}",
                _python("spark_core.ops.cli", "--site", HQ, "--config", str(launched.sites_toml)),
                logs / f"ops-{HQ}.log",
            ),
            f"{HOST}:{ops_port}",
        )

        say("starting an edge agent per ship")
        for ship in ships:
            root = dir / "ships" / ship
            cert = sec.authority.issue(ship, client=True)  # the ship's, for mutual TLS
            path = root / "edge.toml"
            text = edge_config(
                launched.ships[ship],
                root,
                root / "bundle",
                Tls(sec.ca_file, cert.cert, cert.key),
                satellite_budget=SATELLITE_BUDGET,
            )
            write_atomic(path, text, mode=0o600)
            launched.edge_toml[ship] = path
            launched.record(
                Proc.start(
                    f"edge:{ship}",
                    _python("edge_agent.cli", "run", "--config", str(path)),
                    logs / f"edge-{ship}.log",
                ),
                f"{HOST}:{launched.ships[ship].metrics_port}",
            )

        verify = ssl.create_default_context(cafile=str(sec.ca_file))
        for p in launched.procs:
            if p.name.startswith("gateway:"):
                url = f"https://{info.sites[p.name.split(':', 1)[1]]['gateway']}/readyz"
                p.wait_ready(functools.partial(_http_ok, url, verify), 60)
            elif p.name.startswith("ops:"):
                p.wait_ready(functools.partial(_http_ok, f"{launched.ops_url}healthz"), 60)
            elif p.name.startswith("edge:"):
                ship = p.name.split(":", 1)[1]
                port = launched.ships[ship].metrics_port
                p.wait_ready(functools.partial(port_open, HOST, port), 60)
        say("waiting for the Spark applications (the first start of a JVM takes a while)")
        for p in launched.procs:
            if p.name.startswith("spark:"):
                for site in p.name.split(":", 1)[1].split(","):
                    p.wait_ready(functools.partial(_warm, launched.checkpoint_dir(site)), 400)
        # every gateway and Spark application enforces the registry's ships before the
        # ships sail: the time from the entries' writing at HQ is the start-up's
        launched.watch = RegistryWatch(
            {s: f"{HOST}:{launched.sites[s].gateway_metrics_port}" for s in SITES},
            {s: launched.checkpoint_dir(s) / "replication.status.json" for s in SITES},
        )
        launched.watch.start()
        version = Registry.open(launched.registry).state.version
        deadline = time.monotonic() + 120
        while not launched.watch.everywhere(version):
            if time.monotonic() > deadline:
                raise StackError(
                    f"the fleet registry's version {version} was not enforced at every site "
                    f"within 120s: {launched.watch.versions()}; see {logs / 'fleet-hq.log'}"
                )
            time.sleep(0.2)
        info.started_s = time.monotonic() - t0
        info.save()
        return launched
    except BaseException:
        stop_procs(started, grace=5)
        if "launched" in locals():
            launched.stop(grace=5)
        # stack.json -> stack.stopped.json: nothing of a start cut short is left running
        with contextlib.suppress(StackError, OSError):
            down(dir)
        raise
