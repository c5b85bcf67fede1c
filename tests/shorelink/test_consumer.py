"""A consumer that moves from one site to another must miss nothing and repeat nothing
it committed, although the two sites hold the same identities at other offsets, in
another order, in other partitions (that is the promise of docs/consumers.md, and what
MirrorMaker's translated offsets only approximate)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions

import shorelink.kafka.consumer as consumer_mod
from local_stack.kafka import KafkaBroker
from shorelink.contract import Record, canonical_topic
from shorelink.identity import Identity
from shorelink.kafka.admin import Admin
from shorelink.kafka.consumer import Consumed, ConsumerError, PortableConsumer
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.position import FileStore, KafkaStore, Position, PositionStore
from shorelink.kafka.topics import TopicSpec, ensure_topics
from tests.helpers import eventually, unique

SITES = ("csg", "csy")


@pytest.fixture(scope="module")
def sites(kafka_sites: Callable[..., dict[str, KafkaBroker]]) -> dict[str, KafkaBroker]:
    return kafka_sites(*SITES)


def _record(ident: Identity, site: str) -> Record:
    key = f"c{ident.seq % 5}".encode()
    value = b"\xff\x00binary" if ident.seq % 17 == 0 else f"v{ident.seq}".encode()
    return Record(ident, key, value, 1000 + ident.seq, site, f"ship/{ident.origin}")


def write_canonical(
    bootstrap: str,
    stream: str,
    idents: list[Identity],
    *,
    partitions: int,
    site: str,
    aborted: Sequence[Identity] = (),
) -> None:
    """Write ``idents`` to ``sl.<stream>`` in this order in one committed transaction,
    as the merge does (and ``aborted`` in one that is aborted: read_committed hides it)."""
    topic = canonical_topic(stream)
    ensure_topics(KafkaEndpoint.plaintext(bootstrap), [TopicSpec(topic, partitions=partitions)])
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": unique("merge")})
    p.init_transactions(20)
    if aborted:
        p.begin_transaction()
        for i in aborted:
            r = _record(i, site)
            p.produce(topic, key=r.key, value=r.value, headers=r.headers())
        p.flush(20)
        p.abort_transaction(20)
    p.begin_transaction()
    for i in idents:
        r = _record(i, site)
        part = _partition(r.key, partitions)
        p.produce(topic, key=r.key, value=r.value, headers=r.headers(), partition=part)
    p.commit_transaction(20)


def _partition(key: bytes, partitions: int) -> int:
    """One key, one partition (as the merge's partitioner), another spread per count."""
    return int(key[1:]) % partitions


def _take(c: PortableConsumer, n: int) -> list[Identity]:
    """Exactly ``n`` new records (poll hands over what is there, maybe fewer)."""
    got: list[Identity] = []
    while len(got) < n:
        got += _ids(c.poll(n - len(got), timeout=10))
    return got


def _ids(batch: list[Consumed]) -> list[Identity]:
    return [c.identity for c in batch]


def _two_sites(sites: dict[str, KafkaBroker]) -> tuple[str, set[Identity]]:
    """One stream at both sites: the same 150 identities, in another order and other
    partitions; 10 more only at csy (they reached it first), one of its records twice,
    and an aborted transaction at csy."""
    stream = unique("cons")
    common = [
        Identity(o, stream, s)
        for o, n in (("bigblue", 90), ("redstar", 60))
        for s in range(1, n + 1)
    ]
    only_csy = [Identity("bigblue", stream, s) for s in range(91, 101)]
    write_canonical(sites["csg"].bootstrap, stream, common, partitions=3, site="csg")
    shuffled = [*common, *only_csy]
    random.Random(7).shuffle(shuffled)
    write_canonical(
        sites["csy"].bootstrap,
        stream,
        [*shuffled, shuffled[5]],
        partitions=2,
        site="csy",
        aborted=[Identity("bigblue", stream, 999)],
    )
    return stream, {*common, *only_csy}


def _drain(c: PortableConsumer, commit: bool = True) -> list[Identity]:
    got: list[Identity] = []
    for batch in c.batches():
        got += _ids(batch)
        if commit:
            c.commit()
    return got


@pytest.mark.parametrize("store_kind", ["file", "kafka"])
def test_failover_to_another_site_misses_nothing_and_repeats_nothing_committed(
    sites: dict[str, KafkaBroker], tmp_path: Path, store_kind: str
) -> None:
    stream, everything = _two_sites(sites)

    def store() -> PositionStore:
        if store_kind == "file":
            return FileStore(tmp_path / "pos.json")
        # the position lives at a third place both sites' consumers can reach: here csy
        return KafkaStore(sites["csy"].endpoint, unique("reader"))

    s = store()
    # at csg: three committed batches, then one handed over but never committed (a crash)
    with PortableConsumer(sites["csg"].endpoint, [stream], store=s, batch_size=25) as a:
        committed: list[Identity] = []
        for _ in range(3):
            committed += _take(a, 25)
            a.commit()
        uncommitted = _take(a, 25)
    assert len(committed) == 75 and len(uncommitted) == 25
    assert len(set(committed)) == 75

    # at csy, from the saved position
    s2 = s if store_kind == "file" else KafkaStore(sites["csy"].endpoint, s.name)  # type: ignore[attr-defined]
    with PortableConsumer(sites["csy"].endpoint, [stream], store=s2, batch_size=40) as b:
        after = _drain(b)
        skipped = b.skipped
    assert len(after) == len(set(after)), "an identity handed over twice at csy"
    assert not set(after) & set(committed), "a committed identity was handed over again"
    assert set(after) | set(committed) == everything, "an identity was missed"
    assert set(uncommitted) <= set(after), "what was not committed comes again"
    assert Identity("bigblue", stream, 999) not in after  # aborted: read_committed
    assert skipped == 75 + 1  # the committed ones, and csy's second copy of one record
    assert s2.load().count() == len(everything)


def test_a_restart_at_the_same_site_starts_at_its_offset_hints(
    sites: dict[str, KafkaBroker], tmp_path: Path
) -> None:
    """Resuming at another site reads its retained topic once; at the same site the
    hints skip what was read, and only new records are handed over."""
    stream = unique("cons")
    first = [Identity("bigblue", stream, s) for s in range(1, 201)]
    write_canonical(sites["csg"].bootstrap, stream, first, partitions=3, site="csg")
    store = FileStore(tmp_path / "pos.json")
    with PortableConsumer(sites["csg"].endpoint, [stream], store=store) as c:
        assert sorted(_drain(c)) == first
    more = [Identity("bigblue", stream, s) for s in range(201, 231)]
    write_canonical(sites["csg"].bootstrap, stream, more, partitions=3, site="csg")
    with PortableConsumer(sites["csg"].endpoint, [stream], store=store) as c:
        again = _drain(c)
        assert sorted(again) == more
        assert c.skipped == 0  # nothing below the hints was read again
    # the same position at a site whose topic has other ids ignores csg's hints
    write_canonical(sites["csy"].bootstrap, stream, [*first, *more], partitions=2, site="csy")
    with PortableConsumer(sites["csy"].endpoint, [stream], store=store) as c:
        assert _drain(c) == []
        assert c.skipped == 230


def test_records_retention_deleted_before_a_restart_read_them_are_reported_as_lost(
    sites: dict[str, KafkaBroker], tmp_path: Path
) -> None:
    """A consumer that stops, while retention deletes records it had not read yet, used to
    start again from the oldest record left without a word: a customer lost records
    and nothing said so. The jump is a DataLoss per partition, counted and logged, and
    everything still there is handed over."""
    stream = unique("cons")
    topic = canonical_topic(stream)
    first = [Identity("bigblue", stream, s) for s in range(1, 11)]
    write_canonical(sites["csg"].bootstrap, stream, first, partitions=1, site="csg")
    store = FileStore(tmp_path / "pos.json")
    with PortableConsumer(sites["csg"].endpoint, [stream], store=store) as c:
        assert sorted(_drain(c)) == first
        assert not c.gaps
    more = [Identity("bigblue", stream, s) for s in range(11, 21)]
    write_canonical(sites["csg"].bootstrap, stream, more, partitions=1, site="csg")
    # retention takes the first five of the new records (offsets 11-15; 0-9 were read,
    # the hint is 10: the first transaction's marker, never a record)
    admin = Admin(sites["csg"].endpoint)
    (future,) = admin.client.delete_records([TopicPartition(topic, 0, 16)]).values()
    admin.wait(future, "delete records")
    with PortableConsumer(sites["csg"].endpoint, [stream], store=store) as c:
        assert sorted(_drain(c)) == more[5:]
        (gap,) = c.gaps
        assert (gap.topic, gap.partition, gap.consumed_to, gap.reset_to) == (topic, 0, 10, 16)


def test_records_that_reach_the_new_site_late_are_not_repeated(
    sites: dict[str, KafkaBroker], tmp_path: Path
) -> None:
    """The consumer moves to a site that lags (replication has not brought everything
    yet): when the rest arrives there, what the consumer had at the old site is skipped
    and only what it never had is handed over."""
    stream = unique("cons")
    ids = [Identity("bigblue", stream, s) for s in range(1, 61)]
    write_canonical(sites["csg"].bootstrap, stream, ids[:50], partitions=2, site="csg")
    write_canonical(sites["csy"].bootstrap, stream, ids[:30], partitions=3, site="csy")
    store = FileStore(tmp_path / "pos.json")
    with PortableConsumer(sites["csg"].endpoint, [stream], store=store) as a:
        assert len(_drain(a)) == 50
    with PortableConsumer(sites["csy"].endpoint, [stream], store=store) as b:
        assert _drain(b) == []
        write_canonical(sites["csy"].bootstrap, stream, ids[30:], partitions=3, site="csy")
        late: list[Identity] = []

        def ten_late() -> bool:
            late.extend(_ids(b.poll(timeout=1)))
            b.commit()
            return len(late) >= 10

        eventually(ten_late, within=30, what="the 10 records written late", interval=0)
        assert sorted(late) == ids[50:]
        assert b.skipped == 50


def test_a_following_consumer_reads_partitions_added_to_its_topic(
    sites: dict[str, KafkaBroker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``shorelink-spark topics apply`` may grow a canonical topic under a consumer that
    follows it: the new partition's records must not be missed until a restart."""
    monkeypatch.setattr(consumer_mod, "PARTITION_REFRESH_S", 0.3)
    stream = unique("cons")
    ids = [Identity("bigblue", stream, s) for s in range(1, 21)]
    write_canonical(sites["csg"].bootstrap, stream, ids[:10], partitions=1, site="csg")
    with PortableConsumer(sites["csg"].endpoint, [stream], position=Position()) as c:
        assert sorted(_drain(c)) == ids[:10]
        admin = AdminClient({"bootstrap.servers": sites["csg"].bootstrap})
        fut = admin.create_partitions([NewPartitions(canonical_topic(stream), 2)])
        for f in fut.values():
            f.result(20)
        write_canonical(sites["csg"].bootstrap, stream, ids[10:], partitions=2, site="csg")
        got: list[Identity] = []

        def ten_new() -> bool:
            got.extend(_ids(c.poll(timeout=0.5)))
            return len(got) >= 10

        eventually(ten_new, within=30, what="the 10 records of the new partition", interval=0)
        assert sorted(got) == ids[10:]


def test_per_key_a_consumer_gets_the_order_the_site_wrote(
    sites: dict[str, KafkaBroker],
) -> None:
    """One key's records share a partition: per (origin, stream, key), seq order."""
    stream = unique("cons")
    idents = [Identity("bigblue", stream, s) for s in range(1, 101)]
    write_canonical(sites["csg"].bootstrap, stream, idents, partitions=3, site="csg")
    with PortableConsumer(sites["csg"].endpoint, [stream], position=Position()) as c:
        got = [x for batch in c.batches() for x in batch]
    per_key: dict[bytes, list[int]] = {}
    for x in got:
        per_key.setdefault(x.record.key, []).append(x.identity.seq)
    assert all(seqs == sorted(seqs) for seqs in per_key.values())
    assert sum(map(len, per_key.values())) == 100


def test_an_unreachable_site_or_a_missing_stream_is_a_clear_error(
    sites: dict[str, KafkaBroker],
) -> None:
    with pytest.raises(ConsumerError, match="did not answer within 1s") as exc:
        PortableConsumer(KafkaEndpoint.plaintext("127.0.0.1:1", timeout_s=1), ["nav"]).open()
    assert exc.value.retryable
    with pytest.raises(ConsumerError, match=r"no topic sl\.nosuchstream"):
        PortableConsumer(sites["csg"].endpoint.with_timeout(10), ["nosuchstream"]).open()


# -- the command line -------------------------------------------------------------------


def _sites_toml(tmp_path: Path, sites: dict[str, KafkaBroker], stream: str) -> Path:
    path = tmp_path / "sites.toml"
    path.write_text(
        "\n".join(
            f'[sites.{name}]\nstreams = ["{stream}"]\n[sites.{name}.kafka]\n'
            f'bootstrap = "{b.bootstrap}"\n'
            for name, b in sites.items()
        )
    )
    return path


def _consume(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shorelink.cli", "consume", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_consume_command_prints_json_lines_and_fails_over_with_its_position(
    sites: dict[str, KafkaBroker], tmp_path: Path
) -> None:
    stream, everything = _two_sites(sites)
    cfg = _sites_toml(tmp_path, sites, stream)
    pos = tmp_path / "pos.json"
    common = ("--stream", stream, "--config", cfg, "--position", pos)
    first = _consume("--site", "csg", *common, "--max", "30")
    assert first.returncode == 0, first.stderr
    lines = [json.loads(ln) for ln in first.stdout.splitlines()]
    assert len(lines) == 30
    one = lines[0]
    assert set(one) >= {"origin", "stream", "seq", "ts", "site", "topic", "partition", "offset"}
    assert one["topic"] == canonical_topic(stream) and one["site"] == "csg"
    rest = _consume("--site", "csy", *common)
    assert rest.returncode == 0, rest.stderr
    more = [json.loads(ln) for ln in rest.stdout.splitlines()]
    got = [Identity(x["origin"], x["stream"], x["seq"]) for x in [*lines, *more]]
    assert len(got) == len(set(got)) and set(got) == everything
    binary = [x for x in more + lines if "value_b64" in x]
    assert binary and all("value" not in x for x in binary)
    assert "printed" in rest.stderr and "skipped 31 already seen" in rest.stderr
    # nothing new: a third run prints nothing
    again = _consume("--site", "csy", *common)
    assert again.returncode == 0 and again.stdout == ""


def test_the_consume_command_exits_2_with_a_message_when_it_cannot_start(
    sites: dict[str, KafkaBroker], tmp_path: Path
) -> None:
    stream = unique("cons")
    cfg = _sites_toml(tmp_path, sites, stream)
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "shorelink.kafka.position/1", "sources": [{"origin": "x"}]}')
    cases = [
        (("--site", "tokyo", "--stream", stream, "--config", cfg), "no site 'tokyo'"),
        (
            ("--site", "csg", "--stream", "nav", "--config", cfg),
            "'nav' is not a stream of site csg",
        ),
        (
            (
                "--site",
                "csg",
                "--stream",
                stream,
                "--bootstrap",
                sites["csg"].bootstrap,
                "--position",
                bad,
            ),
            "not a shorelink position: sources[0].stream",
        ),
        (
            ("--site", "x", "--stream", stream, "--bootstrap", "127.0.0.1:1", "--timeout", "1"),
            "did not answer",
        ),
        (("--site", "csg", "--stream", stream), "give one of --bootstrap"),
    ]
    for args, says in cases:
        res = _consume(*args)
        assert res.returncode == 2, (args, res.stdout, res.stderr)
        assert says in res.stderr, (args, res.stderr)
        assert res.stdout == ""
    assert "--follow" in _consume("--help").stdout
