"""The merge handles Kafka's transaction errors as librdkafka defines them. A fenced
merge must not re-initialise its producer on the next batch: that would fence the merge
that took over, which would do the same back (two writers of the canonical topics
taking turns, each failing the other's batches)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from local_stack.kafka import KafkaBroker
from shorelink.contract import ingress_topic
from spark_core.merge import Merger, SourceRow
from spark_core.merge_state import MergeError
from tests.helpers import unique
from tests.spark_core.helpers import assert_exactly_once, canonical, make_site, record


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
