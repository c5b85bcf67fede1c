"""A site's merge split by origin (docs/data-centre.md, "Scaling out: merges split by
origin, each fenced"): each shard merges only its origins, from its own ingress
partitions, with its own transactional id and marker; the shards together write every
record exactly once; one shard killed leaves the other merging; a change of layout
fences the merges of the old one."""

from __future__ import annotations

import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka import Producer

from local_stack.kafka import KafkaBroker
from local_stack.process import Proc
from shorelink.contract import MARKER_TOPIC, Record, ingress_topic, marker_key
from shorelink.errors import ConfigError
from shorelink.identity import Identity
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.errors import UnknownTopic
from shorelink.kafka.reading import read_to_end
from shorelink.shards import Shard, origin_partition
from spark_core.cli import main as spark_cli
from spark_core.config import SiteConfig, carry_registry, load_config, parse_config, shard_site
from spark_core.jobs.site import build_supervisor
from spark_core.merge import (
    Merger,
    fence_predecessors,
    merge_layout,
    reset_reassigned_checkpoint,
)
from spark_core.merge_state import MergeError, MergeState, SourceRow, plan_batch
from tests.helpers import eventually, kill9, run_process, unique, write_toml
from tests.spark_core.helpers import (
    assert_exactly_once,
    canonical,
    create_ingress,
    ledger,
    produce_raw,
    record,
    site_doc,
)

PARTITIONS = 4


def _sharded_doc(bootstrap: str, root: Path, stream: str, name: str, shards: int) -> dict[str, Any]:
    doc = site_doc(bootstrap, root, [stream], name=name)
    merge = doc["sites"][name]["merge"]
    del merge["source_pattern"]  # a shard reads the ingress partitions of its origins
    merge.update(shards=shards, canonical_partitions=PARTITIONS, backstop_interval="1s")
    return doc


def _sharded(bootstrap: str, root: Path, stream: str, shards: int = 2) -> tuple[SiteConfig, Path]:
    name = unique("shsite")
    root.mkdir(parents=True, exist_ok=True)
    doc = _sharded_doc(bootstrap, root, stream, name, shards)
    path = write_toml(root / "sites.toml", doc)
    return parse_config(doc, base=root).site(name), path


def _produce_by_origin(bootstrap: str, records: list[Record]) -> None:
    """Ingress as a gateway with ``kafka.ingress_by_origin`` writes it: each record in
    its origin's partition, whatever its key, in one transaction."""
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": unique("gw")})
    p.init_transactions(20)
    p.begin_transaction()
    for r in records:
        topic = ingress_topic(r.identity.stream)
        part = origin_partition(r.identity.origin, PARTITIONS)
        p.produce(topic, key=r.key, value=r.value, headers=r.headers(), partition=part)
    p.commit_transaction(20)


def _row(origin: str, stream: str, seq: int, offset: int, partition: int = 0) -> SourceRow:
    r = record(origin, stream, seq)
    return SourceRow(ingress_topic(stream), partition, offset, r.key, r.value, r.headers())


# -- the rule and the plan (no broker) -----------------------------------------------------


def test_every_origin_has_one_shard_and_its_partition_is_read_by_that_shard() -> None:
    """An origin merged by two shards would be written twice (two ledgers racing); one
    merged by none, never. Its ingress partition must be one its shard reads."""
    origins = [f"ship{i}" for i in range(500)]
    for n in (1, 2, 4):
        shards = [Shard(k, n) for k in range(n)]
        for origin in origins:
            owners = [s for s in shards if s.owns(origin)]
            assert len(owners) == 1, (origin, n)
            for parts in (n, 2 * n, 12):
                if parts % n == 0:
                    assert owners[0].reads(origin_partition(origin, parts), parts)
        # spread: no shard left without origins
        assert all(sum(s.owns(o) for o in origins) > 500 / n / 2 for s in shards)
    # a topic the shard count does not divide (the registry's one partition): every
    # shard reads it, each keeping its own origins
    assert all(Shard(k, 2).reads(0, 1) for k in range(2))


def test_a_shard_is_named_k_of_n_from_zero_and_refuses_what_is_not_one() -> None:
    assert Shard.parse("1/2") == Shard(1, 2) and Shard(1, 2).suffix == "-o1of2"
    for bad in ("2/2", "1", "a/b", "0/0", "-1/2"):
        with pytest.raises(ValueError):
            Shard.parse(bad)


def test_a_shard_plans_only_its_origins_and_passes_the_others_offsets() -> None:
    """A record of another shard's origin is that shard's to write: planned here it
    would be written twice. Its offset is still passed, or the shard would read it
    again for ever."""
    shard = Shard(0, 2)
    mine = next(o for o in (f"s{i}" for i in range(50)) if shard.owns(o))
    theirs = next(o for o in (f"s{i}" for i in range(50)) if not shard.owns(o))
    rows = [_row(mine, "c", 1, 0), _row(theirs, "c", 1, 1), _row(mine, "c", 2, 2)]
    plan = plan_batch(rows, MergeState(), owns=shard.owns)
    assert [k for k in plan.ledger] == [(mine, "c")] and str(plan.ledger[(mine, "c")]) == "1-2"
    assert plan.foreign == 1 and plan.offsets == {(ingress_topic("c"), 0): 3}
    assert len(plan.canonical) == 2
    whole = plan_batch(rows, MergeState())  # one merge: every origin, as ever
    assert set(whole.ledger) == {(mine, "c"), (theirs, "c")} and whole.foreign == 0


def test_the_sites_file_refuses_shards_it_cannot_run(tmp_path: Path) -> None:
    """Each mistake named at load, not found as records merged twice or never."""
    doc = _sharded_doc("127.0.0.1:9092", tmp_path, "containers", "tokyo", 3)
    with pytest.raises(ConfigError, match=r"4 partitions is not a multiple of merge\.shards = 3"):
        parse_config(doc, base=tmp_path)
    doc = _sharded_doc("127.0.0.1:9092", tmp_path, "containers", "tokyo", 2)
    doc["sites"]["tokyo"]["merge"]["source_pattern"] = "sl\\.ingress\\.containers"
    with pytest.raises(ConfigError, match="unset source_pattern"):
        parse_config(doc, base=tmp_path)
    doc = _sharded_doc("127.0.0.1:9092", tmp_path, "containers", "tokyo", 2)
    doc["sites"]["hq"] = {**doc["sites"]["tokyo"], "neighbours": ["tokyo"]}
    doc["sites"]["hq"]["merge"] = {}
    with pytest.raises(ConfigError, match="replication from or to a sharded site is not built"):
        parse_config(doc, base=tmp_path)
    doc = _sharded_doc("127.0.0.1:9092", tmp_path, "containers", "tokyo", 2)
    site = parse_config(doc, base=tmp_path).site("tokyo")
    with pytest.raises(ConfigError, match=r"run each shard with --shard k/2"):
        shard_site(site, None)
    with pytest.raises(ConfigError, match="--shard 0/3 is a shard of 3"):
        shard_site(site, Shard(0, 3))
    assert shard_site(site, Shard(1, 2)).state_path == site.state_path / "shard-1of2"


# -- fencing (Kafka) ------------------------------------------------------------------------


def test_a_change_of_layout_fences_the_merges_of_the_old_one(
    kafka: KafkaBroker, tmp_path: Path
) -> None:
    """The merge that ran whole, still running when the site is split (a driver that
    did not die, on another host), would write the same origins as the shards: fenced
    by the first shard's start, and the shards by the whole merge's return. The layout
    lives in Kafka (the shards' drivers share no disk). A split is refused while the
    whole merge has ingress left to merge (written by key: no shard would merge it)."""
    b = kafka.bootstrap
    stream = unique("s")
    site, _ = _sharded(b, tmp_path, stream)
    whole = parse_config(_sharded_doc(b, tmp_path, stream, site.name, 1), base=tmp_path).site(
        site.name
    )
    create_ingress(b, [stream], PARTITIONS)
    produce_raw(b, ingress_topic(stream), [(b"c1", b"v", [])], partition=3)
    old = Merger(whole)
    old.write_rows(0, [_row("ship1", stream, 1, 0)])
    assert merge_layout(site) is None  # one merge writes no layout record, as ever
    with pytest.raises(MergeError, match=rf"{ingress_topic(stream)}\[3\]: 1 records left"):
        fence_predecessors(site, Shard(0, 2))
    old.write_rows(1, [_row("ship2", stream, 1, 0, partition=3)])  # not fenced: it goes on

    fence_predecessors(site, Shard(0, 2))  # now merged to the end
    assert merge_layout(site) == 2
    with pytest.raises(MergeError, match="fenced") as fenced:
        old.write_rows(2, [_row("ship1", stream, 2, 1)])
    assert fenced.value.fatal
    shards = [Merger(site, shard=Shard(k, 2)) for k in range(2)]
    fence_predecessors(site, Shard(1, 2))  # the same layout: the live shard 0 not fenced
    owner = next(m for m in shards if m.owns is not None and m.owns("ship1"))
    other = next(m for m in shards if m is not owner)
    assert owner.shard is not None and other.shard is not None
    mine = next(p for p in range(PARTITIONS) if owner.shard.reads(p, PARTITIONS))
    owner.write_rows(0, [_row("ship1", stream, 2, 1, partition=mine)])
    assert owner.transactional_id == f"{whole.merge.transactional_id}{owner.query[5:]}"
    assert owner.query == f"merge{owner.shard.suffix}"
    assert str(ledger(b, [stream])[("ship1", stream)]) == "1-2"
    keys = {m.key() for m in read_to_end(KafkaEndpoint.plaintext(b), [MARKER_TOPIC])}
    assert marker_key(site.name, owner.query) in keys

    # ship1's record in a partition only the other shard reads (a gateway writing by
    # key): refused, not passed, since its own shard never reads it there
    theirs = next(p for p in range(PARTITIONS) if other.shard.reads(p, PARTITIONS))
    with pytest.raises(MergeError, match=r"kafka\.ingress_by_origin") as misrouted:
        other.write_rows(0, [_row("ship1", stream, 3, 5, partition=theirs)])
    assert misrouted.value.fatal and str(ledger(b, [stream])[("ship1", stream)]) == "1-2"

    fence_predecessors(whole)  # back to one merge: both shards fenced
    assert merge_layout(site) == 1
    with pytest.raises(MergeError, match="fenced"):
        owner.write_rows(1, [_row("ship1", stream, 3, 2, partition=mine)])
    for m in [old, *shards]:
        m.close()


# -- two shards on Spark ----------------------------------------------------------------------


class _Ships:
    """Uploads of many origins, batch after batch, each with a resent copy of the one
    before (duplicates the merge must drop), into the origins' partitions."""

    def __init__(self, bootstrap: str, stream: str, origins: list[str]) -> None:
        self.bootstrap, self.stream, self.origins = bootstrap, stream, origins
        self.last = 0

    def send(self, n: int) -> None:
        lo = max(1, self.last - 2)
        recs = [
            record(o, self.stream, q, key=f"c{q % 7}")
            for q in range(lo, self.last + n + 1)
            for o in self.origins
        ]
        _produce_by_origin(self.bootstrap, recs)
        self.last += n

    def expected(self) -> dict[tuple[str, str], int]:
        return {(o, self.stream): self.last for o in self.origins}


def _held(bootstrap: str, expected: dict[tuple[str, str], int]) -> bool:
    try:
        held = ledger(bootstrap, {stream for _, stream in expected})
    except UnknownTopic:  # no merge has written yet
        return False
    return all(
        (got := held.get(src)) is not None and got.last == last for src, last in expected.items()
    )


@pytest.mark.spark
def test_two_shards_merge_many_origins_exactly_once_and_one_killed_leaves_the_other_merging(
    spark: Any, kafka: KafkaBroker, tmp_path: Path
) -> None:
    """Shard 0 runs as its own application (``shorelink-spark site --shard 0/2``), shard 1
    in this process's Spark session: 24 origins over 4 ingress partitions. Every
    record is merged once, each shard holds only its origins; shard 0 killed (SIGKILL,
    its JVM and driver) while uploads go on: shard 1 keeps merging its origins; shard 0
    started again takes its own up from its marker, nothing lost or doubled."""
    b = kafka.bootstrap
    stream = unique("s")
    site, config = _sharded(b, tmp_path, stream)
    origins = [f"ship{i}" for i in range(24)]
    shard0 = [o for o in origins if Shard(0, 2).owns(o)]
    shard1 = [o for o in origins if Shard(1, 2).owns(o)]
    assert shard0 and shard1
    create_ingress(b, [stream], PARTITIONS)  # as the gateway does at its start
    ships = _Ships(b, stream, origins)
    ships.send(30)  # before either shard starts: their Spark queries' first batches

    def start0(log: str) -> Proc:
        argv = ["-m", "spark_core.cli", "site", "--site", site.name, "--config", str(config)]
        return run_process(
            "shard0", [sys.executable, *argv, "--shard", "0/2"], tmp_path / f"{log}.log"
        )

    p0 = start0("shard0-a")
    sup = build_supervisor(spark, load_config(config), site.name, shard=Shard(1, 2))
    t1 = threading.Thread(target=sup.run, name="shard1", daemon=True)
    t1.start()
    try:
        eventually(lambda: _held(b, ships.expected()), 120, "both shards merged", proc=p0)
        ships.send(20)
        kill9(p0, group=True)
        ships.send(20)  # shard 0 is dead: only shard 1's origins can move
        mine1 = {k: v for k, v in ships.expected().items() if k[0] in shard1}
        eventually(lambda: _held(b, mine1), 60, "shard 1 merging while shard 0 is dead")
        behind0 = {k: v for k, v in ships.expected().items() if k[0] in shard0}
        assert not _held(b, behind0)  # nothing merged shard 0's origins meanwhile
        p0 = start0("shard0-b")
        ships.send(10)
        eventually(lambda: _held(b, ships.expected()), 120, "shard 0 back", proc=p0)
    finally:
        sup.request_stop()
        t1.join(timeout=120)
        if p0.popen is not None and p0.popen.poll() is None:
            p0.stop(grace=20)
    got = canonical(b, stream)
    assert_exactly_once(got, ships.expected())
    # each shard held only its origins, and read only its partitions: none passed over
    status1 = MergeState.load(site.kafka, site.name, query="merge" + Shard(1, 2).suffix)
    assert status1.offsets and {tp[1] for tp in status1.offsets} <= {1, 3}
    by_origin = Counter(r.identity.origin for r in got)
    assert set(by_origin) == set(origins)
    assert {Identity(o, stream, 1) for o in origins} <= {r.identity for r in got}


def test_shorelink_spark_runs_and_shows_one_shard_and_refuses_a_shard_the_site_has_not(
    tmp_path: Path,
) -> None:
    """``site --shard k/N`` hands the shard to the application; a shard of another count
    than the sites file's, or a sharded site started whole, is refused before any
    spark-submit (two layouts at once would fence each other)."""
    doc = _sharded_doc("127.0.0.1:9092", tmp_path, "containers", "tokyo", 2)
    config = write_toml(tmp_path / "sites.toml", doc)
    base = ["--site", "tokyo", "--config", str(config)]
    runner = CliRunner()
    ok = runner.invoke(spark_cli, ["site", *base, "--shard", "1/2", "--dry-run"])
    assert ok.exit_code == 0, ok.output
    assert ok.output.splitlines()[0].endswith("--shard 1/2"), ok.output
    for shard, error in (("0/3", "--shard 0/3 is a shard of 3"), ("2/2", "expected 0-1")):
        bad = runner.invoke(spark_cli, ["site", *base, "--shard", shard, "--dry-run"])
        assert bad.exit_code != 0 and error in bad.output, bad.output
    whole = runner.invoke(spark_cli, ["site", *base, "--dry-run"])
    assert whole.exit_code != 0 and "run each shard with --shard k/2" in whole.output
    status = runner.invoke(spark_cli, ["status", *base, "--shard", "1/2"])
    assert status.exit_code == 1 and "shard-1of2" in status.output, status.output


def test_the_registrys_one_partition_is_read_whole_by_every_shard_and_purged_by_none(
    kafka: KafkaBroker, tmp_path: Path
) -> None:
    """The fleet registry's ingress has one partition, which two shards cannot split:
    each reads it whole and takes its own origins; purged by one, the other would lose
    what it had not read yet. Any other topic the shard count does not divide is
    refused: every shard would read all of it."""
    b = kafka.bootstrap
    stream = unique("s")
    site = carry_registry(_sharded(b, tmp_path, stream)[0])
    shards = [Merger(site, shard=Shard(k, 2)) for k in range(2)]
    for m in shards:
        m.ready()
        assigned = m.assignment()
        assert assigned[ingress_topic("registry")] == [0]
        assert m.shard is not None
        assert assigned[ingress_topic(stream)] == [m.shard.index, m.shard.index + 2]
        below = {(ingress_topic("registry"), 0): 5, (ingress_topic(stream), m.shard.index): 7}
        assert m.purgeable(below) == {(ingress_topic(stream), m.shard.index): 7}
        m.close()
    odd = unique("s")
    create_ingress(b, [odd], 3)
    lopsided = Merger(_sharded(b, tmp_path / "odd", odd)[0], shard=Shard(0, 2))
    with pytest.raises(MergeError, match=r"has 3 partitions, not a multiple of merge\.shards = 2"):
        lopsided.ready()
    lopsided.close()


def test_a_shard_whose_partitions_changed_starts_its_query_afresh(tmp_path: Path) -> None:
    """Partitions added to an ingress topic change what a shard reads, and Spark's
    ``assign`` source fails on a checkpoint of other partitions, on every start: the
    checkpoint goes (the marker's cursors skip what was merged), once."""
    doc = _sharded_doc("127.0.0.1:9092", tmp_path, "containers", "tokyo", 2)
    site = shard_site(parse_config(doc, base=tmp_path).site("tokyo"), Shard(1, 2))
    merger = Merger(site, shard=Shard(1, 2))
    checkpoint = site.query_checkpoint(merger.query).path
    topic = ingress_topic("containers")
    site.state_path.mkdir(parents=True)
    checkpoint.mkdir(parents=True)
    reset_reassigned_checkpoint(merger, {topic: [1, 3]})  # the first start: kept
    reset_reassigned_checkpoint(merger, {topic: [1, 3]})
    assert checkpoint.exists()
    reset_reassigned_checkpoint(merger, {topic: [1, 3, 5, 7]})  # 4 partitions to 8
    assert not checkpoint.exists()
