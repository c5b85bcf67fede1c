"""The registry as records (shorelink/fleet/travel.py) and their follower
(shorelink/fleet/follow.py), without Kafka: a site takes an entry only in its place of
the chain from the root it pins, whatever order or copies the topic holds; a forged or
replayed candidate is refused and counted and the genuine entries after it are taken;
and a neighbour cannot make a registry record the merge would take (its proof)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shorelink.contract import H_PROOF, Record
from shorelink.fleet.bundle import provision
from shorelink.fleet.entry import FLEET_ORIGIN, REGISTRY_STREAM, FleetKey, RegistryError, sign_entry
from shorelink.fleet.follow import RegistryFollower
from shorelink.fleet.log import Registry
from shorelink.fleet.travel import entry_record
from shorelink.fleet.views import site_ship_keys
from shorelink.kafka.registry import entry_records
from shorelink.proof import ShipKeys

Raw = tuple[bytes, bytes, list[tuple[str, str | bytes | None]]]


def _registry(tmp_path: Path, ships: int) -> tuple[Registry, list[Raw]]:
    reg = Registry.init(tmp_path / "reg")
    for i in range(ships):
        provision(reg, f"ship{i}", ["north"], out=tmp_path / f"b{i}")
    key = reg.fleet_key()
    return reg, [entry_record(e, key, "hq") for e in reg.entries()]


def _check(keys: ShipKeys, raw: Raw) -> str | None:
    """What a merge says of this record pulled from a neighbour (proof check)."""
    key, value, headers = raw
    rec = Record.from_kafka(key, value, headers)
    proof = next(v for k, v in headers if k == H_PROOF)
    i = rec.identity
    assert isinstance(proof, bytes)
    return keys.check(
        i.origin, i.stream, i.seq, rec.ts_ms, rec.key, rec.mqtt_topic, rec.value, proof
    )


def test_entries_are_taken_in_their_place_whatever_order_the_topic_holds(tmp_path: Path) -> None:
    """Replication may bring a later entry first: it waits for its place, never skips."""
    reg, raws = _registry(tmp_path, 2)
    f = RegistryFollower(reg.state.fleet_key or "")
    for raw in reversed(raws):
        f.take(*raw)
    assert f.version == reg.state.version and f.waiting == 0 and not f.refused
    assert set(f.state.ships) == {"ship0", "ship1"}


def test_forged_and_replayed_entries_are_refused_and_later_ones_still_taken(
    tmp_path: Path,
) -> None:
    """A candidate slipped into the topic at the next version must neither apply nor
    stop the genuine entry of that version, nor any after it."""
    reg, raws = _registry(tmp_path, 1)
    f = RegistryFollower(reg.state.fleet_key or "")
    for raw in raws:
        f.take(*raw)
    at = f.version
    forged = sign_entry(
        FleetKey.generate(), at + 1, reg.state.head, "ship_revoked", {"ship": "ship0"}
    )
    f.take(*_unproved(forged, at + 1))
    f.take(*raws[1])  # replayed
    provision(reg, "ship1", ["north"], out=tmp_path / "b1")
    key = reg.fleet_key()
    for e in reg.entries()[at:]:
        assert f.take(*entry_record(e, key, "hq"))
    assert f.version == reg.state.version
    assert f.refused == {"forged": 1, "replayed": 1}
    assert [q[:2] for q in f.quarantine] == [(at + 1, "forged"), (2, "replayed")]
    # as an operator reads it outside the process (gateway /registry, Spark status file)
    shown = f.quarantined()
    assert [(q["version"], q["reason"]) for q in shown] == [(2, "replayed"), (at + 1, "forged")]
    assert all(q["error"] and q["at"].endswith("Z") for q in shown)
    assert [q["reason"] for q in f.quarantined(1)] == ["replayed"]
    assert not f.state.ships["ship0"].revoked


def _unproved(entry: object, seq: int) -> Raw:
    from shorelink.contract import contract_headers

    headers = contract_headers(FLEET_ORIGIN.encode(), REGISTRY_STREAM.encode(), seq, 0, b"x", b"")
    return b"registry", entry.raw, list(headers)  # type: ignore[attr-defined]


def test_a_neighbour_cannot_make_a_registry_record_the_merge_takes(tmp_path: Path) -> None:
    """The merge keeps the first copy of an identity: a record of ``fleet`` that a
    hostile neighbour made at the next seq would take the genuine entry's place at every
    site behind it for good, so its proof is checked against the fleet's keys."""
    reg, raws = _registry(tmp_path, 1)
    keys = site_ship_keys(reg.state)
    assert all(_check(keys, raw) is None for raw in raws)
    root_only = RegistryFollower(reg.state.fleet_key or "").current()
    assert _check(root_only, raws[-1]) is None  # a fresh site knows the root only
    thief = FleetKey.generate()
    forged = sign_entry(thief, len(raws) + 1, reg.state.head, "ship_revoked", {"ship": "ship0"})
    raw = entry_record(forged, thief, "hq")
    assert _check(keys, raw) is not None
    assert keys.refuses(FLEET_ORIGIN) is False and keys.signed(FLEET_ORIGIN)


def test_after_a_fleet_key_rotation_the_old_key_proves_only_the_entries_it_signed(
    tmp_path: Path,
) -> None:
    """A fleet key retired by a rotation must not prove a record past its last entry."""
    reg, _ = _registry(tmp_path, 1)
    old = reg.fleet_key()
    reg.rotate_fleet_key()
    provision(reg, "ship1", ["north"], out=tmp_path / "b1")
    entries = reg.entries()
    rotated = next(e.version for e in entries if e.kind == "fleet_key_rotated")
    keys = site_ship_keys(reg.state)
    new = reg.fleet_key()
    assert _check(keys, entry_record(entries[rotated - 1], old, "hq")) is None
    assert _check(keys, entry_record(entries[rotated], new, "hq")) is None
    late = entries[rotated]
    object.__setattr__(late, "signer", old.id)
    assert _check(keys, entry_record(late, old, "hq")) is not None
    with pytest.raises(RegistryError, match="no longer holds"):
        entry_record(entries[0], new, "hq")


def test_entries_signed_before_a_fleet_key_rotation_are_published_after_it(
    tmp_path: Path,
) -> None:
    """Issue 41: the fleet key rotated before ``publish`` ran (or for a site rebuilt
    later) left entries signed by a key headquarters no longer holds, and their records
    could not be published at all. The retired key signs their records in chunks when
    it is rotated (``fleet.retired``): every entry's record, from version 1, is proved
    at a site that knows only the root, and the follower takes the whole chain."""
    reg, _ = _registry(tmp_path, 1)
    more = [("ship_added", {"ship": f"more{i}", "groups": ["north"]}) for i in range(130)]
    reg.append(more)  # past one chunk of 128 records
    old = reg.fleet_key()
    reg.rotate_fleet_key()
    provision(reg, "late", ["north"], out=tmp_path / "late")
    entries, raws = entry_records(reg, "hq", 0)
    assert len(raws) == reg.state.version
    assert {c[2] for c in reg.retired()} == {old.id} and len(reg.retired()) == 2
    assert (reg.directory / "fleet.retired").stat().st_mode & 0o777 == 0o644
    follower = RegistryFollower(Registry.open(reg.directory).state.anchor or "")
    for raw in raws:
        assert _check(follower.current(), raw) is None
        if follower.take(*raw):
            follower.changed()
    assert follower.version == reg.state.version and not follower.refused
    assert "late" in follower.state.ships
    # publishing from the middle of a chunk: its other entries are read from the log
    rotated = next(e.version for e in entries if e.kind == "fleet_key_rotated")
    assert [r[1] for r in entry_records(reg, "hq", rotated - 2)[1]] == [
        r[1] for r in raws[rotated - 2 :]
    ]


def test_a_rotation_cut_short_after_its_entry_still_keeps_the_retired_keys_proofs(
    tmp_path: Path,
) -> None:
    """The rotation entry written, the process killed before the new key took
    ``fleet.key``'s name: the next command finishes the rename, and the old key signs
    the retired chunks first (it is given up then)."""
    reg, _ = _registry(tmp_path, 1)
    old = reg.fleet_key()
    new = FleetKey.generate()
    new.save(reg.directory / "fleet.key.next")
    reg.append([("fleet_key_rotated", {"fleet_key": new.public})], key=old)
    assert not reg.retired()
    again = Registry.open(reg.directory)
    assert again.fleet_key().id == new.id
    _, raws = entry_records(again, "hq", 0)
    keys = site_ship_keys(again.state)
    assert [_check(keys, r) for r in raws] == [None] * again.state.version
