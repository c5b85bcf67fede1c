"""Fixtures that start the real components, through the same code as `shorelink stack`.

Kafka brokers and Spark are session-scoped (a JVM start costs seconds); tests keep apart
by using unique topic names. Mosquitto is cheap and starts fresh per test.

``scripts/test`` runs the suite in two lanes, one after the other, chosen by
``SHORELINK_TEST_LANE``: ``heavy``, the files in ``HEAVY`` (each starts a dozen JVMs of
its own: a voyage, a mesh of sites, Spark applications killed and restarted), in one
process, since they keep both cores busy; then ``light``, every other file, on
``SHORELINK_TEST_WORKERS`` pytest-xdist workers (default 3), since those mostly wait on
brokers, links and timers. Each file is a unit handed to whichever worker is free, and
each worker is a pytest session with its own brokers and Spark session. Plain
``pytest -n N`` (no lane) keeps the ``HEAVY`` files on one worker, one after another.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fleet_sim.publisher import DEFAULT_AIS
from local_stack.kafka import (
    CLIENT_COMPILER,
    SPARK_CLIENT_COMPILER,
    BrokerSecurity,
    KafkaBroker,
    start_kafka,
)
from local_stack.mosquitto import MosquittoBroker, start_mosquitto
from local_stack.process import stop_procs
from local_stack.tls import make_authority
from local_stack.toxiproxy import Toxiproxy, ToxiproxyServer, start_toxiproxy

#: the real AIS sample the tests read: fleet_sim's package data, declared there
AIS_SAMPLE = DEFAULT_AIS


#: the files that start many JVMs of their own, longest first (``pytest --durations`` on
#: the 2-core machine): one lane, run one after another (the module's docstring)
HEAVY = (
    "tests/voyage/test_voyage.py",
    "tests/spark_core/test_replication.py",
    "tests/spark_core/test_crash.py",
    "tests/local_stack/test_cluster.py",
)
HEAVY_LANE = "heavy"

#: the light lane's longest files (``--durations`` on three workers), handed out first,
#: so that no worker is left running a long file while the others have finished
SLOW_LIGHT = (
    "tests/edge_agent/test_ingest.py",
    "tests/spark_core/test_tables.py",
    "tests/spark_core/test_standalone.py",
    "tests/edge_agent/test_power_cut.py",
    "tests/core_gateway/test_upload.py",
    "tests/test_ship_to_shore.py",
    "tests/spark_core/test_access.py",
    "tests/core_gateway/test_memory_bound.py",
    "tests/test_install.py",
    "tests/core_gateway/test_transactions.py",
)


#: ``SHORELINK_TEST_LANE=heavy`` keeps only the ``HEAVY`` files, ``light`` every other
#: file (scripts/test runs the two one after the other: the module's docstring)
LANE = os.environ.get("SHORELINK_TEST_LANE", "")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The heavy files first, then the light lane's longest (see the module's
    docstring); the rest keep their order. With ``SHORELINK_TEST_LANE`` set, only that
    lane's tests are kept."""
    if LANE not in ("", "heavy", "light"):
        raise pytest.UsageError(f"SHORELINK_TEST_LANE={LANE!r}: heavy, light or unset")
    order = {path: i for i, path in enumerate(HEAVY + SLOW_LIGHT)}
    if LANE:
        lanes: dict[bool, list[pytest.Item]] = {True: [], False: []}
        for item in items:
            lanes[item.nodeid.split("::")[0] in HEAVY].append(item)
        if lanes[LANE != "heavy"]:
            config.hook.pytest_deselected(items=lanes[LANE != "heavy"])
        items[:] = lanes[LANE == "heavy"]
    items.sort(key=lambda item: order.get(item.nodeid.split("::")[0], len(order)))


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """The two lanes: every ``HEAVY`` file in one unit of work, each other file a unit,
    in collection order (the heavy unit first, so it starts at once)."""
    from xdist.scheduler import LoadScopeScheduling

    class Lanes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::")[0]
            return HEAVY_LANE if path in HEAVY else path

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
def mosquitto(tmp_path: Path) -> Iterator[MosquittoBroker]:
    broker = start_mosquitto("ship", tmp_path / "mosquitto", tmp_path / "logs")
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
            **SPARK_CLIENT_COMPILER,
        },
    )
    yield session
    session.stop()
