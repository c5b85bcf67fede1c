"""Decoding large batches away from the gateway's event loop and its Kafka writer.

Decoding is the gateway's largest cost per record (about 2 µs; rendering payloads from
the columnar body), and it holds the GIL: in a thread it competes with the writer
thread that produces the previous batch to Kafka, so the two together are bounded by
one core (bench/uplink.py measured about 123,000 records/s on a loaded 2-core machine,
below what one ship's 2 Mbit/s link delivers). With ``decode_workers >= 1`` (the
default is 1) batches above :data:`PROCESS_DECODE_BYTES` are decoded in worker
processes, which hand back plain columns (keys, times, topics, payloads: pickled in
milliseconds, far cheaper than the decode); the gateway process only rebuilds the
records. ``decode_workers = 0`` decodes in a thread of the gateway (one process).

A worker that dies is replaced; the batch it was decoding is decoded again in a thread,
so no request fails for it. Where no worker can be started (no writable /dev/shm, a
process limit, workers that die at start :data:`MAX_BROKEN` times in a row) the gateway
logs it once and decodes in threads from then on.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from shorelink.wire import Batch, Limits, WireError, WireRecord, decode_batch

__all__ = ["PROCESS_DECODE_BYTES", "BatchDecoder"]

log = logging.getLogger(__name__)

#: batches at least this large go to a worker process (smaller ones decode in a thread:
#: the hand-over would cost more than it saves)
PROCESS_DECODE_BYTES = 64 * 1024

#: worker pools broken in a row (no batch decoded by a worker in between) before the
#: gateway gives up on worker processes
MAX_BROKEN = 3

_Columns = tuple[Any, ...]


def _decode_columns(body: bytes, limits: Limits) -> _Columns:
    """In a worker: the batch as columns, or ("error", reason, message) (an exception
    with a custom constructor does not cross a process boundary intact)."""
    try:
        batch = decode_batch(body, limits)
    except WireError as exc:
        return ("error", exc.reason, str(exc).removeprefix(f"{exc.reason}: "))
    _seqs, keys, times, topics, payloads = zip(*batch.records, strict=True)
    return (
        "ok",
        batch.origin,
        batch.stream,
        batch.first_available,
        batch.first_seq,
        keys,
        times,
        topics,
        payloads,
    )


def _from_columns(cols: _Columns) -> Batch:
    if cols[0] == "error":
        raise WireError(cols[1], cols[2])
    _, origin, stream, first_available, first, keys, times, topics, payloads = cols
    seqs = range(first, first + len(keys))
    return Batch(
        origin, stream, tuple(map(WireRecord, seqs, keys, times, topics, payloads)), first_available
    )


class BatchDecoder:
    def __init__(self, limits: Limits, *, workers: int) -> None:
        self.limits = limits
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None
        self._broken = 0

    async def decode(self, body: bytes) -> Batch:
        """Decode and check ``body`` (raises :class:`WireError` as ``decode_batch``)."""
        if not self.workers or len(body) < PROCESS_DECODE_BYTES:
            return await asyncio.to_thread(decode_batch, body, self.limits)
        try:
            pool = self._pool_now()
            done = asyncio.get_running_loop().run_in_executor(
                pool, _decode_columns, body, self.limits
            )
            cols = await done
            self._broken = 0
            return _from_columns(cols)
        except OSError as exc:
            self._give_up(exc)
        except BrokenProcessPool as exc:
            self._drop_pool()
            self._broken += 1
            if self._broken >= MAX_BROKEN:
                self._give_up(exc)
            else:
                log.error("event=decode_worker_died error=%r", str(exc))
        return await asyncio.to_thread(decode_batch, body, self.limits)

    def _give_up(self, exc: Exception) -> None:
        log.error("event=decode_workers_unavailable fallback=thread error=%r", str(exc))
        self._drop_pool()
        self.workers = 0

    def _pool_now(self) -> ProcessPoolExecutor:
        if self._pool is None:
            # spawn, not fork: the gateway has threads (the Kafka writer, librdkafka's)
            self._pool = ProcessPoolExecutor(
                max_workers=self.workers, mp_context=multiprocessing.get_context("spawn")
            )
        return self._pool

    def _drop_pool(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def pids(self) -> list[int]:
        """The worker processes now (none before the first large batch)."""
        procs = getattr(self._pool, "_processes", None) or {}
        return sorted(procs)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
