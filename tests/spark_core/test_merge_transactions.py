"""The merge handles Kafka's transaction errors as librdkafka defines them. A fenced
merge must not re-initialise its producer on the next batch: that would fence the merge
that took over, which would do the same back (two writers of the canonical topics
taking turns, each failing the other's batches)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from local_stack.kafka import KafkaBroker
from shorelink.contract import MARKER_TOPIC, ingress_topic, marker_key, relay_topic
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.reading import read_to_end
from shorelink.ranges import RangeSet
from spark_core.config import parse_config
from spark_core.merge import Merger, SourceRow, fence_predecessors
from spark_core.merge_state import MergeError
from tests.helpers import unique
from tests.spark_core.helpers import (
    assert_exactly_once,
    canonical,
    make_site,
    record,
    site_doc,
)


def _row(topic: str, offset: int, origin: str, stream: str, seq: int) -> SourceRow:
    r = record(origin, stream, seq)
    return SourceRow(topic, 0, offset, r.key, r.value, list(r.headers()))


def test_a_fenced_merge_fails_its_batches_and_never_fences_back(
    kafka: KafkaBroker, tmp_path: Path
) -> None:
    b = kafka.bootstrap
    s = unique("s")
    site, _ = make_site(b, tmp_path, [s])
    t = ingress_topic(s)
    rows = [_row(t, i, "ship1", s, q) for i, q in enumerate(range(1, 11))]
    old = Merger(site)
    old.prepare()
    new = Merger(site)
    new.prepare()  # same transactional.id: fences `old`
    try:
        with pytest.raises(MergeError) as first:
            old.write_rows(0, rows)
        assert first.value.fatal and "fenced" in str(first.value)
        assert json.loads(old.status_path.read_text())["state"] == "fenced"
        # the next batch of the fenced merge fails too, without re-initialising
        with pytest.raises(MergeError) as again:
            old.write_rows(0, rows)
        assert "fenced" in str(again.value)
        # nor when the supervisor restarts its query (start_merge -> prepare)
        with pytest.raises(MergeError, match="fenced"):
            old.prepare()
        # ... so the merge that took over still writes
        plan = new.write_rows(0, rows)
        assert len(plan.canonical) == 10
    finally:
        old.close()
        new.close()
    assert_exactly_once(canonical(b, s), {("ship1", s): 10})


@pytest.mark.parametrize("old_query", ["merge", "merge-urgent"])
def test_a_site_started_with_other_urgent_streams_fences_every_earlier_merge(
    kafka: KafkaBroker, tmp_path: Path, old_query: str
) -> None:
    """Review (replication N17): a merge fenced only the older holder of its own
    transactional id, so after ``urgent`` changed between two runs the old ``merge``
    (every stream) kept writing alerts beside the new ``merge-urgent``, or the old
    ``merge-urgent`` beside the new ``merge``: both wrote the same records. A site's
    start fences every merge an earlier run may have left, whatever its layout."""
    b = kafka.bootstrap
    s = unique("s")
    site, _ = make_site(b, tmp_path, [s])
    t = ingress_topic(s)
    rows = [_row(t, i, "ship1", s, q) for i, q in enumerate(range(1, 6))]
    old = Merger(site, query=old_query, streams=[s])
    old.prepare()
    try:
        fence_predecessors(site)
        with pytest.raises(MergeError, match="fenced"):
            old.write_rows(0, rows)
    finally:
        old.close()
    new = Merger(site, streams=[s])  # the new run's merge takes its id back and writes
    new.prepare()
    try:
        assert len(new.write_rows(0, rows).canonical) == 5
    finally:
        new.close()
    assert_exactly_once(canonical(b, s), {("ship1", s): 5})


def test_pending_relay_seqs_of_many_origins_never_push_the_marker_past_the_size_limit(
    kafka: KafkaBroker, tmp_path: Path
) -> None:
    """Review (replication N9): the marker, rewritten whole in every transaction,
    carries the seqs relayed since the last index segment; 104,000 of them (13 ships,
    every other seq) made it larger than a record may be, and every transaction failed
    for good. Past the bound the tails start again at their topics' ends: the batch
    commits, the marker stays small, and the next batches are indexed as before."""
    b, s = kafka.bootstrap, unique("s")
    a, n = unique("site"), unique("site")
    doc = site_doc(b, tmp_path, [s], name=a)
    other = dict(doc["sites"][a], checkpoint_dir=str(tmp_path / "n"), neighbours=[a])
    doc["sites"][n] = other
    site = parse_config(doc, base=tmp_path).site(a)
    merger = Merger(site, sites=parse_config(doc, base=tmp_path))
    merger.prepare()
    t = ingress_topic(s)
    seqs = [(f"ship{k}", q) for k in range(13) for q in range(1, 16_000, 2)]
    rows = [_row(t, i, origin, s, q) for i, (origin, q) in enumerate(seqs)]
    try:
        assert len(merger.write_rows(0, rows).canonical) == len(rows)
        assert merger.totals.index_restarts == 1
        more = [_row(t, len(rows) + i, "ship0", s, q) for i, q in enumerate(range(16_001, 16_011))]
        assert len(merger.write_rows(1, more).canonical) == 10
        assert merger.state.index[relay_topic(a, s)].pending["ship0"] == RangeSet(
            [(16_001, 16_010)]
        )
    finally:
        merger.close()
    markers = [
        len(m.value() or b"")
        for m in read_to_end(KafkaEndpoint.plaintext(b), [MARKER_TOPIC])
        if (m.key() or b"").partition(b"/")[0] == marker_key(a).partition(b"/")[0]
    ]
    assert markers and max(markers) < 100_000
