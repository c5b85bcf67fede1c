"""Benchmark: what each deployable costs to install and to run, per pip extra, side by
side with the same deployable in the ``all`` install (the peer).

For each extra (``edge``, ``gateway``, ``spark``, ``all``) a clean virtualenv (no system
site-packages) gets ``pip install SRC[extra]`` from a copy of this checkout (pip's cache
is the user's). Measured per install:

- installed size: ``du -sk`` of site-packages (pip and setuptools, the same ~15 MB in
  every venv, included), the number of distributions, the largest ones, and which of
  the shore-only packages (confluent_kafka, pyspark, pyarrow, delta) are present;
- for each deployable the install holds, in its own install and in ``all``:
  - import time of its CLI module (``edge_agent.cli``, ``core_gateway.cli``,
    ``spark_core.cli``): median of ``--repeats`` fresh interpreters, each timing the
    ``import`` with ``perf_counter`` (after one warm-up run);
  - RSS at idle: the edge agent as ``shorelink-edge run``, connected to a real Mosquitto
    (``local_stack.mosquitto``), ``--idle`` seconds after it connected (its whole process
    tree); the gateway and the site application as a Python process that imported what
    ``run`` loads (gateway: ``core_gateway.app``, ``core_gateway.service``; Spark:
    ``spark_core.jobs.site``, the driver's Python side; its JVM comes on top).

    .venv/bin/python bench/footprint.py --quick     # 3 repeats, 2 s idle
    .venv/bin/python bench/footprint.py             # 7 repeats, 10 s idle

Progress goes to stderr; one JSON object goes to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path
from typing import Any

import tomli_w
from _common import (
    add_run_options,
    agent_metrics_and_streams,
    bench_parser,
    fill_defaults,
    progress,
    run_bench,
    tree_rss_mb,
)

from local_stack.mosquitto import MosquittoBroker, start_mosquitto
from local_stack.process import Proc, free_port

say = progress("footprint")
REPO = Path(__file__).resolve().parent.parent
EXTRAS = ("edge", "gateway", "spark", "all")
PEER = "all"
SHORE_ONLY = ("confluent_kafka", "pyspark", "pyarrow", "delta")

#: per deployable: its CLI module, and what ``run`` has loaded at idle (when the
#: process itself is not measured)
DEPLOYABLES: dict[str, dict[str, Any]] = {
    "edge": {"cli": "edge_agent.cli", "runtime": None},
    "gateway": {
        "cli": "core_gateway.cli",
        "runtime": ["core_gateway.cli", "aiohttp.web", "core_gateway.app", "core_gateway.service"],
    },
    "spark": {"cli": "spark_core.cli", "runtime": ["spark_core.cli", "spark_core.jobs.site"]},
}


def edge_config(*, mqtt_port: int, extra: str, log_path: Path, metrics_port: int) -> str:
    return tomli_w.dumps(
        {
            "ship": "bigblue",
            "log_level": "warning",
            "mqtt": {"host": "127.0.0.1", "port": mqtt_port, "client_id": f"footprint-{extra}"},
            "log": {"path": str(log_path)},
            "rules": [
                {"filter": "bigblue/+/containers/+/env", "stream": "containers", "key": "{4}"}
            ],
            **agent_metrics_and_streams(metrics_port),
        }
    )


#: run in the measured venv: sizes and distributions from importlib.metadata
SIZES = """
import importlib.metadata as md, importlib.util, json, os, sys
sizes = {}
for d in md.distributions():
    total = 0
    for f in d.files or ():
        p = d.locate_file(f)
        try:
            total += os.path.getsize(p)
        except OSError:
            pass
    sizes[d.metadata["Name"]] = total
print(json.dumps({
    "sizes": sizes,
    "present": [n for n in SHORE if importlib.util.find_spec(n) is not None],
}))
"""

IMPORT_TIME = "import time; t = time.perf_counter(); import {mod}; print(time.perf_counter() - t)"

IMPORT_RSS = """
import importlib, json
for m in {mods!r}:
    importlib.import_module(m)
for line in open("/proc/self/status"):
    if line.startswith("VmRSS:"):
        print(int(line.split()[1]) / 1024)
"""


def copy_source(dst: Path) -> Path:
    """pyproject.toml, README.md and the packages pyproject names (pip builds in the
    source tree: not in the checkout)."""
    find = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    tops = sorted({p.split(".")[0].rstrip("*") for p in find["packages"]["find"]["include"]})
    dst.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, dst / name)
    for top in tops:
        shutil.copytree(REPO / top, dst / top, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def clean_env() -> dict[str, str]:
    drop = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")
    return {k: v for k, v in os.environ.items() if k not in drop}


def mb(n: float) -> float:
    return round(n / 1e6, 1)


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.procs: list[Proc] = []
        self.broker: MosquittoBroker | None = None
        self.src = copy_source(work / "src")

    def cleanup(self) -> None:
        for p in self.procs:
            p.stop(grace=5)

    def py(self, extra: str) -> str:
        return str(self.work / extra / "bin" / "python")

    def run_py(self, extra: str, code: str) -> str:
        res = subprocess.run(
            [self.py(extra), "-c", code],
            capture_output=True,
            text=True,
            timeout=300,
            env=clean_env(),
            cwd=self.work,  # not the checkout: its packages would shadow the installed ones
        )
        if res.returncode != 0:
            raise RuntimeError(f"{extra}: {code.strip()[:60]}...: {res.stderr.strip()[-400:]}")
        return res.stdout.strip()

    def install(self, extra: str) -> dict[str, Any]:
        venv = self.work / extra
        say(f"{extra}: venv and pip install .[{extra}]")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
        t0 = time.monotonic()
        subprocess.run(
            [self.py(extra), "-m", "pip", "install", "-q", f"{self.src}[{extra}]"],
            check=True,
            timeout=1800,
            env=clean_env(),
            cwd=self.work,
        )
        install_s = time.monotonic() - t0
        site = next((venv / "lib").glob("python3*/site-packages"))
        du = subprocess.run(["du", "-sk", str(site)], capture_output=True, text=True, check=True)
        got = json.loads(self.run_py(extra, f"SHORE = {SHORE_ONLY!r}\n{SIZES}"))
        sizes: dict[str, int] = got["sizes"]
        largest = sorted(sizes.items(), key=lambda kv: -kv[1])[:6]
        return {
            "site_packages_mb": round(int(du.stdout.split()[0]) / 1024, 1),
            "distributions": len(sizes),
            "largest_mb": {name: mb(n) for name, n in largest},
            "shore_only_present": got["present"],
            "install_s_warm_cache": round(install_s, 1),
        }

    def import_ms(self, extra: str, module: str) -> float:
        code = IMPORT_TIME.format(mod=module)
        self.run_py(extra, code)  # warm-up: the page cache, not the .pyc (pip compiled them)
        runs = [float(self.run_py(extra, code)) for _ in range(self.args.repeats)]
        return round(statistics.median(runs) * 1000, 1)

    def import_rss_mb(self, extra: str, modules: list[str]) -> float:
        return round(float(self.run_py(extra, IMPORT_RSS.format(mods=modules))), 1)

    def edge_idle_rss(self, extra: str) -> dict[str, Any]:
        """``shorelink-edge run`` of this venv, connected to Mosquitto, left idle."""
        if self.broker is None:
            self.broker = start_mosquitto("footprint", self.work / "mosquitto", self.work / "logs")
            self.procs.append(self.broker.proc)
        port = free_port()
        cfg = self.work / f"edge-{extra}.toml"
        cfg.write_text(
            edge_config(
                mqtt_port=self.broker.port,
                extra=extra,
                log_path=self.work / f"edge-{extra}.db",
                metrics_port=port,
            )
        )
        argv = [str(self.work / extra / "bin" / "shorelink-edge"), "run", "--config", str(cfg)]
        proc = Proc.start(
            f"edge-{extra}",
            argv,
            self.work / "logs" / f"edge-{extra}.log",
            env=clean_env(),
            cwd=self.work,
        )
        self.procs.append(proc)
        try:
            deadline = time.monotonic() + 60
            while b"shorelink_edge_mqtt_connected 1.0" not in self._metrics(port):
                if time.monotonic() > deadline or not proc.alive():
                    raise RuntimeError(f"edge agent ({extra}) did not connect:\n{proc.tail()}")
                time.sleep(0.1)
            time.sleep(self.args.idle)
            assert proc.popen is not None
            rss, n = tree_rss_mb(proc.popen.pid)
        finally:
            proc.stop(grace=10)
            self.procs.remove(proc)
        return {"rss_idle_mb": rss, "processes": n}

    @staticmethod
    def _metrics(port: int) -> bytes:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                return bytes(r.read())
        except OSError:
            return b""

    def deployable(self, name: str) -> dict[str, Any]:
        spec = DEPLOYABLES[name]
        out: dict[str, Any] = {"cli": spec["cli"], "import_ms": {}, "rss_idle_mb": {}}
        for extra in (name, PEER):
            say(f"{name} in the {extra} install: import time, RSS")
            out["import_ms"][extra] = self.import_ms(extra, spec["cli"])
            if spec["runtime"] is None:
                idle = self.edge_idle_rss(extra)
                out["rss_idle_mb"][extra] = idle["rss_idle_mb"]
                out.setdefault("processes", {})[extra] = idle["processes"]
            else:
                out["rss_idle_mb"][extra] = self.import_rss_mb(extra, spec["runtime"])
        out["rss_what"] = (
            f"shorelink-edge run connected to Mosquitto, {self.args.idle:g} s idle, whole "
            "process tree"
            if spec["runtime"] is None
            else "a Python process that imported " + ", ".join(spec["runtime"])
        )
        return out

    def run(self) -> dict[str, Any]:
        installs = {extra: self.install(extra) for extra in EXTRAS}
        return {
            "command": "bench/footprint.py" + (" --quick" if self.args.quick else ""),
            "python": platform.python_version(),
            "machine": platform.machine(),
            "peer": PEER,
            "installs": installs,
            "deployables": {name: self.deployable(name) for name in DEPLOYABLES},
        }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = bench_parser("footprint", __doc__)
    add_run_options(p, "3 repeats, 2 s idle", "the venvs")
    p.add_argument("--repeats", type=int, default=None, help="import timings per figure")
    p.add_argument("--idle", type=float, default=None, help="seconds the edge agent idles")
    args = p.parse_args(argv)
    fill_defaults(args, {"repeats": (3, 7), "idle": (2.0, 10.0)})
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_bench(say, args.keep, "footprint-", lambda work: Bench(args, work))


if __name__ == "__main__":
    sys.exit(main())
