"""What a feed reads and from where: the pullers' decisions, apart from their Kafka work
(like ``merge_state.plan_batch`` beside the merge). Pure: the topics as the neighbour
described them, the merge's cursors and the relay index's first reads come in as
arguments; tests of the decisions need no broker.

A feed (spark_core/feed.py) asks, at each assignment:

1. :func:`plan_parts`: which partitions of the topics it wants exist, and under which
   source name the merge keeps each one's cursor. A pulled topic's source names its
   neighbour and topic id (``merge_state.pulled_source``), so a topic deleted and
   created again is a new source, read from its start; a topic whose id changed since
   the last description says so (the consumer's cached metadata belongs to the old one).
2. :func:`keep_parts`: of those, the ones read now: a neighbour's canonical topic only in
   the partitions that hold history still to read, and none of the topics dropped
   (this site's own relays once nothing is left to take back).
3. :func:`plan_starts`: where each partition starts: the merge's cursor, else where the
   relay index lets a first read start, else the partition's oldest record, or offset
   0 where a relay that retention already cut is a gap (a site that starts with
   nothing: what was lost comes from history).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence

from shorelink.kafka.reading import BEGINNING
from spark_core.merge_state import history_stream

__all__ = ["Part", "keep_parts", "plan_parts", "plan_starts"]

#: a partition: (topic, partition)
Part = tuple[str, int]


def plan_parts(
    described: Mapping[str, tuple[str, Sequence[int]]],
    wanted: Collection[str],
    ids: Mapping[str, str],
    source: Callable[[str, str], str],
) -> tuple[dict[str, str], dict[Part, str], dict[str, str], bool]:
    """Of ``wanted``, the topics ``described`` (topic -> its id and partitions) holds:
    their source names (``source(topic, topic_id)``), their partitions with the source
    of each, the topic ids known from now on (``ids``: as last described; a wanted topic
    gone is known as "": whatever comes back is a new topic), and whether a topic's id
    changed (deleted and created again under the feed)."""
    sources: dict[str, str] = {}
    parts: dict[Part, str] = {}
    known = dict(ids)
    renewed = False
    for topic in sorted(wanted):
        desc = described.get(topic)
        if desc is None:  # a neighbour's merge creates it with its first record
            if topic in known:
                known[topic] = ""
            continue
        topic_id, partitions = desc
        renewed |= known.get(topic, topic_id) != topic_id
        known[topic] = topic_id
        sources[topic] = source(topic, topic_id)
        for p in partitions:
            parts[(topic, p)] = sources[topic]
    return sources, parts, known, renewed


def keep_parts(
    parts: Mapping[Part, str],
    sources: Mapping[str, str],
    history: Collection[Part],
    dropped: Collection[str] = (),
) -> tuple[dict[Part, str], dict[str, str]]:
    """The partitions read now and their topics' sources: a canonical topic's
    partitions only where they hold history still to read (``history``), and no
    partition of a ``dropped`` topic."""
    kept = {
        tp: src
        for tp, src in parts.items()
        if tp[0] not in dropped and (history_stream(src) is None or tp in history)
    }
    topics = {tp[0] for tp in kept}
    return kept, {t: src for t, src in sources.items() if t in topics}


def plan_starts(
    parts: Mapping[Part, str],
    cursors: Mapping[tuple[str, int], int],
    first: Mapping[Part, int],
    *,
    from_zero: bool = False,
) -> dict[Part, int]:
    """Where each partition of ``parts`` (partition -> its source) starts: the merge's
    cursor for its source, else where its first read starts (``first``: past what the
    relay index proves held), else its oldest record; offset 0 instead with
    ``from_zero``, so that a partition retention already cut is reported as a gap."""
    out: dict[Part, int] = {}
    for (topic, part), source in sorted(parts.items()):
        start = cursors.get((source, part), first.get((topic, part)))
        out[(topic, part)] = start if start is not None else 0 if from_zero else BEGINNING
    return out
