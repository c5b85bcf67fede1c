"""Sealing: a stream's backlog is encoded into segments at sea, and a port link sends a
segment with a fresh header. A segment is a cache, never the truth: whole or not at
all, byte-for-byte what its records encode to, gone with any of its records.
Real SQLite logs throughout; the end-to-end test runs Mosquitto, the agent, toxiproxy,
the gateway and Kafka for real."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import sqlite_utils

from core_gateway.auth import Credentials
from edge_agent import migrations
from edge_agent.agent import Agent
from edge_agent.batching import BatchBuilder, BuildSpec, SealSpec, build, seal
from edge_agent.config import EdgeConfig, load_config
from edge_agent.log import EdgeLog, Incoming, message_digest
from edge_agent.metrics import EdgeMetrics
from edge_agent.sealing import SEAL_MAX_BYTES, Sealer
from edge_agent.status import collect_status, open_log
from edge_agent.uplink import Uplink
from local_stack.kafka import KafkaBroker
from local_stack.mosquitto import MosquittoBroker
from local_stack.process import free_port
from local_stack.toxiproxy import Toxiproxy
from shorelink.ranges import RangeSet
from shorelink.wire import FLAG_TEMPLATED, Batch, WireRecord, decode_batch, encode_batch
from tests.core_gateway.helpers import assert_exactly_once, gateway_config, start_gateway
from tests.edge_agent.helpers import Publisher, edge_config_doc, status_of
from tests.edge_agent.memory_gateway import MemoryGateway
from tests.edge_agent.uplink_helpers import fill, uplink_config
from tests.helpers import eventually_async, unique, write_toml

#: receive time of the i-th record (0-based) of one ``fill`` call: BASE_MS + i
BASE_MS = 1_700_000_000_000
#: the streams' default max_age (30 days)
MAX_AGE_MS = 30 * 86_400 * 1000
#: a port link's batch_max_bytes
PORT_BATCH_BYTES = 8 * 1024 * 1024


def _config(tmp_path: Path, **uplink: object) -> EdgeConfig:
    return uplink_config(tmp_path, gateways=[("tokyo", "port_wifi")], uplink=uplink)


def _fill_json(edge_log: EdgeLog, stream: str, n: int) -> None:
    """Commit ``n`` sensor readings of one shape (the wire format's templated coding)."""
    batch = []
    for i in range(n):
        topic = f"bigblue/d1/{stream}/C{i % 7}/env"
        payload = f'{{"t": {4 + i % 10 / 10}, "i": {i}}}'.encode()
        digest = message_digest(topic.encode(), payload)
        batch.append(
            Incoming(stream, f"C{i % 7}", BASE_MS + i, BASE_MS + i, topic, payload, digest=digest)
        )
    edge_log.commit(batch)


def _wire(edge_log: EdgeLog, stream: str, lo: int, hi: int) -> tuple[WireRecord, ...]:
    """The log's records ``lo..hi`` as the wire format carries them."""
    return tuple(
        WireRecord(r.seq, r.key, r.ts_ms, r.topic, r.payload)
        for r in edge_log.read(stream, lo, hi, max_records=1_000_000)
    )


def _spec(
    edge_log: EdgeLog,
    stream: str = "containers",
    *,
    held: RangeSet | None = None,
    pos: int | None = None,
    floor: int | None = None,
    max_records: int = 50_000,
    max_bytes: int = PORT_BATCH_BYTES,
    budget_left: int | None = None,
) -> BuildSpec:
    """The next batch for a site holding ``held`` over a port link (by default)."""
    last = edge_log.stream_state(stream).next_seq - 1
    return BuildSpec(
        stream, last, pos, floor, held or RangeSet(), False, max_records, max_bytes, budget_left
    )


def _seal_ranges(edge_log: EdgeLog, stream: str, *ranges: tuple[int, int]) -> None:
    """Seal exactly these runs (each a whole segment of its own length)."""
    for lo, hi in ranges:
        body = seal(edge_log, SealSpec(stream, lo, hi, hi - lo + 1, SEAL_MAX_BYTES))
        assert body is not None and (body.first_seq, body.count) == (lo, hi - lo + 1)
        assert edge_log.segments.add(stream, body)


def _session(edge_log: EdgeLog, held: RangeSet, **spec: int) -> list[tuple[int, int, bool]]:
    """Every batch a session would build for a site holding ``held``, as (first, last,
    sealed); an encoded one must be what its records encode to."""
    sent = []
    pos = floor = None
    while (built := build(edge_log, _spec(edge_log, held=held, pos=pos, floor=floor, **spec))).body:
        sent.append((built.first, built.last, built.sealed))
        pos, floor = built.pos, built.floor
        if not built.sealed:
            recs = _wire(edge_log, "containers", built.first, built.last)
            assert built.body == encode_batch(
                Batch("bigblue", "containers", recs, first_available=built.floor or 1)
            )
    return sent


def _age_out(edge_log: EdgeLog, upto: int) -> dict[str, int]:
    """Retention by age removes seqs 1..``upto`` of a stream filled by one ``fill``
    (drop_oldest streams: undelivered too; others: what a site holds)."""
    return edge_log.expire(now_ms=BASE_MS + MAX_AGE_MS + upto)


def _sample(metrics: EdgeMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


# -- seal(): what makes a segment -------------------------------------------------------
def test_seal_waits_until_a_whole_segment_is_there(tmp_path: Path) -> None:
    """A segment sealed early would be short forever: every later batch of the stream
    would then be cut at its end."""
    edge_log = open_log(_config(tmp_path))
    fill(edge_log, "containers", 499)
    assert seal(edge_log, SealSpec("containers", 1, 499, 500, SEAL_MAX_BYTES)) is None
    fill(edge_log, "containers", 701)  # seqs 500..1200
    body = seal(edge_log, SealSpec("containers", 1, 1200, 500, SEAL_MAX_BYTES))
    assert body is not None and (body.first_seq, body.count) == (1, 500)
    body = seal(edge_log, SealSpec("containers", 501, 1200, 500, SEAL_MAX_BYTES))
    assert body is not None and (body.first_seq, body.count) == (501, 500)
    # 1001..1200: 200 records, not a segment yet
    assert seal(edge_log, SealSpec("containers", 1001, 1200, 500, SEAL_MAX_BYTES)) is None
    edge_log.close()


def test_a_run_cut_by_retention_is_sealed_short(tmp_path: Path) -> None:
    """Seqs a site confirmed and retention removed never come back: the run before the
    gap is as long as it will ever be, so waiting for it to grow would never seal it."""
    edge_log = open_log(_config(tmp_path))
    fill(edge_log, "alerts", 600)
    edge_log.set_holdings("tokyo", "alerts", RangeSet([(101, 200)]))
    assert _age_out(edge_log, 600) == {"alerts": 100}  # alerts: only what tokyo holds
    body = seal(edge_log, SealSpec("alerts", 1, 600, 500, SEAL_MAX_BYTES))
    assert body is not None and (body.first_seq, body.count) == (1, 100)
    # after the gap: 201..600 is 400 contiguous records, not yet a whole segment
    assert seal(edge_log, SealSpec("alerts", 101, 600, 500, SEAL_MAX_BYTES)) is None
    fill(edge_log, "alerts", 100)  # 601..700
    body = seal(edge_log, SealSpec("alerts", 101, 700, 500, SEAL_MAX_BYTES))
    assert body is not None and (body.first_seq, body.count) == (201, 500)
    edge_log.close()


def test_a_run_cut_by_a_deleted_record_is_sealed_short(tmp_path: Path) -> None:
    """The same with a single record gone (deleted with SQL on the real file)."""
    cfg = _config(tmp_path)
    edge_log = open_log(cfg)
    fill(edge_log, "nav", 300)
    with sqlite3.connect(cfg.log.path) as conn:
        conn.execute("DELETE FROM records WHERE stream = 'nav' AND seq = 42")
    body = seal(edge_log, SealSpec("nav", 1, 300, 500, SEAL_MAX_BYTES))
    assert body is not None and (body.first_seq, body.count) == (1, 41)
    edge_log.close()


def test_large_records_are_sealed_once_the_byte_limit_cuts_the_run(tmp_path: Path) -> None:
    """Big payloads: a segment of max_records of them would not fit a batch, so a run
    that ``max_bytes`` of payload cuts is whole (it can grow no more); the records at
    the end of the log are not (more may join them)."""
    edge_log = open_log(_config(tmp_path))
    fill(edge_log, "containers", 4, size=10_000)
    assert seal(edge_log, SealSpec("containers", 1, 4, 50_000, 100_000)) is None
    fill(edge_log, "containers", 36, size=10_000)  # 40 records
    body = seal(edge_log, SealSpec("containers", 1, 40, 50_000, 100_000))
    assert body is not None
    assert (body.first_seq, body.count) == (1, 10)  # read stops at max_bytes of payload
    framed = encode_batch(Batch("bigblue", "containers", _wire(edge_log, "containers", 1, 10)))
    assert framed.endswith(body.data)
    edge_log.close()


def test_one_record_larger_than_half_the_byte_limit_does_not_stop_sealing(
    tmp_path: Path,
) -> None:
    """A run cut short by one big record is whole; so is the big record's own run: the
    stream's sealing goes on past it instead of reading the same bytes every pass."""
    cfg = _config(tmp_path, seal_records=500)
    edge_log = open_log(cfg)
    fill(edge_log, "containers", 300, size=100)
    fill(edge_log, "containers", 1, size=75_000)  # seq 301
    fill(edge_log, "containers", 1000, size=100)  # 302..1301
    limit = 100_000
    first = seal(edge_log, SealSpec("containers", 1, 1301, 500, limit))
    assert first is not None and (first.first_seq, first.count) == (1, 300)
    assert edge_log.segments.add("containers", first)
    second = seal(edge_log, SealSpec("containers", 301, 1301, 500, limit))
    assert second is not None and second.first_seq == 301
    # the big record and as many after it as fit the byte limit
    assert second.count == 1 + (limit - 75_000) // 100
    assert edge_log.segments.add("containers", second)
    third = seal(edge_log, SealSpec("containers", 301 + second.count, 1301, 500, limit))
    assert third is not None and third.count == 500
    edge_log.close()


async def test_runs_that_do_not_compress_are_skipped_not_stored(tmp_path: Path) -> None:
    """Random payloads: a segment would cost as much disk as its records (outside the
    log's budget) and save the link nothing; the sealer skips the run and goes on with
    the records after it; the skipped run is encoded when sent."""
    cfg = _config(tmp_path, seal_records=500, encode_workers=0)
    edge_log = open_log(cfg)
    fill(edge_log, "containers", 500, size=200, random=True)  # 1..500
    fill(edge_log, "containers", 500, size=200)  # 501..1000: compress
    metrics = EdgeMetrics()
    builder = BatchBuilder(edge_log, workers=0)
    sealer = Sealer(cfg, edge_log, builder, metrics)
    try:
        assert await sealer.seal_due() == 1
        assert edge_log.segments.get("containers", 1) is None
        seg = edge_log.segments.get("containers", 501)
        assert seg is not None and seg.count == 500
        assert {s: t[:2] for s, t in edge_log.segments.totals().items()} == {"containers": (1, 500)}
        assert _sample(metrics, "shorelink_edge_sealed_records_total", stream="containers") == 500
        assert await sealer.seal_due() == 0
        first = build(edge_log, _spec(edge_log, max_records=600))
        assert (first.first, first.last, first.sealed) == (1, 500, False)
        nxt = build(edge_log, _spec(edge_log, held=RangeSet([(1, 500)]), max_records=600))
        assert (nxt.first, nxt.last, nxt.sealed) == (501, 1000, True)
    finally:
        builder.close()
        edge_log.close()


# -- a segment is exactly what its records encode to --------------------------------------
@pytest.mark.parametrize("kind", ["templated", "plain", "incompressible"])
def test_batch_framed_from_a_segment_is_byte_identical_to_encoding_its_records(
    tmp_path: Path, kind: str
) -> None:
    """A site must not be able to tell a sealed batch from an encoded one: the CRC,
    the seq range, the body's coding flags and first_available of the moment are all
    in the fresh header."""
    edge_log = open_log(_config(tmp_path))
    if kind == "templated":
        _fill_json(edge_log, "containers", 1500)
    else:
        fill(edge_log, "containers", 1500, random=kind == "incompressible")
    _seal_ranges(edge_log, "containers", (1, 500), (501, 1000))
    seg = edge_log.segments.get("containers", 501)
    assert seg is not None and bool(seg.flags & FLAG_TEMPLATED) is (kind == "templated")

    built = build(edge_log, _spec(edge_log))
    assert built.sealed and (built.first, built.last, built.count) == (1, 500, 500)
    recs = _wire(edge_log, "containers", 1, 500)
    assert built.body == encode_batch(Batch("bigblue", "containers", recs, first_available=1))
    assert decode_batch(built.body).records == recs

    # retention drops 1..100 (and the segment holding them): the next segment is
    # framed with the first_available of now, still byte for byte the encoding
    assert _age_out(edge_log, 100) == {"containers": 100}
    first = build(edge_log, _spec(edge_log))
    assert not first.sealed and (first.first, first.last, first.floor) == (101, 500, 101)
    built = build(edge_log, _spec(edge_log, pos=first.pos, floor=first.floor))
    assert built.sealed and (built.first, built.last, built.floor) == (501, 1000, 101)
    recs = _wire(edge_log, "containers", 501, 1000)
    assert built.body == encode_batch(Batch("bigblue", "containers", recs, first_available=101))
    batch = decode_batch(built.body)
    assert batch.records == recs and batch.first_available == 101
    edge_log.close()


# -- build(): a segment when it fits, encoding otherwise ---------------------------------------
def _one_segment(tmp_path: Path) -> tuple[EdgeLog, bytes]:
    """A log with records 1..600, 1..500 sealed; and that segment framed."""
    edge_log = open_log(_config(tmp_path))
    fill(edge_log, "containers", 600)
    _seal_ranges(edge_log, "containers", (1, 500))
    framed = encode_batch(Batch("bigblue", "containers", _wire(edge_log, "containers", 1, 500)))
    return edge_log, framed


def test_segment_is_sent_when_the_link_takes_it_exactly(tmp_path: Path) -> None:
    """At the limits (records, bytes and budget all just enough) the segment goes."""
    edge_log, framed = _one_segment(tmp_path)
    built = build(
        edge_log, _spec(edge_log, max_records=500, max_bytes=len(framed), budget_left=len(framed))
    )
    assert built.sealed and built.body == framed and (built.pos, built.count) == (501, 500)
    edge_log.close()


@pytest.mark.parametrize("limit", ["max_records", "max_bytes", "budget_left"])
def test_segment_the_link_cannot_take_whole_is_encoded_instead(tmp_path: Path, limit: str) -> None:
    """A satellite batch, a gateway's byte limit or the rest of today's budget: the
    link gets fewer records, encoded now, exactly as without sealing."""
    edge_log, framed = _one_segment(tmp_path)
    spec = _spec(edge_log)
    if limit == "max_records":
        spec = replace(spec, max_records=499)
    elif limit == "max_bytes":
        spec = replace(spec, max_bytes=len(framed) - 1)
    else:
        spec = replace(spec, budget_left=len(framed) - 1)
    built = build(edge_log, spec)
    assert built.body is not None and not built.sealed
    assert built.first == 1 and 0 < built.count < 500 and built.pos == built.last + 1
    assert built.count <= spec.max_records and len(built.body) <= spec.max_bytes
    assert spec.budget_left is None or len(built.body) <= spec.budget_left
    recs = _wire(edge_log, "containers", 1, built.last)
    assert built.body == encode_batch(Batch("bigblue", "containers", recs))
    edge_log.close()


def test_partly_held_segment_is_completed_encoded_then_the_next_goes_sealed(
    tmp_path: Path,
) -> None:
    """A site that got part of a segment (a batch before sealing, replication) gets
    the rest encoded, cut where the next segment starts, so that one goes as is."""
    edge_log = open_log(_config(tmp_path))
    fill(edge_log, "containers", 1700)
    _seal_ranges(edge_log, "containers", (1, 500), (501, 1000), (1001, 1500))
    sent = _session(edge_log, RangeSet([(1, 200)]))
    assert sent == [
        (201, 500, False),
        (501, 1000, True),
        (1001, 1500, True),
        (1501, 1700, False),
    ]
    edge_log.close()


def test_hole_inside_a_segment_is_filled_around_and_batches_line_up_again(
    tmp_path: Path,
) -> None:
    """The site holds the middle of a segment: the seqs on either side are encoded, the
    second run stopping right before the next segment."""
    edge_log = open_log(_config(tmp_path))
    fill(edge_log, "containers", 1000)
    _seal_ranges(edge_log, "containers", (1, 500), (501, 1000))
    sent = _session(edge_log, RangeSet([(300, 400)]))
    assert sent == [(1, 299, False), (401, 500, False), (501, 1000, True)]
    edge_log.close()


def test_small_batches_stop_before_a_segment_they_cannot_take(tmp_path: Path) -> None:
    """A link with batches smaller than a segment: encoded batches, the last before a
    segment cut short at it (so a port link later could still send it whole)."""
    edge_log = open_log(_config(tmp_path))
    fill(edge_log, "containers", 1000)
    _seal_ranges(edge_log, "containers", (1, 500), (501, 1000))
    sent = _session(edge_log, RangeSet(), max_records=300)
    assert sent == [(1, 300, False), (301, 500, False), (501, 800, False), (801, 1000, False)]
    edge_log.close()


# -- the segments table: a cache that follows the records -----------------------------------
def test_adding_a_segment_refuses_records_gone_and_is_idempotent(tmp_path: Path) -> None:
    """Sealing runs beside retention: a segment encoded from records retention removed
    meanwhile must not be stored, and sealing the same run twice stores it once."""
    edge_log = open_log(_config(tmp_path))
    fill(edge_log, "containers", 1100)
    first = seal(edge_log, SealSpec("containers", 1, 1100, 500, SEAL_MAX_BYTES))
    second = seal(edge_log, SealSpec("containers", 501, 1100, 500, SEAL_MAX_BYTES))
    assert first is not None and second is not None
    assert edge_log.segments.add("containers", first)
    assert not edge_log.segments.add("containers", first)
    assert edge_log.segments.totals() == {"containers": (1, 500, len(first.data))}
    assert edge_log.segments.sealed_upto("containers") == 500
    assert edge_log.segments.next("containers", 0) == 1
    assert edge_log.segments.next("containers", 1) is None

    assert _age_out(edge_log, 600) == {"containers": 600}  # 1..600: part of `second`
    assert not edge_log.segments.add("containers", second)
    assert edge_log.segments.get("containers", 1) is None  # went with its records
    assert edge_log.segments.get("containers", 501) is None
    assert edge_log.segments.totals() == {} and edge_log.segments.sealed_upto("containers") == 0
    edge_log.close()


def test_retention_removes_overlapping_segments_and_no_batch_is_framed_from_them(
    tmp_path: Path,
) -> None:
    """A segment is only ever sent whole: once any of its records is gone, a batch
    framed from it would carry records the ship no longer has."""
    edge_log = open_log(_config(tmp_path))
    fill(edge_log, "containers", 1500)
    _seal_ranges(edge_log, "containers", (1, 500), (501, 1000), (1001, 1500))
    assert _age_out(edge_log, 700) == {"containers": 700}
    assert edge_log.segments.totals()["containers"][:2] == (1, 500)
    assert edge_log.segments.get("containers", 501) is None
    sent = []
    pos = floor = None
    while (built := build(edge_log, _spec(edge_log, pos=pos, floor=floor))).body:
        assert built.body is not None
        batch = decode_batch(built.body)
        assert batch.records == _wire(edge_log, "containers", built.first, built.last)
        sent.append((built.first, built.last, built.sealed, batch.first_available))
        pos, floor = built.pos, built.floor
    assert sent == [(701, 1000, False, 701), (1001, 1500, True, 701)]
    edge_log.close()


def test_drop_oldest_on_a_full_log_removes_the_segments_it_cuts_into(tmp_path: Path) -> None:
    """The same when the disk budget, not age, removes undelivered records."""
    cfg = uplink_config(
        tmp_path,
        gateways=[("tokyo", "port_wifi")],
        log={"max_bytes": 200_000, "alerts_reserve_bytes": 1000},
    )
    edge_log = open_log(cfg)
    fill(edge_log, "containers", 1000)  # ~160 bytes a record: fits
    assert edge_log.stream_state("containers").dropped == 0
    _seal_ranges(edge_log, "containers", (1, 500), (501, 1000))
    fill(edge_log, "containers", 300)  # no room: the oldest undelivered go
    first = edge_log.first_seq("containers")
    assert 1 < first <= 500 and edge_log.stream_state("containers").dropped == first - 1
    assert edge_log.segments.get("containers", 1) is None
    assert edge_log.segments.get("containers", 501) is not None
    built = build(edge_log, _spec(edge_log))
    assert not built.sealed and (built.first, built.last, built.floor) == (first, 500, first)
    built = build(edge_log, _spec(edge_log, pos=built.pos, floor=built.floor))
    assert built.sealed and (built.first, built.last) == (501, 1000)
    edge_log.close()


def test_log_from_before_sealing_gains_the_segments_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ships upgrade in place: a log written by an agent without sealing (migrations
    1-2) opens, gains the table, keeps its records, and they can be sealed and sent."""
    cfg = _config(tmp_path)
    with monkeypatch.context() as m:
        m.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:2])
        open_log(cfg).close()
    # what that agent wrote (this version's commit needs the later schema)
    with sqlite3.connect(cfg.log.path) as conn:
        conn.executemany(
            "INSERT INTO records (stream, seq, key, ts_ms, recv_ms, topic, payload, size)"
            " VALUES ('containers', ?, ?, ?, ?, ?, ?, ?)",
            [
                (i + 1, f"C{i % 7}", 1_700_000_000_000 + i, 1_700_000_000_000 + i,
                 f"bigblue/d1/containers/C{i % 7}/env", f"containers-{i:08d}".encode().ljust(100, b"."), 140)
                for i in range(600)
            ],
        )  # fmt: skip
        conn.execute(
            "INSERT OR REPLACE INTO streams VALUES ('containers', 601, 600, 84000, 0, 0, 0)"
        )
    db = sqlite_utils.Database(cfg.log.path)
    assert "segments" not in db.table_names()
    assert [r["id"] for r in db.query("SELECT id FROM _migrations ORDER BY id")] == [1, 2]
    db.close()
    # `status` of the new version reads the old log (the agent not restarted yet)
    report = status_of(cfg, "containers")
    assert (report["records"], report["sealed_records"]) == (600, 0)

    edge_log = open_log(cfg)
    db = sqlite_utils.Database(cfg.log.path)
    assert "segments" in db.table_names()
    assert [r["id"] for r in db.query("SELECT id FROM _migrations ORDER BY id")] == list(
        range(1, len(migrations.MIGRATIONS) + 1)
    )
    db.close()
    assert edge_log.stream_state("containers").next_seq == 601
    _seal_ranges(edge_log, "containers", (1, 500))
    built = build(edge_log, _spec(edge_log))
    assert built.sealed and built.body is not None
    assert decode_batch(built.body).records == _wire(edge_log, "containers", 1, 500)
    edge_log.close()


# -- the Sealer ----------------------------------------------------------------------------
@pytest.mark.parametrize("workers", [0, 1], ids=["thread", "child"])
async def test_sealer_seals_exactly_the_whole_segments_once(tmp_path: Path, workers: int) -> None:
    """Every whole segment of every stream, nothing more; a second pass finds nothing
    (sealing twice would be CPU the ship spends for nothing); the metrics count them.
    ``child``: sealed in the batch builder's child process, as the agent does."""
    cfg = _config(tmp_path, seal_records=500, encode_workers=workers)
    edge_log = open_log(cfg)
    fill(edge_log, "containers", 1700)
    fill(edge_log, "nav", 499)
    fill(edge_log, "alerts", 1000)
    metrics = EdgeMetrics()
    builder = BatchBuilder(edge_log, workers=workers)
    sealer = Sealer(cfg, edge_log, builder, metrics)
    try:
        assert await sealer.seal_due() == 5
        assert await sealer.seal_due() == 0
        assert builder.workers == workers and bool(builder.pids()) is (workers == 1)
        totals = edge_log.segments.totals()
        assert {s: t[:2] for s, t in totals.items()} == {
            "containers": (3, 1500),
            "alerts": (2, 1000),
        }
        for first in (1, 501, 1001):
            seg = edge_log.segments.get("containers", first)
            assert seg is not None and seg.count == 500
        assert edge_log.segments.next("containers", 1001) is None
        assert _sample(metrics, "shorelink_edge_sealed_records_total", stream="containers") == 1500
        assert _sample(metrics, "shorelink_edge_sealed_records_total", stream="alerts") == 1000
        assert _sample(metrics, "shorelink_edge_sealed_records_total", stream="nav") == 0
        assert _sample(metrics, "shorelink_edge_seal_seconds_count") == 5
        sealer.update_gauges()
        assert _sample(metrics, "shorelink_edge_segment_records", stream="containers") == 1500
        assert _sample(metrics, "shorelink_edge_segment_records", stream="nav") == 0

        report = collect_status(cfg, edge_log)["streams"]
        assert (report["containers"]["sealed_records"], report["nav"]["sealed_records"]) == (
            1500,
            0,
        )
        assert report["containers"]["sealed_bytes"] == totals["containers"][2] > 0

        fill(edge_log, "containers", 300)  # 1501..2000: one more
        fill(edge_log, "nav", 1)  # nav 1..500
        assert await sealer.seal_due() == 2
        assert edge_log.segments.sealed_upto("containers") == 2000
        assert edge_log.segments.sealed_upto("nav") == 500
        assert _sample(metrics, "shorelink_edge_sealed_records_total", stream="containers") == 2000
    finally:
        builder.close()
        edge_log.close()


async def test_sealer_runs_on_its_interval_until_stopped(tmp_path: Path) -> None:
    """Records committed at sea are sealed within a seal_interval, without a link."""
    cfg = _config(tmp_path, seal_records=200, seal_interval="50ms")
    edge_log = open_log(cfg)
    metrics = EdgeMetrics()
    builder = BatchBuilder(edge_log, workers=0)
    sealer = Sealer(cfg, edge_log, builder, metrics)
    stop = asyncio.Event()
    task = asyncio.create_task(sealer.run(stop))
    try:
        fill(edge_log, "containers", 450)
        await eventually_async(lambda: edge_log.segments.sealed_upto("containers") == 400, within=5)
        await eventually_async(
            lambda: _sample(metrics, "shorelink_edge_segment_records", stream="containers") == 400,
            within=5,
        )
        fill(edge_log, "containers", 150)
        await eventually_async(lambda: edge_log.segments.sealed_upto("containers") == 600, within=5)
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
        builder.close()
        edge_log.close()


async def test_seal_records_0_seals_nothing(tmp_path: Path) -> None:
    """``seal_records = 0`` turns sealing off: batches are encoded when sent, as before."""
    cfg = _config(tmp_path, seal_records=0, seal_interval="10ms")
    edge_log = open_log(cfg)
    fill(edge_log, "containers", 1200)
    metrics = EdgeMetrics()
    builder = BatchBuilder(edge_log, workers=0)
    sealer = Sealer(cfg, edge_log, builder, metrics)
    stop = asyncio.Event()
    await asyncio.wait_for(sealer.run(stop), 2)  # returns at once, stop never set
    assert await sealer.seal_due() == 0
    assert edge_log.segments.totals() == {}
    assert _sample(metrics, "shorelink_edge_sealed_records_total", stream="containers") == 0
    assert not build(edge_log, _spec(edge_log)).sealed
    builder.close()
    edge_log.close()


async def test_uplink_sends_segments_with_a_fresh_header_and_the_rest_encoded(
    tmp_path: Path,
) -> None:
    """Through the session (the gateway seam in memory): whole segments go as they are,
    counted in uplink_sealed_batches; every record arrives once."""
    cfg = _config(tmp_path, seal_records=400)
    edge_log = open_log(cfg)
    fill(edge_log, "containers", 1234)
    metrics = EdgeMetrics()
    gw = MemoryGateway("tokyo", "port_wifi")
    up = Uplink(cfg, edge_log, metrics, asyncio.Event(), gateways=[gw])
    try:
        assert await up.sealer.seal_due() == 3
        await up.sync_once()
    finally:
        up.close()
    assert [(r.first, r.last) for r in gw.log] == [(1, 400), (401, 800), (801, 1200), (1201, 1234)]
    assert gw.held("containers") == RangeSet([(1, 1234)]) and max(gw.arrivals.values()) == 1
    assert tuple(gw.records["containers"][s] for s in range(1, 1235)) == _wire(
        edge_log, "containers", 1, 1234
    )
    sealed = "shorelink_edge_uplink_sealed_batches_total"
    assert _sample(metrics, sealed, site="tokyo", stream="containers") == 3
    edge_log.close()


# -- end to end ----------------------------------------------------------------------------
def _agent_config(
    tmp_path: Path, mosquitto: MosquittoBroker, ship: str, token: str, proxy_port: int
) -> Path:
    return write_toml(
        tmp_path / "edge.toml",
        {
            **edge_config_doc(tmp_path, mosquitto),
            "ship": ship,
            "uplink": {
                "token": token,
                "interval": "200ms",
                "linger": "20ms",
                "probe_timeout": "2s",
                "retry_min": "50ms",
                "retry_max": "300ms",
                "seal_records": 500,
                "seal_interval": "100ms",
            },
            "gateways": [
                {"site": "tokyo", "url": f"http://127.0.0.1:{proxy_port}", "link": "port_wifi"}
            ],
        },
    )


def _publish(publisher: Publisher, n: int) -> None:
    for i in range(n):
        publisher.publish(
            f"bigblue/deck{i % 3}/containers/MSCU{i % 40:07d}/env",
            f'{{"ts": {1_700_000_000 + i}, "t": {4 + (i % 10) / 10}, "i": {i}}}'.encode(),
        )
    publisher.wait_all_acked()


async def test_backlog_sealed_at_sea_arrives_in_kafka_exactly_once_in_port(
    tmp_path: Path,
    kafka_sites: Callable[..., dict[str, KafkaBroker]],
    mosquitto: MosquittoBroker,
    publisher: Publisher,
    toxiproxy: Toxiproxy,
) -> None:
    """The voyage the feature is for: no gateway reachable at sea, the backlog sealed
    as it grows (in the agent's child process); in port the segments go with fresh
    headers and every identity lands in sl.ingress exactly once."""
    kafka = kafka_sites("tokyo")["tokyo"]
    gw_cfg = gateway_config(tmp_path / "shore", kafka, site="tokyo")
    ship = unique("ship")
    token = Credentials(gw_cfg.credentials_file).add(ship)
    gw_stop = asyncio.Event()
    gw_task = await start_gateway(gw_cfg, gw_stop)
    proxy, proxy_port = unique(f"{ship}-link"), free_port()
    toxiproxy.create_proxy(proxy, f"127.0.0.1:{proxy_port}", f"127.0.0.1:{gw_cfg.port}")
    toxiproxy.set_enabled(proxy, False)  # at sea
    agent = Agent(load_config(_agent_config(tmp_path, mosquitto, ship, token, proxy_port)))
    task = asyncio.create_task(agent.run(install_signals=False))
    try:
        await asyncio.wait_for(agent.ingest.connected.wait(), 10)
        await asyncio.to_thread(_publish, publisher, 1800)
        await eventually_async(
            lambda: agent.log.stream_state("containers").count == 1800, 20, "ingest"
        )
        await eventually_async(
            lambda: agent.log.segments.sealed_upto("containers") == 1500,
            20,
            "three segments sealed",
        )
        assert agent.log.segments.totals()["containers"][:2] == (3, 1500)
        assert agent.log.holdings() == {}  # nothing crossed yet
        # the sealer counts a segment once its write (in a thread) is back on the loop:
        # a moment after the log shows it
        sealed_records = "shorelink_edge_sealed_records_total"
        await eventually_async(
            lambda: _sample(agent.metrics, sealed_records, stream="containers") == 1500,
            10,
            "the sealed records counted",
        )

        toxiproxy.set_enabled(proxy, True)  # in port
        await eventually_async(lambda: agent.log.backlog("containers")[0] == 0, 30, "upload")
        assert_exactly_once(kafka, ship, 1800, "containers")
        sealed = _sample(
            agent.metrics,
            "shorelink_edge_uplink_sealed_batches_total",
            site="tokyo",
            stream="containers",
        )
        assert sealed >= 3  # 3, or more had the link broken and a segment gone again
    finally:
        agent.stop.set()
        await asyncio.wait_for(task, 30)
        gw_stop.set()
        await gw_task
