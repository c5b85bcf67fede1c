"""Staged rollouts (shorelink/fleet/rollout.py): which ships each stage reaches, and the
decision to advance, hold or stop. A rollout exists to keep a bad configuration at its
canaries: it must never advance past a failing or silent ship, must stop exactly at the
stated failure share, and every reader (every site, every re-run) must pick the same
ships; the entries that move it are refused like any other forged or replayed entry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shorelink.fleet.entry import FleetKey, RegistryError, sign_entry, stage_size
from shorelink.fleet.log import Registry
from shorelink.fleet.rollout import (
    FAILED,
    HEALTHY,
    WAITING,
    Heard,
    RolloutRecord,
    canary_order,
    decide,
    entry_ms,
)
from shorelink.fleet.state import FleetState

START = "2026-11-30T00:00:00Z"
START_MS = entry_ms(START)
HEALTHY_S = 60
_SETTINGS = settings(max_examples=60, deadline=2000)

ship_names = st.lists(
    st.from_regex(r"[a-z][a-z0-9-]{0,15}", fullmatch=True), min_size=1, max_size=40, unique=True
)


def _rollout(ships: list[str], stop_percent: int = 20, stages: tuple[str, ...] = ("100%",)) -> Any:
    return RolloutRecord(
        7, "north", stages, HEALTHY_S, stop_percent, canary_order("north", ships), [START]
    )


_OK = Heard(START_MS + HEALTHY_S * 1000, 7, None)
_BROKEN = Heard(START_MS + 1000, 3, "alarms.threshold: unknown key")
# what a ship may say: healthy, failed, not yet applied, applied too briefly, or a
# report written before the stage began
_ANY_HEARD = st.sampled_from(
    [
        _OK,
        _BROKEN,
        Heard(START_MS + 5000, 3, None),
        Heard(START_MS + 5000, 7, None),
        Heard(START_MS - 1000, 7, None),
        Heard(START_MS - 1000, 3, "an old failure"),
    ]
)


@_SETTINGS
@given(ship_names, st.randoms(use_true_random=False))
def test_canaries_are_the_same_ships_whatever_order_or_company_the_fleet_lists(
    ships: list[str], rnd: Any
) -> None:
    """A re-run, another site or a fleet listed in another order must pick the same
    canaries; a ship's place depends on its name alone, not on who else is listed."""
    shuffled = list(ships)
    rnd.shuffle(shuffled)
    order = canary_order("north", ships)
    assert canary_order("north", shuffled) == order
    some = set(shuffled[: len(shuffled) // 2])
    assert canary_order("north", some) == tuple(s for s in order if s in some)


@_SETTINGS
@given(ship_names, st.lists(st.sampled_from(["1", "3", "5%", "25%", "60%"]), max_size=4))
def test_each_stage_reaches_the_ships_before_it_and_the_last_the_whole_group(
    ships: list[str], steps: list[str]
) -> None:
    """A ship reached stays reached: a stage that dropped a canary would take its
    configuration back mid-rollout."""
    r = _rollout(ships, stages=(*steps, "100%"))
    counts = r.stage_counts()
    assert counts == sorted(counts) and counts[-1] == len(ships)
    assert counts[0] == stage_size(r.stages[0], len(ships)) >= 1
    seen: list[str] = []
    for k in range(len(r.stages)):
        if k:
            r.stage_times.append(START)
        reached = r.reached()
        assert reached[: len(seen)] == seen and len(reached) == counts[k]
        seen = reached


@_SETTINGS
@given(ship_names, st.data())
def test_a_rollout_never_advances_past_a_failing_or_silent_ship(
    ships: list[str], data: st.DataObject
) -> None:
    """Advancing is the one irreversible step toward the whole fleet: it takes every
    reached ship healthy; one failed, never heard or still settling ship holds it."""
    r = _rollout(ships, stop_percent=100)
    heard = {s: data.draw(_ANY_HEARD) for s in ships if data.draw(st.booleans())}
    d = decide(r, dict.fromkeys(ships, 7), heard)
    all_healthy = all(heard.get(s) == _OK for s in ships)
    assert (d.action == "done") == all_healthy
    assert d.action in ("done", "hold")
    if any(s not in heard for s in ships):
        assert d.count(WAITING) >= 1 and d.action == "hold"


@_SETTINGS
@given(
    st.integers(1, 60),
    st.data(),
    st.integers(0, 100),
)
def test_it_stops_exactly_when_failures_pass_the_stated_share(
    n: int, data: st.DataObject, percent: int
) -> None:
    """The stop share is a promise to the operator: not one failure early (a noisy
    ship must not stop a good change below it), not one late."""
    failed = data.draw(st.integers(0, n))
    ships = [f"s{i}" for i in range(n)]
    r = _rollout(ships, stop_percent=percent)
    heard = {s: (_BROKEN if i < failed else _OK) for i, s in enumerate(ships)}
    d = decide(r, dict.fromkeys(ships, 7), heard)
    assert (d.action == "stop") == (failed * 100 > percent * n)
    if d.action == "stop":
        assert f"{failed} of {n} ships failed" in d.reason and "unknown key" in d.reason


def test_a_report_from_before_the_stage_began_is_not_heard_and_health_takes_its_time() -> None:
    """A report written before the canary got the change says nothing about it; one
    written too soon after says too little."""
    ships = ["a", "b"]
    r = _rollout(ships, stages=("1", "100%"))
    canary = r.reached()[0]
    stale = {canary: Heard(START_MS - 1, 7, None)}
    assert decide(r, {canary: 7}, stale).ships[0].state == WAITING
    early = {canary: Heard(START_MS + HEALTHY_S * 1000 - 1, 7, None)}
    assert decide(r, {canary: 7}, early).action == "hold"
    d = decide(r, {canary: 7}, {canary: _OK})
    assert d.action == "advance" and d.ships[0].state == HEALTHY
    assert decide(r, {canary: 7}, {canary: _BROKEN}).ships[0].state == FAILED


# -- the registry's entries -------------------------------------------------------------


def _fleet(tmp_path: Path, ships: int = 20) -> Registry:
    reg = Registry.init(tmp_path / "reg")
    reg.append([("ship_added", {"ship": f"ship{i:02}", "groups": ["north"]}) for i in range(ships)])
    reg.append(
        [
            (
                "config_set",
                {
                    "scope": "group",
                    "name": "north",
                    "format": "toml",
                    "document": "a = 1\n",
                    "port_links_only": False,
                },
            )
        ]
    )
    return reg


def _start(reg: Registry, stages: list[str], stop: int = 10) -> int:
    body = {
        "group": "north",
        "format": "toml",
        "document": "a = 2\n",
        "port_links_only": False,
        "stages": stages,
        "healthy_s": HEALTHY_S,
        "stop_failure_percent": stop,
    }
    reg.append([("rollout_started", body)])
    return reg.state.version


def test_config_for_follows_the_rollout_and_a_stopped_one_takes_its_canaries_back(
    tmp_path: Path,
) -> None:
    """The gateway serves config_for: a ship not yet reached must keep the group's
    configuration, and a stopped rollout must not leave its bad configuration on the
    canaries."""
    reg = _fleet(tmp_path)
    before = reg.state.version
    rid = _start(reg, ["10%", "50%", "100%"])
    state = reg.state
    r = state.rollouts[rid]
    canaries = r.reached()
    versions = {s: state.config_for(s).version for s in state.ships}
    assert sorted(s for s, v in versions.items() if v == rid) == sorted(r.reached())
    assert len(r.reached()) == 2 and set(versions.values()) == {before, rid}
    assert state.config_for(r.reached()[0]).documents[0].document == "a = 2\n"

    reg.append([("rollout_advanced", {"rollout": rid, "stage": 1, "by": "health"})])
    assert sum(reg.state.config_version(s) == rid for s in state.ships) == 10
    with pytest.raises(RegistryError, match="under way"):
        reg.append(
            [
                (
                    "config_set",
                    {
                        "scope": "group",
                        "name": "north",
                        "format": "toml",
                        "document": "",
                        "port_links_only": False,
                    },
                )
            ]
        )
    reg.append([("rollout_stopped", {"rollout": rid, "reason": "canary", "by": "operator"})])
    assert {reg.state.config_version(s) for s in state.ships} == {before}

    again = _start(reg, ["10%", "100%"])
    assert reg.state.rollouts[again].reached() == canaries, "same canaries on a re-run"
    reg.append([("rollout_advanced", {"rollout": again, "stage": 1, "by": "health"})])
    reg.append([("rollout_done", {"rollout": again, "by": "health"})])
    assert {reg.state.config_version(s) for s in state.ships} == {again}
    reopened = Registry.open(reg.directory, every=True).state
    assert {reopened.config_version(s) for s in state.ships} == {again}


def test_rollout_entries_forged_replayed_or_out_of_turn_are_refused(tmp_path: Path) -> None:
    """A rollout's entries move configuration to the whole fleet: a thief without the
    fleet key, a replay or a skipped stage must change nothing."""
    reg = _fleet(tmp_path)
    rid = _start(reg, ["1", "100%"])
    state = reg.state
    advance = {"rollout": rid, "stage": 1, "by": "health"}
    forged = sign_entry(
        FleetKey.generate(), state.version + 1, state.head, "rollout_advanced", advance
    )
    with pytest.raises(RegistryError, match="forged"):
        state.apply(forged)
    reg.append([("rollout_advanced", advance)])
    entry = reg.entries()[-1]
    with pytest.raises(RegistryError, match="replayed"):
        reg.state.apply(entry)
    with pytest.raises(RegistryError, match="stage"):
        reg.append([("rollout_advanced", {**advance, "stage": 2})])
    with pytest.raises(RegistryError, match="no rollout"):
        reg.append([("rollout_done", {"rollout": rid + 50, "by": "health"})])
    fresh = FleetState(anchor=state.fleet_key)
    for e in reg.entries():
        fresh.apply(e)
    assert fresh.rollouts[rid].stage == 1
    with pytest.raises(RegistryError, match="stage"):
        _start(reg, ["0", "100%"])


def test_a_rollout_of_an_unknown_or_empty_group_is_refused(tmp_path: Path) -> None:
    reg = _fleet(tmp_path, ships=1)
    body = {
        "group": "south",
        "format": "toml",
        "document": "",
        "port_links_only": False,
        "stages": ["100%"],
        "healthy_s": 0,
        "stop_failure_percent": 0,
    }
    with pytest.raises(RegistryError, match="no ships"):
        reg.append([("rollout_started", body)])
    with pytest.raises(RegistryError, match="last stage"):
        reg.append([("rollout_started", {**body, "group": "north", "stages": ["5%"]})])
