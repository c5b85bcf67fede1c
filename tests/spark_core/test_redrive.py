"""Dead letters the ship keys caused are tried again when the keys change
(spark_core/redrive.py; replication review N4): a ship's key that reaches a site after
the ship's records did must not leave them dead there for good. On real Kafka with the
site's merge (what its pullers hand it), without Spark: the re-drive reads only what
was dead-lettered since its last pass, writes what is proved now exactly once, and a
restarted merge with the same keys does not try again."""

from __future__ import annotations

import json
from pathlib import Path

from local_stack.kafka import KafkaBroker
from shorelink.contract import dead_topic, relay_topic
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.reading import read_to_end
from shorelink.proof import ShipKey, ShipKeys, WatchedShipKeys, key_cause
from spark_core.merge import Merger
from spark_core.merge_state import H_DEAD_REASON, SourceRow, pulled_source
from spark_core.redrive import redrive_once, retry_row
from tests.helpers import eventually, unique
from tests.spark_core.helpers import canonical, make_site, signed_relayed

KEY = ShipKey.generate()


def _dead(bootstrap: str, stream: str) -> list[str]:
    """The reasons of the site's dead letters of ``stream``, in offset order."""
    ep = KafkaEndpoint.plaintext(bootstrap)
    return [
        dict(m.headers() or [])[H_DEAD_REASON].decode()
        for m in read_to_end(ep, [dead_topic(stream)], settled=True)
    ]


def _use(watched: WatchedShipKeys, path: Path, keys: ShipKeys) -> None:
    """Write the keys file and wait until the merge's watcher holds it."""
    path.write_text(
        ShipKeys.render(keys.public_keys(), keys.require_signatures, None, keys.previous)
    )
    want = keys.fingerprint()
    eventually(lambda: watched.current().fingerprint() == want, 15, "the keys re-read")


def test_records_dead_for_a_key_a_site_lacked_are_taken_once_when_the_key_arrives(
    kafka: KafkaBroker, tmp_path: Path
) -> None:
    """The ship's records reach the site (twice: two neighbours) before its key does:
    dead-lettered as ``unknown_ship``. When the key arrives, the re-drive writes each
    exactly once (40 written, 40 duplicates); a later change of the file reads only
    what was dead-lettered since (nothing), and a merge restarted with the same file
    does not try again (the marker keeps the keys it tried under)."""
    s = unique("s")
    keys_file = tmp_path / "ship_keys.toml"
    keys_file.write_text(ShipKeys.render({}, require_signatures=True))
    site, _ = make_site(kafka.bootstrap, tmp_path, [s])
    merger = Merger(site)
    merger.ship_keys = watched = WatchedShipKeys(keys_file)
    rows = [
        SourceRow(pulled_source(n, "tid", relay_topic("e1", s)), 0, off, k, v, h)
        for n in ("tokyo", "sydney")
        for off, (k, v, h) in enumerate(signed_relayed(KEY, s, range(1, 41)))
    ]
    try:
        merger.ready()
        assert merger.write_pulled(rows).unproved == 80
        assert canonical(kafka.bootstrap, s) == []
        # the first look with this merge: the dead letters tried under these keys once
        first = redrive_once(merger)
        assert first is not None and dict(first["unknown_ship"]) == {"refused": 80}
        assert redrive_once(merger) is None  # the same keys: nothing to do
        assert {key_cause(r) for r in _dead(kafka.bootstrap, s)} == {"unknown_ship"}
        with_key = ShipKeys.parse({"require_signatures": True, "ships": {"bigblue": KEY.public()}})
        _use(watched, keys_file, with_key)
        counts = redrive_once(merger)
        assert counts is not None and dict(counts["unknown_ship"]) == {
            "written": 40,
            "duplicate": 40,
        }
        held = canonical(kafka.bootstrap, s)
        assert sorted(r.identity.seq for r in held) == list(range(1, 41))
        assert all(dict(r.headers()).get(H_DEAD_REASON) is None for r in held)
        assert merger.totals.redriven == {
            "unknown_ship:refused": 80,
            "unknown_ship:written": 40,
            "unknown_ship:duplicate": 40,
        }
        status = json.loads(merger.status_path.read_text())
        assert status["totals"]["redriven"]["unknown_ship:written"] == 40
        # another change: only what was dead-lettered since the last pass is read
        dead_before = len(_dead(kafka.bootstrap, s))
        other = ShipKey.generate()
        both = {"bigblue": KEY.public(), "redsea": other.public()}
        _use(watched, keys_file, ShipKeys.parse({"require_signatures": True, "ships": both}))
        assert redrive_once(merger) == {}
        assert len(_dead(kafka.bootstrap, s)) == dead_before
        mark = merger.state.redrive_keys
    finally:
        merger.close()
    again = Merger(site)
    again.ship_keys = WatchedShipKeys(keys_file)
    try:
        again.ready()
        assert again.state.redrive_keys == mark
        assert redrive_once(again) is None
        assert len(canonical(kafka.bootstrap, s)) == 40
    finally:
        again.close()


def test_only_dead_letters_a_change_of_the_keys_can_prove_are_tried_again() -> None:
    """A record that broke the contract or carries a garbled proof stays dead: no keys
    file proves it. Dead letters an older merge wrote (reasons without a cause in
    front) are recognised too."""
    cases = {
        "unknown_ship: ship x has no key and signatures are required": "unknown_ship",
        "unsigned: ship x signs its records; this one has no proof": "unsigned",
        "bad_signature: proof does not verify: not the ship's record": "bad_signature",
        "revoked: signed by a previous key of x valid below seq 5 only": "revoked",
        "ship x has no key and signatures are required": "unknown_ship",
        "ship x signs its records; this one has no proof": "unsigned",
        "proof does not verify: not the ship's record": "bad_signature",
        "bad proof: proof of 3 bytes is too short": None,
        "bad record: seq out of range": None,
        "header sl.stream=a but topic is sl.ingress.b": None,
        "record of 9 value bytes > MAX_RECORD_BYTES 8": None,
        "x/y holds 4096 ranges already": None,
    }
    for reason, cause in cases.items():
        headers = [
            ("sl.origin", b"x"),
            (H_DEAD_REASON, reason.encode()),
            ("sl.dead.source", b"t/0/1"),
        ]
        got = retry_row("src", 0, 7, b"k", b"v", headers)
        assert (got and got[1]) == cause, reason
        if got is not None:
            assert got[0].headers == [("sl.origin", b"x")] and got[0].offset == 7
    assert retry_row("src", 0, 1, b"k", None, [(H_DEAD_REASON, b"unsigned: x")]) is None
    assert retry_row("src", 0, 1, b"k", b"v", None) is None
