"""``shorelink audit`` as text (shorelink/cli.py): every line fits 80 columns (a
terminal, or piped) and every figure is whole. The old fixed-width columns ran a long
ship name or gap list past the edge, and the gap list is the answer an operator runs
the audit for. The audit of a real Kafka is tested in test_audit.py; these build the
results it returns."""

from __future__ import annotations

import re
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from shorelink.cli import render_audit, render_sites_audit
from shorelink.kafka.audit import SitesAudit, SiteStreamAudit, SourceAudit
from shorelink.ranges import RangeSet
from tests.strategies import DIGITS, LOWER, words

names = words(LOWER, LOWER + DIGITS + "_-", 62)


@st.composite
def seqs(draw: st.DrawFn) -> RangeSet:
    """Held seqs of a source with up to 20 holes (over 600 characters: lines to break),
    seqs up to 15 digits."""
    out = RangeSet()
    lo = draw(st.integers(1, 10**14))
    for _ in range(draw(st.integers(1, 20))):
        hi = lo + draw(st.integers(0, 10**6))
        out.add_range(lo, hi)
        lo = hi + draw(st.integers(2, 10**6))
    return out


@st.composite
def sources(draw: st.DrawFn) -> SourceAudit:
    src = SourceAudit(draw(names), draw(names), draw(seqs()))
    src.duplicates = draw(st.integers(0, 10**15))
    return src


def _check(lines: list[str], figures: list[object], ranges: list[RangeSet]) -> None:
    assert all(len(line) <= 80 for line in lines), [ln for ln in lines if len(ln) > 80]
    # a figure split over two lines would count as two other figures
    shown = Counter(re.findall(r"\d+", "\n".join(lines)))
    assert shown >= Counter(re.findall(r"\d+", " ".join(map(str, figures))))
    tokens = {t for line in lines for t in re.split(r"[\s,:]+", line)}
    for r in ranges:
        for part in filter(None, str(r).split(",")):
            assert part in tokens, part  # a range whole on some line


@settings(max_examples=200, deadline=None)
@given(st.lists(sources(), max_size=6), st.integers(0, 10**15), names)
def test_the_site_audit_fits_80_columns_and_every_gap_is_whole(
    results: list[SourceAudit], malformed: int, site: str
) -> None:
    lines = render_audit(site, results, malformed, ok=False, width=80)
    figures = [malformed, *(f for r in results for f in (r.identities, r.duplicates))]
    _check(lines, figures + [r.gaps.count() for r in results], [r.gaps for r in results])
    for r in results:
        assert r.origin in text_words(lines) and r.stream in text_words(lines)


def text_words(lines: list[str]) -> set[str]:
    return set(re.split(r"[\s,:]+", "\n".join(lines)))


def test_a_short_audit_is_one_table() -> None:
    src = SourceAudit("bigblue", "containers", RangeSet.parse("1-3,5-6"))
    src.add(3)
    lines = render_audit("tokyo", [src], 0, ok=False, width=80)
    assert lines == [
        "site tokyo: 1 sources, 0 malformed records",
        "origin   stream      identities  duplicates  gaps  gap ranges",
        "bigblue  containers           5           1     1  4",
        "NOT OK: duplicates or gaps found",
    ]


@st.composite
def site_streams(draw: st.DrawFn) -> SiteStreamAudit:
    r = SiteStreamAudit(draw(names), draw(names), present=draw(st.booleans()))
    for origin in draw(st.lists(names, max_size=3, unique=True)):
        r.sources[origin] = SourceAudit(origin, r.stream, draw(seqs()))
        r.sources[origin].duplicates = draw(st.integers(0, 10**15))
        r.sources[origin].duplicated = draw(seqs())
        r.missing[origin] = draw(seqs())
    r.malformed = draw(st.integers(0, 10**15))
    return r


@settings(max_examples=200, deadline=None)
@given(st.lists(site_streams(), max_size=5))
def test_the_all_sites_audit_fits_80_columns_and_every_missing_seq_is_whole(
    results: list[SiteStreamAudit],
) -> None:
    lines = render_sites_audit(SitesAudit(results), width=80)
    figures = [f for r in results for f in (r.records, r.identities, r.duplicates, r.missing_count)]
    figures += [r.malformed for r in results if r.malformed]  # named as a problem
    ranges = [m for r in results for m in r.missing.values()]
    ranges += [s.duplicated for r in results for s in r.sources.values() if s.duplicates]
    _check(lines, figures, ranges)
    for r in results:
        if not r.present:
            assert f"no canonical topic sl.{r.stream} at {r.site}" in " ".join(lines)
