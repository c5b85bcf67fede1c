"""Benchmark: bytes on the wire per record, shorelink batches vs gzip of JSON lines.

Workload (deterministic for a given ``--seed``): one ship, ``--containers`` containers
each reporting once a minute on ``bigblue/deck{d}/containers/{id}/env`` (ids are ISO 6346
with a valid check digit, e.g. ``MSCU1234565``) with a JSON payload of ``ts`` (epoch
seconds, ms precision), temperature (reefers hold a setpoint, dry boxes drift slowly),
humidity (slow random walk), door (``closed``; rarely ``open`` for a few minutes), shock
(small noise, rare spikes) and battery (slowly declining); plus the ship's position every
10 s on stream ``nav``. Records get seqs in arrival order, as the edge log assigns them.

"Raw" is one JSON line per record, the size a naive uplink would send::

    json.dumps({"origin", "stream", "seq", "key", "ts", "topic", "payload": <str>})

Each stream is cut into batches of each ``--batch-sizes`` (500: satellite; 5000: port
links) and encoded with ``shorelink.wire.encode_batch``; the peer is gzip (level 6, the
``gzip`` CLI default) of the same batch's JSON lines; zstd of those lines at the same
level is shown too, to separate what the columns buy from what zstd buys. Every batch is decoded back and
compared with what was encoded. The goal is wire/raw <= 0.08 on port-link batches.

    .venv/bin/python bench/wire_size.py              # 1 hour: 60,000 + 360 records
    .venv/bin/python bench/wire_size.py --minutes 10 --levels 3,12,19

Dictionaries (``dictionary`` in the output; ``--no-dict`` skips it): per stream, a zstd
dictionary (shorelink/wire_dict.py) is trained on batch bodies of one stretch of data and
measured on another, at the satellite's batch size (``--dict-batch``, 200 records):

- ``ais``: the real AIS sample (fleet_sim/data/nmea_data_sample.txt, 898 sentences on
  ``bigblue/ship1/nav/ais``, key ``ais``, one every 3 s): trained on the first half,
  measured on the second;
- ``containers``: the same ship's containers (``--containers``), trained on the first
  20 minutes, measured on the next 20 (another stretch of the same voyage: the ship's
  containers are the same, their readings are not);
- ``reports``: the ship report (shorelink/ship_report.py) every 10 minutes, of a ship
  whose backlog grows and shrinks: trained on the first 10 days, measured on the next
  10; also one report a batch (what a satellite session carries between reports).

Each measured batch is encoded three ways: the wire with the dictionary (at ``--level``,
as the agent sends), the wire without one at zstd-19, and zstd-19 of the batch's JSON
lines (for AIS also zstd-19 of the sentences alone, the issue's "raw bytes"). AIS
sentences go as fields (shorelink/wire_ais.py); ``as_text_with_dict`` is the wire as it
was before, the sentences as text with a dictionary trained on such bodies, in the same
run, and ``ais_where_the_bytes_go`` what each field takes (``ais_breakdown``). The goal:
the wire with the dictionary at most 0.8 of zstd-19 of the same batch's raw bytes
without a dictionary (``goal_met``: the JSON lines; AIS: the sentences alone);
``dict_alone_met`` holds it to the stricter peer, the wire's own body at zstd-19
without a dictionary (what the dictionary alone buys).

Prints one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import random
import time
from pathlib import Path
from typing import Any

import zstandard
from telemetry import Container, fleet

from shorelink.ship_report import ShipReport, encode_report
from shorelink.wire import Batch, WireRecord, decode_batch, encode_batch
from shorelink.wire_ais import AIS
from shorelink.wire_body import put_ints
from shorelink.wire_dict import Dictionaries, Dictionary, train, training_samples

AIS_SAMPLE = Path(__file__).resolve().parents[1] / "fleet_sim" / "data" / "nmea_data_sample.txt"
#: the goal: the wire with a dictionary at most this part of zstd-19 without one
DICT_GOAL = 0.8

SHIP = "bigblue"
T0_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def container_records(rng: random.Random, n: int, minutes: int, style: str) -> list[WireRecord]:
    boxes = fleet(rng, n)
    arrivals: list[tuple[int, int, Container, bytes]] = []
    for minute in range(minutes):
        for c in boxes:
            ts = T0_MS + c.phase_ms + minute * 60_000 + int(rng.gauss(0, 150))
            payload = c.reading(rng, ts, style)
            arrivals.append((ts + rng.randint(5, 50), ts, c, payload))  # broker latency
    arrivals.sort(key=lambda a: a[0])
    return [
        WireRecord(seq, c.id, ts, c.topic(SHIP), payload)
        for seq, (_, ts, c, payload) in enumerate(arrivals, start=1)
    ]


def nav_records(rng: random.Random, minutes: int) -> list[WireRecord]:
    lat, lon, cog, sog = 35.2811, 139.8123, 211.0, 18.2  # leaving Tokyo Bay
    out = []
    for i in range(minutes * 6):
        ts = T0_MS + i * 10_000 + rng.randint(0, 40)
        cog = (cog + rng.gauss(0, 0.3)) % 360
        sog = max(0.0, sog + rng.gauss(0, 0.05))
        nm = sog * 10 / 3600
        lat += nm / 60 * math.cos(math.radians(cog))
        lon += nm / 60 * math.sin(math.radians(cog)) / math.cos(math.radians(lat))
        payload = (
            f'{{"ts":{ts / 1000:.3f},"lat":{lat:.6f},"lon":{lon:.6f},"sog":{sog:.1f},'
            f'"cog":{cog:.1f},"hdg":{round(cog + rng.gauss(0, 1)) % 360}}}'
        ).encode()
        out.append(WireRecord(i + 1, "position", ts, f"{SHIP}/nav/position", payload))
    return out


def raw_line(stream: str, r: WireRecord) -> bytes:
    doc = {
        "origin": SHIP,
        "stream": stream,
        "seq": r.seq,
        "key": r.key,
        "ts": r.ts_ms,
        "topic": r.topic,
        "payload": r.payload.decode(),
    }
    return json.dumps(doc).encode()


def measure(stream: str, records: list[WireRecord], size: int, level: int) -> dict[str, Any]:
    raw = wire = gz = zs = 0
    zstd = zstandard.ZstdCompressor(level=level)
    enc_s = dec_s = 0.0
    batches = 0
    for lo in range(0, len(records), size):
        chunk = tuple(records[lo : lo + size])
        batch = Batch(SHIP, stream, chunk, first_available=1)
        lines = [raw_line(stream, r) for r in chunk]
        raw += sum(map(len, lines))
        text = b"\n".join(lines) + b"\n"
        gz += len(gzip.compress(text, compresslevel=6, mtime=0))
        zs += len(zstd.compress(text))
        t = time.perf_counter()
        data = encode_batch(batch, level=level)
        enc_s += time.perf_counter() - t
        t = time.perf_counter()
        back = decode_batch(data)
        dec_s += time.perf_counter() - t
        if back != batch:
            raise SystemExit(f"round trip failed: {stream} batch at seq {chunk[0].seq}")
        wire += len(data)
        batches += 1
    n = len(records)
    return {
        "batch_records": size,
        "batches": batches,
        "zstd_level": level,
        "raw_bytes_per_record": round(raw / n, 1),
        "wire_bytes_per_record": round(wire / n, 2),
        "gzip_bytes_per_record": round(gz / n, 2),
        "zstd_json_bytes_per_record": round(zs / n, 2),
        "wire_ratio": round(wire / raw, 4),
        "gzip_ratio": round(gz / raw, 4),
        "zstd_json_ratio": round(zs / raw, 4),
        "wire_vs_gzip": round(wire / gz, 3),
        "encode_ms_per_batch": round(enc_s * 1000 / batches, 2),
        "decode_ms_per_batch": round(dec_s * 1000 / batches, 2),
    }


def ais_records() -> list[WireRecord]:
    """The real AIS sample as the voyage's AIS ship sends it (one sentence every 3 s)."""
    rng = random.Random(3)
    lines = [ln.strip() for ln in AIS_SAMPLE.read_bytes().splitlines() if ln.strip()]
    return [
        WireRecord(i + 1, "ais", T0_MS + i * 3000 + rng.randint(0, 40), f"{SHIP}/ship1/nav/ais", ln)
        for i, ln in enumerate(lines)
    ]


def report_records(rng: random.Random, n: int) -> list[WireRecord]:
    """A ship report every 10 minutes: streams' last seqs grow, the backlog rises at sea
    and falls when a link carries it, the satellite's spend grows through the day."""
    seqs = {"containers": 0, "nav": 0, "alerts": 0, "agent": 0}
    rates = {"containers": 10_000, "nav": 60, "alerts": 0, "agent": 1}
    backlog = dict.fromkeys(seqs, 0)
    out = []
    for i in range(n):
        at = T0_MS + i * 600_000 + rng.randint(0, 900)
        for s, rate in rates.items():
            new = (
                rate + (rng.random() < 0.001)
                if s == "alerts"
                else rate + rng.randint(0, rate // 50)
            )
            seqs[s] += new
            backlog[s] = 0 if rng.random() < 0.02 else backlog[s] + new
            if s in ("nav", "alerts", "agent") and rng.random() < 0.7:
                backlog[s] = 0  # the satellite carries these
        day_s = (i * 600) % 86_400
        report = ShipReport(
            at_ms=at,
            link="satellite" if rng.random() < 0.9 else None,
            streams={s: (seqs[s], backlog[s]) for s in seqs},
            links={
                "satellite": (day_s * 180 + rng.randint(0, 5000), 20_000_000),
                "port_wifi": (0, 0),
            },
            log_bytes=4_000_000_000 + i * 1_700_000,
            log_budget=32_000_000_000,
            agent="0.4.1",
        )
        out.append(WireRecord(i + 1, SHIP, at, "$shorelink/report", encode_report(report)))
    return out


def _renumbered(records: list[WireRecord]) -> tuple[WireRecord, ...]:
    return tuple(
        WireRecord(i + 1, r.key, r.ts_ms, r.topic, r.payload) for i, r in enumerate(records)
    )


def measure_dict(
    stream: str,
    dictionary: Dictionary,
    measure_on: list[WireRecord],
    size: int,
    level: int,
    text_dictionary: Dictionary | None = None,
) -> dict[str, Any]:
    """Encode ``measure_on`` in batches of ``size`` with ``dictionary`` and compare with
    zstd-19 of the same batches without one. With ``text_dictionary`` (AIS: one trained
    on bodies with the sentences as text), also the wire as it was before AIS sentences
    were coded as fields (``ais=False``) with it."""
    held = Dictionaries([d for d in (dictionary, text_dictionary) if d is not None])
    z19 = zstandard.ZstdCompressor(level=19)
    with_dict = wire19 = json19 = payload19 = raw = batches = as_text = 0
    for lo in range(0, len(measure_on), size):
        chunk = _renumbered(measure_on[lo : lo + size])
        batch = Batch(SHIP, stream, chunk, first_available=1)
        data = encode_batch(batch, level=level, dictionary=dictionary)
        if decode_batch(data, dictionaries=held) != batch:
            raise SystemExit(f"round trip failed: {stream} dictionary batch at {lo}")
        with_dict += len(data)
        if text_dictionary is not None:
            old = encode_batch(batch, level=level, dictionary=text_dictionary, ais=False)
            if decode_batch(old, dictionaries=held) != batch:
                raise SystemExit(f"round trip failed: {stream} text batch at {lo}")
            as_text += len(old)
        wire19 += len(encode_batch(batch, level=19))
        lines = [raw_line(stream, r) for r in chunk]
        raw += sum(map(len, lines))
        json19 += len(z19.compress(b"\n".join(lines) + b"\n"))
        payload19 += len(z19.compress(b"\n".join(r.payload for r in chunk) + b"\n"))
        batches += 1
    n = len(measure_on)
    peers = {"wire_zstd19": wire19, "json_lines_zstd19": json19}
    if stream == "ais":
        peers["sentences_zstd19"] = payload19
    ratios = {f"vs_{k}": round(with_dict / v, 3) for k, v in peers.items()}
    before = {}
    if text_dictionary is not None:
        before = {
            "as_text_with_dict_bytes_per_record": round(as_text / n, 2),
            "as_text_vs_sentences_zstd19": round(as_text / payload19, 3),
        }
    # the goal's peer: zstd-19 of the batch's raw bytes (AIS: the sentences, as the
    # issue measured them; else the JSON lines)
    goal_peer = "vs_sentences_zstd19" if stream == "ais" else "vs_json_lines_zstd19"
    return {
        "batch_records": size,
        "batches": batches,
        "measured_records": n,
        "raw_bytes_per_record": round(raw / n, 1),
        "with_dict_bytes_per_record": round(with_dict / n, 2),
        **{f"{k}_bytes_per_record": round(v / n, 2) for k, v in peers.items()},
        **ratios,
        **before,
        "goal": DICT_GOAL,
        "goal_peer": goal_peer,
        "goal_met": ratios[goal_peer] <= DICT_GOAL,
        # what the dictionary itself buys: the same wire body without it, at zstd-19
        "dict_alone_met": ratios["vs_wire_zstd19"] <= DICT_GOAL,
    }


#: the AIS section's parts (shorelink/wire_ais.py ``AIS.parts``) by what they carry
AIS_GROUPS = {
    "type_and_framing": (
        "sentences per record", "literal lengths", "heads", "forms", "form", "channel",
    ),
    "mmsi": ("mmsi table", "mmsi"),
    "position": ("lon", "lat"),
    "motion": ("speed", "course", "heading", "turn"),
    "time": ("second", "year", "month", "day", "hour", "minute"),
    "radio": ("radio_state", "radio_sub", "radio20"),
    "literal": ("literal",),
}  # fmt: skip


def ais_breakdown(records: list[WireRecord], size: int) -> dict[str, Any]:
    """Where an AIS batch's bytes go: each group of the section's parts compressed
    alone at zstd-19 (no dictionary), per record; ``record_time`` is the records' event
    time column (outside the section), ``other_bits`` every other field and the raw
    bits (the text of static messages, fragments after the first). Parts compressed
    apart sum to more than the section compressed whole (shown beside them)."""
    z19 = zstandard.ZstdCompressor(level=19, write_checksum=False, write_content_size=False)
    group_of = {part: g for g, parts in AIS_GROUPS.items() for part in parts}
    sizes: dict[str, int] = dict.fromkeys([*AIS_GROUPS, "other_bits", "record_time"], 0)
    whole = 0
    for lo in range(0, len(records), size):
        chunk = records[lo : lo + size]
        parts = AIS.parts([r.payload for r in chunk])
        if parts is None:
            raise SystemExit(f"AIS batch at {lo} is not coded as fields")
        joined: dict[str, bytes] = {}
        for name, data in parts:
            group = group_of.get(name, "other_bits")
            joined[group] = joined.get(group, b"") + data
        for group, data in joined.items():
            sizes[group] += len(z19.compress(data))
        times = bytearray()
        put_ints(times, [r.ts_ms for r in chunk])
        sizes["record_time"] += len(z19.compress(bytes(times)))
        whole += len(z19.compress(b"".join(data for _, data in parts)))
    n = len(records)
    return {
        **{f"{k}_bytes_per_record": round(v / n, 2) for k, v in sizes.items()},
        "parts_apart_bytes_per_record": round(sum(sizes.values()) / n, 2),
        "section_whole_bytes_per_record": round(whole / n, 2),
    }


def dictionary_figures(args: argparse.Namespace) -> dict[str, Any]:
    """Per stream: one dictionary trained on one stretch, measured on the next at the
    satellite's batch size and at one record a batch (what a satellite session carries
    between readings)."""
    size, level = args.dict_batch, args.level
    ais = ais_records()
    half = len(ais) // 2
    boxes = container_records(random.Random(args.seed + 1), args.containers, 40, args.payload_style)
    mid = next(i for i, r in enumerate(boxes) if r.ts_ms >= T0_MS + 20 * 60_000)
    reports = report_records(random.Random(args.seed + 2), 2 * 1440)
    data = {
        "ais": (ais[:half], ais[half:]),
        "containers": (boxes[:mid], boxes[mid:]),
        "reports": (reports[:1440], reports[1440:]),
    }
    out: dict[str, Any] = {}
    for i, (stream, (train_on, measure_on)) in enumerate(data.items()):
        t = time.perf_counter()
        samples = training_samples(train_on, size)
        d = train(stream, samples, dict_id=1_000_000 + i, size=args.dict_bytes)
        trained = {
            "dict_bytes": len(d.data),
            "train_s": round(time.perf_counter() - t, 2),
            "trained_on_records": len(train_on),
            "training_samples": len(samples),
        }
        text = None
        if stream == "ais":  # the wire before AIS sentences were coded as fields
            samples = training_samples(train_on, size, ais=False)
            text = train(stream, samples, dict_id=1_100_000 + i, size=args.dict_bytes)
        out[stream] = {**trained, **measure_dict(stream, d, measure_on, size, level, text)}
        out[f"{stream}_one_a_batch"] = {
            **trained,
            **measure_dict(stream, d, measure_on[:200], 1, level, text),
        }
        if stream == "ais":
            out["ais_where_the_bytes_go"] = ais_breakdown(measure_on, size)
    out["goal_met"] = all(v["goal_met"] for v in list(out.values()) if "goal_met" in v)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description="Wire bytes per record for container telemetry and ship position, "
        "shorelink batches vs gzip of JSON lines. Prints one JSON object on stdout.",
    )
    ap.add_argument("--containers", type=int, default=1000, help="containers (default 1000)")
    ap.add_argument("--minutes", type=int, default=60, help="minutes of data (default 60)")
    ap.add_argument(
        "--batch-sizes",
        default="500,5000",
        help="records per batch, comma-separated (default 500,5000: satellite, port)",
    )
    ap.add_argument("--level", type=int, default=12, help="zstd level (default 12)")
    ap.add_argument(
        "--levels",
        default="3,12,19",
        help="zstd levels to sweep on the largest batch size (default 3,12,19; '' for none)",
    )
    ap.add_argument(
        "--payload-style",
        choices=["compact", "python"],
        default="compact",
        help="compact: firmware-style fixed decimals (default); python: json.dumps of rounded floats",
    )
    ap.add_argument("--seed", type=int, default=7, help="random seed (default 7)")
    ap.add_argument(
        "--dict-batch",
        type=int,
        default=200,
        help="records per batch for the dictionaries' figures (default 200: the satellite's)",
    )
    ap.add_argument(
        "--dict-bytes",
        type=int,
        default=32 * 1024,
        help="size of each trained dictionary (default 32768)",
    )
    ap.add_argument("--no-dict", action="store_true", help="skip the dictionaries' figures")
    args = ap.parse_args()
    sizes = [int(s) for s in args.batch_sizes.split(",") if s]
    levels = [int(s) for s in args.levels.split(",") if s]

    rng = random.Random(args.seed)
    streams = {
        "containers": container_records(rng, args.containers, args.minutes, args.payload_style),
        "nav": nav_records(rng, args.minutes),
    }
    result: dict[str, Any] = {
        "workload": {
            "containers": args.containers,
            "minutes": args.minutes,
            "payload_style": args.payload_style,
            "records": {name: len(recs) for name, recs in streams.items()},
            "example_payload": {n: recs[0].payload.decode() for n, recs in streams.items()},
            "example_raw_line": raw_line("containers", streams["containers"][0]).decode(),
        },
    }
    for name, recs in streams.items():
        result[name] = {str(s): measure(name, recs, s, args.level) for s in sizes}
    port = max(sizes)
    result["containers_level_sweep"] = {
        str(lv): measure("containers", streams["containers"], port, lv) for lv in levels
    }
    ratio = result["containers"][str(port)]["wire_ratio"]
    result["goal"] = {"port_batch_records": port, "wire_ratio_max": 0.08, "met": ratio <= 0.08}
    if not args.no_dict:
        result["dictionary"] = dictionary_figures(args)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
