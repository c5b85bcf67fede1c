"""A ship installs ``shorelink[edge]`` and nothing of the shore: no Kafka client, no
Spark, no Arrow; a port's gateway installs ``shorelink[gateway]`` without Spark. Checked
in clean virtualenvs (no system site-packages) built from a copy of this checkout, where
the agent must still ingest for real: a ship's computer is small, often 64-bit ARM, and
every package it does not need is one more that can fail to install at sea."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tomllib
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from local_stack.kafka import KafkaBroker
from local_stack.mosquitto import MosquittoBroker
from local_stack.process import free_port
from tests.edge_agent.helpers import Publisher, write_config
from tests.helpers import build_version, eventually, run_process, unique

ROOT = Path(__file__).resolve().parents[1]

#: what only the shore needs (the gateway's Kafka client, the site's Spark application)
SHORE_ONLY = ("confluent_kafka", "pyspark", "pyarrow", "delta")
#: what only the site's Spark application needs
NOT_IN_GATEWAY = ("pyspark", "pyarrow", "delta")


def copy_source(dst: Path) -> Path:
    """pyproject.toml, README.md, the licence files and the packages pyproject names,
    copied to ``dst``: pip builds a wheel in the source tree, and must not leave build/ in
    the checkout."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    find = pyproject["tool"]["setuptools"]
    tops = sorted({p.split(".")[0].rstrip("*") for p in find["packages"]["find"]["include"]})
    dst.mkdir(parents=True)
    for top in tops:
        shutil.copytree(ROOT / top, dst / top, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", *pyproject["project"]["license-files"]):
        shutil.copy2(ROOT / name, dst / name)
    return dst


@functools.cache
def checkout_version() -> str:
    """The version a build of this checkout gets (setuptools-scm, as pip's build would):
    the wheels below are built from a copy without git, and are given it."""
    return build_version(ROOT)


def clean_env() -> dict[str, str]:
    """This process's environment without what would let the checkout or the dev venv
    leak into the lean one."""
    return {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")
    }


@pytest.fixture(scope="module")
def lean_venv(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Factory: ``lean_venv("edge")`` -> a fresh venv with ``shorelink[edge]``, made once
    per module from one wheel built once (pip's cache is the user's, shared). The venvs
    have no pip of their own: this environment's pip installs into them (``--python``)."""
    root = tmp_path_factory.mktemp("install")
    src = copy_source(root / "src")

    def pip(*args: str, **env: str) -> None:
        cmd = [sys.executable, "-m", "pip", *args]
        subprocess.run(cmd, check=True, timeout=300, env={**clean_env(), **env}, cwd=root)

    pip(
        "wheel",
        "-q",
        "--no-deps",
        "-w",
        str(root),
        str(src),
        SETUPTOOLS_SCM_PRETEND_VERSION_FOR_SHORELINK=checkout_version(),
    )
    (wheel,) = root.glob("shorelink-*.whl")
    made: dict[str, Path] = {}

    def get(extra: str) -> Path:
        if extra not in made:
            venv = root / extra
            subprocess.run(
                [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
            )
            python = str(venv / "bin" / "python")
            pip("--python", python, "install", "-q", "--no-compile", f"{wheel}[{extra}]")
            made[extra] = venv
        return made[extra]

    return get


@pytest.fixture
def edge_venv(lean_venv: Callable[[str], Path]) -> Path:
    return lean_venv("edge")


def probe(venv: Path, package: str, absent: tuple[str, ...]) -> dict[str, Any]:
    """In ``venv``: import every module of ``package``; where it was imported from,
    which of ``absent`` can be found, which top-level modules were loaded."""
    code = f"""
import importlib, importlib.util, json, pkgutil, sys
import {package} as pkg
for m in pkgutil.walk_packages(pkg.__path__, "{package}."):
    importlib.import_module(m.name)
print(json.dumps({{
    "from": pkg.__file__,
    "present": [n for n in {absent!r} if importlib.util.find_spec(n) is not None],
    "loaded": sorted({{n.split(".")[0] for n in sys.modules}}),
}}))
"""
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(),
        cwd=venv,  # not the checkout: its packages must not shadow the installed ones
    )
    assert out.returncode == 0, out.stderr
    got: dict[str, Any] = json.loads(out.stdout)
    assert got["from"].startswith(str(venv)), got["from"]
    return got


def test_edge_install_has_no_kafka_client_spark_or_arrow(edge_venv: Path) -> None:
    """Every module of the agent imports in the lean install, and none of the shore's
    packages is there to import."""
    got = probe(edge_venv, "edge_agent", SHORE_ONLY)
    assert got["present"] == []
    assert not set(SHORE_ONLY) & set(got["loaded"])


def test_gateway_install_has_no_spark_arrow_or_edge_packages(
    lean_venv: Callable[[str], Path],
) -> None:
    """A port's gateway (``shorelink[gateway]``, deploy/gateway/Containerfile) imports
    every module of its own without Spark, Arrow, Delta or the edge's MQTT and SQLite
    packages, and answers --help."""
    venv = lean_venv("gateway")
    got = probe(venv, "core_gateway", (*NOT_IN_GATEWAY, "paho", "sqlite_utils"))
    assert got["present"] == []
    assert "confluent_kafka" in got["loaded"]
    helped = subprocess.run(
        [str(venv / "bin" / "shorelink-gateway"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(),
        cwd=venv,
    )
    assert helped.returncode == 0 and "Usage: shorelink-gateway" in helped.stdout, helped.stderr
    # the kernel's command starts in a lean install too; a command whose package needs
    # what this install lacks says so in one line naming the extra that brings it: the
    # local stack's (tomli_w) and the voyage's (rich; review, ecosystem §4: a traceback)
    kernel = str(venv / "bin" / "shorelink")
    helped = subprocess.run(
        [kernel, "--help"], capture_output=True, text=True, timeout=60, env=clean_env(), cwd=venv
    )
    assert helped.returncode == 0 and "audit" in helped.stdout, helped.stderr
    for command in (["stack", "status"], ["demo", "--ships", "1"]):
        res = subprocess.run(
            [kernel, *command],
            capture_output=True,
            text=True,
            timeout=60,
            env=clean_env(),
            cwd=venv,
        )
        assert res.returncode == 2, res.stderr
        assert res.stderr.count("\n") == 1 and res.stderr.startswith("error: "), res.stderr
        assert "comes with shorelink's [demo] extra" in res.stderr, res.stderr


def test_edge_agent_ingests_from_its_lean_install(
    edge_venv: Path, tmp_path: Path, mosquitto: MosquittoBroker
) -> None:
    """``shorelink-edge`` as installed on a ship: --help, then a real run against a real
    Mosquitto, stopped with SIGTERM, and ``status --json`` counts what it committed."""
    edge = str(edge_venv / "bin" / "shorelink-edge")
    env = clean_env()
    helped = subprocess.run(
        [edge, "--help"], capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path
    )
    assert helped.returncode == 0 and "Usage: shorelink-edge" in helped.stdout, helped.stderr
    # the version the wheel was built with (from this checkout's git), as the ship says it
    version = subprocess.run(
        [edge, "--version"], capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path
    )
    assert version.stdout.split()[-1] == checkout_version(), version.stdout

    port = free_port()
    cfg = write_config(tmp_path, mosquitto)
    cfg.write_text(cfg.read_text().replace("[metrics]\nport = 0", f"[metrics]\nport = {port}"))
    proc = run_process(
        "edge-agent", [edge, "run", "--config", str(cfg)], tmp_path / "agent.log", env=env
    )
    assert proc.popen is not None
    publisher = Publisher(mosquitto, f"pub-{tmp_path.name}"[:60])
    try:

        def connected() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    return b"shorelink_edge_mqtt_connected 1.0" in r.read()
            except OSError:
                return False

        eventually(connected, within=30, what="the agent connected", proc=proc)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            build = next(ln for ln in r.read().decode().splitlines() if "_build_info{" in ln)
        assert build.startswith("shorelink_edge_build_info{"), build
        assert f'version="{checkout_version()}"' in build, build
        for i in range(20):
            publisher.publish(
                f"bigblue/d1/containers/C{i % 4}/env", f'{{"ts": 1700000000, "i": {i}}}'.encode()
            )
        publisher.publish("bigblue/d1/containers/C0/alert", b'{"door": "open"}')
        publisher.wait_all_acked()

        def status() -> dict[str, dict[str, int]]:
            res = subprocess.run(
                [edge, "status", "--config", str(cfg), "--json"],
                capture_output=True,
                text=True,
                timeout=60,
                env=env,
                cwd=tmp_path,
                check=True,
            )
            streams: dict[str, dict[str, int]] = json.loads(res.stdout)["streams"]
            return streams

        eventually(
            lambda: status()["containers"]["records"] == 20,
            within=30,
            what="20 container records committed",
            proc=proc,
        )
        proc.popen.send_signal(signal.SIGTERM)
        assert proc.popen.wait(30) == 0, proc.tail()
    finally:
        publisher.close()
        proc.stop(grace=0)

    streams = status()
    assert (streams["containers"]["records"], streams["containers"]["last_seq"]) == (20, 20)
    assert (streams["alerts"]["records"], streams["alerts"]["last_seq"]) == (1, 1)


@pytest.mark.timeout(600)
def test_the_site_application_runs_from_its_wheel_install(
    lean_venv: Callable[[str], Path], kafka: KafkaBroker, tmp_path: Path
) -> None:
    """Review (ecosystem): installed from a wheel, ``shorelink-spark site`` named
    ``site-packages/deploy/spark/ivysettings.xml``, which no wheel has, and the job edited
    ``sys.path`` to reach a checkout. Now a clean venv with ``shorelink[spark]`` (no
    checkout on its path) runs the site application over a few records, and the merge
    writes each once."""
    from tests.spark_core.helpers import (
        assert_exactly_once,
        canonical,
        create_ingress,
        produce,
        record,
        site_toml,
    )

    venv = lean_venv("spark")
    b = kafka.bootstrap
    s = unique("wheel")
    create_ingress(b, [s], partitions=1)
    produce(b, [record("ship1", s, q) for q in range(1, 51)])
    name = unique("site")
    config = tmp_path / "sites.toml"
    config.write_text(site_toml(b, tmp_path, [s], name=name))
    command = [str(venv / "bin" / "shorelink-spark"), "site", "--site", name]
    command += ["--config", str(config)]
    dry = subprocess.run(
        [*command, "--dry-run"], capture_output=True, text=True, env=clean_env(), cwd=tmp_path
    )
    assert dry.returncode == 0, dry.stderr
    settings = dry.stdout.split("spark.jars.ivySettings=")[1].split()[0]
    assert settings.startswith(str(venv)) and Path(settings).is_file(), settings
    assert str(ROOT) not in dry.stdout.replace(str(config), "")
    done = subprocess.run(
        [*command, "--available-now", "--log-json"],
        capture_output=True,
        text=True,
        env={**clean_env(), "SHORELINK_SPARK_LOG_LEVEL": "info"},  # more than warnings
        cwd=tmp_path,  # not the checkout
        timeout=420,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert_exactly_once(canonical(b, s), {("ship1", s): 50})
    # the JVM's log as the Python side's, from the wheel's own log4j2.properties
    # (review, ecosystem: Spark's lines were its own format): one JSON object per line,
    # at the level asked for; only spark-submit's Ivy report beside them (the driver's
    # Python side writes to the JVM's stdout)
    out = done.stdout + done.stderr
    events = [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")]
    assert all({"ts", "level", "logger"} <= e.keys() for e in events)
    jvm = [e for e in events if e["logger"].startswith("org.apache.spark")]
    assert any(e["level"] == "info" for e in jvm), out[-4000:]
    assert any(e["logger"].startswith("spark_core") for e in events), out[-4000:]
    # Spark's Kafka consumers name the application and its site (groupIdPrefix), as the
    # Python side's clients do (client.id): Kafka's Java client logs its config at INFO
    config = "org.apache.kafka.clients.consumer.ConsumerConfig"
    consumers = [e["message"] for e in events if e["logger"] == config]
    assert consumers and all(f"group.id = shorelink-spark-{name}-" in m for m in consumers)
    spark_format = re.compile(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d (INFO|WARN|ERROR) ", re.M)
    assert not spark_format.search(out), out[-4000:]
    assert "Spark's default log4j profile" not in out
