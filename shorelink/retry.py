"""Retry as a policy, written once, on tenacity.

:class:`Backoff` says how long to wait after the n-th failure in a row: exponential from
``first_s``, times ``growth`` per failure, plus up to ``jitter_s`` of random jitter,
capped at ``cap_s`` (tenacity's ``wait_exponential`` plus ``wait_random``). A loop that retries one
call until it succeeds uses :func:`retrying` (tenacity's ``AsyncRetrying`` with a sleep
that a stop event cuts short); a loop that runs for good and only waits after a failed
turn (a puller, a query supervisor) asks :meth:`Backoff.delay` for the same waits.

Where a call can make progress before it fails (an upload pass that got batches through
before its link dropped), ``progress`` restarts the count: the wait after a failure that
followed progress is the first one again, so a link that drops for two seconds now and
then is not answered with ever longer waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    wait_exponential,
    wait_random,
)

__all__ = ["Backoff", "retry_fields", "retrying"]


@dataclass(frozen=True)
class Backoff:
    """The waits after failures in a row: ``first_s * growth**(n-1)`` plus up to
    ``jitter_s`` at random, capped at ``cap_s``."""

    first_s: float
    cap_s: float
    growth: float = 2.0
    jitter_s: float = 0.0

    def __post_init__(self) -> None:
        if not 0 < self.first_s <= self.cap_s or self.growth < 1 or self.jitter_s < 0:
            raise ValueError(f"not a backoff: {self}")

    def _strategy(self) -> Callable[[RetryCallState], float]:
        grow = wait_exponential(multiplier=self.first_s, max=self.cap_s, exp_base=self.growth)
        jitter = wait_random(0, self.jitter_s)
        return lambda state: min(self.cap_s, grow(state) + jitter(state))

    def delay(self, failures: int) -> float:
        """The wait after ``failures`` failures in a row (1: the first)."""
        state = RetryCallState(None, None, (), {})  # type: ignore[arg-type]
        state.attempt_number = max(1, failures)
        return float(self._strategy()(state))

    def wait(
        self, progress: Callable[[], object] | None = None
    ) -> Callable[[RetryCallState], float]:
        """tenacity's ``wait`` for this policy. With ``progress``, the count starts
        again at the first failure after ``progress()`` changed."""
        strategy = self._strategy()
        if progress is None:
            return strategy
        first, mark = 1, progress()

        def wait(state: RetryCallState) -> float:
            nonlocal first, mark
            now = progress()
            if now != mark:
                first, mark = state.attempt_number, now
            return self.delay(state.attempt_number - first + 1)

        return wait


def retrying(
    backoff: Backoff,
    *,
    retry_on: Callable[[BaseException], bool],
    stop: asyncio.Event | threading.Event | None = None,
    on_retry: Callable[[RetryCallState], None] | None = None,
    progress: Callable[[], object] | None = None,
) -> AsyncRetrying:
    """Retry the attempts of an ``async for attempt in retrying(...): with attempt:``
    loop while the error is one ``retry_on`` accepts, waiting as ``backoff`` says (cut
    short by ``stop``), until one succeeds; ``on_retry`` is called before each wait
    (log it there, with :func:`retry_fields`). Once ``stop`` is set, the last error is
    raised instead of retried, also when it is set during a wait (without ``stop``:
    retried until cancelled); an error ``retry_on`` refuses is raised at once, and so
    is anything not an :class:`Exception` (a cancellation: tenacity would hand it to
    ``retry_on``). An :class:`asyncio.Event` also cuts the wait short; a
    :class:`threading.Event` (set from another thread) is seen after it."""

    failed: list[BaseException] = []  # the error the wait follows

    def before_sleep(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        failed[:] = [exc] if exc is not None else []
        if on_retry is not None:
            on_retry(state)

    async def sleep(seconds: float) -> None:
        if not isinstance(stop, asyncio.Event):
            await asyncio.sleep(seconds)
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), seconds)
        if stop is not None and stop.is_set() and failed:
            raise failed[0]  # asked to stop while waiting: not one more attempt

    return AsyncRetrying(
        # tenacity hands every BaseException to the predicate: a cancellation (or an
        # exit) is never retried, whatever ``retry_on`` says
        retry=retry_if_exception(lambda e: isinstance(e, Exception) and retry_on(e)),
        wait=backoff.wait(progress),
        stop=lambda _state: stop is not None and stop.is_set(),
        sleep=sleep,
        before_sleep=before_sleep,
        reraise=True,
    )


def retry_fields(state: RetryCallState) -> dict[str, object]:
    """What a log line says of a retry about to wait: the attempt that failed, its
    error and the wait."""
    exc = state.outcome.exception() if state.outcome else None
    wait = state.next_action.sleep if state.next_action else 0.0
    return {"attempt": state.attempt_number, "retry_in": f"{wait:.1f}s", "error": str(exc)}
