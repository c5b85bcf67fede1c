"""``shorelink ship-key``: the key tool an operator uses to give a ship its signing key
(a private file for the ship, the public half in the ship keys file every site reads)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from shorelink.proof import ShipKey, ShipKeys, SignatureError
from shorelink.wire import Batch, WireRecord, decode_columns, encode_batch


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shorelink.cli", "ship-key", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_new_list_replace_and_remove_keep_the_private_key_private(tmp_path: Path) -> None:
    keys = tmp_path / "ship_keys.toml"
    key = tmp_path / "bigblue.key"
    made = _run("new", "bigblue", "--key-file", str(key), "--ship-keys", str(keys))
    assert made.returncode == 0, made.stderr
    assert "next: copy" in made.stdout
    assert key.stat().st_mode & 0o077 == 0
    loaded = ShipKeys.load(keys)
    assert loaded.require_signatures  # a new file refuses ships without a key
    # the key the ship gets signs what the file proves
    ship_key = ShipKey.load(key)
    recs = tuple(WireRecord(s, "k", s, "t", b"%d" % s) for s in range(1, 40))
    h, cols = decode_columns(encode_batch(Batch("bigblue", "nav", recs), key=ship_key))
    assert loaded.prove_batch("bigblue", "nav", 1, cols, h.signatures) is not None
    # never overwritten, never replaced by accident
    again = _run("new", "bigblue", "--key-file", str(key), "--ship-keys", str(keys))
    assert again.returncode == 2 and "never overwritten" in again.stderr
    other = tmp_path / "other.key"
    dup = _run("new", "bigblue", "--key-file", str(other), "--ship-keys", str(keys))
    assert dup.returncode == 2 and "--replace" in dup.stderr and not other.exists()
    swap = _run("new", "bigblue", "--key-file", str(other), "--ship-keys", str(keys), "--replace")
    assert swap.returncode == 0
    assert ShipKeys.load(keys).public_keys()["bigblue"] == ShipKey.load(other).public()
    two = _run(
        "new", "redsea", "--key-file", str(tmp_path / "r.key"), "--ship-keys", str(keys),
        "--no-require-signatures",
    )  # fmt: skip
    assert two.returncode == 0
    old = _run(
        "new", "oldtimer", "--key-file", str(tmp_path / "o.key"), "--ship-keys", str(keys),
        "--unsigned-below", "containers=5000", "--unsigned-below", "nav=70",
    )  # fmt: skip
    assert old.returncode == 0, old.stderr
    listed = json.loads(_run("list", "--ship-keys", str(keys), "--json").stdout)
    assert sorted(listed["ships"]) == ["bigblue", "oldtimer", "redsea"]
    assert listed["require_signatures"] is False
    assert listed["unsigned_below"] == {"oldtimer": {"containers": 5000, "nav": 70}}
    assert "containers < 5000" in _run("list", "--ship-keys", str(keys)).stdout
    bad = _run(
        "new", "x", "--key-file", str(tmp_path / "x1.key"), "--ship-keys", str(keys),
        "--unsigned-below", "nav",
    )  # fmt: skip
    assert bad.returncode == 2 and "STREAM=SEQ" in bad.stderr
    assert not (tmp_path / "x1.key").exists()
    text = _run("list", "--ship-keys", str(keys)).stdout
    assert "redsea" in text and "taken unsigned" in text
    gone = _run("remove", "redsea", "--ship-keys", str(keys))
    assert gone.returncode == 0 and sorted(ShipKeys.load(keys).ships) == ["bigblue", "oldtimer"]
    # review N10: without require_signatures the ship is now taken unsigned: said
    assert "warning: require_signatures = false" in gone.stderr and "UNSIGNED" in gone.stderr
    assert ShipKeys.load(keys).unsigned_below == {"oldtimer": {"containers": 5000, "nav": 70}}
    assert _run("remove", "redsea", "--ship-keys", str(keys)).returncode == 2
    bad = _run("new", "Big Blue", "--key-file", str(tmp_path / "x.key"), "--ship-keys", str(keys))
    assert bad.returncode == 2 and "bad origin name" in bad.stderr


def _nav_batch(key: ShipKey, first: int, n: int) -> tuple[tuple[object, ...], bytes]:
    recs = tuple(WireRecord(s, "k", s, "t", b"%d" % s) for s in range(first, first + n))
    h, cols = decode_columns(encode_batch(Batch("bigblue", "nav", recs), key=key))
    return cols, h.signatures


def test_replace_keeps_what_the_old_key_signed_provable_and_revoke_bounds_it(
    tmp_path: Path,
) -> None:
    """Review N4: ``--replace`` made every record the old key signed a dead letter
    wherever a site lacked it. The old key goes to the ship's ``previous`` keys and
    proves at every seq (a lost key); ``--revoke --from nav=20`` (a stolen one) bounds
    it: what it signed below 20 is still taken, above refused. ``list`` shows the
    history; a revocation without a bound is refused, not guessed; ``revoke`` bounds a
    previous key after the fact (replaced as lost, then found stolen)."""
    keys = tmp_path / "ship_keys.toml"
    first, second, third = (tmp_path / f"k{i}.key" for i in range(3))
    assert (
        _run("new", "bigblue", "--key-file", str(first), "--ship-keys", str(keys)).returncode == 0
    )
    old = ShipKey.load(first)
    swap = _run("new", "bigblue", "--key-file", str(second), "--ship-keys", str(keys), "--replace")
    assert swap.returncode == 0, swap.stderr
    loaded = ShipKeys.load(keys)
    assert loaded.prove_batch("bigblue", "nav", 1, *_nav_batch(old, 1, 30)) is not None
    assert loaded.prove_batch("bigblue", "nav", 1, *_nav_batch(ShipKey.load(second), 1, 30))
    unbounded = _run("new", "bigblue", "--key-file", str(third), "--ship-keys", str(keys),
                     "--replace", "--revoke")  # fmt: skip
    assert unbounded.returncode == 2 and "--from" in unbounded.stderr and not third.exists()
    alone = _run("new", "bigblue", "--key-file", str(third), "--ship-keys", str(keys),
                 "--replace", "--from", "nav=20")  # fmt: skip
    assert alone.returncode == 2 and "--revoke" in alone.stderr
    revoke = _run("new", "bigblue", "--key-file", str(third), "--ship-keys", str(keys),
                  "--replace", "--revoke", "--from", "nav=20")  # fmt: skip
    assert revoke.returncode == 0, revoke.stderr
    loaded = ShipKeys.load(keys)
    middle = ShipKey.load(second)
    assert loaded.prove_batch("bigblue", "nav", 1, *_nav_batch(middle, 1, 19)) is not None
    assert loaded.prove_batch("bigblue", "nav", 1, *_nav_batch(old, 1, 30)) is not None
    try:
        loaded.prove_batch("bigblue", "nav", 15, *_nav_batch(middle, 15, 10))
    except SignatureError as exc:
        assert exc.reason == "bad_signature"
    else:
        raise AssertionError("a revoked key signed seqs above its bound")
    listed = json.loads(_run("list", "--ship-keys", str(keys), "--json").stdout)
    assert listed["previous"] == {
        "bigblue": [{"key": middle.public(), "valid_below": {"nav": 20}}, {"key": old.public()}]
    }
    text = _run("list", "--ship-keys", str(keys)).stdout
    assert "nav < 20" in text and "every seq" in text
    # the first key, replaced as lost, turns out stolen: bounded after the fact
    late = _run("revoke", "bigblue", "--ship-keys", str(keys), "--key", old.public(),
                "--from", "10")  # fmt: skip
    assert late.returncode == 0, late.stderr
    loaded = ShipKeys.load(keys)
    assert loaded.prove_batch("bigblue", "nav", 1, *_nav_batch(old, 1, 9)) is not None
    try:
        loaded.prove_batch("bigblue", "nav", 1, *_nav_batch(old, 1, 30))
    except SignatureError as exc:
        assert exc.reason == "bad_signature"
    else:
        raise AssertionError("a key revoked later still signed seqs above its bound")
    nothing = _run("revoke", "bigblue", "--ship-keys", str(keys), "--key", "AAAA", "--from", "1")
    assert nothing.returncode == 2 and "no previous key" in nothing.stderr
    assert _run("remove", "bigblue", "--ship-keys", str(keys)).returncode == 0
    assert ShipKeys.load(keys).previous == {}
