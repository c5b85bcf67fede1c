"""Repair by identity (anti-entropy): a site compares what each neighbour holds with
what it holds, and takes what it lacks from the neighbour's canonical topic.

Replication moves records along relay topics and cursors; any bug there, a relay's
retention, a wiped topic or a neighbour that withholds can leave a site without a
record another site holds, and nothing else would notice. Every
``replication.repair_interval`` the site's repairer, per neighbour it can reach and
per merge:

1. reads the neighbour's ``sl.ledger`` (compacted: per ``(origin, stream)`` the seqs it
   holds; read on from where the last round stopped, so a round costs what changed);
2. finds what the neighbour held at the *previous* round that this site still lacks
   (:func:`lacking`): a record on its way through the relays a moment ago is not
   repaired, one that has not come within a whole interval is;
3. finds those seqs in the neighbour's ``sl.canonical.index`` (the merge's index of its
   canonical topics, spark_core/relay_index.py) and reads only the offset ranges whose
   segments name them (:func:`plan_reads`); records written before the index, or in a
   hole of its chain, are looked for in the offsets no segment covers;
4. hands the records it lacks to the merge (``Merger.write_pulled``, one transaction,
   the cursors left as they are): the merge checks each as it checks any record from a
   neighbour (contract, ship proof, the ledger: written once), and relays it on under
   its entry, so the sites behind get it too.

What was repaired is counted per neighbour and stream; what the neighbour claims and
does not serve (retention took it, or its ledger lies), or serves and the merge does not
take (its ship's proof fails), is counted as ``unserved`` and not looked for there
again while the application runs. ``replication.status.json`` says per
site whether it holds everything its neighbours hold, else the difference
(docs/replication.md, "Repair by identity").
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from confluent_kafka import Message
from confluent_kafka.admin import OffsetSpec

from shorelink.contract import (
    CANONICAL_INDEX_TOPIC,
    H_ORIGIN,
    H_SEQ,
    LEDGER_TOPIC,
    ContractError,
    canonical_topic,
)
from shorelink.kafka.admin import Admin
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.errors import UnknownTopic
from shorelink.kafka.reading import PartitionReader, read_to_end, written_ms
from shorelink.ledger import decode_entry
from shorelink.logs import get_logger
from shorelink.ranges import RangeSet
from spark_core.access import pull_group
from spark_core.merge import Merger
from spark_core.merge_state import Headers, MergeError, Source, SourceRow, pulled_source
from spark_core.neighbour_admin import SharedAdmin
from spark_core.relay_index import IndexTooLarge, Segment, read_segments

__all__ = [
    "Repairer",
    "SelfCheck",
    "gone_early",
    "lacking",
    "plan_reads",
    "read_ranges",
    "remaining",
]

log = get_logger(__name__)

Part = tuple[str, int]
#: offset ranges ``[lo, hi)`` per partition
Ranges = dict[int, list[tuple[int, int]]]


def lacking(
    theirs: Mapping[Source, RangeSet], ours: Mapping[Source, RangeSet], streams: Iterable[str]
) -> dict[Source, RangeSet]:
    """Per ``(origin, stream)`` of ``streams``: the seqs ``theirs`` holds and ``ours``
    does not (none where it lacks nothing)."""
    wanted = set(streams)
    out = {}
    for source, held in theirs.items():
        if source[1] in wanted:
            diff = held.difference(ours.get(source) or RangeSet())
            if diff:
                out[source] = diff
    return out


def plan_reads(
    segments: Iterable[Segment],
    topic: str,
    topic_id: str,
    marks: Mapping[int, tuple[int, int]],
    lack: Mapping[str, RangeSet],
) -> Ranges:
    """Per partition of ``marks`` (its oldest offset and its end), the offset ranges of
    ``topic`` (id ``topic_id``) to read for the seqs of ``lack`` (per origin): the
    ranges of the segments that name one of them, a segment that names none (too
    large to) whole, and, when some lacking seq is named by no segment, every offset no
    segment covers (written before the index, or in a hole of its chain). Ranges are
    cut to what the partition holds, sorted and merged."""
    want: dict[int, list[tuple[int, int]]] = {p: [] for p in marks}
    covered: dict[int, list[tuple[int, int]]] = {p: [] for p in marks}
    named = {origin: RangeSet() for origin in lack}
    for seg in segments:
        if seg.topic != topic or seg.topic_id != topic_id:
            continue
        hit = seg.seqs is None
        if seg.seqs is not None:
            for origin, seqs in seg.seqs.items():
                if origin in named:
                    named[origin].update(seqs)
                    if any(lack[origin].overlaps(lo, hi) for lo, hi in seqs):
                        hit = True
        for part, (lo, hi) in seg.parts.items():
            if part in marks:
                covered[part].append((lo, hi))
                if hit:
                    want[part].append((lo, hi))
    unnamed = any(seqs.difference(named[origin]) for origin, seqs in lack.items())
    out: Ranges = {}
    for part, (low, end) in marks.items():
        ranges = list(want[part])
        if unnamed:
            ranges += _uncovered(covered[part], low, end)
        merged = _merge([(max(lo, low), min(hi, end)) for lo, hi in ranges])
        if merged:
            out[part] = merged
    return out


def _uncovered(covered: list[tuple[int, int]], low: int, end: int) -> list[tuple[int, int]]:
    out = []
    at = low
    for lo, hi in _merge(covered):
        if lo > at:
            out.append((at, lo))
        at = max(at, hi)
    if at < end:
        out.append((at, end))
    return out


def _merge(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(r for r in ranges if r[0] < r[1]):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


#: how much younger than its retention a segment must be for its records' absence to be
#: a loss, not retention doing its work (retention acts on whole log segments, a little
#: after their time)
RETENTION_SLACK_MS = 10 * 60_000


def gone_early(
    segments: Iterable[Segment],
    topic: str,
    topic_id: str,
    lows: Mapping[int, int],
    now_ms: int,
    retention_ms: int | None,
    present: Mapping[str, RangeSet] | None = None,
    unsettled: Mapping[int, int] | None = None,
) -> dict[str, RangeSet]:
    """Per origin, the seqs a site's own canonical ``topic`` (id ``topic_id``, each
    partition's oldest offset in ``lows``) no longer holds though its retention
    (``retention_ms``, None: for ever) has not passed: named by a segment of its index
    that deletion cut (an offset range starting below its partition's oldest offset, or
    of a former topic id: the topic was deleted and created again), written less than
    the retention ago; less what ``present`` says those segments' remaining offsets
    hold (:func:`remaining`, read by the caller) and what any segment deletion did not
    touch names (a seq lost and written again since). ``unsettled``: partitions whose
    oldest offset moved to where it stands here too recently to be acted on (their
    ``lows`` are where it was): a segment with records below that is taken as
    untouched, its seqs held (which of them lay in that partition is not known)."""
    gone: dict[str, RangeSet] = {}
    kept: dict[str, RangeSet] = {}
    for seg in segments:
        if seg.topic != topic or seg.seqs is None:
            continue
        if _deferred(seg, topic_id, unsettled):
            into: dict[str, RangeSet] | None = kept
        elif _cut(seg, topic_id, lows):
            young = retention_ms is None or (
                seg.written_ms is not None
                and now_ms - seg.written_ms < retention_ms - RETENTION_SLACK_MS
            )
            into = gone if young else None
        else:
            into = kept
        if into is not None:
            for origin, seqs in seg.seqs.items():
                into.setdefault(origin, RangeSet()).update(seqs)
    out = {}
    for origin, seqs in gone.items():
        rest = seqs.difference(kept.get(origin) or RangeSet())
        rest = rest.difference((present or {}).get(origin) or RangeSet())
        if rest:
            out[origin] = rest
    return out


def _deferred(seg: Segment, topic_id: str, unsettled: Mapping[int, int] | None) -> bool:
    """Does ``seg`` hold records a move not acted on yet may have taken?"""
    if not unsettled or seg.topic_id != topic_id:
        return False
    return any(
        hi > lo and p in unsettled and lo < unsettled[p] for p, (lo, hi) in seg.parts.items()
    )


def _cut(seg: Segment, topic_id: str, lows: Mapping[int, int]) -> bool:
    """Did deletion take some of ``seg``'s records (or the whole topic it indexed)?"""
    spans = [(p, lo, hi) for p, (lo, hi) in seg.parts.items() if hi > lo]
    return bool(spans) and (
        seg.topic_id != topic_id or any(lo < lows.get(p, 0) for p, lo, _ in spans)
    )


def remaining(
    segments: Iterable[Segment],
    topic: str,
    topic_id: str,
    lows: Mapping[int, int],
    unsettled: Mapping[int, int] | None = None,
) -> Ranges:
    """The offsets the topic still holds of the segments deletion cut (where their
    seqs may still lie): what a self-check reads before it forgets anything (none of a
    segment :func:`gone_early` takes as untouched for ``unsettled``)."""
    out: dict[int, list[tuple[int, int]]] = {}
    for seg in segments:
        if seg.topic != topic or seg.topic_id != topic_id or not _cut(seg, topic_id, lows):
            continue
        if _deferred(seg, topic_id, unsettled):
            continue
        for p, (lo, hi) in seg.parts.items():
            start = max(lo, lows.get(p, 0))
            if hi > start:
                out.setdefault(p, []).append((start, hi))
    return {p: _merge(r) for p, r in out.items()}


class SelfCheck:
    """A site's own canonical topics against its ledger (per merge): what a topic lost
    before its retention (records deleted, the topic wiped and created again) is
    forgotten (``Merger.forget``), so the site lacks it again and its neighbours'
    holdings bring it back by repair. Looked at when a partition's oldest offset moved
    (or the topic's id changed) since the last look, and the move has held for
    ``replication.self_check_settle`` (:attr:`settle_s`): Kafka writes a partition's new
    start offset down only every ``log.flush.start.offset.checkpoint.interval.ms`` (60 s
    by default), and a broker that crashes before brings records deleted by
    ``delete_records`` back. Forgotten and repaired meanwhile, they would be in the
    topic twice (found by the fault soak, bench/soak.py)."""

    def __init__(self, merger: Merger) -> None:
        self.merger = merger
        self.site = merger.site
        self.settle_s = merger.site.replication.self_check_settle_s
        #: monotonic seconds (a test's own clock: the settle time is what it tests)
        self.clock: Callable[[], float] = time.monotonic
        #: per canonical topic: its id and its partitions' oldest offsets at the last look
        #: acted on
        self._seen: dict[str, tuple[str, dict[int, int]]] = {}
        #: per canonical topic under the id it was acted on under: per partition whose
        #: oldest offset moved since, where it stands and since when it has held there
        self._moved: dict[str, tuple[str, dict[int, tuple[int, float]]]] = {}
        #: per canonical topic first looked at with records deleted, or created again: its
        #: id and oldest offsets, and since when they have held (settled as one)
        self._whole: dict[str, tuple[str, dict[int, int], float]] = {}
        #: per stream: seqs forgotten since the start
        self.forgotten: Counter[str] = Counter()
        self._admin: Admin | None = None

    def admin(self) -> Admin:
        if self._admin is None:
            self._admin = Admin(self.site.kafka)
        return self._admin

    def round(self) -> int:
        """Look, forget what was lost; returns the seqs forgotten."""
        topics = {canonical_topic(s): s for s in self.merger.streams}
        described = self.admin().describe(topics)
        total = 0
        for topic, desc in sorted(described.items()):
            parts = [(topic, p.id) for p in desc.partitions]
            lows = {
                p: a.offset
                for (_, p), a in self.admin().offsets(parts, OffsetSpec.earliest()).items()
            }
            total += self._look(topics[topic], topic, str(desc.topic_id), lows)
        return total

    def _look(self, stream: str, topic: str, topic_id: str, lows: dict[int, int]) -> int:
        """One topic: what of its move has held for :attr:`settle_s`, acted on. Per
        partition: a busy topic whose retention moves some partition more often than
        that put off a deletion on another for good when the whole topic's timer
        started again at every move (review 9, finding 10). The look is recorded as
        acted on only once the check went through: one that failed is tried again at
        the next round (finding 6: the deletion it detected was never acted on)."""
        seen = self._seen.get(topic)
        if seen is None and not any(lows.values()):
            seen = self._seen[topic] = (topic_id, lows)
        if seen == (topic_id, lows):
            self._moved.pop(topic, None)
            self._whole.pop(topic, None)
            return 0  # nothing deleted since the last look (or the deletion undone)
        now = self.clock()
        if seen is None or seen[0] != topic_id:  # nothing to compare with partition-wise
            whole = self._whole.get(topic)
            if whole is None or whole[:2] != (topic_id, lows):
                self._whole[topic] = (topic_id, lows, now)
                if self.settle_s > 0:
                    return 0  # a move first seen: looked at again once it has held
            elif now - whole[2] < self.settle_s:
                return 0
            count = self._check(stream, topic, topic_id, lows)
            self._whole.pop(topic, None)
            self._moved.pop(topic, None)
            self._seen[topic] = (topic_id, lows)
            return count
        acted = seen[1]
        was = self._moved.get(topic)
        before = was[1] if was is not None and was[0] == topic_id else {}
        marks: dict[int, tuple[int, float]] = {}
        for p, low in lows.items():
            if low == acted.get(p, 0):
                continue  # not moved (or moved back: a deletion undone)
            mark = before.get(p)
            marks[p] = mark if mark is not None and mark[0] == low else (low, now)
        settled = {p: low for p, (low, at) in marks.items() if now - at >= self.settle_s}
        self._moved[topic] = (topic_id, marks)
        if not settled:
            return 0
        acting = {p: acted.get(p, 0) for p in lows} | settled
        unsettled = {p: low for p, (low, _) in marks.items() if p not in settled}
        count = self._check(stream, topic, topic_id, acting, unsettled)
        self._seen[topic] = (topic_id, acting)
        self._moved[topic] = (topic_id, {p: m for p, m in marks.items() if p not in settled})
        return count

    def _check(
        self,
        stream: str,
        topic: str,
        topic_id: str,
        lows: dict[int, int],
        unsettled: Mapping[int, int] | None = None,
    ) -> int:
        retention = self.site.policy(stream).retention_ms
        now = int(time.time() * 1000)
        try:
            segments = list(
                read_segments(
                    self.site.kafka,
                    [topic],
                    timeout=self.site.kafka.timeout_s,
                    limit_bytes=self.site.merge.max_batch_bytes,
                    since_ms=None if retention is None else now - retention,
                    index=CANONICAL_INDEX_TOPIC,
                    whole=True,
                )
            )
        except UnknownTopic:
            return 0
        except IndexTooLarge as exc:  # a partial view could forget what is still held
            log.warning("self_check_skipped", site=self.site.name, topic=topic, error=str(exc))
            return 0
        present: dict[str, RangeSet] = {}
        reads = remaining(segments, topic, topic_id, lows, unsettled)
        what = f"self-check of {topic} at {self.site.name}"
        for m in read_ranges(self.site.kafka, pull_group(self.site.name), what, topic, reads):
            ident = _identity(list(m.headers() or []))  # type: ignore[arg-type]
            if ident is not None:
                present.setdefault(ident[0], RangeSet()).add(ident[1])
        lost = gone_early(segments, topic, topic_id, lows, now, retention, present, unsettled)
        if not lost:
            return 0
        forgotten = self.merger.forget({(o, stream): seqs for o, seqs in lost.items()})
        count = sum(seqs.count() for seqs in forgotten.values())
        if count:
            self.forgotten[stream] += count
            log.warning(
                "canonical_lost",
                site=self.site.name,
                stream=stream,
                seqs=count,
                origins=len(forgotten),
                message="records the canonical topic lost before its retention; "
                "forgotten, to be repaired from the neighbours that hold them",
            )
        return count


def _identity(headers: Headers) -> tuple[str, int] | None:
    """A record's origin and seq from its headers (the last of each, as the contract
    reads them); None when they do not parse (the merge's own check judges it)."""
    origin = seq = None
    for k, v in headers:
        if k == H_ORIGIN and v is not None:
            origin = v
        elif k == H_SEQ and v is not None:
            seq = v
    if origin is None or seq is None:
        return None
    try:
        text = origin.decode() if isinstance(origin, bytes) else origin
        return text, int(seq)
    except (UnicodeDecodeError, ValueError):
        return None


@dataclass
class Neighbourhood:
    """What a repairer knows of its neighbour's holdings."""

    #: per (origin, stream), the seqs the neighbour's ledger says it holds
    held: dict[Source, RangeSet] = field(default_factory=dict)
    #: where its ledger was read to, and the ledger topic's id then
    next_offset: int = 0
    topic_id: str = ""


class Repairer:
    """Repairs ``merger``'s streams at ``site`` from ``neighbour`` (its Kafka at
    ``kafka``); :meth:`round` once per ``replication.repair_interval``. Not
    thread-safe: one thread runs it."""

    def __init__(
        self,
        neighbour: str,
        kafka: KafkaEndpoint,
        merger: Merger,
        shared_admin: SharedAdmin | None = None,
    ) -> None:
        self.site = merger.site
        self.neighbour = neighbour
        self.kafka = kafka
        self.merger = merger
        self.streams = tuple(s for s in merger.streams if s in self.site.streams)
        self.known = Neighbourhood()
        #: what the neighbour held at the last round (what this round repairs)
        self._before: dict[Source, RangeSet] = {}
        #: per (origin, stream): seqs looked for at the neighbour and not found there
        self.unserved: dict[Source, RangeSet] = {}
        #: per stream: the seqs the neighbour holds that this site lacks (last round)
        self.lacking: dict[str, int] = {}
        self.repaired: Counter[str] = Counter()
        self.unproved = 0
        self.rounds = 0
        self.read = 0
        self.last_round: float | None = None
        self.error: str | None = None
        self._admin: Admin | None = None
        #: the admin client it shares with the pullers of its neighbour (None: its own)
        self.shared_admin = shared_admin

    @property
    def name(self) -> str:
        return f"repair-{self.neighbour}-{self.merger.query}"

    def admin(self) -> Admin:
        if self._admin is None:
            shared = self.shared_admin or SharedAdmin.of_neighbour(self.site, self.kafka)
            self._admin = shared()
        return self._admin

    # -- a round ---------------------------------------------------------------------------
    def round(self) -> int:
        """Compare, then repair what the neighbour held a whole round ago and this site
        still lacks. Returns the records written. Raises the tree's KafkaClientError or
        MergeError (the caller logs it and tries again next round)."""
        if not self.streams:
            return 0
        self._read_ledger()
        ours = self.merger.ready().held
        now = {s: held for s, held in self.known.held.items() if s[1] in self.streams}
        self.lacking = Counter()
        for (_, stream), seqs in lacking(now, ours, self.streams).items():
            self.lacking[stream] += seqs.count()
        due = lacking(self._before, ours, self.streams)
        self._before = {s: held.copy() for s, held in now.items()}
        written = 0
        for stream in sorted({s for _, s in due}):
            lack = {
                origin: rest
                for (origin, s), seqs in due.items()
                if s == stream
                and (rest := seqs.difference(self.unserved.get((origin, s)) or RangeSet()))
            }
            if lack:
                written += self._repair(stream, lack)
        self.rounds += 1
        self.last_round = time.time()
        self.error = None
        return written

    def _read_ledger(self) -> None:
        """Read the neighbour's ``sl.ledger`` on from where the last round stopped (from
        its start when the topic is new, or was recreated)."""
        described = self.admin().describe([LEDGER_TOPIC], f" at {self.neighbour}")
        if LEDGER_TOPIC not in described:
            return  # a neighbour whose merge has not run yet holds nothing
        topic_id = str(described[LEDGER_TOPIC].topic_id)
        if topic_id != self.known.topic_id:
            self.known = Neighbourhood(topic_id=topic_id)
        starts = {(LEDGER_TOPIC, 0): self.known.next_offset}
        bad = 0
        for msg in read_to_end(
            self.kafka,
            [LEDGER_TOPIC],
            timeout=self.kafka.timeout_s,
            starts=starts,
            group=pull_group(self.site.name),
        ):
            self.known.next_offset = (msg.offset() or 0) + 1
            try:
                origin, stream, held = decode_entry(msg.key(), msg.value())
            except ContractError:
                bad += 1
                continue
            self.known.held[(origin, stream)] = held
        if bad:
            log.warning("repair_ledger_bad", neighbour=self.neighbour, records=bad)

    def _repair(self, stream: str, lack: dict[str, RangeSet]) -> int:
        topic = canonical_topic(stream)
        described = self.admin().describe([topic], f" at {self.neighbour}")
        if topic not in described:
            return 0
        desc = described[topic]
        topic_id = str(desc.topic_id)
        marks = self._marks([(topic, p.id) for p in desc.partitions])
        if not marks:
            self._unserved(stream, lack)
            return 0
        try:
            segments = list(
                read_segments(
                    self.kafka,
                    [topic],
                    timeout=self.kafka.timeout_s,
                    limit_bytes=self.site.merge.max_batch_bytes,
                    index=CANONICAL_INDEX_TOPIC,
                    group=pull_group(self.site.name),
                )
            )
        except UnknownTopic:
            segments = []  # a neighbour that keeps no index: what it holds is scanned
        reads = plan_reads(segments, topic, topic_id, marks, lack)
        source = pulled_source(self.neighbour, topic_id, topic)
        found = {origin: RangeSet() for origin in lack}
        written = 0
        rows: list[SourceRow] = []
        size = 0
        for m in read_ranges(
            self.kafka, pull_group(self.site.name), f"repair from {self.neighbour}", topic, reads
        ):
            headers: Headers = list(m.headers() or [])  # type: ignore[arg-type]
            self.read += 1
            ident = _identity(headers)
            if ident is None or ident[0] not in lack or ident[1] not in lack[ident[0]]:
                continue
            if ident[1] in found[ident[0]]:
                continue  # delivered again after a seek
            found[ident[0]].add(ident[1])
            key, value = m.key(), m.value()
            rows.append(
                SourceRow(
                    source, m.partition() or 0, m.offset() or 0, key, value, headers, written_ms(m)
                )
            )
            size += len(key or b"") + len(value or b"")
            if size >= self.site.merge.max_batch_bytes:
                written += self._write(stream, rows)
                rows, size = [], 0
        if rows:
            written += self._write(stream, rows)
        # not found there, or found and not taken (its proof failed, the bound on holes):
        # not looked for at this neighbour again, so a forgery is refused once, not
        # every round
        held = self.merger.state.held
        self._unserved(
            stream, {o: s.difference(held.get((o, stream)) or RangeSet()) for o, s in lack.items()}
        )
        if written:
            log.info(
                "repaired",
                site=self.site.name,
                neighbour=self.neighbour,
                stream=stream,
                records=written,
            )
        return written

    def _write(self, stream: str, rows: list[SourceRow]) -> int:
        plan = self.merger.write_pulled(rows, cursors=False)
        self.repaired[stream] += len(plan.canonical)
        self.unproved += plan.unproved
        return len(plan.canonical)

    def _unserved(self, stream: str, missing: Mapping[str, RangeSet]) -> None:
        for origin, seqs in missing.items():
            if seqs:
                self.unserved.setdefault((origin, stream), RangeSet()).update(seqs)
                log.warning(
                    "repair_unserved",
                    site=self.site.name,
                    neighbour=self.neighbour,
                    origin=origin,
                    stream=stream,
                    seqs=str(seqs)[:200],
                )

    def _marks(self, parts: list[Part]) -> dict[int, tuple[int, int]]:
        """Per partition that holds committed records: its oldest offset and its last
        stable offset."""
        return {
            p: span for (_, p), span in self.admin().spans(parts, f" at {self.neighbour}").items()
        }

    def status(self) -> dict[str, object]:
        return {
            "lacking": dict(self.lacking),
            "repaired": dict(self.repaired),
            "unserved": {f"{o}/{s}": str(seqs) for (o, s), seqs in sorted(self.unserved.items())},
            "unproved": self.unproved,
            "rounds": self.rounds,
            "last_round": self.last_round,
            "error": self.error,
        }


def read_ranges(
    kafka: KafkaEndpoint, group: str, what: str, topic: str, reads: Ranges
) -> Iterator[Message]:
    """The records of ``reads`` (per partition of ``topic``, offset ranges), each
    partition's ranges in order, each offset once; a range whose records retention took
    meanwhile yields what is left of it."""
    todo = {(topic, p): list(ranges) for p, ranges in reads.items() if ranges}
    if not todo:
        return
    with PartitionReader(kafka, group=group, what=what) as reader:
        reader.assign({tp: ranges[0][0] for tp, ranges in todo.items()})
        deadline = time.monotonic() + kafka.timeout_s
        while todo:
            got = reader.poll(500, timeout=0.2)
            if got.errors:
                raise got.errors[0]
            if got.records or got.gaps or got.ends:
                deadline = time.monotonic() + kafka.timeout_s
            elif time.monotonic() > deadline:
                raise MergeError(f"{what}: no record for a while")
            for m in got.records:
                tp = (str(m.topic()), m.partition() or 0)
                ranges = todo.get(tp)
                offset = m.offset() or 0
                if ranges and offset >= ranges[0][1]:
                    # past the range (its last offset was a transaction marker): on to
                    # the next, which this record may be the start of
                    _next_range(reader, todo, tp, offset)
                    continue
                if not ranges or offset < ranges[0][0]:
                    continue  # fetched before a seek
                yield m
                if offset + 1 >= ranges[0][1]:
                    _next_range(reader, todo, tp, offset + 1)
            for end in got.ends:
                tp = (end.topic, end.partition)
                ranges = todo.get(tp)
                if ranges and end.offset >= ranges[0][0]:
                    _next_range(reader, todo, tp, end.offset, at_end=True)


def _next_range(
    reader: PartitionReader,
    todo: dict[Part, list[tuple[int, int]]],
    tp: Part,
    at: int,
    *,
    at_end: bool = False,
) -> None:
    """The reader of ``tp`` is at offset ``at``, past its current range (or at the
    partition's end: ``at_end``, when no range from there on holds anything): on to the
    next range, or done with the partition."""
    ranges = todo[tp]
    ranges.pop(0)
    if at_end and ranges and ranges[0][0] >= at:
        ranges.clear()  # nothing from the end on
    if ranges:
        reader.seek(*tp, ranges[0][0])
    else:
        del todo[tp]
        reader.pause([tp])
