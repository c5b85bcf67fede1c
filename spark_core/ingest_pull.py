"""A merge's ingest puller: the site's own ingress topics read as a neighbour's relays
are (spark_core/feed.py), so a record's way from the gateway into the merge waits for
no Spark micro-batch. The merge's Spark query reads the same topics as a backstop
(``merge.backstop_interval``); the cursors are the same marker offsets, so whichever
reads a record first writes it, and the other skips it.

The ingest puller's loop also writes the merge's relay index when it is due
(``Merger.write_index``), and :func:`write_through` reads a Spark batch too large for
the driver through one, in slices of ``merge.max_batch_bytes``.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from shorelink.contract import ingress_topic
from spark_core.feed import Feed
from spark_core.merge import Merger
from spark_core.merge_state import MergeError
from spark_core.pull_plan import Part

__all__ = ["IngestPuller", "write_through"]


@dataclass
class IngestPuller(Feed):
    """Reads ``merger``'s own ingress topics (``topics``: these instead) into it."""

    #: the topics read (default: the ingress topics of ``streams``)
    topics: tuple[str, ...] = ()

    @classmethod
    def of(cls, merger: Merger, topics: tuple[str, ...] = ()) -> IngestPuller:
        site = merger.site
        return cls(
            site,
            site.name,
            site.kafka,
            merger.streams,
            urgent=all(s in site.urgent_streams for s in merger.streams),
            merger=merger,
            topics=topics,
        )

    @property
    def name(self) -> str:
        return f"ingest-{'urgent' if self.urgent else 'bulk'}"

    def wanted(self) -> frozenset[str]:
        return frozenset(self.topics or (ingress_topic(s) for s in self.streams))

    def source(self, topic: str, topic_id: str) -> str:
        return topic

    def narrow(
        self, parts: dict[Part, str], sources: dict[str, str]
    ) -> tuple[dict[Part, str], dict[str, str]]:
        # a shard of a merge split by origin reads the partitions of its origins
        # (shorelink/shards.py), as its Spark query does (``Merger.assignment``)
        shard = self.merger.shard
        if shard is None:
            return parts, sources
        counts = Counter(topic for topic, _ in parts)
        return {tp: s for tp, s in parts.items() if shard.reads(tp[1], counts[tp[0]])}, sources

    def described(self, ids: Mapping[str, str]) -> list[str]:
        # a source is named by its topic here, so a topic deleted and created again
        # under the site (review N11) is told by its id: its cursors go, and it is read
        # from its start
        return self.merger.adopt_sources(ids)

    def after_turn(self) -> None:
        self.merger.write_index()  # the merge's own loop: its relay index, when due


def write_through(merger: Merger, ends: Mapping[Part, int]) -> None:
    """Write the source partitions of a merge's Spark batch up to ``ends`` (next offsets)
    through an ingest puller of the site's own Kafka: slices of at most
    ``merge.max_batch_bytes``, each one transaction with its cursors
    (``Merger.write_pulled``). How the merge takes a batch too big for the driver
    (``Merger.process_batch``). A slice that fails fails the batch (Spark replays it;
    the slices committed stay, and are skipped as written)."""
    site = merger.site
    puller = IngestPuller.of(merger, tuple(sorted({topic for topic, _ in ends})))
    stalled_after = site.kafka.timeout_s * 2
    progress = time.monotonic()
    try:
        while not puller.reached(ends):
            if merger.stopping.is_set():
                raise MergeError("merge is stopping; batch left for the next run")
            if puller.round():
                progress = time.monotonic()
            elif time.monotonic() - progress > stalled_after:
                raise MergeError(f"no record of the batch read for {stalled_after:.0f}s")
    finally:
        puller.close()
