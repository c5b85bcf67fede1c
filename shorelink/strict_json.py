"""JSON that came from outside (a sensor's payload, a ship's report, a record a
neighbour relayed), read and written as every other JSON reader will read it.

Python's :mod:`json` is lenient where a browser's ``JSON.parse``, ``jq`` and Spark are
not: it reads ``NaN``, ``Infinity`` and ``1e999`` (as a float that is no number) and
writes them back as bare tokens no one else parses, and it raises ``RecursionError``
(not ``ValueError``) on nesting deeper than the interpreter's recursion limit. Here
every one of those is a :class:`ValueError`, the one error a reader of hostile input
catches: :func:`loads` returns only what :func:`dumps` (and any strict JSON reader)
accepts, and :func:`dumps` never writes a token that is not JSON.
"""

from __future__ import annotations

import json
import math
from typing import Any

from shorelink.boundary import boundary

__all__ = ["dumps", "finite", "loads"]


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:20]} is beyond a double")
    return value


@boundary
def loads(data: str | bytes) -> Any:
    """The JSON value of ``data``; ValueError for anything but strict JSON (RFC 8259):
    ``NaN``/``Infinity``, numbers beyond a double, nesting deeper than the parser can
    follow, invalid UTF-8, integers beyond Python's ``int_max_str_digits``."""
    try:
        return json.loads(data, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError:
        raise ValueError("JSON nested deeper than the parser follows") from None


def finite(obj: Any) -> Any:
    """``obj`` with every float that is no finite number replaced by None (a value
    computed here, or read by a lenient parser, that is about to be written)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite(v) for v in obj]
    return obj


def dumps(obj: Any) -> str:
    """Compact JSON that every strict reader accepts: a float that is no number is
    written as ``null``."""
    try:
        return json.dumps(obj, separators=(",", ":"), allow_nan=False)
    except ValueError:  # the rare case: look for the culprits only then
        return json.dumps(finite(obj), separators=(",", ":"), allow_nan=False)
