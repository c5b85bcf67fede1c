"""The feeds' batches waiting for their merge are written together (spark_core/
merge_queue.py): each batch was a transaction of its own, and on a busy site a batch
waited for every commit ahead of it. What one transaction takes stays within the
merge's batch bytes; each feed learns what became of its own batch (its own unproved
records: a forging neighbour parks its feed, not another's; the failure of the
transaction it was written in)."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest

from local_stack.kafka import KafkaBroker
from shorelink.contract import canonical_topic, relay_topic
from spark_core.merge import Merger
from spark_core.merge_queue import WriteQueue, rows_bytes, settle
from spark_core.merge_state import (
    BatchPlan,
    MergeError,
    MergeState,
    SourceRow,
    plan_batch,
    pulled_source,
)
from tests.helpers import eventually, unique
from tests.spark_core.helpers import canonical, make_site, record, set_max_message_bytes
from tests.spark_core.test_merge_proofs import FROM_G, FROM_N, GENUINE, KEYS, _forged, _rows


def _pulled(source: str, seqs: range, stream: str = "containers") -> list[SourceRow]:
    out = []
    for offset, q in enumerate(seqs):
        r = record("x", stream, q)
        out.append(SourceRow(source, 0, offset, r.key, r.value, list(r.headers())))
    return out


def test_batches_waiting_together_are_taken_up_to_the_cap_and_the_first_always() -> None:
    """The merge plans no more at once than a batch's bytes: batches that wait together
    go in one transaction while they fit, the rest waits in order; a first batch over
    the cap still goes (every feed moves)."""
    one = _pulled("a", range(1, 11))
    size = rows_bytes(one)
    q = WriteQueue(cap=2 * size)
    first, second, third = q.add(one), q.add(_pulled("b", range(1, 11))), q.add(one)
    assert q.take() == [first, second]
    assert q.take() == [third] and len(q) == 0
    big = WriteQueue(cap=size // 2)
    alone, after = big.add(one), big.add(one)
    assert big.take() == [alone] and big.take() == [after]


def test_each_feed_of_a_shared_transaction_gets_its_own_unproved_and_the_failure() -> None:
    """The feed guard parks a neighbour whose copies fail their ship's proof: written
    with a genuine neighbour's batch, the forger's count stays its own. A transaction
    that fails fails every batch in it: its writer gets the error, the others a
    MergeError of it, fatal if it was (a fenced merge stops every feed)."""
    nasty = _rows([(FROM_N, _forged(q, 1 + q % 3)) for q in range(1, 11)])
    good = _rows([(FROM_G, g) for g in GENUINE[:10]])
    q = WriteQueue(cap=1 << 30)
    wn, wg = q.add(nasty), q.add(good)
    group = q.take()
    plan = plan_batch([*nasty, *good], MergeState(), None, KEYS)
    assert plan.unproved == 10
    settle(group, wg, plan)
    assert (wn.outcome().unproved, wg.outcome().unproved) == (10, 0)
    assert len(wg.outcome().canonical) == 10

    fenced = MergeError("fenced", fatal=True)
    wn, wg = q.add(nasty), q.add(good)
    settle(q.take(), wg, error=fenced)
    with pytest.raises(MergeError) as own:
        wg.outcome()
    assert own.value is fenced
    with pytest.raises(MergeError, match="another feed's batch: fenced") as other:
        wn.outcome()
    assert other.value.fatal and other.value.__cause__ is fenced


def test_feeds_waiting_for_a_busy_merge_are_written_in_one_transaction_each_record_once(
    kafka: KafkaBroker, tmp_path: Path
) -> None:
    """Three neighbours' feeds hand the merge their batches while it is busy (two of
    them carrying the same ten records): once it is free, one transaction writes all
    three, each record once, with every feed's cursor; each feed returns."""
    b = kafka.bootstrap
    s = unique("s")
    site, _ = make_site(b, tmp_path, [s])
    merger = Merger(site)
    merger.ready()
    sources = [pulled_source(n, f"id-{n}", relay_topic("e1", s)) for n in ("n1", "n2", "n3")]
    batches = [
        _pulled(sources[0], range(1, 21), s),
        _pulled(sources[1], range(11, 31), s),
        _pulled(sources[2], range(31, 41), s),
    ]
    plans: list[BatchPlan] = []
    try:
        with merger.busy:
            feeds = [
                threading.Thread(target=lambda rows=rows: plans.append(merger.write_pulled(rows)))
                for rows in batches
            ]
            for t in feeds:
                t.start()
            eventually(lambda: len(merger._queue) == 3, 30, "three batches waiting")
            commits = merger.commits
        for t in feeds:
            t.join(60)
        assert len(plans) == 3 and not any(t.is_alive() for t in feeds)
        assert merger.commits == commits + 1
        assert {src: merger.state.offsets[(src, 0)] for src in sources} == dict(
            zip(sources, (20, 20, 10), strict=True)
        )
        assert sorted(r.identity.seq for r in canonical(b, s)) == list(range(1, 41))
    finally:
        merger.close()


def test_a_batch_the_merge_cannot_write_fails_its_own_feed_not_the_others_in_its_transaction(
    kafka: KafkaBroker, tmp_path: Path
) -> None:
    """Three neighbours' batches queued for one transaction (the pullers' loop queues
    every batch of its turn); one holds a record the site's Kafka refuses (its canonical
    topic's max.message.bytes below it). That transaction fails; each batch is written
    again apart: the two others' records are written once with their cursors, and only
    the third's feed gets the failure (before, all three did, every turn: a site routed
    around every neighbour, review finding 11)."""
    b = kafka.bootstrap
    s = unique("s")
    site, _ = make_site(b, tmp_path, [s])
    merger = Merger(site)
    sources = [pulled_source(n, f"id-{n}", relay_topic("e1", s)) for n in ("n1", "n2", "n3")]
    try:
        first_source = pulled_source("n0", "id-n0", relay_topic("e1", s))
        merger.write_pulled(_pulled(first_source, range(1, 2), s))  # the topics made
        set_max_message_bytes(b, canonical_topic(s), 100_000)
        r = record("big", s, 1, value=random.randbytes(200_000))  # no compression helps
        poison = [SourceRow(sources[1], 0, 0, r.key, r.value, list(r.headers()))]
        waiting = [
            merger.enqueue(_pulled(sources[0], range(2, 21), s)),
            merger.enqueue(poison),
            merger.enqueue(_pulled(sources[2], range(21, 31), s)),
        ]
        first = merger.written(waiting[0])
        assert first.canonical and waiting[2].done and waiting[2].error is None
        with pytest.raises(Exception) as refused:
            merger.written(waiting[1])
        assert "written with another" not in str(refused.value)  # its own failure
        assert merger.written(waiting[2]).canonical
        assert (sources[1], 0) not in merger.state.offsets
        assert merger.state.offsets[(sources[2], 0)] == 10
        held = sorted((r.identity.origin, r.identity.seq) for r in canonical(b, s))
        assert held == sorted([("x", q) for q in range(1, 31)])
    finally:
        merger.close()
