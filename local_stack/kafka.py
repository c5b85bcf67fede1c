"""A single-node KRaft Kafka broker (one per site), run from the Maven-assembled jars.

Plain by default (tests of everything but access control). With a
:class:`BrokerSecurity`, the broker is what a site runs in production: clients (and the
link listeners) speak SASL/SCRAM-SHA-512 over TLS, the controller listener takes only
the broker's own certificate (mutual TLS), and the KRaft ``StandardAuthorizer`` allows
nothing that no ACL grants; ``admin`` (SCRAM credentials written at format time) and
the broker itself are the super users. ``shorelink-spark access apply`` creates the
other principals and their ACLs (spark_core/access.py).
"""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from local_stack.errors import StackError
from local_stack.process import Proc, free_ports, port_open
from local_stack.tls import Authority
from local_stack.tools import kafka_classpath, kafka_log4j_config
from shorelink.config import Secret
from shorelink.kafka_auth import KafkaAuth, client_config

__all__ = [
    "BrokerSecurity",
    "KafkaBroker",
    "LinkListener",
    "link_listener_properties",
    "start_kafka",
]

HOST = "127.0.0.1"

# Small internal topics: the defaults (50 partitions each) make the first transaction
# and the first consumer group on a fresh broker take seconds.
SERVER_PROPERTIES = """\
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@{host}:{cport}
listeners={client}://{host}:{port},CONTROLLER://{host}:{cport}{links}
advertised.listeners={client}://{host}:{port}{advertised}
controller.listener.names=CONTROLLER
listener.security.protocol.map={client}:{client},CONTROLLER:{controller}{protocols}
inter.broker.listener.name={client}
log.dirs={data}
num.partitions=1
auto.create.topics.enable=false
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
transaction.max.timeout.ms=900000
log.retention.hours=168
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
ssl.principal.mapping.rules=RULE:^CN=([^,]+)$/$1/,DEFAULT
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:{admin};User:{broker}
"""


def _secure_properties(sec: BrokerSecurity, site: str, listeners: list[str]) -> str:
    """The security part of server.properties; ``listeners``: the SASL ones' names."""
    broker = f"kafka-{site}"
    issued = sec.authority.issue(broker)
    jaas = (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{sec.admin_user}" password="{sec.admin_password}";'
    )
    text = SECURE_PROPERTIES.format(
        keystore=issued.bundle, ca=sec.authority.ca_cert, admin=sec.admin_user, broker=broker
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
    site: str
    port: int
    controller_port: int
    proc: Proc
    links: dict[str, LinkListener] = field(default_factory=dict)
    security: BrokerSecurity | None = None

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def admin(self) -> KafkaAuth:
        """How a super user connects (nothing for a plain broker)."""
        return self.security.admin_auth() if self.security else KafkaAuth()

    def link_bootstrap(self, name: str) -> str:
        """Where a client of link ``name`` bootstraps (the proxy's address)."""
        return f"{HOST}:{self.links[name].advertised}"

    def ready(self) -> bool:
        if not port_open(HOST, self.port):
            return False
        try:
            AdminClient(client_config(self.bootstrap, self.admin)).list_topics(timeout=2)
        except KafkaException:
            return False
        return True


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


def _java_argv(
    main: str, *args: str, logs: Path, heap: str, jvm_opts: tuple[str, ...] = ()
) -> list[str]:
    return [
        "java",
        *jvm_opts,
        f"-Xmx{heap}",
        "-Xms64m",
        "-XX:+UseG1GC",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={kafka_log4j_config()}",
        f"-Dkafka.logs.dir={logs}",
        "-cp",
        kafka_classpath(),
        main,
        *args,
    ]


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
) -> KafkaBroker:
    """Format (first time only) and start a broker for ``site`` under ``root``;
    ``security``: SASL/SCRAM over TLS with ACLs (:class:`BrokerSecurity`);
    ``properties`` add to (or override) the broker's server.properties; ``links``:
    one more listener per name (:class:`LinkListener`); ``jvm_opts``: more JVM flags
    (e.g. the quick-start JIT of a short demo). A caller that reserves other
    ports at once (:func:`free_ports`) passes ``port`` and ``controller_port`` too, so
    that none of them is handed out twice."""
    taken = ({port, controller_port} - {None}) | {
        p for ln in (links or {}).values() for p in (ln.port, ln.advertised)
    }
    fresh = [p for p in free_ports(len(taken) + 2, HOST) if p not in taken]
    port = port or fresh[0]
    cport = controller_port or fresh[1]
    data = root / "data"
    root.mkdir(parents=True, exist_ok=True)
    props = root / "server.properties"
    extra = "".join(f"{k}={v}\n" for k, v in (properties or {}).items())
    client = "SASL_SSL" if security else "PLAINTEXT"
    listeners = link_listener_properties(links or {}, client)
    secure = ""
    if security is not None:
        names = [client] + [ln.split("://")[0] for ln in listeners["links"].split(",")[1:]]
        secure = _secure_properties(security, site, names)
    props.write_text(
        SERVER_PROPERTIES.format(
            host=HOST,
            port=port,
            cport=cport,
            data=data,
            client=client,
            controller="SSL" if security else "PLAINTEXT",
            **listeners,
        )
        + secure
        + extra
    )
    site_logs = logs / f"kafka-{site}"
    site_logs.mkdir(parents=True, exist_ok=True)
    if not (data / "meta.properties").exists():
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        fmt = Proc.start(
            f"kafka-format:{site}",
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
                logs=site_logs,
                heap="256m",
            ),
            site_logs / "format.out",
        )
        assert fmt.popen is not None
        if fmt.popen.wait(timeout=120) != 0:
            raise StackError(f"kafka:{site}: storage format failed; see {fmt.log}:\n{fmt.tail()}")
    proc = Proc.start(
        f"kafka:{site}",
        _java_argv("kafka.Kafka", str(props), logs=site_logs, heap=heap, jvm_opts=jvm_opts),
        site_logs / "stdout.log",
    )
    broker = KafkaBroker(site, port, cport, proc, dict(links or {}), security)
    if wait:
        proc.wait_ready(broker.ready, timeout=90)
    return broker
