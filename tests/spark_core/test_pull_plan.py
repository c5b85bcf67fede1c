"""The feeds' decisions without a broker (spark_core/pull_plan.py): which partitions,
under which source, from where. Each rule is the one a lost or doubled record would
break: a recreated topic is a new source read from its start, a cursor always wins,
history is read only where it is left, a fresh site reads relays from offset 0."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shorelink.contract import canonical_topic, relay_topic
from shorelink.kafka.reading import BEGINNING
from spark_core.merge_state import pulled_source
from spark_core.pull_plan import keep_parts, plan_parts, plan_starts

RELAY, CANON = relay_topic("e1", "nav"), canonical_topic("nav")


def _source(topic: str, topic_id: str) -> str:
    return pulled_source("tokyo", topic_id, topic)


def test_a_topic_whose_id_changed_is_a_new_source_and_says_so() -> None:
    described = {RELAY: ("id2", [0, 1])}
    sources, parts, ids, renewed = plan_parts(described, {RELAY}, {RELAY: "id1"}, _source)
    assert renewed and ids == {RELAY: "id2"}
    assert sources == {RELAY: _source(RELAY, "id2")}
    assert parts == {(RELAY, 0): sources[RELAY], (RELAY, 1): sources[RELAY]}
    # a wanted topic that is gone is remembered as "": whatever comes back is new
    _, parts, ids, renewed = plan_parts({}, {RELAY}, ids, _source)
    assert (parts, ids, renewed) == ({}, {RELAY: ""}, False)
    assert plan_parts(described, {RELAY}, ids, _source)[3]


def test_history_is_read_only_where_it_is_left_and_dropped_topics_not_at_all() -> None:
    own = relay_topic("here", "nav")
    parts = {
        (RELAY, 0): _source(RELAY, "a"),
        (CANON, 0): _source(CANON, "b"),
        (CANON, 1): _source(CANON, "b"),
        (own, 0): _source(own, "c"),
    }
    sources = {RELAY: _source(RELAY, "a"), CANON: _source(CANON, "b"), own: _source(own, "c")}
    kept, kept_sources = keep_parts(parts, sources, {(CANON, 1)}, {own})
    assert set(kept) == {(RELAY, 0), (CANON, 1)}
    assert set(kept_sources) == {RELAY, CANON}
    kept, kept_sources = keep_parts(parts, sources, set())
    assert set(kept_sources) == {RELAY, own} and (CANON, 0) not in kept


@given(
    cursors=st.dictionaries(st.integers(0, 3), st.integers(0, 10**6)),
    first=st.dictionaries(st.integers(0, 3), st.integers(0, 10**6)),
    from_zero=st.booleans(),
)
def test_a_cursor_wins_then_the_first_read_then_the_start(
    cursors: dict[int, int], first: dict[int, int], from_zero: bool
) -> None:
    source = _source(RELAY, "a")
    parts = {(RELAY, p): source for p in range(4)}
    starts = plan_starts(
        parts,
        {(source, p): o for p, o in cursors.items()},
        {(RELAY, p): o for p, o in first.items()},
        from_zero=from_zero,
    )
    for p in range(4):
        want = cursors.get(p, first.get(p, 0 if from_zero else BEGINNING))
        assert starts[(RELAY, p)] == want
