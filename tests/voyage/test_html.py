"""The report page and the summary are what a reader of a voyage sees: they must show
every figure the verdict rests on, work offline (one file, nothing fetched), never let a
string from the report become markup, and never crash on a report that is partial
because the voyage failed."""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.voyage.sample_report import failed_report, minimal_report, sample_report
from voyage.html import render_html, write_report
from voyage.summary import summary_text

PNG = b"\x89PNG\r\n\x1a\n"
IMG = re.compile(r'<img[^>]*src="data:image/png;base64,([A-Za-z0-9+/=]+)"')


def _pngs(page: str) -> list[bytes]:
    return [base64.b64decode(m, validate=True) for m in IMG.findall(page)]


def test_page_is_self_contained_so_it_opens_on_a_ship_without_internet() -> None:
    page = render_html(sample_report())
    assert page.startswith("<!doctype html>")
    for banned in ('src="http', "src='http", "<link", "<script", "url(", "@import"):
        assert banned not in page
    assert page.count("<img") == len(IMG.findall(page))


def test_every_chart_is_an_embedded_png_that_decodes() -> None:
    page = render_html(sample_report())
    pngs = _pngs(page)
    # alert bars, records, backlog, link timeline, route map
    assert len(pngs) == 5
    assert all(p.startswith(PNG) for p in pngs)
    assert len(page) < 3_000_000


def test_pass_verdict_and_every_sites_figures_are_shown() -> None:
    r = sample_report()
    page = render_html(r)
    assert "verdict pass" in page and "PASS" in page and "FAIL" not in page
    for name, s in r["sites"].items():
        assert f"<td>{name}" in page or f">{name}</span>" in page
        assert f"{s['held']:,}" in page
        assert f"{s['latency_s']['p50']:.1f} s" in page
        assert f"{s['latency_s']['p99']:.1f} s" in page
    assert "BBLU1234565" in page and "40.1 s" in page and "-3.5 s" in page
    assert "20,000,000" in page  # satellite budget
    # the overboard alert hop by hop
    for hop in r["alert"]["timeline"]:
        assert f"<td>{html.escape(hop['hop'])}</td><td>{hop['after_s']:.1f} s</td>" in page


def test_fail_verdict_lists_every_problem() -> None:
    r = failed_report()
    page = render_html(r)
    assert "verdict fail" in page and "verdict pass" not in page
    for p in r["problems"]:
        assert p in page
    assert "51,988" in page


def test_strings_from_the_report_cannot_inject_markup() -> None:
    r = failed_report()
    evil = "<x>&\"'"
    r["problems"].append("<script>alert(1)</script>")
    r["alert"]["containers"] = [evil]
    r["container_history"]["container"] = evil
    r["container_history"]["rows"][0]["door"] = "<b>open</b>"
    r["run"]["command"] = "shorelink demo </p><img src=http://x>"
    r["sites"]["<i>site</i>"] = r["sites"].pop("hq")
    page = render_html(r)
    for raw in ("<x>", "<script>", "<b>open</b>", "<i>site</i>", "<img src=http"):
        assert raw not in page
    assert "&lt;x&gt;&amp;" in page and "&lt;script&gt;" in page


def test_minimal_report_of_a_failed_run_renders() -> None:
    page = render_html(minimal_report())
    assert "verdict fail" in page
    assert "no overboard event" in page
    assert _pngs(page) == []
    text = summary_text(minimal_report())
    assert text.splitlines()[0].startswith("FAIL")


def test_write_report_replaces_the_page_atomically(tmp_path: Path) -> None:
    (tmp_path / "report.html").write_text("old")
    path = write_report(sample_report(), tmp_path)
    assert path == tmp_path / "report.html"
    assert path.read_text(encoding="utf-8").startswith("<!doctype html>")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]


def test_summary_starts_with_the_verdict_and_fits_80_columns() -> None:
    r = sample_report()
    text = summary_text(r)
    lines = text.splitlines()
    assert lines[0] == "PASS: every site holds every record exactly once"
    assert all(len(line) <= 80 for line in lines)
    for name, s in r["sites"].items():
        row = next(line for line in lines if line.startswith(name + " "))
        assert str(s["held"]) in row and str(s["produced"]) in row
        assert f"{s['latency_s']['p50']:.1f}s" in row and f"{s['latency_s']['p99']:.1f}s" in row
    assert "ship3" in text and "8.2s" in text and "3.1s" in text
    assert "40.1s early" in text
    assert "1.0MB" in text and "4.8MB" in text


def test_summary_of_a_failure_lists_its_problems() -> None:
    r = failed_report()
    r["problems"].append("x" * 200)
    lines = summary_text(r).splitlines()
    assert lines[0].startswith("FAIL: singapore lacks 12 records")
    assert any("sydney holds ship1/nav seq 17 twice" in line for line in lines)
    assert all(len(line) <= 80 for line in lines)


_num = st.one_of(st.none(), st.integers(0, 10**9), st.floats(-1e6, 1e6, allow_nan=False))
_name = st.text(min_size=0, max_size=30)


@st.composite
def _reports(draw: Any) -> dict[str, Any]:
    r = sample_report()
    r["ok"] = draw(st.booleans())
    r["problems"] = draw(st.lists(_name, max_size=3))
    r["sites"] = {
        draw(_name): {
            "produced": draw(_num),
            "held": draw(_num),
            "duplicates": draw(_num),
            "latency_s": draw(st.one_of(st.none(), st.fixed_dictionaries({"p50": _num}))),
        }
        for _ in range(draw(st.integers(0, 4)))
    }
    for key in ("alert", "port_calls", "links", "container_history", "series"):
        if draw(st.booleans()):
            del r[key]
    series = r.get("series")
    if series is not None:
        for key in list(series):
            choice = draw(st.sampled_from(["keep", "drop", "empty"]))
            if choice == "drop":
                del series[key]
            elif choice == "empty":
                series[key] = type(series[key])()
    if "alert" in r and draw(st.booleans()):
        r["alert"]["sites"] = {draw(_name): {"latency_s": draw(_num)}}
        r["alert"]["position"] = None
    return r


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_reports())
def test_any_partial_report_renders_and_summarises(report: dict[str, Any]) -> None:
    page = render_html(report)
    assert all(p.startswith(PNG) for p in _pngs(page))
    assert all(len(line) <= 80 for line in summary_text(report).splitlines())


def test_a_malformed_series_costs_only_its_chart() -> None:
    r = sample_report()
    r["series"]["links"]["ship1"][0] = {"link": "satellite", "to_s": 3.0}
    page = render_html(r)
    assert "chart not drawn: KeyError" in page
    assert len(_pngs(page)) == 4
