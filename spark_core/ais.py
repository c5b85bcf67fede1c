"""Positions from nav records: AIS NMEA (``!AIVDM``/``!AIVDO``, decoded with pyais) or
JSON with ``lat``/``lon``. Pure Python, no Spark: ``spark_core.tables`` calls it on the
driver for each micro-batch of ``sl.nav``.

Multi-part AIS messages arrive as records of one origin (one sentence per record), in
seq order but possibly interleaved with other sentences (see ``assemble``). A message
is decoded in the batch that brings its last fragment; fragments of earlier batches come
from the fragment store (``lookup``) that the table writer keeps.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pyais import decode as ais_decode

from shorelink import strict_json
from shorelink.boundary import boundary

__all__ = ["WINDOW", "Fragment", "NavRecord", "Position", "assemble", "decode_nav", "fragment_info"]


@dataclass(frozen=True, slots=True)
class NavRecord:
    origin: str
    seq: int
    ts_ms: int
    payload: str


@dataclass(frozen=True, slots=True)
class Position:
    origin: str
    seq: int
    ts_ms: int
    mmsi: int | None
    lat: float
    lon: float
    sog: float | None
    cog: float | None
    heading: float | None


@dataclass(frozen=True, slots=True)
class Fragment:
    count: int
    number: int
    msg_id: str


def fragment_info(payload: str) -> Fragment | None:
    """``(count, number, sequential id)`` of an AIVDM/AIVDO sentence, else None."""
    text = payload.strip()
    if not (text.startswith("!AIVDM") or text.startswith("!AIVDO")):
        return None
    parts = text.split(",")
    if len(parts) < 7 or not parts[1].isdigit() or not parts[2].isdigit():
        return None
    return Fragment(int(parts[1]), int(parts[2]), parts[3])


#: how far (in seqs of one origin) the fragments of one message may lie apart
WINDOW = 50

Lookup = Callable[[dict[str, int]], list[NavRecord]]


def _no_store(_: dict[str, int]) -> list[NavRecord]:
    return []


def assemble(
    records: Iterable[NavRecord], lookup: Lookup = _no_store
) -> list[tuple[NavRecord, list[str]]]:
    """Every AIS message this batch completes: ``(record that carries it, sentences)``;
    for a multi-part message, the record is its last fragment.

    Per origin, in seq order, fragment 1 of ``n`` with sequential id ``m`` opens a
    message, fragments 2..n with the same ``(m, n)`` follow (other sentences may come in
    between, as receivers interleave channels; at most ``WINDOW`` seqs apart). Fragments
    of earlier batches come from ``lookup({origin: first seq of this batch})``, which
    returns that origin's stored fragments with seqs in ``[first - WINDOW, first)``."""
    by_origin: dict[str, list[NavRecord]] = {}
    for r in records:
        by_origin.setdefault(r.origin, []).append(r)
    need: dict[str, int] = {}
    for origin, rs in by_origin.items():
        for r in rs:
            f = fragment_info(r.payload)
            if f is not None and f.count > 1 and f.number > 1:
                need[origin] = min(x.seq for x in rs)
                break
    earlier: dict[str, list[NavRecord]] = {}
    for r in lookup(need) if need else []:
        earlier.setdefault(r.origin, []).append(r)
    out: list[tuple[NavRecord, list[str]]] = []
    for origin, rs in by_origin.items():
        in_batch = {r.seq for r in rs}
        seen: dict[int, NavRecord] = {r.seq: r for r in earlier.get(origin, [])}
        seen.update((r.seq, r) for r in rs)
        pending: dict[tuple[str, int], list[NavRecord]] = {}
        for seq in sorted(seen):
            r = seen[seq]
            f = fragment_info(r.payload)
            if f is None:
                continue
            if f.count <= 1:
                if seq in in_batch:
                    out.append((r, [r.payload.strip()]))
                continue
            key = (f.msg_id, f.count)
            if f.number == 1:
                pending[key] = [r]
                continue
            group = pending.get(key)
            if group is None or len(group) != f.number - 1 or seq - group[-1].seq > WINDOW:
                pending.pop(key, None)  # a fragment without its predecessors: unusable
                continue
            group.append(r)
            if f.number == f.count:
                del pending[key]
                if seq in in_batch:
                    out.append((r, [g.payload.strip() for g in group]))
    out.sort(key=lambda m: (m[0].origin, m[0].seq))
    return out


def _num(
    value: Any, invalid: float | None = None, lo: float = -math.inf, hi: float = math.inf
) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    v = float(value)
    if math.isnan(v) or v == invalid or not lo <= v <= hi:
        return None
    return v


def _position(r: NavRecord, d: dict[str, Any]) -> Position | None:
    lat = _num(d.get("lat"), 91.0, -90.0, 90.0)
    lon = _num(d.get("lon"), 181.0, -180.0, 180.0)
    if lat is None or lon is None:
        return None
    mmsi = d.get("mmsi")
    try:
        mmsi_int = int(mmsi) if mmsi is not None else None
    except (TypeError, ValueError):
        mmsi_int = None
    return Position(
        r.origin,
        r.seq,
        r.ts_ms,
        mmsi_int,
        lat,
        lon,
        _num(d.get("speed", d.get("sog")), 102.3, 0.0, 102.2),
        _num(d.get("course", d.get("cog")), 360.0, 0.0, 359.9),
        _num(d.get("heading"), 511.0, 0.0, 359.9),
    )


@boundary
def decode_nav(
    records: Iterable[NavRecord], lookup: Lookup = _no_store
) -> tuple[list[Position], int]:
    """Positions in ``records`` and the number of payloads that could not be decoded
    (broken AIS, non-JSON). AIS messages without a position (static data, ...) and JSON
    without lat/lon are neither."""
    recs = list(records)
    positions: list[Position] = []
    errors = 0
    for r, sentences in assemble(recs, lookup):
        try:
            d = ais_decode(*sentences).asdict()
        except Exception:
            errors += 1
            continue
        p = _position(r, d)
        if p is not None:
            positions.append(p)
    for r in recs:
        text = r.payload.strip()
        if not text.startswith("{"):
            continue
        try:
            d = strict_json.loads(text)
        except ValueError:  # NaN, nesting too deep too: counted, never raised
            errors += 1
            continue
        if isinstance(d, dict):
            p = _position(r, d)
            if p is not None:
                positions.append(p)
    positions.sort(key=lambda p: (p.origin, p.seq))
    return positions, errors
