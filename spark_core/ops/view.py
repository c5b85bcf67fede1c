"""The operations page's facts as JSON (``/api/...``, docs/operations.md): pure
functions of what the follower read (spark_core/ops/follow.py), the site application's
status files (spark_core/status.py) and the gateway's metrics, so each is tested on its
own and the page, the API and the live updates show the same figures.
"""

from __future__ import annotations

import math
import time
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from shorelink.boundary import boundary
from shorelink.fleet.health import FleetView, decisions, fleet_health, heard_from, rollout_json
from shorelink.ranges import RangeSet
from spark_core.ops.follow import Facts
from spark_core.quarantine import retried_when
from spark_core.status import SiteStatus, holdings, lacking

__all__ = [
    "FOLLOWER_STALE_S",
    "MAX_FLEET_ROLLOUTS",
    "alerts_view",
    "fleet_view",
    "gateway_view",
    "map_view",
    "ships_view",
    "site_view",
]

#: the link class whose spend the page sets against its budget
SATELLITE = "satellite"
#: the follower polls Kafka every half second: this long without a poll is a problem
#: (its thread stopped, or a call hangs), and every figure from Kafka is that old
FOLLOWER_STALE_S = 30.0
_GATEWAY = "shorelink_gateway_"
#: the rollouts the fleet section lists: every active one and the newest ended ones
MAX_FLEET_ROLLOUTS = 20


def site_view(
    site: str,
    streams: tuple[str, ...],
    facts: Facts,
    status: SiteStatus,
    gateway: dict[str, Any] | None,
) -> dict[str, Any]:
    """The site at a glance: records per stream and origin (the ledger), replication
    per neighbour, the Spark queries, the gateway, dead letters and what is wrong."""
    with facts.lock:
        ledger = dict(facts.ledger)
        dead = dict(facts.dead)
        bad = dict(facts.bad)
        error = facts.error
        polled_at = facts.polled_at
    per_stream: dict[str, list[dict[str, Any]]] = {s: [] for s in streams}
    for (origin, stream), held in sorted(ledger.items()):
        per_stream.setdefault(stream, []).append(
            {
                "origin": origin,
                "records": held.count(),
                "last_seq": held.last or 0,
                "gaps": _gaps(held),
            }
        )
    rep = status.replication or {}
    neighbours = []
    for name, n in sorted((rep.get("neighbours") or {}).items()):
        n = n or {}
        neighbours.append(
            {
                "neighbour": name,
                "state": n.get("state"),
                "since": n.get("since"),
                "last_ok": n.get("last_ok"),
                "error": n.get("error") or "",
                "streams": [
                    {
                        "stream": s,
                        "state": (v or {}).get("state"),
                        "lag_records": (v or {}).get("lag_records"),
                        "lag_s": (v or {}).get("lag_s"),
                        "last_success": (v or {}).get("last_success"),
                    }
                    for s, v in sorted((n.get("streams") or {}).items())
                ],
            }
        )
    queries = [
        {
            k: q.get(k)
            for k in (
                "query",
                "state",
                "batch_id",
                "timestamp",
                "input_rows_per_s",
                "processed_rows_per_s",
                "lag_records",
            )
        }
        for q in sorted(
            (status.queries or {}).get("queries") or (), key=lambda q: str(q.get("query"))
        )
    ]
    problems = list(status.problems)
    if error:
        problems.append(f"kafka: {error}")
    if gateway is not None and gateway.get("error"):
        problems.append(f"gateway: {gateway['error']}")
    if polled_at and time.time() - polled_at > FOLLOWER_STALE_S:
        # the figures below are as they stood then (its log says why)
        problems.append(f"kafka: not read for over {FOLLOWER_STALE_S:.0f} s")
    problems += [
        f"{n} record{'s' if n != 1 else ''} of {t} broke the contract (logged)"
        for t, n in sorted(bad.items())
    ]
    return {
        "site": site,
        "generated_at": time.time(),
        "kafka_polled_at": polled_at or None,
        "streams": [
            {"stream": s, "records": sum(o["records"] for o in origins), "origins": origins}
            for s, origins in per_stream.items()
        ],
        "replication": {
            "neighbours": neighbours,
            "routes": rep.get("routes") or {},
            # repair by identity (spark_core/repair.py): None before every neighbour
            # was compared once; absent where the site has no repair (no neighbours)
            **({"holds_all": rep["holds_all"]} if "holds_all" in rep else {}),
            "lacking": lacking(rep),
            "lost_here": rep.get("lost_here") or {},
            # the same words as `shorelink-spark status` (the page shows them as they are)
            "holdings": _holdings_text(rep),
        },
        "queries": queries,
        "gateway": gateway,
        "dead_letters": [
            {"topic": t, "cause": c, "records": n, "tried_again_when": retried_when(c)}
            for (t, c), n in sorted(dead.items())
        ],
        "problems": problems,
    }


def _holdings_text(rep: dict[str, Any]) -> dict[str, Any] | None:
    said = holdings(rep)
    return None if said is None else {"headline": said[0], "details": said[1]}


def _gaps(held: RangeSet) -> int:
    """Seqs missing below the highest held (replication still to come, or abandoned)."""
    last = held.last
    return last - held.count() if last else 0


def ships_view(facts: Facts, now_ms: int | None = None) -> list[dict[str, Any]]:
    """Per ship: when this site last heard of it and through which site, the link it
    last reached a site over, its backlog at sea (the ship's last seq of each stream
    against what this site holds), today's satellite spend against its budget, and its
    last position."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    with facts.lock:
        reports = dict(facts.reports)
        heard = dict(facts.heard)
        ledger = dict(facts.ledger)
        last_pos = {o: t[-1] for o, t in facts.tracks.items() if t}
    ships = sorted(set(reports) | set(heard))
    out = []
    for ship in ships:
        h = heard.get(ship)
        row: dict[str, Any] = {
            "ship": ship,
            "last_heard_ms": h.at_ms if h else None,
            "last_heard_age_s": round((now_ms - h.at_ms) / 1000, 1) if h else None,
            "via": h.site if h else None,
            "position": (
                {"ts_ms": last_pos[ship][0], "lat": last_pos[ship][1], "lon": last_pos[ship][2]}
                if ship in last_pos
                else None
            ),
            "report": None,
            "streams": [],
            "backlog_records": None,
            "satellite": None,
        }
        rep = reports.get(ship)
        if rep is not None:
            report, _ts, site = rep
            row["report"] = {
                "at_ms": report.at_ms,
                "site": site,
                "link": report.link,
                "agent": report.agent,  # the agent's version (None: from before versions)
            }
            total = 0
            for stream, (last_seq, ship_backlog) in sorted(report.streams.items()):
                held = ledger.get((ship, stream), RangeSet())
                # seqs the ship had when it reported past the highest this site holds
                # (holes below it are the stream's gaps, counted in site_view)
                behind = max(0, last_seq - (held.last or 0))
                total += behind
                row["streams"].append(
                    {
                        "stream": stream,
                        "ship_last_seq": last_seq,
                        "held_here": held.count(),
                        "held_last_seq": held.last or 0,
                        "behind": behind,
                        "unconfirmed_on_ship": ship_backlog,
                    }
                )
            row["backlog_records"] = total
            sat = report.links.get(SATELLITE)
            if sat is not None:
                spent, budget = sat
                row["satellite"] = {
                    "spent_today": spent,
                    "daily_budget": budget,
                    "percent": round(100 * spent / budget, 1) if budget else None,
                }
            row["report"]["log_bytes"] = report.log_bytes
            row["report"]["log_budget"] = report.log_budget
        out.append(row)
    return out


def fleet_view(view: FleetView | None, facts: Facts, now_ms: int | None = None) -> Any:
    """The fleet as the registry this site follows says it and the ships' reports
    answer (None: the site does not follow the registry, no ``fleet_pub_file``): the
    registry's version, the rollouts (each active one with what its next tick decides
    and why) and per ship the configuration version it should run, the one it runs, its
    health and last failure, and when this site last heard of it."""
    if view is None:
        return None
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    with facts.lock:
        reports = {ship: r for ship, (r, _ts, _site) in facts.reports.items()}
        heard_ms = {ship: h.at_ms for ship, h in facts.heard.items()}
    heard = heard_from(reports)
    health = fleet_health(view, heard, heard_ms, now_ms)
    decided = decisions(view, heard)
    ended = [r for r in view.rollouts if r.state != "active"]
    shown = view.active() + ended[::-1][: max(0, MAX_FLEET_ROLLOUTS - len(view.active()))]
    return {
        "version": view.version,
        "rollouts": [rollout_json(r, decided.get(r.id)) for r in shown],
        "ships": [
            {
                "ship": name,
                "groups": list(line.groups),
                "revoked": line.revoked,
                "config": line.expected,
                **health[name],
            }
            for name, line in sorted(view.ships.items())
        ],
    }


def alerts_view(facts: Facts, limit: int = 50) -> list[dict[str, Any]]:
    """The newest alerts first (by event time, then seq)."""
    with facts.lock:
        alerts = list(facts.alerts)
    alerts.sort(key=lambda a: (a["ts_ms"], a["origin"], a["seq"]), reverse=True)
    return alerts[:limit]


def map_view(facts: Facts) -> dict[str, Any]:
    """Each ship's track, oldest point first: ``[ts_ms, lat, lon]``."""
    with facts.lock:
        tracks = {o: [list(p) for p in t] for o, t in sorted(facts.tracks.items())}
    return {"tracks": tracks}


@boundary
def gateway_view(url: str, metrics_text: str | None, error: str = "") -> dict[str, Any]:
    """The gateway's state from its Prometheus text: ships connected now, batches and
    records written, refusals by reason, failed Kafka transactions. Never raises: text
    that is no Prometheus exposition is the view's ``error``, and a sample that is no
    finite number is not counted (``NaN`` or ``+Inf`` stopped the page's refresh)."""
    out: dict[str, Any] = {
        "url": url,
        "error": error,
        "ready": None,
        "connected": None,
        "batches": None,
        "records": None,
        "refusals": {},
        "kafka_errors": None,
    }
    if metrics_text is None:
        return out
    sums: dict[str, float] = {}
    refusals: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(metrics_text):
            for sample in family.samples:
                name = sample.name
                if not name.startswith(_GATEWAY) or not math.isfinite(sample.value):
                    continue
                short = name.removeprefix(_GATEWAY)
                if short == "rejected_batches_total":
                    reason = sample.labels.get("reason", "?")
                    refusals[reason] = refusals.get(reason, 0) + sample.value
                sums[short] = sums.get(short, 0) + sample.value
    except (ValueError, OverflowError) as exc:  # OverflowError: an integer past a float
        out["error"] = f"unreadable metrics: {exc}"[:300]
        return out

    # finite samples can still sum past a float (two of 9e307 are +Inf): no count then
    def count(name: str) -> int | None:
        total = sums.get(name)
        return int(total) if total is not None and math.isfinite(total) else None

    out.update(
        ready=bool(sums["ready"]) if "ready" in sums else None,
        connected=count("upload_connections"),
        batches=count("batches_written_total"),
        records=count("records_written_total"),
        refusals={k: int(v) for k, v in sorted(refusals.items()) if math.isfinite(v)},
        kafka_errors=count("kafka_errors_total"),
    )
    return out
