"""The voyage's verdict is computed, not asserted: the pieces that turn observations
into figures are checked against brute force here, so a pass in the report means what
it says."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from voyage.observe import Arrival
from voyage.report import Observed, _gaps, _hops, percentile


@given(
    st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=200), st.floats(0.1, 100)
)
def test_percentile_is_a_value_of_the_sample_with_the_right_rank(
    values: list[float], q: float
) -> None:
    p = percentile(values, q)
    assert p is not None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    assert p == round(ordered[rank - 1], 3)
    assert sum(1 for v in values if round(v, 3) <= p) >= rank * 0.999


def test_percentile_of_nothing_is_none() -> None:
    assert percentile([], 50) is None


@given(st.sets(st.integers(1, 300), max_size=150))
def test_gaps_count_the_missing_runs_below_the_highest_seq(held: set[int]) -> None:
    """A gap is a run of seqs missing between 1 and the highest held: what a consumer
    reading the site would have to wait for."""
    top = max(held, default=0)
    missing_runs = 0
    inside = False
    for seq in range(1, top + 1):
        if seq not in held and not inside:
            missing_runs += 1
        inside = seq not in held
    assert _gaps(held) == missing_runs


@dataclass
class _Plan:
    """A voyage's clock alone (fleet_sim.plan.VoyagePlan's start and speed)."""

    start_wall: float
    speed: float

    def wall_offset(self, sim_epoch_s: float) -> float:
        return (sim_epoch_s - self.start_wall) / self.speed


@given(behind=st.floats(0, 5), silence=st.floats(0, 6 * 3600), speed=st.floats(1, 20_000))
def test_the_alert_is_raised_after_the_overboard_event_however_far_the_simulator_lags(
    behind: float, silence: float, speed: float
) -> None:
    """The raise is the event plus the alarm's silence in wall seconds: a simulator
    running ``behind`` its plan on a loaded machine (the shock's voyage time maps to a
    wall time before its publish) once put it 0.28 s before the event it follows."""
    plan = _Plan(start_wall=1_700_000_000.0, speed=speed)
    event_s = 40.0
    shock_ts = plan.start_wall + (event_s - behind) * speed  # voyage seconds
    body = {"alarm": "overboard", "ts": shock_ts * 1000, "silence_s": silence}
    a = Arrival(event_s + 3, "hq", int(shock_ts * 1000), "BOX", "t", json.dumps(body).encode())
    o = Observed.__new__(Observed)
    o.plan, o.arrivals = plan, {}
    hops = _hops(o, ("ship", "alerts", 1), a, event_s)
    raised = hops[1]
    assert raised["hop"] == "raised on the ship (shock + silence)"
    assert math.isclose(raised["after_s"], round(silence / speed, 2), abs_tol=0.011)
