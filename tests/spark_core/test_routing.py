"""Routes (pure): over any graph and any set of links up, every site's route for an
entry leads to that entry along links that are up, never in a loop, and exists exactly
when the entry can be reached; with every link of a full mesh up, each site pulls each
entry from the entry itself (each record crosses into each site once)."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from local_stack.process import free_port
from shorelink.kafka.errors import KafkaClientError
from spark_core.config import parse_config
from spark_core.routing import (
    DOWN_AFTER_PROBES,
    FAIL_GRACE_PROBES,
    MAX_AHEAD_MS,
    MAX_HOLD_TTLS,
    MAX_VERSION,
    LinkState,
    Report,
    plan_routes,
)
from tests.spark_core.helpers import graph_doc

NAMES = ["hq", "sgp", "syd", "tyo", "bus", "ldn"]


@st.composite
def graphs(draw: st.DrawFn) -> tuple[dict[str, list[str]], set[tuple[str, str]]]:
    n = draw(st.integers(2, len(NAMES)))
    sites = NAMES[:n]
    graph = {s: sorted(draw(st.sets(st.sampled_from([x for x in sites if x != s])))) for s in sites}
    edges = [(s, x) for s, xs in graph.items() for x in xs]
    up = draw(st.sets(st.sampled_from(edges))) if edges else set()
    return graph, up


@st.composite
def graphs_with_failing(
    draw: st.DrawFn,
) -> tuple[dict[str, list[str]], set[tuple[str, str]], set[tuple[str, str]]]:
    graph, up = draw(graphs())
    failing = draw(st.sets(st.sampled_from(sorted(up)))) if up else set()
    return graph, up, failing


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


@settings(max_examples=300, deadline=None)
@given(graphs_with_failing())
def test_failing_links_are_a_last_resort_and_routes_still_never_loop(
    g: tuple[dict[str, list[str]], set[tuple[str, str]], set[tuple[str, str]]],
) -> None:
    """Finding 11: a route avoids an edge whose puller keeps failing wherever a path of
    healthy edges exists, still reaches every entry reachable at all, and never loops."""
    graph, up, failing = g
    healthy = up - failing
    routes = {s: plan_routes(s, graph, up, failing) for s in graph}
    for s in graph:
        can = reachable(graph, up, s)
        can_healthily = reachable(graph, healthy, s)
        for entry, hop in routes[s].items():
            assert (hop is not None) == (entry in can), (s, entry, hop)
            if hop is None:
                continue
            at, steps, path = s, 0, []
            while at != entry:
                nxt = routes[at][entry]
                assert nxt is not None and (at, nxt) in up, (s, entry, at)
                path.append((at, nxt))
                at, steps = nxt, steps + 1
                assert steps <= len(graph), f"routes loop for {entry} from {s}"
            if entry in can_healthily:
                assert not set(path) & failing, (s, entry, path)


def test_a_failing_transit_is_routed_around_and_used_when_nothing_else_leads_there() -> None:
    ring = {"a": ["b", "d"], "b": ["a", "c"], "c": ["b", "d"], "d": ["a", "c"]}
    up = {(s, x) for s in ring for x in ring[s]}
    assert plan_routes("a", ring, up)["c"] == "b"  # the name tie-break
    assert plan_routes("a", ring, up, {("b", "c")})["c"] == "d"
    assert plan_routes("b", ring, up, {("b", "c")})["c"] == "a"
    # d cannot reach c either: the failing edge is all there is
    assert plan_routes("a", ring, up - {("d", "c")}, {("b", "c")})["c"] == "b"


def _link_state(tmp_path: Path) -> LinkState:
    doc = graph_doc(
        {"a": ["b", "c"], "b": ["a"], "c": ["a"]},
        tmp_path,
        {"probe_interval": "1s", "report_ttl": "10s"},
    )
    cfg = parse_config(doc, base=tmp_path)
    links = LinkState(cfg, cfg.site("a"))
    for link in links.links.values():
        link.up = True
    return links


def test_a_neighbour_is_routed_around_only_after_two_probes_in_a_row_found_it_down(
    tmp_path: Path,
) -> None:
    """A real probe of a Kafka that does not answer (nothing listens on the neighbour's
    port): the first miss keeps the link in the routes (a slow answer or a neighbour
    starting a moment later is no outage), the second takes it out; an answer (here:
    the probe's state as an answer leaves it) puts it back at once."""
    doc = graph_doc({"a": ["b"], "b": ["a"]}, tmp_path, {"probe_timeout": "300ms"})
    doc["sites"]["b"]["kafka"]["bootstrap"] = f"127.0.0.1:{free_port()}"
    cfg = parse_config(doc, base=tmp_path)
    links = LinkState(cfg, cfg.site("a"))
    b = links.links["b"]
    assert links.edges()[0] == set()  # never probed: not a route
    try:
        for miss in range(1, DOWN_AFTER_PROBES + 1):
            links._probe(b)
            assert not b.up and b.missed == miss and b.status()["state"] == "down"
            assert (("a", "b") in links.edges()[0]) == (miss < DOWN_AFTER_PROBES), miss
        assert links.routes() == {"b": None}
        b.up, b.missed = True, 0  # what a probe that is answered sets
        assert links.routes() == {"b": "b"}
    finally:
        links.close()


def test_a_silent_neighbour_is_found_down_within_the_probe_timeout_while_its_pullers_ask_it(
    tmp_path: Path,
) -> None:
    """The probe asks through the one admin client its neighbour's pullers and repairers
    use (``SharedAdmin``, made with the probe timeout): a neighbour that takes
    connections and never answers (a listening socket nothing reads) is found down by
    each probe within that timeout, though their describes wait on the same client."""
    timeout = 0.3
    with socket.create_server(("127.0.0.1", 0)) as silent:
        doc = graph_doc({"a": ["b"], "b": ["a"]}, tmp_path, {"probe_timeout": f"{timeout}s"})
        doc["sites"]["b"]["kafka"]["bootstrap"] = f"127.0.0.1:{silent.getsockname()[1]}"
        cfg = parse_config(doc, base=tmp_path)
        links = LinkState(cfg, cfg.site("a"))
        b = links.links["b"]
        done = threading.Event()

        def pullers_ask() -> None:
            while not done.is_set():
                with contextlib.suppress(KafkaClientError):
                    b.admin().describe({"sl.relay.c.s"})

        asking = threading.Thread(target=pullers_ask, daemon=True)
        asking.start()
        try:
            for miss in range(1, DOWN_AFTER_PROBES + 1):
                started = time.monotonic()
                links._probe(b)
                took = time.monotonic() - started
                assert not b.up and b.missed == miss, b.error
                assert took < timeout + 1.0, took  # the timeout, and room for a busy machine
        finally:
            done.set()
            asking.join(10)
            links.close()
    assert not asking.is_alive()


def test_a_neighbour_whose_pullers_keep_failing_is_held_for_longer_each_time(
    tmp_path: Path,
) -> None:
    """Held after FAIL_GRACE_PROBES probe intervals of failure, for a report TTL, then
    twice that if it fails again at once, up to MAX_HOLD_TTLS; a TTL of pulling without
    failure starts again from one. Only the failing neighbour is held."""
    links = _link_state(tmp_path)
    # a whole second, so that its sums with the holds are exact (a raw monotonic reading
    # is not: 40.00000000000023 on a machine up for 20 minutes); status() reads the clock
    t = float(int(time.monotonic()))
    links.note_pulls({"b": (t, "denied")}, now=t + FAIL_GRACE_PROBES - 0.5)
    assert links.edges(t + 3)[1] == set()  # not yet: failing for less than the grace
    t += FAIL_GRACE_PROBES
    holds = []
    for _ in range(6):
        links.note_pulls({"b": (t - FAIL_GRACE_PROBES, "denied")}, now=t)
        link = links.links["b"]
        holds.append(link.held_until - t)
        assert links.edges(t)[1] == {("a", "b")}
        assert link.status()["pull_error"] == "denied"
        t = link.held_until
        assert links.edges(t)[1] == set()  # the hold is over: tried again
        t += FAIL_GRACE_PROBES  # ... and failing again, for the grace
    assert holds == [10, 20, 40, 80, 80, 80]
    assert MAX_HOLD_TTLS == 8
    links.note_pulls({}, now=t + 10)  # a TTL without failure
    links.note_pulls({"b": (t + 10, "denied")}, now=t + 10 + FAIL_GRACE_PROBES)
    assert links.links["b"].held_until - (t + 10 + FAIL_GRACE_PROBES) == 10
    assert links.links["c"].held_until == 0.0
    # pullers failing while the probe finds the link down: no hold, no strike (the
    # link is routed around already; an outage must not lengthen the next hold)
    links.links["c"].up = False
    links.note_pulls({"c": (t, "connection refused")}, now=t + 100)
    assert links.links["c"].held_until == 0.0 and links.links["c"].strikes == 0
    # ... nor right after it is back up: the grace starts then
    links.links["c"].up = True
    links.note_pulls({"c": (t, "connection refused")}, now=t + 101)
    assert links.links["c"].held_until == 0.0
    links.note_pulls({"c": (t, "connection refused")}, now=t + 100 + FAIL_GRACE_PROBES)
    assert links.links["c"].held_until == t + 100 + FAIL_GRACE_PROBES + 10


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
                | st.dictionaries(st.sampled_from(["up", "version", "failing", "x"]), c, max_size=4)
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
    assert isinstance(r.version, int) and all(isinstance(u, str) for u in r.up + r.failing)


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
    failing = Report("tyo", ("hq", "sgp"), 18, ("sgp",))
    assert Report.decode("tyo", failing.encode()) == failing
    assert json.loads(failing.encode())["failing"] == ["sgp"]


def test_a_link_report_version_beyond_a_day_ahead_is_refused_and_a_stale_one_gives_way(
    tmp_path: Path,
) -> None:
    """Review N5: versions are unsigned, so a site must never hold one its subject cannot
    write above. A version more than MAX_AHEAD_MS ahead of the reader's clock is refused
    (of another site, and of itself: a keeps its own version); one within the bound that
    the subject did not adopt (their clocks differ) holds only while fresh: once stale
    for report_ttl, any other version of that site replaces it."""
    links = _link_state(tmp_path)  # a, neighbours b and c, report_ttl 10 s
    now_ms = int(time.time() * 1000)
    t = time.monotonic()
    links._learn([Report("b", ("a",), now_ms)], now=t)
    links._learn([Report("b", (), MAX_VERSION), Report("a", (), MAX_VERSION)], now=t)
    assert links.reports["b"].version == now_ms and links._version < now_ms + 60_000
    ahead = now_ms + MAX_AHEAD_MS - 60_000  # within a's bound, beyond b's clock
    links._learn([Report("b", (), ahead)], now=t + 1)
    links._learn([Report("b", ("a",), now_ms + 2000)], now=t + 2)
    assert links.reports["b"].version == ahead  # fresh: the order holds
    links._learn([Report("b", ("a",), now_ms + 12_000)], now=t + 12)
    assert links.reports["b"].version == now_ms + 12_000  # stale: b's own again
    assert links.edges(t + 12)[0] >= {("b", "a")}
