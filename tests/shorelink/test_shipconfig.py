"""A ship's configuration on its way (shorelink/fleet/shipconfig.py): the delta a
gateway sends reads back to the entries the fleet signed, costs little for a small
change, and whatever a gateway or a ship sends instead is a ValueError within its
bound, never another exception."""

from __future__ import annotations

import zlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shorelink import strict_json
from shorelink.fleet.entry import (
    MAX_CONFIG_BYTES,
    MAX_CONFIG_LINES_ASIDE_BYTES,
    MAX_ENTRY_BYTES,
    FleetKey,
    RegistryError,
    decode_entry,
    sign_entry,
)
from shorelink.fleet.log import Registry
from shorelink.fleet.shipconfig import (
    MAX_ANSWER_BYTES,
    ConfigRequest,
    FleetKeys,
    answer_lines,
    decode_delta,
    document_of,
    encode_delta,
    merge_documents,
    offer_for,
    parse_offer,
    parse_request,
    request_json,
    verify_config_entry,
    verify_end,
)
from shorelink.fleet.state import FleetState
from tests.bounds import FAST, KIB, MIB, Bound, within
from tests.strategies import any_bytes, deep_json, json_values, mutated

RULES = "".join(
    f'[[alarms]]\nname = "t{i}"\nstream = "containers"\nabove = {i}\n' for i in range(40)
)


_GROUP = {"scope": "group", "format": "toml", "port_links_only": False}


def _config(reg: Registry, document: str) -> bytes:
    reg.append(
        [
            (
                "config_set",
                {
                    "scope": "group",
                    "name": "north",
                    "format": "toml",
                    "document": document,
                    "port_links_only": False,
                },
            )
        ]
    )
    reg.refresh()
    return reg.entries()[-1].raw


def test_a_one_key_change_crosses_as_a_small_delta_that_reads_back_signed(tmp_path: Path) -> None:
    """The ship holds the group's entry; a change of one key in a 2 KB document costs
    the link its header, its signature and the key, and what the ship rebuilds is the
    entry exactly as the fleet signed it."""
    reg = Registry.init(tmp_path / "r")
    old = _config(reg, RULES + '[streams.nav]\nmax_age = "30d"\n')
    new = _config(reg, RULES + '[streams.nav]\nmax_age = "7d"\n')
    answer = encode_delta([new], [old])
    assert decode_delta(answer, [old]) == [new]
    assert len(answer) < len(zlib.compress(new, 9)) / 2
    assert len(answer) < 400
    anchor = (reg.directory / "fleet.pub").read_text().strip()
    assert verify_config_entry(new, anchor, "g:north").version == reg.state.version
    with pytest.raises(RegistryError, match="not s:x"):
        verify_config_entry(new, anchor, "s:x")
    other = FleetKey.generate()
    with pytest.raises(RegistryError, match="forged"):
        verify_config_entry(new, other.public, "g:north")


def test_the_offer_is_the_ships_scopes_in_order(tmp_path: Path) -> None:
    reg = Registry.init(tmp_path / "r")
    reg.append([("ship_added", {"ship": "bigblue", "groups": ["north", "reefers"]})])
    _config(reg, "a = 1\n")
    reg.refresh()
    assert offer_for(reg.state, "bigblue") == {"g:north": (reg.state.version, False)}
    assert offer_for(reg.state, "nobody") is None
    assert merge_documents([{"a": {"b": 1, "c": 2}}, {"a": {"b": 3}, "d": [1]}]) == {
        "a": {"b": 3, "c": 2},
        "d": [1],
    }
    assert parse_request(request_json({"g:north": None, "s:bigblue": 4})) == ConfigRequest(
        {"g:north": None, "s:bigblue": 4}
    )
    assert parse_request(request_json({"g:north": 3}, since=0)).since == 0


def test_a_rollouts_configuration_reaches_its_canary_signed_as_it_was_started(
    tmp_path: Path,
) -> None:
    """While a rollout's stage reaches a ship, its group's configuration is the
    rollout's (a rollout_started entry): the gateway serves that entry and the ship
    verifies and reads it like a config_set; a ship the stage has not reached keeps the
    group's own."""
    reg = Registry.init(tmp_path / "r")
    reg.append([("ship_added", {"ship": f"s{i}", "groups": ["north"]}) for i in range(4)])
    old = _config(reg, "a = 1\n")
    body = {
        "group": "north",
        "format": "toml",
        "document": "a = 2\n",
        "port_links_only": False,
        "stages": ["1", "100%"],
        "healthy_s": 60,
        "stop_failure_percent": 10,
    }
    reg.append([("rollout_started", body)])
    reg.refresh()
    state, rollout = reg.state, reg.state.version
    offers = {f"s{i}": offer_for(state, f"s{i}") for i in range(4)}
    canary = [s for s, o in offers.items() if o == {"g:north": (rollout, False)}]
    assert len(canary) == 1
    assert sorted(o["g:north"][0] for o in offers.values() if o) == [rollout - 1] * 3 + [rollout]
    line = decode_delta(encode_delta([state.config_lines[rollout]], [old]), [old])[0]
    anchor = (reg.directory / "fleet.pub").read_text().strip()
    entry = verify_config_entry(line, anchor, "g:north")
    assert document_of(entry) == {"a": 2}


_ANSWER = encode_delta([b'{"a":1}', b'{"b":2}'], [b'{"a":0}', b""])


@FAST
@given(st.one_of(any_bytes(300), mutated(_ANSWER)))
def test_any_answer_is_entry_lines_or_a_value_error(answer: bytes) -> None:
    within(Bound(256 * KIB, 16, cpu_s=0.5), (ValueError,), decode_delta, answer, [b'{"a":0}', b""])


@FAST
@given(st.integers(1, 4))
def test_a_compressed_bomb_stops_at_its_bound(mib: int) -> None:
    """An answer that inflates past every entry a ship can hold is refused, having
    taken at most MAX_ANSWER_BYTES."""
    bomb = b"\x00" + zlib.compress(b"x" * (MAX_ANSWER_BYTES + mib * MIB), 9)
    out = within(Bound(24 * MIB, 64, cpu_s=2.0), (ValueError,), decode_delta, bomb, [])
    assert isinstance(out, ValueError)


@FAST
@given(st.one_of(json_values(), st.dictionaries(st.text(max_size=8), json_values(4), max_size=20)))
def test_any_offer_is_an_offer_or_a_value_error(value: object) -> None:
    within(Bound(256 * KIB, 16, cpu_s=0.5), (ValueError,), parse_offer, value, size=0)


@FAST
@given(
    st.one_of(
        any_bytes(300),
        deep_json(),
        mutated(request_json({"g:north": 3}).encode()),
        json_values().map(lambda d: strict_json.dumps({"type": "config", "have": d}).encode()),
    )
)
def test_any_request_is_a_request_or_a_value_error(data: bytes) -> None:
    within(Bound(256 * KIB, 16, cpu_s=0.5), (ValueError,), parse_request, data)


def test_a_rollouts_ships_go_back_on_its_stop_and_follow_the_fleet_keys_rotation(
    tmp_path: Path,
) -> None:
    """A canary that runs a stopped rollout's configuration is served the group's
    entry before it with the signed stop that ended its own, and the rotation that
    signed it, past what it follows; a stop of another rollout ends nothing it holds."""
    reg = Registry.init(tmp_path / "r")
    reg.append([("ship_added", {"ship": "s0", "groups": ["north"]})])
    old = _config(reg, "a = 1\n")
    body = {
        "group": "north",
        "format": "toml",
        "document": "a = 2\n",
        "port_links_only": False,
        "stages": ["100%"],
        "healthy_s": 60,
        "stop_failure_percent": 10,
    }
    reg.append([("rollout_started", body)])
    reg.refresh()
    rollout = reg.state.version
    reg.rotate_fleet_key()
    reg.append(
        [("rollout_stopped", {"rollout": rollout, "reason": "canary failed", "by": "operator"})]
    )
    reg.refresh()
    state, anchor = reg.state, (reg.directory / "fleet.pub").read_text().strip()
    offer = offer_for(state, "s0")
    assert offer is not None and offer["g:north"][0] < rollout
    lines, bases = answer_lines(state, offer, ConfigRequest({"g:north": rollout}, since=0), "s0")
    assert bases == [state.config_lines[rollout]]
    keys = FleetKeys(anchor)
    entries = [decode_entry(line) for line in lines]
    assert [e.kind for e in entries] == ["config_set", "rollout_stopped", "fleet_key_rotated"]
    assert keys.follow([entries[2]]) == [entries[2]] and keys.since == rollout + 1
    assert verify_end(entries[1], keys, "g:north", rollout)  # signed by the new key
    assert not verify_end(entries[1], keys, "g:north", rollout - 1)
    assert verify_config_entry(entries[0], keys, "g:north").raw == old
    with pytest.raises(RegistryError, match="forged"):
        verify_end(entries[1], anchor, "g:north", rollout)  # the root alone: not its key
    # an agent from before gets the group's entry alone, as it always did
    assert answer_lines(state, offer, ConfigRequest({"g:north": rollout}), "s0")[0] == [old]
    # a rotation before the newest one followed is refused, not taken back
    thief = FleetKey.generate()
    fake = sign_entry(thief, 2, "0" * 64, "fleet_key_rotated", {"fleet_key": thief.public})
    with pytest.raises(RegistryError, match="replayed or forked"):
        keys.follow([fake])
    assert keys.since == rollout + 1


def test_the_lines_a_gateway_keeps_beside_those_in_force_stay_within_their_bound() -> None:
    """A group changed a hundred times with near-full documents: the gateway keeps
    the one in force and the newest superseded within MAX_CONFIG_LINES_ASIDE_BYTES,
    not every line ever signed."""
    key, state = FleetKey.generate(), FleetState()
    prev = None

    def add(kind: str, body: dict[str, object]) -> None:
        nonlocal prev
        entry = sign_entry(key, state.version + 1, prev, kind, body)
        state.apply(entry)
        prev = entry.digest

    add("fleet_created", {"fleet_key": key.public})
    add("ship_added", {"ship": "s0", "groups": ["north"]})
    filler = "#" + "x" * (MAX_CONFIG_BYTES - 100) + "\n"
    for i in range(MAX_CONFIG_LINES_ASIDE_BYTES // MAX_CONFIG_BYTES + 20):
        doc = f"a = {i}\n{filler}"
        add(
            "config_set",
            {
                "scope": "group",
                "name": "north",
                "format": "toml",
                "document": doc,
                "port_links_only": False,
            },
        )
    kept = sum(len(line) for line in state.config_lines.values())
    assert kept <= MAX_CONFIG_LINES_ASIDE_BYTES + MAX_ENTRY_BYTES
    assert state.version in state.config_lines  # the one in force, always
    assert len(state.config_lines) < state.version - 20


def test_a_ship_that_leaves_groups_is_shown_the_entry_that_moved_it(tmp_path: Path) -> None:
    """A ship moved out of two groups is served, for each, the one signed entry that
    set its groups; it ends those two scopes for that ship only, and not a group it
    stays in."""
    reg = Registry.init(tmp_path / "r")
    reg.append([("ship_added", {"ship": "s0", "groups": ["north", "reefers", "all"]})])
    _config(reg, "a = 1\n")
    north = reg.state.version
    reg.append([("config_set", {**_GROUP, "name": "reefers", "document": "b = 1\n"})])
    reg.append([("config_set", {**_GROUP, "name": "all", "document": "c = 1\n"})])
    reg.refresh()
    reefers, every = north + 1, north + 2
    reg.append([("ship_groups_set", {"ship": "s0", "groups": ["all"]})])
    reg.refresh()
    state, anchor = reg.state, (reg.directory / "fleet.pub").read_text().strip()
    offer = offer_for(state, "s0")
    assert offer == {"g:all": (every, False)}
    have: dict[str, int | None] = {"g:north": north, "g:reefers": reefers}
    lines, _ = answer_lines(state, offer, ConfigRequest(have, since=0), "s0")
    moved = decode_entry(lines[0])
    assert lines == [moved.raw, moved.raw] and moved.kind == "ship_groups_set"
    assert verify_end(moved, anchor, "g:north", north, "s0")
    assert verify_end(moved, anchor, "g:reefers", reefers, "s0")
    assert not verify_end(moved, anchor, "g:all", every, "s0")
    assert not verify_end(moved, anchor, "g:north", north, "s1")
    assert state.config_end("g:all", every, "s0") is None
