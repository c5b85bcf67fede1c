"""The voyage's figures, computed from what was observed (``report.json``; the HTML page
and the text summary are drawn from it by :mod:`voyage.html` and :mod:`voyage.summary`).

The verdict is strict about what the system promises: a site that lacks an identity a
ship produced, holds one twice, or has a gap fails the run, and so does an overboard
alert that did not reach every site. How fast is measured against goals, reported
apart (``goals_missed``) and shown on the page, but does not fail the run: a port that
held a ship's earlier data only after the ship docked, an alert slower than
:data:`ALERT_GOAL_S`. Speed depends on the machine; correctness does not.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from voyage.customers import problems as customer_problems
from voyage.observe import Arrival, EdgeSample, Ident
from voyage.ops import problems as ops_problems
from voyage.topology import HQ, PORTS, SATELLITE, SITES, STREAMS, WIFI, ship_link

__all__ = ["ALERT_GOAL_S", "Observed", "build_report", "percentile"]

#: "the alert reaches every office in seconds"
ALERT_GOAL_S = 10.0


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return round(ordered[rank - 1], 3)


@dataclass
class Observed:
    """Everything the run saw, handed to :func:`build_report`."""

    plan: Any  # fleet_sim.plan.VoyagePlan
    ships: list[str]
    started: str
    wall_s: float
    command: str
    dir: str
    arrivals: dict[str, dict[Ident, Arrival]]  # site -> identity -> arrival
    duplicates: dict[str, int]  # site -> identities seen more than once
    edge: dict[str, EdgeSample]  # ship -> last metrics read
    fleet: dict[str, dict[str, Any]]  # ship -> last stats event of the simulator
    link_bytes: dict[str, int]  # proxy -> bytes both ways
    overboard: dict[str, Any] | None  # the simulator's overboard event
    timeline: dict[str, list[list[Any]]]
    site_outages: list[dict[str, Any]]
    series_records: dict[str, list[list[float]]]
    series_backlog: dict[str, list[list[float]]]
    tracks: dict[str, list[list[float]]]
    history: dict[str, Any] | None = None
    audit: dict[str, Any] | None = None
    #: the followed customer's consumer (voyage/customers.py)
    customer: dict[str, Any] | None = None
    #: headquarters' operations page at the end (voyage/ops.py)
    ops: dict[str, Any] | None = None
    problems: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    #: headquarters' fleet registry: its rollouts and what the ships fetched
    #: (voyage/fleet.py ``FleetScenario.summary``)
    registry: dict[str, Any] | None = None


def _produced(edge: Mapping[str, EdgeSample]) -> set[Ident]:
    return {
        (ship, stream, seq)
        for ship, sample in edge.items()
        for stream, last in sample.last_seq.items()
        for seq in range(1, last + 1)
    }


def _created_s(plan: Any, a: Arrival) -> float:
    """When a record was made, in wall seconds since the start: event times of the
    simulator's messages are voyage time; AIS lines carry the ship's receive time."""
    if a.mqtt_topic.endswith("/nav/ais"):
        return float(a.ts_ms / 1000 - plan.start_wall)
    return float(plan.wall_offset(a.ts_ms / 1000))


def _gaps(held: set[int]) -> int:
    """Holes below the highest seq held (ranges missing between 1 and max)."""
    if not held:
        return 0
    ordered = sorted(held)
    holes = 1 if ordered[0] > 1 else 0
    return holes + sum(1 for a, b in itertools.pairwise(ordered) if b > a + 1)


def _site_figures(o: Observed, produced: set[Ident]) -> tuple[dict[str, Any], list[str]]:
    out: dict[str, Any] = {}
    problems: list[str] = []
    for site in SITES:
        arr = o.arrivals.get(site, {})
        held = set(arr) & produced
        missing = produced - held
        extra = set(arr) - produced
        by_source: dict[tuple[str, str], set[int]] = {}
        for origin, stream, seq in arr:
            by_source.setdefault((origin, stream), set()).add(seq)
        gaps = sum(_gaps(seqs) for seqs in by_source.values())
        lat = [a.at_s - _created_s(o.plan, a) for i, a in arr.items() if i in produced]
        per_stream = {}
        for stream in STREAMS:
            p = sum(1 for i in produced if i[1] == stream)
            h = sum(1 for i in held if i[1] == stream)
            sl = [a.at_s - _created_s(o.plan, a) for i, a in arr.items() if i[1] == stream]
            per_stream[stream] = {
                "produced": p,
                "held": h,
                "latency_s": {"p50": percentile(sl, 50), "p99": percentile(sl, 99)},
            }
        dups = o.duplicates.get(site, 0)
        out[site] = {
            "produced": len(produced),
            "held": len(held),
            "duplicates": dups,
            "gaps": gaps,
            "missing": len(missing),
            "unexpected": len(extra),
            "latency_s": {"p50": percentile(lat, 50), "p99": percentile(lat, 99), "n": len(lat)},
            "per_stream": per_stream,
        }
        if missing:
            sample = sorted(missing)[:3]
            problems.append(f"{site} lacks {len(missing)} records, e.g. {sample}")
        if dups:
            problems.append(f"{site} holds {dups} records twice")
        if gaps:
            problems.append(f"{site} has {gaps} gaps in its seqs")
        if extra:
            problems.append(f"{site} holds {len(extra)} records no ship reported producing")
    return out, problems


def _manifest_event(payload: bytes) -> str | None:
    try:
        body = json.loads(payload)
    except ValueError:
        return None
    return body.get("event") if isinstance(body, dict) else None


def _port_calls(o: Observed) -> tuple[list[dict[str, Any]], list[str]]:
    """Per call at a port after the first: how long before docking the port held the
    ship's departure manifest and everything the ship uploaded at earlier ports."""
    calls: list[dict[str, Any]] = []
    problems: list[str] = []
    union: dict[Ident, Arrival] = {}
    for arr in o.arrivals.values():
        for i, a in arr.items():
            union.setdefault(i, a)
    for ship_plan in o.plan.ships:
        ship = ship_plan.name
        earlier: list[str] = []
        for phase in ship_plan.phases:
            if phase.kind != "port":
                continue
            port = str(phase.port)
            if not earlier:
                earlier.append(port)
                continue
            docked = float(phase.start_s)
            docked_sim_ms = o.plan.sim_time(docked) * 1000
            at_port = o.arrivals.get(port, {})
            uploaded = [i for i, a in union.items() if i[0] == ship and a.entry in earlier]
            # the manifest the ship sent when it left its last port (not the one it
            # publishes on arrival here)
            cargo = [
                i
                for i, a in union.items()
                if i[0] == ship
                and i[1] == "cargo"
                and a.ts_ms < docked_sim_ms
                and _manifest_event(a.payload) == "departure"
            ]
            manifest = max(cargo, key=lambda i: union[i].ts_ms) if cargo else None
            manifest_s = at_port[manifest].at_s if manifest in at_port else None
            held = [at_port[i].at_s for i in uploaded if i in at_port]
            earlier_s = max(held) if held and len(held) == len(uploaded) else None
            ready = None
            if manifest_s is not None and earlier_s is not None:
                ready = max(manifest_s, earlier_s)
            lead = round(docked - ready, 2) if ready is not None else None
            ok = lead is not None and lead > 0
            calls.append(
                {
                    "ship": ship,
                    "port": port,
                    "docked_s": round(docked, 2),
                    "manifest_s": manifest_s and round(manifest_s, 2),
                    "earlier_data_s": earlier_s and round(earlier_s, 2),
                    "lead_s": lead,
                    "earlier_records": len(uploaded),
                    "ok": ok,
                }
            )
            if not ok:
                problems.append(
                    f"{port} held {ship}'s manifest and earlier data only after it docked"
                    + (f" ({-lead:.1f}s late)" if lead is not None else " (never)")
                )
            earlier.append(port)
    return calls, problems


def _alert(o: Observed) -> tuple[dict[str, Any] | None, list[str], list[str]]:
    ev = o.overboard
    if not ev:
        return None, ["the overboard event did not happen"], []
    ship = ev["ship"]
    boxes = set(ev.get("containers", []))
    event_s = float(ev["t"])
    sites: dict[str, Any] = {}
    problems = []
    slow = []
    raised = None
    first_alert: tuple[float, Ident, Arrival] | None = None  # the first at any site
    for site in SITES:
        arrived = []
        for ident, a in o.arrivals.get(site, {}).items():
            if ident[0] != ship or ident[1] != "alerts" or a.key not in boxes:
                continue
            if _overboard_body(a) is not None:
                arrived.append(a.at_s)
                if first_alert is None or a.at_s < first_alert[0]:
                    first_alert = (a.at_s, ident, a)
        first = min(arrived) if arrived else None
        sites[site] = {
            "latency_s": round(first - event_s, 2) if first is not None else None,
            "all_s": round(max(arrived) - event_s, 2) if len(arrived) == len(boxes) else None,
            "alerts": len(arrived),
        }
        if first is None:
            problems.append(f"the overboard alert never reached {site}")
        elif len(arrived) < len(boxes):
            problems.append(f"{site} got {len(arrived)} of {len(boxes)} overboard alerts")
        if first is not None:
            raised = first if raised is None else min(raised, first)
            if first - event_s > ALERT_GOAL_S:
                slow.append(
                    f"the overboard alert reached {site} after {first - event_s:.1f}s "
                    f"(goal: {ALERT_GOAL_S:.0f}s)"
                )
    return (
        {
            "ship": ship,
            "containers": sorted(boxes),
            "event_s": round(event_s, 2),
            "first_site_s": raised and round(raised, 2),
            "position": ev.get("position"),
            "sites": sites,
            "timeline": first_alert and _hops(o, first_alert[1], first_alert[2], event_s),
            "goal_s": ALERT_GOAL_S,
        },
        problems,
        slow,
    )


def _overboard_body(a: Arrival) -> dict[str, Any] | None:
    try:
        body = json.loads(a.payload)
    except ValueError:
        return None
    return body if isinstance(body, dict) and body.get("alarm") == "overboard" else None


def _hops(o: Observed, ident: Ident, a: Arrival, event_s: float) -> list[dict[str, Any]]:
    """One overboard alert's way, hop by hop, in seconds from the overboard event: the
    shock and the silence that raised it on the ship (the alert's own event time and
    ``silence_s`` in voyage time: the earliest the agent could raise it), when the
    gateway of its entry site wrote it into Kafka (``sl.entered``), when each site's
    merge wrote it (the entry site's first). Each hop with its own cost (``took_s``). The clocks are
    one machine's in the voyage; at sea they are the ship's and each site's."""
    body = _overboard_body(a) or {}
    hops: list[tuple[str, float | None]] = [("overboard", event_s)]
    ts, silence = body.get("ts"), body.get("silence_s")
    if isinstance(ts, int | float) and isinstance(silence, int | float):
        # the silence after the shock, in wall seconds (voyage time runs `speed` times
        # faster), from when the simulator published the shock: not the shock's own
        # voyage time mapped to the plan's wall clock, which a simulator running behind
        # its plan on a loaded machine put before the event it raised on (-0.28 s)
        quiet = o.plan.wall_offset(ts / 1000 + silence) - o.plan.wall_offset(ts / 1000)
        hops.append(("raised on the ship (shock + silence)", event_s + quiet))
    hops.append((f"written at {a.entry}'s gateway", a.entered_s))
    # the entry site's merge first, then the others in the order they merged it
    merged = sorted(
        (
            (site, got.at_s)
            for site in SITES
            if (got := o.arrivals.get(site, {}).get(ident)) is not None
        ),
        key=lambda sa: (sa[0] != a.entry, sa[1], sa[0]),
    )
    hops += [(f"merged at {site}", at) for site, at in merged]
    out: list[dict[str, Any]] = []
    before: float | None = None
    for what, at in hops:
        since = None if at is None else round(at - event_s, 2)
        took = None if at is None or before is None else round(at - before, 2)
        out.append({"hop": what, "after_s": since, "took_s": took})
        before = at if at is not None else before
    return out


def _links(o: Observed) -> dict[str, Any]:
    out = {}
    for ship in o.ships:
        stats = o.fleet.get(ship, {})
        sat = o.link_bytes.get(ship_link(ship, HQ), 0)
        wifi = sum(o.link_bytes.get(ship_link(ship, p), 0) for p in PORTS)
        total = sat + wifi
        raw = int(stats.get("payload_bytes", 0))
        mqtt = int(stats.get("mqtt_bytes", 0))
        edge = o.edge.get(ship, EdgeSample())
        spent = edge.budget_used.get(SATELLITE, 0)
        budget = edge.budget_limit.get(SATELLITE, 0)
        out[ship] = {
            "messages": int(stats.get("messages", 0)),
            "raw_payload_bytes": raw,
            "mqtt_bridge_bytes": mqtt,
            "sent_bytes": {SATELLITE: sat, WIFI: wifi},
            "total_sent_bytes": total,
            "vs_raw": round(total / raw, 3) if raw else None,
            "vs_mqtt": round(total / mqtt, 3) if mqtt else None,
            "satellite": {
                "spent_bytes": spent,
                "budget_bytes": budget,
                "share": round(spent / budget, 4) if budget else None,
            },
        }
    return out


def _registry_slow(registry: Mapping[str, Any]) -> list[str]:
    """A registry entry enforced at a site later than its goal after its writing at HQ
    (a goal, not the verdict: speed depends on the machine)."""
    goal = float(registry.get("goal_enforced_s") or 10.0)
    out = []
    for r in registry.get("rollouts") or ():
        late = {k: v for k, v in r["enforced_s"].items() if v is None or v > goal}
        if late:
            what = ", ".join(
                f"{k} {'never' if v is None else f'{v:.1f}s'}" for k, v in late.items()
            )
            out.append(
                f"registry entry {r['id']} ({r['what']}) enforced later than {goal:.0f}s: {what}"
            )
    return out


def build_report(o: Observed) -> dict[str, Any]:
    produced = _produced(o.edge)
    problems = list(o.problems)
    if not produced:
        problems.append("no ship reported producing any record")
    sites, p = _site_figures(o, produced)
    problems += p
    calls, late = _port_calls(o)
    alert, p, slow = _alert(o)
    problems += p
    if o.customer is not None:
        problems += list(customer_problems(o.customer))
    if o.ops is not None:
        problems += ops_problems(o.ops, (o.overboard or {}).get("containers") or ())
    if o.registry is not None:
        problems += list(o.registry.get("problems") or ())
        slow += _registry_slow(o.registry)
    if o.audit is not None and not o.audit.get("ok", False):
        problems.append(f"shorelink audit --all-sites: {o.audit.get('summary', 'failed')}")
    ports = {}
    for name in PORTS:
        ports[name] = list(o.plan.port_position(name)) if hasattr(o.plan, "port_position") else []
    return {
        "ok": not problems,
        "problems": problems,
        "goals_missed": late + slow,
        "run": {
            "started": o.started,
            "wall_s": round(o.wall_s, 1),
            "voyage_s": round(float(o.plan.end_s()), 1),
            "ships": o.ships,
            "speed": round(float(o.plan.speed), 1),
            "sites": list(SITES),
            "hq": HQ,
            "command": o.command,
            "dir": o.dir,
            **{k: v for k, v in o.timings.items()},
        },
        "sites": sites,
        "port_calls": calls,
        "alert": alert,
        "links": _links(o),
        "container_history": o.history,
        "audit": o.audit,
        "customer": o.customer,
        "ops": o.ops,
        "fleet_registry": o.registry,
        "series": {
            "records": o.series_records,
            "backlog": o.series_backlog,
            "links": {
                ship: [{"from_s": a, "to_s": b, "link": link} for a, b, link in spans]
                for ship, spans in o.timeline.items()
            },
            "site_links": [{**x, "up": False} for x in o.site_outages],
            "tracks": o.tracks,
            "ports": ports,
            "hq_position": list(o.plan.hq_position) if hasattr(o.plan, "hq_position") else [],
            "alerts": [],
            "docked": {
                sp.name: [
                    {"port": ph.port, "from_s": ph.start_s, "to_s": ph.end_s}
                    for ph in sp.phases
                    if ph.kind == "port"
                ]
                for sp in o.plan.ships
            },
        },
    }
