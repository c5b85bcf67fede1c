"""The voyage: start the whole system, sail the fleet, play the links, watch every site,
wait until everything is ashore everywhere, then judge and report.

Phases: start-up (:func:`voyage.launch.launch`), the voyage itself (the fleet simulator
publishes; the links follow the plan), the drain (ships docked at their last port until
every site holds every record, bounded by ``drain_timeout``), the report. Every process
is stopped at the end, also on Ctrl-C or a failure, unless ``keep`` (then ``shorelink
stack down --dir DIR`` stops them).
"""

from __future__ import annotations

import functools
import json
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live

from fleet_sim.plan import VoyagePlan, plan_voyage
from local_stack.errors import StackError
from local_stack.process import Proc, port_open
from local_stack.stack import down
from local_stack.stack import load as load_stack
from shorelink.config import Secret
from shorelink.contract import canonical_topic
from shorelink.kafka.auth import KafkaAuth
from shorelink.kafka.endpoint import KafkaEndpoint
from voyage.configs import REPORT_INTERVAL_S
from voyage.customers import READER, CustomerReader
from voyage.fleet import FleetScenario, KeyRotation
from voyage.html import write_report
from voyage.launch import Launched, launch
from voyage.links import LinkPlayer
from voyage.live import LiveState, ShipRow, progress_line, render
from voyage.observe import EdgeSample, SiteWatch, edge_metrics, query_level_with
from voyage.ops import OpsReader
from voyage.report import Observed, build_report
from voyage.security import STAFF, env_var
from voyage.summary import summary_text
from voyage.topology import HQ, OUTAGE, SITES

__all__ = ["Options", "run_voyage"]

MARKER = ".shorelink-voyage"
SAMPLE_EVERY_S = 2.0
# how long every site must hold everything, unchanged, before the voyage counts it done
SETTLE_S = REPORT_INTERVAL_S + 2 * SAMPLE_EVERY_S


@dataclass(frozen=True)
class Options:
    dir: Path
    ships: int = 3
    minutes: float | None = None
    speed: float | None = None
    containers: int = 24
    seed: int = 1
    keep: bool = False
    drain_timeout: float = 300.0
    live: bool | None = None  # None: a live view when the output is a terminal
    command: str = "shorelink demo"
    spark_per_site: bool = False


def prepare_dir(dir: Path) -> Path:
    """A fresh voyage directory: created, or emptied if an earlier voyage (and only a
    voyage: its marker file) left it; a running stack there is an error."""
    dir = dir.resolve()
    if dir.exists() and any(dir.iterdir()):
        if not (dir / MARKER).exists():
            raise StackError(
                f"{dir} is not empty and holds no earlier voyage: choose another --dir"
            )
        if (dir / "stack.json").exists() and any(
            c.state() != "dead" for c in load_stack(dir).components()
        ):
            raise StackError(
                f"a voyage is still running in {dir} (--keep): `shorelink stack down --dir {dir}` first"
            )
        shutil.rmtree(dir)
    dir.mkdir(parents=True, exist_ok=True)
    (dir / MARKER).write_text(
        "made by shorelink demo; the next demo in this directory replaces it\n"
    )
    return dir


@dataclass
class _Events:
    """The fleet simulator's events file, read as it grows."""

    path: Path
    offset: int = 0
    positions: dict[str, dict[str, Any]] = field(default_factory=dict)
    stats: dict[str, dict[str, Any]] = field(default_factory=dict)
    tracks: dict[str, list[list[float]]] = field(default_factory=dict)
    overboard: dict[str, Any] | None = None
    log: list[str] = field(default_factory=list)

    def read(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n")
        if end < 0:
            return
        self.offset += end + 1
        for line in data[: end + 1].splitlines():
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if not isinstance(ev, dict):
                continue
            ship, kind = ev.get("ship", ""), ev.get("kind")
            if kind == "position":
                self.positions[ship] = ev
                self.tracks.setdefault(ship, []).append(
                    [round(float(ev["t"]), 1), float(ev["lat"]), float(ev["lon"])]
                )
            elif kind == "stats":
                self.stats[ship] = ev
            elif kind == "overboard":
                self.overboard = ev
                self.log.append(
                    f"t={ev['t']:.0f}s {ship}: {len(ev.get('containers', []))} containers overboard"
                )
            elif kind in ("arrive", "depart"):
                self.log.append(f"t={ev['t']:.0f}s {ship} {kind}s {ev.get('port', '')}")


class Voyage:
    def __init__(self, opts: Options, console: Console) -> None:
        self.opts = opts
        self.console = console
        self.t_start = time.time()
        self.ships = [f"ship{i}" for i in range(1, opts.ships + 1)]
        self.dir = opts.dir
        self.launched: Launched | None = None
        self.fleet: Proc | None = None
        self.watches: dict[str, SiteWatch] = {}
        self.customer: CustomerReader | None = None
        self.edge: dict[str, EdgeSample] = {}
        self.series_records: dict[str, list[list[float]]] = {s: [] for s in SITES}
        self.series_backlog: dict[str, list[list[float]]] = {s: [] for s in self.ships}
        self.problems: list[str] = []
        #: headquarters' doings mid-voyage (voyage/fleet.py)
        self.scenario: FleetScenario | None = None
        #: processes stopped on purpose for a moment (an agent given its new key)
        self.paused: set[str] = set()
        self.stopped = False
        self.converged_at = 0.0
        #: wall seconds of each phase: start-up, voyage, drain
        self.timings: dict[str, float] = {}

    def say(self, text: str) -> None:
        self.console.print(f"[dim]{time.time() - self.t_start:6.1f}s[/dim] {text}")

    # -- phases ---------------------------------------------------------------------------
    def start(self) -> VoyagePlan:
        self.launched = launch(
            self.dir, self.ships, self.say, spark_per_site=self.opts.spark_per_site
        )
        self.say(f"stack up in {self.launched.info.started_s:.0f}s: {self.dir / 'stack.json'}")
        self.timings["startup_s"] = round(time.time() - self.t_start, 1)
        plan = plan_voyage(
            self.ships,
            minutes=self.opts.minutes if self.opts.speed is None else None,
            speed=self.opts.speed,
            containers=self.opts.containers,
            seed=self.opts.seed,
            start_wall=time.time() + 3.0,
        )
        (self.dir / "plan.json").write_text(json.dumps(plan.to_json(), indent=1))
        for site in SITES:
            w = SiteWatch(site, self.staff_at(site), plan.start_wall)
            w.start()
            self.watches[site] = w
        # a customer reading its own containers at HQ, live, for the whole voyage
        self.customer = CustomerReader(
            self.launched.customer_toml, self.dir / "logs" / f"customer-{READER}.log"
        )
        self.launched.record(self.customer.start())
        brokers = [f"--broker={s}=127.0.0.1:{self.launched.ships[s].mqtt_port}" for s in self.ships]
        self.fleet = Proc.start(
            "fleet-sim",
            [
                sys.executable,
                "-m",
                "fleet_sim",
                "run",
                "--plan",
                str(self.dir / "plan.json"),
                "--events",
                str(self.dir / "events.jsonl"),
                *brokers,
            ],
            self.dir / "logs" / "fleet-sim.log",
        )
        self.launched.record(self.fleet)
        assert self.launched.watch is not None
        self.scenario = FleetScenario(
            self.launched.registry, self.ships, self.dir / "hq", self.launched.watch, self.say
        )
        rotated = self.ships[-1]  # not the rollouts' canary: their trials stay apart
        self.scenario.rotation = KeyRotation(
            rotated,
            self.launched.registry,
            self.launched.edge_toml[rotated],
            self.dir / "ships" / rotated / "bundle" / "ship.key",
            self.launched.watch,
            functools.partial(self.stop_agent, rotated),
            functools.partial(self.start_agent, rotated),
        )
        self.say(
            f"voyage: {len(self.ships)} ships, {plan.end_s():.0f}s of wall time at "
            f"{plan.speed:.0f}x (one wall second = {plan.speed / 3600:.1f} hours at sea)"
        )
        return plan

    def stop_agent(self, ship: str) -> None:
        """Stop ``ship``'s agent (SIGTERM: it ends its batch, its broker keeps what
        arrives) for a moment the voyage's watch of its processes allows."""
        assert self.launched is not None
        name = f"edge:{ship}"
        self.paused.add(name)
        proc = next(p for p in self.launched.procs if p.name == name)
        proc.stop(grace=30)
        self.launched.procs.remove(proc)

    def start_agent(self, ship: str) -> None:
        """Start ``ship``'s agent again, as launch started it."""
        assert self.launched is not None
        name = f"edge:{ship}"
        config = self.launched.edge_toml[ship]
        port = self.launched.ships[ship].metrics_port
        proc = Proc.start(
            name,
            [sys.executable, "-m", "edge_agent.cli", "run", "--config", str(config)],
            self.dir / "logs" / f"edge-{ship}.log",
        )
        self.launched.record(proc, f"127.0.0.1:{port}")
        proc.wait_ready(functools.partial(port_open, "127.0.0.1", port), 60)
        self.paused.discard(name)

    def sample(self, t: float) -> None:
        assert self.launched is not None
        for ship in self.ships:
            sample = edge_metrics(f"127.0.0.1:{self.launched.ships[ship].metrics_port}")
            if sample.ok:
                self.edge[ship] = sample
            self.series_backlog[ship].append(
                [round(t, 1), self.edge.get(ship, EdgeSample()).backlog_total]
            )
        for site, w in self.watches.items():
            self.series_records[site].append([round(t, 1), w.count()])
        if self.customer is not None:
            self.customer.sample(t)

    def produced(self) -> int:
        return sum(sum(s.last_seq.values()) for s in self.edge.values())

    def state(
        self, plan: VoyagePlan, links: LinkPlayer, events: _Events, t: float, phase: str
    ) -> LiveState:
        rows = []
        for ship in self.ships:
            ph = plan.phase_at(ship, t)
            leg = ph.leg or ("", "")
            where = f"docked {ph.port}" if ph.kind == "port" else f"at sea {leg[0]}->{leg[1]}"
            pos = events.positions.get(ship)
            e = self.edge.get(ship, EdgeSample())
            rows.append(
                ShipRow(
                    ship,
                    where,
                    f"{pos['lat']:.1f},{pos['lon']:.1f}" if pos else "",
                    links.link_of(ship),
                    e.backlog_total,
                    sum(e.last_seq.values()),
                )
            )
        return LiveState(
            t=t,
            voyage_s=plan.end_s(),
            phase=phase,
            ships=rows,
            sites={s: w.count() for s, w in self.watches.items()},
            duplicates={s: sum(w.duplicates.values()) for s, w in self.watches.items()},
            produced=self.produced(),
            site_links=f"{OUTAGE.a}-{OUTAGE.b} CUT" if links.outage_on else "all up",
            alerts=events.log,
        )

    def converged(self) -> bool:
        produced = self.produced()
        if produced == 0 or any(e.backlog_total for e in self.edge.values()):
            return False
        return all(w.count() >= produced for w in self.watches.values())

    def sail(self, plan: VoyagePlan) -> tuple[LinkPlayer, _Events]:
        assert self.launched is not None and self.fleet is not None
        links = LinkPlayer(self.launched.toxiproxy, plan, self.ships)
        events = _Events(self.dir / "events.jsonl")
        live_on = self.console.is_terminal if self.opts.live is None else self.opts.live
        last_sample = last_line = 0.0
        drain_started: float | None = None
        settled: tuple[float, int] | None = None  # since when, at which count
        with (
            Live(console=self.console, refresh_per_second=2, transient=False)
            if live_on
            else _Null() as live
        ):
            while True:
                t = time.time() - plan.start_wall
                links.apply(max(t, 0.0))
                events.read()
                if self.scenario is not None:
                    self.scenario.step(
                        t, lambda ship: links.wifi.get(ship, "") is None, plan.end_s()
                    )
                if time.monotonic() - last_sample >= SAMPLE_EVERY_S:
                    last_sample = time.monotonic()
                    self.sample(t)
                voyage_over = t >= plan.end_s() and not self.fleet.alive()
                if voyage_over and drain_started is None:
                    drain_started = time.monotonic()
                    self.timings["voyage_s"] = round(t, 1)
                    links.heal(t)
                    self.say(
                        "voyage over: ships docked at Sydney; waiting until every site holds everything"
                    )
                    if self.fleet.popen is not None and self.fleet.popen.returncode:
                        self.problems.append(
                            f"the fleet simulator failed (exit {self.fleet.popen.returncode}); see {self.fleet.log}"
                        )
                phase = "draining" if drain_started is not None else "sailing"
                st = self.state(plan, links, events, t, phase)
                if live_on:
                    live.update(render(st))
                elif time.monotonic() - last_line >= 10:
                    last_line = time.monotonic()
                    self.console.print(progress_line(st), highlight=False, soft_wrap=True)
                if drain_started is not None:
                    if not self.converged():
                        settled = None
                    elif settled is None or settled[1] != self.produced():
                        settled = (time.monotonic(), self.produced())
                        self.timings.setdefault(
                            "drain_s", round(time.monotonic() - drain_started, 1)
                        )
                    elif self.scenario is not None and not self.scenario.done:
                        pass  # headquarters' rollouts are still under way
                    elif time.monotonic() - settled[0] > SETTLE_S:
                        # each ship writes one more report once its backlog is empty
                        # (edge_agent/report.py): held still for a report interval, no
                        # record is on its way
                        self.sample(t)
                        self.converged_at = time.time()
                        self.say(f"every site holds every record ({self.produced():,})")
                        break
                    if time.monotonic() - drain_started > self.opts.drain_timeout:
                        self.problems.append(
                            f"not every site held every record {self.opts.drain_timeout:.0f}s after the voyage"
                        )
                        break
                for p in list(self.launched.procs):
                    if p is not self.fleet and p.name not in self.paused and not p.alive():
                        raise StackError(
                            f"{p.name} exited during the voyage; see {p.log}:\n{p.tail()}"
                        )
                time.sleep(0.5)
        links.close(time.time() - plan.start_wall)
        return links, events

    def staff_at(self, site: str) -> KafkaEndpoint:
        """How the voyage's observers read ``site``'s Kafka: as Big Blue's staff."""
        assert self.launched is not None and self.launched.security is not None
        sec = self.launched.security
        staff = KafkaAuth(STAFF, Secret(sec.password("staff", STAFF)), sec.ca_file)
        return KafkaEndpoint(self.launched.info.sites[site]["kafka"], staff)

    def tables_caught_up(self, timeout: float = 180.0) -> bool:
        """HQ's Delta table queries have committed batches up to the end of their
        canonical topics (their checkpoints against Kafka's end offsets)."""
        assert self.launched is not None
        root = self.launched.checkpoint_dir(HQ)
        kafka = self.staff_at(HQ)
        tables = {"container_readings": "containers", "alerts": "alerts", "ship_positions": "nav"}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(
                query_level_with(root / f"table-{t}", kafka, canonical_topic(stream))
                for t, stream in tables.items()
            ):
                return True
            time.sleep(2)
        return False

    def history(self, container: str) -> dict[str, Any] | None:
        """The container's rows in HQ's ``container_readings`` Delta table, read with
        ``shorelink-spark query container-history`` (its own local Spark session)."""
        assert self.launched is not None
        try:
            done = subprocess.run(
                [
                    *[sys.executable, "-m", "spark_core.cli", "query", "container-history"],
                    *["--site", HQ, "--config", str(self.launched.sites_toml)],
                    *["--container", container, "--json"],
                ],
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
        except subprocess.TimeoutExpired:
            self.problems.append(f"the container-history query of {container} took over 600s")
            return None
        rows = [json.loads(x) for x in done.stdout.splitlines() if x.strip().startswith("{")]
        if done.returncode != 0 or not rows:
            self.problems.append(
                f"HQ's container_readings table gave no rows of {container}: "
                f"{done.stderr.strip()[-300:]}"
            )
            return None
        return {"container": container, "site": HQ, "rows": rows}

    def audit(self) -> dict[str, Any] | None:
        assert self.launched is not None
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "shorelink.cli",
                "audit",
                "--all-sites",
                "--config",
                str(self.launched.sites_toml),
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        try:
            result = json.loads(done.stdout)
        except ValueError:
            return {"ok": False, "summary": done.stderr.strip()[-500:] or "no output"}
        return {
            "ok": done.returncode == 0,
            "exit": done.returncode,
            "result": result,
            "summary": "ok" if done.returncode == 0 else "differences, see result",
        }

    def finish(self, plan: VoyagePlan, links: LinkPlayer, events: _Events) -> dict[str, Any]:
        assert self.launched is not None
        link_bytes = self.launched.toxiproxy.link_bytes()
        pick = None
        if events.overboard and events.overboard.get("containers"):
            boxes = events.overboard["containers"]
            pick = next((c for c in boxes if c in plan.transshipped), boxes[0])
        # the checks at once: each reads a different process (and mostly waits on it)
        with ThreadPoolExecutor(max_workers=4) as pool:
            self.say("auditing every site's canonical topics (shorelink audit --all-sites)")
            audit_run = pool.submit(self.audit)
            customer_run = pool.submit(self.customer_summary)
            ops_run = pool.submit(self.ops_summary)
            tables_run = pool.submit(self.tables_caught_up) if pick is not None else None
            audit, customer, ops = audit_run.result(), customer_run.result(), ops_run.result()
            if tables_run is not None and not tables_run.result():
                self.problems.append("HQ's Delta tables did not catch up within 180s")
        for w in self.watches.values():
            w.close()
        with ThreadPoolExecutor(max_workers=1) as pool:
            if pick is not None:  # the table is files: read while the rest stops
                self.say(f"reading {pick}'s history from HQ's Delta table")
            history_run = None if pick is None else pool.submit(self.history, pick)
            if not self.opts.keep:
                self.stop()
            history = None if history_run is None else history_run.result()
        observed = Observed(
            plan=plan,
            ships=self.ships,
            started=datetime.fromtimestamp(self.t_start, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            wall_s=time.time() - self.t_start,
            command=self.opts.command,
            dir=str(self.dir),
            arrivals={s: w.snapshot() for s, w in self.watches.items()},
            duplicates={s: sum(w.duplicates.values()) for s, w in self.watches.items()},
            edge=self.edge,
            fleet=events.stats,
            link_bytes=link_bytes,
            overboard=events.overboard,
            timeline=links.timeline,
            site_outages=links.site_outages,
            series_records=self.series_records,
            series_backlog=self.series_backlog,
            tracks=events.tracks,
            history=history,
            audit=audit,
            customer=customer,
            ops=ops,
            problems=self.problems
            + [f"{s}: {w.error}" for s, w in self.watches.items() if w.error],
            timings=self.timings,
            registry=None if self.scenario is None else self.fleet_summary(),
        )
        return build_report(observed)

    def fleet_summary(self) -> dict[str, Any]:
        assert self.scenario is not None and self.launched is not None
        if not self.scenario.done:
            self.scenario.problems.append(
                f"headquarters' rollouts did not end during the voyage ({self.scenario.phase})"
            )
        logs = {ship: self.dir / "logs" / f"edge-{ship}.log" for ship in self.ships}
        return self.scenario.summary(logs)

    def ops_summary(self) -> dict[str, Any]:
        """Headquarters' operations page as staff see it at the end, and its picture."""
        assert self.launched is not None and self.launched.security is not None
        self.say(f"reading {HQ}'s operations page {self.launched.ops_url}")
        page = OpsReader(
            self.launched.ops_url, STAFF, self.launched.security.password("ops_login", STAFF)
        )
        summary = page.summary(self.ships)
        shot = self.dir / "ops.png"
        why_not = page.screenshot(shot)
        summary["screenshot"] = str(shot) if why_not is None else None
        summary["screenshot_note"] = why_not
        return summary

    def customer_summary(self) -> dict[str, Any] | None:
        """The followed customer's consumer against what HQ holds of its containers;
        then the same consumer asks for another customer's stream."""
        if self.customer is None:
            return None
        hq = self.watches[HQ].snapshot()
        self.say(f"checking customer {READER}'s consumer against what {HQ} holds")
        summary = self.customer.summary(hq)
        self.customer.wait_for(summary["expected"])
        self.customer.stop()
        self.customer.try_other()
        return self.customer.summary(hq)

    def stop(self) -> None:
        """Stop every process (once), unless ``keep``."""
        for w in self.watches.values():
            w.close()
        if self.launched is None or self.opts.keep or self.stopped:
            return
        self.stopped = True
        self.say("stopping every process")
        try:
            down(self.dir)
        except StackError as exc:
            self.console.print(f"[red]{exc}[/red]")
        # stopped by pid above; reap them here (or stop what is left)
        self.launched.stop(grace=5)


class _Null:
    def __enter__(self) -> _Null:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, _renderable: Any) -> None:
        return None


def run_voyage(opts: Options, console: Console | None = None) -> int:
    """Run the whole voyage; 0 when the report's verdict is a pass, 1 when it fails,
    2 when the system could not be started, 130 on Ctrl-C."""
    console = console or Console()
    dir = prepare_dir(opts.dir)
    opts = Options(**{**opts.__dict__, "dir": dir})
    v = Voyage(opts, console)
    code = 2

    def terminated(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt  # SIGTERM (a service manager, `timeout`) stops it as Ctrl-C does

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        plan = v.start()
        links, events = v.sail(plan)
        report = v.finish(plan, links, events)
        (dir / "report.json").write_text(json.dumps(report, indent=1))
        html = write_report(report, dir)
        console.print(summary_text(report), highlight=False, soft_wrap=True)
        console.print(f"report: {html}")
        code = 0 if report["ok"] else 1
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/yellow]")
        code = 130
    except StackError as exc:
        console.print(f"[red]error:[/red] {exc}")
        code = 2
    finally:
        v.stop()
        signal.signal(signal.SIGTERM, previous)
    if opts.keep and v.launched is not None:
        console.print(keep_help(v.launched, v.ships))
    return code


def keep_help(launched: Launched, ships: list[str]) -> str:
    d = launched.dir
    cfg = launched.sites_toml
    return "\n".join(
        [
            f"the stack is still running (--keep); stop it with: shorelink stack down --dir {d}",
            "explore it with (the config files name their secrets; load them first):",
            f"  set -a; . {d / 'secrets.env'}; set +a",
            f"  shorelink stack status --dir {d}",
            f"  shorelink consume --site singapore --stream alerts --config {cfg}",
            f"  shorelink audit --all-sites --config {cfg}",
            f"  shorelink-edge status --config {launched.edge_toml[ships[0]]}",
            f"  shorelink-spark status --site hq --config {cfg}",
            f"  open {launched.ops_url} (HQ's operations page; login: {STAFF}, password"
            f" {env_var('ops_login', STAFF)} in secrets.env)",
            f"  shorelink-spark query container-history --site hq --config {cfg} --container ID",
        ]
    )
