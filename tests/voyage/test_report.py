"""The voyage's verdict is computed, not asserted: the pieces that turn observations
into figures are checked against brute force here, so a pass in the report means what
it says."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from voyage.report import _gaps, percentile


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
