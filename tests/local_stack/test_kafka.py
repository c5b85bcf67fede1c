"""The stack's Kafka is a real broker: transactions, read_committed, no auto-creation."""

from __future__ import annotations

import subprocess
from pathlib import Path

from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, ConfigResource

from local_stack.kafka import KafkaBroker, _formatted, _new_cluster_id, _start_format
from local_stack.tls import make_authority
from local_stack.tools import cds_flags, kafka_cds_archive, kafka_classpath
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.reading import read_to_end
from shorelink.kafka.topics import TopicSpec, ensure_topics
from tests.helpers import unique


def _values(bootstrap: str, topic: str, isolation: str) -> list[bytes]:
    return [
        m.value()
        for m in read_to_end(
            KafkaEndpoint.plaintext(bootstrap), [topic], isolation=isolation, settled=True
        )
    ]


def test_transactional_produce_visible_to_read_committed_only_after_commit(
    kafka: KafkaBroker,
) -> None:
    """Exactly-once in the gateway and merge rests on transactions: aborted writes must
    never reach a read_committed consumer."""
    topic = unique("txn")
    ensure_topics(kafka.endpoint, [TopicSpec(topic)])
    p = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": unique("tx")})
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(5):
        p.produce(topic, value=f"aborted-{i}".encode())
    p.flush()
    p.abort_transaction(30)
    p.begin_transaction()
    for i in range(5):
        p.produce(topic, value=f"committed-{i}".encode())
    p.commit_transaction(30)

    committed = _values(kafka.bootstrap, topic, "read_committed")
    assert committed == [f"committed-{i}".encode() for i in range(5)]
    uncommitted = _values(kafka.bootstrap, topic, "read_uncommitted")
    assert len(uncommitted) == 10


def test_auto_topic_creation_is_off(kafka: KafkaBroker) -> None:
    """Production keeps auto-creation off; the stack must too, or a missing
    ensure_topics() call would only fail in production."""
    topic = unique("nope")
    p = Producer({"bootstrap.servers": kafka.bootstrap, "message.timeout.ms": 3000})
    errors: list[KafkaError] = []
    p.produce(topic, b"x", on_delivery=lambda err, _msg: errors.append(err))
    p.flush(10)
    assert errors and errors[0] is not None
    assert (
        topic
        not in AdminClient({"bootstrap.servers": kafka.bootstrap}).list_topics(timeout=5).topics
    )


def test_ensure_topics_creates_with_partitions_and_retention_once(kafka: KafkaBroker) -> None:
    topic = unique("spec")
    spec = TopicSpec(topic, partitions=3, retention_ms=3_600_000)
    assert ensure_topics(kafka.endpoint, [spec]) == [topic]
    assert ensure_topics(kafka.endpoint, [spec]) == []  # second call: nothing to do
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    md = admin.list_topics(topic, timeout=5).topics[topic]
    assert len(md.partitions) == 3
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    cfg = admin.describe_configs([res])[res].result(timeout=10)
    assert cfg["retention.ms"].value == "3600000"


def test_brokers_map_the_class_data_archive_setup_made_and_a_damaged_one_is_not_used(
    kafka: KafkaBroker, tmp_path: Path
) -> None:
    """scripts/setup makes and checks the archive (local_stack/tools.py
    ``install_kafka_cds``); every broker maps it. A truncated copy (the JVM would crash
    on it) is not mapped; a bit-flipped one the JVM itself ignores (VerifySharedSpaces)
    and the tool runs."""
    archive = kafka_cds_archive()
    assert archive.exists() and archive.stat().st_size > 1_000_000
    assert cds_flags(archive) and all(f in kafka.argv for f in cds_flags(archive))
    data = archive.read_bytes()
    truncated = tmp_path / "truncated.jsa"
    truncated.write_bytes(data[: len(data) // 2])
    (tmp_path / "truncated.jsa.ok").write_text(f"{len(data)}\n")
    assert cds_flags(truncated) == []
    assert cds_flags(tmp_path / "none.jsa") == []
    flipped = tmp_path / "flipped.jsa"
    flipped.write_bytes(data[: len(data) // 2] + b"\xff" * 64 + data[len(data) // 2 + 64 :])
    (tmp_path / "flipped.jsa.ok").write_text(f"{len(data)}\n")
    out = subprocess.run(
        [
            *("java", *cds_flags(flipped), "-cp", kafka_classpath()),
            *("kafka.tools.StorageTool", "random-uuid"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and len(out.stdout.strip().splitlines()[-1]) == 22, out


def test_the_admin_password_is_in_no_file_others_can_read(secure_kafka: KafkaBroker) -> None:
    """Review L1: server.properties holds the super user's password (its JAAS line) and
    was written with the umask (0644)."""
    props = Path(secure_kafka.argv[-1])
    assert props.name == "server.properties"
    assert secure_kafka.security is not None
    password = secure_kafka.security.admin_password.encode()
    assert password in props.read_bytes()
    readable = [
        p
        for p in props.parent.rglob("*")
        if p.is_file() and p.stat().st_mode & 0o077 and password in p.read_bytes()
    ]
    assert not readable, f"the admin password in files others can read: {readable}"


def test_the_admin_password_is_on_no_command_line_when_storage_is_formatted(
    secure_kafka: KafkaBroker, tmp_path: Path
) -> None:
    """Review L1 (the rest): the storage tool took the super user's SCRAM credentials as
    an argument, which ``ps`` shows while it formats. Now they are in a 0600 argument
    file the JVM reads (``java @file``), removed once the format is done; the secured
    broker of the fixture was formatted so and its admin logs in."""
    props = Path(secure_kafka.argv[-1])
    security = secure_kafka.security
    assert security is not None
    copy = tmp_path / "server.properties"
    copy.write_text(props.read_text().replace(str(props.parent / "data"), str(tmp_path / "data")))
    fmt = _start_format("l1", copy, _new_cluster_id(), security, tmp_path / "logs")
    assert fmt.popen is not None
    argv = [str(a) for a in fmt.popen.args]  # type: ignore[union-attr]
    assert security.admin_password not in " ".join(argv)
    argfile = tmp_path / "format.args"
    assert f"@{argfile}" in argv
    _formatted(fmt)
    assert not argfile.exists()
    assert "cluster.id=" in (tmp_path / "data" / "meta.properties").read_text()


#: the controllers' quorum as a client with a certificate sees it (Kafka's Admin API with
#: ``bootstrap.controllers``: the controller listener, mutual TLS)
_DESCRIBE_QUORUM = """
import java.util.Properties; import org.apache.kafka.clients.admin.Admin;
public class DescribeQuorum { public static void main(String[] a) throws Exception {
  Properties p = new Properties();
  p.put("bootstrap.controllers", a[0]); p.put("security.protocol", "SSL");
  p.put("ssl.keystore.type", "PEM"); p.put("ssl.keystore.location", a[1]);
  p.put("ssl.truststore.type", "PEM"); p.put("ssl.truststore.location", a[2]);
  p.put("request.timeout.ms", "20000"); p.put("default.api.timeout.ms", "30000");
  try (Admin admin = Admin.create(p)) {
    System.out.println("leader " + admin.describeMetadataQuorum().quorumInfo().get().leaderId());
  } } }
"""


def test_a_certificate_named_like_a_broker_is_no_broker(
    secure_kafka: KafkaBroker, tmp_path: Path
) -> None:
    """Review L11: the controller listener took any certificate of the stack's CA and
    made its common name the principal, so a ship's certificate named ``kafka-<site>``
    (same CA, mutual TLS to gateways) was the broker: a super user. Now only a
    certificate of the brokers' unit maps to a broker; the same name from a ship's
    certificate is a stranger the controller refuses."""
    security = secure_kafka.security
    assert security is not None
    authority = security.authority
    broker_name = f"kafka-{secure_kafka.site}"

    probe = tmp_path / "DescribeQuorum.java"
    probe.write_text(_DESCRIBE_QUORUM)

    def describe_quorum(bundle: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                *("java", "-cp", kafka_classpath(), str(probe)),
                *(f"127.0.0.1:{secure_kafka.controller_port}", str(bundle), str(authority.ca_cert)),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )

    real = describe_quorum(authority.issue(broker_name, broker=True).bundle)
    assert real.returncode == 0 and "leader" in real.stdout, real.stderr
    ship = make_authority(authority.dir)  # the same CA, as the voyage issues ships' from
    impostor = Path(tmp_path / "impostor")
    impostor.mkdir()
    (impostor / "ca.pem").write_bytes(ship.ca_cert.read_bytes())
    (impostor / "ca.key").write_bytes(ship.ca_key.read_bytes())
    forged = make_authority(impostor).issue(broker_name, client=True)
    refused = describe_quorum(forged.bundle)
    assert refused.returncode != 0
    assert "ClusterAuthorization" in refused.stderr + refused.stdout, refused.stderr
