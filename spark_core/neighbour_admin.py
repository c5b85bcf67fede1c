"""A neighbour's one admin client, shared by everything of a site that asks that
neighbour's Kafka for metadata, topics and offsets (:class:`SharedAdmin`)."""

from __future__ import annotations

import threading

from shorelink.kafka.admin import Admin
from shorelink.kafka.endpoint import KafkaEndpoint
from spark_core.config import SiteConfig

__all__ = ["SharedAdmin"]


class SharedAdmin:
    """One admin client of a neighbour's Kafka for everything of a site that asks it
    (the link probe, spark_core/routing.py ``NeighbourLink.admin``; the pullers of each
    merge and their repairers, spark_core/replication.py), made at the first question;
    librdkafka's client answers several threads at once. A site held an admin per
    puller, per repairer and per probe: 2m + 2m + 1 clients a neighbour for one's worth
    of metadata, describes and offsets (docs/data-centre.md, "A site's costs as
    neighbours grow").

    Its requests time out at the endpoint's timeout (:meth:`of_neighbour`: the site's
    ``replication.probe_timeout``), both each call's wait and librdkafka's
    ``socket.timeout.ms``, as the probe's own admin did: a request a neighbour gone
    silent never answers is dropped, and its connection closed, once that time is out,
    so the probe finds the neighbour down within its timeout and up at the first probe
    after it answers again (Kafka's 60 s default kept the dead connection, and every
    request queued on it, for a minute). Only small answers come through it (metadata,
    topics, offsets); the pullers' fetches, which can take seconds over a slow link, go
    through their readers, which keep Kafka's default."""

    def __init__(self, kafka: KafkaEndpoint) -> None:
        self.kafka = kafka
        self._admin: Admin | None = None
        self._lock = threading.Lock()

    @classmethod
    def of_neighbour(cls, site: SiteConfig, kafka: KafkaEndpoint) -> SharedAdmin:
        """``site``'s admin of a neighbour's ``kafka``: its calls wait at most the
        probe timeout."""
        return cls(kafka.with_timeout(site.replication.probe_timeout_s))

    def __call__(self) -> Admin:
        with self._lock:
            if self._admin is None:
                # librdkafka takes 10 ms to 5 minutes
                timeout_ms = min(300_000, max(10, int(self.kafka.timeout_s * 1000)))
                self._admin = Admin(self.kafka, {"socket.timeout.ms": timeout_ms})
            return self._admin
