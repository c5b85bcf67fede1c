"""A site's pullers in one thread per merge (spark_core/feed_loop.py): the threads of a
site's replication do not grow with its neighbours (issue "A fleet's worth": a thread
per neighbour and merge was 2.0 threads a neighbour, docs/data-centre.md), and every
neighbour's records are still merged exactly once, a neighbour that is down holding
up none of the others. Real Kafka: the site's own broker, and one broker holding
every neighbour's relay topics (as bench/site_scale.py does)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import Producer

from local_stack.kafka import KafkaBroker
from local_stack.process import free_port
from shorelink.contract import relay_topic
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.topics import TopicSpec, ensure_topics
from spark_core.config import parse_config
from spark_core.jobs.site import mergers
from spark_core.replication import Replicator
from tests.helpers import eventually, unique
from tests.spark_core.helpers import canonical, graph_doc, record

SHIPS_RECORDS = 150


def _site_threads(site: str) -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.endswith(f"@{site}")]


def _replicate(
    kafka: KafkaBroker,
    far: KafkaBroker,
    tmp_path: Path,
    neighbours: int,
    *,
    dead: int = 0,
) -> tuple[list[str], set[tuple[str, int]]]:
    """A site with ``neighbours`` neighbours on ``far`` (and ``dead`` more whose Kafka
    does not answer), each bringing one ship's records in its relay topic: the names of
    the site's pulling threads while it runs, and the identities it merged."""
    s = unique("s")
    site_name = unique("port")
    live = [unique("n") for _ in range(neighbours)]
    gone = [unique("gone") for _ in range(dead)]
    edges = {site_name: live + gone} | {n: [site_name] for n in live + gone}
    doc = graph_doc(
        edges, tmp_path / site_name, replication={"probe_interval": "200ms", "probe_timeout": "2s"}
    )
    for name in edges:
        broker = kafka.bootstrap if name == site_name else far.bootstrap
        if name in gone:
            broker = f"127.0.0.1:{free_port()}"
        doc["sites"][name] |= {"streams": [s, "alerts"], "kafka": {"bootstrap": broker}}
    cfg = parse_config(doc)
    site = cfg.site(site_name)
    ep = KafkaEndpoint.plaintext(far.bootstrap)
    ensure_topics(ep, [TopicSpec(relay_topic(n, s), 2) for n in live])
    p = Producer({"bootstrap.servers": far.bootstrap, "enable.idempotence": True})
    for n in live:
        for q in range(1, SHIPS_RECORDS + 1):
            r = record(f"ship-{n}", s, q, key=f"c{q % 5}")
            p.produce(relay_topic(n, s), key=r.key, value=r.value, headers=r.headers())
    assert p.flush(30) == 0
    merges = mergers(site, cfg)
    replicator = Replicator(cfg, site, merges)
    want = {(f"ship-{n}", q) for n in live for q in range(1, SHIPS_RECORDS + 1)}
    try:
        replicator.start()
        threads = _site_threads(site_name)

        def merged() -> list[tuple[str, int]]:
            return [(r.identity.origin, r.identity.seq) for r in canonical(kafka.bootstrap, s)]

        eventually(lambda: set(merged()) >= want, 120, "every neighbour's records merged")
        held = merged()
        assert len(held) == len(set(held)), "a record merged twice"
        return threads, set(held)
    finally:
        replicator.stop()
        for m in merges:
            m.close()


def test_a_sites_pulling_threads_do_not_grow_with_its_neighbours(
    kafka: KafkaBroker, kafka_sites: Callable[..., dict[str, KafkaBroker]], tmp_path: Path
) -> None:
    """Two neighbours or five: the same threads pull (an ingest puller per merge, a
    loop per merge for every neighbour's pullers), and every neighbour's ship is merged
    once. (A thread per neighbour and merge before: 4 more threads for 3 more
    neighbours.)"""
    far = kafka_sites("tokyo")["tokyo"]
    few, held_few = _replicate(kafka, far, tmp_path, 2)
    many, held_many = _replicate(kafka, far, tmp_path, 5)
    assert len(few) == len(many), (few, many)
    assert sum("pull-loop" in t for t in many) == 2  # one a merge: urgent and bulk
    assert len({o for o, _ in held_few}) == 2 and len({o for o, _ in held_many}) == 5


def test_a_neighbour_whose_kafka_does_not_answer_holds_up_none_of_the_others(
    kafka: KafkaBroker, kafka_sites: Callable[..., dict[str, KafkaBroker]], tmp_path: Path
) -> None:
    """Two neighbours of three answer; the third's Kafka is not there. Its pullers
    share their loop with the others', which merge every record of theirs once."""
    far = kafka_sites("tokyo")["tokyo"]
    _, held = _replicate(kafka, far, tmp_path, 2, dead=1)
    assert len({o for o, _ in held}) == 2
