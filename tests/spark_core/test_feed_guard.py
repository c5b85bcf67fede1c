"""A neighbour that forges records by the thousand is parked (review N5): checking a
forged proof costs ten times a genuine record, and the pullers share the merge with
the site's own ingest, so a forging neighbour would delay the site's own ships'
alerts. Its feed is not read a while; nothing is lost: after the park the genuine
records behind the forgeries are read and taken (on real Kafka: the neighbour's relay
topic, the site's merge)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from local_stack.kafka import KafkaBroker
from shorelink.contract import relay_topic
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.topics import TopicSpec, ensure_topics
from shorelink.proof import ShipKey, ShipKeys, WatchedShipKeys
from spark_core.feed_guard import FeedGuard
from spark_core.merge import Merger
from spark_core.pull import Puller
from tests.helpers import unique
from tests.spark_core.helpers import canonical, make_site, produce_raw, signed_relayed

KEY = ShipKey.generate()


def test_a_neighbour_that_forges_is_parked_and_its_genuine_records_come_after(
    kafka: KafkaBroker, kafka_sites: Callable[..., dict[str, KafkaBroker]], tmp_path: Path
) -> None:
    s = unique("s")
    neighbour = kafka_sites("tokyo")["tokyo"]
    ep = KafkaEndpoint.plaintext(neighbour.bootstrap)
    topic = relay_topic("e1", s)
    ensure_topics(ep, [TopicSpec(topic, 1)])
    produce_raw(neighbour.bootstrap, topic, signed_relayed(KEY, s, range(1, 301), forged=True))
    produce_raw(neighbour.bootstrap, topic, signed_relayed(KEY, s, range(1, 41)))
    keys_file = tmp_path / "ship_keys.toml"
    keys_file.write_text(ShipKeys.render({"bigblue": KEY.public()}, require_signatures=True))
    site, _ = make_site(kafka.bootstrap, tmp_path, [s])
    site = replace(site, replication=replace(site.replication, max_offsets_per_trigger=100))
    merger = Merger(site)
    merger.ship_keys = WatchedShipKeys(keys_file)
    now = [0.0]
    guard = FeedGuard(limit=150, window_s=60, park_s=600, clock=lambda: now[0])
    puller = Puller(
        site,
        "tokyo",
        ep,
        (s,),
        urgent=False,
        merger=merger,
        routes=lambda: {"e1": "tokyo"},
        sites=("e1",),
        guard=guard,
    )
    try:
        for _ in range(50):  # bounded: each round reads what is there, 100 at most
            if guard.parked():
                break
            puller.round()
        assert (guard.parked(), guard.unproved, puller.read) == (True, 200, 200)
        assert [puller.round() for _ in range(3)] == [0, 0, 0]  # parked: not read
        assert canonical(kafka.bootstrap, s) == []
        now[0] += 600  # the park is over: the rest is read and checked as ever
        for _ in range(50):
            if puller.round() == 0 and puller.idle:
                break
        assert (guard.unproved, guard.parks, puller.read) == (300, 1, 340)
        held = canonical(kafka.bootstrap, s)
        assert sorted(r.identity.seq for r in held) == list(range(1, 41))
        assert all(b"forged" not in r.value for r in held)
    finally:
        puller.close()
        merger.close()
