"""shorelink/textout.py: whatever the rows, every line fits the width and every figure
is printed whole. A table that overflows 80 columns wraps into noise in a terminal, and
one cut to fit hides the very number an operator asked for (a gap, a lag)."""

from __future__ import annotations

import re
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shorelink.textout import INDENT, block, table, terminal_width, wrap
from tests.strategies import DIGITS, LOWER, words

names = words(LOWER, LOWER + DIGITS + "_:.-", 62)
figures = st.integers(0, 10**15).map(str)
labels = st.from_regex(r"[a-z][a-z ]{0,14}[a-z]", fullmatch=True)


@st.composite
def ranges(draw: st.DrawFn) -> str:
    starts = sorted(draw(st.sets(st.integers(1, 10**12), min_size=1, max_size=40)))
    return ",".join(f"{a}-{a + draw(st.integers(0, 1000))}" for a in starts)


cells = st.one_of(names, figures, ranges(), st.just(""), st.just("-"))


def _digits(text: str) -> Counter[str]:
    return Counter(re.findall(r"\d+", text))


def _fits_and_whole(lines: list[str], width: int, cells: list[str]) -> None:
    assert all(len(line) <= width for line in lines), [ln for ln in lines if len(ln) > width]
    # every word that fits a line at the deepest indent a layout uses is printed whole (a
    # longer one, a 63-character name at 40 columns, cannot be); a figure split over two
    # lines would count as two other figures
    room = width - 2 * len(INDENT)
    words = [w for cell in cells for w in re.split(r"[\s,]+", cell) if 0 < len(w) <= room]
    assert _digits("\n".join(lines)) >= _digits("\n".join(words))
    for word in words:
        assert any(word in line for line in lines), word


@st.composite
def tables(draw: st.DrawFn) -> tuple[list[str], list[list[str]]]:
    n = draw(st.integers(1, 7))
    header = draw(st.lists(labels, min_size=n, max_size=n))
    rows = draw(st.lists(st.lists(cells, min_size=n, max_size=n), max_size=8))
    return header, rows


@settings(max_examples=400, deadline=None)
@given(tables(), st.sampled_from([40, 80, 120]))
def test_a_table_fits_the_width_and_keeps_every_figure_whole(
    t: tuple[list[str], list[list[str]]], width: int
) -> None:
    header, rows = t
    lines = table(header, rows, width, right={1})
    _fits_and_whole(lines, width, [c for r in rows for c in r])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(names, figures, ranges()), max_size=20), names)
def test_a_block_fits_80_columns_and_keeps_every_figure_whole(fields: list[str], head: str) -> None:
    lines = block(head, [f"seqs {f}" for f in fields], 80)
    _fits_and_whole(lines, 80, [head, *fields])


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400), st.integers(10, 100))
def test_any_text_wraps_within_the_width_and_loses_no_character(text: str, width: int) -> None:
    lines = wrap(text, width, "  ", "    ")
    assert all(len(line) <= width for line in lines)
    assert "".join("".join(lines).split()) == "".join(text.split())


def test_columns_when_they_fit() -> None:
    lines = table(["origin", "gaps"], [["bigblue", "3"], ["redstar", "12"]], 80, right={1})
    assert lines == ["origin   gaps", "bigblue     3", "redstar    12"]


def test_the_long_last_column_goes_under_its_row() -> None:
    gaps = ",".join(f"{n}-{n + 5}" for n in range(100_000, 101_000, 10))
    lines = table(["origin", "gaps", "gap ranges"], [["bigblue", "600", gaps]], 80)
    assert lines[:2] == ["origin   gaps", "bigblue  600"]
    assert lines[2].startswith("  gap ranges: 100000-100005,100010-100015,")
    assert all(ln.startswith("    ") for ln in lines[3:])


def test_rows_too_wide_for_columns_become_blocks_and_a_blank_head_continues_the_group() -> None:
    x, y = "x" * 40, "y" * 40
    lines = table(["who", "what", "how", "why"], [["a", x, y, "1"], ["", "b", "", "2"]], 80)
    assert lines == ["a", f"  what: {x}", f"  how: {y}   why: 1", "a", "  what: b   why: 2"]


def test_a_range_list_breaks_after_a_comma_never_inside_a_range() -> None:
    assert wrap("held 1-100,200-300,400-500", 16) == ["held 1-100,", "200-300,400-500"]


def test_a_word_longer_than_a_line_is_cut_after_a_slash_or_before_a_figure() -> None:
    assert wrap("/var/lib/shorelink/x.db", 15) == ["/var/lib/", "shorelink/x.db"]
    assert wrap("ship-abc-123456789", 15) == ["ship-abc-", "123456789"]


def test_width_follows_the_terminal_within_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "132")
    assert terminal_width() == 132
    monkeypatch.setenv("COLUMNS", "1000")
    assert terminal_width() == 160
    monkeypatch.setenv("COLUMNS", "20")
    assert terminal_width() == 40
