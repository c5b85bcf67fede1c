"""The plain-text summary printed at the end of a voyage: the verdict first, then the
figures that back it; every line fits 80 columns."""

from __future__ import annotations

import textwrap
from typing import Any

__all__ = ["summary_text"]


def _s(v: Any, unit: str = "s") -> str:
    return f"{v:.1f}{unit}" if isinstance(v, (int, float)) else "-"


def _n(v: Any) -> str:
    return str(v) if isinstance(v, (int, float)) else "-"


def _bytes(n: Any) -> str:
    if not isinstance(n, (int, float)):
        return "-"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n}B"


def summary_text(report: dict[str, Any]) -> str:
    lines: list[str] = []
    if report.get("ok"):
        lines.append("PASS: every site holds every record exactly once")
    else:
        problems = [str(p) for p in report.get("problems") or []] or ["see report.json"]
        lines += textwrap.wrap(f"FAIL: {problems[0]}", 80, subsequent_indent="      ")
        for p in problems[1:8]:
            lines += textwrap.wrap(p, 80, initial_indent="  - ", subsequent_indent="    ")
        if len(problems) > 8:
            lines.append(f"  ... and {len(problems) - 8} more in report.json")
    goals = [str(g) for g in report.get("goals_missed") or []]
    if goals:
        lines.append(f"goals not met ({len(goals)}; the run still passes on correctness):")
        for g in goals[:6]:
            lines += textwrap.wrap(g, 80, initial_indent="  - ", subsequent_indent="    ")
        if len(goals) > 6:
            lines.append(f"  ... and {len(goals) - 6} more in report.json")
    run = report.get("run") or {}
    lines.append(
        f"{len(run.get('ships') or [])} ships, {_s(run.get('wall_s'))} wall "
        f"({_s(run.get('voyage_s'))} voyage at {_s(run.get('speed'), 'x')})"
    )
    lines.append("")
    lines.append(
        f"{'site':<10} {'held':>8} {'produced':>8} {'dups':>5} {'gaps':>5} {'p50':>8} {'p99':>8}"
    )
    for name, s in (report.get("sites") or {}).items():
        lat = s.get("latency_s") or {}
        lines.append(
            f"{str(name)[:10]:<10} {_n(s.get('held')):>8} {_n(s.get('produced')):>8} "
            f"{_n(s.get('duplicates')):>5} {_n(s.get('gaps')):>5} "
            f"{_s(lat.get('p50')):>8} {_s(lat.get('p99')):>8}"
        )
    alert = report.get("alert")
    if alert:
        lines.append("")
        lines.append(
            f"overboard: {alert.get('ship')} lost "
            + ", ".join(str(c) for c in alert.get("containers") or [])
        )
        per = "  ".join(
            f"{k} {_s((v or {}).get('latency_s'))}" for k, v in (alert.get("sites") or {}).items()
        )
        lines += textwrap.wrap(f"alert after: {per}", 80, subsequent_indent="  ")
        hops = "  ".join(
            f"{h.get('hop')} +{_s(h.get('took_s'))}"
            for h in (alert.get("timeline") or [])[1:]
            if isinstance(h, dict)
        )
        if hops:
            lines += textwrap.wrap(f"hop by hop: {hops}", 80, subsequent_indent="  ")
    cust = report.get("customer")
    if cust:
        lines.append("")
        ok = "refused" if cust.get("refused_ok") else "NOT refused"
        lines += textwrap.wrap(
            f"customer {cust.get('customer')}: read {_n(cust.get('identities'))} of "
            f"{_n(cust.get('expected'))} records of its containers at hq, "
            f"{_n(cust.get('duplicates'))} twice, {_n(cust.get('foreign'))} not its own; "
            f"another customer's stream: {ok}",
            80,
            subsequent_indent="  ",
        )
    reg = report.get("fleet_registry")
    if reg:
        lines.append("")
        for r in reg.get("rollouts") or ():
            enforced = [v for v in (r.get("enforced_s") or {}).values() if v is not None]
            lines += textwrap.wrap(
                f"fleet rollout {r['id']} ({r['what']}): {r['state']} by {r.get('by')} at "
                f"stage {r.get('stage_reached')} of {len(r.get('stages') or [])}, reached "
                f"{', '.join(r.get('reached') or [])}"
                + (f" ({r['reason']})" if r.get("reason") else "")
                + f"; its entry at every site within {_s(max(enforced, default=None))}",
                80,
                subsequent_indent="  ",
            )
        costs = ", ".join(
            f"{ship} {_bytes(c.get('satellite_bytes'))} by satellite"
            for ship, c in sorted((reg.get("config") or {}).items())
        )
        if costs:
            lines += textwrap.wrap(f"configurations fetched: {costs}", 80, subsequent_indent="  ")
        rot = reg.get("key_rotation")
        if rot:
            enforced = [v for v in (rot.get("enforced_s") or {}).values() if v is not None]
            lines += textwrap.wrap(
                f"{rot['ship']}'s key rotated at {_s(rot.get('at_s'))} (agent down "
                f"{_s(rot.get('agent_down_s'))}), enforced at every site within "
                f"{_s(max(enforced, default=None))}",
                80,
                subsequent_indent="  ",
            )
    calls = report.get("port_calls") or []
    if calls:
        lines.append("")
        lines.append("ports knew the cargo before docking:")
        for c in calls:
            lead = c.get("lead_s")
            when = "early" if not isinstance(lead, (int, float)) or lead >= 0 else "LATE"
            lines.append(f"  {c.get('ship')} at {c.get('port')}: {_s(lead)} {when}")
    links = report.get("links") or {}
    if links:
        lines.append("")
        lines.append(
            f"{'ship':<8} {'on links':>9} {'payloads':>9} {'as MQTT':>9} {'ratio':>6} {'sat/day':>16}"
        )
        for ship, x in links.items():
            sat = x.get("satellite") or {}
            ratio = x.get("vs_mqtt")
            lines.append(
                f"{str(ship)[:8]:<8} {_bytes(x.get('total_sent_bytes')):>9} {_bytes(x.get('raw_payload_bytes')):>9} "
                f"{_bytes(x.get('mqtt_bridge_bytes')):>9} {f'{ratio:.2f}' if isinstance(ratio, (int, float)) else '-':>6} "
                f"{_bytes(sat.get('spent_bytes')) + '/' + _bytes(sat.get('budget_bytes')):>16}"
            )
    return "\n".join(line[:80] for line in lines)
