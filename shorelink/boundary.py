"""Where bytes or text from outside enter: a mark on each function that takes them.

A boundary function is one that reads what another party wrote: an MQTT topic and
payload, an upload body, a neighbour's records, ledger entries, link reports and relay
index, a config or keys file, the operations page's requests, a value written to a log.
Each is held to a promise over the whole input space: it returns, or raises its
documented error, within its documented memory and CPU bound, and never hangs.
``docs/boundaries.md`` lists each one with its error, its bound and the property test
that holds it; ``tests/test_boundaries.py`` fails when a marked function has no row,
when a row names a function that is not marked, and when a route handler, an MQTT
callback or a parser of outside text is neither marked nor explained.

The mark does nothing at run time but note the function's name (:data:`MARKED`): the
tests read the marks from the source.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

__all__ = ["MARKED", "boundary"]

F = TypeVar("F", bound=Callable[..., object])

#: ``module:qualname`` of every marked function imported so far
MARKED: set[str] = set()


def boundary(fn: F) -> F:
    """Mark ``fn`` as taking outside input (see the module's docstring); returns it."""
    MARKED.add(f"{fn.__module__}:{fn.__qualname__}")
    return fn
