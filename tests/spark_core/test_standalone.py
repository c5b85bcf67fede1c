"""The site application on a Spark cluster, not one JVM: a standalone master and two
workers started from the installed pyspark, and ``shorelink-spark site --available-now``
submitted to it as an operator would (``[spark] master = "spark://..."``). The Kafka
source runs in executors on the workers, the merge's transactions in the driver: the
canonical topic must hold every identity exactly once, as in local mode, or the promise
would hold only on the developer's machine."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from local_stack.kafka import CLIENT_COMPILER, KafkaBroker
from local_stack.process import Proc, free_ports, stop_procs
from spark_core.config import load_config
from tests.helpers import eventually, run_process, unique
from tests.spark_core.helpers import (
    assert_exactly_once,
    canonical,
    create_ingress,
    ledger,
    produce,
    record,
    site_toml,
)

pytestmark = pytest.mark.spark

HOST = "127.0.0.1"
WORKERS = 2


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


@dataclass
class Standalone:
    """A running standalone cluster: its master URL, the master's JSON page, the
    workers' JSON pages and every process (each in its own group: a worker's
    executors are in the worker's)."""

    url: str
    master_ui: str
    worker_uis: list[str]
    procs: list[Proc]


def _ask(url: str) -> dict[str, Any] | None:
    """A master's or worker's JSON page, or None while it does not answer (not up yet,
    or its Jetty closed the connection without an answer, as on a loaded machine) or
    answers with something else (Spark 4.2's master served its HTML page at /json/
    while it started, in a loaded CI run)."""
    try:
        with urllib.request.urlopen(f"{url}/json/", timeout=5) as r:
            got = json.loads(r.read())
    except (OSError, http.client.HTTPException, ValueError):
        return None
    assert isinstance(got, dict)
    return got


def _json(url: str) -> dict[str, Any]:
    """:func:`_ask`, asked again until it answers, up to a bound."""
    pages: list[dict[str, Any]] = []

    def answered() -> bool:
        page = _ask(url)
        if page is not None:
            pages.append(page)
        return bool(pages)

    eventually(answered, within=30, what=f"an answer from {url}/json/", interval=0.5)
    return pages[0]


def _alive_workers(ui: str) -> int:
    """Workers the master counts alive; 0 while its page does not answer yet (three JVMs
    starting at once on a loaded machine: over 30 s, seen)."""
    page = _ask(ui)
    return 0 if page is None else int(page["aliveworkers"])


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standalone]:
    """A master and two workers (one core, 1 GiB each), in the foreground, on
    loopback; daemons with 256 MiB heaps and the client compiler only, as the session's
    brokers and drivers (short-lived JVMs on a 2-core machine: local_stack/spark.py)."""
    root = tmp_path_factory.mktemp("standalone")
    home = _spark_home()
    env = dict(
        os.environ,
        SPARK_HOME=str(home),
        SPARK_LOCAL_IP=HOST,
        SPARK_DAEMON_MEMORY="256m",
        SPARK_DAEMON_JAVA_OPTS=" ".join(CLIENT_COMPILER),
    )
    port, ui, *worker_ports = free_ports(2 + WORKERS, HOST)
    spark_class = str(home / "bin" / "spark-class")
    url = f"spark://{HOST}:{port}"
    procs = [
        run_process(
            "spark-master",
            [
                spark_class,
                "org.apache.spark.deploy.master.Master",
                *("--host", HOST, "--port", str(port), "--webui-port", str(ui)),
            ],
            root / "master.log",
            env=env,
        )
    ]
    try:
        for i, wport in enumerate(worker_ports, 1):
            procs.append(
                run_process(
                    f"spark-worker-{i}",
                    [
                        spark_class,
                        "org.apache.spark.deploy.worker.Worker",
                        *("--host", HOST, "--webui-port", str(wport)),
                        *("--cores", "1", "--memory", "1g"),
                        *("--work-dir", str(root / f"worker-{i}"), url),
                    ],
                    root / f"worker-{i}.log",
                    env=env,
                )
            )
        master_ui = f"http://{HOST}:{ui}"
        eventually(
            lambda: _alive_workers(master_ui) == WORKERS,
            within=120,
            what="two workers registered with the master",
            proc=procs[0],
            interval=0.5,
        )
        yield Standalone(url, master_ui, [f"http://{HOST}:{p}" for p in worker_ports], procs)
    finally:
        stop_procs(procs, grace=10)


def _cluster_site(bootstrap: str, root: Path, stream: str, master: str) -> tuple[str, Path]:
    """A sites file whose application runs on ``master``: the driver on loopback (the
    executors connect back to it), one core and 512 MiB per executor, one per worker,
    each with the client compiler only, as the driver."""
    name = unique("site")
    text = site_toml(bootstrap, root, [stream], name=name, max_offsets=400)
    local = 'master = "local[2]"\n'
    assert local in text
    text = text.replace(local, f'master = "{master}"\n').replace(
        "[spark.conf]\n",
        "[spark.conf]\n"
        '"spark.driver.host" = "127.0.0.1"\n'
        '"spark.driver.bindAddress" = "127.0.0.1"\n'
        '"spark.executor.memory" = "512m"\n'
        '"spark.executor.cores" = "1"\n'
        f'"spark.executor.extraJavaOptions" = "{" ".join(CLIENT_COMPILER)}"\n'
        f'"spark.cores.max" = "{WORKERS}"\n',
    )
    root.mkdir(parents=True, exist_ok=True)
    path = root / "sites.toml"
    path.write_text(text)
    assert load_config(path).spark.master == master
    return name, path


@pytest.mark.timeout(600)
def test_site_application_on_a_standalone_cluster_merges_exactly_once(
    standalone: Standalone, kafka: KafkaBroker, tmp_path: Path
) -> None:
    b = kafka.bootstrap
    s = unique("sa")
    create_ingress(b, [s], partitions=2)
    produce(b, [record("ship1", s, q, key=f"c{q % 5}") for q in range(1, 1201)])
    produce(b, [record("ship1", s, q, key=f"c{q % 5}") for q in range(500, 801)])  # a resend
    produce(b, [record("ship2", s, q, key="c7") for q in reversed(range(1, 401))])
    name, config = _cluster_site(b, tmp_path, s, standalone.url)
    cmd = [sys.executable, "-m", "spark_core.cli", "site", "--site", name, "--config", str(config)]
    dry = subprocess.run([*cmd, "--dry-run"], capture_output=True, text=True, check=True)
    assert f"--master {standalone.url}" in dry.stdout
    proc = run_process("spark-site", [*cmd, "--available-now"], tmp_path / "site.log")
    assert proc.popen is not None
    try:
        rc = proc.popen.wait(timeout=420)
    except subprocess.TimeoutExpired:
        proc.stop(grace=10)
        raise AssertionError(f"the site application did not finish; see {proc.log}") from None
    assert rc == 0, f"the site application failed ({rc}); see {proc.log}:\n{proc.tail(30)}"
    assert_exactly_once(canonical(b, s), {("ship1", s): 1200, ("ship2", s): 400})
    held = ledger(b)
    assert str(held[("ship1", s)]) == "1-1200" and str(held[("ship2", s)]) == "1-400"
    # it ran on the cluster: the master finished the application, an executor ran on
    # each worker
    (app,) = [
        a for a in _json(standalone.master_ui)["completedapps"] if a["name"] == f"shorelink-{name}"
    ]
    assert app["state"] == "FINISHED"
    for ui in standalone.worker_uis:
        ran = [e for e in _json(ui)["finishedexecutors"] if e["appid"] == app["id"]]
        assert ran, f"no executor of {app['id']} on the worker at {ui}"
