"""One identity entered at two sites reaches every site, in any graph where every site
reaches every other and in any order of the sites' merges (review finding 4). The
merge's own planner (``plan_batch``, told each source's entry) and the real routes
(``plan_routes``) run here; the Kafka topics are lists, and a batch's records go where
``Merger._commit`` writes them (a new record to its canonical topic and its entry's
relay topic, a record relayed again to its entry's relay topic only). The same rule on
real Kafka: tests/spark_core/test_replication.py, "entered at two sites".

Before the fix a site filed a record under the entry whose copy reached it first and
dropped the other copy, so its relay topic of the other entry lacked the record; in the
review's six-site graph a site pulling those two entries from two such neighbours never
got it.

Each batch also writes a segment of the site's relay index naming the seqs it relayed,
and a site's first read of a neighbour's relay topic starts past the segments whose seqs
the merge would drop anyway (``MergeState.skips``, as ``spark_core/pull.py`` asks it):
asked "does the site hold them", the review's six-site case skipped the copy e had to
relay again under c (replication review N6).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from shorelink.contract import Record, ingress_topic, relay_topic
from shorelink.identity import Identity
from shorelink.ranges import RangeSet
from spark_core.merge_state import (
    MergeState,
    Out,
    SourceRow,
    plan_batch,
    pulled_source,
    source_entry,
)
from spark_core.relay_index import Segment, start_offsets
from spark_core.routing import plan_routes

STREAM = "nav"
#: the review's graph (site -> the sites it pulls from); f is headquarters
REVIEW_GRAPH = {
    "a": ["d", "f"],
    "b": ["e", "f"],
    "c": ["d", "e", "f"],
    "d": ["a", "c", "e", "f"],
    "e": ["b", "c", "d", "f"],
    "f": ["a", "b", "c", "d", "e"],
}
NAMES = ["a", "b", "c", "d", "e", "f", "g"]


def _record(seq: int, entry: str) -> Out:
    rec = Record(Identity("ship1", STREAM, seq), b"k", b"%d" % seq, 1, entry, "s/k")
    return ("", rec.key, rec.value, list(rec.headers()))


@dataclass
class Site:
    name: str
    graph: dict[str, list[str]]
    state: MergeState = field(default_factory=MergeState)
    ingress: list[Out] = field(default_factory=list)
    #: entry -> sl.relay.<entry>.nav, as the merge wrote it
    relays: dict[str, list[Out]] = field(default_factory=dict)
    #: its relay index: a segment per relay topic a batch wrote to, naming its seqs
    segments: list[Segment] = field(default_factory=list)

    def entry_of(self, topic: str) -> str:
        entry = source_entry(topic)
        return entry if entry in self.graph else self.name

    def routes(self) -> dict[str, str | None]:
        up = {(s, n) for s, ns in self.graph.items() for n in ns}
        return plan_routes(self.name, self.graph, up)

    def rows(self, action: str, sites: dict[str, Site]) -> list[SourceRow]:
        """What one merge batch reads: the site's ingress, or neighbour ``action``'s
        relay topics of the entries routed through it, from the site's cursors."""
        if action == self.name:
            topics = [(ingress_topic(STREAM), self.ingress)]
        else:
            n = sites[action]
            entries = [e for e, via in self.routes().items() if via == action]
            topics = [
                (pulled_source(action, "id", relay_topic(e, STREAM)), n.relays.get(e, []))
                for e in entries
            ]
            for e in entries:
                source = pulled_source(action, "id", relay_topic(e, STREAM))
                if (source, 0) not in self.state.offsets:  # a first read: past the index
                    start = start_offsets(
                        n.segments,
                        relay_topic(e, STREAM),
                        "id",
                        {0: 0},
                        self.state.skips(e, STREAM, relays=True),
                    )
                    self.state.offsets[(source, 0)] = start[0]
        return [
            SourceRow(topic, 0, offset, key, value, headers)
            for topic, records in topics
            for offset, (_, key, value, headers) in enumerate(records)
            if offset >= self.state.offsets.get((topic, 0), 0)
        ]

    def merge(self, rows: list[SourceRow]) -> None:
        """One batch, committed: ``Merger._commit``'s writes and state update."""
        plan = plan_batch(rows, self.state, self.entry_of)
        written: dict[str, list[Out]] = {}
        for record, source in [
            *zip(plan.canonical, plan.read_from, strict=True),
            *zip(plan.again, plan.again_from, strict=True),
        ]:
            written.setdefault(self.entry_of(source), []).append(record)
        for entry, records in written.items():
            relay = self.relays.setdefault(entry, [])
            seqs = RangeSet.from_seqs(int(dict(h)["sl.seq"]) for _, _, _, h in records)
            self.segments.append(
                Segment(
                    relay_topic(entry, STREAM),
                    "id",
                    {0: (len(relay), len(relay) + len(records))},
                    {"ship1": seqs},
                )
            )
            relay += records
        self.state.held.update(plan.ledger)
        self.state.relayed.update(plan.relayed)
        self.state.offsets.update(plan.offsets)

    def holds(self) -> set[int]:
        return {
            seq for lo, hi in self.state.held_for(("ship1", STREAM)) for seq in range(lo, hi + 1)
        }


def _connected(graph: dict[str, list[str]]) -> bool:
    up = {(s, n) for s, ns in graph.items() for n in ns}
    return all(None not in plan_routes(s, graph, up).values() for s in graph)


@st.composite
def graphs(draw: st.DrawFn) -> dict[str, list[str]]:
    """The review's graph, or any graph of 3 to 7 sites where every site reaches every
    other."""
    if draw(st.booleans()):
        return REVIEW_GRAPH
    sites = NAMES[: draw(st.integers(3, len(NAMES)))]
    graph = {
        s: sorted(draw(st.sets(st.sampled_from([x for x in sites if x != s]), min_size=1)))
        for s in sites
    }
    return graph if _connected(graph) else REVIEW_GRAPH


def _settle(sites: dict[str, Site]) -> None:
    """Every site's merge reads every source it has until nothing changes."""
    for _ in range(4 * len(sites)):
        busy = False
        for s, site in sorted(sites.items()):
            for action in [s, *site.graph[s]]:
                rows = site.rows(action, sites)
                busy |= bool(rows)
                site.merge(rows)
        if not busy:
            return
    raise AssertionError("the sites did not settle")


def test_the_reviews_six_site_case_reaches_b() -> None:
    """The review's order: d and e merge a's copy of X first, f merges c's first; b
    pulls a from f and c from e, whose relay topics of a and c lacked X."""
    sites = {s: Site(s, REVIEW_GRAPH) for s in REVIEW_GRAPH}
    assert sites["b"].routes()["a"] == "f" and sites["b"].routes()["c"] == "e"
    assert sites["e"].routes()["a"] == "d"
    sites["a"].ingress = [_record(1, "a")]
    sites["c"].ingress = [_record(1, "c")]
    for site, action in [("a", "a"), ("d", "a"), ("e", "d"), ("c", "c"), ("f", "c")]:
        sites[site].merge(sites[site].rows(action, sites))
    _settle(sites)
    assert {s: site.holds() for s, site in sites.items()} == {s: {1} for s in sites}
    # f holds X from c and relays a's copy under a too; e holds it from a (via d) and
    # relays c's copy under c too
    assert [len(sites["f"].relays[e]) for e in ("a", "c")] == [1, 1]
    assert [len(sites["e"].relays[e]) for e in ("a", "c")] == [1, 1]


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_an_identity_entered_at_two_sites_reaches_every_site_whatever_the_order(
    data: st.DataObject,
) -> None:
    graph = data.draw(graphs())
    names = sorted(graph)
    first, second = data.draw(st.permutations(names))[:2]
    sites = {s: Site(s, graph) for s in names}
    # seqs 1-3 entered at both (a resend after a lost answer), 10 and 20 at one each
    sites[first].ingress = [_record(q, first) for q in (1, 2, 3, 10)]
    sites[second].ingress = [_record(q, second) for q in (3, 2, 1, 20)]
    # any order of merge batches first, then every site's merge reads every source it
    # has until nothing changes (the review's order is the test above: random orders
    # rarely meet it, 4,000 examples run once did not; this one holds every order to
    # convergence and no record relayed twice under one entry)
    steps = data.draw(st.lists(st.tuples(st.sampled_from(names), st.integers(0, 6)), max_size=40))
    for site, k in steps:
        sources = [site, *graph[site]]
        sites[site].merge(sites[site].rows(sources[k % len(sources)], sites))
    _settle(sites)
    assert {s: sites[s].holds() for s in names} == {s: {1, 2, 3, 10, 20} for s in names}
    # and nothing is relayed twice under one entry
    for s in names:
        for entry, records in sites[s].relays.items():
            seqs = [int(dict(h)["sl.seq"]) for _, _, _, h in records]
            assert len(seqs) == len(set(seqs)), f"{s}: sl.relay.{entry} holds {seqs}"
