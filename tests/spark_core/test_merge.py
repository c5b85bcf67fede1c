"""The merge writes every identity once to the canonical topic, in seq order per
(origin, stream) within a batch, with the ledger telling exactly what it holds: every
consumer and every other site relies on this."""

from __future__ import annotations

import random
import shutil
import urllib.request
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from local_stack.kafka import KafkaBroker
from shorelink.contract import (
    DEAD_UNKNOWN_TOPIC,
    H_ENTERED,
    H_SEQ,
    H_SITE,
    HEADER_LAYOUT,
    LEDGER_TOPIC,
    MAX_RECORD_BYTES,
    canonical_topic,
    dead_topic,
    entered_ms,
    ingress_topic,
    relay_topic,
)
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.reading import read_to_end
from shorelink.kafka.topics import TopicSpec, ensure_topics, producer_config
from shorelink.ledger import MAX_HOLDINGS_RANGES
from shorelink.ranges import RangeSet
from spark_core import merge as merge_module
from spark_core.config import parse_config
from spark_core.ingest_pull import write_through
from spark_core.merge import Merger, SourceRow, plan_batch, start_merge
from spark_core.merge_batch import ArrowBatch, batch_frame, unwritten
from spark_core.merge_state import (
    DEAD_VALUE_MAX,
    Headers,
    MergeError,
    MergeState,
    admissible,
    forgettable,
    pulled_source,
    source_entry,
)
from spark_core.metrics import serve_metrics
from tests.helpers import unique
from tests.spark_core.helpers import (
    assert_exactly_once,
    canonical,
    create_ingress,
    graph_doc,
    ledger,
    make_site,
    produce,
    produce_raw,
    record,
)


def _row(topic: str, offset: int, origin: str, stream: str, seq: int) -> SourceRow:
    r = record(origin, stream, seq)
    return SourceRow(topic, 0, offset, r.key, r.value, list(r.headers()))


def test_plan_drops_known_and_repeated_identities_and_orders_by_seq() -> None:
    """The pure core: dedup against the state and within the batch, seq order out."""
    t = ingress_topic("nav")
    state = MergeState(held={("a", "nav"): RangeSet.parse("1-2")})
    rows = [_row(t, i, "a", "nav", s) for i, s in enumerate([5, 1, 3, 3, 4, 2])]
    plan = plan_batch(rows, state)
    assert [int(dict(h)[H_SEQ]) for _, _, _, h in plan.canonical] == [3, 4, 5]
    assert plan.duplicates == 3
    assert str(plan.ledger[("a", "nav")]) == "1-5"
    assert plan.offsets == {(t, 0): 6}
    # rows below a committed batch's offsets were handled already (replay, lost checkpoint)
    state.offsets[(t, 0)] = 6
    assert plan_batch(rows, state).skipped == 6


def test_a_record_that_entered_here_carries_when_the_gateway_wrote_it() -> None:
    """``sl.entered``: the ingress record's Kafka timestamp, added by the entry site's
    merge (a stamp some other writer put there is replaced); a pulled record keeps the
    one its entry site gave it."""
    t = ingress_topic("nav")
    pulled = pulled_source("hq", "id1", relay_topic("hq", "nav"))
    forged = [*record("a", "nav", 2).headers(), (H_ENTERED, b"1")]
    from_hq = [*record("b", "nav", 1).headers(), (H_ENTERED, b"1700000000500")]
    rows = [
        SourceRow(t, 0, 0, b"k", b"v", list(record("a", "nav", 1).headers()), 1_700_000_000_100),
        SourceRow(t, 0, 1, b"k", b"v", forged, 1_700_000_000_200),
        SourceRow(pulled, 0, 0, b"k", b"v", from_hq, 1_700_000_000_900),
    ]
    plan = plan_batch(rows, MergeState())
    entered = {_origin_seq(h): [v for k, v in h if k == H_ENTERED] for _, _, _, h in plan.canonical}
    assert entered == {
        ("a", "1"): [b"1700000000100"],
        ("a", "2"): [b"1700000000200"],
        ("b", "1"): [b"1700000000500"],
    }
    assert [h[-1][0] for _, _, _, h in plan.canonical] == [H_ENTERED] * 3  # after the layout
    assert rows[1].headers == forged  # the source row itself is left as it came


def test_a_held_record_that_comes_again_through_another_entry_is_relayed_under_it_once() -> None:
    """A site's ``sl.relay.<E>.*`` holds every record that reached it through E, whichever
    entry's copy came first (review finding 4; tests/spark_core/test_relay_model.py)."""
    t = ingress_topic("nav")
    hq = pulled_source("hq", "id1", relay_topic("hq", "nav"))
    syd = pulled_source("syd", "id2", relay_topic("syd", "nav"))

    def entry_of(topic: str) -> str:
        return source_entry(topic) or "tokyo"

    state = MergeState(
        held={("a", "nav"): RangeSet.parse("1-3")},
        relayed={("hq", "a", "nav"): RangeSet.parse("1-3")},
    )
    rows = [
        _row(t, 0, "a", "nav", 2),  # held (came through hq): tokyo's own relay lacks it
        _row(t, 1, "a", "nav", 4),  # new
        _row(hq, 0, "a", "nav", 3),  # held, and in the hq relay already: nothing
        _row(syd, 0, "a", "nav", 4),  # written by this batch through tokyo: syd's relay too
        _row(syd, 1, "a", "nav", 4),  # the same again: once
        _row(t, 2, "a", "nav", 4),  # through the entry of its first copy: nothing
    ]
    plan = plan_batch(rows, state, entry_of)
    assert [int(dict(h)[H_SEQ]) for _, _, _, h in plan.canonical] == [4] and plan.read_from == [t]
    again = [
        (entry_of(src), int(dict(h)[H_SEQ]))
        for (_, _, _, h), src in zip(plan.again, plan.again_from, strict=True)
    ]
    assert again == [("tokyo", 2), ("syd", 4)] and plan.duplicates == 5
    assert {k: str(v) for k, v in plan.relayed.items()} == {
        ("tokyo", "a", "nav"): "2,4",
        ("syd", "a", "nav"): "4",
    }
    # committed, the same rows read again (a replay) relay nothing more
    state.held.update(plan.ledger)
    state.relayed.update(plan.relayed)
    replay = plan_batch(rows, state, entry_of)
    assert (replay.again, replay.relayed, replay.duplicates) == ([], {}, 6)
    # a site nobody pulls from keeps no relays
    assert plan_batch(rows, MergeState()).relayed == {}


def test_history_is_relayed_under_the_entry_its_records_name_and_held_history_nowhere(
    tmp_path: Path,
) -> None:
    """Review N1: records taken from a neighbour's canonical topic after a gap are what
    the sites behind this one lack too, so each new one is relayed under the entry its
    ``sl.site`` names (one that is no site of the file: entered here), as the merge
    itself files it; a history record the site holds already is relayed again nowhere
    (history only fills what is missing)."""
    cfg = parse_config(graph_doc({"a": ["b"], "b": ["a", "c"], "c": ["b"]}, tmp_path))
    merger = Merger(cfg.site("b"), sites=cfg)
    hist = pulled_source("a", "id1", canonical_topic("nav"))

    def row(offset: int, seq: int, site: str) -> SourceRow:
        r = record("s1", "nav", seq)
        headers = [(k, site.encode() if k == H_SITE else v) for k, v in r.headers()]
        return SourceRow(hist, 0, offset, r.key, r.value, headers)

    state = MergeState(held={("s1", "nav"): RangeSet.parse("1")})
    relay = pulled_source("a", "id2", relay_topic("a", "nav"))
    rows = [
        row(0, 1, "a"),
        row(1, 2, "a"),
        row(2, 3, "c"),
        row(3, 4, "gone"),
        # the relay's copy after history's, in the same batch: a's relay has it already
        _row(relay, 0, "s1", "nav", 2),
    ]
    plan = plan_batch(rows, state, merger._entry)
    assert plan.again == [] and plan.duplicates == 2
    assert {k: str(v) for k, v in plan.relayed.items()} == {
        ("a", "s1", "nav"): "2",
        ("c", "s1", "nav"): "3",
        ("b", "s1", "nav"): "4",
    }
    relays = [
        merger._relay(topic, src, headers)
        for (topic, _, _, headers), src in zip(plan.canonical, plan.read_from, strict=True)
    ]
    assert relays == [relay_topic(e, "nav") for e in ("a", "c", "b")]


def test_what_a_neighbour_stamps_in_sl_site_cannot_grow_the_merges_memory(
    tmp_path: Path,
) -> None:
    """Review (replication N15): the merge cached each record's relay topic by the raw
    ``sl.site`` it carried, so a neighbour stamping every record with a new name grew
    the cache by an entry per record, for ever. Keyed by what decides the relay topic,
    100,000 names cost a handful of entries and each record still goes where its
    source says."""
    cfg = parse_config(graph_doc({"a": ["b"], "b": ["a", "c"], "c": ["b"]}, tmp_path))
    merger = Merger(cfg.site("b"), sites=cfg)
    sources = [
        pulled_source("a", "id1", relay_topic("a", "nav")),
        pulled_source("a", "id2", canonical_topic("nav")),
        ingress_topic("nav"),
    ]
    for i in range(100_000):
        r = record("s1", "nav", i + 1)
        name = f"forged-{i}" if i % 3 else "c"
        headers = [(k, name.encode() if k == H_SITE else v) for k, v in r.headers()]
        topic = merger._relay(canonical_topic("nav"), sources[i % 3], headers)
        want = {0: "a", 1: "c" if name == "c" else "b", 2: "b"}[i % 3]
        assert topic == relay_topic(want, "nav")
    assert len(merger._relays) <= 6


def test_plan_dead_letters_what_breaks_the_contract() -> None:
    """A malformed record must be kept for inspection, never dropped nor fatal."""
    t = ingress_topic("nav")
    good = record("a", "nav", 1)
    bad = [
        SourceRow(t, 0, 0, b"k", b"v", []),  # no headers
        SourceRow(
            t,
            0,
            1,
            b"k",
            b"v",
            [(n, v.replace(b"1", b"x") if n == H_SEQ else v) for n, v in good.headers()],
        ),
        SourceRow(
            t, 0, 2, b"k", b"v", [(n, b"\xff" if n == H_SITE else v) for n, v in good.headers()]
        ),
        SourceRow(ingress_topic("alerts"), 0, 0, b"k", b"v", list(good.headers())),  # wrong stream
        SourceRow("sl.ingress.Bad", 0, 0, b"k", b"v", list(good.headers())),
    ]
    plan = plan_batch([*bad, _row(t, 3, "a", "nav", 1)], MergeState())
    assert [d[0] for d in plan.dead] == [dead_topic("nav")] * 3 + [
        dead_topic("alerts"),
        DEAD_UNKNOWN_TOPIC,
    ]
    assert all(any(n == "sl.dead.reason" for n, _ in d[3]) for d in plan.dead)
    assert len(plan.canonical) == 1


@pytest.mark.spark
def test_duplicates_and_out_of_order_are_written_once_in_seq_order(
    spark: Any, kafka: KafkaBroker, tmp_path: Path
) -> None:
    """Two gateway uploads of the same identities and out-of-order ranges: one copy
    each, ordered, headers intact, ledger exact."""
    b = kafka.bootstrap
    s = unique("s")
    create_ingress(b, [s])
    site, _ = make_site(b, tmp_path, [s])
    produce(b, [record("ship1", s, q) for q in [5, 3, 1, 2, 4]])
    produce(b, [record("ship1", s, q) for q in [3, 4, 5, 6]])  # a second upload
    produce(b, [record("ship2", s, q, key="c2") for q in [2, 1]])
    merger = Merger(site)
    q = start_merge(spark, merger, available_now=True)
    q.awaitTermination(120)
    assert q.exception() is None
    got = canonical(b, s)
    assert_exactly_once(got, {("ship1", s): 6, ("ship2", s): 2})
    # one key -> one partition: in seq order within the batch
    assert [r.identity.seq for r in got if r.identity.origin == "ship1"] == [1, 2, 3, 4, 5, 6]
    # key, value and every sl.* header as the gateway wrote them (sl.site included)
    assert set(got) == {record("ship1", s, q) for q in range(1, 7)} | {
        record("ship2", s, q, key="c2") for q in (1, 2)
    }
    assert {r.site for r in got} == {"tokyo"}
    # each carries when the gateway wrote it: the Kafka timestamp of one of its copies
    # in sl.ingress (the copy the merge took)
    ep = KafkaEndpoint.plaintext(b)
    written: dict[tuple[str, str], set[int]] = {}
    for m in read_to_end(ep, [ingress_topic(s)], settled=True):
        written.setdefault(_origin_seq(m.headers()), set()).add(m.timestamp()[1])
    stamped = {
        _origin_seq(m.headers()): entered_ms(m.headers())
        for m in read_to_end(ep, [canonical_topic(s)], settled=True)
    }
    assert len(stamped) == 8 and all(ms in written[i] for i, ms in stamped.items())
    held = ledger(b)
    assert str(held[("ship1", s)]) == "1-6" and str(held[("ship2", s)]) == "1-2"
    assert merger.totals.duplicates == 3 and merger.totals.written == 8

    # a later run from the same checkpoint writes only what is new
    produce(b, [record("ship1", s, q) for q in [2, 7, 7]])
    q = start_merge(spark, merger, available_now=True)
    q.awaitTermination(120)
    assert_exactly_once(canonical(b, s), {("ship1", s): 7, ("ship2", s): 2})
    assert str(ledger(b)[("ship1", s)]) == "1-7"
    merger.close()


@pytest.mark.spark
def test_a_batch_over_the_byte_bound_reaches_the_driver_in_slices(
    spark: Any, kafka: KafkaBroker, tmp_path: Path
) -> None:
    """Review finding 9: a Spark batch is bounded in records only, so a backlog of
    large records could exceed the driver's memory (and a replay has the same range).
    Past ``merge.max_batch_bytes`` the batch is written in slices of at most that, each
    one transaction with its cursors, so the driver never holds more than the bound; a
    batch that cannot reach it takes no extra Spark job. Exactly once as ever."""
    b = kafka.bootstrap
    s = unique("s")
    create_ingress(b, [s])
    budget = 2 * 1024 * 1024
    site, _ = make_site(b, tmp_path, [s], max_batch_bytes=budget)
    rng = random.Random(9)
    records = [
        record(f"ship{o}", s, q, key=f"c{o}", value=rng.randbytes(200_000))
        for o in range(3)
        for q in range(1, 21)
    ]  # 12 MB, incompressible: six times the bound
    for o in range(3):
        produce(b, records[o * 20 : (o + 1) * 20])
    merger = Merger(site)
    merger.write_through = partial(write_through, merger)
    q = start_merge(spark, merger, available_now=True)
    q.awaitTermination(180)
    assert q.exception() is None
    got = canonical(b, s)
    assert_exactly_once(got, {(f"ship{o}", s): 20 for o in range(3)})
    assert set(got) == set(records)  # every payload as written
    assert merger.totals.sliced == 1
    # the slices: each at most the bound (ten records of 200 KB), so at least six
    assert merger.totals.pulled >= 6
    assert merger.totals.largest_fetch_bytes <= budget  # what the Spark batch left
    # and the site's metrics say so (the real exporter, scraped over HTTP)
    server = serve_metrics("127.0.0.1", 0, None, [merger])
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/metrics") as r:
            families = {f.name: f for f in text_string_to_metric_families(r.read().decode())}
    finally:
        server.shutdown()
    sliced = families["shorelink_spark_merge_batches_sliced"].samples
    assert [(x.labels, x.value) for x in sliced if x.name.endswith("_total")] == [
        ({"merge": "merge"}, 1.0)
    ]
    fetched = families["shorelink_spark_merge_largest_fetch_bytes"].samples
    assert fetched[0].value == merger.totals.largest_fetch_bytes

    # small batches come whole: no slicing, and the offset log spares the measuring job
    produce(b, [record("ship0", s, q) for q in range(21, 24)])
    pulled = merger.totals.pulled
    q = start_merge(spark, merger, available_now=True)
    q.awaitTermination(120)
    assert q.exception() is None
    assert merger.totals.sliced == 1 and merger.totals.pulled == pulled
    assert_exactly_once(canonical(b, s), {("ship0", s): 23, ("ship1", s): 20, ("ship2", s): 20})
    merger.close()


@pytest.mark.spark
def test_checkpoint_deleted_state_comes_from_the_ledger(
    spark: Any, kafka: KafkaBroker, tmp_path: Path
) -> None:
    """A lost checkpoint re-reads ingress from the start; nothing is written twice."""
    b = kafka.bootstrap
    s = unique("s")
    create_ingress(b, [s])
    site, _ = make_site(b, tmp_path, [s])
    produce(b, [record("ship1", s, q) for q in range(1, 41)])
    m1 = Merger(site)
    start_merge(spark, m1, available_now=True).awaitTermination(120)
    m1.close()
    shutil.rmtree(site.query_checkpoint("merge"))
    # the same identities arrive again after the loss (a ship resending)
    produce(b, [record("ship1", s, q) for q in range(30, 46)])
    m2 = Merger(site)
    q = start_merge(spark, m2, available_now=True)
    q.awaitTermination(120)
    assert q.exception() is None
    # the 40 below the marker's offsets (a committed batch handled them) stayed on the
    # executors (merge_batch.unwritten): only the 16 sent again reached the driver
    assert m2.totals.input == 16 and m2.totals.skipped == 0
    assert m2.totals.duplicates == 11 and m2.totals.written == 5
    assert_exactly_once(canonical(b, s), {("ship1", s): 45})
    m2.close()


@pytest.mark.spark
def test_malformed_records_go_to_dead_letter_and_the_query_goes_on(
    spark: Any, kafka: KafkaBroker, tmp_path: Path
) -> None:
    """Bad input is counted and kept in sl.dead.<stream>; good records still flow."""
    b = kafka.bootstrap
    s = unique("s")
    create_ingress(b, [s])
    site, _ = make_site(b, tmp_path, [s])
    good = record("ship1", s, 1)
    hs = list(good.headers())
    produce(b, [good])
    produce_raw(
        b,
        ingress_topic(s),
        [
            (b"k", b"no headers", []),
            (b"k", b"bad seq", [(n, b"x1" if n == H_SEQ else v) for n, v in hs]),
            (b"k", b"seq 0", [(n, b"0" if n == H_SEQ else v) for n, v in hs]),
            (b"k", b"not utf-8", [(n, b"\xff\xfe" if n == H_SITE else v) for n, v in hs]),
        ],
    )
    produce(b, [record("ship1", s, 2)])
    merger = Merger(site)
    q = start_merge(spark, merger, available_now=True)
    q.awaitTermination(120)
    assert q.exception() is None
    assert merger.totals.dead == 4
    dead = list(read_to_end(KafkaEndpoint.plaintext(b), [dead_topic(s)], settled=True))
    assert sorted(bytes(m.value()) for m in dead) == sorted(
        [b"no headers", b"bad seq", b"seq 0", b"not utf-8"]
    )
    assert all(dict(m.headers())["sl.dead.reason"] for m in dead)
    assert_exactly_once(canonical(b, s), {("ship1", s): 2})
    merger.close()


def test_replayed_batch_after_a_crash_writes_nothing_twice(
    kafka: KafkaBroker, tmp_path: Path
) -> None:
    """Spark replays a batch whose transaction committed (crash before its commit log):
    the state rebuilt from the ledger finds every identity. A transaction left open by
    a crashed merge is aborted by the next one, so it never shows."""
    b = kafka.bootstrap
    s = unique("s")
    site, _ = make_site(b, tmp_path, [s])
    t = ingress_topic(s)
    rows = [_row(t, i, "ship1", s, q) for i, q in enumerate(range(1, 11))]
    m1 = Merger(site)
    m1.prepare()
    m1.write_rows(0, rows)
    m1.close()
    # a zombie: a merge that began a transaction and died before committing it
    zombie = Producer({"bootstrap.servers": b, "transactional.id": site.merge.transactional_id})
    zombie.init_transactions(20)
    zombie.begin_transaction()
    zombie.produce(
        canonical_topic(s),
        key=b"c1",
        value=b"zombie",
        headers=list(record("ship1", s, 11).headers()),
    )
    zombie.flush(10)
    m2 = Merger(site)
    m2.prepare()  # fences the zombie, aborting its transaction
    plan = m2.write_rows(0, rows)  # the replay
    assert plan.canonical == [] and plan.skipped == 10
    # even without the marker's offsets, the ledger alone recognises every identity
    fresh = [_row(t, 100 + i, "ship1", s, q) for i, q in enumerate(range(1, 12))]
    plan = m2.write_rows(1, fresh)
    assert plan.duplicates == 10 and len(plan.canonical) == 1
    m2.close()
    got = canonical(b, s)
    assert_exactly_once(got, {("ship1", s): 11})
    assert b"zombie" not in {r.value for r in got}


def _origin_seq(headers: Any) -> tuple[str, str]:
    h = dict(headers)
    return h["sl.origin"].decode(), h[H_SEQ].decode()


def _when(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC)


def _kafka_frame(spark: Any, rows: list[SourceRow]) -> Any:
    """Rows with the Kafka source's schema, as the merge's micro-batch has them."""
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    schema = StructType(
        [
            StructField("topic", StringType()),
            StructField("partition", IntegerType()),
            StructField("offset", LongType()),
            StructField("key", BinaryType()),
            StructField("value", BinaryType()),
            StructField("headers", ArrayType(header)),
            StructField("timestamp", TimestampType()),
        ]
    )
    data = [
        (r.topic, r.partition, r.offset, r.key, r.value, r.headers or None, _when(r.written_ms))
        for r in rows
    ]
    return spark.createDataFrame(data, schema).coalesce(1)


@pytest.mark.spark
def test_spark_vouching_never_changes_what_the_plan_decides(spark: Any) -> None:
    """Spark pre-checks the headers so the driver can skip the contract check for
    well-formed rows; on any row it must agree with ``Record.from_kafka`` or leave the
    row to it, else a bad record could reach a canonical topic (or a good one die)."""
    s = unique("s")
    t, inbox = ingress_topic(s), f"sl.inbox.hq.{s}"  # the old inbox topics: no longer read

    def hdrs(n: int, **change: bytes | None) -> Headers:
        """The contract's headers of identity ``a/<s>/n``, with some values changed."""
        return [(k, change.get(k.removeprefix("sl."), v)) for k, v in record("a", s, n).headers()]

    cases: list[tuple[str, Headers, bool]] = [
        (t, hdrs(1), True),
        (inbox, hdrs(2), False),
        (t, hdrs(3, seq=b"0003"), False),  # leading zeros: seq 3, good
        (t, hdrs(1), True),  # a duplicate
        (t, [*hdrs(4), ("x-extra", b"1")], False),  # other layout, still good
        (t, hdrs(5)[::-1], False),  # other order, still good
        (t, [*hdrs(6), ("sl.seq", b"7")], False),  # the last sl.seq counts: 7
        (t, hdrs(8, mqtt_topic="ship/a/kühl".encode()), False),  # UTF-8, good
        (t, hdrs(9, origin=b"a\n"), False),  # a name is matched whole: no final newline
        (t, hdrs(10, seq=b"1" * 24), False),  # beyond int64: breaks the contract (review N4)
        (t, hdrs(11, mqtt_topic=None), False),  # a null value is skipped: good
        (t, hdrs(12, seq=b"0"), False),
        (t, hdrs(13, seq=b" 13"), False),
        (t, hdrs(14, seq="١٤".encode()), False),  # non-ASCII digits
        (t, hdrs(15, ts=b"15a"), False),
        (t, hdrs(16, site=b"\xff"), False),
        (t, hdrs(17, site=None), False),
        (t, hdrs(18, stream=b"other"), False),
        (t, hdrs(19, origin=b"Bad"), False),
        (t, [], False),
        (f"sl.ingress.{s}.x", hdrs(20), False),
        ("sl.ingress.Bad", hdrs(21), False),
        # Spark vouches (stream = topic's); Python's name check still says no stream
        ("sl.ingress.Bad", hdrs(22, stream=b"Bad"), True),
        (t, hdrs(23, mqtt_topic=b"\xc3"), False),  # not UTF-8
        (f"sl.ingress.{s}.x", hdrs(24, stream=f"{s}.x".encode()), False),
    ]
    rows = [
        SourceRow(topic, 0, i, b"k", b"v%d" % i, hs, 1_700_000_000_000 + i)
        for i, (topic, hs, _) in enumerate(cases)
    ]
    frame = _kafka_frame(spark, rows)
    assert plan_batch(ArrowBatch(batch_frame(frame.limit(0)).toArrow()), MergeState()).input == 0
    batch = ArrowBatch(batch_frame(frame).toArrow())
    assert [bool(o) for o in batch.origins] == [vouched for _, _, vouched in cases]
    by_spark, by_python = plan_batch(batch, MergeState()), plan_batch(rows, MergeState())
    assert by_spark == by_python
    assert len(by_spark.canonical) == 7 and len(by_spark.dead) == 17
    # each written record entered here: stamped with its ingress record's timestamp
    stamps = [h[-1] for _, _, _, h in by_spark.canonical]
    assert stamps == [
        (H_ENTERED, b"%d" % (1_700_000_000_000 + int(v[1:]))) for _, _, v, _ in by_spark.canonical
    ]
    assert by_spark.duplicates == 1


def test_plan_dead_letters_a_record_over_the_size_limit_and_writes_the_rest() -> None:
    """A record over MAX_RECORD_BYTES (a writer that skipped the gateway) must not fail
    the transaction on every replay, which would stop the site's merge for good."""
    t = ingress_topic("nav")
    big = record("a", "nav", 2, value=b"v" * (MAX_RECORD_BYTES + 1))
    rows = [_row(t, 0, "a", "nav", 1), SourceRow(t, 0, 1, big.key, big.value, big.headers())]
    pulled = pulled_source("hq", "AAAA", relay_topic("tokyo", "nav"))
    rows.append(_row(pulled, 2, "a", "nav", 3))
    plan = plan_batch(rows, MergeState())
    assert [int(dict(h)[H_SEQ]) for _, _, _, h in plan.canonical] == [1, 3]
    # each written record keeps where it was read from (its entry), the big one dropped
    assert plan.read_from == [t, pulled]
    ((topic, _, value, headers),) = plan.dead
    assert topic == dead_topic("nav") and len(value or b"") == DEAD_VALUE_MAX
    assert b"MAX_RECORD_BYTES" in dict(headers)["sl.dead.reason"]
    assert str(plan.ledger[("a", "nav")]) == "1,3"  # seq 2 is not held: the audit shows it


@pytest.mark.spark
def test_a_record_at_the_limit_is_merged_and_one_over_is_dead_lettered(
    spark: Any, kafka: KafkaBroker, tmp_path: Path
) -> None:
    """Every hop of the site takes a record at the limit: the ingress topic, Spark's
    source, the merge's producer and the canonical topic."""
    b = kafka.bootstrap
    s = unique("s")
    ensure_topics(
        KafkaEndpoint.plaintext(b), [TopicSpec(ingress_topic(s), partitions=1)]
    )  # as the gateway makes it
    site, _ = make_site(b, tmp_path, [s])
    topic = f"ship/ship1/{s}"
    at_limit = record("ship1", s, 1, value=b"a" * (MAX_RECORD_BYTES - 2 - len(topic)))
    over = record("ship1", s, 2, value=b"o" * (MAX_RECORD_BYTES + 10))
    p = Producer(producer_config(KafkaEndpoint.plaintext(b)))
    for r in (at_limit, over, record("ship1", s, 3)):
        p.produce(ingress_topic(s), key=r.key, value=r.value, headers=r.headers())
    assert p.flush(20) == 0
    merger = Merger(site)
    q = start_merge(spark, merger, available_now=True)
    q.awaitTermination(120)
    assert q.exception() is None
    got = canonical(b, s)
    assert [r.identity.seq for r in got] == [1, 3]
    assert got[0].value == at_limit.value
    (dead,) = list(read_to_end(KafkaEndpoint.plaintext(b), [dead_topic(s)], settled=True))
    assert len(dead.value() or b"") == DEAD_VALUE_MAX
    merger.close()


def test_plan_keeps_a_ledger_entry_within_the_range_bound() -> None:
    """A ledger value is rewritten with every batch and must fit one Kafka record: a
    record that would split an entry already at MAX_HOLDINGS_RANGES is dead-lettered,
    one that extends a range is written."""
    t = ingress_topic("nav")
    full = RangeSet((3 * i + 1, 3 * i + 1) for i in range(MAX_HOLDINGS_RANGES))  # 1,4,7,...
    assert len(full) == MAX_HOLDINGS_RANGES
    top = 3 * MAX_HOLDINGS_RANGES
    state = MergeState(held={("a", "nav"): full})
    seqs = [
        2,
        top + 5,
        top + 7,
        3 * 7 + 2,
        top - 2 + 1,
    ]  # extends, splits, splits, extends, extends
    rows = [_row(t, i, "a", "nav", s) for i, s in enumerate(seqs)]
    plan = plan_batch(rows, state)
    written = sorted(int(dict(h)[H_SEQ]) for _, _, _, h in plan.canonical)
    assert written == [2, 23, top - 1]
    assert len(plan.dead) == 2
    assert all(b"ranges already" in dict(h)["sl.dead.reason"] for _, _, _, h in plan.dead)
    assert len(plan.ledger[("a", "nav")]) == MAX_HOLDINGS_RANGES


def test_a_seq_its_neighbour_in_the_same_batch_joins_to_the_entry_is_taken_at_the_bound() -> None:
    """Found by CI: an entry at the bound holds 3 on; a batch brings 1 and 2. Taken
    seq by seq, 1 touches nothing held and was refused, then 2 extended 3: the batch
    left a hole at 1 that the bound never needed (the re-drive's pass of a catch-up
    brought the two together and refused 1 again, for good). Decided on the batch's
    runs, 1-2 extends 3: both are written."""
    t = ingress_topic("nav")
    bound = MAX_HOLDINGS_RANGES
    full = RangeSet((3 * i + 3, 3 * i + 4) for i in range(bound))  # 3-4,6-7,9-10,...
    assert len(full) == bound
    state = MergeState(held={("a", "nav"): full})
    far = 3 * bound + 10
    rows = [_row(t, i, "a", "nav", s) for i, s in enumerate([2, far, 1, far + 1])]
    plan = plan_batch(rows, state)
    written = sorted(int(dict(h)[H_SEQ]) for _, _, _, h in plan.canonical)
    assert written == [1, 2]  # far-far+1 would be one range more: refused, both
    assert sorted(int(dict(h)[H_SEQ]) for _, _, _, h in plan.dead) == [far, far + 1]
    assert plan.held_back == {("a", "nav"): RangeSet([(far, far + 1)])}
    assert len(plan.ledger[("a", "nav")]) == bound


@given(
    st.lists(st.integers(1, 80), max_size=50),
    st.lists(st.integers(1, 80), max_size=50),
    st.integers(1, 12),
)
def test_a_batch_takes_all_it_can_and_keeps_the_entry_within_the_bound(
    held_seqs: list[int], new_seqs: list[int], bound: int
) -> None:
    """Over any entry and any batch: what is taken keeps the entry within the bound (or
    within what it was, past it already); all of it when all of it fits; every seq
    next to the entry or to a run taken is taken; and each run refused would pass the
    bound if it were taken too."""
    held = RangeSet.from_seqs(held_seqs)
    new = RangeSet.from_seqs(new_seqs).difference(held)
    taken = admissible(held, new, bound)
    assert new.contains_all(taken)
    after = held.copy()
    after.update(taken)
    assert len(after) <= max(bound, len(held))
    both = held.copy()
    both.update(new)
    if len(both) <= bound:
        assert taken == new
    refused = new.difference(taken)
    for lo, hi in refused:
        assert not after.overlaps(lo - 1, hi + 1)  # it touches nothing held or taken
        more = after.copy()
        more.add_range(lo, hi)
        assert len(more) > bound


@pytest.mark.spark
@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.dictionaries(
        st.tuples(
            st.sampled_from(["sl.ingress.a", "sl.ingress.b", "n/id/sl.relay.x.a"]),
            st.integers(0, 1),
        ),
        st.integers(0, 12),
        max_size=6,
    )
)
def test_a_spark_batch_keeps_only_the_rows_at_or_above_their_committed_offset(
    spark: Any, committed: dict[tuple[str, int], int]
) -> None:
    """What the ingest puller wrote first (below the merge's committed offset of its
    partition) stays on the executors; every other row reaches the driver, and a pulled
    source's cursor (a name with slashes) filters nothing."""
    rows = [
        SourceRow(t, p, o, b"k", b"v", [], 1_700_000_000_000)
        for t in ("sl.ingress.a", "sl.ingress.b")
        for p in (0, 1)
        for o in range(10)
    ]
    frame = _kafka_frame(spark, rows)
    kept = ArrowBatch(batch_frame(unwritten(frame, committed)).toArrow())
    got = sorted(zip(kept.topics, kept.partitions, kept.offsets, strict=True))
    want = sorted(
        (r.topic, r.partition, r.offset)
        for r in rows
        if r.offset >= committed.get((r.topic, r.partition), 0)
    )
    assert got == want


#: header values a writer that skipped the gateway (or a neighbour) can put in a source
#: topic: the contract's own, and everything around it
_hostile_value = st.one_of(
    st.none(),
    st.binary(max_size=24),
    st.sampled_from([b"ship1", b"nav", b"1", b"0", b"9" * 19, b"\xff", b"a\n", b"", b"-1"]),
    st.integers(0, 2**70).map(b"%d".__mod__),
)
_hostile_headers = st.lists(
    st.tuples(st.sampled_from([*HEADER_LAYOUT, H_ENTERED, "x", "sl.seq ", ""]), _hostile_value),
    max_size=9,
)
_hostile_rows = st.lists(
    st.tuples(
        st.sampled_from(["sl.ingress.nav", "sl.ingress.alerts", "sl.ingress.Bad", "sl.ingress."]),
        _hostile_headers,
        st.one_of(st.none(), st.binary(max_size=40)),
    ),
    max_size=25,
)


def _hostile(rows: list[tuple[str, Headers, bytes | None]]) -> list[SourceRow]:
    return [
        SourceRow(t, 0, i, b"k", v, hs, 1_700_000_000_000 + i) for i, (t, hs, v) in enumerate(rows)
    ]


def _accounted(plan: Any, n: int) -> None:
    """Every row is written once, dead-lettered with a reason, or a duplicate."""
    assert plan.input == n
    assert len(plan.canonical) + len(plan.dead) + plan.duplicates == n
    assert all(any(k == "sl.dead.reason" for k, _ in d[3]) for d in plan.dead)


@given(_hostile_rows)
def test_the_merge_plans_every_hostile_record_and_stops_for_none(
    rows: list[tuple[str, Headers, bytes | None]],
) -> None:
    """Issue item 3, the merge: whatever headers, topic and value a source record has,
    the plan neither raises nor loses it: written once, dead-lettered with a reason (a
    dead letter fails no transaction on replay), or counted as a duplicate."""
    _accounted(plan_batch(_hostile(rows), MergeState()), len(rows))


@pytest.mark.spark
@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(_hostile_rows)
def test_spark_reads_every_hostile_record_as_the_plan_does(
    spark: Any, rows: list[tuple[str, Headers, bytes | None]]
) -> None:
    """The same hostile records through Spark's own reading of them (the vouch, the
    Arrow batch the driver plans): the query raises nothing and decides as the
    pure plan does."""
    source = _hostile(rows)
    batch = ArrowBatch(batch_frame(_kafka_frame(spark, source)).toArrow())
    by_spark = plan_batch(batch, MergeState())
    _accounted(by_spark, len(rows))
    assert by_spark == plan_batch(source, MergeState())


@settings(max_examples=100, deadline=2000)
@given(
    st.lists(st.integers(1, 60), max_size=40),
    st.lists(st.integers(1, 60), max_size=40),
    st.integers(1, 12),
)
def test_forgetting_keeps_an_entry_within_the_bound_and_forgets_all_that_fits(
    held_seqs: list[int], lost_seqs: list[int], bound: int
) -> None:
    """Review 9, finding 3: forgetting what a canonical topic lost (a partition's
    prefix, interleaved with seqs still held) split a ship's entry past the bound on
    holes, and every reader of the ledger refuses such an entry. What is forgotten is
    held and lost; the entry stays within the bound (or within what it was, if past
    it already); when forgetting all of it fits, all of it is forgotten; and no more is
    left held than the bound forces (each split kept is one the bound had no room for)."""
    held, lost = RangeSet.from_seqs(held_seqs), RangeSet.from_seqs(lost_seqs)
    gone = forgettable(held, lost, bound)
    both = lost.difference(lost.difference(held))
    assert both.contains_all(gone)
    left = held.difference(gone)
    assert len(left) <= max(bound, len(held))
    if len(held.difference(both)) <= bound:
        assert gone == both
    kept = both.difference(gone)
    if kept:  # one more run forgotten would pass the bound
        lo, hi = next(iter(kept))
        more = gone.copy()
        more.add_range(lo, hi)
        assert len(held.difference(more)) > bound


def test_forgetting_a_lost_prefix_keeps_the_ledger_entry_within_the_bound(
    kafka: KafkaBroker, tmp_path: Path
) -> None:
    """Review 9, finding 3, on real Kafka: seqs 1-20 held, every even one up to 12 lost
    (the ship's other container's partition lost its prefix). Forgetting all of them
    made 7 ranges of an entry whose bound is 4; the merge forgets 2, 4 and 6 (4 ranges)
    and still holds the rest: the entry in sl.ledger and in memory is within the bound,
    and a merge that starts from it holds what it says."""
    s = unique("s")
    site, _ = make_site(kafka.bootstrap, tmp_path, [s])
    source = pulled_source("tokyo", "tid", relay_topic("e1", s))
    rows = [
        SourceRow(source, 0, q, r.key, r.value, list(r.headers()))
        for q in range(1, 21)
        for r in [record("bigblue", s, q)]
    ]
    merger = Merger(site)
    merger.max_ranges = 4
    try:
        merger.ready()
        merger.write_pulled(rows)
        lost = RangeSet.from_seqs([2, 4, 6, 8, 10, 12])
        forgotten = merger.forget({("bigblue", s): lost})
        assert forgotten == {("bigblue", s): RangeSet.from_seqs([2, 4, 6])}
        want = RangeSet.from_seqs([1, 3, 5, *range(7, 21)])
        assert merger.state.held_for(("bigblue", s)) == want
    finally:
        merger.close()
    assert ledger(kafka.bootstrap)[("bigblue", s)] == want
    again = Merger(site)
    try:
        again.ready()
        assert again.state.held_for(("bigblue", s)) == want
    finally:
        again.close()


def test_a_merge_refuses_to_start_from_its_ledger_with_an_entry_past_the_bound(
    kafka: KafkaBroker, tmp_path: Path
) -> None:
    """Review 9, finding 3: an entry past the bound on holes in the site's own ledger
    was skipped at start-up, so the merge held nothing of that ship and wrote every
    seq of it again (repair and pullers offer them): duplicates. It refuses to start
    instead, naming the entry, and starts once a later entry of the key replaces it.
    (The session's broker: the entry is replaced whatever happens, before any other
    test of this worker reads the ledger.)"""
    b = kafka.bootstrap
    s = unique("s")
    site, _ = make_site(b, tmp_path, [s])
    first = Merger(site)  # the site's topics made
    first.ready()
    first.close()
    p = Producer({"bootstrap.servers": b})
    key = f"bigblue/{s}".encode()
    p.produce(LEDGER_TOPIC, key=key, value=",".join(str(2 * i + 1) for i in range(10_001)))
    try:
        assert p.flush(30) == 0
        refusing = Merger(site)
        try:
            with pytest.raises(MergeError, match="more than 10000") as refused:
                refusing.ready()
            assert key.decode() in str(refused.value) and refused.value.retryable is False
            with pytest.raises(MergeError, match="more than 10000"):  # nor a batch after it
                refusing.write_pulled([])
        finally:
            refusing.close()
    finally:
        p.produce(LEDGER_TOPIC, key=key, value=b"1-5")
        assert p.flush(30) == 0
    merger = Merger(site)
    try:
        merger.ready()
        assert merger.state.held_for(("bigblue", s)) == RangeSet([(1, 5)])
    finally:
        merger.close()


@pytest.mark.spark
def test_a_spark_batch_under_way_when_its_source_topic_is_recreated_writes_none_of_it(
    spark: Any, kafka: KafkaBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review 9, finding 7: the query's batch has read offsets 5000-5004 of the site's
    ingress topic when the ingest puller's round finds the topic deleted and created
    again (its cursors dropped: read from its start). Written, the batch set the new
    topic's cursor to 5005, and the puller skipped its first 5005 records, which only
    this site holds. The batch writes nothing of that topic; its cursor stays dropped.
    The query's next batch, planned after, is written as usual."""
    s = unique("s")
    t = ingress_topic(s)
    site, _ = make_site(kafka.bootstrap, tmp_path, [s])
    m = Merger(site)

    def rows(first: int, seqs: range) -> list[SourceRow]:
        return [
            SourceRow(t, 0, first + i, r.key, r.value, list(r.headers()), 1_700_000_000_000)
            for i, q in enumerate(seqs)
            for r in [record("bigblue", s, q)]
        ]

    try:
        m.ready()
        assert m.adopt_sources({t: "first-id"}) == []
        under_way = merge_module.ArrowBatch

        def recreated_meanwhile(table: Any) -> Any:
            if m.state.source_ids[t] == "first-id":  # once: the puller's round
                assert m.adopt_sources({t: "second-id"}) == [t]
            return under_way(table)

        monkeypatch.setattr(merge_module, "ArrowBatch", recreated_meanwhile)
        m.process_batch(_kafka_frame(spark, rows(5000, range(1, 6))), 0)
        assert (t, 0) not in m.state.offsets
        assert canonical(kafka.bootstrap, s) == []
        monkeypatch.setattr(merge_module, "ArrowBatch", under_way)
        m.process_batch(_kafka_frame(spark, rows(0, range(1, 4))), 1)
        assert m.state.offsets[(t, 0)] == 3
        assert sorted(r.identity.seq for r in canonical(kafka.bootstrap, s)) == [1, 2, 3]
    finally:
        m.close()
