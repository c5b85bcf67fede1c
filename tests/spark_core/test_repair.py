"""Repair by identity (spark_core/repair.py): a site takes from its neighbour's canonical
topic what the neighbour holds and it lacks, found through the neighbour's canonical
index. The pure parts over their whole input space (what is lacking, which offsets to
read, a model of many sites repairing each other after any loss), then the real thing
on two Kafka brokers: the neighbour's merge writes its records and index, the site's
merge takes what it lacks, once."""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from hypothesis import given, settings
from hypothesis import strategies as st

from local_stack.kafka import CLIENT_COMPILER, KafkaBroker, start_kafka
from shorelink.contract import canonical_topic, dead_topic, ingress_topic
from shorelink.kafka.admin import Admin
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.reading import read_to_end
from shorelink.proof import ShipKey, ShipKeys, WatchedShipKeys
from shorelink.ranges import RangeSet
from spark_core.merge import Merger
from spark_core.merge_state import MergeError, SourceRow
from spark_core.relay_index import Segment
from spark_core.repair import (
    Repairer,
    SelfCheck,
    gone_early,
    lacking,
    plan_reads,
    remaining,
)
from tests.helpers import kill9, unique
from tests.spark_core.helpers import canonical, make_site, record

_seqs = st.lists(st.integers(1, 60), max_size=40).map(RangeSet.from_seqs)
_holdings = st.dictionaries(
    st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from(["s", "t"])), _seqs, max_size=6
)


@given(_holdings, _holdings, st.sets(st.sampled_from(["s", "t", "u"])))
def test_lacking_is_what_they_hold_of_the_streams_and_we_do_not(
    theirs: dict[tuple[str, str], RangeSet],
    ours: dict[tuple[str, str], RangeSet],
    streams: set[str],
) -> None:
    got = lacking(theirs, ours, streams)
    for source, held in theirs.items():
        want = {s for lo, hi in held for s in range(lo, hi + 1)}
        if source[1] in streams:
            want -= {s for lo, hi in ours.get(source, RangeSet()) for s in range(lo, hi + 1)}
        else:
            want = set()
        have = {s for lo, hi in got.get(source, RangeSet()) for s in range(lo, hi + 1)}
        assert have == want
    assert all(got.values())  # nothing lacking: no entry


@st.composite
def _layouts(draw: st.DrawFn) -> tuple[dict[int, list[tuple[str, int]]], list[Segment], int]:
    """A canonical topic as a neighbour holds it: per partition its records (origin,
    seq) by offset, the oldest ones maybe taken by retention (``low``), and its index:
    segments over consecutive offsets from some point on (what came before the index
    is named by none), some too large to name their seqs, some missing (a hole in the
    chain), some of another topic id (a topic recreated)."""
    parts: dict[int, list[tuple[str, int]]] = {}
    segments: list[Segment] = []
    seqs: Counter[str] = Counter()
    for part in range(draw(st.integers(1, 3))):
        records = []
        for _ in range(draw(st.integers(0, 40))):
            origin = draw(st.sampled_from(["a", "b", "c"]))
            seqs[origin] += 1
            records.append((origin, seqs[origin]))
        parts[part] = records
        at = draw(st.integers(0, len(records)))  # the index starts here
        while at < len(records):
            to = min(len(records), at + draw(st.integers(1, 8)))
            kind = draw(st.sampled_from(["named", "named", "named", "unnamed", "lost", "other"]))
            named: dict[str, RangeSet] = {}
            for origin, seq in records[at:to]:
                named.setdefault(origin, RangeSet()).add(seq)
            if kind != "lost":
                segments.append(
                    Segment(
                        "sl.s",
                        "other-id" if kind == "other" else "id",
                        {part: (at, to)},
                        None if kind == "unnamed" else named,
                    )
                )
            at = to
    low = draw(st.integers(0, 5))
    return parts, draw(st.permutations(segments)), low


@given(_layouts(), st.data())
@settings(max_examples=300)
def test_the_reads_planned_hold_every_lacking_record_the_partitions_still_hold(
    layout: tuple[dict[int, list[tuple[str, int]]], list[Segment], int], data: st.DataObject
) -> None:
    parts, segments, low = layout
    held = [(p, off, r) for p, recs in parts.items() for off, r in enumerate(recs)]
    lost = data.draw(st.sets(st.sampled_from(held))) if held else set()
    lack: dict[str, RangeSet] = {}
    for _, _, (origin, seq) in lost:
        lack.setdefault(origin, RangeSet()).add(seq)
    marks = {p: (min(low, len(recs)), len(recs)) for p, recs in parts.items() if recs}
    reads = plan_reads(segments, "sl.s", "id", marks, lack)
    for part, ranges in reads.items():
        lo_p, hi_p = marks[part]
        assert all(lo_p <= lo < hi <= hi_p for lo, hi in ranges)
        assert all(a[1] < b[0] for a, b in itertools.pairwise(ranges))
    for part, off, _ in lost:
        if part in marks and off >= marks[part][0]:  # not taken by retention
            assert any(lo <= off < hi for lo, hi in reads.get(part, [])), (part, off)


def test_a_lack_the_index_names_reads_only_its_segments() -> None:
    segments = [
        Segment(
            "sl.s", "id", {0: (10 * i, 10 * i + 10)}, {"a": RangeSet([(10 * i + 1, 10 * i + 10)])}
        )
        for i in range(100)
    ]
    marks = {0: (0, 1000)}
    reads = plan_reads(segments, "sl.s", "id", marks, {"a": RangeSet([(401, 405)])})
    assert reads == {0: [(400, 410)]}
    # a seq no segment names: what no segment covers is read too (here: nothing more)
    assert plan_reads(segments, "sl.s", "id", marks, {"a": RangeSet([(5000, 5000)])}) == {}
    # the index starts at offset 200: what lies before it is read for such a seq
    assert plan_reads(segments[20:], "sl.s", "id", marks, {"a": RangeSet([(5000, 5000)])}) == {
        0: [(0, 200)]
    }


@st.composite
def _fleets(draw: st.DrawFn) -> tuple[dict[int, set[int]], list[set[int]], list[set[int]]]:
    """Sites 0..n-1 in a connected graph; identities (seqs) 1..k, each held by some
    sites (what replication delivered before it lost the rest: a relay's retention, a
    cursor moved past records, a neighbour that withheld them), and per site what its
    canonical topic still serves of what its ledger holds (records deleted from it)."""
    n = draw(st.integers(2, 6))
    edges: dict[int, set[int]] = {i: set() for i in range(n)}
    for i in range(1, n):  # a random spanning tree, then random extra links
        j = draw(st.integers(0, i - 1))
        edges[i].add(j)
        edges[j].add(i)
    for _ in range(draw(st.integers(0, n))):
        i, j = draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))
        if i != j:
            edges[i].add(j)
            edges[j].add(i)
    k = draw(st.integers(1, 30))
    holds = [draw(st.sets(st.integers(1, k))) for _ in range(n)]
    serves = [draw(st.sets(st.sampled_from(sorted(h)))) if h else set() for h in holds]
    return edges, holds, serves


@given(_fleets())
@settings(max_examples=300)
def test_in_a_model_fleet_repair_brings_every_served_identity_to_every_site(
    fleet: tuple[dict[int, set[int]], list[set[int]], list[set[int]]],
) -> None:
    """The repair's rules on a model: each round, each site first forgets what its
    ledger holds and its canonical topic lost (``SelfCheck``), then takes from each
    neighbour what that neighbour held at the round before, still lacks, and the
    neighbour serves (``lacking`` decides; a record repaired is held and served on).
    After two rounds per hop of the graph's diameter and one more (to forget), every
    site holds every identity some site served at the start, once, and nothing else.
    Without the self-check a hub whose topic lost a record held it by its ledger, and
    the sites behind it never got it (this test found that)."""
    edges, holds, serves = fleet
    n = len(holds)
    ours = [{("o", "s"): RangeSet.from_seqs(h)} for h in holds]
    served = [set(x) for x in serves]
    before: list[list[dict[tuple[str, str], RangeSet]]] = [[{} for _ in range(n)] for _ in range(n)]
    for _ in range(2 * n + 1):
        for i in range(n):  # the self-check: the ledger forgets what is not served
            ours[i][("o", "s")] = RangeSet.from_seqs(served[i])
        snapshot = [{k: v.copy() for k, v in o.items()} for o in ours]
        for i in range(n):
            for j in sorted(edges[i]):
                due = lacking(before[i][j], ours[i], ["s"]).get(("o", "s"), RangeSet())
                assert not any(due.overlaps(lo, hi) for lo, hi in ours[i][("o", "s")])
                got = {q for lo, hi in due for q in range(lo, hi + 1)} & served[j]
                ours[i][("o", "s")].update(RangeSet.from_seqs(got))
                served[i] |= got
                before[i][j] = snapshot[j]
    start = set().union(*serves)
    for i in range(n):
        assert {q for lo, hi in ours[i][("o", "s")] for q in range(lo, hi + 1)} == start


@dataclass
class Pair:
    """A stream, the neighbour tokyo's Kafka, its merge (``there``) and this site's
    (``here``), both prepared."""

    stream: str
    tokyo: KafkaBroker
    there: Merger
    here: Merger


@pytest.fixture
def pair(
    kafka: KafkaBroker, kafka_sites: Callable[..., dict[str, KafkaBroker]], tmp_path: Path
) -> Iterator[Pair]:
    s = unique("s")
    tokyo = kafka_sites("tokyo")["tokyo"]
    there, _ = make_site(tokyo.bootstrap, tmp_path / "tokyo", [s])
    here, _ = make_site(kafka.bootstrap, tmp_path / "here", [s])
    n, m = Merger(there), Merger(here)
    try:
        n.prepare()
        m.prepare()
        yield Pair(s, tokyo, n, m)
    finally:
        n.close()
        m.close()


def _write(merger: Merger, stream: str, origin: str, seqs: range, *, index: bool) -> None:
    """``seqs`` of ``origin`` as the merge's next Spark batch (from its ingress topic,
    at the offsets past what it read), then, with ``index``, a segment of its index."""
    t = ingress_topic(stream)
    at = merger.state.offsets.get((t, 0), 0)
    rows = []
    for i, q in enumerate(seqs):
        r = record(origin, stream, q, key=f"c{q % 3}")
        rows.append(SourceRow(t, 0, at + i, r.key, r.value, list(r.headers())))
    merger.write_rows((merger.state.last_batch or 0) + 1, rows)
    if index:
        merger._index_due = 0.0  # due now: a segment per batch
        assert merger.write_index() >= 1


def test_a_site_takes_what_it_lacks_from_its_neighbours_canonical_topic_by_identity(
    kafka: KafkaBroker, pair: Pair, tmp_path: Path
) -> None:
    """Review (replication N13, issue 40): a site that lacks records its neighbour holds
    (a relay's retention, a withholding neighbour, any replication bug) had no way to
    notice. The neighbour's merge writes ship1 1-1000 in ten batches, a segment of its
    canonical index after each; this site holds all but 401-450 (and nothing of
    ship2, which the neighbour holds 1-30). The first round sees the difference and
    repairs nothing (in flight a moment ago?); the second takes exactly what it lacks,
    reading the index's segments that name it, not the topic; the third finds nothing
    lacking. Every identity once."""
    s, tokyo, n, m = pair.stream, pair.tokyo, pair.there, pair.here
    for b in range(10):
        _write(n, s, "ship1", range(100 * b + 1, 100 * b + 101), index=True)
    _write(n, s, "ship2", range(1, 31), index=True)
    _write(m, s, "ship1", range(1, 401), index=False)
    _write(m, s, "ship1", range(451, 1001), index=False)
    r = Repairer("tokyo", KafkaEndpoint.plaintext(tokyo.bootstrap), m)
    assert r.round() == 0
    assert dict(r.lacking) == {s: 80}
    assert r.round() == 80
    assert dict(r.repaired) == {s: 80}
    assert r.read <= 200  # the segments naming 401-450 and ship2's: not 1,030 records
    assert r.round() == 0 and not r.lacking and not r.unserved
    got = Counter(x.identity for x in canonical(kafka.bootstrap, s))
    assert max(got.values()) == 1
    assert {(i.origin, i.seq) for i in got} == {("ship1", q) for q in range(1, 1001)} | {
        ("ship2", q) for q in range(1, 31)
    }


def test_what_the_neighbour_no_longer_serves_is_counted_and_not_looked_for_again(
    kafka: KafkaBroker, pair: Pair, tmp_path: Path
) -> None:
    """A neighbour with no segment for its records (written before its index existed)
    is scanned; what its retention took, though its ledger still names it, is
    ``unserved`` and no later round reads for it."""
    s, tokyo, n, m = pair.stream, pair.tokyo, pair.there, pair.here
    _write(n, s, "ship1", range(1, 101), index=False)
    admin = AdminClient({"bootstrap.servers": tokyo.bootstrap})
    topic = canonical_topic(s)
    parts = admin.list_topics(topic, timeout=20).topics[topic].partitions
    # retention takes the oldest 10 records of every partition
    done = admin.delete_records([TopicPartition(topic, p, 10) for p in parts])
    for f in done.values():
        f.result(20)
    r = Repairer("tokyo", KafkaEndpoint.plaintext(tokyo.bootstrap), m)
    r.round()
    written = r.round()
    got = {x.identity.seq for x in canonical(kafka.bootstrap, s)}
    held = {x.identity.seq for x in canonical(tokyo.bootstrap, s)}
    assert written == len(got) == len(held) and got == held
    unserved = r.unserved[("ship1", s)]
    assert unserved.count() == 100 - len(held)
    read = r.read
    assert r.round() == 0 and r.read == read  # not looked for again
    assert dict(r.lacking) == {s: 100 - len(held)}


def test_records_a_neighbour_serves_that_fail_their_proof_are_refused_once(
    kafka: KafkaBroker, pair: Pair, tmp_path: Path
) -> None:
    """A neighbour whose canonical topic holds copies of a ship's records without the
    ship's proof (forged, or a site that skipped the check): the repair hands them to
    the merge, which dead-letters them as it does any unproved pulled record; they are
    then ``unserved`` there, so the next round neither reads nor dead-letters them
    again."""
    s, tokyo, n, m = pair.stream, pair.tokyo, pair.there, pair.here
    keys_file = tmp_path / "ship_keys.toml"
    keys_file.write_text(ShipKeys.render({"ship1": ShipKey.generate().public()}, False))
    m.ship_keys = WatchedShipKeys(keys_file)
    _write(n, s, "ship1", range(1, 51), index=True)
    r = Repairer("tokyo", KafkaEndpoint.plaintext(tokyo.bootstrap), m)
    r.round()
    assert r.round() == 0
    assert r.unproved == 50 and r.unserved[("ship1", s)].count() == 50
    dead = len(list(read_to_end(KafkaEndpoint.plaintext(kafka.bootstrap), [dead_topic(s)])))
    assert dead == 50
    read = r.read
    assert r.round() == 0 and r.read == read
    again = list(read_to_end(KafkaEndpoint.plaintext(kafka.bootstrap), [dead_topic(s)]))
    assert len(again) == dead
    assert not list(canonical(kafka.bootstrap, s))


@st.composite
def _own_topics(
    draw: st.DrawFn,
) -> tuple[dict[int, list[tuple[str, int]]], list[Segment], dict[int, int]]:
    """A site's own canonical topic: per partition its records (origin, seq) by offset,
    some seqs written twice (lost and written again), its index's segments (some of a
    former topic id), and how far deletion went in each partition."""
    parts: dict[int, list[tuple[str, int]]] = {}
    segments: list[Segment] = []
    for part in range(draw(st.integers(1, 3))):
        records = draw(
            st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(1, 30)), max_size=40)
        )
        parts[part] = records
        at = 0
        while at < len(records):
            to = min(len(records), at + draw(st.integers(1, 8)))
            named: dict[str, RangeSet] = {}
            for origin, seq in records[at:to]:
                named.setdefault(origin, RangeSet()).add(seq)
            age = draw(st.sampled_from([0, 10**9]))  # young, or older than any retention
            tid = draw(st.sampled_from(["id", "id", "id", "old"]))
            segments.append(Segment("sl.s", tid, {part: (at, to)}, named, 10**10 - age))
            at = to
    lows = {p: draw(st.integers(0, len(recs))) for p, recs in parts.items()}
    return parts, segments, lows


@given(_own_topics(), st.sampled_from([None, 10**8]))
@settings(max_examples=300)
def test_a_site_forgets_of_its_own_topic_exactly_what_deletion_took_early(
    topic: tuple[dict[int, list[tuple[str, int]]], list[Segment], dict[int, int]],
    retention: int | None,
) -> None:
    """Forgetting a seq the topic still holds would write it twice; not forgetting one
    it lost leaves it lost. With what the cut segments' remaining offsets hold (as the
    self-check reads them), ``gone_early`` names no seq the topic still holds under its
    current id, and every seq a young segment named that deletion took and no other
    segment names."""
    parts, segments, lows = topic
    reads = remaining(segments, "sl.s", "id", lows)
    present: dict[str, RangeSet] = {}
    for p, ranges in reads.items():
        for lo, hi in ranges:
            for origin, seq in parts[p][lo:hi]:
                present.setdefault(origin, RangeSet()).add(seq)
    gone = gone_early(segments, "sl.s", "id", lows, 10**10, retention, present)
    current = [x for x in segments if x.topic_id == "id"]
    still = {
        (origin, seq)
        for x in current
        for p, (lo, hi) in x.parts.items()
        for origin, seq in parts[p][max(lo, lows[p]) : hi]
    }
    named = {(o, q) for o, seqs in gone.items() for lo, hi in seqs for q in range(lo, hi + 1)}
    assert not named & still
    untouched = {
        (o, q)
        for x in segments
        if x.topic_id == "id" and all(lo >= lows[p] for p, (lo, hi) in x.parts.items())
        for o, seqs in (x.seqs or {}).items()
        for lo, hi in seqs
        for q in range(lo, hi + 1)
    }
    for x in segments:
        cut = x.topic_id != "id" or any(lo < lows[p] for p, (lo, hi) in x.parts.items())
        young = retention is None or 10**10 - (x.written_ms or 0) < retention - 600_000
        if cut and young:
            for o, seqs in (x.seqs or {}).items():
                for lo, hi in seqs:
                    for q in range(lo, hi + 1):
                        if (o, q) not in still and (o, q) not in untouched:
                            assert (o, q) in named, (o, q)


@given(_own_topics(), st.data())
@settings(max_examples=200, deadline=2000)
def test_a_self_check_forgets_nothing_a_move_not_settled_yet_may_have_taken(
    topic: tuple[dict[int, list[tuple[str, int]]], list[Segment], dict[int, int]],
    data: st.DataObject,
) -> None:
    """Review 9, finding 10: the self-check acts on the partitions whose move has held
    while others' have not (``unsettled``: where their oldest offset stands now, above
    ``lows``). A broker that crashes may bring those records back: forgotten, they
    would be written twice. No seq of a record between a partition's ``lows`` and its
    unsettled offset is forgotten, and none of those offsets is read."""
    parts, segments, lows = topic
    unsettled = {
        p: data.draw(st.integers(lows[p] + 1, len(recs)))
        for p, recs in parts.items()
        if lows[p] < len(recs) and data.draw(st.booleans())
    }
    reads = remaining(segments, "sl.s", "id", lows, unsettled)
    assert all(lo >= unsettled.get(p, 0) for p, ranges in reads.items() for lo, _ in ranges)
    present: dict[str, RangeSet] = {}
    for p, ranges in reads.items():
        for lo, hi in ranges:
            for origin, seq in parts[p][lo:hi]:
                present.setdefault(origin, RangeSet()).add(seq)
    gone = gone_early(segments, "sl.s", "id", lows, 10**10, None, present, unsettled)
    maybe = {
        parts[p][o]
        for x in segments
        if x.topic_id == "id"
        for p, (lo, hi) in x.parts.items()
        if p in unsettled
        for o in range(max(lo, lows[p]), min(hi, unsettled[p]))
    }
    named = {(o, q) for o, seqs in gone.items() for lo, hi in seqs for q in range(lo, hi + 1)}
    assert not named & maybe


def test_a_segment_deleted_while_young_is_gone_and_one_retention_took_is_not() -> None:
    young, old = 10**10, 10**10 - 10**9
    segments = [
        Segment("sl.s", "id", {0: (0, 10)}, {"a": RangeSet([(1, 10)])}, young),
        Segment("sl.s", "id", {0: (10, 20)}, {"a": RangeSet([(11, 20)])}, young),
        Segment("sl.s", "id", {1: (0, 10)}, {"b": RangeSet([(1, 10)])}, old),
    ]
    lows = {0: 15, 1: 10}
    assert remaining(segments, "sl.s", "id", lows) == {0: [(15, 20)]}
    present = {"a": RangeSet([(16, 20)])}  # what offsets 15-19 hold
    got = gone_early(segments, "sl.s", "id", lows, 10**10, 10**8, present)
    assert got == {"a": RangeSet([(1, 15)])}  # b's: retention's work
    assert gone_early(segments, "sl.s", "id", lows, 10**10, None, present) == {
        "a": RangeSet([(1, 15)]),
        "b": RangeSet([(1, 10)]),
    }
    # the topic created again: everything the old one held (and nothing written since)
    again = [*segments, Segment("sl.s", "new", {0: (0, 5)}, {"a": RangeSet([(3, 4)])}, young)]
    assert gone_early(again, "sl.s", "new", {0: 0, 1: 0}, 10**10, None) == {
        "a": RangeSet([(1, 2), (5, 20)]),
        "b": RangeSet([(1, 10)]),
    }


def test_records_a_sites_own_canonical_topic_lost_early_come_back_from_a_neighbour(
    kafka: KafkaBroker, pair: Pair, tmp_path: Path
) -> None:
    """Issue 40: records deleted from one site's canonical topic (by hand, a tool, a
    broker that lost a log) while its ledger still said it held them: nothing brought
    them back, and every neighbour comparing with it found nothing lacking. The site's
    self-check sees its index's segments below the partitions' oldest offsets, written
    well within the retention: it forgets those seqs, its repair takes them from the
    neighbour, and they are held (and in the topic) once; a second look forgets
    nothing."""
    s, tokyo, n, m = pair.stream, pair.tokyo, pair.there, pair.here
    for b in range(4):
        _write(n, s, "ship1", range(25 * b + 1, 25 * b + 26), index=True)
        _write(m, s, "ship1", range(25 * b + 1, 25 * b + 26), index=True)
    topic = canonical_topic(s)
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    parts = admin.list_topics(topic, timeout=20).topics[topic].partitions
    # the first half of every partition deleted: about its first two batches' records
    cut = {}
    for p in parts:
        lo, hi = _watermarks(kafka.bootstrap, topic, p)
        cut[p] = (lo + hi) // 2
    done = admin.delete_records([TopicPartition(topic, p, off) for p, off in cut.items()])
    for f in done.values():
        f.result(20)
    left = {x.identity.seq for x in canonical(kafka.bootstrap, s)}
    assert len(left) < 100
    check = SelfCheck(m)
    check.settle_s = 0.0  # the move acted on at once (see the next test for why not)
    forgotten = check.round()
    assert forgotten == 100 - len(left)
    assert check.round() == 0  # nothing moved since
    r = Repairer("tokyo", KafkaEndpoint.plaintext(tokyo.bootstrap), m)
    r.round()
    assert r.round() == forgotten
    got = Counter(x.identity.seq for x in canonical(kafka.bootstrap, s))
    assert max(got.values()) == 1
    assert set(got) == set(range(1, 101))
    assert m.state.held_for(("ship1", s)).contains_all(RangeSet.from_seqs(got))
    m._index_due = 0.0
    m.write_index()
    third = SelfCheck(m)
    third.settle_s = 0.0
    assert third.round() == 0  # written again, named by a live segment


def test_a_deletion_a_broker_crash_undoes_is_not_forgotten(
    stack_root: Path, tmp_path: Path
) -> None:
    """Found by the fault soak: Kafka writes a partition's new start offset down only
    every ``log.flush.start.offset.checkpoint.interval.ms`` (60 s by default). A
    broker killed before brings records ``delete_records`` took back. The self-check
    had forgotten them and repair had written them again: each was in the topic
    twice. Now a move of the oldest offsets is acted on only once it has held for
    ``self_check_settle``: here the broker is killed within the interval, the records
    come back, and nothing is forgotten; a move that holds is acted on."""
    broker = start_kafka(
        "crash-undo",
        stack_root / "sites" / unique("undo"),
        stack_root / "logs",
        heap="256m",
        jvm_opts=CLIENT_COMPILER,
    )
    s = unique("s")
    site, _ = make_site(broker.bootstrap, tmp_path, [s])
    m = Merger(site)
    try:
        m.prepare()
        _write(m, s, "ship1", range(1, 41), index=True)
        _write(m, s, "ship1", range(41, 81), index=True)
        topic = canonical_topic(s)
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        parts = admin.list_topics(topic, timeout=20).topics[topic].partitions
        cut = [
            TopicPartition(topic, p, _watermarks(broker.bootstrap, topic, p)[1] // 2) for p in parts
        ]
        for f in admin.delete_records(cut).values():
            f.result(20)
        check = SelfCheck(m)
        check.settle_s = 5.0
        assert check.round() == 0  # the move seen, not acted on yet
        kill9(broker.proc)  # within the checkpoint interval: the deletion undone
        broker.restart()
        m.close()
        m.prepare()
        lows = {p: _watermarks(broker.bootstrap, topic, p)[0] for p in parts}
        assert not any(lows.values()), lows  # what the soak met: the records are back
        time.sleep(check.settle_s)  # the settle time itself is what is under test
        assert check.round() == 0
        assert m.state.held_for(("ship1", s)) == RangeSet([(1, 80)])
        # a deletion that holds is acted on once it has held
        for f in admin.delete_records(cut).values():
            f.result(20)
        assert check.round() == 0
        left = {x.identity.seq for x in canonical(broker.bootstrap, s)}
        assert 0 < len(left) < 80
        time.sleep(check.settle_s)
        assert check.round() == 80 - len(left)
    finally:
        m.close()
        broker.proc.stop(grace=5)


def _spread(merger: Merger, stream: str, seqs: range) -> None:
    """``_write`` with ten containers: the seqs spread over every canonical partition."""
    t = ingress_topic(stream)
    at = merger.state.offsets.get((t, 0), 0)
    rows = []
    for i, q in enumerate(seqs):
        r = record("ship1", stream, q, key=f"c{q % 10}")
        rows.append(SourceRow(t, 0, at + i, r.key, r.value, list(r.headers())))
    merger.write_rows((merger.state.last_batch or 0) + 1, rows)
    merger._index_due = 0.0
    assert merger.write_index() >= 1


def _where(bootstrap: str, topic: str) -> dict[tuple[int, int], int]:
    """(partition, offset) -> seq of every record of ``topic``."""
    out = {}
    for m in read_to_end(KafkaEndpoint.plaintext(bootstrap), [topic], settled=True):
        seq = int(dict(m.headers() or [])["sl.seq"])
        out[(m.partition() or 0, m.offset() or 0)] = seq
    return out


def _delete_below(bootstrap: str, topic: str, part: int, offset: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.delete_records([TopicPartition(topic, part, offset)]).values():
        f.result(20)


def test_a_deletion_is_acted_on_once_it_held_while_retention_keeps_moving_another_partition(
    kafka: KafkaBroker, tmp_path: Path
) -> None:
    """Review 9, finding 10: a move of any partition's oldest offset started the whole
    topic's settle time again, so on a busy topic whose retention moves some partition
    more often than ``self_check_settle`` a deletion on another was put off for good.
    Settled per partition: partition A's deletion (three segments' records, the first
    one's and most of the others') is acted on 100 s later though B's oldest offset
    moved at 0, 60 and 100 s (within the first segment). The first segment holds
    records B's unsettled move may have taken: none of its seqs is forgotten yet; once
    B's move has held, its lost seqs, A's and B's, are. A clock of the test's own: the
    settle time is what is under test."""
    s = unique("s")
    site, _ = make_site(kafka.bootstrap, tmp_path, [s])
    m = Merger(site)
    try:
        m.prepare()
        topic = canonical_topic(s)
        check = SelfCheck(m)
        check.settle_s = 90.0
        now = [0.0]
        check.clock = lambda: now[0]
        assert check.round() == 0  # nothing deleted yet: the look to compare with
        for first in (1, 31, 61):
            _spread(m, s, range(first, first + 30))
        where = _where(kafka.bootstrap, topic)
        counts = Counter(p for p, _ in where)
        assert len(counts) >= 2, counts
        # B: a partition with at least four records of the first segment (1-30)
        b = next(p for p in sorted(counts) if all(where.get((p, o), 99) <= 30 for o in range(4)))
        a = next(p for p in sorted(counts) if p != b)
        cut = max(o for (p, o) in where if p == a)  # all of A but its last record
        _delete_below(kafka.bootstrap, topic, a, cut)
        _delete_below(kafka.bootstrap, topic, b, 1)
        assert check.round() == 0  # t=0: both moves seen
        now[0] = 60.0
        _delete_below(kafka.bootstrap, topic, b, 2)
        assert check.round() == 0
        now[0] = 100.0
        _delete_below(kafka.bootstrap, topic, b, 3)
        lost_a = {q for (p, o), q in where.items() if p == a and o < cut}
        lost_b = {q for (p, o), q in where.items() if p == b and o < 3}
        first = {q for q in lost_a if q > 30}
        assert first and check.round() == len(first)
        held = m.state.held_for(("ship1", s))
        assert not any(q in held for q in first)
        assert all(q in held for q in (lost_a - first) | lost_b)
        now[0] = 150.0
        assert check.round() == 0  # B's move of 100 s has not held long enough
        now[0] = 190.0
        rest = (lost_a - first) | lost_b
        assert check.round() == len(rest)
        held = m.state.held_for(("ship1", s))
        assert held == RangeSet.from_seqs(set(range(1, 91)) - lost_a - lost_b)
    finally:
        m.close()


def test_a_deletion_the_self_check_failed_on_is_acted_on_at_the_next_round(
    kafka: KafkaBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review 9, finding 6: the self-check recorded a deletion as acted on before it
    acted; when forgetting failed (the merge stopping, Kafka not answering), the next
    round found nothing moved since, and the lost records stayed held for good: never
    repaired. The next round acts on it."""
    s = unique("s")
    site, _ = make_site(kafka.bootstrap, tmp_path, [s])
    m = Merger(site)
    try:
        m.prepare()
        check = SelfCheck(m)
        check.settle_s = 0.0
        assert check.round() == 0
        for first in (1, 31):
            _spread(m, s, range(first, first + 30))
        topic = canonical_topic(s)
        where = _where(kafka.bootstrap, topic)
        a = min(p for p, _ in where)
        cut = max(o for (p, o) in where if p == a)
        _delete_below(kafka.bootstrap, topic, a, cut)
        lost = {q for (p, o), q in where.items() if p == a and o < cut}
        forget = m.forget
        calls = []

        def failing_once(lost: Any) -> Any:
            calls.append(1)
            if len(calls) == 1:
                raise MergeError("merge is stopping; nothing forgotten")
            return forget(lost)

        monkeypatch.setattr(m, "forget", failing_once)
        with pytest.raises(MergeError):
            check.round()
        assert check.round() == len(lost) > 0
        assert not any(q in m.state.held_for(("ship1", s)) for q in lost)
        assert check.round() == 0
    finally:
        m.close()


def _watermarks(bootstrap: str, topic: str, part: int) -> tuple[int, int]:
    admin = Admin(KafkaEndpoint.plaintext(bootstrap))
    lo = admin.offsets([(topic, part)], OffsetSpec.earliest())[(topic, part)].offset
    hi = admin.offsets([(topic, part)], OffsetSpec.latest())[(topic, part)].offset
    return lo, hi
