"""The merge's marker keyed per source (spark_core/merge_state.py, ``marker_records``):
each source's cursors are a record of their own in ``sl.merge.marker``, written by the
transaction that moved them, beside the records they account for. Exactly once rests on
those cursors committing with the records; the bytes a site writes to the marker rest on
a transaction writing only what it moved (fleet issue, item 2: rewritten whole, they
grew as the square of the neighbours, 311 KB/s at 20)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from confluent_kafka import Producer

from local_stack.kafka import KafkaBroker
from shorelink.contract import MARKER_TOPIC, canonical_topic, ingress_topic, marker_key, relay_topic
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.reading import read_to_end
from shorelink.ranges import RangeSet
from spark_core.config import SiteConfig
from spark_core.merge import Merger, SourceRow
from spark_core.merge_state import MARKER_FORM, pulled_source
from tests.helpers import unique
from tests.spark_core.helpers import assert_exactly_once, canonical, make_site, record

Marker = list[tuple[bytes, bytes | None]]


def _row(topic: str, offset: int, origin: str, stream: str, seq: int, part: int = 0) -> SourceRow:
    r = record(origin, stream, seq)
    return SourceRow(topic, part, offset, r.key, r.value, list(r.headers()))


def _pulled(neighbour: str, stream: str, topic_id: str = "id1") -> str:
    return pulled_source(neighbour, topic_id, relay_topic(neighbour, stream))


def _marker(bootstrap: str, site: SiteConfig) -> Marker:
    """This site's merge's marker records, in the order written."""
    head = marker_key(site.name)
    return [
        (m.key() or b"", m.value())
        for m in read_to_end(KafkaEndpoint.plaintext(bootstrap), [MARKER_TOPIC])
        if m.key() == head or (m.key() or b"").startswith(head + b"/")
    ]


def _bytes(records: Marker) -> int:
    return sum(len(k) + len(v or b"") for k, v in records)


def test_a_transaction_that_moves_one_source_writes_the_same_marker_bytes_whatever_the_others(
    kafka: KafkaBroker, tmp_path: Path
) -> None:
    """A puller's transaction writes the head and its own source's cursors (and the
    seqs it left pending in the index): the same bytes with 2 other sources or 12.
    Rewritten whole, the marker grew by a source's bytes per neighbour in every
    transaction."""
    b = kafka.bootstrap
    written: dict[int, Marker] = {}
    for n in (2, 12):
        s = unique("s")
        site, _ = make_site(b, tmp_path / str(n), [s])
        merger = Merger(site)
        merger.prepare()
        try:
            for i in range(n):
                merger.write_pulled([_row(_pulled(f"n{i:02d}", s), 0, f"ship{i:02d}", s, 1)])
            before = len(_marker(b, site))
            merger.write_pulled([_row(_pulled("n00", s), 1, "ship00", s, 2)])
            written[n] = _marker(b, site)[before:]
        finally:
            merger.close()
        head = marker_key(site.name)
        assert sorted(k for k, _ in written[n]) == [
            head,
            head + f"/pending/{canonical_topic(s)}/ship00".encode(),
            head + f"/source/{_pulled('n00', s)}".encode(),
        ]
    assert _bytes(written[2]) == _bytes(written[12])


def test_a_restarted_merge_resumes_every_source_at_its_committed_offset_exactly_once(
    kafka: KafkaBroker, tmp_path: Path
) -> None:
    """Transactions that each moved other sources (three neighbours' relay topics, two
    partitions of the site's own ingress): a merge started again finds every cursor
    where its last transaction left it, reads on from there and neither reads a record
    twice nor skips one."""
    b = kafka.bootstrap
    s = unique("s")
    site, _ = make_site(b, tmp_path, [s])
    t = ingress_topic(s)
    logs = {  # (source, partition) -> its records' (origin, seq), in offset order
        (_pulled("n01", s), 0): [("ship-a", q) for q in range(1, 11)],
        (_pulled("n02", s), 0): [("ship-b", q) for q in range(1, 6)],
        (_pulled("n03", s), 0): [("ship-c", q) for q in range(1, 5)],
        (t, 0): [("ship-t0", q) for q in range(1, 7)],
        (t, 1): [("ship-t1", q) for q in range(1, 4)],
    }

    def rows(tp: tuple[str, int], lo: int, hi: int) -> list[SourceRow]:
        return [
            _row(tp[0], o, origin, s, q, tp[1])
            for o, (origin, q) in enumerate(logs[tp])
            if lo <= o < hi
        ]

    a, bb, c, t0, t1 = logs
    first = Merger(site)
    first.prepare()
    try:
        first.write_pulled(rows(a, 0, 5))
        first.write_pulled(rows(bb, 0, 3))
        first.write_rows(0, rows(t0, 0, 4))
        first.write_pulled(rows(a, 5, 8))
        first.write_pulled(rows(c, 0, 2))
        first.write_rows(1, rows(t1, 0, 2))
    finally:
        first.close()
    again = Merger(site)
    again.prepare()
    try:
        cursors = {a: 8, bb: 3, c: 2, t0: 4, t1: 2}
        assert again.state.offsets == cursors
        assert again.state.last_batch == 1
        duplicates = 0
        for tp, at in cursors.items():
            plan = again.write_pulled(rows(tp, at, len(logs[tp])))
            duplicates += plan.duplicates
        assert duplicates == 0
        assert again.state.offsets == {tp: len(log) for tp, log in logs.items()}
    finally:
        again.close()
    assert_exactly_once(
        canonical(b, s),
        {(records[0][0], s): len(records) for records in logs.values()},
    )


def test_a_site_whose_marker_is_of_the_whole_form_starts_from_it_and_writes_the_keyed_form(
    kafka: KafkaBroker, tmp_path: Path
) -> None:
    """A site upgraded with the marker its merge wrote whole (every cursor, tail, source
    id, re-drive mark and source held back in one record) starts from it; its first
    transaction writes the keyed form, whose records then rule: a cursor moved since
    overrides the whole marker's, the others are carried."""
    b = kafka.bootstrap
    s = unique("s")
    site, _ = make_site(b, tmp_path, [s])
    t = ingress_topic(s)
    a, bb = _pulled("n01", s), _pulled("n02", s)
    first = Merger(site)
    first.prepare()  # the topics
    first.close()
    whole = {
        "site": site.name,
        "batch_id": 7,
        "offsets": {a: {"0": 5}, bb: {"0": 3}, t: {"0": 2, "1": 4}},
        "index": {
            canonical_topic(s): {"id": "cid", "to": {"0": 0}, "pending": {"ship-a": [[1, 5]]}}
        },
        "source_ids": {t: "tid"},
        "redrive_keys": "keys1",
        "held_back": [f"shipx/{s}"],
        "written": 5,
        "dead": 0,
        "ts_ms": int(time.time() * 1000),
    }
    p = Producer({"bootstrap.servers": b})
    p.produce(MARKER_TOPIC, key=marker_key(site.name), value=json.dumps(whole).encode())
    assert p.flush(10) == 0
    upgraded = Merger(site)
    upgraded.prepare()
    try:
        state = upgraded.state
        assert state.offsets == {(a, 0): 5, (bb, 0): 3, (t, 0): 2, (t, 1): 4}
        assert state.last_batch == 7 and state.redrive_keys == "keys1"
        assert state.source_ids == {t: "tid"} and set(state.held_back) == {("shipx", s)}
        assert state.index[canonical_topic(s)].pending == {"ship-a": RangeSet([(1, 5)])}
        upgraded.write_pulled([_row(a, 5, "ship-a", s, 6), _row(a, 6, "ship-a", s, 7)])
    finally:
        upgraded.close()
    last = dict(_marker(b, site))
    head = json.loads(last[marker_key(site.name)] or b"")
    assert head["form"] == MARKER_FORM and "offsets" not in head
    assert json.loads(last[marker_key(site.name, part=f"source/{bb}")] or b"") == {
        "offsets": {"0": 3}
    }
    later = Merger(site)
    later.prepare()
    try:
        state = later.state
        assert state.offsets == {(a, 0): 7, (bb, 0): 3, (t, 0): 2, (t, 1): 4}
        assert state.last_batch == 7 and state.redrive_keys == "keys1"
        assert state.source_ids == {t: "tid"} and set(state.held_back) == {("shipx", s)}
        assert state.index[canonical_topic(s)].to == {0: 0}
        assert state.index[canonical_topic(s)].pending == {"ship-a": RangeSet([(1, 7)])}
    finally:
        later.close()


def test_a_superseded_source_leaves_one_tombstone_and_no_cursor(
    kafka: KafkaBroker, tmp_path: Path
) -> None:
    """A neighbour's relay topic recreated (a new topic id) supersedes the old source:
    the transaction that first reads the new one writes a tombstone for the old one's
    record, so the compacted topic forgets it and no restart brings its cursor back."""
    b = kafka.bootstrap
    s = unique("s")
    site, _ = make_site(b, tmp_path, [s])
    old, new = _pulled("n01", s, "id1"), _pulled("n01", s, "id2")
    merger = Merger(site)
    merger.prepare()
    try:
        merger.write_pulled([_row(old, 0, "ship-a", s, 1), _row(old, 1, "ship-a", s, 2)])
        before = len(_marker(b, site))
        merger.write_pulled([_row(new, 0, "ship-a", s, 3)])
        written = _marker(b, site)[before:]
    finally:
        merger.close()
    gone = marker_key(site.name, part=f"source/{old}")
    assert (gone, None) in written
    assert [k for k, v in written if v is None] == [gone]
    again = Merger(site)
    again.prepare()
    try:
        assert again.state.offsets == {(new, 0): 1}
    finally:
        again.close()
