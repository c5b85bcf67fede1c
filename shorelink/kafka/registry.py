"""The fleet registry at a site's Kafka (docs/fleet-registry.md, "How it travels"):
headquarters :func:`publish` es its entries into its own ``sl.ingress.registry``, and
every gateway and Spark application reads its site's ``sl.registry`` through a
:class:`RegistryFeed` into a :class:`~shorelink.fleet.follow.RegistryFollower`, which
decides what to take.
"""

from __future__ import annotations

from confluent_kafka import Message

from shorelink.contract import H_ORIGIN, H_SEQ, canonical_topic, ingress_topic
from shorelink.fleet.entry import FLEET_ORIGIN, REGISTRY_STREAM, Entry, RegistryError
from shorelink.fleet.follow import RegistryFollower
from shorelink.fleet.log import Registry
from shorelink.fleet.travel import entry_record, retired_proofs
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.errors import UnknownTopic
from shorelink.kafka.reading import TopicFollower, read_to_end
from shorelink.kafka.topics import Durability, ensure_topics, ingress_spec, producer
from shorelink.logs import get_logger

__all__ = ["RegistryFeed", "entry_records", "held_version", "publish"]

log = get_logger(__name__)


def held_version(kafka: KafkaEndpoint, timeout: float = 30.0) -> int:
    """The newest entry version ``kafka``'s ``sl.registry`` holds (0: none, or no topic)."""
    top = 0
    try:
        for msg in read_to_end(kafka, [canonical_topic(REGISTRY_STREAM)], timeout=timeout):
            headers = dict(msg.headers() or [])
            seq = headers.get(H_SEQ)
            if headers.get(H_ORIGIN) == FLEET_ORIGIN.encode() and seq and seq.isdigit():
                top = max(top, int(seq))
    except UnknownTopic:
        return 0
    return top


def entry_records(
    registry: Registry, site: str, since: int
) -> tuple[list[Entry], list[tuple[bytes, bytes, list[tuple[str, str | bytes | None]]]]]:
    """The entries past version ``since`` and their records as ``site``'s ingress takes
    them (:func:`~shorelink.fleet.travel.entry_record`): those signed by the fleet key in
    force proved by it, those signed before a rotation by the chunks the retired key
    signed then (``fleet.retired``). :class:`RegistryError` if one cannot be proved."""
    every = registry.entries()
    entries = [e for e in every if e.version > since]
    if not entries:
        return [], []
    key = registry.fleet_key()
    old = {e.version for e in entries if e.signer != key.id}  # signed before a rotation
    kept = retired_proofs(every, registry.retired(), old) if old else {}
    return entries, [entry_record(e, key, site, kept.get(e.version)) for e in entries]


def publish(
    registry: Registry,
    kafka: KafkaEndpoint,
    site: str,
    durability: Durability | None = None,
    since: int | None = None,
) -> list[int]:
    """Write into ``site``'s ``sl.ingress.registry`` (at ``kafka``) every entry past
    what its ``sl.registry`` holds (or past ``since``); return their versions. Writing
    one again is harmless: the merge keeps one copy of an identity."""
    ensure_topics(kafka, [ingress_spec(REGISTRY_STREAM, 1)], durability)
    start = held_version(kafka) if since is None else since
    entries, records = entry_records(registry, site, start)  # all refused or none written
    if not entries:
        return []
    p = producer(kafka, {"enable.idempotence": True})
    topic = ingress_topic(REGISTRY_STREAM)
    failed: list[str] = []

    def delivered(err: object, _msg: object) -> None:
        if err is not None:
            failed.append(str(err))

    for k, v, headers in records:
        p.produce(topic, v, k, headers=headers, on_delivery=delivered)
        p.poll(0)
    left = p.flush(kafka.timeout_s)
    if left or failed:
        why = failed[0] if failed else f"{left} records not acknowledged in time"
        raise RegistryError(f"publishing to {topic} at {kafka.bootstrap} failed: {why}")
    return [e.version for e in entries]


class RegistryFeed(TopicFollower):
    """Reads ``kafka``'s ``sl.registry`` (read_committed, from its beginning) on a
    thread of its own into ``follower``; never takes its process down."""

    wait_s = 1.0
    poll_s = 0.2

    def __init__(self, kafka: KafkaEndpoint, follower: RegistryFollower) -> None:
        super().__init__(kafka, canonical_topic(REGISTRY_STREAM), "registry")
        self.follower = follower

    def take(self, records: list[Message]) -> None:
        moved = False
        for msg in records:
            moved = self.follower.take(msg.key(), msg.value(), msg.headers()) or moved
        if moved:
            self.follower.changed()
