"""shorelink.retry: the one retry policy (tenacity underneath) that every service's
retry loop and back-off uses."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shorelink.retry import Backoff, retry_fields, retrying


class Refused(Exception):
    pass


class Broken(Exception):
    pass


@given(
    first=st.floats(0.001, 10),
    growth=st.floats(1, 4),
    spread=st.floats(1, 1000),
    jitter=st.floats(0, 5),
    failures=st.integers(-5, 10_000),
)
def test_a_delay_grows_from_the_first_wait_and_never_passes_the_cap(
    first: float, growth: float, spread: float, jitter: float, failures: int
) -> None:
    """Whatever the count (10,000 failures in a row overflow the exponent), the wait is
    at least the first one and at most the cap; without jitter it is the formula."""
    b = Backoff(first, first * spread, growth, jitter)
    delay = b.delay(failures)
    assert first <= delay <= b.cap_s
    if jitter == 0 and failures < 50:
        assert delay == pytest.approx(min(b.cap_s, first * growth ** (max(1, failures) - 1)))


@pytest.mark.parametrize(
    "args",
    [(0.0, 1.0), (-1.0, 1.0), (2.0, 1.0), (1.0, 2.0, 0.5), (1.0, 2.0, 2.0, -1.0)],
)
def test_a_backoff_that_would_spin_or_shrink_is_refused(args: tuple[float, ...]) -> None:
    with pytest.raises(ValueError, match="not a backoff"):
        Backoff(*args)


async def test_a_call_is_retried_until_it_succeeds_with_growing_waits() -> None:
    calls, waits = 0, []

    def seen(state: object) -> None:
        waits.append(retry_fields(state)["retry_in"])  # type: ignore[arg-type]

    async for attempt in retrying(
        Backoff(0.001, 0.004), retry_on=lambda e: isinstance(e, Broken), on_retry=seen
    ):
        with attempt:
            calls += 1
            if calls < 5:
                raise Broken(f"try {calls}")
    assert calls == 5
    assert waits == ["0.0s"] * 4  # logged as the waits were: 1, 2, 4, 4 ms


async def test_an_error_the_policy_refuses_is_raised_at_once() -> None:
    calls = 0
    with pytest.raises(Refused):
        async for attempt in retrying(
            Backoff(0.001, 0.01), retry_on=lambda e: isinstance(e, Broken)
        ):
            with attempt:
                calls += 1
                raise Refused("credentials")
    assert calls == 1


async def test_a_stop_cuts_the_wait_short_and_raises_the_last_error() -> None:
    """A retry waiting out a long back-off ends as soon as it is asked to stop."""
    stop, waiting = asyncio.Event(), asyncio.Event()
    calls = 0

    async def retry_for_good() -> None:
        nonlocal calls
        async for attempt in retrying(
            Backoff(3600, 3600),
            retry_on=lambda e: isinstance(e, Broken),
            stop=stop,
            on_retry=lambda _state: waiting.set(),
        ):
            with attempt:
                calls += 1
                raise Broken("Kafka away")

    task = asyncio.create_task(retry_for_good())
    await asyncio.wait_for(waiting.wait(), 5)
    stop.set()
    with pytest.raises(Broken):
        await asyncio.wait_for(task, 5)
    assert calls == 1  # not one more attempt after the stop


async def test_progress_restarts_the_count() -> None:
    """A pass that got something through before it failed waits the first wait again,
    not one that kept growing over earlier, unrelated failures."""
    progress, waits = [0], []

    def seen(state: object) -> None:
        waits.append(state.next_action.sleep)  # type: ignore[attr-defined]

    async for attempt in retrying(
        Backoff(0.001, 1.0),
        retry_on=lambda e: isinstance(e, Broken),
        on_retry=seen,
        progress=lambda: progress[0],
    ):
        with attempt:
            n = attempt.retry_state.attempt_number
            if n == 4:
                progress[0] += 1  # the fourth pass got batches through, then failed
            if n < 6:
                raise Broken("link dropped")
    assert waits == pytest.approx([0.001, 0.002, 0.004, 0.001, 0.002])


async def test_a_cancelled_retry_ends_even_when_every_error_is_retried() -> None:
    """tenacity hands a cancellation to the retry predicate like any error: a loop whose
    predicate retries everything (the agent's isolated commits, the gateway's producer
    recovery) would have gone on after its task was cancelled."""
    attempts = 0
    started = asyncio.Event()

    async def forever() -> None:
        nonlocal attempts
        async for attempt in retrying(Backoff(0.001, 0.001), retry_on=lambda _e: True):
            with attempt:
                attempts += 1
                started.set()
                await asyncio.sleep(3600)

    task = asyncio.create_task(forever())
    await asyncio.wait_for(started.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    assert attempts == 1
