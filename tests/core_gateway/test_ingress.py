"""The gateway's ingress partitioned by origin (``kafka.ingress_by_origin``): what a site
whose merge is split by origin needs, each shard reading only the partitions of its
origins (docs/data-centre.md, "Scaling out")."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from core_gateway.auth import Credentials
from core_gateway.service import GatewayService
from local_stack.kafka import KafkaBroker
from shorelink.contract import H_ORIGIN, ingress_topic
from shorelink.kafka.admin import Admin
from shorelink.kafka.reading import read_to_end
from shorelink.shards import origin_partition
from tests.core_gateway.helpers import batch, gateway_config
from tests.helpers import unique


async def test_with_ingress_by_origin_every_record_of_a_ship_is_in_its_origins_partition(
    tmp_path: Path, kafka: KafkaBroker
) -> None:
    """A record in another partition than its origin's would be read by a shard that does
    not merge it, and never by the one that does: lost to the site. Records of one ship
    with many keys (containers) all land in ``crc32(origin) mod partitions``."""
    cfg = replace(gateway_config(tmp_path, kafka), decode_workers=0, ingress_by_origin=True)
    ships = [unique("ship") for _ in range(12)]
    creds = Credentials(cfg.credentials_file)
    for ship in ships:
        creds.add(ship)
    service = GatewayService(cfg)
    await service.start()
    try:
        for ship in ships:
            reply = await (await service.receive(ship, "containers", batch(ship, 1, 20)))
            assert reply["held"] == "1-20", reply
    finally:
        await service.stop()
    topic = ingress_topic("containers")
    seen: dict[str, set[int]] = {}
    for m in read_to_end(kafka.endpoint, [topic], settled=True):
        origin = dict(m.headers() or [])[H_ORIGIN].decode()
        if origin in ships:
            seen.setdefault(origin, set()).add(m.partition())
    assert set(seen) == set(ships)
    # the topic's own count: the session's broker is shared, and a test before this one
    # may have created the topic with another count than this config's (the gateway
    # partitions by what the topic has, never by its config: ensure_topics)
    (desc,) = Admin(kafka.endpoint).describe([topic]).values()
    parts = len(desc.partitions)
    assert all(seen[s] == {origin_partition(s, parts)} for s in ships), (parts, seen)
    assert len({p for ps in seen.values() for p in ps}) > 1  # the ships spread
