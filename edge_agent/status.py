"""What ``shorelink-edge status`` reports: per stream, what the log holds and what shore
has confirmed; per gateway, whether its link is up and today's bytes against the link's
budget; this agent's version, the log's schema and the copy taken before its last
migration (docs/edge-agent.md, "Upgrades and rollbacks"). Read from the log file, so it
works while the agent runs, and on a log a newer agent migrated."""

from __future__ import annotations

import time
from typing import Any

from edge_agent import migrations
from edge_agent.budget import utc_day
from edge_agent.config import EdgeConfig
from edge_agent.log import EdgeLog
from shorelink.textout import block, terminal_width, wrap
from shorelink.version import version

__all__ = ["collect_status", "open_log", "render"]


def open_log(cfg: EdgeConfig, *, readonly: bool = False) -> EdgeLog:
    return EdgeLog(cfg.log.path, cfg.ship, cfg.streams, cfg.log, readonly=readonly)


def collect_status(cfg: EdgeConfig, edge_log: EdgeLog) -> dict[str, Any]:
    now_ms = int(time.time() * 1000)
    holdings = edge_log.holdings()
    streams: dict[str, Any] = {}
    names = [s.name for s in cfg.by_priority()]
    names += [n for n in edge_log.stream_names() if n not in cfg.streams]
    sealed = edge_log.segments.totals()
    for name in names:
        st = edge_log.stream_state(name)
        n, nbytes, oldest = edge_log.backlog(name)
        streams[name] = {
            "priority": cfg.streams[name].priority if name in cfg.streams else None,
            "last_seq": st.next_seq - 1,
            "first_seq": edge_log.first_seq(name),
            "records": st.count,
            "bytes": st.bytes,
            "held": {site: str(per[name]) for site, per in sorted(holdings.items()) if name in per},
            "backlog_records": n,
            "backlog_bytes": nbytes,
            "oldest_undelivered_age_s": round((now_ms - oldest) / 1000, 1)
            if oldest is not None
            else None,
            "dropped": st.dropped,
            "retired": st.retired,
            "rejected": st.rejected,
            # encoded ahead of any link (edge_agent/sealing.py): records and bytes
            "sealed_records": sealed.get(name, (0, 0, 0))[1],
            "sealed_bytes": sealed.get(name, (0, 0, 0))[2],
        }
    sizes = edge_log.sizes()
    return {
        "ship": cfg.ship,
        "agent": version(),
        "log": str(cfg.log.path),
        # the log's schema against this agent's, and the way back of the last upgrade
        "log_schema": max(edge_log.schema(), default=0),
        "agent_schema": len(migrations.MIGRATIONS),
        "log_copies": {
            str(n): str(p) for n, p in sorted(migrations.copies_of(cfg.log.path).items())
        },
        "log_record_bytes": sizes.records,
        "log_budget_bytes": cfg.log.max_bytes,
        "log_file_bytes": sizes.files,
        "quarantined": edge_log.quarantine.count(),
        "streams": streams,
        "links": _links(cfg, edge_log, now_ms),
    }


def _links(cfg: EdgeConfig, edge_log: EdgeLog, now_ms: int) -> list[dict[str, Any]]:
    """One entry per configured gateway: link state as the agent last recorded it."""
    day = utc_day(now_ms / 1000)
    states = {(s.site, s.link): s for s in edge_log.links.states()}
    out = []
    for g in cfg.gateways:
        link = cfg.links[g.link]
        st = states.get((g.site, g.link))
        out.append(
            {
                "site": g.site,
                "link": g.link,
                "url": g.url,
                "cost": link.cost,
                "streams": list(link.streams),
                "state": "never tried" if st is None else ("up" if st.up else "down"),
                "last_success_age_s": _age(now_ms, st.last_success_ms if st else None),
                "last_error": st.last_error if st else "",
                "last_error_age_s": _age(now_ms, st.last_error_ms if st else None),
                "today_bytes": edge_log.links.spend(g.link, day),
                "daily_budget_bytes": link.daily_budget_bytes,
            }
        )
    return out


def _age(now_ms: int, at_ms: int | None) -> float | None:
    return None if at_ms is None else round((now_ms - at_ms) / 1000, 1)


def render(report: dict[str, Any], width: int | None = None) -> list[str]:
    """The report as text that fits ``width`` columns (default: the terminal's; 80
    piped): one block per stream and per gateway, long values wrapped whole, never cut."""
    width = width or terminal_width()
    lines = wrap(f"ship {report['ship']}  agent {report['agent']}  log {report['log']}", width)
    schema, known = report["log_schema"], report["agent_schema"]
    lines += wrap(
        f"log schema {schema}"
        + (f" (a newer agent migrated it: this agent knows {known})" if schema > known else "")
        + "".join(
            f"; copy at schema {n}: {p}"
            for n, p in sorted(report["log_copies"].items(), key=lambda c: int(c[0]))
        ),
        width,
    )
    for name, s in report["streams"].items():
        age = s["oldest_undelivered_age_s"]
        held = "; ".join(f"{site}:{r}" for site, r in s["held"].items()) or "-"
        prio = "-" if s["priority"] is None else s["priority"]
        lines += block(
            f"stream {name} (priority {prio})",
            [
                f"last seq {s['last_seq']}",
                f"backlog {s['backlog_records']} records ({s['backlog_bytes']} B)",
                f"oldest undelivered {'-' if age is None else f'{age:.0f}s'}",
                f"sealed {s['sealed_records']}",
                f"dropped {s['dropped']}",
                f"rejected {s['rejected']}",
                f"held by shore {held}",
            ],
            width,
        )
    if not report["links"]:
        lines.append("links: no gateways configured (ingest only)")
    for g in report["links"]:
        ok, err = g["last_success_age_s"], g["last_error_age_s"]
        budget = g["daily_budget_bytes"]
        lines += block(
            f"gateway {g['site']} over {g['link']}: {g['state']}",
            [
                f"last success {'-' if ok is None else f'{ok:.0f}s ago'}",
                f"today {g['today_bytes']} B of {f'{budget} B' if budget else 'unlimited'}",
                "" if err is None else f"last error {err:.0f}s ago: {g['last_error'][:200]}",
            ],
            width,
        )
    lines += wrap(
        f"log: {report['log_record_bytes']} of {report['log_budget_bytes']} budget bytes, "
        f"{report['log_file_bytes']} on disk; quarantined: {report['quarantined']}",
        width,
    )
    return lines
