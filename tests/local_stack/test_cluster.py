"""A site as a data centre runs it: a three-node KRaft cluster (local_stack/kafka.py
``start_kafka_cluster``), topics kept three times and acknowledged by two (acks=all).
One node killed with SIGKILL while the gateway writes, or while the merge commits, loses
nothing that was acknowledged and doubles nothing: the promise of exactly once must not
rest on every broker of a site staying up."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource

from core_gateway.auth import Credentials
from local_stack.kafka import CLIENT_COMPILER, KafkaBroker, KafkaCluster, start_kafka_cluster
from local_stack.process import free_port, pid_alive, stop_procs
from local_stack.stack import load
from shorelink.contract import (
    GATEWAY_CURSOR_TOPIC,
    H_ORIGIN,
    H_SEQ,
    LEDGER_TOPIC,
    canonical_topic,
    ingress_topic,
)
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.reading import read_to_end
from shorelink.kafka.topics import TopicSpec, ensure_topics
from spark_core.merge import Merger, start_merge
from tests.core_gateway.helpers import batch, run_gateway, wait_ready
from tests.helpers import eventually, kill9, unique, write_toml
from tests.spark_core.helpers import (
    assert_exactly_once,
    canonical,
    create_ingress,
    ledger,
    make_site,
    produce,
    record,
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """One site's Kafka: three nodes, each broker and controller (heaps as the session's
    brokers; the quick-start JIT, as the demo's, for a machine that runs much else)."""
    root = tmp_path_factory.mktemp("cluster")
    c = start_kafka_cluster(
        "dc", root / "kafka", root / "logs", heap="384m", jvm_opts=CLIENT_COMPILER
    )
    yield c
    stop_procs(c.procs, grace=10)


def _leader(cluster: KafkaCluster, topic: str, partition: int = 0) -> KafkaBroker:
    """The node leading ``topic``'s ``partition`` now."""
    md = cluster.metadata(timeout=10)
    return cluster.node(md.topics[topic].partitions[partition].leader)


def _replication(cluster: KafkaCluster, topic: str) -> tuple[set[int], str]:
    """(replicas per partition, ``min.insync.replicas``) of ``topic``, once the broker
    asked knows the topic (a new topic reaches each broker's metadata in its own time)."""
    eventually(lambda: topic in cluster.metadata(timeout=10).topics, 30, f"{topic} in metadata")
    md = cluster.metadata(timeout=10)
    factors = {len(p.replicas) for p in md.topics[topic].partitions.values()}
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    (fut,) = admin.describe_configs([ConfigResource("topic", topic)]).values()
    return factors, fut.result(timeout=10)["min.insync.replicas"].value


def _fully_in_sync(cluster: KafkaCluster, *topics: str) -> bool:
    """Every partition of ``topics`` has its three replicas in sync again."""
    md = cluster.metadata(timeout=5)
    return all(
        len(p.isrs) == len(p.replicas) == 3
        for t in topics
        for p in md.topics[t].partitions.values()
    )


def _kill_and_restart_later(node: KafkaBroker) -> None:
    """SIGKILL ``node`` (the JVM, no shutdown of any kind)."""
    kill9(node.proc)
    assert not node.proc.alive()


def _write_gateway_config(tmp_path: Path, cluster: KafkaCluster, port: int) -> Path:
    return write_toml(
        tmp_path / "gateway.toml",
        {
            "site": "dc",
            "credentials_file": "ships.json",
            "streams": ["containers"],
            "listen": {"host": "127.0.0.1", "port": port},
            "metrics": {"port": free_port()},
            "kafka": {
                "bootstrap": cluster.bootstrap,
                "transactional_id": unique("gw"),
                "ingress_partitions": 3,
                "timeout": "30s",
            },
        },
    )


def _request(
    method: str, url: str, token: str, body: bytes | None = None
) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(
        url,
        data=body,
        method=method,
        headers={
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/x-shorelink-batch",
        },
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def _ingress_seqs(cluster: KafkaCluster, ship: str) -> Counter[int]:
    out: Counter[int] = Counter()
    for m in read_to_end(cluster.endpoint, [ingress_topic("containers")], settled=True):
        h = dict(m.headers() or [])
        seq = h.get(H_SEQ)
        if h.get(H_ORIGIN) == ship.encode() and isinstance(seq, bytes):
            out[int(seq)] += 1
    return out


def test_gateway_topics_are_kept_three_times_and_acknowledged_by_two(
    cluster: KafkaCluster, tmp_path: Path
) -> None:
    """With three brokers the gateway's topics get what production wants without a
    setting (shorelink/kafka/topics.py Durability): one lost broker loses no record."""
    port = free_port()
    cfg = _write_gateway_config(tmp_path, cluster, port)
    Credentials(tmp_path / "ships.json").add(unique("ship"))
    proc = run_gateway(cfg, tmp_path / "gw.log")
    try:
        wait_ready(proc, port)
    finally:
        proc.stop(grace=10)
    for topic in (ingress_topic("containers"), GATEWAY_CURSOR_TOPIC):
        assert _replication(cluster, topic) == ({3}, "2"), topic


def test_broker_killed_during_uploads_every_seq_once(cluster: KafkaCluster, tmp_path: Path) -> None:
    """The leader of sl.ingress.containers killed with SIGKILL while a ship uploads: the
    uploads go on meanwhile (two replicas in sync are enough), the ship resends what an
    upload cut short from the site's holdings, and after the node is back every seq is
    in the topic exactly once."""
    port = free_port()
    cfg = _write_gateway_config(tmp_path, cluster, port)
    ship = unique("ship")
    token = Credentials(tmp_path / "ships.json").add(ship)
    url = f"http://127.0.0.1:{port}/v1/ships/{ship}"
    total, size = 3000, 150
    proc = run_gateway(cfg, tmp_path / "gw.log")
    victim: KafkaBroker | None = None
    held_at_kill = held_at_restart = 0
    failed = 0
    try:
        wait_ready(proc, port)
        next_seq, uploads = 1, 0

        def upload() -> bool:
            """One upload as the edge does it; true once the site holds every seq."""
            nonlocal next_seq, uploads, victim, held_at_kill, held_at_restart, failed
            uploads += 1
            hi = min(total, next_seq + size - 1)
            if victim is None and next_seq > total // 4:
                victim = _leader(cluster, ingress_topic("containers"))
                held_at_kill = next_seq - 1
                # the kill lands while this batch is on its way
                threading.Timer(0.02, _kill_and_restart_later, [victim]).start()
            elif victim is not None and not held_at_restart and next_seq > total * 3 // 4:
                held_at_restart = next_seq - 1
                # the other two took over the partition the dead node led
                assert _leader(cluster, ingress_topic("containers")) is not victim
                victim.restart(timeout=120)
            with contextlib.suppress(OSError):
                status, _ = _request(
                    "POST", f"{url}/streams/containers/batches", token, batch(ship, next_seq, hi)
                )
                failed += status != 200
            # as the edge does: continue from what the site says it holds
            status, body = _request("GET", f"{url}/holdings", token)
            assert status == 200, body
            held = str(body["streams"]["containers"])
            assert "," not in held, f"holdings have a gap: {held}"
            next_seq = int(held.split("-")[-1]) + 1 if held else 1
            return next_seq > total or uploads >= 200

        eventually(upload, within=150, what=f"the site to hold seqs 1-{total}", interval=0)
    finally:
        proc.stop(grace=10)
        if victim is not None and not victim.proc.alive():
            victim.restart(timeout=120)
    assert victim is not None and held_at_restart, "the kill and restart never came"
    # the site went on taking batches while one of its three brokers was dead
    assert held_at_restart - held_at_kill >= 5 * size, (held_at_kill, held_at_restart, failed)
    seqs = _ingress_seqs(cluster, ship)
    assert sorted(seqs) == list(range(1, total + 1)), "gap (or extra seqs) in sl.ingress"
    assert max(seqs.values()) == 1, "an identity was written twice"
    # the restarted node caught up: every partition has its three replicas again
    eventually(
        lambda: _fully_in_sync(cluster, ingress_topic("containers"), GATEWAY_CURSOR_TOPIC),
        within=60,
        what="the restarted node back in every ISR",
    )


def _batches(query: Any) -> int:
    """Micro-batches the query has finished (with data or not)."""
    return len(query.recentProgress)


@pytest.mark.spark
def test_broker_killed_during_the_merge_canonical_exactly_once(
    cluster: KafkaCluster, spark: Any, tmp_path: Path
) -> None:
    """The leader of the canonical topic killed with SIGKILL between the merge's
    transactions (batches of 200 records): the merge's transactions go on on the other
    two (a batch cut short is replayed, as the site's supervisor restarts a failed
    query), and the canonical topic and the ledger hold every identity exactly once."""
    b = cluster.bootstrap
    s = unique("dc")
    create_ingress(b, [s], partitions=3)
    assert _replication(cluster, ingress_topic(s)) == ({3}, "2")
    produce(b, [record("ship1", s, q, key=f"c{q % 7}") for q in range(1, 1501)])
    produce(b, [record("ship1", s, q, key=f"c{q % 7}") for q in range(700, 1001)])  # a resend
    produce(b, [record("ship2", s, q, key="c9") for q in reversed(range(1, 601))])
    # the merge's Kafka source waits 15 s, not Kafka's 60, on the dead leader before it
    # asks again (docs/data-centre.md, offsets_timeout)
    site, _ = make_site(b, tmp_path, [s], max_offsets=200, offsets_timeout="15s")
    mergers = [Merger(site)]
    q = start_merge(spark, mergers[0], available_now=True)  # creates its topics first
    victim = _leader(cluster, canonical_topic(s))
    try:
        for topic in (canonical_topic(s), LEDGER_TOPIC):
            assert _replication(cluster, topic) == ({3}, "2"), topic
        eventually(lambda: _batches(q) >= 2 or not q.isActive, 120, "two merge batches")
        assert q.isActive, "the merge finished before the kill"
        kill9(victim.proc)
        written_before = mergers[0].totals.written
        while True:  # the site's supervisor: a failed query starts again (bounded)
            q.awaitTermination(240)
            assert not q.isActive, "the merge did not finish within 240 s"
            if q.exception() is None:
                break
            assert len(mergers) <= 3, f"the merge failed again and again: {q.exception()}"
            mergers.append(Merger(site))
            q = start_merge(spark, mergers[-1], available_now=True)
        # the backlog left at the kill was merged while the node was dead, on the other
        # two: at least half of it (the kill waits for the node to die, and on a loaded
        # machine the merge is some batches further on by then), up to 1000
        after = sum(m.totals.written for m in mergers) - written_before
        assert after >= min(1000, (2100 - written_before) // 2), (written_before, after)
        assert _leader(cluster, canonical_topic(s)) is not victim
    finally:
        if q.isActive:
            q.stop()
        for m in mergers:
            m.close()
        if not victim.proc.alive():
            victim.restart(timeout=120)
    assert_exactly_once(canonical(b, s), {("ship1", s): 1500, ("ship2", s): 600})
    held = ledger(b)
    assert str(held[("ship1", s)]) == "1-1500" and str(held[("ship2", s)]) == "1-600"
    eventually(
        lambda: _fully_in_sync(cluster, canonical_topic(s)),
        within=60,
        what="the restarted node back in every ISR",
    )


def _stack(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    cli = [sys.executable, "-m", "shorelink.cli", "stack"]
    return subprocess.run([*cli, *args], capture_output=True, text=True, timeout=300, check=check)


def test_stack_up_brokers_3_runs_each_site_as_a_secure_cluster(tmp_path: Path) -> None:
    """``shorelink stack up --brokers 3``: the site's Kafka is three nodes, each with
    SASL/SCRAM over TLS and ACLs as a one-node site's, and what the stack's admin creates
    is kept three times; ``status`` and ``down`` see every node."""
    d = tmp_path / "st"
    _stack(
        "up",
        "--sites",
        "hq",
        "--ships",
        "0",
        "--brokers",
        "3",
        "--dir",
        str(d),
        "--kafka-heap",
        "256m",
    )
    info = json.loads((d / "stack.json").read_text())
    nodes = info["sites"]["hq"]["nodes"]
    assert [n["node"] for n in nodes] == [1, 2, 3]
    bootstrap = info["sites"]["hq"]["kafka"]
    assert bootstrap == ",".join(n["kafka"] for n in nodes)
    try:
        st = json.loads(_stack("status", "--dir", str(d), "--json").stdout)
        kafka = {r["name"]: r["state"] for r in st if r["name"].startswith("kafka:")}
        assert kafka == {"kafka:hq/1": "up", "kafka:hq/2": "up", "kafka:hq/3": "up"}
        admin = KafkaEndpoint(bootstrap, load(d).admin_auth())
        topic = unique("dc")
        assert ensure_topics(admin, [TopicSpec(topic, partitions=2)]) == [topic]
        client = AdminClient(admin.client_config())

        def replicas() -> set[int]:
            # the broker asked may not know a topic just created yet (metadata spreads
            # to the others a moment later): wait for it rather than fail on KeyError
            md = client.list_topics(topic, timeout=20)
            assert set(md.brokers) == {1, 2, 3}
            known = md.topics.get(topic)
            if known is None or known.error is not None or len(known.partitions) != 2:
                return set()
            return {len(p.replicas) for p in known.partitions.values()}

        eventually(lambda: replicas() == {3}, what="the new topic's three replicas")
        (fut,) = client.describe_configs([ConfigResource("topic", topic)]).values()
        assert fut.result(timeout=20)["min.insync.replicas"].value == "2"
        with pytest.raises(KafkaException):
            plain = {"bootstrap.servers": bootstrap, "socket.timeout.ms": 3000}
            AdminClient(plain).list_topics(timeout=5)
    finally:
        down = _stack("down", "--dir", str(d))
    assert all(f"kafka:hq/{i}" in down.stdout for i in (1, 2, 3))
    assert not any(pid_alive(n["pid"]) for n in nodes)
