"""Routes (pure): over any graph and any set of links up, every site's route for an
entry leads to that entry along links that are up, never in a loop, and exists exactly
when the entry can be reached; with every link of a full mesh up, each site pulls each
entry from the entry itself (each record crosses into each site once)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_core.routing import Report, plan_routes

NAMES = ["hq", "sgp", "syd", "tyo", "bus", "ldn"]


@st.composite
def graphs(draw: st.DrawFn) -> tuple[dict[str, list[str]], set[tuple[str, str]]]:
    n = draw(st.integers(2, len(NAMES)))
    sites = NAMES[:n]
    graph = {s: sorted(draw(st.sets(st.sampled_from([x for x in sites if x != s])))) for s in sites}
    edges = [(s, x) for s, xs in graph.items() for x in xs]
    up = draw(st.sets(st.sampled_from(edges))) if edges else set()
    return graph, up


def reachable(graph: dict[str, list[str]], up: set[tuple[str, str]], start: str) -> set[str]:
    seen, todo = {start}, [start]
    while todo:
        x = todo.pop()
        for y in graph[x]:
            if (x, y) in up and y not in seen:
                seen.add(y)
                todo.append(y)
    return seen


@settings(max_examples=300, deadline=None)
@given(graphs())
def test_routes_follow_up_links_to_the_entry_without_loops(
    g: tuple[dict[str, list[str]], set[tuple[str, str]]],
) -> None:
    graph, up = g
    routes = {s: plan_routes(s, graph, up) for s in graph}
    for s in graph:
        can = reachable(graph, up, s)
        for entry, hop in routes[s].items():
            assert (hop is not None) == (entry in can), (s, entry, hop)
            if hop is None:
                continue
            assert (s, hop) in up and hop in graph[s]
            # follow the routes hop by hop: reach the entry within len(graph) steps
            at, steps = s, 0
            while at != entry:
                nxt = routes[at][entry]
                assert nxt is not None and (at, nxt) in up, (s, entry, at)
                at, steps = nxt, steps + 1
                assert steps <= len(graph), f"routes loop for {entry} from {s}"


def test_full_mesh_every_link_up_pulls_each_entry_from_itself() -> None:
    graph = {s: [x for x in NAMES if x != s] for s in NAMES}
    up = {(s, x) for s in graph for x in graph[s]}
    for s in graph:
        assert plan_routes(s, graph, up) == {e: e for e in NAMES if e != s}


def test_a_cut_link_routes_through_the_first_neighbour_that_reaches_the_entry() -> None:
    graph = {s: [x for x in ("a", "b", "c", "d") if x != s] for s in ("a", "b", "c", "d")}
    up = {(s, x) for s in graph for x in graph[s]} - {("b", "a")}
    assert plan_routes("b", graph, up)["a"] == "c"
    up -= {("c", "a")}
    assert plan_routes("b", graph, up)["a"] == "d"
    up -= {("d", "a")}
    assert plan_routes("b", graph, up)["a"] is None


def test_a_line_routes_through_the_middle() -> None:
    graph = {"tyo": ["hq"], "hq": ["tyo", "syd"], "syd": ["hq"]}
    up = {("tyo", "hq"), ("hq", "tyo"), ("hq", "syd"), ("syd", "hq")}
    assert plan_routes("tyo", graph, up) == {"hq": "hq", "syd": "hq"}


@given(
    st.one_of(
        st.binary(max_size=200),
        st.recursive(
            st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=5),
            lambda c: (
                st.lists(c, max_size=3)
                | st.dictionaries(st.sampled_from(["up", "version", "x"]), c, max_size=3)
            ),
            max_leaves=8,
        ).map(lambda v: json.dumps(v).encode()),
    )
)
def test_a_hostile_link_report_is_a_value_error_or_a_well_formed_report(raw: bytes) -> None:
    try:
        r = Report.decode("x", raw)
    except ValueError:
        return
    assert isinstance(r.version, int) and all(isinstance(u, str) for u in r.up)


@pytest.mark.parametrize(
    "value",
    [b'{"up": "hq", "version": 1}', b'{"up": [1], "version": 1}', b'{"version": 1}', b"[]"],
)
def test_malformed_reports_are_refused(value: bytes) -> None:
    with pytest.raises(ValueError):
        Report.decode("x", value)


def test_a_report_round_trips() -> None:
    r = Report("tyo", ("hq", "sgp"), 17)
    assert Report.decode("tyo", r.encode()) == r
    assert json.loads(r.encode()) == {"up": ["hq", "sgp"], "version": 17}
