"""Delta tables from canonical topics: every identity once across restarts from the
checkpoint, real AIS decoded into positions, one container's history across ships."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from pyais import decode as ais_decode
from pyais import encode_dict

from local_stack.kafka import KafkaBroker
from shorelink.contract import Record
from shorelink.identity import Identity
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.topics import TopicSpec, ensure_topics
from spark_core.ais import WINDOW, NavRecord, assemble, decode_nav
from spark_core.config import SiteConfig, TableMaintenanceConfig
from spark_core.metrics import site_registry
from spark_core.query import container_history, latest_positions
from spark_core.tables import FRAGMENTS, TableKeeper, start_table, start_tables, table_path
from tests.conftest import AIS_SAMPLE
from tests.helpers import eventually, unique
from tests.spark_core.helpers import make_site, produce_raw

T0 = 1_700_000_000_000  # 2023-11-14T22:13:20Z: a run crosses midnight -> two day partitions


def _lines() -> list[str]:
    return [ln.strip() for ln in AIS_SAMPLE.read_text().splitlines() if ln.strip()]


def _checksum(body: str) -> str:
    x = 0
    for ch in body:
        x ^= ord(ch)
    return f"{x:02X}"


def split_position(mmsi: int, lat: float, lon: float, msg_id: str = "7") -> list[str]:
    """A position report (type 1) sent as two fragments, as some transponders do."""
    one = encode_dict(
        {"msg_type": 1, "mmsi": mmsi, "lat": lat, "lon": lon, "speed": 12.3, "course": 87.5}
    )[0]
    payload = one.split(",")[5]
    out = []
    for n, (part, fill) in enumerate([(payload[:14], 0), (payload[14:], 0)], start=1):
        body = f"AIVDM,2,{n},{msg_id},B,{part},{fill}"
        out.append(f"!{body}*{_checksum(body)}")
    return out


SPLIT_MMSI = 999000111


def test_assemble_multi_part_across_batches() -> None:
    """Fragment 1 in one batch, an interleaved sentence, fragment 2 in the next batch:
    decoded once, in the second; an orphan fragment is no message."""
    lines = _lines()
    f1, f2 = split_position(SPLIT_MMSI, 1.264, 103.82)
    feed = [lines[0], f1, lines[2], lines[95], f2]  # lines[95]: an orphan "2,1" fragment
    recs = [NavRecord("ship", n + 1, T0 + n, ln) for n, ln in enumerate(feed)]
    first, second = recs[:3], recs[3:]
    assert [r.seq for r, _ in assemble(first)] == [1, 3]
    store = [r for r in first if r.payload.startswith("!AIVDM,2")]
    asked: list[dict[str, int]] = []

    def lookup(need: dict[str, int]) -> list[NavRecord]:
        asked.append(need)
        return [r for r in store if need[r.origin] - WINDOW <= r.seq < need[r.origin]]

    positions, errors = decode_nav(second, lookup)
    assert asked == [{"ship": 4}] and errors == 0
    assert [(p.seq, p.mmsi, round(p.lat, 3), round(p.lon, 2), p.sog) for p in positions] == [
        (5, SPLIT_MMSI, 1.264, 103.82, 12.3)
    ]
    # JSON positions too
    pos, errors = decode_nav(
        [NavRecord("s", 1, T0, json.dumps({"lat": 1.5, "lon": 103.8, "mmsi": 7, "sog": 3}))]
    )
    assert [(p.mmsi, p.lat, p.lon, p.sog) for p in pos] == [(7, 1.5, 103.8, 3.0)] and errors == 0


def _rec(origin: str, stream: str, seq: int, key: str, ts: int, payload: str) -> Record:
    return Record(
        Identity(origin, stream, seq),
        key.encode(),
        payload.encode(),
        ts,
        "tokyo",
        f"ship/{origin}/{key}",
    )


def _produce(bootstrap: str, prefix: str, records: list[Record]) -> None:
    for stream in {r.identity.stream for r in records}:
        produce_raw(
            bootstrap,
            f"{prefix}.{stream}",
            [(r.key, r.value, r.headers()) for r in records if r.identity.stream == stream],
        )


def _run(spark: Any, site: SiteConfig, prefix: str) -> None:
    queries = start_tables(spark, site, available_now=True, topic_for=lambda s: f"{prefix}.{s}")
    for q in queries.values():
        assert q.awaitTermination(90)
        assert q.exception() is None


def _rows(spark: Any, site: SiteConfig, table: str) -> list[Any]:
    return spark.read.format("delta").load(str(table_path(site, table))).collect()


def _identities(rows: list[Any]) -> list[tuple[str, int]]:
    return sorted((r.origin, r.seq) for r in rows)


def _expected_positions(lines: list[str]) -> dict[int, tuple[float, float]]:
    """Last lat/lon per MMSI, by pyais alone (every position message is single-part)."""
    out: dict[int, tuple[float, float]] = {}
    for ln in lines:
        try:
            d = ais_decode(ln).asdict()
        except Exception:
            continue
        lat, lon = d.get("lat"), d.get("lon")
        if lat is None or lon is None or not (-90 <= lat <= 90 and -180 <= lon <= 180):
            continue
        out[d["mmsi"]] = (lat, lon)
    return out


@pytest.fixture
def small_delta(spark: Any) -> Iterator[Any]:
    """Tiny tables: rebuild Delta snapshots with 2 tasks instead of 50."""
    key = "spark.databricks.delta.snapshotPartitions"
    old = spark.conf.get(key, None)
    spark.conf.set(key, "2")
    yield spark
    if old is None:
        spark.conf.unset(key)
    else:
        spark.conf.set(key, old)


def test_tables_exactly_once_across_restarts(
    kafka: KafkaBroker, small_delta: Any, tmp_path: Path
) -> None:
    spark = small_delta
    bs = kafka.bootstrap
    site, _ = make_site(bs, tmp_path, ["containers", "nav", "alerts"])
    prefix = unique("tbl")
    ensure_topics(
        KafkaEndpoint.plaintext(bs),
        [TopicSpec(f"{prefix}.{s}", partitions=2) for s in ("containers", "nav", "alerts")],
    )
    # the sample, with a two-fragment position report split across the two runs
    sample = _lines()
    f1, f2 = split_position(SPLIT_MMSI, -33.86, 151.21)
    cut = len(sample) // 2
    lines = [*sample[:cut], f1, *sample[cut : cut + 3], f2, *sample[cut + 3 :]]
    cut += 2  # run 1 ends after f1 and one more sentence
    hour = 3_600_000

    def reading(origin: str, seq: int, box: str, ts: int, temp: float) -> Record:
        body = {
            "temperature": temp,
            "humidity": 60.5,
            "door": "closed",
            "shock": 0.01,
            "battery": 90,
        }
        return _rec(origin, "containers", seq, box, ts, json.dumps(body))

    # run 1: container C1 on ship-a (seq 1-3), C2; an alert; first part of the AIS feed
    run1 = [
        reading("ship-a", 1, "C1", T0, 4.0),
        reading("ship-a", 2, "C2", T0 + 1, 5.0),
        reading("ship-a", 3, "C1", T0 + 2 * hour, 4.5),
        _rec("ship-a", "alerts", 1, "C1", T0 + 3, '{"door": "open"}'),
        *[
            _rec("ship-a", "nav", n + 1, "position", T0 + n * 1000, ln)
            for n, ln in enumerate(lines[:cut])
        ],
    ]
    _produce(bs, prefix, run1)
    _run(spark, site, prefix)
    assert len(_rows(spark, site, "container_readings")) == 3
    first_positions = len(_rows(spark, site, "ship_positions"))
    assert first_positions > 0
    assert any(r.seq == cut - 1 for r in _rows(spark, site, FRAGMENTS))  # f1, pending
    assert SPLIT_MMSI not in {p.mmsi for p in _rows(spark, site, "ship_positions")}

    # run 2 (restart from the checkpoint): C1 moved to a port (other origin), more nav
    run2 = [
        reading("port-sg", 1, "C1", T0 + 3 * hour, 6.0),
        reading("ship-a", 4, "C1", T0 + hour, 4.2),
        reading("port-sg", 2, "C1", T0 + 4 * hour, "x"),  # type: ignore[arg-type]
        _rec("ship-a", "alerts", 2, "C2", T0 + 4, "not json"),
        *[
            _rec("ship-a", "nav", n + 1, "position", T0 + n * 1000, ln)
            for n, ln in enumerate(lines)
            if n >= cut
        ],
    ]
    _produce(bs, prefix, run2)
    _run(spark, site, prefix)
    _run(spark, site, prefix)  # nothing new: nothing written

    readings = _rows(spark, site, "container_readings")
    assert _identities(readings) == sorted(
        [("ship-a", s) for s in (1, 2, 3, 4)] + [("port-sg", 1), ("port-sg", 2)]
    )
    by_id = {(r.origin, r.seq): r for r in readings}
    r1 = by_id[("ship-a", 1)]
    assert (r1.container, r1.temperature, r1.door, r1.battery, r1.site) == (
        "C1",
        4.0,
        "closed",
        90.0,
        "tokyo",
    )
    assert str(r1.day) == "2023-11-14" and str(by_id[("ship-a", 3)].day) == "2023-11-15"
    assert by_id[("port-sg", 2)].temperature is None  # unparsable field: null, payload kept
    alerts = _rows(spark, site, "alerts")
    assert _identities(alerts) == [("ship-a", 1), ("ship-a", 2)]
    assert {a.payload for a in alerts} == {'{"door": "open"}', "not json"}

    positions = _rows(spark, site, "ship_positions")
    assert len(positions) == len({(p.origin, p.seq) for p in positions})  # once each
    assert len(positions) > first_positions
    expected = _expected_positions(sample)
    split = [p for p in positions if p.mmsi == SPLIT_MMSI]
    assert [(p.seq, round(p.lat, 2), round(p.lon, 2)) for p in split] == [(cut + 3, -33.86, 151.21)]
    expected[SPLIT_MMSI] = (split[0].lat, split[0].lon)
    assert {p.mmsi for p in positions} == set(expected)
    latest = {r.mmsi: (r.lat, r.lon) for r in latest_positions(spark, site)}
    assert latest == expected
    # a couple of exact values straight from the sample's first position reports
    first = ais_decode(lines[2]).asdict()
    row = next(p for p in positions if p.seq == 3)
    assert (row.mmsi, row.lat, row.lon, row.sog, row.cog) == (
        first["mmsi"],
        first["lat"],
        first["lon"],
        first["speed"],
        first["course"],
    )
    assert str(row.ts) and row.origin == "ship-a"

    history = container_history(spark, site, "C1")
    assert [(h.origin, h.seq) for h in history] == [
        ("ship-a", 1),
        ("ship-a", 4),
        ("ship-a", 3),
        ("port-sg", 1),
        ("port-sg", 2),
    ]
    assert [h.ts for h in history] == sorted(h.ts for h in history)
    # an id is a value, never SQL: quotes and backslashes read no other container
    for hostile in ("C1' OR 1=1 --", "\\' OR 1=1 --", "C1\\", "%"):
        assert container_history(spark, site, hostile) == [], hostile


#: payloads a ship (or a device on its network) can put in any stream: non-finite
#: numbers, nesting deeper than any parser's limit, wrong types, invalid UTF-8, no JSON
HOSTILE_PAYLOADS = (
    b'{"temperature": NaN, "humidity": Infinity, "shock": -Infinity, "battery": 1e999}',
    b"[" * 50_000 + b"]" * 50_000,
    b'{"temperature": ' + b'{"a": ' * 5_000 + b"1" + b"}" * 5_001,
    b'{"temperature": "hot", "door": 5, "battery": [1], "shock": {"x": null}}',
    b'\xff\xfe{"temperature": 1, "door": "\xc3"}',
    b'{"lat": NaN, "lon": 1e999, "mmsi": "x", "sog": -Infinity}',
    b'{"lat": 91, "lon": -181, "mmsi": -1}',
    b"!AIVDM,1,1,,A,\xff\xff,0*00",
    b"!AIVDM,9,1,7,A,13u?etPv2;0n:dDPwUM1U1Cb069D,0*24",
    b"",
    b"null",
    b'"just a string"',
    b"\x00" * 64,
)
#: event times from the epoch to far beyond what a Spark timestamp holds (18 digits: the
#: most the contract takes)
HOSTILE_TIMES = (0, 1, T0, 253_402_300_799_999, 9_223_372_036_854_775, 999_999_999_999_999_999)


def test_hostile_records_are_kept_and_never_stop_a_table(
    kafka: KafkaBroker, small_delta: Any, tmp_path: Path
) -> None:
    """Review H2, the tables' part (issue item 3): every record of the canonical topics
    passed the contract, but its payload and event time are the ship's word. Each
    table's query ends without an error on every hostile payload at every extreme time;
    container_readings and alerts keep every record (a field that does not parse is
    null, the payload kept), ship_positions decodes none of them and stops for none,
    and a good record after them is still there."""
    spark = small_delta
    bs = kafka.bootstrap
    site, _ = make_site(bs, tmp_path, ["containers", "nav", "alerts"])
    prefix = unique("hostile")
    ensure_topics(
        KafkaEndpoint.plaintext(bs),
        [TopicSpec(f"{prefix}.{s}", partitions=1) for s in ("containers", "nav", "alerts")],
    )
    records: list[Record] = []
    for stream in ("containers", "nav", "alerts"):
        seq = 0
        for payload in HOSTILE_PAYLOADS:
            for ts in HOSTILE_TIMES:
                seq += 1
                records.append(
                    Record(Identity("ship-h", stream, seq), b"C1", payload, ts, "tokyo", "ship/h")
                )
        good = {"temperature": 4.0, "lat": 35.0, "lon": 139.0, "mmsi": 431000001}
        records.append(_rec("ship-h", stream, seq + 1, "C1", T0, json.dumps(good)))
    _produce(bs, prefix, records)
    _run(spark, site, prefix)
    each = len(HOSTILE_PAYLOADS) * len(HOSTILE_TIMES) + 1
    readings = _rows(spark, site, "container_readings")
    assert len(readings) == each and len(_rows(spark, site, "alerts")) == each
    last = max(readings, key=lambda r: r.seq)
    assert (last.temperature, str(last.day)) == (4.0, "2023-11-14")
    assert all(r.temperature is None for r in readings if r.seq < each)
    beyond = [r for r in readings if r.seq % len(HOSTILE_TIMES) == 0 and r.seq < each]
    assert beyond and all(r.ts is None and r.day is None for r in beyond)
    positions = _rows(spark, site, "ship_positions")
    assert [(p.seq, p.mmsi) for p in positions] == [(each, 431000001)]


def test_compaction_keeps_the_file_count_bounded_while_the_stream_writes(
    kafka: KafkaBroker, small_delta: Any, tmp_path: Path
) -> None:
    """Review (ecosystem): the tables are written every trigger, a few small files each
    time, and nothing compacted them. ``TableKeeper`` runs Delta's OPTIMIZE and VACUUM
    beside the running query (four bursts, a round after every second): after each
    round the table has one file per day partition
    (on disk too, with a retention of 0), the query goes on without an error, and every
    reading is there once."""
    spark = small_delta
    bs = kafka.bootstrap
    site, _ = make_site(bs, tmp_path, ["containers"], tables=True)
    # an interval, for the metrics; the rounds are run here, the keeper is not started
    site = dataclasses.replace(
        site, table_maintenance=TableMaintenanceConfig(interval_s=3600, retention_s=0)
    )
    prefix = unique("keep")
    ensure_topics(KafkaEndpoint.plaintext(bs), [TopicSpec(f"{prefix}.containers", partitions=1)])
    # a small site's listing: VACUUM lists with 10,000 tasks by default (64 s here for a
    # table of three files, 5.8 s with 2: docs/tables.md)
    listing = "spark.sql.sources.parallelPartitionDiscovery.parallelism"
    spark.conf.set(listing, "2")
    query = start_table(spark, site, "container_readings", topic_for=lambda s: f"{prefix}.{s}")
    keeper = TableKeeper(spark, site)
    path = table_path(site, "container_readings").path
    try:
        seq = 0
        for burst in range(4):
            _produce(
                bs,
                prefix,
                [
                    _rec("ship-k", "containers", q, "C1", T0 + q, '{"temperature": 4}')
                    for q in range(seq + 1, seq + 6)
                ],
            )
            seq += 5
            eventually(
                # a table exists from its first commit (written by a rename), not its folder
                lambda n=seq: (
                    (path / "_delta_log" / f"{0:020}.json").exists()  # type: ignore[misc]
                    and len(_rows(spark, site, "container_readings")) == n
                ),
                60,
                f"{seq} readings in the table",
            )
            if burst % 2:  # the stream is idle between bursts: vacuum at 0 retention is safe
                round_at = time.time()
                (before, after) = keeper.run_once()["container_readings"]
                assert before >= 2 and after == 1, (before, after)
                assert len(list(path.glob("day=*/*.parquet"))) == 1  # on disk too
                # and the site's metrics say so (the alert ShorelinkTableNotCompacted)
                m = _table_metrics(keeper)
                assert m[("shorelink_spark_table_files", "container_readings")] == 1
                assert (
                    m[("shorelink_spark_table_compacted_timestamp_seconds", "container_readings")]
                    >= round_at
                )
                assert (
                    m[("shorelink_spark_table_maintenance_failures_total", "container_readings")]
                    == 0
                )
        assert query.isActive and query.exception() is None
        assert _identities(_rows(spark, site, "container_readings")) == [
            ("ship-k", q) for q in range(1, seq + 1)
        ]
    finally:
        query.stop()
        spark.conf.unset("spark.databricks.delta.retentionDurationCheck.enabled")
        spark.conf.unset(listing)


def _table_metrics(keeper: TableKeeper) -> dict[tuple[str, str], float]:
    """The keeper's figures as the site application serves them: (name, table) -> value."""
    text = generate_latest(site_registry(None, [], None, keeper)).decode()
    return {
        (s.name, s.labels["table"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if "table" in s.labels
    }
