"""The fleet registry (shorelink/fleet/): a log of entries signed by the fleet key and
chained, so every site and ship can take headquarters' word for who a ship is and which
key signed which of its records. A forged, replayed, reordered, cut or corrupted entry
must be refused where it stands, whatever bytes it holds; a key rotation must keep old
records provable and bound the old key; and the files today's gateways and sites read
must come out of it byte for byte as their own loaders take them."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core_gateway.auth import Credentials
from core_gateway.auth import hash_token as gateway_hash_token
from shorelink.errors import ConfigError, ContractError
from shorelink.fleet.entry import (
    MAX_GROUPS_PER_SHIP,
    MAX_KEYS_PER_SHIP,
    FleetKey,
    RegistryError,
    decode_entry,
    hash_token,
    new_token,
    sign_entry,
)
from shorelink.fleet.log import CHECKED, Registry, read_anchor, read_log
from shorelink.fleet.state import FleetState
from shorelink.fleet.views import gateway_credentials, ship_keys
from shorelink.identity import check_name
from shorelink.proof import ShipKey, ShipKeys, record_hash
from tests.bounds import FAST, FILES, KIB, Bound, within
from tests.strategies import DIGITS, LOWER, any_bytes, any_text, deep_json, mutated, words

FLEET = FleetKey.generate()


class Chain:
    """Entries signed by one fleet key, applied to a state as they are made."""

    def __init__(self, key: FleetKey = FLEET) -> None:
        self.key = key
        self.state = FleetState(anchor=key.public)
        self.entries = [self.make("fleet_created", {"fleet_key": key.public})]
        self.state.apply(self.entries[0])

    def make(self, kind: str, body: dict[str, Any], key: FleetKey | None = None) -> Any:
        version = len(getattr(self, "entries", [])) + 1
        prev = self.entries[-1].digest if version > 1 else None
        return sign_entry(key or self.key, version, prev, kind, body)

    def add(self, kind: str, body: dict[str, Any], key: FleetKey | None = None) -> Any:
        entry = self.make(kind, body, key)
        self.state.apply(entry)
        self.entries.append(entry)
        return entry

    def ship(self, name: str, key: ShipKey | None = None, token: str | None = None) -> None:
        self.add("ship_added", {"ship": name, "groups": ["north"]})
        th = hash_token(token or new_token())
        self.add("token_issued", {"ship": name, "token_hash": th, "retire_previous": False})
        pub = (key or ShipKey.generate()).public()
        self.add("ship_key_added", {"ship": name, "public": pub, "from_seq": 1})


def _replay(entries: list[Any], anchor: str = FLEET.public) -> FleetState:
    state = FleetState(anchor=anchor)
    for e in entries:
        state.apply(e)
    return state


def test_an_entry_signed_by_another_key_is_refused_as_forged() -> None:
    chain = Chain()
    forged = chain.make("ship_added", {"ship": "evil", "groups": ["north"]}, FleetKey.generate())
    with pytest.raises(RegistryError, match=r"entry 2: .*forged"):
        chain.state.apply(forged)
    assert "evil" not in chain.state.ships


def test_an_entry_with_a_changed_byte_of_its_body_is_refused_as_forged() -> None:
    chain = Chain()
    good = chain.make("ship_added", {"ship": "bigblue", "groups": ["north"]})
    edited = decode_entry(good.raw.replace(b"bigblue", b"bigred!"[:6] + b"x"))
    with pytest.raises(RegistryError, match="forged"):
        chain.state.apply(edited)


def test_a_replayed_entry_is_refused() -> None:
    chain = Chain()
    chain.ship("bigblue")
    with pytest.raises(RegistryError, match="entry 3: replayed"):
        chain.state.apply(chain.entries[2])


def test_a_reordered_or_gapped_log_is_refused_at_the_first_entry_out_of_place() -> None:
    chain = Chain()
    chain.ship("bigblue")
    chain.ship("red")
    e = chain.entries
    with pytest.raises(RegistryError, match="entry 4: after a gap"):
        _replay([e[0], e[1], e[3]])
    with pytest.raises(RegistryError, match="entry 3: after a gap"):
        _replay([e[0], e[2], e[1]])
    # an entry of the right version from a fork (another token issued) is refused too
    other = Chain()
    other.ship("bigblue")
    with pytest.raises(RegistryError, match="entry 4: does not follow"):
        _replay([*e[:3], other.entries[3]])


def test_a_log_of_another_fleet_is_refused_against_the_pinned_root_key() -> None:
    theirs = Chain(FleetKey.generate())
    with pytest.raises(RegistryError, match="entry 1: made by another fleet key"):
        _replay(theirs.entries[:1])


def test_a_truncated_or_corrupted_log_file_is_refused_naming_the_entry(tmp_path: Path) -> None:
    reg = Registry.init(tmp_path / "reg")
    reg.append([("ship_added", {"ship": "bigblue", "groups": ["north"]})])
    reg.append([("ship_added", {"ship": "red", "groups": ["north"]})])
    whole = reg.path.read_bytes()
    reg.path.write_bytes(whole[:-10])
    with pytest.raises(RegistryError, match=r"entry 3: cut short.*2 whole entries"):
        Registry.open(reg.directory, every=True)
    at = whole.index(b"red")
    reg.path.write_bytes(whole[:at] + b"rad" + whole[at + 3 :])
    with pytest.raises(RegistryError, match=r"entry 3: .*forged"):
        Registry.open(reg.directory, every=True)
    with pytest.raises(RegistryError, match=r"entry 3: is not the entry checked before"):
        Registry.open(reg.directory)  # as `fleet status` reads it
    reg.path.write_bytes(whole.replace(b'{"body"', b'{ "body"', 1))
    with pytest.raises(RegistryError, match="entry 1: not in canonical form"):
        Registry.open(reg.directory, every=True)


def test_a_log_changed_below_the_entry_a_reader_checked_is_refused(tmp_path: Path) -> None:
    """``fleet status`` checks only the signatures past ``registry.verified``: a log cut
    or rewritten below it must still be refused (the hash chain vouches for the rest)."""
    reg = Registry.init(tmp_path / "reg")
    reg.append([("ship_added", {"ship": "bigblue", "groups": ["north"]})])
    reg.append([("ship_added", {"ship": "red", "groups": ["north"]})])
    assert (reg.directory / CHECKED).read_text().split() == ["3", reg.state.head]
    whole = reg.path.read_bytes()
    reg.path.write_bytes(whole[: whole.index(b"\n") + 1])
    with pytest.raises(RegistryError, match="holds 1 entries; 3 were checked before"):
        Registry.open(reg.directory)
    reg.path.write_bytes(whole.replace(b"bigblue", b"bigbluf"))
    with pytest.raises(RegistryError, match="entry 3: does not follow"):
        Registry.open(reg.directory)
    reg.path.write_bytes(whole)
    assert Registry.open(reg.directory).state.version == 3


def test_an_entry_the_state_refuses_leaves_the_log_and_the_state_as_they_were(
    tmp_path: Path,
) -> None:
    reg = Registry.init(tmp_path / "reg")
    reg.append([("ship_added", {"ship": "bigblue", "groups": ["north"]})])
    before = reg.path.read_bytes()
    changes = [
        ("ship_added", {"ship": "red", "groups": ["north"]}),
        ("ship_added", {"ship": "bigblue", "groups": ["north"]}),  # a name given twice
    ]
    with pytest.raises(RegistryError, match="entry 4: ship bigblue exists"):
        reg.append(changes)
    assert reg.path.read_bytes() == before
    assert sorted(reg.state.ships) == ["bigblue"] and reg.state.version == 2
    assert Registry.open(reg.directory).state.version == 2


def test_two_registry_objects_see_each_others_entries_before_they_sign(tmp_path: Path) -> None:
    a = Registry.init(tmp_path / "reg")
    b = Registry.open(a.directory)
    a.append([("ship_added", {"ship": "bigblue", "groups": ["north"]})])
    b.append([("ship_added", {"ship": "red", "groups": ["north"]})])
    assert sorted(Registry.open(a.directory).state.ships) == ["bigblue", "red"]


def _provision_many(directory: Path, prefix: str, n: int, ready: Any, go: Any) -> None:
    reg = Registry.open(directory)
    ready.release()
    go.wait(30)
    for i in range(n):
        reg.append([("ship_added", {"ship": f"{prefix}{i}", "groups": ["north"]})])


def test_commands_appending_at_once_lose_no_entry_and_keep_one_chain(tmp_path: Path) -> None:
    """Two operators' commands at once: each must see the other's entries before it
    signs the next (the lock), or one chain forks and every reader refuses the log."""
    reg = Registry.init(tmp_path / "reg")
    ctx = multiprocessing.get_context("spawn")
    ready, go = ctx.Semaphore(0), ctx.Event()
    procs = [
        ctx.Process(target=_provision_many, args=(reg.directory, p, 20, ready, go))
        for p in ("a", "b", "c")
    ]
    for p in procs:
        p.start()
    for _ in procs:
        assert ready.acquire(timeout=30)
    go.set()  # all at once, each with the registry it read before
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    state = Registry.open(reg.directory, every=True).state
    assert state.version == 1 + 3 * 20 and len(state.ships) == 60


def test_a_fleet_key_rotation_is_followed_from_the_root_and_the_old_key_signs_no_more(
    tmp_path: Path,
) -> None:
    reg = Registry.init(tmp_path / "reg")
    old = reg.fleet_key()
    new = reg.rotate_fleet_key()
    reg.append([("ship_added", {"ship": "bigblue", "groups": ["north"]})])
    state = Registry.open(reg.directory).state
    assert state.fleet_key_id == new.id and "bigblue" in state.ships
    late = sign_entry(old, state.version + 1, state.head, "ship_revoked", {"ship": "bigblue"})
    with pytest.raises(RegistryError, match="forged"):
        state.apply(late)


def test_a_rotated_key_proves_old_seqs_and_the_new_key_new_seqs_at_a_site(tmp_path: Path) -> None:
    old, new = ShipKey.generate(), ShipKey.generate()
    chain = Chain()
    chain.ship("bigblue", old)
    bound = {"nav": 100, "alerts": 5}
    chain.add("ship_key_added", {"ship": "bigblue", "public": new.public(), "from_seq": bound})
    state = chain.state
    old_id, new_id = (k.id for k in state.ships["bigblue"].keys)
    assert state.key_at("bigblue", "nav", 99).id == old_id  # type: ignore[union-attr]
    assert state.key_at("bigblue", "nav", 100).id == new_id  # type: ignore[union-attr]
    assert state.key_at("bigblue", "alerts", 5).id == new_id  # type: ignore[union-attr]
    assert state.key_at("bigblue", "containers", 1).id == new_id  # not named: from 1
    # what a site enforces: the exported ship keys file, through the real loader
    path = tmp_path / "ship_keys.toml"
    path.write_text(ship_keys(state))
    keys = ShipKeys.load(path)
    assert _verdict(keys, old, "nav", 99) is None
    assert _verdict(keys, new, "nav", 150) is None
    assert _verdict(keys, old, "nav", 100).startswith("revoked")  # type: ignore[union-attr]
    assert _verdict(keys, old, "containers", 1).startswith("revoked")  # type: ignore[union-attr]


def test_a_revoked_key_is_refused_above_its_seq(tmp_path: Path) -> None:
    first, second, third = ShipKey.generate(), ShipKey.generate(), ShipKey.generate()
    chain = Chain()
    chain.ship("bigblue", first)
    chain.add("ship_key_added", {"ship": "bigblue", "public": second.public(), "from_seq": 500})
    kid = chain.state.ships["bigblue"].keys[0].id
    with pytest.raises(RegistryError, match="newest"):
        chain.add(
            "key_revoked",
            {"ship": "bigblue", "key_id": chain.state.ships["bigblue"].keys[1].id, "at_seq": 9},
        )
    chain.add("key_revoked", {"ship": "bigblue", "key_id": kid, "at_seq": 200})
    chain.add("key_revoked", {"ship": "bigblue", "key_id": kid, "at_seq": 300})  # never widens
    chain.add("ship_key_added", {"ship": "bigblue", "public": third.public(), "from_seq": 900})
    state = chain.state
    assert state.key_at("bigblue", "nav", 199).id == kid  # type: ignore[union-attr]
    assert state.key_at("bigblue", "nav", 200) is None
    assert state.key_at("bigblue", "nav", 499) is None
    path = tmp_path / "ship_keys.toml"
    path.write_text(ship_keys(state))
    keys = ShipKeys.load(path)
    assert _verdict(keys, first, "nav", 199) is None
    assert _verdict(keys, first, "nav", 200).startswith("revoked")  # type: ignore[union-attr]
    assert _verdict(keys, second, "nav", 899) is None
    assert _verdict(keys, second, "nav", 900).startswith("revoked")  # type: ignore[union-attr]
    assert _verdict(keys, third, "nav", 10**6) is None


def _verdict(keys: ShipKeys, signer: ShipKey, stream: str, seq: int) -> str | None:
    leaf = record_hash(seq, 1000, "k", "t/1", b"x")
    proof = signer.proofs("bigblue", stream, seq, [leaf])[0]
    return keys.check("bigblue", stream, seq, 1000, "k", "t/1", b"x", proof)


def test_a_token_rotation_keeps_the_old_token_until_it_is_retired() -> None:
    chain = Chain()
    t1, t2, t3 = (hash_token(new_token()) for _ in range(3))
    chain.add("ship_added", {"ship": "bigblue", "groups": ["north"]})
    chain.add("token_issued", {"ship": "bigblue", "token_hash": t1, "retire_previous": False})
    chain.add("token_issued", {"ship": "bigblue", "token_hash": t2, "retire_previous": False})
    assert set(chain.state.valid_tokens()) == {t1, t2}
    with pytest.raises(RegistryError, match="no previous token"):
        chain.add("token_retired", {"ship": "bigblue", "token_hash": t2})
    chain.add("token_retired", {"ship": "bigblue", "token_hash": t1})
    assert set(chain.state.valid_tokens()) == {t2}
    with pytest.raises(RegistryError, match="issued before"):
        chain.add("token_issued", {"ship": "bigblue", "token_hash": t1, "retire_previous": False})
    chain.add("token_issued", {"ship": "bigblue", "token_hash": t3, "retire_previous": True})
    assert set(chain.state.valid_tokens()) == {t3}
    chain.add("ship_revoked", {"ship": "bigblue"})
    assert not chain.state.valid_tokens()


def test_the_exported_views_are_read_by_the_gateway_and_the_sites_own_loaders(
    tmp_path: Path,
) -> None:
    tokens = {s: new_token() for s in ("bigblue", "red", "gone")}
    chain = Chain()
    for ship, token in tokens.items():
        chain.ship(ship, token=token)
    rotated = new_token()
    body = {"ship": "red", "token_hash": hash_token(rotated), "retire_previous": False}
    chain.add("token_issued", body)
    chain.add("ship_revoked", {"ship": "gone"})
    creds_path = tmp_path / "ships.json"
    creds_path.write_text(gateway_credentials(chain.state))
    creds = Credentials(creds_path)
    assert creds.ship_for_token(tokens["bigblue"]) == "bigblue"
    assert creds.ship_for_token(rotated) == "red"  # the view carries the newest token
    assert creds.ship_for_token(tokens["gone"]) is None
    assert [c.ship for c in creds.list() if c.revoked] == ["gone"]
    # byte for byte what the gateway writes for the same credentials
    creds._save()
    assert creds_path.read_text() == gateway_credentials(chain.state)
    keys_path = tmp_path / "ship_keys.toml"
    keys_path.write_text(ship_keys(chain.state))
    keys = ShipKeys.load(keys_path)
    assert sorted(keys.ships) == sorted(tokens) and keys.require_signatures
    assert keys_path.read_text() == ShipKeys.render(
        keys.public_keys(), True, keys.unsigned_below, keys.previous
    )


def test_the_kernels_token_hash_is_the_gateways() -> None:
    token = new_token()
    assert token.startswith("slk_") and hash_token(token) == gateway_hash_token(token)


def test_every_bound_of_a_ship_is_kept() -> None:
    chain = Chain()
    groups = [f"g{i}" for i in range(MAX_GROUPS_PER_SHIP + 1)]
    with pytest.raises(RegistryError, match="groups must be a list of 1 to"):
        chain.add("ship_added", {"ship": "bigblue", "groups": groups})
    chain.ship("bigblue")
    for seq in range(2, MAX_KEYS_PER_SHIP + 1):
        pub = ShipKey.generate().public()
        chain.add("ship_key_added", {"ship": "bigblue", "public": pub, "from_seq": seq})
    with pytest.raises(RegistryError, match=f"{MAX_KEYS_PER_SHIP} keys already"):
        pub = ShipKey.generate().public()
        chain.add("ship_key_added", {"ship": "bigblue", "public": pub, "from_seq": 99})
    # the ship keys file takes what the registry holds at its bound
    ShipKeys.parse(__import__("tomllib").loads(ship_keys(chain.state)))


# -- hostile input over the whole input space (docs/boundaries.md) ----------------------

_CHAIN = Chain()
_CHAIN.ship("bigblue")
_CONFIG = {"scope": "group", "name": "north", "format": "toml", "document": "a = 1\n"}
_CHAIN.add("config_set", {**_CONFIG, "port_links_only": True})
_SAMPLES = [e.raw for e in _CHAIN.entries]
_LOG = b"".join(raw + b"\n" for raw in _SAMPLES)
_ENTRY_BOUND = Bound(256 * KIB, 24, cpu_s=0.5, cpu_per_mib=4)


@FAST
@given(
    st.one_of(
        any_bytes(400),
        st.sampled_from(_SAMPLES).flatmap(lambda s: mutated(s, 4)),
        deep_json(),
    )
)
def test_any_bytes_as_an_entry_are_an_entry_or_a_registry_error(raw: bytes) -> None:
    got = within(_ENTRY_BOUND, (RegistryError,), decode_entry, raw)
    if not isinstance(got, RegistryError):
        assert got.raw == raw and got.version >= 1


@FILES
@given(st.one_of(any_bytes(400), mutated(_LOG, 6)))
def test_any_log_file_is_read_or_refused_with_a_registry_error(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "registry.log"
    path.write_bytes(data)
    state = FleetState(anchor=FLEET.public)
    got = within(_ENTRY_BOUND, (RegistryError,), read_log, path, state, size=len(data))
    if not isinstance(got, RegistryError):
        assert data == _LOG[:got] and state.version == data.count(b"\n")


@FILES
@given(any_bytes(200))
def test_any_fleet_key_files_are_read_or_refused_with_a_config_error(
    tmp_path: Path, data: bytes
) -> None:
    path = tmp_path / "fleet.key"
    path.write_bytes(data)
    path.chmod(0o600)
    within(Bound(64 * KIB, 8, cpu_s=0.2), (ConfigError,), FleetKey.load, path, size=len(data))
    within(Bound(64 * KIB, 8, cpu_s=0.2), (ConfigError,), read_anchor, path, size=len(data))


_NAMES = words(LOWER + DIGITS, LOWER + DIGITS + "_-", 62)


@FAST
@given(ship=st.one_of(any_text(70), _NAMES), group=st.one_of(any_text(20), _NAMES))
def test_ship_and_group_names_are_taken_only_as_check_name_takes_them(
    ship: str, group: str
) -> None:
    def valid(kind: str, name: str) -> bool:
        try:
            check_name(kind, name)
        except ContractError:
            return False
        return True

    state = _replay(_CHAIN.entries[:1])
    try:
        entry = sign_entry(FLEET, 2, state.head, "ship_added", {"ship": ship, "groups": [group]})
        state.apply(entry)
    except RegistryError:
        assert not (valid("ship", ship) and valid("group", group))
    else:
        assert valid("ship", ship) and valid("group", group)
        assert state.ships[ship].groups == (group,)


def test_a_ship_that_must_present_a_client_certificate_says_so_in_every_view(
    tmp_path: Path,
) -> None:
    """The registry replaces ``ships add --require-client-cert``: its word reaches the
    credentials a gateway following it takes and the file ``fleet export`` writes, and
    it is said of a ship that exists and is not revoked only."""
    chain = Chain()
    token = new_token()
    chain.ship("bigblue", token=token)
    chain.ship("red")
    chain.add("client_cert_set", {"ship": "bigblue", "required": True})
    followed = Credentials(None)
    followed.take_registry(chain.state)
    assert followed.requires_client_cert("bigblue") and not followed.requires_client_cert("red")
    assert followed.ship_for_token(token) == "bigblue"
    path = tmp_path / "ships.json"
    path.write_text(gateway_credentials(chain.state))
    assert Credentials(path).requires_client_cert("bigblue")
    assert _replay(chain.entries).ships["bigblue"].require_client_cert
    chain.add("client_cert_set", {"ship": "bigblue", "required": False})
    followed.take_registry(chain.state)
    assert not followed.requires_client_cert("bigblue")
    with pytest.raises(RegistryError, match="no ship ghost"):
        chain.add("client_cert_set", {"ship": "ghost", "required": True})
    chain.add("ship_revoked", {"ship": "red"})
    with pytest.raises(RegistryError, match="revoked"):
        chain.add("client_cert_set", {"ship": "red", "required": True})
    with pytest.raises(RegistryError, match="required must be true or false"):
        decode_entry(chain.make("client_cert_set", {"ship": "red", "required": 1}).raw)
