"""Benchmark: the fleet registry at a fleet's size (shorelink/fleet/, docs/fleet-registry.md).

Provisions ``--ships`` ships through the registry's own code (what `shorelink fleet
provision` does: three signed entries a ship, a bundle with its token and key), gives
every group a configuration, rotates a key of one ship in ten, then measures:

- **status**: ``shorelink fleet status --json`` as an operator runs it, a new process
  each time (Python's start, the imports, reading and checking every entry's signature
  and link, the answer); goal: under a second for 700 ships (issue 41);
- **verify**: ``shorelink fleet verify``, every entry's signature checked (status checks
  only the entries past ``registry.verified``, the newest one a reader checked);
- **apply**: reading and applying the whole log in this process (``Registry.open``),
  every signature checked, and past ``registry.verified`` only;
- **status with reports**: ``shorelink fleet status --json --kafka B`` with a rollout to
  every ship under way (its canary and second stage reached) and ``--reports-per-ship``
  ship reports of every ship in the report stream's canonical topic: the reports read
  to the topic's end, each ship's version, health and last heard, what the rollout's
  next tick decides; ``fleet rollout status`` the same way; goal: under a second
  (issue 41). ``--kafka`` names a broker, else one is started here;
- **python**: a bare ``python -c pass``, the floor any command stands on;
- **provision**: the seconds a ship's provisioning took (append under the lock, fsync,
  the bundle's files).

    .venv/bin/python bench/fleet_registry.py                 # 700 ships
    .venv/bin/python bench/fleet_registry.py --ships 70 --runs 3

Progress goes to stderr; one JSON object goes to stdout, each figure beside its goal.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from _common import bench_parser, progress, work_dir

from local_stack.kafka import start_kafka
from local_stack.process import stop_procs
from shorelink.contract import canonical_topic
from shorelink.fleet.bundle import provision
from shorelink.fleet.log import Registry
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.topics import TopicSpec, ensure_topics, producer
from shorelink.proof import ShipKey
from shorelink.ship_report import ReportedConfig, ShipReport, report_record

STATUS_GOAL_S = 1.0


def _loadavg() -> str:
    return Path("/proc/loadavg").read_text().strip()


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed_runs(
    cmd: list[str], runs: int, env: dict[str, str] | None = None
) -> tuple[list[float], list[float]]:
    """Each run's wall seconds and CPU seconds (the machine's other load inflates the
    first, barely the second)."""
    wall, cpu = [], []
    for _ in range(runs):
        t, c = time.perf_counter(), _children_cpu()
        done = subprocess.run(cmd, capture_output=True, check=False, env=env)
        wall.append(time.perf_counter() - t)
        cpu.append(_children_cpu() - c)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.decode()[-500:]}")
    return wall, cpu


def _summary(values: list[float], cpu: list[float] | None = None) -> dict[str, float]:
    out = {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }
    if cpu is not None:
        out["cpu_median"] = round(statistics.median(cpu), 3)
    return out


def _rollout(reg: Registry, before: int) -> tuple[int, dict[str, int]]:
    """A rollout to every ship (group ``all``) at its second stage: the version each
    ship should run now."""
    body = {
        "group": "all",
        "format": "toml",
        "document": "[alarms]\nthreshold = 5\n",
        "port_links_only": False,
        "stages": ["5%", "25%", "100%"],
        "healthy_s": 0,
        "stop_failure_percent": 10,
    }
    reg.append([("rollout_started", body)])
    rid = reg.state.version
    reg.append([("rollout_advanced", {"rollout": rid, "stage": 1, "by": "operator"})])
    return rid, {s: reg.state.config_version(s) or before for s in reg.state.ships}


def _write_reports(kafka: KafkaEndpoint, expected: dict[str, int], per_ship: int) -> str:
    """``per_ship`` reports of every ship in a report stream of its own, the newest
    saying the version it should run (one in fifty a failure instead)."""
    stream = f"benchagent{uuid.uuid4().hex[:8]}"
    topic = canonical_topic(stream)
    ensure_topics(kafka, [TopicSpec(topic, 3)])
    p = producer(kafka, {"linger.ms": 20})
    now = int(time.time() * 1000)
    for n in range(per_ship):
        for i, (ship, version) in enumerate(sorted(expected.items())):
            failure = "alarms.threshold: out of range" if i % 50 == 0 else None
            config = ReportedConfig(version - (failure is not None), failure)
            at = now - (per_ship - 1 - n) * 60_000 + 5_000
            report = ShipReport(at, "satellite", {"nav": (n, 0)}, {}, config=config)
            rec = report_record(ship, stream, n + 1, report, "hq")
            headers: list[tuple[str, str | bytes | None]] = list(rec.headers())
            p.produce(topic, rec.value, rec.key, headers=headers)
            p.poll(0)
    assert p.flush(60) == 0
    return stream


def run(
    work: Path,
    ships: int,
    groups: int,
    runs: int,
    say: Any,
    kafka: KafkaEndpoint,
    per_ship: int,
) -> dict[str, Any]:
    directory = work / "registry"
    reg = Registry.init(directory)
    names = [f"ship-{i:04d}" for i in range(ships)]
    t0 = time.perf_counter()
    for i, name in enumerate(names):
        provision(reg, name, [f"group-{i % groups}", "all"])
        if (i + 1) % 100 == 0:
            say(f"provisioned {i + 1} ships")
    provision_s = time.perf_counter() - t0
    config = work / "group.toml"
    config.write_text("[alarms]\nthreshold = 4\n")
    for g in range(groups):
        body = {
            "scope": "group",
            "name": f"group-{g}",
            "format": "toml",
            "document": config.read_text(),
            "port_links_only": False,
        }
        reg.append([("config_set", body)])
    for name in names[::10]:
        body = {"ship": name, "public": ShipKey.generate().public(), "from_seq": 1000}
        reg.append([("ship_key_added", body)])
    rid, expected = _rollout(reg, reg.state.version)
    reached = sum(v == rid for v in expected.values())
    version = reg.state.version
    say(f"registry at version {version}; writing {per_ship} reports a ship")
    stream = _write_reports(kafka, expected, per_ship)
    say("timing")

    apply_s: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(runs):
        for every in (True, False):
            t = time.perf_counter()
            opened = Registry.open(directory, every=every)
            apply_s[every].append(time.perf_counter() - t)
            assert opened.state.version == version and len(opened.state.ships) == ships

    env = {**os.environ, "SHORELINK_FLEET_REGISTRY": str(directory)}
    shorelink = [sys.executable, "-m", "shorelink.cli"]
    python_s = _timed_runs([sys.executable, "-c", "pass"], runs)
    status_s = _timed_runs([*shorelink, "fleet", "status", "--json"], runs, env)
    table_s = _timed_runs([*shorelink, "fleet", "status"], runs, env)
    verify_s = _timed_runs([*shorelink, "fleet", "verify"], runs, env)
    reports = ["--kafka", kafka.bootstrap, "--report-stream", stream]
    health_s = _timed_runs([*shorelink, "fleet", "status", "--json", *reports], runs, env)
    health_table_s = _timed_runs([*shorelink, "fleet", "status", *reports], runs, env)
    rollout_s = _timed_runs([*shorelink, "fleet", "rollout", "status", *reports], runs, env)
    shown = json.loads(
        subprocess.run(
            [*shorelink, "fleet", "status", "--json", *reports],
            capture_output=True,
            check=True,
            env=env,
        ).stdout
    )
    health: dict[str, int] = {}
    for ship in shown["ships"]:
        health[ship["health"]] = health.get(ship["health"], 0) + 1
    return {
        "ships": ships,
        "groups": groups,
        "entries": version,
        "log_bytes": (directory / "registry.log").stat().st_size,
        "status_json_s": {**_summary(*status_s), "goal": STATUS_GOAL_S},
        "status_table_s": {**_summary(*table_s), "goal": STATUS_GOAL_S},
        "verify_s": _summary(*verify_s),
        "status_with_reports_json_s": {**_summary(*health_s), "goal": STATUS_GOAL_S},
        "status_with_reports_table_s": {**_summary(*health_table_s), "goal": STATUS_GOAL_S},
        "rollout_status_s": {**_summary(*rollout_s), "goal": STATUS_GOAL_S},
        "reports": ships * per_ship,
        "rollout": {
            "reached": reached,
            "health": health,
            "decision": shown["rollouts"][0]["decision"]["action"],
        },
        "apply_log_s": _summary(apply_s[True]),
        "apply_past_verified_s": _summary(apply_s[False]),
        "apply_per_entry_us": round(statistics.median(apply_s[True]) / version * 1e6, 1),
        "python_start_s": _summary(*python_s),
        "provision_per_ship_ms": round(provision_s / ships * 1e3, 2),
        "runs": runs,
    }


def main() -> int:
    p = bench_parser("fleet_registry.py", __doc__)
    p.add_argument("--ships", type=int, default=700)
    p.add_argument("--groups", type=int, default=7)
    p.add_argument("--runs", type=int, default=5, help="timed runs of each measure")
    p.add_argument("--keep", type=Path, default=None, metavar="DIR", help="work in DIR, keep it")
    p.add_argument("--kafka", metavar="BOOTSTRAP", help="a broker to write reports to")
    p.add_argument("--reports-per-ship", type=int, default=10)
    a = p.parse_args()
    if a.ships < 1 or a.groups < 1 or a.runs < 1:
        p.error("--ships, --groups and --runs must be at least 1")
    say = progress("fleet_registry")
    before = _loadavg()
    with work_dir(a.keep, "sl-fleet-registry-") as work:
        broker = None
        if a.kafka is None:
            broker = start_kafka("hq", work / "kafka", work / "logs")
            say(f"kafka on {broker.bootstrap}")
        kafka = KafkaEndpoint.plaintext(a.kafka) if broker is None else broker.endpoint
        try:
            result = run(work, a.ships, a.groups, a.runs, say, kafka, a.reports_per_ship)
        finally:
            if broker is not None:
                stop_procs([broker.proc])
    result["loadavg"] = {"before": before, "after": _loadavg()}
    print(json.dumps(result, indent=2), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
