"""write_json_atomic: readers of status files must never see half a file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shorelink.files import write_json_atomic


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
