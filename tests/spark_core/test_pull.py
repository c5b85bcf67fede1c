"""How the merge names a neighbour's relay topic as a source (spark_core/pull.py): the
name carries the topic's id, so a recreated topic is a new source, and it must always
lead back to the stream, whatever characters the id (base64) holds. A neighbour's
canonical topic, read for history, names its stream and no entry. Which neighbour a
site takes each stream's history from, and what it reads there."""

from __future__ import annotations

import base64
import contextlib
import gc
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from hypothesis import given
from hypothesis import strategies as st

from local_stack.kafka import KafkaBroker
from shorelink.contract import canonical_topic, dead_topic, ingress_topic, relay_topic
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.errors import UnknownTopic
from shorelink.kafka.reading import PartitionReader, Polled, read_to_end
from shorelink.kafka.topics import TopicSpec, ensure_topics
from spark_core import feed as feed_module
from spark_core.config import SiteConfig, parse_config
from spark_core.feed import ByteBudget
from spark_core.ingest_pull import IngestPuller, write_through
from spark_core.jobs.site import mergers
from spark_core.merge import Merger
from spark_core.merge_state import (
    SourceRow,
    history_stream,
    pulled_source,
    source_entry,
    source_stream,
    superseded_sources,
    topic_stream,
)
from spark_core.pull import Puller
from spark_core.redrive import redrive_once
from spark_core.replication import Replicator, history_sources
from tests.helpers import eventually, unique
from tests.spark_core.helpers import (
    canonical,
    create_ingress,
    graph_doc,
    make_site,
    produce,
    record,
)
from tests.strategies import DIGITS, LOWER, words

_NAME = words(LOWER, LOWER + DIGITS + "-", 20)


@given(
    neighbour=_NAME,
    entry=_NAME,
    stream=_NAME,
    raw_id=st.binary(min_size=16, max_size=16),
)
def test_a_pulled_source_names_its_stream_whatever_its_topic_id_holds(
    neighbour: str, entry: str, stream: str, raw_id: bytes
) -> None:
    # Kafka's topic ids print as base64, "/" and "+" included (the bug this guards:
    # an id with a "/" made every record of that topic a dead letter)
    topic_id = base64.b64encode(raw_id).decode().rstrip("=")
    source = pulled_source(neighbour, topic_id, relay_topic(entry, stream))
    assert source_stream(source) == stream
    # the entry a record pulled from it files under: the topic's, never its sl.site
    assert source_entry(source) == entry
    # never taken for a local topic: the purge deletes only from those
    assert topic_stream(source) is None
    assert history_stream(source) is None
    # the neighbour's canonical topic (history): its stream, no entry, never purged
    history = pulled_source(neighbour, topic_id, canonical_topic(stream))
    assert (source_stream(history), history_stream(history)) == (stream, stream)
    assert source_entry(history) is None and topic_stream(history) is None


def test_a_recreated_topics_old_cursors_are_superseded_and_nothing_else() -> None:
    """Review N9: a neighbour's topic created again (a new id) is a new source; the old
    id's cursors can never be used again and were kept in every marker for good. Only
    the same neighbour's same topic under another id is superseded (ids hold "/")."""
    relay = relay_topic("tokyo", "nav")
    old, new = pulled_source("hq", "a/b+c", relay), pulled_source("hq", "d/e", relay)
    other_site = pulled_source("syd", "a/b+c", relay)
    other_topic = pulled_source("hq", "a/b+c", relay_topic("tokyo", "alerts"))
    history = pulled_source("hq", "x/y", canonical_topic("nav"))
    known = {old, new, other_site, other_topic, history, ingress_topic("nav")}
    assert superseded_sources(known, {new}) == {old}
    assert superseded_sources(known, {old}) == {new}  # (whichever is read now)
    assert superseded_sources(known, {ingress_topic("nav")}) == set()


def test_local_sources_keep_their_streams_and_other_names_have_none() -> None:
    assert source_stream("sl.ingress.alerts") == "alerts"
    assert source_stream("sl.ledger") is None
    assert source_stream("hq/AAAA/sl.ledger") is None
    assert source_stream("hq/AAAA/sl.relay.tokyo") is None
    # what a local topic holds entered here
    assert source_entry("sl.ingress.alerts") is None
    assert source_entry("hq/AAAA/sl.ledger") is None


def test_history_comes_from_the_neighbour_that_keeps_the_stream_longest(tmp_path: Path) -> None:
    doc = graph_doc({"hq": ["tyo", "syd"], "tyo": ["hq", "syd"], "syd": ["hq", "tyo"]}, tmp_path)
    for site in doc["sites"].values():
        site["streams"] = ["containers", "nav"]
        site["topics"] = {"containers": {"retention": "14d"}, "nav": {"retention": "14d"}}
    doc["sites"]["hq"]["topics"] = {"containers": {"retention": "forever"}}
    doc["sites"]["hq"]["streams"] = ["containers"]  # hq does not carry nav
    doc["sites"]["tyo"]["topics"]["nav"] = {"retention": "30d"}
    cfg = parse_config(doc)
    assert history_sources(cfg, cfg.site("syd")) == {"containers": "hq", "nav": "tyo"}
    # ties: by name
    assert history_sources(cfg, cfg.site("hq")) == {"containers": "syd"}
    assert history_sources(cfg, cfg.site("tyo")) == {"containers": "hq", "nav": "syd"}


def test_a_site_that_starts_with_nothing_takes_as_history_only_what_no_relay_holds(
    kafka: KafkaBroker, kafka_sites: Callable[..., dict[str, KafkaBroker]], tmp_path: Path
) -> None:
    """The neighbour's canonical records from before its relay topics began are history;
    the rest come through the relays. So the sites of a new deployment, whose relays
    hold everything, read no history twice (Kafka answers no offset for timestamp 0 to a
    read_committed ListOffsets: the oldest relay record was never found, and every
    fresh site read its neighbour's whole canonical topic)."""
    s = unique("s")
    neighbour = kafka_sites("tokyo")["tokyo"]
    ep = KafkaEndpoint.plaintext(neighbour.bootstrap)
    ensure_topics(ep, [TopicSpec(canonical_topic(s), 1), TopicSpec(relay_topic("e1", s), 1)])
    before = [record("ship1", s, q) for q in range(1, 6)]
    relayed = [record("ship1", s, q) for q in range(6, 9)]
    p = Producer({"bootstrap.servers": neighbour.bootstrap, "transactional.id": unique("m")})
    p.init_transactions(20)
    base = int(time.time() * 1000) - 10_000
    for batch, topics, at in (
        (before, [canonical_topic(s)], base),
        (relayed, [canonical_topic(s), relay_topic("e1", s)], base + 100),
    ):
        p.begin_transaction()
        for r in batch:
            # the merge writes both copies in one transaction, at one time; a record a
            # millisecond: times taken from the clock made the history's end (found by
            # time) depend on how fast the loop ran, and CI saw (6, 6) and (8, 8)
            ts = at + r.identity.seq
            for t in topics:
                p.produce(t, key=r.key, value=r.value, headers=r.headers(), timestamp=ts)
        p.commit_transaction(20)
    site, _ = make_site(kafka.bootstrap, tmp_path, [s])
    merger = Merger(site)
    puller = Puller(
        site,
        "tokyo",
        ep,
        (s,),
        urgent=False,
        merger=merger,
        routes=dict,
        history=(s,),
        sites=("e1",),
    )
    try:
        puller.begin()
        assert puller.reading_history == [s]
        for _ in range(50):  # bounded: a round reads what is there and returns
            if not puller.reading_history:
                break
            puller.round()
        assert puller.reading_history == []
        assert (puller.read, puller.read_history) == (5, 5)
        assert {r.identity.seq for r in canonical(kafka.bootstrap, s)} == set(range(1, 6))
    finally:
        puller.close()
        merger.close()


def test_a_catch_up_of_the_ingress_loses_no_acknowledged_record_what_the_bound_holds_back_is_redriven(
    kafka: KafkaBroker, tmp_path: Path
) -> None:
    """Review N3: a site's merge catches up on its ingress (its application was down
    while the gateway acknowledged uploads). Ship X's containers spread its seqs over
    every partition; the other ships' records fill all but one, so X's partition there
    is cold. Read by an equal count per partition, the cold partition ran days ahead of
    the others: X's seqs from it came in isolated, its ledger entry reached the bound on
    holes, and the merge dead-lettered records the gateway had acknowledged (the ship
    freed them: lost everywhere). Read aligned on time across a topic's partitions,
    X's seqs come in order and every record is written (the bound lowered to 20)."""
    b = kafka.bootstrap
    s = unique("s")
    create_ingress(b, [s], partitions=4)
    site, _ = make_site(b, tmp_path, [s])
    # 400 records a round: 100 from each partition
    site = replace(site, replication=replace(site.replication, max_offsets_per_trigger=400))
    p = Producer({"bootstrap.servers": b, "transactional.id": unique("gw"), "linger.ms": 5})
    p.init_transactions(20)
    p.begin_transaction()
    base = int(time.time() * 1000) - 200_000
    want = set()
    for t in range(100):  # an upload a second: 4 of X's seqs, 30 of other ships'
        batch = [
            (record("x", s, 4 * t + i, key=f"c{(4 * t + i) % 20}"), (4 * t + i) % 4)
            for i in range(1, 5)
        ]
        batch += [
            (record(f"o{k}", s, 10 * t + j, key=f"o{k}"), k)
            for k in (1, 2, 3)
            for j in range(1, 11)
        ]
        for r, part in batch:
            want.add(r.identity)
            p.produce(
                ingress_topic(s),
                key=r.key,
                value=r.value,
                headers=r.headers(),
                partition=part,
                timestamp=base + 1000 * t,
            )
    p.commit_transaction(30)
    merger = Merger(site)
    merger.max_ranges = 20
    ends = {
        (ingress_topic(s), part): hi
        for part in range(4)
        for _, hi in [_watermarks(b, ingress_topic(s), part)]
    }
    try:
        write_through(merger, ends)
        # on a loaded machine a partition has still run ahead of the others (twice on
        # 2026-11-29: 16 of X's seqs at the bound; its cause not found yet): what the
        # bound quarantined is taken again once X's entry has room
        # (spark_core/redrive.py), so no acknowledged record is lost either way. (CI,
        # 2026-11-30: seqs 1 and 2 held back together, the pass took 2 and refused 1,
        # decided seq by seq; the bound is decided on a batch's runs now)
        for _ in range(5):
            if redrive_once(merger) is None:
                break
        assert not merger.state.held_back
    finally:
        merger.close()
    got = Counter(r.identity for r in canonical(b, s))
    assert set(got) == want and max(got.values()) == 1
    assert merger.totals.quarantined.keys() <= {f"{s}:holes"}


def test_a_batch_written_through_ends_only_when_what_waits_in_the_carry_is_written(
    kafka: KafkaBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by CI (the test above failed once under load, the tail of ship X's seqs
    missing): one poll can bring a partition's last records and its end together (a
    busy machine polls late; librdkafka has fetched again and found the end). The
    records past the partition's share wait in the carry for the next round, but the
    end found said the partition was read: ``write_through`` returned with them
    unwritten, and the batch's offsets were done. Here a partition holds 60 records,
    its share is 50, and every poll comes a second late: the partition is read only
    when the last 10 are written."""
    b = kafka.bootstrap
    s = unique("s")
    create_ingress(b, [s], partitions=2)
    site, _ = make_site(b, tmp_path, [s])
    site = replace(site, replication=replace(site.replication, max_offsets_per_trigger=100))
    p = Producer({"bootstrap.servers": b, "linger.ms": 50})
    want = set()
    for seq, part in [(n, 0) for n in range(1, 61)] + [(61, 1)]:
        r = record("x", s, seq, key=f"c{seq}")
        want.add(r.identity)
        p.produce(ingress_topic(s), key=r.key, value=r.value, headers=r.headers(), partition=part)
    assert p.flush(30) == 0
    ends = {(ingress_topic(s), part): _watermarks(b, ingress_topic(s), part)[1] for part in (0, 1)}
    poll = PartitionReader.poll

    def late(
        reader: PartitionReader, max_records: int = 500, timeout: float = 0.5, **kw: bool
    ) -> Polled:
        time.sleep(1.0)  # the busy machine: the fetcher has run ahead meanwhile
        return poll(reader, max_records, timeout, **kw)

    monkeypatch.setattr(PartitionReader, "poll", late)
    merger = Merger(site)
    try:
        write_through(merger, ends)
    finally:
        merger.close()
    assert {r.identity for r in canonical(b, s)} == want


def _watermarks(bootstrap: str, topic: str, part: int) -> tuple[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("marks")})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, part), timeout=20)
    finally:
        consumer.close()


def _dead(bootstrap: str, stream: str) -> list[object]:
    try:
        return list(read_to_end(KafkaEndpoint.plaintext(bootstrap), [dead_topic(stream)]))
    except UnknownTopic:
        return []


def _slow_puller(
    site: SiteConfig, ep: KafkaEndpoint, stream: str, merger: Merger, fetch: int = 4096
) -> Puller:
    """A puller from tokyo's relay of entry e1 over a slow link: at most 100 records a
    round, a fetch of ``fetch`` bytes and a prefetch as small (the test sets ``site``
    and ``reader_config`` back for full speed)."""
    slow = replace(site, replication=replace(site.replication, max_offsets_per_trigger=100))
    return Puller(
        slow,
        "tokyo",
        ep,
        (stream,),
        urgent=False,
        merger=merger,
        routes=lambda: {"e1": "tokyo"},
        sites=("e1",),
        reader_config={
            "fetch.max.bytes": fetch,
            "message.max.bytes": fetch,
            "max.partition.fetch.bytes": fetch,
            "queued.max.messages.kbytes": fetch // 1024,
            "queued.min.messages": 20,
        },
    )


def test_records_retention_takes_in_the_middle_of_a_read_are_a_gap_and_come_from_history(
    kafka: KafkaBroker,
    kafka_sites: Callable[..., dict[str, KafkaBroker]],
    tmp_path: Path,
) -> None:
    """Review (replication N2): a puller catching up over a slow link had retention
    delete records just ahead of its fetch position; with ``auto.offset.reset=earliest``
    librdkafka moved it to the oldest record left without a word, the gap was looked
    for only at the first record after an assignment, and the cursor committed past
    the hole. The reader stops such a partition (``auto.offset.reset=error``): the jump
    is counted as a gap, and the stream's history (the neighbour's canonical topic)
    brings back what the relay lost. A prefetch of a few hundred records plays the slow
    link: the first round takes 100, then the relay loses everything below 2,000."""
    s = unique("s")
    neighbour = kafka_sites("tokyo")["tokyo"]
    ep = KafkaEndpoint.plaintext(neighbour.bootstrap)
    relay = relay_topic("e1", s)
    ensure_topics(ep, [TopicSpec(canonical_topic(s), 1), TopicSpec(relay, 1)])
    p = Producer({"bootstrap.servers": neighbour.bootstrap, "linger.ms": 0})
    for q in range(1, 3001):
        r = record("ship1", s, q)
        for t in (canonical_topic(s), relay):
            p.produce(t, key=r.key, value=r.value, headers=r.headers())
        if q % 50 == 0:
            assert p.flush(20) == 0  # small batches: a fetch brings a few of them
    site, _ = make_site(kafka.bootstrap, tmp_path, [s])
    merger = Merger(site)
    puller = _slow_puller(site, ep, s, merger)
    try:
        for _ in range(50):  # bounded: the first fetches may take a round or two
            if puller.read >= 100:
                break
            puller.round()
        assert 100 <= puller.read < 2000
        admin = AdminClient({"bootstrap.servers": neighbour.bootstrap})
        (done,) = admin.delete_records([TopicPartition(relay, 0, 2000)]).values()
        done.result(20)
        for _ in range(50):  # bounded: the gap is found at the next fetch
            if puller.gaps:
                break
            puller.round()
        assert 1000 <= puller.gaps <= 1900  # from the fetch position to 2,000, counted once
        puller.site, puller.reader_config = site, {}  # the rest at full speed
        puller.close()
        for _ in range(100):  # bounded: a round reads what is there and returns
            if not puller.round() and puller.idle and not puller.reading_history:
                break
        assert sorted(r.identity.seq for r in canonical(kafka.bootstrap, s)) == list(range(1, 3001))
    finally:
        puller.close()
        merger.close()


def test_history_after_a_gap_starts_past_what_the_canonical_index_proves_held(
    kafka: KafkaBroker,
    kafka_sites: Callable[..., dict[str, KafkaBroker]],
    tmp_path: Path,
) -> None:
    """Review (replication N10): a puller that met a gap read the neighbour's canonical
    topic for history from its start (a parked route reused after the relay retention:
    at HQ, all of history), though it lacked only what the relay lost. The neighbour's
    merge indexes its canonical topic now (``sl.canonical.index``), and a first history
    read starts past the segments whose seqs the site holds. Here the site read 1,500
    of 3,000 records through the relay, the relay lost everything below 2,000, and the
    history read takes about the 500 it lacks (within a segment at each end), not
    2,000."""
    s = unique("s")
    neighbour = kafka_sites("tokyo")["tokyo"]
    ep = KafkaEndpoint.plaintext(neighbour.bootstrap)
    there, _ = make_site(neighbour.bootstrap, tmp_path / "tokyo", [s])
    writer = Merger(there)
    writer.prepare()
    t = ingress_topic(s)
    for b in range(30):  # the neighbour's merge: 30 batches, a segment of its index each
        rows = []
        for q in range(100 * b + 1, 100 * b + 101):
            r = record("ship1", s, q)
            rows.append(SourceRow(t, 0, q, r.key, r.value, list(r.headers())))
        writer.write_rows(b, rows)
        writer._index_due = 0.0
        assert writer.write_index() >= 1
    writer.close()
    relay = relay_topic("e1", s)
    ensure_topics(ep, [TopicSpec(relay, 1)])
    p = Producer({"bootstrap.servers": neighbour.bootstrap, "linger.ms": 0})
    for m in read_to_end(ep, [canonical_topic(s)], settled=True):  # the relay's copies
        p.produce(
            relay, key=m.key(), value=m.value(), headers=m.headers(), timestamp=m.timestamp()[1]
        )
        if (m.offset() or 0) % 50 == 0:
            assert p.flush(20) == 0
    assert p.flush(20) == 0
    site, _ = make_site(kafka.bootstrap, tmp_path / "here", [s])
    merger = Merger(site)
    puller = _slow_puller(site, ep, s, merger, fetch=16384)  # a prefetch of ~120
    try:
        for _ in range(500):  # bounded: a round takes at most 100
            if puller.read >= 1500:
                break
            puller.round()
        at_gap = puller.read
        assert 1500 <= at_gap < 2000
        admin = AdminClient({"bootstrap.servers": neighbour.bootstrap})
        (done,) = admin.delete_records([TopicPartition(relay, 0, 2000)]).values()
        done.result(20)
        for _ in range(50):  # bounded: the gap is found at the next fetch
            if puller.gaps:
                break
            puller.round()
        assert puller.gaps
        puller.site, puller.reader_config = site, {}  # the rest at full speed
        puller.close()
        for _ in range(200):  # bounded: a round reads what is there and returns
            if merger.state.held_for(("ship1", s)).count() == 3000:
                break
            puller.round()
        got = Counter(r.identity.seq for r in canonical(kafka.bootstrap, s))
        assert sorted(got) == list(range(1, 3001)) and max(got.values()) == 1
        lacked = 2000 - at_gap
        # a segment (here a batch of 100) at each end at most: the walk starts at the
        # first segment the site does not wholly hold, and history ends past the
        # millisecond of the relay's oldest record (a batch shares it); before: 2,000+
        assert puller.read_history <= lacked + 200, (puller.read_history, lacked)
        assert puller.skipped_held >= 1000
    finally:
        puller.close()
        merger.close()


def test_a_sites_bulk_feeds_hold_their_shared_budget_while_the_merge_is_busy(
    kafka: KafkaBroker,
    kafka_sites: Callable[..., dict[str, KafkaBroker]],
    tmp_path: Path,
) -> None:
    """Review (replication N12): each feed bounded its own batch (``merge.max_batch_bytes``)
    but a site has a feed per neighbour and merge, and every one could hold a batch
    waiting for the merge's lock: about 6 GB in a mesh of 20. The bulk feeds of a site
    share one budget: with the merge busy, three feeds reading a backlog of 2 MB hold
    at most the budget (and a first record each, so each moves), and once the merge is
    free every record is written once."""
    s = unique("s")
    neighbour = kafka_sites("tokyo")["tokyo"]
    ep = KafkaEndpoint.plaintext(neighbour.bootstrap)
    relay = relay_topic("e1", s)
    ensure_topics(ep, [TopicSpec(relay, 1)])
    site, _ = make_site(kafka.bootstrap, tmp_path, [s])
    merger = Merger(site)
    merger.ready()
    budget = ByteBudget(200_000)
    feeds = [
        Puller(
            site,
            "tokyo",
            ep,
            (s,),
            urgent=False,
            merger=merger,
            routes=lambda: {"e1": "tokyo"},
            sites=("e1",),
            budget=budget,
        )
        for _ in range(3)
    ]

    def pull(feed: Puller) -> None:
        for _ in range(50):  # bounded: the first fetch may take a round or two
            if feed.read:
                return
            feed.round()

    try:
        for f in feeds:  # each assigned at the merge's cursors while the merge is free
            f.round()
        p = Producer({"bootstrap.servers": neighbour.bootstrap})
        for q in range(1, 2001):
            r = record("ship1", s, q, value=bytes(1000))
            p.produce(relay, key=r.key, value=r.value, headers=r.headers())
        assert p.flush(20) == 0
        with merger.busy:  # the merge is busy: every feed's batch waits for it
            threads = [threading.Thread(target=pull, args=(f,)) for f in feeds]
            for t in threads:
                t.start()
            eventually(
                lambda: all(max(f._assigned.values(), default=-1) > 0 for f in feeds),
                what="each feed holding a batch",
            )
            held = budget.used
        for t in threads:
            t.join(60)
        assert 0 < held <= budget.peak <= 200_000 + 3 * 1100
        assert budget.used == 0  # given back once written
        for _ in range(100):  # bounded: the rest, round by round
            if all(not f.round() and f.idle for f in feeds):
                break
        assert sorted(r.identity.seq for r in canonical(kafka.bootstrap, s)) == list(range(1, 2001))
    finally:
        for f in feeds:
            f.close()
        merger.close()


def test_an_ingress_topic_recreated_under_the_ingest_puller_is_read_from_its_start(
    kafka: KafkaBroker, tmp_path: Path
) -> None:
    """Replication review N11, without Spark: the ingest puller has read the site's
    ingress to offset 200; the topic is deleted and created again, and 30 new records
    land at offsets 0-29 of the new one. The merge's cursors were taken in the old
    topic (its id in the marker): they are dropped, the new topic is read from its
    start and all 30 are written, once; a merge started afterwards knows the new id."""
    b = kafka.bootstrap
    s = unique("s")
    create_ingress(b, [s], partitions=1)
    site, _ = make_site(b, tmp_path, [s])
    produce(b, [record("x", s, q) for q in range(1, 201)])
    merger = Merger(site)
    puller = IngestPuller.of(merger)
    try:
        eventually(lambda: puller.round() == 0 and len(canonical(b, s)) == 200, 60, "200 read")
        old_id = merger.state.source_ids[ingress_topic(s)]
        assert merger.state.offsets[(ingress_topic(s), 0)] == 200
        admin = AdminClient({"bootstrap.servers": b})
        admin.delete_topics([ingress_topic(s)])[ingress_topic(s)].result(30)

        def created() -> bool:
            try:
                create_ingress(b, [s], partitions=1)
            except Exception:  # still marked for deletion
                return False
            return True

        eventually(created, 60, "the topic created again")
        produce(b, [record("x", s, q) for q in range(201, 231)])

        def all_written() -> bool:
            puller.round()
            return len(canonical(b, s)) == 230

        eventually(all_written, 60, "the new topic's records written")
        got = Counter(r.identity.seq for r in canonical(b, s))
        assert set(got) == set(range(1, 231)) and max(got.values()) == 1
        assert merger.state.source_ids[ingress_topic(s)] != old_id
    finally:
        puller.close()
        merger.close()
    again = Merger(site)
    try:
        assert again.ready().source_ids == merger.state.source_ids
        assert again.state.offsets[(ingress_topic(s), 0)] == 30
    finally:
        again.close()


def test_a_feed_at_its_end_writes_each_record_as_it_arrives_not_when_its_wait_is_out(
    kafka: KafkaBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every hop of a record (the entry site's ingest puller, then each other site's
    puller) waited for its feed's round to end: the round's poll held what arrived until
    its 0.2 s were out (librdkafka's batch consume), and a round that read nothing paused
    0.2 s more before the next one, up to 0.4 s a hop (bench/replication.py, steady and
    alert lag). A feed now waits in a poll that returns as a record arrives: with a wait
    of ten minutes, three records written one after another are each written while the
    feed waits, and once."""
    monkeypatch.setattr(feed_module, "WAIT_S", 600.0)
    b = kafka.bootstrap
    s = unique("s")
    create_ingress(b, [s], partitions=1)
    site, _ = make_site(b, tmp_path, [s])
    merger = Merger(site)
    puller = IngestPuller.of(merger)
    stop = threading.Event()
    loop = threading.Thread(target=puller.run, args=(stop,), daemon=True)
    try:
        loop.start()
        eventually(lambda: bool(puller._assigned), 60, "the feed assigned and waiting")
        for q in (1, 2, 3):
            produce(b, [record("x", s, q)])
            eventually(lambda q=q: puller.read == q, 60, f"record {q} written in the wait")
    finally:
        stop.set()
        produce(b, [record("x", s, 4)])  # ends the wait; the loop then sees stop
        loop.join(60)
        merger.close()
    assert not loop.is_alive()
    assert sorted(r.identity.seq for r in canonical(b, s)) == [1, 2, 3, 4]


def _kafka_clients() -> int:
    """librdkafka clients alive in this process: a ``rdk:main`` thread each (the count
    bench/site_scale.py takes of a site's driver)."""
    gc.collect()  # a client nothing holds any more ends its threads when collected
    names = []
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
            names.append((task / "comm").read_text().strip())
    return names.count("rdk:main")


def test_a_neighbours_link_probe_pullers_and_repairers_ask_through_one_admin_client(
    kafka: KafkaBroker, kafka_sites: Callable[..., dict[str, KafkaBroker]], tmp_path: Path
) -> None:
    """A site held an admin client per puller, per repairer and for the link probe: five
    a neighbour at two merges, each with librdkafka's threads and connections, for
    metadata, describes and offsets one client answers (bench/site_scale.py: 5-8
    clients and 20-26 threads a neighbour, docs/data-centre.md). Each neighbour's probe,
    pullers and repairers now share one, which answers each of them from that
    neighbour's own Kafka, never another's: with the probe's ``sl.links`` reader, two
    clients a neighbour before any puller reads (three when the probe had its own)."""
    s = unique("s")
    tokyo = kafka_sites("tokyo")["tokyo"]
    ensure_topics(KafkaEndpoint.plaintext(tokyo.bootstrap), [TopicSpec(relay_topic("e1", s), 1)])
    doc = graph_doc({"port": ["tokyo", "hq"], "tokyo": ["port"], "hq": ["port"]}, tmp_path)
    for name, broker in (("port", kafka), ("tokyo", tokyo), ("hq", kafka)):
        doc["sites"][name] |= {"streams": [s, "alerts"], "kafka": {"bootstrap": broker.bootstrap}}
    cfg = parse_config(doc)
    site = cfg.site("port")
    merges = mergers(site, cfg)
    replicator = Replicator(cfg, site, merges)
    links = replicator.links
    try:
        before = _kafka_clients()
        assert len(merges) == 2  # the urgent merge and the rest: two pullers a neighbour
        for n, topics in (("tokyo", {relay_topic("e1", s)}), ("hq", set())):
            pullers = [p for p in replicator.pullers if p.neighbour == n]
            repairers = [r for r in replicator.repairers if r.neighbour == n]
            assert len(pullers) == len(repairers) == 2
            admins = {id(p.admin()) for p in pullers} | {id(r.admin()) for r in repairers}
            assert admins == {id(replicator.admins[n]())}
            # it is that neighbour's: tokyo's relay topic exists at tokyo only
            assert set(pullers[0].describe(frozenset({relay_topic("e1", s)}))) == topics
            link = links.links[n]
            links._probe(link)  # the probe asks through the same client
            assert link.up, link.error
            assert link.admin is replicator.admins[n]
        assert replicator.admins["tokyo"]() is not replicator.admins["hq"]()
        # per neighbour: the admin and the probe's sl.links reader (spark_core/routing.py)
        assert _kafka_clients() - before == 2 * len(links.links)
    finally:
        links.close()
        for m in merges:
            m.close()
