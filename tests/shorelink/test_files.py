"""write_atomic, write_json_atomic: readers of status files, credentials and keys must
never see half a file, nor anyone else a private one."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from shorelink.files import write_atomic, write_json_atomic


def test_content_round_trips_and_no_temp_file_is_left(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "status.json"
    write_json_atomic(path, {"a": [1, 2]}, indent=1)
    assert json.loads(path.read_text()) == {"a": [1, 2]}
    assert [p.name for p in path.parent.iterdir()] == ["status.json"]


def test_an_existing_file_is_replaced_whole(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    path.write_text(json.dumps({"long": "x" * 1000}))
    write_json_atomic(path, {"b": 1})
    assert json.loads(path.read_text()) == {"b": 1}


def test_a_failed_write_leaves_the_old_file_intact(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    write_json_atomic(path, {"old": True})
    with pytest.raises(TypeError):
        write_json_atomic(path, {"bad": object()})
    assert json.loads(path.read_text()) == {"old": True}
    assert [p.name for p in tmp_path.iterdir()] == ["status.json"]


def test_a_private_file_is_never_readable_by_others(tmp_path: Path) -> None:
    """Keys and token hashes go through the temporary file too: it is private from the
    moment it exists, and the bytes arrive as given."""
    path = tmp_path / "key.pem"
    write_atomic(path, b"\x00secret\xff", mode=0o600)
    assert path.read_bytes() == b"\x00secret\xff"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    write_atomic(path, "text, as UTF-8: \u00e9", mode=0o600)
    assert path.read_text(encoding="utf-8") == "text, as UTF-8: \u00e9"
    assert [p.name for p in tmp_path.iterdir()] == ["key.pem"]
