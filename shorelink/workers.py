"""Worker processes for CPU-heavy pure functions, with a thread as the way out.

The edge agent builds and seals batches, and the gateway decodes them, in child
processes: that work holds the GIL for hundreds of milliseconds a batch, which in a
thread would starve the MQTT ingest (ship) or the Kafka writer (shore). Both need the
same care, kept here:

- processes are started with ``spawn`` (both programs have threads a fork would copy)
  and only when first needed;
- a worker that dies (killed, out of memory) raises :class:`WorkerDied` for the call it
  was running; the next call starts a new one;
- where no worker can be started (no writable /dev/shm, a process limit, workers that
  die :data:`MAX_BROKEN` times in a row without finishing a call) the pool logs it once,
  sets ``workers`` to 0 and raises :class:`WorkersUnavailable`: the caller does the work
  in a thread from then on rather than never.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from shorelink.errors import ShorelinkError
from shorelink.logs import get_logger

__all__ = ["MAX_BROKEN", "WorkerDied", "WorkerPool", "WorkersUnavailable"]

log = get_logger(__name__)

#: pools broken in a row (no call finished by a worker in between) before giving up
MAX_BROKEN = 3

_T = TypeVar("_T")


class WorkerDied(ShorelinkError):
    """The worker running the call died; the next call starts a new one."""

    retryable = True


class WorkersUnavailable(ShorelinkError):
    """No worker process can be started here; ``workers`` is now 0 (use a thread)."""


class WorkerPool:
    def __init__(
        self,
        name: str,
        workers: int,
        *,
        initializer: Callable[..., None] | None = None,
        initargs: tuple[Any, ...] = (),
    ) -> None:
        """``name`` is the ``pool`` of the log events (``event=worker_died``,
        ``event=workers_unavailable``); ``workers`` 0 means: no processes (callers use a
        thread)."""
        self.name = name
        self.workers = workers
        self._initializer = initializer
        self._initargs = initargs
        self._pool: ProcessPoolExecutor | None = None
        self._broken = 0

    async def run(self, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)`` in a worker process (``fn`` and ``args`` must pickle)."""
        if not self.workers:
            raise WorkersUnavailable(f"{self.name}: no worker processes")
        try:
            done = asyncio.get_running_loop().run_in_executor(self._pool_now(), fn, *args)
        except OSError as exc:
            raise self._give_up(exc) from exc
        except BrokenProcessPool as exc:  # (at submit: the worker died while idle)
            raise self._died(exc) from exc
        try:
            result = await done
        except BrokenProcessPool as exc:
            raise self._died(exc) from exc
        self._broken = 0
        return result

    def _died(self, exc: BrokenProcessPool) -> Exception:
        self._drop()
        self._broken += 1
        if self._broken >= MAX_BROKEN:
            return self._give_up(exc)
        log.error("worker_died", pool=self.name, error=str(exc))
        return WorkerDied(f"{self.name}: the worker process died: {exc}")

    def _give_up(self, exc: Exception) -> WorkersUnavailable:
        log.error("workers_unavailable", pool=self.name, fallback="thread", error=str(exc))
        self._drop()
        self.workers = 0
        return WorkersUnavailable(f"{self.name}: no worker process can be started: {exc}")

    def _pool_now(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                max_workers=self.workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=self._initializer,
                initargs=self._initargs,
            )
        return self._pool

    def _drop(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def pids(self) -> list[int]:
        """The worker processes now (none before the first call)."""
        procs = getattr(self._pool, "_processes", None) or {}
        return sorted(procs)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
