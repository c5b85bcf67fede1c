"""The plan is the one schedule both the simulated ships and the links follow: if it
were inconsistent (a gap between phases, a container on board after it went overboard),
the voyage's report would judge the system against an impossible world."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet_sim.geo import LANES, PORTS, Route, distance_nm, interpolate
from fleet_sim.iso6346 import is_valid
from fleet_sim.plan import VoyagePlan, plan_voyage

points = st.tuples(st.floats(-80, 80), st.floats(-179, 179))


@given(points, points)
def test_great_circle_distance_is_symmetric_and_interpolation_hits_the_ends(a, b) -> None:  # type: ignore[no-untyped-def]
    assert distance_nm(a, b) == pytest.approx(distance_nm(b, a), abs=1e-6)
    start, end = interpolate(a, b, 0.0), interpolate(a, b, 1.0)
    assert distance_nm(start, a) < 0.01 and distance_nm(end, b) < 0.01
    mid = interpolate(a, b, 0.5)
    assert distance_nm(a, mid) + distance_nm(mid, b) == pytest.approx(distance_nm(a, b), abs=0.05)


def test_sea_lanes_join_the_ports_with_plausible_lengths() -> None:
    tokyo_singapore = Route.between("tokyo", "singapore").length_nm
    singapore_sydney = Route.between("singapore", "sydney").length_nm
    assert 2800 < tokyo_singapore < 3200
    assert 4300 < singapore_sydney < 5000
    for (a, b), lane in LANES.items():
        assert lane[0] == PORTS[a] and lane[-1] == PORTS[b]
    back = Route.between("singapore", "tokyo")
    assert back.position_at(0.0)[:2] == pytest.approx(PORTS["singapore"], abs=1e-6)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 5), st.floats(2, 20), st.integers(4, 60), st.integers(0, 1000))
def test_plans_are_consistent(ships: int, minutes: float, containers: int, seed: int) -> None:
    names = [f"s{i}" for i in range(ships)]
    plan = plan_voyage(names, minutes=minutes, containers=containers, seed=seed, start_wall=1e9)
    assert plan.end_s() == pytest.approx(minutes * 60)
    for sp in plan.ships:
        phases = sp.phases
        assert phases[0].start_s == 0
        assert all(a.end_s == b.start_s for a, b in itertools.pairwise(phases))
        assert [p.port for p in phases if p.kind == "port"] == ["tokyo", "singapore", "sydney"]
        assert all(is_valid(c) for c in sp.ever_on_board())
    for t in (0.0, 1.5, plan.end_s() / 3, plan.end_s()):
        assert plan.wall_offset(plan.sim_time(t)) == pytest.approx(t)
    # the overboard event: at sea, on board until then, never after
    ob = plan.overboard
    ship = plan.ship(ob.ship)
    assert plan.phase_at(ob.ship, ob.at_s).kind == "sea"
    assert len(ob.containers) == 3
    assert set(ob.containers) <= ship.on_board(ob.at_s - 1e-6)
    assert not set(ob.containers) & ship.on_board(ob.at_s)
    assert not set(ob.containers) & ship.on_board(plan.end_s())
    if ships >= 2:
        # one of them came from an earlier ship at Singapore: its history spans two ships
        moved = [c for c in ob.containers if c in plan.transshipped]
        assert moved
        assert sum(1 for s in plan.ships if moved[0] in s.ever_on_board()) == 2
    assert VoyagePlan.from_json(json.loads(json.dumps(plan.to_json()))) == plan


def test_minutes_or_speed_exactly_one() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        plan_voyage(["a"], start_wall=0)
    with pytest.raises(ValueError, match="exactly one"):
        plan_voyage(["a"], minutes=1, speed=100, start_wall=0)
    fast = plan_voyage(["a"], speed=10_000, start_wall=0)
    assert fast.speed == 10_000


def test_a_plan_that_is_not_one_is_refused_with_a_clear_error() -> None:
    with pytest.raises(ValueError, match="not a voyage plan"):
        VoyagePlan.from_json({"ships": [{"name": "x"}]})
