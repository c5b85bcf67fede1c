"""RangeSet is the holdings, the ledger and a consumer's position: if it ever disagrees
with a plain set of seqs, records are resent, skipped or doubled."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shorelink.ranges import RangeSet

ranges = st.lists(
    st.tuples(st.integers(1, 200), st.integers(0, 20)).map(lambda t: (t[0], t[0] + t[1])),
    max_size=30,
)


def _model(rs: list[tuple[int, int]]) -> set[int]:
    return {s for lo, hi in rs for s in range(lo, hi + 1)}


@given(ranges)
def test_rangeset_matches_a_plain_set(rs: list[tuple[int, int]]) -> None:
    got = RangeSet(rs)
    model = _model(rs)
    assert got.count() == len(model)
    assert {s for lo, hi in got for s in range(lo, hi + 1)} == model
    # canonical: sorted, disjoint, non-touching
    pairs = list(got)
    assert all(a[1] + 1 < b[0] for a, b in itertools.pairwise(pairs))
    for s in range(0, 230):
        assert (s in got) == (s in model)


@given(ranges, st.integers(1, 250), st.integers(0, 60))
def test_missing_is_the_complement_within_bounds(
    rs: list[tuple[int, int]], lo: int, width: int
) -> None:
    hi = lo + width
    got = RangeSet(rs).missing(lo, hi)
    assert _model(list(got)) == set(range(lo, hi + 1)) - _model(rs)


@given(ranges, ranges)
def test_difference_is_the_set_difference_in_canonical_form(
    a: list[tuple[int, int]], b: list[tuple[int, int]]
) -> None:
    got = RangeSet(a).difference(RangeSet(b))
    assert _model(list(got)) == _model(a) - _model(b)
    assert got == RangeSet(list(got))  # sorted, disjoint, non-touching


@given(ranges)
def test_text_and_json_forms_round_trip(rs: list[tuple[int, int]]) -> None:
    r = RangeSet(rs)
    assert RangeSet.parse(str(r)) == r
    assert RangeSet.from_json(r.to_json()) == r


def test_contiguous_end_contains_and_overlaps() -> None:
    r = RangeSet.parse("1-5,7-9")
    assert r.contiguous_end() == 5
    assert RangeSet.parse("2-5").contiguous_end() == 0
    r = RangeSet.parse("4-5,7-9")
    assert r.contains_range(7, 9) and not r.contains_range(5, 7)
    assert r.overlaps(6, 7) and not r.overlaps(6, 6)


@pytest.mark.parametrize("bad", ["a-3", "3-x", "5-2", "0-1", "-1"])
def test_parse_rejects_bad_text_naming_it(bad: str) -> None:
    with pytest.raises(ValueError, match="seq range"):
        RangeSet.parse(bad)


@given(ranges, ranges)
def test_update_is_the_union_whichever_way_it_merges(
    a: list[tuple[int, int]], b: list[tuple[int, int]]
) -> None:
    """``update`` merges small sets range by range and large ones in one linear pass
    (holdings with many holes); both must give the canonical union."""
    got = RangeSet(a)
    got.update(RangeSet(b))
    assert got == RangeSet([*a, *b])
    pairs = list(got)
    assert all(x[1] + 1 < y[0] for x, y in itertools.pairwise(pairs))
    assert {s for lo, hi in got for s in range(lo, hi + 1)} == _model(a) | _model(b)
