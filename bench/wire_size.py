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

Prints one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import random
import time
from typing import Any

import zstandard
from telemetry import Container, fleet

from shorelink.wire import Batch, WireRecord, decode_batch, encode_batch

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
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
