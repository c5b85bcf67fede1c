"""A consumer's position is what makes failover miss and repeat nothing: it must come
back from disk exactly as saved, say "seen" for exactly the identities added, and refuse
a damaged or hostile file rather than become a wrong position."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from local_stack.kafka import KafkaBroker
from shorelink.identity import Identity
from shorelink.kafka.position import FORMAT, FileStore, KafkaStore, Position, PositionError
from tests.helpers import unique

ORIGINS = st.sampled_from(["bigblue", "redstar", "ship-3"])
STREAMS = st.sampled_from(["alerts", "nav"])
IDENTITIES = st.builds(Identity, ORIGINS, STREAMS, st.integers(1, 400))
#: (topic id, partition, next offset); a topic id belongs to one topic
HINTS = st.lists(
    st.tuples(st.sampled_from(["id-a", "id-b"]), st.integers(0, 5), st.integers(0, 10**6)),
    max_size=8,
)
TOPIC_OF = {"id-a": "sl.alerts", "id-b": "sl.nav"}


@settings(max_examples=200, deadline=None)
@given(st.lists(IDENTITIES, max_size=300), st.lists(IDENTITIES, max_size=50), HINTS)
def test_a_position_says_seen_for_exactly_what_was_added_and_survives_a_round_trip(
    added: list[Identity], probes: list[Identity], hints: list[tuple[str, int, int]]
) -> None:
    pos = Position.of(added)
    for tid, part, off in hints:
        pos.hint((tid, TOPIC_OF[tid], part), off)
    back = Position.loads(pos.dumps())
    assert back == pos
    for i in [*added, *probes]:
        assert back.seen(i) == (i in set(added))
    assert back.count() == len(set(added))
    # a hint moves only forward: the largest offset given per partition
    for tid in TOPIC_OF:
        want: dict[int, int] = {}
        for t, part, off in hints:
            if t == tid:
                want[part] = max(want.get(part, -1), off)
        assert back.hints(tid) == want


@settings(max_examples=100, deadline=None)
@given(st.lists(IDENTITIES, max_size=200), st.lists(IDENTITIES, max_size=200))
def test_merging_positions_is_the_union_of_what_each_saw(
    a: list[Identity], b: list[Identity]
) -> None:
    pa, pb = Position.of(a), Position.of(b)
    pa.update(pb)
    assert pa == Position.of([*a, *b])


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 5000).flatmap(lambda n: st.permutations(range(1, n + 1))))
def test_a_position_stays_a_few_ranges_in_whatever_order_seqs_come(seqs: list[int]) -> None:
    """Bounded memory: a position is ranges, not one entry per record, however the
    partitions interleave a source's seqs."""
    pos = Position.of(Identity("bigblue", "nav", s) for s in seqs)
    assert [list(r) for _, r in pos.sources()] == [[(1, len(seqs))]]
    assert len(pos.dumps()) < 200


def test_a_file_position_is_replaced_atomically_and_missing_means_empty(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "pos.json")
    assert store.load() == Position()
    pos = Position.of(Identity("bigblue", "alerts", s) for s in (1, 2, 3, 7))
    store.save(pos)
    assert store.load() == pos
    assert [p.name for p in tmp_path.iterdir()] == ["pos.json"]  # no temporary left
    saved = json.loads((tmp_path / "pos.json").read_text())
    assert saved["format"] == FORMAT
    assert saved["sources"] == [{"origin": "bigblue", "stream": "alerts", "seen": "1-3,7"}]


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"", "not JSON"),
        (b"\xff\xfe garbage", "not JSON"),
        (b"[1, 2]", "expected a JSON object"),
        (b'{"format": "shorelink.kafka.position/999"}', "format"),
        (b'{"format": "%s", "sources": {}}' % FORMAT.encode(), "sources: expected a list"),
        (
            b'{"format": "%s", "sources": [{"origin": "A/B", "stream": "x", "seen": "1"}]}'
            % FORMAT.encode(),
            "bad origin name",
        ),
        (
            b'{"format": "%s", "sources": [{"origin": "a", "stream": "x", "seen": "0-5"}]}'
            % FORMAT.encode(),
            "sources[0]",
        ),
        (
            b'{"format": "%s", "sources": [{"origin": "a", "stream": "x", "seen": "5-zz"}]}'
            % FORMAT.encode(),
            "bad seq range",
        ),
        (
            b'{"format": "%s", "sources": [{"origin": "a", "stream": "x", "seen": 5}]}'
            % FORMAT.encode(),
            "sources[0].seen: expected str",
        ),
        (
            b'{"format": "%s", "offsets": [{"topic_id": "t", "topic": "sl.x", '
            b'"partition": -1, "next": 3}]}' % FORMAT.encode(),
            "offsets[0]",
        ),
        (
            b'{"format": "%s", "offsets": [{"topic_id": "t", "topic": "sl.x", '
            b'"partition": true, "next": 3}]}' % FORMAT.encode(),
            "offsets[0].partition",
        ),
    ],
)
def test_a_hostile_position_file_is_refused_naming_what_is_wrong(
    tmp_path: Path, content: bytes, says: str
) -> None:
    path = tmp_path / "pos.json"
    path.write_bytes(content)
    with pytest.raises(PositionError) as exc:
        FileStore(path).load()
    assert says in str(exc.value) and str(path) in str(exc.value)


def test_a_position_that_is_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PositionError, match="cannot read"):
        FileStore(tmp_path).load()


def test_a_kafka_position_store_reaches_a_secured_site(secure_kafka: KafkaBroker) -> None:
    """docs/consumers.md offers KafkaStore to customers, whose sites run SASL/SCRAM over
    TLS: the store must carry the endpoint's credentials to every client it makes
    (topic creation, producer, reader), or the position cannot be saved there."""
    kafka = secure_kafka.endpoint
    assert kafka.auth.protocol == "SASL_SSL"
    name = unique("reader")
    store = KafkaStore(kafka, name)
    assert store.load() == Position()  # nothing saved under this name yet
    pos = Position.of(Identity("bigblue", "alerts", s) for s in (1, 2, 3, 9))
    store.save(pos)
    assert KafkaStore(kafka, name).load() == pos  # a new store (another process) reads it
    assert KafkaStore(kafka, unique("other")).load() == Position()
