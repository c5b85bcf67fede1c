"""The relay index: which seqs lie where in a site's relay topics, so that a neighbour
using a route for the first time starts reading at what it lacks, not at the relay
topic's start (docs/replication.md, "A route's first use").

Writing (the merge, spark_core/merge.py). After each committed transaction the merge
has the seqs it wrote to each relay topic in its *tail*: per relay topic, the topic's
id, per partition the offset where the last segment ended (``to``), and the seqs per
origin written since (``pending``). The tail rides in the merge's marker (its own records:
where the last segment ended, and the seqs pending per origin), in the same
transaction as the records, so it is always what Kafka holds. Every
:data:`INDEX_EVERY_S` (asked from the merge's ingest puller's loop) the merge writes,
in a transaction of its own, one segment per relay topic with pending seqs into
:data:`~shorelink.contract.RELAY_INDEX_TOPIC`, all of a round in one record
(:func:`encode_round`; the form of one segment keyed by its topic, :func:`encode_segment`,
is what merges wrote before, still read): the relay topic, its id, per partition
``[from, to)`` (``from`` the tail's ``to``, ``to`` the partition's end now) and the
pending seqs; the tail moves to ``to`` with nothing pending. No transaction of the
merge is open then and the merge alone writes its relay topics, so every record in
``[from, to)`` is one whose seq was pending. A segment may name more seqs than its
records (records of an aborted transaction, a topic recreated between two segments:
its ``from`` is then 0), never fewer; one too large to write names none (``seqs``
null: a reader stops there).

Reading (spark_core/pull.py). For a relay topic it has no cursor in, a puller reads the
neighbour's index and walks each partition from its oldest offset (:func:`start_offsets`):
while the next segment of the topic's current id starts at or below the walk and the
site holds every seq it names, the walk moves to the segment's ``to``. The puller
starts there: everything skipped is held, and whatever it cannot prove held (a hole in
the chain, a segment it cannot read, records written before the index existed) it
reads. A neighbour that lies in its index can make a site skip records of its relay:
no more than it can do by leaving them out of the relay (docs/replication.md, "What a
hostile neighbour can and cannot do").
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from confluent_kafka import Message
from confluent_kafka.admin import OffsetSpec

from shorelink import strict_json
from shorelink.boundary import boundary
from shorelink.contract import CANONICAL_INDEX_TOPIC, RELAY_INDEX_TOPIC
from shorelink.kafka.admin import Admin
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.reading import read_to_end
from shorelink.logs import get_logger
from shorelink.ranges import RangeSet
from spark_core.errors import SparkCoreError

__all__ = [
    "INDEX_EVERY_S",
    "INDEX_SLACK_MS",
    "SEGMENT_MAX_BYTES",
    "IndexTooLarge",
    "Segment",
    "SegmentOf",
    "Tail",
    "decode_round",
    "dump_tail",
    "dump_tails",
    "encode_round",
    "encode_segment",
    "index_topic",
    "load_tail",
    "load_tails",
    "oldest_written_ms",
    "read_segments",
    "start_offsets",
]

log = get_logger(__name__)

#: how often a merge writes the seqs it relayed since the last segment (when it did)
INDEX_EVERY_S = 5.0
#: a segment larger than this names no seqs (a reader reads its records instead); far
#: below any topic's message size limit
SEGMENT_MAX_BYTES = 256 * 1024


@dataclass
class Tail:
    """Where a relay topic's index stands: the topic's id ("" before the topic
    existed), per partition the end of the last segment, the seqs per origin written
    to the topic since."""

    topic_id: str = ""
    to: dict[int, int] = field(default_factory=dict)
    pending: dict[str, RangeSet] = field(default_factory=dict)

    def copy(self) -> Tail:
        return Tail(self.topic_id, dict(self.to), {o: s.copy() for o, s in self.pending.items()})


def index_topic(topic: str) -> str:
    """Where the segments of ``topic`` go: :data:`RELAY_INDEX_TOPIC` for a relay topic
    (``sl.relay.<entry>.<stream>``), :data:`CANONICAL_INDEX_TOPIC` for a canonical one
    (``sl.<stream>``: spark_core/repair.py reads it), kept as long as what they index."""
    return RELAY_INDEX_TOPIC if topic.startswith("sl.relay.") else CANONICAL_INDEX_TOPIC


def dump_tail(tail: Tail) -> dict[str, object]:
    """Where a tail's last segment ended (its topic id, per partition its ``to``) as the
    marker keeps it (JSON), its pending seqs left out: the marker keeps those per origin
    (spark_core/merge_state.py, ``MergeState.marker_records``), so a transaction writes
    the seqs of the origins it wrote, not of every origin since the last segment."""
    return {"id": tail.topic_id, "to": {str(p): o for p, o in sorted(tail.to.items())}}


def load_tail(data: object) -> Tail:
    """A tail from :func:`dump_tail`, nothing pending; raises ValueError, KeyError or
    TypeError on a malformed one (the merge writes none such)."""
    if not isinstance(data, dict):
        raise ValueError(f"relay index tail: {data!r}")
    return Tail(str(data["id"]), {int(p): int(o) for p, o in data["to"].items()})


def dump_tails(tails: Mapping[str, Tail]) -> dict[str, object]:
    """The tails as a marker of the whole form keeps them (JSON, per topic, with their
    pending seqs)."""
    return {
        topic: {**dump_tail(t), "pending": {o: s.to_json() for o, s in sorted(t.pending.items())}}
        for topic, t in sorted(tails.items())
    }


def load_tails(data: object) -> dict[str, Tail]:
    """The tails from a marker of the whole form; raises ValueError, KeyError or
    TypeError on a malformed one (the merge writes none such)."""
    if not isinstance(data, dict):
        raise ValueError(f"relay index tails: {data!r}")
    out = {}
    for topic, t in data.items():
        tail = out[str(topic)] = load_tail(t)
        tail.pending = {str(o): RangeSet.from_json(s) for o, s in t["pending"].items()}
    return out


def _segment_doc(
    topic_id: str, parts: Mapping[int, tuple[int, int]], seqs: Mapping[str, RangeSet] | None
) -> dict[str, object]:
    return {
        "id": topic_id,
        "parts": {str(p): [lo, hi] for p, (lo, hi) in sorted(parts.items())},
        "seqs": None if seqs is None else {o: s.to_json() for o, s in sorted(seqs.items())},
    }


def encode_segment(
    topic: str, topic_id: str, parts: Mapping[int, tuple[int, int]], seqs: Mapping[str, RangeSet]
) -> tuple[bytes, bytes]:
    """A record of the index: key the relay topic, value JSON ``{"id", "parts": {p:
    [from, to]}, "seqs": {origin: ranges} | null}`` (null: too large to name them). The
    form merges wrote before :func:`encode_round`; readers still read it."""
    value = json.dumps(_segment_doc(topic_id, parts, seqs), separators=(",", ":")).encode()
    if len(value) > SEGMENT_MAX_BYTES:
        value = json.dumps(_segment_doc(topic_id, parts, None), separators=(",", ":")).encode()
    return topic.encode(), value


#: one topic's segment for :func:`encode_round`: topic, its id, per partition
#: ``(from, to)``, the seqs per origin written there
SegmentOf = tuple[str, str, Mapping[int, tuple[int, int]], Mapping[str, RangeSet]]


def encode_round(key: bytes, segments: Sequence[SegmentOf]) -> list[tuple[bytes, bytes]]:
    """The records of one round of the index (every topic that moved since the last
    one): value JSON ``{"round": {topic: segment}}``, a segment as :func:`encode_segment`
    writes one; as few records as :data:`SEGMENT_MAX_BYTES` allows (one, unless the
    seqs of the round pass it), so the records a second do not follow the number of
    relay topics (fleet issue, item 2). A segment too large alone names no seqs.
    ``key``: the writer's (its marker key: no topic's name, which old readers took a
    record's key for, so they skip it)."""
    out: list[tuple[bytes, bytes]] = []
    docs: list[str] = []
    size = 0

    def flush() -> None:
        nonlocal size
        if docs:
            out.append((key, ('{"round":{' + ",".join(docs) + "}}").encode()))
            docs.clear()
            size = 0

    for topic, topic_id, parts, seqs in sorted(segments, key=lambda seg: seg[0]):
        doc = _segment_doc(topic_id, parts, seqs)
        one = json.dumps(topic) + ":" + json.dumps(doc, separators=(",", ":"))
        if len(one) + 16 > SEGMENT_MAX_BYTES:
            doc = _segment_doc(topic_id, parts, None)
            one = json.dumps(topic) + ":" + json.dumps(doc, separators=(",", ":"))
        if size + len(one) + 16 > SEGMENT_MAX_BYTES:
            flush()
        docs.append(one)
        size += len(one) + 1
    flush()
    return out


class IndexTooLarge(SparkCoreError):
    """An index read that must be whole passed its byte limit."""


@dataclass(frozen=True)
class Segment:
    """One record of a neighbour's index, as read: ``seqs`` None when it names none."""

    topic: str
    topic_id: str
    parts: dict[int, tuple[int, int]]
    seqs: dict[str, RangeSet] | None
    #: when the index record was written (epoch ms; None where not read from Kafka)
    written_ms: int | None = None


@boundary
def decode_segment(key: bytes | None, value: bytes | None) -> Segment:
    """Parse one index record of the form keyed by its topic (a neighbour's: anything
    may come); raises ValueError (and its kin: KeyError, TypeError, AttributeError) on
    anything else. Strict JSON (shorelink/strict_json.py): nesting deeper than the
    parser follows is a ValueError, not a RecursionError that would escape the reader
    and stop the puller."""
    if not key or not value:
        raise ValueError("no key or value")
    if len(value) > SEGMENT_MAX_BYTES:  # encode_segment never writes one
        raise ValueError(f"a segment of {len(value)} bytes > {SEGMENT_MAX_BYTES}")
    return _segment(key.decode(), strict_json.loads(value))


@boundary
def decode_round(value: bytes | None) -> list[Segment]:
    """Parse one index record of :func:`encode_round`'s form (a neighbour's: anything
    may come): its segments, one per topic; raises as :func:`decode_segment`."""
    if not value:
        raise ValueError("no value")
    if len(value) > SEGMENT_MAX_BYTES:  # encode_round never writes one
        raise ValueError(f"a round of {len(value)} bytes > {SEGMENT_MAX_BYTES}")
    doc = strict_json.loads(value)
    return [_segment(str(topic), seg) for topic, seg in doc["round"].items()]


def _segment(topic: str, doc: Any) -> Segment:
    """A segment from its JSON document (parsed already, strict)."""
    seqs = doc["seqs"]
    parts = {int(p): (int(lo), int(hi)) for p, (lo, hi) in doc["parts"].items()}
    if any(lo < 0 or hi < lo for lo, hi in parts.values()):
        raise ValueError(f"bad offsets {doc['parts']!r}")
    return Segment(
        topic,
        str(doc["id"]),
        parts,
        None if seqs is None else {str(o): RangeSet.from_json(s) for o, s in seqs.items()},
    )


def read_segments(
    kafka: KafkaEndpoint,
    topics: Iterable[str],
    *,
    timeout: float,
    limit_bytes: int,
    since_ms: int | None = None,
    index: str = RELAY_INDEX_TOPIC,
    group: str = "shorelink-read-to-end",
    whole: bool = False,
) -> Iterator[Segment]:
    """The segments of ``topics`` in a site's ``index`` topic (at ``kafka``), in the
    order they were written, at most ``limit_bytes`` of the index read; a record that
    is no segment is skipped (counted in the log). ``since_ms``: from the first segment
    written at or after that time (:func:`oldest_written_ms`), not from the index's
    start. ``group``: as ``read_to_end``'s (a neighbour's ACLs name the groups its
    principal may use). ``whole``: past ``limit_bytes`` raise :class:`IndexTooLarge`
    instead of stopping (a reader that must see every segment). Raises what
    ``read_to_end`` raises (an index that does not exist:
    :class:`~shorelink.kafka.errors.UnknownTopic`)."""
    wanted_names = set(topics)
    wanted = {t.encode() for t in wanted_names}
    read = bad = 0
    starts = None
    if since_ms is not None:
        at = Admin(kafka).offsets([(index, 0)], OffsetSpec.for_timestamp(since_ms))
        offset = at[(index, 0)].offset
        if offset < 0:
            return  # nothing was written since then
        starts = {(index, 0): offset}
    msg: Message
    for msg in read_to_end(kafka, [index], timeout=timeout, starts=starts, group=group):
        value = msg.value()
        read += len(value or b"")
        if read > limit_bytes:
            if whole:
                raise IndexTooLarge(f"{index} at {kafka.bootstrap}: over {limit_bytes} bytes")
            log.warning("relay_index_cut", bootstrap=kafka.bootstrap, index=index, read_bytes=read)
            break
        key = msg.key() or b""
        if key.startswith(b"sl.") and key not in wanted:
            continue  # a segment of another topic (the form keyed by its topic)
        try:
            if key in wanted:
                segs = [decode_segment(key, value)]
            else:  # a round: every topic that moved, keyed by its writer
                segs = [seg for seg in decode_round(value) if seg.topic in wanted_names]
        except (ValueError, KeyError, TypeError, AttributeError):
            bad += 1
            continue
        _, ts = msg.timestamp()
        for seg in segs:
            yield replace(seg, written_ms=ts if ts >= 0 else None)
    if bad:
        log.warning("relay_index_bad", bootstrap=kafka.bootstrap, index=index, records=bad)


#: how much earlier than the oldest record a reader reads a neighbour's index from: a
#: segment is written after the records it spans (by the same merge, on the same clock)
INDEX_SLACK_MS = 60_000


def oldest_written_ms(kafka: KafkaEndpoint, parts: Iterable[tuple[str, int]]) -> int | None:
    """When the oldest record of any of ``parts`` (relay partitions) was written, less
    :data:`INDEX_SLACK_MS`: a segment of the index written before that spans only
    records retention deleted, and a reader need not read it (replication review N8:
    the index is kept as long as the longest-kept relay, so reading it from its start
    spent the read budget on dead segments). None when no partition holds a record.
    Reading from later than needed is safe: the walk stops at the first hole and reads
    from there."""
    answers = Admin(kafka).offsets(list(parts), OffsetSpec.for_timestamp(0))
    times = [a.timestamp for a in answers.values() if a.offset >= 0 and a.timestamp >= 0]
    return min(times) - INDEX_SLACK_MS if times else None


def start_offsets(
    segments: Iterable[Segment],
    topic: str,
    topic_id: str,
    lows: Mapping[int, int],
    holds: Callable[[str, RangeSet], bool],
) -> dict[int, int]:
    """Per partition of ``lows`` (its oldest offset), where a reader that holds what
    ``holds(origin, seqs)`` says starts reading ``topic`` (id ``topic_id``): the end of
    the chain of segments, from the oldest offset on, whose seqs it all holds."""
    at = dict(lows)
    stopped: set[int] = set()
    for seg in segments:
        if seg.topic != topic or seg.topic_id != topic_id:
            continue
        held: bool | None = None  # asked once per segment, only when it matters
        for part, (lo, hi) in seg.parts.items():
            if part not in at or part in stopped or hi <= at[part]:
                continue  # not read, decided, or wholly below the walk
            if lo > at[part]:
                stopped.add(part)  # a hole in the chain: read from here
                continue
            if held is None:
                held = seg.seqs is not None and all(holds(o, s) for o, s in seg.seqs.items())
            if held:
                at[part] = hi
            else:
                stopped.add(part)
    return at
