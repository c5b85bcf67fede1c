"""Decoding batches away from the gateway's event loop and its Kafka writer.

Decoding is the gateway's largest cost per record (about 2 µs; rendering payloads from
the columnar body), and it holds the GIL. In a thread it competes with the writer
thread that produces to Kafka and with the event loop: with 700 ships uploading at once
(bench/fleet.py) the loop waited 0.7-2.5 s for the GIL between two turns, and every
answer, an alert's too, waited with it. So with ``decode_workers >= 1`` (the default is
1) every batch is decoded in worker processes, which hand back plain columns (keys,
times, topics, payloads: pickled in milliseconds, far cheaper than the decode); the
gateway process only rebuilds the records. Measured at 700 ships, decoding in threads
against in workers: the loop's turns 0.7-2.5 s against 0.1-0.5 s, an alert's answer
p99 7.5 s against 0.9 s.

Three lanes, so that nothing waits behind what it should not:
- a batch whose bytes and decompressed bytes pass :data:`PROCESS_DECODE_BYTES` goes to
  the large batches' workers: one that decompresses to 64 MiB takes a second or more
  (``decode_cost_bound`` in :mod:`shorelink.wire`), and holds up only its own kind;
- every other batch to the small batches' workers;
- a small batch of an urgent stream (``urgent``: alerts) to a thread of its own, at
  once, however many bulk batches wait for the workers.
``decode_workers = 0`` decodes in threads of the gateway (one process).

No batch is decoded on the event loop: what a batch costs to decode is bounded by its
bytes and decompressed bytes, not by its size on the wire (a few hundred bytes can
decompress to 64 MiB), so its lane is chosen on both.

A worker that dies is replaced; the batch it was decoding is decoded again in a thread,
so no request fails for it. Where no worker can be started (no writable /dev/shm, a
process limit, workers that die again and again) the gateway logs it once and decodes in
threads from then on (shorelink/workers.py).

A ship with a key (shorelink/proof.py) is proved in the same step: its chunks'
signatures checked and each record's ``sl.proof`` made beside the decode, in the worker
or the thread, never on the event loop (about 3 µs a record more: a hash per record,
an Ed25519 check per 32 records and the proofs' bytes).

Batches compressed with a dictionary (shorelink/wire_dict.py) decode with the gateway's
``dictionaries_dir``, read at start by the gateway and by each worker as it starts (a
dictionary is not sent with every batch). A batch naming one the gateway lacks makes it
read the directory again (at most every :data:`RESCAN_EVERY_S`: a dictionary copied
there, by hand or by the fleet registry, is taken without a restart); still lacking, the
batch is refused from its header (``unknown_dictionary``) before it is handed on. A
dictionary that came after the workers started is decoded in a thread.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from shorelink.errors import ConfigError
from shorelink.logs import get_logger
from shorelink.proof import ShipKeys, SignatureError
from shorelink.wire import (
    Batch,
    Header,
    Limits,
    WireError,
    decode_columns,
    dictionary_of,
    peek_header,
)
from shorelink.wire_dict import Dictionaries
from shorelink.workers import WorkerDied, WorkerPool, WorkersUnavailable

__all__ = ["PROCESS_DECODE_BYTES", "RESCAN_EVERY_S", "BatchDecoder"]

log = get_logger(__name__)

#: batches whose bytes and decompressed bytes together pass this are large: decoded by
#: the large batches' workers (or, without one, a thread); the rest by the small
#: batches' workers, or, of an urgent stream, by the urgent thread
PROCESS_DECODE_BYTES = 64 * 1024
#: a batch naming a dictionary the gateway lacks makes it read ``dictionaries_dir``
#: again, at most this often (seconds)
RESCAN_EVERY_S = 10.0

_Columns = tuple[Any, ...]
#: what a worker needs of the ship keys for one batch: whether keys are required, and
#: the batch's ship's entry if it has a key (its keys, previous ones included: a
#: ShipKeys does not cross processes)
KeySpec = tuple[bool, dict[str, object]]

#: a worker's dictionaries, loaded when it starts (_load_dictionaries)
_WORKER_DICTIONARIES = Dictionaries()


def _load_dictionaries(directory: Path | None) -> None:
    global _WORKER_DICTIONARIES
    _WORKER_DICTIONARIES = Dictionaries.load(directory)


def _decode_columns(
    body: bytes, limits: Limits, spec: KeySpec | None = None, held: Dictionaries | None = None
) -> _Columns:
    """In a worker or a thread: the batch as columns and its records' proofs, or
    ("error", kind, reason, message) (an exception with a custom constructor does not
    cross a process boundary intact). ``held``: the dictionaries (None: a worker's own)."""
    try:
        h, columns = decode_columns(body, limits, _WORKER_DICTIONARIES if held is None else held)
        proved = None
        if spec is not None:
            keys = ShipKeys.parse({"require_signatures": spec[0], "ships": spec[1]})
            proved = keys.prove_batch(h.origin, h.stream, h.first_seq, columns, h.signatures)
    except WireError as exc:
        return ("error", "wire", exc.reason, str(exc).removeprefix(f"{exc.reason}: "))
    except SignatureError as exc:
        return ("error", "signature", exc.reason, str(exc).removeprefix(f"{exc.reason}: "))
    batch = (h.origin, h.stream, h.first_available, h.first_seq, h.signatures, *columns)
    return ("ok", proved, *batch)


def _from_columns(cols: _Columns) -> tuple[Batch, list[bytes] | None]:
    if cols[0] == "error":
        kind, reason, message = cols[1:]
        raise WireError(reason, message) if kind == "wire" else SignatureError(reason, message)
    _, proved, origin, stream, first_available, first, sigs, *columns = cols
    return Batch.from_columns(origin, stream, first, first_available, columns, sigs), proved


class BatchDecoder:
    def __init__(
        self, limits: Limits, *, workers: int, dictionaries_dir: Path | None = None
    ) -> None:
        """``dictionaries_dir``: the batch bodies' dictionaries, loaded now (and by each
        worker as it starts)."""
        self.limits = limits
        self.dictionaries_dir = dictionaries_dir
        self.dictionaries = Dictionaries.load(dictionaries_dir)
        #: what the workers load when they start (at least: files are only added)
        self._worker_ids = frozenset(self.dictionaries.ids())
        self._rescan_at = 0.0
        #: the large batches' workers
        self.pool = self._workers("decode_workers", workers)
        #: the small batches' workers: never behind a large batch
        self.small = self._workers("decode_workers_small", workers)
        #: an urgent stream's small batches (alerts): never behind bulk
        self._urgent = ThreadPoolExecutor(1, thread_name_prefix="decode-urgent")

    def _workers(self, name: str, workers: int) -> WorkerPool:
        return WorkerPool(
            name, workers, initializer=_load_dictionaries, initargs=(self.dictionaries_dir,)
        )

    async def decode(self, body: bytes) -> Batch:
        """Decode and check ``body`` (raises :class:`WireError` as ``decode_batch``), off
        the event loop."""
        return (await self.decode_proved(body, None))[0]

    async def decode_proved(
        self, body: bytes, keys: ShipKeys | None, *, urgent: bool = False
    ) -> tuple[Batch, list[bytes] | None]:
        """:meth:`decode`, and with ``keys`` the records' proofs (None for a ship
        without a key); raises :class:`SignatureError` when the ship's key does not
        prove the batch. ``urgent``: the batch is of an urgent stream."""
        header = peek_header(body, self.limits)
        await self._holds(header)  # one it lacks: refused before handing on
        spec: KeySpec | None = None
        if keys is not None:
            spec = (keys.require_signatures, keys.entries([header.origin]))
        large = len(body) + header.raw_len > PROCESS_DECODE_BYTES
        if urgent and not large:
            return _from_columns(await self._in_thread(self._urgent, body, spec))
        pool = self.pool if large else self.small
        if pool.workers and header.dict_id in self._worker_ids | {0}:
            try:
                return _from_columns(await pool.run(_decode_columns, body, self.limits, spec))
            except (WorkerDied, WorkersUnavailable):
                pass  # (logged by the pool) this batch, at least, in a thread
        return _from_columns(await self._in_thread(None, body, spec))

    async def _in_thread(
        self, pool: ThreadPoolExecutor | None, body: bytes, spec: KeySpec | None
    ) -> _Columns:
        """Decode in ``pool``'s thread (None: the event loop's default threads), with
        the dictionaries the gateway holds now."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            pool, _decode_columns, body, self.limits, spec, self.dictionaries
        )

    async def _holds(self, header: Header) -> None:
        """Raise ``unknown_dictionary`` unless the gateway holds the dictionary the
        batch names, after reading its directory again if it has not lately."""
        try:
            dictionary_of(header, self.dictionaries)
            return
        except WireError:
            now = time.monotonic()
            if self.dictionaries_dir is None or now < self._rescan_at:
                raise
            self._rescan_at = now + RESCAN_EVERY_S
        try:
            found = await asyncio.to_thread(
                Dictionaries.load, self.dictionaries_dir, "dictionaries_dir"
            )
        except ConfigError as exc:
            log.warning("dictionaries_unreadable", error=str(exc))
        else:
            if found.ids() != self.dictionaries.ids():
                log.info("dictionaries_loaded", ids=",".join(map(str, found.ids())))
                self.dictionaries = found
        dictionary_of(header, self.dictionaries)

    def pids(self) -> list[int]:
        """The worker processes now (none before the first batch that needs one)."""
        return sorted(self.pool.pids() + self.small.pids())

    def close(self) -> None:
        self.pool.close()
        self.small.close()
        self._urgent.shutdown(wait=False, cancel_futures=True)
