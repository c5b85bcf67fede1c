"""write_atomic, write_json_atomic: readers of status files, credentials and keys must
never see half a file, nor anyone else a private one."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from shorelink.files import locked, write_atomic, write_json_atomic
from shorelink.proof import ShipKey


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


def test_a_planted_symlink_never_receives_a_private_key(tmp_path: Path) -> None:
    """Review N9: in a directory others may write, a ``ship.key.tmp`` planted as a
    symlink to a file of theirs received the ship's private key (the temporary name was
    predictable and opened without O_EXCL/O_NOFOLLOW, and save() chmodded by name).
    Now no planted name is written through: not the old temporary name, not the lock's,
    not the key's own (the rename replaces the link, never its target)."""
    stolen = tmp_path / "stolen"
    stolen.write_bytes(b"")
    stolen.chmod(0o644)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(b"theirs")
    elsewhere.chmod(0o644)
    keys = tmp_path / "keys"
    keys.mkdir()
    path = keys / "ship.key"
    (keys / "ship.key.tmp").symlink_to(stolen)
    path.symlink_to(elsewhere)
    key = ShipKey.generate()
    key.save(path)
    assert stolen.read_bytes() == b"" and stat.S_IMODE(stolen.stat().st_mode) == 0o644
    assert elsewhere.read_bytes() == b"theirs"
    assert stat.S_IMODE(elsewhere.stat().st_mode) == 0o644
    assert not path.is_symlink() and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert ShipKey.load(path).public() == key.public()
    # the lock of a read-modify-write (ship keys, credentials) is not followed either
    (keys / "ship_keys.toml.lock").symlink_to(stolen)
    with pytest.raises(OSError), locked(keys / "ship_keys.toml"):
        pass
    assert stolen.read_bytes() == b""


def test_each_write_uses_a_temporary_name_no_one_can_guess(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two writers of one file (the replication status: the routing thread and a
    caller) never share a temporary file, and a leftover one is never reused."""
    path = tmp_path / "status.json"
    seen: set[str] = set()
    real_replace = os.replace

    def spy(src: str | Path, dst: str | Path) -> None:
        seen.add(Path(src).name)
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    for i in range(20):
        write_json_atomic(path, {"i": i})
    assert len(seen) == 20 and all(n.startswith(".status.json.") for n in seen)
    assert json.loads(path.read_text()) == {"i": 19}
