"""Fixtures that start the real components, through the same code as `shorelink stack`.

Kafka brokers and Spark are session-scoped (a JVM start costs seconds); tests keep apart
by using unique topic names. Mosquitto is cheap and starts fresh per test.

``scripts/test`` runs the suite in two lanes, one after the other, chosen by
``SHORELINK_TEST_LANE``: ``alone``, the files in ``ALONE`` (the short voyage: four
sites, a dozen JVMs, both cores busy for four minutes), in one process with nothing
beside it; then ``shared``, every other file, on ``SHORELINK_TEST_WORKERS`` pytest-xdist
workers (default 3). There the ``HEAVY`` files (a mesh of sites, Spark applications
killed and restarted, a three-node cluster: several JVMs each, but waiting on them half
the time) are two units of work (``HEAVY_UNITS``: the mesh on one worker, the other two
one after the other on another), never more than two at once;
every other file is a unit of its own, handed to whichever worker is free, the longest
(``SLOW_LIGHT``) first. Each worker is a pytest session with its own brokers and Spark
session. Plain ``pytest`` runs everything in one process, ``ALONE`` and ``HEAVY`` first.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fleet_sim.publisher import DEFAULT_AIS
from local_stack.kafka import (
    CLIENT_COMPILER,
    BrokerSecurity,
    KafkaBroker,
    start_kafka,
)
from local_stack.mosquitto import MosquittoBroker, start_mosquitto
from local_stack.process import stop_procs
from local_stack.spark import spark_driver_conf
from local_stack.tls import make_authority
from local_stack.toxiproxy import Toxiproxy, ToxiproxyServer, start_toxiproxy
from tests.debian_base import DebianBase, ensure_base

#: the real AIS sample the tests read: fleet_sim's package data, declared there
AIS_SAMPLE = DEFAULT_AIS


#: the files that keep both cores busy by themselves: first, with nothing beside them
ALONE = ("tests/voyage/test_voyage.py",)

#: the files that start several JVMs of their own, longest first (``pytest --durations``
#: on the 2-core machine): one unit of work, one file after another (the docstring)
HEAVY = (
    "tests/spark_core/test_replication.py",
    "tests/spark_core/test_soak.py",
    "tests/spark_core/test_crash.py",
    "tests/local_stack/test_cluster.py",
    "tests/voyage/test_interrupt.py",
    "tests/spark_core/test_fleet_keys.py",
)
#: the ``HEAVY`` files in two units of work: the replication mesh (its longest file)
#: then the fault soak's short seed on one worker; the Spark driver killed, the
#: three-node cluster, a voyage's stack interrupted while it starts and the ship keys
#: on three sites one after the other on another; never more than two heavy files at once
HEAVY_UNITS = {
    "tests/spark_core/test_replication.py": "heavy-mesh",
    "tests/spark_core/test_soak.py": "heavy-mesh",
    "tests/spark_core/test_crash.py": "heavy-restarts",
    "tests/local_stack/test_cluster.py": "heavy-restarts",
    "tests/voyage/test_interrupt.py": "heavy-restarts",
    "tests/spark_core/test_fleet_keys.py": "heavy-restarts",
}

#: the other files' longest (``--durations`` on three workers), handed out first, so
#: that no worker is left running a long file while the others have finished
SLOW_LIGHT = (
    "tests/edge_agent/test_ingest.py",
    "tests/core_gateway/test_memory_bound.py",
    "tests/spark_core/test_tables.py",
    "tests/core_gateway/test_api.py",
    "tests/test_ship_to_shore.py",
    "tests/edge_agent/test_power_cut.py",
    "tests/spark_core/test_standalone.py",
    "tests/local_stack/test_stack.py",
    "tests/core_gateway/test_upload.py",
    "tests/spark_core/test_access.py",
    "tests/test_install.py",
    "tests/core_gateway/test_transactions.py",
    # bench/fleet.py at 3 ships: its own Kafka, gateway and site application
    "tests/test_fleet_bench.py",
    # the gateway image built once, then played by podman kube play and the Quadlet line
    "tests/test_deploy_files.py",
)


#: ``SHORELINK_TEST_LANE=alone`` keeps only the ``ALONE`` files, ``shared`` every other
#: file (scripts/test runs the two one after the other: the module's docstring)
LANE = os.environ.get("SHORELINK_TEST_LANE", "")


#: the directory every Spark JVM of this run (the session's, each application a test
#: starts) keeps its scratch in: ``SPARK_LOCAL_DIRS``, made by the process that
#: configures first (the controller under xdist; its workers inherit it) and removed
#: by it when the run ends. A JVM killed on purpose (the crash tests, a voyage
#: interrupted) leaves its ``spark-*`` directory behind, each with a copy of the
#: ``--packages`` jars (97 MB): in ``/tmp`` a run left 6 GB there, and a machine that
#: runs the suite often filled its disk
_SPARK_SCRATCH: Path | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _SPARK_SCRATCH
    if "SPARK_LOCAL_DIRS" not in os.environ:
        _SPARK_SCRATCH = Path(tempfile.mkdtemp(prefix="shorelink-spark-"))
        os.environ["SPARK_LOCAL_DIRS"] = str(_SPARK_SCRATCH)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _SPARK_SCRATCH is not None:
        shutil.rmtree(_SPARK_SCRATCH, ignore_errors=True)
        os.environ.pop("SPARK_LOCAL_DIRS", None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``ALONE``, ``HEAVY``, then ``SLOW_LIGHT`` first (see the module's docstring); the
    rest keep their order. With ``SHORELINK_TEST_LANE`` set, only that lane's tests are
    kept."""
    if LANE not in ("", "alone", "shared"):
        raise pytest.UsageError(f"SHORELINK_TEST_LANE={LANE!r}: alone, shared or unset")
    order = {path: i for i, path in enumerate(ALONE + HEAVY + SLOW_LIGHT)}
    if LANE:
        lanes: dict[bool, list[pytest.Item]] = {True: [], False: []}
        for item in items:
            lanes[item.nodeid.split("::")[0] in ALONE].append(item)
        if lanes[LANE != "alone"]:
            config.hook.pytest_deselected(items=lanes[LANE != "alone"])
        items[:] = lanes[LANE == "alone"]
    items.sort(key=lambda item: order.get(item.nodeid.split("::")[0], len(order)))


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: ``alone``, a ``HEAVY_UNITS`` name or its file."""
    path = nodeid.split("::")[0]
    return "alone" if path in ALONE else HEAVY_UNITS.get(path, path)


#: seconds of test (setup, call, teardown) per xdist worker and per unit of work, as
#: the workers report them to the controller: where a lane's wall time goes
_WORKER_BUSY: dict[str, float] = {}
_UNIT_BUSY: dict[tuple[str, str], float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    node = getattr(report, "node", None)  # set by xdist on the controller only
    gateway = getattr(node, "gateway", None)
    if gateway is None:
        return
    _WORKER_BUSY[gateway.id] = _WORKER_BUSY.get(gateway.id, 0.0) + report.duration
    key = (gateway.id, unit_of(report.nodeid))
    _UNIT_BUSY[key] = _UNIT_BUSY.get(key, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Per worker, the seconds its tests took and its three longest units: a lane whose
    workers end far apart is badly balanced (``HEAVY_UNITS``, ``SLOW_LIGHT``); one whose
    workers all took about its wall time is bound by the cores (scripts/test prints how
    busy they were)."""
    if not _WORKER_BUSY:
        return
    terminalreporter.section("time per worker")
    for worker, busy in sorted(_WORKER_BUSY.items()):
        units = sorted(((s, u) for (w, u), s in _UNIT_BUSY.items() if w == worker), reverse=True)
        top = ", ".join(f"{u} {s:.0f} s" for s, u in units[:3])
        terminalreporter.write_line(
            f"{worker}: {busy:.0f} s in {len(units)} units (longest: {top})"
        )


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """The ``HEAVY`` files in their two units of work (``HEAVY_UNITS``; ``ALONE`` in
    one), each other file a unit, in collection order (the heavy units first, so they
    start at once)."""
    from xdist.scheduler import LoadScopeScheduling

    class Lanes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    config.option.loadscopereorder = False
    return Lanes(config, log)


@pytest.fixture(scope="session")
def stack_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("stack")


@pytest.fixture(scope="session")
def kafka_sites(stack_root: Path) -> Iterator[Callable[..., dict[str, KafkaBroker]]]:
    """Factory: ``kafka_sites("tokyo", "hq")`` -> one running broker per site, started
    once per session and shared by every test that names the same site."""
    brokers: dict[str, KafkaBroker] = {}

    def get(*sites: str) -> dict[str, KafkaBroker]:
        new = [s for s in sites if s not in brokers]
        started = [
            start_kafka(
                s,
                stack_root / "sites" / s,
                stack_root / "logs",
                wait=False,
                heap="384m",
                jvm_opts=CLIENT_COMPILER,
            )
            for s in new
        ]
        for b in started:
            b.proc.wait_ready(b.ready, timeout=120)
            brokers[b.site] = b
        return {s: brokers[s] for s in sites}

    yield get
    stop_procs([b.proc for b in brokers.values()], grace=10)


@pytest.fixture(scope="session")
def kafka(kafka_sites: Callable[..., dict[str, KafkaBroker]]) -> KafkaBroker:
    """The session's default site broker."""
    return kafka_sites("site")["site"]


@pytest.fixture(scope="session")
def secure_kafka(stack_root: Path) -> Iterator[KafkaBroker]:
    """A broker as a site runs it in production: SASL/SCRAM over TLS, the KRaft
    StandardAuthorizer, nothing allowed that no ACL grants (``broker.admin``: the super
    user; ``broker.security.authority``: the CA)."""
    root = stack_root / "secure"
    security = BrokerSecurity(make_authority(root / "tls"), f"admin-{uuid.uuid4().hex}")
    broker = start_kafka(
        "secure",
        root / "kafka",
        stack_root / "logs",
        heap="384m",
        security=security,
        jvm_opts=CLIENT_COMPILER,
    )
    yield broker
    stop_procs([broker.proc], grace=10)


@pytest.fixture
def mosquitto(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MosquittoBroker]:
    """The ship's broker as shipped; a test about the agent rather than the broker's own
    power cuts may pass another ``autosave_interval`` (indirect parametrization)."""
    broker = start_mosquitto(
        "ship",
        tmp_path / "mosquitto",
        tmp_path / "logs",
        autosave_interval=getattr(request, "param", 1),
    )
    yield broker
    broker.proc.stop(grace=5)


@pytest.fixture(scope="session")
def toxiproxy_server(stack_root: Path) -> Iterator[ToxiproxyServer]:
    server = start_toxiproxy(stack_root / "logs")
    yield server
    server.proc.stop(grace=5)


@pytest.fixture
def toxiproxy(toxiproxy_server: ToxiproxyServer) -> Iterator[Toxiproxy]:
    """A toxiproxy client; every proxy is enabled and every toxic removed afterwards."""
    client = toxiproxy_server.client()
    yield client
    client.reset()


@pytest.fixture(scope="session")
def spark(stack_root: Path) -> Iterator[object]:
    """A local-mode SparkSession with the Kafka connector and Delta on its classpath
    (resolved from the Ivy cache that scripts/setup filled)."""
    from spark_core.session import SCHEDULER_CONF, local_session

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    session = local_session(
        "shorelink-tests",
        conf={
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "2",
            **SCHEDULER_CONF,
            "spark.sql.warehouse.dir": str(stack_root / "warehouse"),
            "spark.driver.memory": "1g",
            **spark_driver_conf(),
        },
    )
    yield session
    session.stop()


@pytest.fixture(scope="session")
def debian_base(tmp_path_factory: pytest.TempPathFactory) -> DebianBase:
    """A Debian 12 image to build on or run in (tests/debian_base.py): found, else made
    once with debootstrap and kept; the gateway's image and a ship's bundle share it."""
    return ensure_base(tmp_path_factory.mktemp("debian-base"))
