"""Benchmark: what ship signatures cost (shorelink/proof.py), signed vs unsigned side by
side in one run, on the same telemetry as bench/wire_size.py.

- **wire bytes** per record: batches of the two kinds of link (200 records: the voyage's satellite batches; 5000: port links), encoded
  unsigned and signed (64 bytes per chunk of 128 records); goal: on the satellite,
  signed within 5% of unsigned;
- **ship CPU** per record: encoding unsigned vs signed (hashing every record, one
  Ed25519 signature per chunk);
- **gateway CPU** per record: decoding unsigned vs decoding plus proving (the record
  hashes, one check per chunk, each record's ``sl.proof``);
- **merge CPU** per record: a site checking a pulled record's proof cold (the chunk's
  signature not seen yet) and warm (the signature cached: the chunk's other records);
- **bytes between sites** per record: the record as the gateway writes it into Kafka
  (key, value, headers), without and with ``sl.proof``, raw and lz4-compressed as a
  Kafka batch of one partition (the producers' codec) holds it.

    .venv/bin/python bench/signatures.py            # 20,000 container readings
    .venv/bin/python bench/signatures.py --containers 200 --minutes 10 --batch 200

Prints one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from typing import Any

import lz4.frame
from telemetry import fleet

from shorelink.contract import H_PROOF, contract_headers
from shorelink.proof import ShipKey, ShipKeys
from shorelink.wire import Batch, WireRecord, decode_columns, encode_batch

SHIP = "bigblue"
T0_MS = 1_767_225_600_000


def readings(containers: int, minutes: int, seed: int) -> list[WireRecord]:
    rng = random.Random(seed)
    boxes = fleet(rng, containers)
    out = []
    for minute in range(minutes):
        for c in boxes:
            ts = T0_MS + c.phase_ms + minute * 60_000
            out.append((ts, c.id, c.topic(SHIP), c.reading(rng, ts)))
    out.sort()
    return [WireRecord(i, k, ts, t, p) for i, (ts, k, t, p) in enumerate(out, start=1)]


def per_record_us(seconds: float, n: int) -> float:
    return round(seconds / n * 1e6, 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--containers", type=int, default=1000)
    ap.add_argument("--minutes", type=int, default=20)
    ap.add_argument("--batch", type=int, default=200, help="records per uploaded batch")
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    recs = readings(a.containers, a.minutes, a.seed)
    n = len(recs)
    key = ShipKey.generate()
    keys = ShipKeys.parse({"ships": {SHIP: key.public()}})
    batches = [tuple(recs[i : i + a.batch]) for i in range(0, n, a.batch)]

    t = time.perf_counter()
    plain = [encode_batch(Batch(SHIP, "containers", b)) for b in batches]
    t_plain = time.perf_counter() - t
    t = time.perf_counter()
    signed = [encode_batch(Batch(SHIP, "containers", b), key=key) for b in batches]
    t_signed = time.perf_counter() - t

    t = time.perf_counter()
    for data in plain:
        decode_columns(data)
    t_decode = time.perf_counter() - t
    t = time.perf_counter()
    proofs: list[bytes] = []
    for data in signed:
        h, cols = decode_columns(data)
        got = keys.prove_batch(SHIP, "containers", h.first_seq, cols, h.signatures)
        assert got is not None
        proofs += got
    t_prove = time.perf_counter() - t

    # a merge at another site: every record checked once, the cache cold for each chunk
    # (a fresh ShipKeys: no chunk seen) and warm (the same again)
    site = ShipKeys.parse({"ships": {SHIP: key.public()}})
    args = [(SHIP, "containers", r.seq, r.ts_ms, r.key, r.topic, r.payload) for r in recs]
    t = time.perf_counter()
    for arg, proof in zip(args, proofs, strict=True):
        assert site.check(*arg, proof) is None
    t_check = time.perf_counter() - t
    t = time.perf_counter()
    for arg, proof in zip(args, proofs, strict=True):
        assert site.check(*arg, proof) is None
    t_warm = time.perf_counter() - t

    def kafka_bytes(with_proof: bool) -> tuple[int, int]:
        raw = bytearray()
        for r, proof in zip(recs, proofs, strict=True):
            hs = contract_headers(
                SHIP.encode(), b"containers", r.seq, r.ts_ms, b"tokyo", r.topic.encode()
            )
            if with_proof:
                hs.append((H_PROOF, proof))
            raw += r.key.encode() + r.payload + b"".join(k.encode() + v for k, v in hs)
        # one partition of six, as a producer's batch holds it
        part = bytes(raw)
        return len(part), len(lz4.frame.compress(part))

    # what the ship's links carry, by the batch size of each kind of link
    by_link = {}
    for link, size in (("satellite", 200), ("port", 5000)):
        chunks = [tuple(recs[i : i + size]) for i in range(0, n, size)]
        u = sum(len(encode_batch(Batch(SHIP, "containers", b))) for b in chunks)
        s_ = sum(len(encode_batch(Batch(SHIP, "containers", b), key=key)) for b in chunks)
        by_link[f"{link}_{size}"] = {
            "signed": round(s_ / n, 2),
            "unsigned": round(u / n, 2),
            "ratio": round(s_ / u, 3),
        }
    raw_plain, lz4_plain = kafka_bytes(False)
    raw_proof, lz4_proof = kafka_bytes(True)
    out: dict[str, Any] = {
        "records": n,
        "batch_records": a.batch,
        "wire_bytes_per_record": {
            **by_link,
            "goal_satellite_ratio_max": 1.05,
        },
        "ship_encode_us_per_record": {
            "signed": per_record_us(t_signed, n),
            "unsigned": per_record_us(t_plain, n),
        },
        "gateway_us_per_record": {
            "decode_and_prove": per_record_us(t_prove, n),
            "decode": per_record_us(t_decode, n),
        },
        "merge_check_us_per_record": {
            "cold": per_record_us(t_check, n),
            "cached_signature": per_record_us(t_warm, n),
        },
        "proof_bytes_per_record": round(sum(map(len, proofs)) / n, 1),
        "kafka_bytes_per_record": {
            "with_proof_raw": round(raw_proof / n, 1),
            "without_proof_raw": round(raw_plain / n, 1),
            "with_proof_lz4": round(lz4_proof / n, 1),
            "without_proof_lz4": round(lz4_plain / n, 1),
        },
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
