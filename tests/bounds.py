"""What a boundary function may cost, measured (docs/boundaries.md): every property
test of a boundary calls it through :func:`within`, which returns what the function
returned or the documented error it raised, lets any other exception through (the
test fails on it), and fails when the call's tracemalloc peak or its process time
passed the row's bound."""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, settings

KIB = 1024
MIB = 1024 * 1024

#: a boundary's property test: examples and a deadline per example that keep the suite fast
FAST = settings(max_examples=80, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
#: the same for a boundary that reads a file (a ``tmp_path`` shared by the examples)
FILES = settings(
    max_examples=30,
    deadline=3000,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@dataclass(frozen=True)
class Bound:
    """At most ``per_byte * n + fixed_bytes`` of memory (tracemalloc's peak) and
    ``cpu_s + cpu_per_mib * n / MiB`` seconds of process time for an input of ``n``
    bytes. CPU bounds are generous (tracemalloc slows Python down about threefold, and
    other threads of the test process count): they catch the quadratic and the
    unbounded, not a slow machine."""

    fixed_bytes: int
    per_byte: float = 0.0
    cpu_s: float = 1.0
    cpu_per_mib: float = 0.0

    def memory(self, n: int) -> int:
        return int(self.fixed_bytes + self.per_byte * n)

    def cpu(self, n: int) -> float:
        return self.cpu_s + self.cpu_per_mib * n / MIB


@dataclass
class Measure:
    """What a block cost: tracemalloc's peak above where it started, process time."""

    peak: int = 0
    cpu_s: float = 0.0


@contextmanager
def measured() -> Iterator[Measure]:
    """Measure the block (the one way every boundary test measures)."""
    m = Measure()
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    t0 = time.process_time()
    try:
        yield m
    finally:
        m.cpu_s = time.process_time() - t0
        m.peak = tracemalloc.get_traced_memory()[1] - base
        if not was_tracing:
            tracemalloc.stop()


def within(
    bound: Bound,
    errors: tuple[type[BaseException], ...],
    fn: Callable[..., Any],
    *args: Any,
    size: int | None = None,
    **kwargs: Any,
) -> Any:
    """``fn(*args, **kwargs)``'s result, or the instance of ``errors`` it raised, once
    its memory peak and its process time are within ``bound`` for an input of ``size``
    bytes (default: the length of the first argument, 0 where it has none)."""
    if size is None:
        size = _size(args[0]) if args else 0
    with measured() as m:
        try:
            result: Any = fn(*args, **kwargs)
        except errors as exc:
            result = exc
    name = getattr(fn, "__qualname__", repr(fn))
    assert m.peak <= bound.memory(size), (
        f"{name}: peak {m.peak} bytes > bound {bound.memory(size)} for {size} bytes of input"
    )
    assert m.cpu_s <= bound.cpu(size), f"{name}: {m.cpu_s:.3f} s > bound {bound.cpu(size):.3f} s"
    return result


def _size(arg: object) -> int:
    if isinstance(arg, str):  # in bytes, as the rows count it
        return len(arg.encode("utf-8", "surrogatepass"))
    try:
        return len(arg)  # type: ignore[arg-type]
    except TypeError:
        return 0
