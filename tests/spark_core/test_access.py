"""Who may do what at a site's Kafka, on a real broker with SASL/SCRAM over TLS and the
KRaft StandardAuthorizer: ``access apply`` creates principals and ACLs idempotently,
and each principal can do what docs/access-control.md says and nothing else; every
refused attempt writes nothing."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from local_stack.kafka import KafkaBroker
from shorelink.config import Secret
from shorelink.contract import H_ORIGIN, H_SEQ, canonical_topic, ingress_topic
from shorelink.kafka.auth import KafkaAuth
from shorelink.kafka.reading import read_to_end
from spark_core.access import AccessPlan, apply_access, plan_access
from spark_core.config import Principal, SitesConfig
from spark_core.location import Location
from spark_core.merge import Merger, start_merge
from spark_core.ops.app import Ops
from tests.access_helpers import CUSTOMERS, GROUPS, PASSWORDS, reset_access, secure_sites
from tests.helpers import eventually, unique, write_toml
from tests.spark_core.helpers import record

TOPICS = [
    "sl.containers",
    "sl.ledger",
    "sl.canonical.index",
    "sl.ingress.containers",
    "sl.relay.tokyo.containers",
    "sl.customer.acme.containers",
    "sl.customer.globex.containers",
    "sl.registry",
]


@dataclass
class Site:
    broker: KafkaBroker
    sites: SitesConfig
    plan: AccessPlan
    first: Any  # the first application's AccessChanges

    def auth(self, user: str, password: str | None = None) -> KafkaAuth:
        return self.broker.admin.as_user(user, password or PASSWORDS[user])

    def conf(self, user: str, password: str | None = None, **extra: Any) -> dict[str, Any]:
        c: dict[str, Any] = self.broker.endpoint.with_auth(
            self.auth(user, password)
        ).client_config()
        c["group.id"] = GROUPS[user]
        c.update(extra)
        return c

    def apply(self, plan: AccessPlan | None = None, **kw: Any) -> Any:
        return apply_access(plan or self.plan, self.broker.endpoint, **kw)

    def count(self, topic: str) -> int:
        """Records committed to ``topic`` (read as the admin)."""
        return len(_read(self.conf_admin(), topic))

    def conf_admin(self) -> dict[str, Any]:
        return self.broker.endpoint.client_config()


@pytest.fixture(scope="module")
def site(secure_kafka: KafkaBroker) -> Iterator[Site]:
    admin_conf = secure_kafka.endpoint.client_config()
    admin = AdminClient(admin_conf)
    for fut in admin.create_topics([NewTopic(t, 1, 1) for t in TOPICS]).values():
        try:
            fut.result(30)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
    p = Producer(admin_conf)
    for t in TOPICS:
        p.produce(t, key=b"k", value=f"first record of {t}".encode())
    assert p.flush(30) == 0
    sites = secure_sites(secure_kafka)
    plan = plan_access(sites, "tokyo", CUSTOMERS)
    # the session's broker may have these principals from another module: start bare
    reset_access(secure_kafka)
    first = apply_access(plan, secure_kafka.endpoint)
    yield Site(secure_kafka, sites, plan, first)


def _read(conf: dict[str, Any], topic: str) -> list[bytes]:
    """Every committed record of ``topic`` (all partitions), as the client ``conf`` is;
    a refusal raises the KafkaException the broker answered with."""
    c = Consumer(
        {
            "group.id": unique("reader"),
            **conf,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
        }
    )
    out: list[bytes] = []
    try:
        # a topic the client may not describe comes back with the broker's error
        md = c.list_topics(topic, timeout=30).topics[topic]
        if md.error is not None:
            raise KafkaException(md.error)
        c.assign([TopicPartition(topic, p, 0) for p in md.partitions])
        pending = set(md.partitions)

        def at_end() -> bool:
            msg = c.poll(0.5)
            if msg is None:
                return False
            err = msg.error()
            if err is None:
                out.append(msg.value() or b"")
            elif err.code() == KafkaError._PARTITION_EOF:
                pending.discard(msg.partition())
                return not pending
            else:
                raise KafkaException(err)
            return False

        eventually(at_end, within=30, what=f"the end of {topic}", interval=0)
        return out
    finally:
        c.close()


#: how the broker refuses a user that no longer exists: its SCRAM handshake fails
#: (librdkafka reports it as an authentication or a transport error)
GONE = (KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED, KafkaError._TRANSPORT)


def _login_refused(conf: dict[str, Any]) -> bool:
    """Whether the broker refuses ``conf``'s login (asked as it happens, by the client's
    error callback: a metadata request of a client that cannot log in only times out)."""
    errors: list[KafkaError] = []
    c = Consumer({**conf, "error_cb": errors.append, "group.id": unique("login")})
    try:
        eventually(
            lambda: c.poll(0.2) is None and any(e.code() in GONE for e in errors),
            within=30,
            what="the login refused",
            interval=0,
        )
        return True
    finally:
        c.close()


def _refused(conf: dict[str, Any], topic: str) -> int:
    with pytest.raises(KafkaException) as info:
        _read(conf, topic)
    return int(info.value.args[0].code())


def _produce(conf: dict[str, Any], topic: str) -> KafkaError | None:
    """One record; the delivery error (None: written)."""
    errors: list[KafkaError | None] = []
    conf = {k: v for k, v in conf.items() if k != "group.id"}
    p = Producer({**conf, "message.timeout.ms": 10_000})
    p.produce(topic, b"refused?", key=b"k", on_delivery=lambda e, _m: errors.append(e))
    p.flush(20)
    assert errors, f"no delivery report for {topic}"
    return errors[0]


def test_apply_creates_the_principals_then_changes_nothing(site: Site) -> None:
    assert sorted(site.first.users_created) == sorted(PASSWORDS)
    assert len(site.first.added) == len(site.plan.grants) and not site.first.removed
    again = site.apply()
    assert not again.changed and again.unchanged == len(site.plan.grants)
    assert again.lines() == []


def test_apply_takes_back_what_the_file_no_longer_grants_and_resets_a_password(
    site: Site,
) -> None:
    without = plan_access(site.sites, "tokyo", {"acme": CUSTOMERS["acme"]})
    dry = site.apply(without, dry_run=True)
    assert dry.removed and {g.principal for g in dry.removed} == {"customer-globex"}
    assert dry.users_deleted == ["customer-globex"]
    assert site.apply().unchanged == len(site.plan.grants), "a dry run changes nothing"
    site.apply(without)
    # the user and its grants are gone: it cannot even log in
    assert _login_refused(site.conf("customer-globex"))
    new_pw = plan_access(site.sites, "tokyo", {**CUSTOMERS, "acme": Secret("acme-new")})
    changed = site.apply(new_pw)
    assert changed.passwords_set == ["customer-acme"]
    assert changed.users_created == ["customer-globex"]
    assert {g.principal for g in changed.added} == {"customer-globex"}
    assert _read(site.conf("customer-acme", "acme-new"), "sl.customer.acme.containers")
    restored = site.apply()
    assert restored.passwords_set == ["customer-acme"] and not restored.added


def test_a_staff_member_taken_out_of_the_file_loses_the_password_and_every_grant(
    site: Site,
) -> None:
    """Review M7: deleting a ``[[staff]]`` entry (someone who left) left the user and
    its READ on every topic in place after the next apply, silently. Now the next apply
    deletes the user it made and every ACL of it; a user made by hand is left alone."""
    bob = Principal("bob", Secret("bob-pw"))
    with_bob = dataclasses.replace(site.sites, staff=(*site.sites.staff, bob))
    added = site.apply(plan_access(with_bob, "tokyo", CUSTOMERS))
    assert added.users_created == ["bob"]
    bob_conf = site.broker.endpoint.as_user("bob", bob.password).client_config()
    bob_conf["group.id"] = unique("bob")
    assert _read(bob_conf, "sl.customer.acme.containers")
    dry = site.apply(dry_run=True)
    assert dry.users_deleted == ["bob"] and {g.principal for g in dry.removed} == {"bob"}
    gone = site.apply()
    assert gone.users_deleted == ["bob"]
    assert {g.principal for g in gone.removed} == {"bob"} and not gone.added
    assert _login_refused(bob_conf)
    assert not site.apply().changed, "nothing left to take back"


def test_the_operations_page_reads_as_its_own_principal_which_cannot_write(
    site: Site,
) -> None:
    """Review M6: the web-facing page read Kafka as the site application, a principal
    that may write and delete the canonical topics. With ``[sites.S.ops.kafka]`` it
    reads as its own, which ``access apply`` makes read-only: it reads the canonical
    topics and writes nothing."""
    tokyo = site.sites.site("tokyo")
    ops_cfg = dataclasses.replace(
        tokyo.ops, kafka_username="ops-tokyo", kafka_password=Secret("ops-tokyo-pw")
    )
    sites = dataclasses.replace(
        site.sites,
        sites={**site.sites.sites, "tokyo": dataclasses.replace(tokyo, ops=ops_cfg)},
    )
    added = site.apply(plan_access(sites, "tokyo", CUSTOMERS))
    assert added.users_created == ["ops-tokyo"]
    try:
        page = Ops(sites, "tokyo").kafka_endpoint()
        assert page.auth.username == "ops-tokyo"
        conf = {**page.client_config(), "group.id": "shorelink-ops-tokyo"}
        topic = canonical_topic("containers")
        assert _read(conf, topic)
        assert _produce(conf, topic).code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    finally:
        assert site.apply().users_deleted == ["ops-tokyo"]


def test_a_customer_reads_its_own_stream_and_nothing_else(site: Site) -> None:
    acme = site.conf("customer-acme")
    assert _read(acme, "sl.customer.acme.containers") == [
        b"first record of sl.customer.acme.containers"
    ]
    for topic in (
        "sl.customer.globex.containers",
        "sl.containers",
        "sl.ledger",
        "sl.canonical.index",
        "sl.relay.tokyo.containers",
    ):
        assert _refused(acme, topic) == KafkaError.TOPIC_AUTHORIZATION_FAILED, topic
    # offsets under its own group prefix, and nowhere else
    c = Consumer({**acme, "group.id": "acme.dashboard", "enable.auto.commit": False})
    try:
        c.commit(offsets=[TopicPartition("sl.customer.acme.containers", 0, 1)], asynchronous=False)
    finally:
        c.close()
    c = Consumer({**acme, "group.id": "globex.dashboard", "enable.auto.commit": False})
    try:
        c.subscribe(["sl.customer.acme.containers"])
        codes: list[int] = []

        def answered() -> bool:
            msg = c.poll(0.5)
            if msg is not None:
                err = msg.error()
                assert err is not None, "a group outside its prefix delivered a record"
                codes.append(err.code())
            return bool(codes)

        eventually(answered, within=30, what="the broker's answer", interval=0)
        assert codes == [KafkaError.GROUP_AUTHORIZATION_FAILED]
    finally:
        c.close()
    # and it cannot write its own stream
    assert _produce(acme, "sl.customer.acme.containers") is not None
    assert site.count("sl.customer.acme.containers") == 1


def test_the_gateway_writes_its_ingress_and_not_the_canonical_topics(site: Site) -> None:
    gw = site.conf("gateway-tokyo")
    gw.pop("group.id")
    before = {t: site.count(t) for t in ("sl.ingress.containers", "sl.containers")}
    delivered: dict[str, KafkaError | None] = {}
    p = Producer(
        {
            **gw,
            "transactional.id": "shorelink-gateway-tokyo",
            "on_delivery": lambda e, m: delivered.__setitem__(m.topic(), e),
        }
    )
    p.init_transactions(30)
    p.begin_transaction()
    p.produce("sl.ingress.containers", b"from the gateway", key=b"k")
    p.commit_transaction(30)
    # the canonical topic: refused, and the transaction that tried is aborted whole
    p.begin_transaction()
    p.produce("sl.ingress.containers", b"same transaction", key=b"k")
    p.produce("sl.containers", b"forged canonical", key=b"k")
    with pytest.raises(KafkaException) as info:
        p.commit_transaction(30)
    assert info.value.args[0].txn_requires_abort()
    failed = delivered["sl.containers"]
    assert failed is not None and failed.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    p.abort_transaction(30)
    assert site.count("sl.ingress.containers") == before["sl.ingress.containers"] + 1
    assert site.count("sl.containers") == before["sl.containers"]
    # another transactional.id (the merge's) is not the gateway's to take
    with pytest.raises(KafkaException) as info:
        Producer({**gw, "transactional.id": "shorelink-merge-tokyo"}).init_transactions(30)
    assert info.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


def test_the_gateway_follows_its_sites_fleet_registry_and_cannot_write_it(site: Site) -> None:
    """A gateway with ``fleet_pub_file`` takes its ships from the site's sl.registry: it
    reads it with a group of the follower's (shorelink-registry-...), and only the
    site's merge writes it (a gateway that could would forge the fleet's entries)."""
    gw = site.conf("gateway-tokyo", **{"group.id": unique("shorelink-registry-")})
    assert _read(gw, "sl.registry") == [b"first record of sl.registry"]
    err = _produce(gw, "sl.registry")
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_a_neighbour_reads_the_relay_and_canonical_topics_and_writes_nothing(site: Site) -> None:
    """A neighbour reads the relay topics and, for history (what a relay no longer has:
    spark_core/pull.py), the canonical topics, and for repair by identity
    (spark_core/repair.py) the ledger and the canonical index; nothing else, and writes
    nothing."""
    hq = site.conf("site-hq")
    for topic in ("sl.relay.tokyo.containers", "sl.containers", "sl.ledger", "sl.canonical.index"):
        assert _read(hq, topic) == [f"first record of {topic}".encode()], topic
    for topic in ("sl.ingress.containers", "sl.customer.acme.containers"):
        assert _refused(hq, topic) == KafkaError.TOPIC_AUTHORIZATION_FAILED, topic
    for topic in (
        "sl.relay.tokyo.containers",
        "sl.ingress.containers",
        "sl.containers",
        "sl.ledger",
        "sl.canonical.index",
    ):
        before = site.count(topic)
        err = _produce(hq, topic)
        assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, topic
        assert site.count(topic) == before


def test_the_application_writes_canonical_and_staff_read_everything(site: Site) -> None:
    spark = site.conf("spark-tokyo")
    before = site.count("sl.containers")
    assert _produce(spark, "sl.containers") is None
    assert site.count("sl.containers") == before + 1
    assert _read(spark, "sl.ingress.containers")
    ops = site.conf("ops")
    for topic in TOPICS:
        assert _read(ops, topic), topic
    assert _produce(ops, "sl.ledger") is not None, "staff read, never write"


def test_a_wrong_password_and_a_client_without_tls_are_refused(site: Site) -> None:
    before = site.count("sl.ingress.containers")
    seen: list[KafkaError] = []
    wrong = site.conf("gateway-tokyo", "not-the-password", error_cb=seen.append)
    refused = AdminClient(wrong)
    with pytest.raises(KafkaException):
        refused.list_topics(timeout=5)
    refused.poll(1)  # serves the error callback
    assert any(e.code() == KafkaError._AUTHENTICATION for e in seen), seen
    err = _produce(wrong, "sl.ingress.containers")
    assert err is not None
    # the right password without TLS: the TLS listener never completes a handshake
    plain = {
        "bootstrap.servers": site.broker.bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "gateway-tokyo",
        "sasl.password": PASSWORDS["gateway-tokyo"],
        "socket.timeout.ms": 5000,
    }
    with pytest.raises(KafkaException):
        AdminClient(plain).list_topics(timeout=8)
    no_sasl = site.broker.endpoint.with_auth(
        KafkaAuth(ca_file=site.auth("ops").ca_file)
    ).client_config()
    no_sasl["socket.timeout.ms"] = 5000
    with pytest.raises(KafkaException):
        AdminClient(no_sasl).list_topics(timeout=8)
    assert site.count("sl.ingress.containers") == before


@pytest.mark.spark
def test_the_merge_runs_as_the_site_application(
    spark: Any, site: Site, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The site's application, as its own principal: reads ingress (the gateway's
    writes), writes canonical and ledger in its transactions, exactly once."""
    root = tmp_path_factory.mktemp("secure-merge")
    tokyo = dataclasses.replace(
        site.sites.site("tokyo"),
        checkpoint_dir=Location(str(root / "checkpoints")),
        table_dir=Location(str(root / "tables")),
    )
    ship = unique("ship")
    gw = site.conf("gateway-tokyo")
    gw.pop("group.id")
    p = Producer({**gw, "transactional.id": "shorelink-gateway-tokyo"})
    p.init_transactions(30)
    p.begin_transaction()
    for r in [record(ship, "containers", q) for q in (*range(1, 21), 5, 6)]:  # two resent
        p.produce(ingress_topic("containers"), key=r.key, value=r.value, headers=r.headers())
    p.commit_transaction(30)
    merger = Merger(tokyo)
    try:
        q = start_merge(spark, merger, available_now=True)
        q.awaitTermination(180)
        assert q.exception() is None
    finally:
        merger.close()
    mine = []
    for m in read_to_end(site.broker.endpoint, [canonical_topic("containers")], settled=True):
        h = dict(m.headers() or [])
        if h.get(H_ORIGIN) == ship.encode():
            mine.append(int(h[H_SEQ]))
    assert sorted(mine) == list(range(1, 21))


def _customer_file(site: Site, root: Path, user: str) -> Path:
    """A customer's own file: its site's Kafka, its principal, its password as ${ENV}."""
    kafka = {
        "bootstrap": site.broker.bootstrap,
        "ca_file": str(site.auth(user).ca_file),
        "username": user,
        "password": "${SL_TEST_CUSTOMER_PASSWORD}",
    }
    return write_toml(
        root / f"{user}.toml", {"sites": {"tokyo": {"streams": ["containers"], "kafka": kafka}}}
    )


def test_shorelink_consume_reads_a_customer_stream_and_is_refused_another(
    site: Site, tmp_path: Path
) -> None:
    ship = unique("ship")
    p = Producer(site.conf_admin())
    for q in (1, 2, 3):
        r = record(ship, "containers", q)
        p.produce("sl.customer.acme.containers", r.value, r.key, headers=r.headers())
    assert p.flush(30) == 0
    cfg = _customer_file(site, tmp_path, "customer-acme")
    env = {**os.environ, "SL_TEST_CUSTOMER_PASSWORD": PASSWORDS["customer-acme"]}
    argv = [sys.executable, "-m", "shorelink.cli", "consume", "--site", "tokyo"]
    argv += ["--config", str(cfg), "--stream", "containers"]
    out = subprocess.run(
        [*argv, "--customer", "acme"], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    mine = [json.loads(line) for line in out.stdout.splitlines() if ship in line]
    assert [m["seq"] for m in mine] == [1, 2, 3]
    refused = subprocess.run(
        [*argv, "--customer", "globex"], env=env, capture_output=True, text=True, timeout=120
    )
    assert refused.returncode == 2 and "not authorized" in refused.stderr, refused.stderr
    # and without the secret in the environment: a clear error naming the field
    env.pop("SL_TEST_CUSTOMER_PASSWORD")
    unset = subprocess.run(
        [*argv, "--customer", "acme"], env=env, capture_output=True, text=True, timeout=120
    )
    assert unset.returncode == 2 and "sites.tokyo.kafka.password" in unset.stderr


def test_headquarters_loop_runs_as_its_own_principal_which_writes_only_the_registry_ingress(
    site: Site, tmp_path: Path
) -> None:
    """`shorelink fleet run` logged in as the broker's super user (the voyage's loop did):
    a stolen loop host was the whole site. With ``[sites.S.access] fleet_password`` it
    runs as its own principal, which publishes the registry's entries into
    sl.ingress.registry and reads the ships' reports, and may neither write sl.registry
    (only the merge, which checks the fleet's proof, writes it) nor read a ship's data."""
    from click.testing import CliRunner

    from shorelink.cli import main
    from shorelink.fleet.log import Registry
    from shorelink.ship_report import ShipReport, report_record

    tokyo = site.sites.site("tokyo")
    access = dataclasses.replace(
        tokyo.access, fleet_username="fleet-tokyo", fleet_password=Secret("fleet-pw")
    )
    sites = dataclasses.replace(
        site.sites,
        sites={**site.sites.sites, "tokyo": dataclasses.replace(tokyo, access=access)},
    )
    assert site.apply(plan_access(sites, "tokyo", CUSTOMERS)).users_created == ["fleet-tokyo"]
    try:
        reports = canonical_topic(tokyo.ops.report_stream)
        admin = AdminClient(site.conf_admin())
        for fut in admin.create_topics([NewTopic(reports, 1, 1)]).values():
            try:
                fut.result(30)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
        rec = report_record("bigblue", "agent", 1, ShipReport(1, None, {}, {}), "tokyo")
        p = Producer(site.conf_admin())
        headers: list[tuple[str, str | bytes | None]] = list(rec.headers())
        p.produce(reports, rec.value, rec.key, headers=headers)
        assert p.flush(30) == 0
        reg = Registry.init(tmp_path / "registry")
        reg.append([("ship_added", {"ship": "bigblue", "groups": ["north"]})])
        ingress = ingress_topic("registry")
        before = site.count(ingress) if ingress in admin.list_topics(timeout=30).topics else 0
        assert site.broker.security is not None
        sites_file = write_toml(
            tmp_path / "sites.toml",
            {
                "sites": {
                    "tokyo": {
                        "streams": ["containers", "alerts"],
                        "kafka": {
                            "bootstrap": site.broker.bootstrap,
                            "username": "spark-tokyo",
                            "password": "spark-pw",
                            "ca_file": str(site.broker.security.authority.ca_cert),
                        },
                        "access": {"fleet_password": "${SL_TEST_FLEET_PASSWORD}"},
                    }
                }
            },
        )
        run = ["fleet", "run", "--once", "--registry", str(reg.directory)]
        result = CliRunner().invoke(
            main,
            [*run, "--sites", str(sites_file), "--site", "tokyo"],
            env={"SL_TEST_FLEET_PASSWORD": "fleet-pw"},
        )
        assert result.exit_code == 0, result.output
        assert site.count(ingress) == before + 2, "both entries published by the loop's own"
        loop = site.broker.endpoint.with_auth(site.auth("fleet-tokyo", "fleet-pw"))
        loop_conf = {**loop.client_config(), "group.id": "shorelink-read-to-end"}
        assert len(_read(loop_conf, reports)) >= 1, "it reads the ships' reports"
        err = _produce(loop_conf, "sl.registry")
        assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        assert _refused(loop_conf, "sl.containers") == KafkaError.TOPIC_AUTHORIZATION_FAILED
        # the application's principal, which it logged in as before, may not publish
        spark = {k: v for k, v in site.conf("spark-tokyo").items() if k != "group.id"}
        err = _produce(spark, ingress)
        assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    finally:
        assert site.apply().users_deleted == ["fleet-tokyo"]
