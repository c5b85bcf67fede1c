"""The plain-text summary printed at the end of a voyage: the verdict first, then the
figures that back it; every line fits 80 columns."""

from __future__ import annotations

from typing import Any

__all__ = ["summary_text"]


def _s(v: Any, unit: str = "s") -> str:
    return "-" if v is None else f"{v:.1f}{unit}"


def _bytes(n: int | None) -> str:
    if n is None:
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
        lines.append("FAIL: " + (report.get("problems") or ["see report.json"])[0][:72])
        lines += [f"  - {p[:74]}" for p in (report.get("problems") or [])[1:8]]
    run = report.get("run", {})
    lines.append(
        f"{len(run.get('ships', []))} ships, {run.get('wall_s', 0):.0f}s wall "
        f"({run.get('voyage_s', 0):.0f}s voyage at {run.get('speed', 0):.0f}x)"
    )
    lines.append("")
    lines.append(
        f"{'site':<10} {'held':>8} {'made':>8} {'dups':>5} {'gaps':>5} {'p50':>8} {'p99':>8}"
    )
    for name, s in (report.get("sites") or {}).items():
        lat = s.get("latency_s") or {}
        lines.append(
            f"{name[:10]:<10} {s.get('held', 0):>8} {s.get('produced', 0):>8} "
            f"{s.get('duplicates', 0):>5} {s.get('gaps', 0):>5} {_s(lat.get('p50')):>8} {_s(lat.get('p99')):>8}"
        )
    alert = report.get("alert")
    if alert:
        lines.append("")
        lines.append(
            f"overboard: {alert.get('ship')} lost {', '.join(alert.get('containers', []))}"[:80]
        )
        per = "  ".join(f"{k} {_s(v.get('latency_s'))}" for k, v in alert.get("sites", {}).items())
        lines.append(f"alert after: {per}"[:80])
    calls = report.get("port_calls") or []
    if calls:
        lines.append("")
        lines.append("ports knew the cargo before docking:")
        for c in calls:
            lines.append(f"  {c.get('ship')} at {c.get('port')}: {_s(c.get('lead_s'))} early"[:80])
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
                f"{ship[:8]:<8} {_bytes(x.get('total_sent_bytes')):>9} {_bytes(x.get('raw_payload_bytes')):>9} "
                f"{_bytes(x.get('mqtt_bridge_bytes')):>9} {'-' if ratio is None else f'{ratio:.2f}':>6} "
                f"{_bytes(sat.get('spent_bytes')) + '/' + _bytes(sat.get('budget_bytes')):>16}"
            )
    return "\n".join(line[:80] for line in lines)
