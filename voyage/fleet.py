"""The fleet as headquarters runs it in a voyage (docs/voyage.md, "The fleet from
headquarters"): one registry at HQ (``shorelink fleet init``), every ship provisioned
there (``shorelink fleet provision --require-client-cert``) and its bundle carried on
board, headquarters' loop (``shorelink fleet run``) publishing every entry and ticking
the rollouts, and every gateway and Spark application following its site's
``sl.registry``: no ``ships.json``, no ship keys file anywhere.

Mid-voyage (:class:`FleetScenario`, driven by the voyage's loop): a configuration
change (the overboard alarm's threshold) rolled out to the fleet while the ships are at
sea, reaching every ship over the satellite; then a broken one (a key no agent knows),
which its canary refuses and its rollout stops; then one ship's key rotated while it
uploads (:class:`KeyRotation`). :class:`RegistryWatch` times each entry
the voyage writes from its writing at HQ to its enforcement by every gateway
(``/healthz``) and every Spark application (``replication.status.json``).

Everything here runs the operator's own command lines (``shorelink fleet ...``) and
reads what they write; the registry's state is read with the kernel
(:class:`~shorelink.fleet.log.Registry`), as ``shorelink fleet status`` reads it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shorelink.fleet.entry import RegistryError
from shorelink.fleet.log import Registry
from shorelink.fleet.rollout import canary_order
from voyage.topology import HQ, SITES

__all__ = [
    "GROUP",
    "FleetScenario",
    "RegistryWatch",
    "fleet_cli",
    "provision_fleet",
    "registry_dir",
]

#: the group every ship of the voyage is provisioned in (its rollouts' group)
GROUP = "fleet"
#: how often headquarters' loop ticks the rollouts (a ship reports every 10 s)
TICK_EVERY_S = 3
#: how long a stage's ships must report healthy before the next
HEALTHY_FOR = "3s"

_OVERBOARD = """\
# {what} (written by `shorelink demo`): the overboard alarm, {above} g and then three
# hours of silence
[[alarms]]
name = "overboard"
filter = "bigblue/+/containers/+/env"
key = "{{4}}"
field = "shock"
above = {above}
silence = "3h"
"""
#: the change rolled out mid-voyage: a new threshold for the overboard alarm (a lost
#: container's shock is 25-40 g, a rough sea's 1-3 g: the same alerts either way)
GOOD = _OVERBOARD.format(what="a new alarm threshold", above="8.0")
#: the deliberately broken change: a key no agent of this fleet knows
BROKEN = GOOD.replace("a new alarm threshold", "a change for a newer agent") + (
    '\n[report]\nnew_in_next_release = "yes"\n'
)


def registry_dir(dir: Path) -> Path:
    return dir / "hq" / "registry"


def fleet_cli(*args: str | Path, timeout: float = 60) -> str:
    """``shorelink fleet ARGS`` as an operator runs it; its output (RuntimeError with
    its error line if it fails)."""
    argv = [sys.executable, "-m", "shorelink.cli", "fleet", *map(str, args)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"shorelink fleet {args[0]} failed: {done.stderr.strip()[-500:]}")
    return done.stdout


def provision_fleet(dir: Path, ships: list[str]) -> Path:
    """The registry at HQ and every ship provisioned in it (identity, token, key, client
    certificate required); each bundle carried to its ship's directory
    (``ships/<ship>/bundle``) and deleted at HQ. The registry's directory."""
    registry = registry_dir(dir)
    registry.parent.mkdir(parents=True, exist_ok=True)
    fleet_cli("init", "--registry", registry)
    # at once: each command's start is most of its time, and appends take the log's lock
    with ThreadPoolExecutor(max_workers=len(ships) or 1) as pool:
        runs = [
            pool.submit(
                fleet_cli,
                *("provision", ship, "--group", GROUP, "--require-client-cert"),
                *("--registry", registry),
            )
            for ship in ships
        ]
        for run in runs:
            run.result()
    for ship in ships:
        made = registry / "bundles" / ship
        shutil.copytree(made, dir / "ships" / ship / "bundle")  # modes kept: 0600 secrets
        shutil.rmtree(made)  # it held the token's only copy: on board now
    return registry


def _get_json(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return json.loads(resp.read())
    except (OSError, ValueError):
        return None


@dataclass
class RegistryWatch:
    """The registry version each gateway and Spark application enforces, looked at every
    0.2 s on a thread: when each first enforced each version."""

    gateways: Mapping[str, str]  # site -> the gateway's metrics address (host:port)
    status_files: Mapping[str, Path]  # site -> its replication.status.json
    #: (site, "gateway" | "spark") -> [(version, wall time first seen)]
    seen: dict[tuple[str, str], list[tuple[int, float]]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def versions(self) -> dict[tuple[str, str], int]:
        out = {}
        for site, addr in self.gateways.items():
            reg = (_get_json(f"http://{addr}/healthz") or {}).get("registry")
            if isinstance(reg, dict):
                out[(site, "gateway")] = int(reg["version"])
        for site, path in self.status_files.items():
            try:
                reg = json.loads(path.read_text()).get("registry")
            except (OSError, ValueError):
                continue
            if isinstance(reg, dict):
                out[(site, "spark")] = int(reg["version"])
        return out

    def look(self) -> None:
        now = time.time()
        for where, v in self.versions().items():
            seen = self.seen.setdefault(where, [])
            if not seen or v > seen[-1][0]:
                seen.append((v, now))

    def enforced_at(self, where: tuple[str, str], version: int) -> float | None:
        return next((t for v, t in self.seen.get(where, []) if v >= version), None)

    def everywhere(self, version: int) -> bool:
        places = [(s, c) for s in SITES for c in ("gateway", "spark")]
        return all(self.enforced_at(p, version) is not None for p in places)

    def start(self) -> None:
        def loop() -> None:
            while not self._stop.wait(0.2):
                self.look()

        self._thread = threading.Thread(target=loop, name="registry-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def timing(self, version: int, written: float) -> dict[str, float | None]:
        """Seconds from ``written`` to each site's gateway and Spark application
        enforcing ``version`` (None: not seen)."""
        out: dict[str, float | None] = {}
        for s in SITES:
            for c in ("gateway", "spark"):
                t = self.enforced_at((s, c), version)
                out[f"{s} {c}"] = None if t is None else round(max(0.0, t - written), 2)
        return out


_FETCHED = re.compile(r"event=fleet_config_fetched site=(\S+) bytes=(\d+)")
_TS = re.compile(r"^ts=(\S+)")


def config_fetches(log: Path) -> list[dict[str, Any]]:
    """Each configuration a ship's agent fetched (its log): from which site, how many
    bytes (request and answer, what its link's budget was charged)."""
    out: list[dict[str, Any]] = []
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return out
    for line in lines:
        m = _FETCHED.search(line)
        if m:
            ts = _TS.match(line)
            out.append(
                {"site": m.group(1), "bytes": int(m.group(2)), "at": ts.group(1) if ts else ""}
            )
    return out


def _top(ranges: str) -> int:
    """The highest seq of a held range set's text (``1-500,700-800``; 0: none)."""
    tops = [int(part.rsplit("-", 1)[-1]) for part in ranges.split(",") if part.strip()]
    return max(tops, default=0)


@dataclass
class KeyRotation:
    """One ship's signing key rotated mid-voyage, as an operator does it with today's
    agent (which signs every batch with the one key it loaded at its start):

    1. the agent stopped (SIGTERM: it finishes the batch under way; what arrives over
       MQTT meanwhile waits in its broker's session);
    2. ``shorelink-edge status --json``: per stream the highest seq any site holds;
       the new key signs from the next one (``fleet rotate-key --from-seq``), so every
       record shore holds stays proved by the old key and every record still on board,
       signed when it is sent, is the new key's;
    3. the entry enforced by every gateway and Spark application (a batch signed by a
       key a gateway has not learnt would be refused);
    4. the new key carried on board (over ``uplink.signing_key_file``), deleted at HQ;
       the agent started again.
    """

    ship: str
    registry: Path
    edge_toml: Path
    key_file: Path  # uplink.signing_key_file on board
    watch: RegistryWatch
    stop_agent: Callable[[], None]
    start_agent: Callable[[], None]
    result: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    finished: threading.Event = field(default_factory=threading.Event)

    def run(self, t: float) -> None:
        threading.Thread(target=self._run, args=(t,), name="key-rotation", daemon=True).start()

    def _run(self, t: float) -> None:
        t0 = time.time()
        try:
            self.stop_agent()
            argv = [sys.executable, "-m", "edge_agent.cli", "status", "--config"]
            done = subprocess.run(
                [*argv, str(self.edge_toml), "--json"],
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            )
            streams = json.loads(done.stdout)["streams"]
            bound = {
                name: max((_top(r) for r in st["held"].values()), default=0) + 1
                for name, st in streams.items()
            }
            new_key = self.registry / "bundles" / self.ship / "ship-rotated.key"
            fleet_cli(
                "rotate-key",
                self.ship,
                *(f"--from-seq={name}={seq}" for name, seq in sorted(bound.items())),
                "--key-file",
                new_key,
                "--registry",
                self.registry,
            )
            written = time.time()
            version = Registry.open(self.registry).state.version
            deadline = time.monotonic() + 60
            while not self.watch.everywhere(version):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"entry {version} not enforced everywhere within 60s")
                time.sleep(0.1)
            shutil.copyfile(new_key, self.key_file)  # over the old key: still 0600
            new_key.unlink()
            self.start_agent()
            self.result = {
                "ship": self.ship,
                "at_s": round(t, 1),
                "version": version,
                "from_seq": bound,
                "last_seq": {n: st["last_seq"] for n, st in streams.items()},
                "agent_down_s": round(time.time() - t0, 1),
                "enforced_s": self.watch.timing(version, written),
            }
        except (RuntimeError, OSError, ValueError, KeyError, subprocess.SubprocessError) as exc:
            self.error = f"{self.ship}'s key rotation: {exc}"
            try:
                self.start_agent()
            except Exception as again:
                self.error += f"; the agent did not start again: {again}"
        finally:
            self.finished.set()


@dataclass
class FleetScenario:
    """What headquarters does to the fleet mid-voyage, a step at a time from the
    voyage's loop: the good change once every ship is at sea (or at 30% of the voyage),
    then the broken one once the good one is done; each entry timed to its enforcement
    at every site."""

    registry: Path
    ships: list[str]
    files: Path
    watch: RegistryWatch
    say: Callable[[str], None]
    #: what happened, for the report: each rollout started, with its timing
    rollouts: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    phase: str = "waiting"  # waiting, good, broken, rotate, rotating, done
    #: one ship's key rotated after the rollouts (None: not rotated)
    rotation: KeyRotation | None = None
    #: what the rotation did, for the report
    rotated: dict[str, Any] | None = None
    _since: float = 0.0

    def canary(self) -> str:
        return canary_order(GROUP, self.ships)[0]

    def _start(self, what: str, document: str, t: float) -> None:
        path = self.files / f"{what}.toml"
        path.write_text(document)
        fleet_cli(
            "rollout",
            "start",
            path,
            "--group",
            GROUP,
            "--canary",
            "1",
            "--healthy-for",
            HEALTHY_FOR,
            "--stop-at",
            "0%",
            "--registry",
            self.registry,
        )
        written = time.time()
        rid = Registry.open(self.registry).state.version
        self.rollouts.append(
            {"what": what, "id": rid, "started_s": round(t, 1), "written": written}
        )
        self.say(f"fleet: rollout {rid} ({what}) started; canary {self.canary()}")
        self._since = time.monotonic()

    def step(self, t: float, at_sea: Callable[[str], bool], voyage_s: float) -> None:
        try:
            self._step(t, at_sea, voyage_s)
        except RegistryError:
            return  # read while an entry was being appended: the next turn reads it whole
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            self.problems.append(f"fleet scenario ({self.phase}): {exc}")
            self.phase = "done"

    def _step(self, t: float, at_sea: Callable[[str], bool], voyage_s: float) -> None:
        if self.phase == "waiting":
            if (t > 0.1 * voyage_s and all(at_sea(s) for s in self.ships)) or t > 0.3 * voyage_s:
                self._start("good", GOOD, t)
                self.phase = "good"
            return
        if self.phase in ("good", "broken"):
            self._rollout_step(t)
            return
        rot = self.rotation
        if self.phase == "rotate" and rot is not None:
            where = "at sea" if at_sea(rot.ship) else "at a port"
            self.say(f"fleet: rotating {rot.ship}'s signing key while it uploads ({where})")
            rot.run(t)
            self.rotated = {"where": where}
            self.phase = "rotating"
            return
        if self.phase == "rotating":
            assert rot is not None
            if not rot.finished.is_set():
                return
            if rot.error:
                self.problems.append(rot.error)
            else:
                self.say(
                    f"fleet: {rot.ship} signs with its new key from "
                    + ", ".join(f"{k} {v}" for k, v in sorted(rot.result["from_seq"].items()))
                )
                self.rotated = {**rot.result, **(self.rotated or {})}
            self.phase = "done"

    def _rollout_step(self, t: float) -> None:
        state = Registry.open(self.registry).state
        r = state.rollouts[self.rollouts[-1]["id"]]
        if r.state == "active":
            return
        self.rollouts[-1].update(ended_s=round(t, 1), state=r.state, reason=r.reason, by=r.by)
        self.say(f"fleet: rollout {r.id} {r.state}" + (f": {r.reason}" if r.reason else ""))
        if self.phase == "good":
            if r.state != "done":
                self.problems.append(f"the configuration change's rollout {r.id} {r.state}")
            self._start("broken", BROKEN, t)
            self.phase = "broken"
            return
        if r.state != "stopped" or r.stage != 0:
            self.problems.append(
                f"the broken change's rollout {r.id} was {r.state} at stage {r.stage + 1}, "
                "not stopped at its canary"
            )
        # a ship's key last: its agent stops for it, and stays out of the rollouts' trials
        self.phase = "rotate" if self.rotation is not None else "done"

    @property
    def done(self) -> bool:
        return self.phase == "done"

    def summary(self, edge_logs: Mapping[str, Path]) -> dict[str, Any]:
        """The fleet section of the report: each rollout (stages, ships reached, how it
        ended and why, each entry's way to every site) and what each ship fetched."""
        state = Registry.open(self.registry).state
        rollouts = []
        for started in self.rollouts:
            r = state.rollouts[started["id"]]
            counts = r.stage_counts()
            rollouts.append(
                {
                    "what": started["what"],
                    "id": r.id,
                    "stages": list(r.stages),
                    "stage_ships": counts,
                    "stage_reached": r.stage + 1,
                    "reached": r.reached(),
                    "state": r.state,
                    "by": r.by,
                    "reason": r.reason,
                    "started_s": started["started_s"],
                    "ended_s": started.get("ended_s"),
                    "enforced_s": self.watch.timing(r.id, started["written"]),
                }
            )
        per_ship = {}
        for ship, log in edge_logs.items():
            fetches = config_fetches(log)
            per_ship[ship] = {
                "fetches": fetches,
                "satellite_bytes": sum(f["bytes"] for f in fetches if f["site"] == HQ),
                "port_bytes": sum(f["bytes"] for f in fetches if f["site"] != HQ),
            }
        enforced = [v for r in rollouts for v in r["enforced_s"].values() if v is not None]
        return {
            "key_rotation": self.rotated,
            "registry_version": state.version,
            "ships": len(state.ships),
            "rollouts": rollouts,
            "config": per_ship,
            "enforced_max_s": max(enforced, default=None),
            "goal_enforced_s": 10.0,
            "problems": list(self.problems),
        }
