"""``shorelink-edge status`` as text: every line fits 80 columns (a terminal, or piped),
and every figure is printed whole (the rich table it replaced cut each column to an
ellipsis at 80 columns)."""

from __future__ import annotations

import re
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from edge_agent.status import render
from tests.strategies import DIGITS, LOWER, words

names = words(LOWER, LOWER + DIGITS + "_-", 62)
counts = st.integers(0, 10**15)


@st.composite
def ranges(draw: st.DrawFn) -> str:
    starts = sorted(draw(st.sets(st.integers(1, 10**9), min_size=1, max_size=40)))
    return ",".join(f"{a}-{a + draw(st.integers(0, 1000))}" for a in starts)


@st.composite
def reports(draw: st.DrawFn) -> dict[str, Any]:
    streams = {
        n: {
            "priority": draw(st.one_of(st.none(), st.integers(0, 1000))),
            "last_seq": draw(counts),
            "held": draw(st.dictionaries(names, ranges(), max_size=4)),
            "backlog_records": draw(counts),
            "backlog_bytes": draw(counts),
            "oldest_undelivered_age_s": draw(st.one_of(st.none(), st.floats(0, 1e9))),
            "sealed_records": draw(counts),
            "dropped": draw(counts),
            "rejected": draw(counts),
        }
        for n in draw(st.lists(names, min_size=1, max_size=4, unique=True))
    }
    links = [
        {
            "site": draw(names),
            "link": draw(names),
            "state": draw(st.sampled_from(["up", "down", "never tried"])),
            "last_success_age_s": draw(st.one_of(st.none(), st.floats(0, 1e7))),
            "last_error_age_s": draw(st.one_of(st.none(), st.floats(0, 1e7))),
            "last_error": draw(st.one_of(st.text(max_size=300), st.just("x" * 300))),
            "today_bytes": draw(counts),
            "daily_budget_bytes": draw(counts),
        }
        for _ in range(draw(st.integers(0, 4)))
    ]
    log = "/var/lib/shorelink/" + draw(names) + ".db"
    schema = draw(st.integers(0, 99))
    return {
        "ship": draw(names),
        "agent": draw(st.sampled_from(["0.1.0", "0.2.1.dev558+gfded72fe1.d20261129"])),
        "log": log,
        "log_schema": schema,
        "agent_schema": draw(st.integers(1, 99)),
        "log_copies": draw(st.sampled_from([{}, {str(max(0, schema - 1)): f"{log}.schema-5.bak"}])),
        "streams": streams,
        "links": links,
        "log_record_bytes": draw(counts),
        "log_budget_bytes": draw(counts),
        "log_file_bytes": draw(counts),
        "quarantined": draw(counts),
    }


@settings(max_examples=300, deadline=None)
@given(reports())
def test_every_line_fits_80_columns_and_every_figure_is_whole(report: dict[str, Any]) -> None:
    lines = render(report)
    assert all(len(line) <= 80 for line in lines), [ln for ln in lines if len(ln) > 80]
    text = " ".join(lines)
    words = set(re.split(r"[\s;:,()]+", text))
    for name, s in report["streams"].items():
        assert f"stream {name}" in text
        for k in ("last_seq", "backlog_records", "backlog_bytes", "dropped", "rejected"):
            assert str(s[k]) in words, (k, s[k])
        for r in (r for held in s["held"].values() for r in held.split(",")):
            assert r in words, r
    for g in report["links"]:
        assert str(g["today_bytes"]) in words
    assert str(report["quarantined"]) in words
    assert report["agent"] in words and str(report["log_schema"]) in words
    assert all(p in words for p in report["log_copies"].values())
