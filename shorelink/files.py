"""Files replaced whole: a reader sees the old content or the new, never half of it.

Status files, positions and ``stack.json`` are read by other processes while their
writer runs and must survive a crash mid-write, so each is written to a temporary name,
fsynced, then renamed over the old one (one place, so no writer forgets the fsync).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["write_json_atomic"]


def write_json_atomic(
    path: Path,
    obj: Any,
    *,
    indent: int | None = None,
    sort_keys: bool = False,
    newline: bool = False,
) -> None:
    """Write ``obj`` as JSON to ``path`` via ``<name>.tmp``, fsynced, then renamed.

    The JSON is encoded before anything is written, so an object that cannot be
    serialised leaves the old file (and no temporary file) behind."""
    text = json.dumps(obj, indent=indent, sort_keys=sort_keys) + ("\n" if newline else "")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
