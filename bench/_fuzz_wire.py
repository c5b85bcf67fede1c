"""bench/fuzz.py's ``wire`` target: an upload body through the decoder as the gateway
calls it (``peek_header``, then ``decode_columns``: core_gateway/service.py and
core_gateway/decoding.py), with what the decoder promises as the oracle.

An input's first byte chooses the limits (``// 3 % 2``: the gateway's defaults, or small
ones that inputs of a few KiB can reach) and (``% 3``) how the rest becomes a body, so
that mutations reach past the CRC and the zstd frame (a mutated byte almost never keeps
a CRC right):

- 0: the rest is the body, as a ship (or anyone) would send it;
- 1: the same with its header's CRC made right (mutations of the header and the frame);
- 2: a decompressed body: flags (1 byte: templated, signed, AIS), count - 1 (2 bytes, little-endian), the chunk
  signatures if signed, then the columns, compressed and framed here with a right CRC
  (mutations of the columns: what ``shorelink/wire_body.py`` parses).

A finding is any of: an exception that is not :class:`WireError`; a ``WireError`` that
the decoder's catch-all made of another exception (``"undecodable batch: "``: a check
missing before the code that failed); more bytes allocated than ``decode_cost_bound``
(tracemalloc, whether it took the batch or refused it: every input whose header
declares 256 KiB or more, one in eight of the rest); more CPU than :data:`CPU_FIXED_S`
plus :data:`CPU_PER_BYTE_S` per byte and decompressed byte and :data:`CPU_PER_RECORD_S`
per record; a batch taken whose records break the format's rules or the limits, or that
does not come back the same through ``encode_batch`` and ``decode_batch``.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
import tracemalloc
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import zstandard
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from telemetry import fleet

from shorelink.contract import MAX_RECORD_BYTES, record_bytes
from shorelink.proof import CHUNK_RECORDS, SIGNATURE_BYTES, ShipKey
from shorelink.wire import (
    DEFAULT_LIMITS,
    FLAG_AIS,
    FLAG_SIGNED,
    FLAG_TEMPLATED,
    Batch,
    Body,
    Limits,
    WireError,
    WireRecord,
    decode_batch,
    decode_columns,
    decode_cost_bound,
    encode_batch,
    encode_body,
    frame_batch,
    peek_header,
)
from shorelink.wire_body import I64_MAX, I64_MIN
from tests import wire_bombs

AIS_SAMPLE = Path(__file__).resolve().parents[1] / "fleet_sim" / "data" / "nmea_data_sample.txt"

__all__ = ["CPU_FIXED_S", "CPU_PER_BYTE_S", "CPU_PER_RECORD_S", "DICTIONARY", "check", "seeds"]

#: the gateway's default limits, and small ones (a gateway's limits are its config's):
#: an input's first byte chooses (small ones let inputs of a few KiB reach the caps'
#: refusals: the decoded-size budget, the record count)
LIMITS = (
    DEFAULT_LIMITS,
    Limits(max_records=300, max_compressed_bytes=4096, max_decompressed_bytes=8192),
)
#: the re-encoded batch is decoded again without the limits' caps (it may come out larger)
_UNCAPPED = Limits(max_records=2**32 - 1, max_decompressed_bytes=2**32 - 1)
ORIGIN, STREAM = "fuzzship", "containers"
#: inputs whose header declares this many decompressed bytes are always measured under
#: tracemalloc (the rest one in eight)
TRACE_RAW_BYTES = 256 * 1024
#: CPU per input (this thread's process time), at most: generous for a loaded machine,
#: tight enough that anything worse than linear in a fuzzer's input (4 KiB to 64 KiB)
#: shows (the decoder's own cost: about 2 µs a record, 40 ns a decompressed byte)
CPU_FIXED_S = 0.25
CPU_PER_BYTE_S = 1e-6
CPU_PER_RECORD_S = 20e-6
#: tokens for libFuzzer's dictionary: the header's magic, column codes, number shapes
DICTIONARY = [b"SLKB", b"SLKB\x02", b"\x28\xb5\x2f\xfd", b"\x20", b"\x30", b"\x13", b"-0.5", b"1e5"]

_ZSTD = zstandard.ZstdCompressor(level=1, write_content_size=True, write_checksum=False)
_CRC_AT = 36

#: what the inputs came to: "ok" or the refusal's reason; the worst ratios to the bounds
stats: dict[str, Any] = {
    "outcomes": Counter(),
    "traced": 0,
    "peak_bytes": 0,
    "peak_over_bound": 0.0,
    "cpu_s": 0.0,
    "cpu_over_bound": 0.0,
}


def body_of(data: bytes) -> bytes:
    """The upload body an input stands for (see the module's docstring)."""
    if not data:
        return b""
    mode, rest = data[0] % 3, data[1:]
    if mode == 0 or (mode == 1 and len(rest) < _CRC_AT + 4):
        return rest
    if mode == 1:
        crc = zlib.crc32(rest[_CRC_AT + 4 :], zlib.crc32(rest[:_CRC_AT]))
        return rest[:_CRC_AT] + crc.to_bytes(4, "little") + rest[_CRC_AT + 4 :]
    if len(rest) < 3:
        return rest
    flags, count = (
        rest[0] & (FLAG_TEMPLATED | FLAG_SIGNED | FLAG_AIS),
        1 + int.from_bytes(rest[1:3], "little"),
    )
    raw, sigs = rest[3:], b""
    if flags & FLAG_SIGNED:
        n = -(-count // CHUNK_RECORDS) * SIGNATURE_BYTES
        sigs, raw = raw[:n], raw[n:]
    body = Body(flags, 1, count, len(raw), _ZSTD.compress(raw), 0, sigs)
    return frame_batch(ORIGIN, STREAM, body, 1)


def limits_of(data: bytes) -> Limits:
    """The limits an input is decoded with (its first byte: ``// 3 % 2``)."""
    return LIMITS[data[0] // 3 % 2] if data else LIMITS[0]


def _decode(body: bytes, limits: Limits) -> tuple[Batch | WireError, int, int]:
    """The gateway's decode of ``body``: the batch or the refusal, with the header's
    ``raw_len`` and ``count`` (0 when the header itself is refused)."""
    try:
        h = peek_header(body, limits)
    except WireError as exc:
        return exc, 0, 0
    try:
        hd, columns = decode_columns(body, limits)
        batch = Batch.from_columns(
            hd.origin, hd.stream, hd.first_seq, hd.first_available, columns, hd.signatures
        )
    except WireError as exc:
        return exc, h.raw_len, h.count
    return batch, h.raw_len, h.count


class _Tracer:
    """Decodes a body under tracemalloc in a process of its own (this module run as a
    script), where tracing stays on: started and stopped around each decode, tracing
    leaks about 4 KiB a time (Python 3.11), and on for good in the fuzzer's process it
    would cost every input's decode (and its CPU figure) about 30 times its CPU."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None

    def peak(self, body: bytes, limits: Limits) -> int:
        """The bytes decoding ``body`` allocated at its peak."""
        if self.proc is None or self.proc.poll() is not None:
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
            self.proc = subprocess.Popen(
                [sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
            )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        small = (limits is LIMITS[1]).to_bytes(1, "little")
        self.proc.stdin.write(small + len(body).to_bytes(8, "little") + body)
        self.proc.stdin.flush()
        answer = self.proc.stdout.read(8)
        if len(answer) != 8:
            raise AssertionError(f"decoding under tracemalloc died: {self.proc.wait()}")
        return int.from_bytes(answer, "little")


def _serve() -> None:
    """The tracer's side: a body in (small limits or not, 1 byte; its length, 8 bytes;
    its bytes), the peak out."""
    tracemalloc.start()
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while head := stdin.read(9):
        body = stdin.read(int.from_bytes(head[1:], "little"))
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        _decode(body, LIMITS[head[0]])
        stdout.write((tracemalloc.get_traced_memory()[1] - base).to_bytes(8, "little"))
        stdout.flush()


_TRACER = _Tracer()


def check(data: bytes) -> None:
    """Raise on a finding (see the module's docstring); return on anything the decoder
    promises. Memory is measured (by :class:`_Tracer`) for every input whose header
    declares :data:`TRACE_RAW_BYTES` or more and one in eight of the rest (by its CRC:
    a replay measures what the run did)."""
    body = body_of(data)
    t0 = time.thread_time()
    limits = limits_of(data)
    out, raw_len, count = _decode(body, limits)
    cpu = time.thread_time() - t0
    if isinstance(out, WireError):
        stats["outcomes"][out.reason] += 1
        text = str(out)
        if "undecodable batch: " in text or "unreadable header: " in text:
            raise AssertionError(f"the decoder's catch-all caught another exception: {text}")
        decoded = limits.max_decompressed_bytes if raw_len else 0
    else:
        stats["outcomes"]["ok"] += 1
        decoded = out.decoded_size
    cpu_bound = CPU_FIXED_S + CPU_PER_BYTE_S * (len(body) + raw_len) + CPU_PER_RECORD_S * count
    stats["cpu_s"] = max(stats["cpu_s"], cpu)
    stats["cpu_over_bound"] = max(stats["cpu_over_bound"], cpu / cpu_bound)
    if cpu > cpu_bound:
        raise AssertionError(f"decoding took {cpu:.3f} s of CPU > the bound {cpu_bound:.3f} s")
    if raw_len >= TRACE_RAW_BYTES or zlib.crc32(data) % 8 == 0:
        peak = _TRACER.peak(body, limits)
        bound = decode_cost_bound(len(body), raw_len, count, decoded)
        stats["traced"] += 1
        stats["peak_bytes"] = max(stats["peak_bytes"], peak)
        stats["peak_over_bound"] = max(stats["peak_over_bound"], peak / bound)
        if peak > bound:
            raise AssertionError(f"decoding allocated {peak} bytes > the bound {bound}")
    if isinstance(out, Batch):
        _check_batch(out, limits)


def _check_batch(batch: Batch, limits: Limits) -> None:
    """A batch taken obeys the format's rules and comes back the same when encoded."""
    assert 1 <= batch.first_available <= batch.first_seq, batch.first_available
    assert batch.decoded_size <= limits.max_decompressed_bytes, batch.decoded_size
    assert batch.count <= limits.max_records, batch.count
    for i, r in enumerate(batch.records):
        assert r.seq == batch.first_seq + i, (i, r.seq)
        assert type(r.key) is str and type(r.topic) is str and type(r.payload) is bytes, r
        assert type(r.ts_ms) is int and I64_MIN <= r.ts_ms <= I64_MAX, r.ts_ms
        assert record_bytes(r.key, r.payload, r.topic) <= MAX_RECORD_BYTES, r.seq
    again = decode_batch(encode_batch(batch, level=1), _UNCAPPED)
    assert again.records == batch.records, "the batch does not come back through encode_batch"
    assert (again.origin, again.stream, again.first_available) == (
        batch.origin,
        batch.stream,
        batch.first_available,
    )


def _forms(batch: Batch, key: ShipKey | None = None) -> list[bytes]:
    """The three inputs (modes 0, 1 and 2) that stand for ``batch``."""
    data = encode_batch(batch, key=key)
    body = encode_body(
        batch.records,
        first_available=batch.first_available,
        signer=None if key is None else (key, batch.origin, batch.stream),
    )
    raw = zstandard.ZstdDecompressor().decompress(body.data)
    head = bytes((body.flags,)) + (body.count - 1).to_bytes(2, "little") + body.signatures
    return [b"\x00" + data, b"\x01" + data, b"\x02" + head + raw]


def seeds() -> list[bytes]:
    """Real bodies: container telemetry and positions as the edge agent sends them, AIS
    sentences (fleet_sim's sample, as fields, among other payloads), plain payloads,
    names and keys of every kind, a signed batch, and small versions of the hostile
    bodies of tests/wire_bombs.py."""
    rng = random.Random(40)
    t0 = 1_767_225_600_000
    boxes = fleet(rng, 12)
    telemetry = [
        WireRecord(
            i + 1, c.id, t0 + i * 5000, c.topic(ORIGIN), c.reading(rng, t0 + i * 5000, style)
        )
        for i, (c, style) in enumerate(
            (c, style) for style in ("compact", "python") for c in boxes for _ in range(3)
        )
    ]
    nav = [
        WireRecord(
            i + 1,
            "position",
            t0 + i * 10_000,
            f"{ORIGIN}/nav/position",
            b'{"lat":%.6f,"lon":%.6f,"sog":%.1f,"hdg":%d}'
            % (35.28 - i / 1e3, 139.81 - i / 7e3, 18.2, (211 + i) % 360),
        )
        for i in range(20)
    ]
    binary = [
        WireRecord(7 + i, f"k{i % 3}", t0 - i, f"a/b/{i}", rng.randbytes(rng.randint(0, 40)))
        for i in range(10)
    ]
    odd = [
        WireRecord(1, "", 0, "", b""),
        WireRecord(2, "\u00e9\u2028\x00", I64_MIN, "\ud7ff/\U0001f6a2", b"-0.0 1e5 007 -12.50"),
        WireRecord(3, "k", I64_MAX, "t/" + "x" * 50, b"1.5,2.25,-3,4.000001"),
    ]
    sentences = AIS_SAMPLE.read_bytes().splitlines(keepends=True)
    ais = [
        WireRecord(i + 1, "ais", t0 + i * 3000, f"{ORIGIN}/ship1/nav/ais", p)
        for i, p in enumerate([*sentences[:14], b"".join(sentences[14:17]), b"!AIVDM,1,1"])
    ]
    key = ShipKey(Ed25519PrivateKey.from_private_bytes(bytes(range(32))))
    out: list[bytes] = []
    out += _forms(Batch(ORIGIN, STREAM, tuple(telemetry)))
    out += _forms(Batch(ORIGIN, "nav", tuple(nav), first_available=1))
    out += _forms(Batch(ORIGIN, STREAM, tuple(binary), first_available=3))
    out += _forms(Batch(ORIGIN, STREAM, tuple(odd)))
    out += _forms(Batch(ORIGIN, "nav", tuple(ais)))
    out += _forms(Batch(ORIGIN, STREAM, tuple(telemetry[:5])), key)
    for raw, n in (
        (wire_bombs.number_columns(4, 40), 40),
        (wire_bombs.number_columns(16, 60), 60),  # past the small limits' budget
        (wire_bombs.many_templates(12, 3), 12),
        (wire_bombs.many_templates(6, 2, text=True), 6),
        (wire_bombs.segment_lengths(30), 1),
        (wire_bombs.templated(24, 3, [2, 0, 3], [(0, 0, 1, b"\x01"), (1, 1, 2, b"\xff")]), 24),
        (wire_bombs.templated(9, 2, [1], [(2, 0, 1, b"")]), 9),
    ):
        out.append(b"\x02\x01" + (n - 1).to_bytes(2, "little") + raw)
        out.append(b"\x00" + wire_bombs.batch(raw, n))
    raw = wire_bombs.ais_sentences(30, 4)
    out.append(b"\x02\x08" + (30 - 1).to_bytes(2, "little") + raw)
    out.append(b"\x00" + wire_bombs.batch(raw, 30, flags=FLAG_AIS))
    return out + [bytes((d[0] + 3,)) + d[1:] for d in out if len(d) <= 8192]  # small limits


if __name__ == "__main__":
    _serve()
