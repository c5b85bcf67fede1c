"""A site's KRaft Kafka, run from the Maven-assembled jars: one node (development,
most tests), or a cluster of three as a data centre runs it (:func:`start_kafka_cluster`).

Plain by default (tests of everything but access control). With a
:class:`BrokerSecurity`, the broker is what a site runs in production: clients (and the
link listeners) speak SASL/SCRAM-SHA-512 over TLS, the controller listener takes only
the broker's own certificate (mutual TLS), and the KRaft ``StandardAuthorizer`` allows
nothing that no ACL grants; ``admin`` (SCRAM credentials written at format time) and
the broker itself are the super users. ``shorelink-spark access apply`` creates the
other principals and their ACLs (spark_core/access.py).

A cluster's nodes are each broker and controller (the quorum is the three of them:
``controller.quorum.voters``), formatted with one cluster id, and hold every topic three
times: ``default.replication.factor`` 3, ``min.insync.replicas`` 2, the same for the
consumer offsets and the transaction state, so that one node killed loses nothing that
was acknowledged (``acks=all``) and stops no write (two replicas remain in sync, two of
three voters elect a controller). ``shorelink.kafka.topics.Durability`` gives the topics
shorelink creates the same 3 and 2 once it sees three brokers.
"""

from __future__ import annotations

import base64
import os
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka.admin import ClusterMetadata

from local_stack.errors import StackError
from local_stack.process import Proc, free_ports, port_open, stop_procs
from local_stack.tls import BROKER_UNIT, Authority
from local_stack.tools import (
    archive_flags,
    cds_flags,
    kafka_cds_archive,
    kafka_classpath,
    kafka_log4j_config,
    keep_cds_archive,
    say,
)
from shorelink.config import Secret
from shorelink.files import write_atomic
from shorelink.kafka.admin import Admin
from shorelink.kafka.auth import KafkaAuth
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.errors import KafkaClientError

__all__ = [
    "CLIENT_COMPILER",
    "BrokerSecurity",
    "KafkaBroker",
    "KafkaCluster",
    "LinkListener",
    "install_kafka_cds",
    "link_listener_properties",
    "start_kafka",
    "start_kafka_cluster",
    "start_site_broker",
]

HOST = "127.0.0.1"

# Small internal topics: the defaults (50 partitions each) make the first transaction
# and the first consumer group on a fresh broker take seconds. An idle broker writes a
# no-op metadata record every 5 s, not every 0.5 s (Kafka's default): that halves what
# a dozen idle local brokers cost a 2-core machine (1.4-1.9 CPU-s a minute each, 0.8-1.0
# after).
SERVER_PROPERTIES = """\
process.roles=broker,controller
node.id={node_id}
controller.quorum.voters={voters}
listeners={client}://{host}:{port},CONTROLLER://{host}:{cport}{links}
advertised.listeners={client}://{host}:{port}{advertised}
controller.listener.names=CONTROLLER
listener.security.protocol.map={client}:{client},CONTROLLER:{controller}{protocols}
inter.broker.listener.name={client}
log.dirs={data}
num.partitions=1
auto.create.topics.enable=false
offsets.topic.replication.factor={rf}
offsets.topic.num.partitions=4
transaction.state.log.replication.factor={rf}
transaction.state.log.min.isr={isr}
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor={rf}
share.coordinator.state.topic.min.isr={isr}
group.initial.rebalance.delay.ms=0
transaction.max.timeout.ms=900000
log.retention.hours=168
metadata.max.idle.interval.ms=5000
"""

#: what a one-node site adds: its broker heartbeats its own controller every 2 s
#: (Kafka's default), within the 9 s session. It was every 4 s, to save idle CPU, but
#: that saved 0.03 CPU-s a minute (0.81 against 0.84, measured 2026-11-30) and fenced
#: the broker once a heartbeat was 5 s late (now 7 s): on a loaded machine the
#: controller fenced its own broker, and for a moment its metadata listed no broker (a
#: topic's creation failed)
#: and every leader epoch moved (a read's offsets answered UNKNOWN_LEADER_EPOCH; CI).
#: The session stays 9 s: a node killed and started again waits for its old session
#: to end before it is unfenced (ready 14 s after a restart; 34 s with a 30 s session)
SINGLE_NODE_PROPERTIES = """\
broker.heartbeat.interval.ms=2000
"""

#: what a cluster adds: topics created without a replication factor (Kafka's own, a
#: client's) are kept as shorelink's are (3, acknowledged by 2). A killed node is fenced
#: (its partitions' leadership moves) after 4 s without a heartbeat, not Kafka's 9 s: a
#: local stack has no network pauses to ride out, and its tests wait less.
CLUSTER_PROPERTIES = """\
default.replication.factor={rf}
min.insync.replicas={isr}
broker.heartbeat.interval.ms=1000
broker.session.timeout.ms=4000
"""


@dataclass(frozen=True)
class BrokerSecurity:
    """SASL/SCRAM over TLS with ACLs: the CA that issues the broker's certificate and
    the super user's credentials (written into the storage at format time)."""

    authority: Authority
    admin_password: str
    admin_user: str = "admin"

    def admin_auth(self) -> KafkaAuth:
        return KafkaAuth(self.admin_user, Secret(self.admin_password), self.authority.ca_cert)


SECURE_PROPERTIES = """\
sasl.enabled.mechanisms=SCRAM-SHA-512
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512
ssl.keystore.type=PEM
ssl.keystore.location={keystore}
ssl.truststore.type=PEM
ssl.truststore.location={ca}
listener.name.controller.ssl.client.auth=required
ssl.principal.mapping.rules=RULE:^CN=([^,]+),OU={unit}$/$1/,DEFAULT
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:{admin};User:{broker}
"""


def _secure_properties(sec: BrokerSecurity, site: str, listeners: list[str]) -> str:
    """The security part of server.properties; ``listeners``: the SASL ones' names."""
    broker = f"kafka-{site}"
    issued = sec.authority.issue(broker, broker=True)
    jaas = (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{sec.admin_user}" password="{sec.admin_password}";'
    )
    text = SECURE_PROPERTIES.format(
        keystore=issued.bundle,
        ca=sec.authority.ca_cert,
        admin=sec.admin_user,
        broker=broker,
        unit=BROKER_UNIT,
    ) + "".join(
        f"listener.name.{name.lower()}.scram-sha-512.sasl.jaas.config={jaas}\n"
        for name in listeners
    )
    return text


@dataclass(frozen=True)
class LinkListener:
    """A second way into a broker, for one link between sites: the broker listens on
    ``port`` and tells clients that came in this way to use ``advertised`` (a proxy in
    front of ``port``: toxiproxy to cut the link, a byte counter to measure it). Kafka
    answers each client with the addresses of the listener it connected to, so every
    byte of a client that bootstraps at ``advertised`` goes through the proxy."""

    port: int
    advertised: int


@dataclass
class KafkaBroker:
    """One running node: the whole of a one-node site, or one of a cluster's
    (``node_id``). ``restart`` starts it again from its storage (after a kill)."""

    site: str
    port: int
    controller_port: int
    proc: Proc
    links: dict[str, LinkListener] = field(default_factory=dict)
    security: BrokerSecurity | None = None
    node_id: int = 1
    #: the command line it was started with (``restart`` runs it again)
    argv: list[str] = field(default_factory=list, repr=False)

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def admin(self) -> KafkaAuth:
        """How a super user connects (nothing for a plain broker)."""
        return self.security.admin_auth() if self.security else KafkaAuth()

    @property
    def endpoint(self) -> KafkaEndpoint:
        """This node as its super user reaches it (no credentials on a plain broker)."""
        return KafkaEndpoint(self.bootstrap, self.admin)

    def link_bootstrap(self, name: str) -> str:
        """Where a client of link ``name`` bootstraps (the proxy's address)."""
        return f"{HOST}:{self.links[name].advertised}"

    def ready(self) -> bool:
        if not port_open(HOST, self.port):
            return False
        try:
            Admin(self.endpoint).metadata(timeout=2)
        except KafkaClientError:
            return False
        return True

    def restart(self, *, wait: bool = True, timeout: float = 120) -> None:
        """Start the node again from its storage, on the same ports (it must have
        stopped: killed, or stopped by pid)."""
        if self.proc.alive():
            raise StackError(f"{self.proc.name} is still running (pid {self.proc.pid})")
        if not self.argv:
            raise StackError(f"{self.proc.name}: no command line to restart it with")
        self.proc = Proc.start(self.proc.name, self.argv, self.proc.log)
        if wait:
            self.proc.wait_ready(self.ready, timeout=timeout)


@dataclass
class KafkaCluster:
    """A site's Kafka as a data centre runs it: ``nodes`` (each broker and controller);
    clients bootstrap at all of them (:attr:`bootstrap`), so any one may be down."""

    site: str
    nodes: list[KafkaBroker]
    security: BrokerSecurity | None = None

    @property
    def bootstrap(self) -> str:
        return ",".join(n.bootstrap for n in self.nodes)

    @property
    def admin(self) -> KafkaAuth:
        """How a super user connects (nothing for a plain cluster)."""
        return self.security.admin_auth() if self.security else KafkaAuth()

    @property
    def endpoint(self) -> KafkaEndpoint:
        """The cluster (every node) as its super user reaches it."""
        return KafkaEndpoint(self.bootstrap, self.admin)

    @property
    def procs(self) -> list[Proc]:
        return [n.proc for n in self.nodes]

    def node(self, node_id: int) -> KafkaBroker:
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        raise StackError(f"kafka:{self.site} has no node {node_id}")

    def metadata(self, timeout: float = 5) -> ClusterMetadata:
        """The cluster's metadata (brokers alive, each partition's leader and ISR);
        raises :class:`~shorelink.kafka.errors.KafkaClientError`."""
        return Admin(self.endpoint).metadata(timeout=timeout)

    def ready(self) -> bool:
        """Every node is up and registered with the controller (unfenced)."""
        if not all(port_open(HOST, n.port) for n in self.nodes):
            return False
        try:
            brokers = set(self.metadata(timeout=2).brokers)
        except KafkaClientError:
            return False
        return {n.node_id for n in self.nodes} <= brokers


def link_listener_properties(
    links: dict[str, LinkListener], protocol: str = "PLAINTEXT"
) -> dict[str, str]:
    """The ``listeners``, ``advertised.listeners`` and protocol map additions for
    ``links`` (names become listener names: upper case, letters and digits)."""
    names = {n: "LINK" + "".join(c for c in n.upper() if c.isalnum()) for n in links}
    if len(set(names.values())) != len(names):
        raise StackError(f"link names collide as listener names: {sorted(links)}")
    return {
        "links": "".join(f",{names[n]}://{HOST}:{ln.port}" for n, ln in links.items()),
        "advertised": "".join(f",{names[n]}://{HOST}:{ln.advertised}" for n, ln in links.items()),
        "protocols": "".join(f",{names[n]}:{protocol}" for n in links),
    }


#: JVM options for a small, short-lived broker (the voyage's, the tests'): the client
#: compiler only; C2's compiling costs a 2-core machine more CPU than it wins back
CLIENT_COMPILER = ("-XX:TieredStopAtLevel=1",)


def _java_argv(
    main: str,
    *args: str,
    logs: Path,
    heap: str,
    jvm_opts: tuple[str, ...] = (),
    cds: bool = True,
    argfile: Path | None = None,
) -> list[str]:
    """A Kafka JVM's command line; with ``cds``, mapping the class-data archive when
    scripts/setup made one (local_stack/tools.py ``install_kafka_cds``, ``cds_flags``).
    With ``argfile``, the main class and its arguments are written there (mode 0600)
    and the command line names only ``@argfile``: what it holds (a password) is not
    shown by ``ps``."""
    tail = [main, *args]
    if argfile is not None:
        quoted = ('"' + a.replace("\\", "\\\\").replace('"', '\\"') + '"' for a in tail)
        write_atomic(argfile, "".join(q + "\n" for q in quoted), mode=0o600)
        tail = [f"@{argfile}"]
    return [
        "java",
        *(cds_flags(kafka_cds_archive()) if cds else ()),
        *jvm_opts,
        f"-Xmx{heap}",
        "-Xms64m",
        "-XX:+UseG1GC",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={kafka_log4j_config()}",
        f"-Dkafka.logs.dir={logs}",
        "-cp",
        kafka_classpath(),
        *tail,
    ]


@dataclass(frozen=True)
class _Node:
    """What one node's server.properties says about it and its quorum."""

    node_id: int
    port: int
    cport: int
    voters: str
    replication: tuple[int, int] = (1, 1)  # internal topics' factor and min ISR
    cluster: bool = False


def _write_properties(
    site: str,
    root: Path,
    node: _Node,
    links: dict[str, LinkListener],
    security: BrokerSecurity | None,
    properties: dict[str, str] | None,
) -> Path:
    """``root/server.properties`` of ``node`` (data under ``root/data``)."""
    root.mkdir(parents=True, exist_ok=True)
    props = root / "server.properties"
    extra = "".join(f"{k}={v}\n" for k, v in (properties or {}).items())
    client = "SASL_SSL" if security else "PLAINTEXT"
    listeners = link_listener_properties(links, client)
    secure = ""
    if security is not None:
        names = [client] + [ln.split("://")[0] for ln in listeners["links"].split(",")[1:]]
        secure = _secure_properties(security, site, names)
    rf, isr = node.replication
    # the admin's password is in it (its JAAS line): readable by its owner only
    write_atomic(
        props,
        SERVER_PROPERTIES.format(
            host=HOST,
            node_id=node.node_id,
            voters=node.voters,
            port=node.port,
            cport=node.cport,
            data=root / "data",
            client=client,
            controller="SSL" if security else "PLAINTEXT",
            rf=rf,
            isr=isr,
            **listeners,
        )
        + (CLUSTER_PROPERTIES.format(rf=rf, isr=isr) if node.cluster else SINGLE_NODE_PROPERTIES)
        + secure
        + extra,
        mode=0o600,
    )
    return props


def _stored_cluster_id(root: Path) -> str | None:
    """The cluster id a node's storage was formatted with (None: not formatted)."""
    try:
        lines = (root / "data" / "meta.properties").read_text().splitlines()
    except FileNotFoundError:
        return None
    return next((ln.split("=", 1)[1] for ln in lines if ln.startswith("cluster.id=")), None)


def _new_cluster_id() -> str:
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def _start_format(
    name: str, props: Path, cluster_id: str, security: BrokerSecurity | None, logs: Path
) -> Proc:
    """Start formatting a node's storage with ``cluster_id`` (the super user's SCRAM
    credentials written in, when secure); :func:`_formatted` waits for it."""
    return Proc.start(
        f"kafka-format:{name}",
        _java_argv(
            "kafka.tools.StorageTool",
            "format",
            # "=" form: a random id may start with "-", which a separate argument
            # would turn into an (unknown) option
            f"--cluster-id={cluster_id}",
            "-c",
            str(props),
            *(
                (
                    "--add-scram",
                    f"SCRAM-SHA-512=[name={security.admin_user},"
                    f"password={security.admin_password}]",
                )
                if security
                else ()
            ),
            logs=logs,
            heap="256m",
            # the admin's password is among the arguments: kept off the command line
            argfile=props.with_name("format.args") if security else None,
        ),
        logs / "format.out",
    )


def _formatted(fmt: Proc) -> None:
    assert fmt.popen is not None
    code = fmt.popen.wait(timeout=120)
    for a in fmt.popen.args:  # type: ignore[union-attr]
        if isinstance(a, str) and a.startswith("@"):
            Path(a[1:]).unlink(missing_ok=True)  # read: the password need not stay on disk
    if code != 0:
        name = fmt.name.removeprefix("kafka-format:")
        raise StackError(f"kafka:{name}: storage format failed; see {fmt.log}:\n{fmt.tail()}")


def start_kafka(
    site: str,
    root: Path,
    logs: Path,
    *,
    port: int | None = None,
    controller_port: int | None = None,
    heap: str = "512m",
    wait: bool = True,
    properties: dict[str, str] | None = None,
    links: dict[str, LinkListener] | None = None,
    jvm_opts: tuple[str, ...] = (),
    security: BrokerSecurity | None = None,
    cds: bool = True,
) -> KafkaBroker:
    """Format (first time only) and start a broker for ``site`` under ``root``;
    ``security``: SASL/SCRAM over TLS with ACLs (:class:`BrokerSecurity`);
    ``properties`` add to (or override) the broker's server.properties; ``links``:
    one more listener per name (:class:`LinkListener`); ``jvm_opts``: more JVM flags
    (e.g. the quick-start JIT of a short demo; ``cds=False``: without the class-data
    archive, as when making it). A caller that reserves other
    ports at once (:func:`free_ports`) passes ``port`` and ``controller_port`` too, so
    that none of them is handed out twice."""
    taken = ({port, controller_port} - {None}) | {
        p for ln in (links or {}).values() for p in (ln.port, ln.advertised)
    }
    fresh = [p for p in free_ports(len(taken) + 2, HOST) if p not in taken]
    port = port or fresh[0]
    cport = controller_port or fresh[1]
    node = _Node(1, port, cport, f"1@{HOST}:{cport}")
    props = _write_properties(site, root, node, links or {}, security, properties)
    site_logs = logs / f"kafka-{site}"
    site_logs.mkdir(parents=True, exist_ok=True)
    if _stored_cluster_id(root) is None:
        _formatted(_start_format(site, props, _new_cluster_id(), security, site_logs))
    argv = _java_argv(
        "kafka.Kafka", str(props), logs=site_logs, heap=heap, jvm_opts=jvm_opts, cds=cds
    )
    proc = Proc.start(f"kafka:{site}", argv, site_logs / "stdout.log")
    broker = KafkaBroker(site, port, cport, proc, dict(links or {}), security, 1, argv)
    if wait:
        proc.wait_ready(broker.ready, timeout=90)
    return broker


def start_site_broker(
    site: str,
    root: Path,
    logs: Path,
    ports: Iterator[int],
    links: dict[str, LinkListener],
    security: BrokerSecurity | None = None,
) -> KafkaBroker:
    """A site's broker as the voyage, the fault soak and the replication tests start
    several on one machine: its two ports the next of ``ports`` (reserved with its
    links' at once, :func:`free_ports`), 384 MB of heap, the client compiler, not waited
    for (start them all, then wait on each)."""
    return start_kafka(
        site,
        root,
        logs,
        port=next(ports),
        controller_port=next(ports),
        heap="384m",
        wait=False,
        links=links,
        jvm_opts=CLIENT_COMPILER,
        security=security,
    )


def start_kafka_cluster(
    site: str,
    root: Path,
    logs: Path,
    *,
    nodes: int = 3,
    heap: str = "512m",
    wait: bool = True,
    properties: dict[str, str] | None = None,
    jvm_opts: tuple[str, ...] = (),
    security: BrokerSecurity | None = None,
) -> KafkaCluster:
    """Format (first time only) and start ``site`` as a KRaft cluster of ``nodes``
    nodes under ``root/node-<id>`` (each broker and controller, one quorum of all of
    them, one cluster id), logs under ``logs/kafka-<site>-<id>``; the rest as
    :func:`start_kafka`. Topics are kept ``min(3, nodes)`` times, acknowledged by
    ``min(2, nodes)`` (:data:`CLUSTER_PROPERTIES`)."""
    if nodes < 1:
        raise StackError(f"kafka:{site}: a cluster needs at least one node, not {nodes}")
    ports = free_ports(2 * nodes, HOST)
    ids = list(range(1, nodes + 1))
    cports = dict(zip(ids, ports[nodes:], strict=True))
    voters = ",".join(f"{i}@{HOST}:{cports[i]}" for i in ids)
    rf = min(3, nodes)
    replication = (rf, min(2, rf))
    roots = {i: root / f"node-{i}" for i in ids}
    stored = {cid for r in roots.values() if (cid := _stored_cluster_id(r)) is not None}
    if len(stored) > 1:
        raise StackError(f"kafka:{site}: nodes under {root} belong to different clusters")
    cluster_id = stored.pop() if stored else _new_cluster_id()
    started: list[KafkaBroker] = []
    try:
        # each node's JVMs at once (format, then the node): a JVM starts slowly
        props, node_logs, formats = {}, {}, []
        for i, port in zip(ids, ports, strict=False):
            node = _Node(i, port, cports[i], voters, replication, cluster=True)
            props[i] = _write_properties(site, roots[i], node, {}, security, properties)
            node_logs[i] = logs / f"kafka-{site}-{i}"
            node_logs[i].mkdir(parents=True, exist_ok=True)
            if _stored_cluster_id(roots[i]) is None:
                formats.append(
                    _start_format(f"{site}/{i}", props[i], cluster_id, security, node_logs[i])
                )
        for fmt in formats:
            _formatted(fmt)
        for i, port in zip(ids, ports, strict=False):
            argv = _java_argv(
                "kafka.Kafka", str(props[i]), logs=node_logs[i], heap=heap, jvm_opts=jvm_opts
            )
            proc = Proc.start(f"kafka:{site}/{i}", argv, node_logs[i] / "stdout.log")
            started.append(KafkaBroker(site, port, cports[i], proc, {}, security, i, argv))
        cluster = KafkaCluster(site, started, security)
        if wait:
            for n in started:
                n.proc.wait_ready(cluster.ready, timeout=120)
    except BaseException:
        stop_procs([n.proc for n in started], grace=5)
        raise
    return cluster


def install_kafka_cds() -> None:
    """A class-data-sharing archive of the classes a broker loads up to serving
    (``-XX:ArchiveClassesAtExit``: one broker started and stopped here): each broker and
    storage format then maps them instead of loading them from the jars, about 1.5 s of
    CPU less per start on two cores (a test run starts dozens). Best effort: without it
    the JVMs start as before."""
    archive = kafka_cds_archive()
    if archive.exists():
        say("kafka class-data archive: present")
        return
    say("kafka class-data archive: one broker started and stopped")
    partial = archive.with_name(f"{archive.name}.{os.getpid()}.tmp")
    with tempfile.TemporaryDirectory(prefix="shorelink-cds-") as tmp:
        try:
            b = start_kafka(
                "cds",
                Path(tmp),
                Path(tmp) / "logs",
                heap="384m",
                jvm_opts=(*CLIENT_COMPILER, f"-XX:ArchiveClassesAtExit={partial}"),
                cds=False,
            )
            b.proc.stop(grace=30)
        except StackError as exc:
            say(f"kafka class-data archive: not made ({exc}); brokers start without it")
            partial.unlink(missing_ok=True)
            return
    check = [  # -Xshare:on fails rather than run without the archive
        *("java", "-Xshare:on", *archive_flags(partial)),
        *("-cp", kafka_classpath(), "kafka.tools.StorageTool", "random-uuid"),
    ]
    keep_cds_archive("kafka", partial, archive, check)
