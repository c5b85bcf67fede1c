"""Decoding large batches away from the gateway's event loop and its Kafka writer.

Decoding is the gateway's largest cost per record (about 2 µs; rendering payloads from
the columnar body), and it holds the GIL: in a thread it competes with the writer
thread that produces the previous batch to Kafka, so the two together are bounded by
one core (bench/gateway_ingest.py measured about 123,000 records/s on a loaded 2-core machine,
below what one ship's 2 Mbit/s link delivers). With ``decode_workers >= 1`` (the
default is 1) batches above :data:`PROCESS_DECODE_BYTES` are decoded in worker
processes, which hand back plain columns (keys, times, topics, payloads: pickled in
milliseconds, far cheaper than the decode); the gateway process only rebuilds the
records. ``decode_workers = 0`` decodes in a thread of the gateway (one process).

No batch is decoded on the event loop: what a batch costs to decode is bounded by its
bytes and decompressed bytes (``decode_cost_bound`` in :mod:`shorelink.wire`), not by
its size on the wire (a few hundred bytes can decompress to 64 MiB), so the choice
between a thread and a worker process is made on both (:data:`PROCESS_DECODE_BYTES`),
and a small batch goes to a thread, never decoded in place.

A worker that dies is replaced; the batch it was decoding is decoded again in a thread,
so no request fails for it. Where no worker can be started (no writable /dev/shm, a
process limit, workers that die again and again) the gateway logs it once and decodes in
threads from then on (shorelink/workers.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

from shorelink.wire import Batch, Limits, WireError, decode_batch, decode_columns, peek_header
from shorelink.workers import WorkerDied, WorkerPool, WorkersUnavailable

__all__ = ["PROCESS_DECODE_BYTES", "BatchDecoder"]

#: batches whose bytes and decompressed bytes together pass this are decoded in a worker
#: process (or, without one, a thread); smaller ones in a thread (a hand-over to a
#: process would cost more than it saves)
PROCESS_DECODE_BYTES = 64 * 1024

_Columns = tuple[Any, ...]


def _decode_columns(body: bytes, limits: Limits) -> _Columns:
    """In a worker: the batch as columns, or ("error", reason, message) (an exception
    with a custom constructor does not cross a process boundary intact)."""
    try:
        h, (keys, times, topics, payloads) = decode_columns(body, limits)
    except WireError as exc:
        return ("error", exc.reason, str(exc).removeprefix(f"{exc.reason}: "))
    return ("ok", h.origin, h.stream, h.first_available, h.first_seq, keys, times, topics, payloads)


def _from_columns(cols: _Columns) -> Batch:
    if cols[0] == "error":
        raise WireError(cols[1], cols[2])
    _, origin, stream, first_available, first, *columns = cols
    return Batch.from_columns(origin, stream, first, first_available, columns)


class BatchDecoder:
    def __init__(self, limits: Limits, *, workers: int) -> None:
        self.limits = limits
        self.pool = WorkerPool("decode_workers", workers)

    @property
    def workers(self) -> int:
        return self.pool.workers

    async def decode(self, body: bytes) -> Batch:
        """Decode and check ``body`` (raises :class:`WireError` as ``decode_batch``), off
        the event loop."""
        header = peek_header(body, self.limits)
        if len(body) + header.raw_len > PROCESS_DECODE_BYTES and self.pool.workers:
            try:
                return _from_columns(await self.pool.run(_decode_columns, body, self.limits))
            except (WorkerDied, WorkersUnavailable):
                pass  # (logged by the pool) this batch, at least, in a thread
        return await asyncio.to_thread(decode_batch, body, self.limits)

    def pids(self) -> list[int]:
        """The worker processes now (none before the first large batch)."""
        return self.pool.pids()

    def close(self) -> None:
        self.pool.close()
