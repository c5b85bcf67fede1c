"""``report.html``: the voyage's report as one self-contained page (no external CSS,
script, font or image; the charts are PNGs drawn with matplotlib's Agg backend and
embedded as data URIs), made from ``report.json`` only. Every string from the report
is escaped."""

from __future__ import annotations

import base64
import html
import io
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from shorelink.files import write_atomic

__all__ = ["render_html", "write_report"]

LINK_COLOURS = {"satellite": "#d62728", "none": "#bbbbbb"}
WIFI_COLOUR = "#2ca02c"

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1100px;color:#222}
h1{margin-bottom:4px} h2{margin-top:32px;border-bottom:1px solid #ddd;padding-bottom:4px}
.verdict{padding:12px 16px;border-radius:6px;font-size:1.2em;font-weight:600}
.pass{background:#e6f4ea;color:#1e6b30} .fail{background:#fde8e8;color:#9b1c1c}
.goals{background:#fff6e0;color:#7a5200;padding:8px 16px;border-radius:6px;margin-top:8px}
table{border-collapse:collapse;margin:8px 0} td,th{padding:4px 10px;border-bottom:1px solid #eee;text-align:right}
th{background:#f6f6f6} td:first-child,th:first-child{text-align:left}
.bad{color:#9b1c1c;font-weight:600} .muted{color:#777} img{max-width:100%}
"""


def _e(v: Any) -> str:
    return html.escape("" if v is None else str(v))


def _num(v: Any, digits: int = 1, unit: str = "") -> str:
    if v is None:
        return "&ndash;"
    if isinstance(v, float):
        return _e(f"{v:,.{digits}f}{unit}")
    if isinstance(v, int):
        return _e(f"{v:,}{unit}")
    return _e(v)


def _label(v: Any) -> str:
    """A report string as chart text: printable, and no ``$`` to start mathtext."""
    return "".join(c for c in str(v) if c.isprintable()).replace("$", r"\$")[:40]


def _png(fig: Figure) -> str:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        # a name from the report in a script the bundled font lacks draws as boxes
        warnings.filterwarnings("ignore", "Glyph .* missing from", UserWarning)
        fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    data = base64.b64encode(buf.getvalue()).decode()
    return f'<img alt="chart" src="data:image/png;base64,{data}">'


def _chart(draw: Callable[..., str], *args: Any) -> str:
    """One chart, or a note saying why not: a malformed series in a failed run's report
    must not cost the reader the rest of the page."""
    try:
        return draw(*args)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        return f"<p class='muted'>chart not drawn: {_e(type(exc).__name__)}: {_e(exc)}</p>"


def _table(head: list[str], rows: list[list[str]]) -> str:
    th = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{th}</tr>{body}</table>"


def _series_chart(series: dict[str, list[list[float]]], title: str, ylabel: str) -> str:
    if not series or not any(series.values()):
        return ""
    fig = Figure(figsize=(10, 3.2))
    ax = fig.add_subplot()
    for name, points in series.items():
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], label=_label(name))
    ax.set_title(title)
    ax.set_xlabel("seconds since start")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", fontsize="small")
    return _png(fig)


def _links_chart(series: dict[str, Any]) -> str:
    spans = series.get("links") or {}
    if not spans:
        return ""
    ships = list(spans)
    fig = Figure(figsize=(10, 0.6 * len(ships) + 1.6))
    ax = fig.add_subplot()
    for row, ship in enumerate(ships):
        for d in series.get("docked", {}).get(ship, []):
            ax.axvspan(d["from_s"], d["to_s"], ymin=0, ymax=1, color="#f0f0f0", zorder=0)
        for s in spans[ship]:
            if s.get("to_s") is None:
                continue
            link = s.get("link") or "none"
            colour = (
                WIFI_COLOUR
                if str(link).startswith("port_wifi")
                else LINK_COLOURS.get(link, "#1f77b4")
            )
            ax.broken_barh(
                [(s["from_s"], s["to_s"] - s["from_s"])], (row - 0.35, 0.7), color=colour
            )
            if str(link).startswith("port_wifi"):
                ax.text(s["from_s"], row + 0.4, _label(str(link).split(":")[-1]), fontsize=7)
    for o in series.get("site_links") or []:
        if o.get("to_s") is not None:
            ax.axvspan(o["from_s"], o["to_s"], color="#ff7f0e", alpha=0.15)
            ax.text(
                o["from_s"],
                len(ships) - 0.4,
                _label(f"{o.get('a')}-{o.get('b')} cut"),
                fontsize=8,
                color="#ff7f0e",
            )
    ax.set_yticks(range(len(ships)), [_label(s) for s in ships])
    ax.set_ylim(-0.6, len(ships) + 0.2)
    ax.set_xlabel("seconds since start")
    ax.set_title("link in use per ship (green: port Wi-Fi, red: satellite; orange: site link cut)")
    return _png(fig)


def _map(series: dict[str, Any], alert: dict[str, Any] | None) -> str:
    tracks = series.get("tracks") or {}
    ports = series.get("ports") or {}
    if not tracks and not ports:
        return ""
    fig = Figure(figsize=(8, 6.5))
    ax = fig.add_subplot()
    for ship, pts in tracks.items():
        if pts:
            ax.plot([p[2] for p in pts], [p[1] for p in pts], label=_label(ship), linewidth=1.5)
    for name, pos in ports.items():
        if len(pos) == 2:
            ax.plot(pos[1], pos[0], "ks", markersize=6)
            ax.annotate(_label(name), (pos[1], pos[0]), textcoords="offset points", xytext=(5, 5))
    lats = [p[1] for pts in tracks.values() for p in pts if len(p) >= 3]
    lons = [p[2] for pts in tracks.values() for p in pts if len(p) >= 3]
    lats += [pos[0] for pos in ports.values() if len(pos) == 2]
    lons += [pos[1] for pos in ports.values() if len(pos) == 2]
    pos = (alert or {}).get("position")
    if isinstance(pos, (list, tuple)) and len(pos) == 2 and None not in pos:
        ax.plot(pos[1], pos[0], "rX", markersize=12, label="overboard")
        lats.append(pos[0])
        lons.append(pos[1])
    if lats:
        ax.set_xlim(min(lons) - 8, max(lons) + 8)
        ax.set_ylim(max(-90, min(lats) - 6), min(90, max(lats) + 6))
    ax.set_aspect("equal")
    ax.grid(alpha=0.3)
    ax.set_xlabel("longitude")
    ax.set_ylabel("latitude")
    hq = series.get("hq_position") or []
    title = "ship tracks"
    if len(hq) == 2 and lats:
        lo, hi = ax.get_xlim()
        if lo <= hq[1] <= hi:
            ax.plot(hq[1], hq[0], "b*", markersize=12)
            ax.annotate("HQ", (hq[1], hq[0]), textcoords="offset points", xytext=(5, 5))
        else:
            title += f" (HQ at {hq[0]:.1f}, {hq[1]:.1f}, off the map)"
            ax.annotate("HQ →", (1.0, 0.5), xycoords="axes fraction", ha="right", color="b")
    ax.set_title(title)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="lower left", fontsize="small")
    return _png(fig)


def _alert_chart(alert: dict[str, Any]) -> str:
    sites = {k: v.get("latency_s") for k, v in (alert.get("sites") or {}).items()}
    if not any(v is not None for v in sites.values()):
        return ""
    fig = Figure(figsize=(6, 2.4))
    ax = fig.add_subplot()
    names = [_label(k) for k in sites]
    ax.barh(names, [v or 0 for v in sites.values()], color="#d62728")
    ax.set_xlabel("seconds from the overboard event")
    ax.set_title("overboard alert at each site")
    return _png(fig)


def _ops_section(ops: dict[str, Any] | None) -> list[str]:
    """Headquarters' operations page at the end: each ship as it showed it, and its
    picture (embedded: the report stays one file)."""
    if not ops:
        return []
    out = ["<h2>Headquarters' operations page</h2>"]
    if ops.get("error"):
        return [*out, f"<p class='bad'>{_e(ops['url'])}: {_e(ops['error'])}</p>"]
    out.append(
        f"<p class='muted'><code>shorelink ops --site hq</code> at {_e(ops.get('url'))}: "
        f"{ops.get('alerts', 0)} alerts listed; what it showed of each ship at the end</p>"
    )
    rows = []
    for ship, r in sorted((ops.get("ships") or {}).items()):
        if r is None:
            rows.append([_e(ship), "not listed", "", "", ""])
            continue
        sat = r.get("satellite") or {}
        rows.append(
            [
                _e(ship),
                _e(r.get("link") or "-"),
                _e(r.get("via") or "-"),
                _num(r.get("backlog_records"), 0),
                f"{_num(sat.get('spent_today'), 0)} of {_num(sat.get('daily_budget'), 0)} B"
                if sat
                else "-",
            ]
        )
    out.append(_table(["ship", "last link", "via", "records at sea", "satellite today"], rows))
    shot = ops.get("screenshot")
    if shot and Path(shot).is_file():
        data = base64.b64encode(Path(shot).read_bytes()).decode()
        out.append(
            f"<img alt='the operations page' style='max-width:100%;border:1px solid #ccc' "
            f"src='data:image/png;base64,{data}'>"
        )
    elif ops.get("screenshot_note"):
        out.append(f"<p class='muted'>no picture: {_e(ops['screenshot_note'])}</p>")
    return out


def _fleet_section(reg: dict[str, Any] | None) -> list[str]:
    """Headquarters' fleet registry: each rollout (stages, ships reached, how it ended
    and why, each entry's way to every site) and what each ship fetched."""
    if not reg:
        return []
    out = [
        "<h2>The fleet from headquarters: rollouts</h2>",
        "<p class='muted'>"
        + _e(
            f"Every ship provisioned at HQ (`shorelink fleet provision`), no ships.json or "
            f"ship keys file at any site: registry version {reg.get('registry_version')}, "
            f"{reg.get('ships')} ships; `shorelink fleet run` at HQ published each entry and "
            "ticked the rollouts on the ships' reports."
        )
        + "</p>",
    ]
    rows = []
    for r in reg.get("rollouts") or ():
        counts = r.get("stage_ships") or []
        stages = " / ".join(
            f"{st} ({n} ships)" for st, n in zip(r.get("stages") or [], counts, strict=False)
        )
        enforced = [v for v in (r.get("enforced_s") or {}).values() if v is not None]
        rows.append(
            [
                _e(f"{r['id']} ({r['what']})"),
                _e(stages),
                _e(f"stage {r.get('stage_reached')}: {', '.join(r.get('reached') or [])}"),
                _e(f"{r.get('state')} by {r.get('by') or '-'}")
                + (f"<br><small>{_e(r['reason'])}</small>" if r.get("reason") else ""),
                _e(f"{_num(r.get('started_s'))}-{_num(r.get('ended_s'))} s"),
                _num(max(enforced), 2, " s") if enforced else "-",
            ]
        )
    out.append(
        _table(
            ["rollout", "stages", "reached", "ended", "voyage time", "enforced everywhere"],
            rows,
        )
    )
    rows = [
        [
            _e(ship),
            _num(len(c.get("fetches") or []), 0),
            _num(c.get("satellite_bytes"), 0, " B"),
            _num(c.get("port_bytes"), 0, " B"),
        ]
        for ship, c in sorted((reg.get("config") or {}).items())
    ]
    out.append(
        _table(["ship", "configurations fetched", "over the satellite", "over port links"], rows)
    )
    rot = reg.get("key_rotation")
    if rot:
        enforced = [v for v in (rot.get("enforced_s") or {}).values() if v is not None]
        out.append(
            "<p>"
            + _e(
                f"{rot['ship']}'s signing key rotated at {_num(rot.get('at_s'))} s "
                f"(`shorelink fleet rotate-key`, entry {rot.get('version')}): the new key "
                "signs from "
                + ", ".join(f"{k} {v}" for k, v in sorted((rot.get("from_seq") or {}).items()))
                + f"; enforced at every site within {_num(max(enforced, default=None), 2)} s; "
                f"the agent was down {_num(rot.get('agent_down_s'))} s (its broker kept what "
                "arrived)."
            )
            + "</p>"
        )
    return out


def render_html(report: dict[str, Any]) -> str:
    ok = bool(report.get("ok"))
    problems = report.get("problems") or []
    run = report.get("run") or {}
    series = report.get("series") or {}
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>shorelink voyage report</title>",
        f"<style>{CSS}</style></head><body>",
        "<h1>shorelink voyage</h1>",
        f"<p class='muted'>{_e(run.get('started'))} &middot; {_e(run.get('command'))} &middot; "
        f"{len(run.get('ships') or [])} ships &middot; {_num(run.get('wall_s'))} s wall &middot; "
        f"voyage {_num(run.get('voyage_s'))} s at {_num(run.get('speed'), 0)}x</p>",
    ]
    if ok:
        parts.append(
            "<div class='verdict pass'>PASS: every site holds every record exactly once</div>"
        )
    else:
        items = "".join(f"<li>{_e(p)}</li>" for p in problems)
        parts.append(f"<div class='verdict fail'>FAIL<ul>{items}</ul></div>")

    goals = report.get("goals_missed") or []
    if goals:
        items = "".join(f"<li>{_e(g)}</li>" for g in goals)
        parts.append(
            f"<div class='goals'>Goals of speed not met on this machine ({len(goals)}):"
            f"<ul>{items}</ul></div>"
        )

    parts.append("<h2>Every record, exactly once, at every site</h2>")
    rows = []
    for name, s in (report.get("sites") or {}).items():
        lat = s.get("latency_s") or {}
        bad = any(s.get(k) for k in ("duplicates", "gaps", "missing"))
        rows.append(
            [
                f"<span class='{'bad' if bad else ''}'>{_e(name)}</span>",
                _num(s.get("produced")),
                _num(s.get("held")),
                _num(s.get("duplicates")),
                _num(s.get("gaps")),
                _num(s.get("missing")),
                _num(lat.get("p50"), 1, " s"),
                _num(lat.get("p99"), 1, " s"),
            ]
        )
    parts.append(
        _table(
            [
                "site",
                "produced",
                "held",
                "duplicates",
                "gaps",
                "missing",
                "creation→arrival p50",
                "p99",
            ],
            rows,
        )
    )
    per = []
    for name, s in (report.get("sites") or {}).items():
        for stream, x in (s.get("per_stream") or {}).items():
            lat = x.get("latency_s") or {}
            per.append(
                [
                    _e(name),
                    _e(stream),
                    _num(x.get("held")),
                    _num(lat.get("p50"), 1, " s"),
                    _num(lat.get("p99"), 1, " s"),
                ]
            )
    if per:
        parts.append("<details><summary>per stream</summary>")
        parts.append(_table(["site", "stream", "held", "p50", "p99"], per))
        parts.append("</details>")

    alert = report.get("alert")
    parts.append("<h2>Containers overboard</h2>")
    if alert:
        parts.append(
            f"<p>{_e(alert.get('ship'))} lost {_e(', '.join(alert.get('containers') or []))} at "
            f"t={_num(alert.get('event_s'))} s. The ship's agent raised an <code>overboard</code> alert "
            "(a shock, then silence) and sent it over the satellite.</p>"
        )
        rows = [
            [
                _e(k),
                _num(v.get("latency_s"), 1, " s"),
                _num(v.get("all_s"), 1, " s"),
                _num(v.get("alerts")),
            ]
            for k, v in (alert.get("sites") or {}).items()
        ]
        parts.append(_table(["site", "first alert after", "all alerts after", "alerts"], rows))
        hops = [h for h in alert.get("timeline") or [] if isinstance(h, dict)]
        if hops:
            parts.append("<p>The first alert to arrive anywhere, hop by hop:</p>")
            parts.append(
                _table(
                    ["hop", "after the event", "this hop took"],
                    [
                        [
                            _e(h.get("hop")),
                            _num(h.get("after_s"), 1, " s"),
                            _num(h.get("took_s"), 1, " s"),
                        ]
                        for h in hops
                    ],
                )
            )
        parts.append(_chart(_alert_chart, alert))
    else:
        parts.append("<p class='muted'>no overboard event in this run</p>")

    calls = report.get("port_calls") or []
    parts.append("<h2>Each port knew the cargo before the ship docked</h2>")
    if calls:
        rows = [
            [
                _e(c.get("ship")),
                _e(c.get("port")),
                _num(c.get("docked_s"), 1, " s"),
                _num(c.get("manifest_s"), 1, " s"),
                _num(c.get("earlier_data_s"), 1, " s"),
                f"<span class='{'' if c.get('ok') else 'bad'}'>{_num(c.get('lead_s'), 1, ' s')}</span>",
                _num(c.get("earlier_records")),
            ]
            for c in calls
        ]
        parts.append(
            _table(
                [
                    "ship",
                    "port",
                    "docked at",
                    "manifest held at",
                    "earlier data held at",
                    "lead",
                    "records from earlier ports",
                ],
                rows,
            )
        )

    links = report.get("links") or {}
    parts.append("<h2>Bytes on the ship links</h2>")
    if links:
        rows = []
        for ship, x in links.items():
            sat = x.get("satellite") or {}
            sent = x.get("sent_bytes") or {}
            rows.append(
                [
                    _e(ship),
                    _num(x.get("messages")),
                    _num(x.get("raw_payload_bytes")),
                    _num(x.get("mqtt_bridge_bytes")),
                    _num(sent.get("port_wifi")),
                    _num(sent.get("satellite")),
                    _num(x.get("total_sent_bytes")),
                    _num(x.get("vs_raw"), 3),
                    _num(x.get("vs_mqtt"), 3),
                    f"{_num(sat.get('spent_bytes'))} / {_num(sat.get('budget_bytes'))}",
                ]
            )
        parts.append(
            _table(
                [
                    "ship",
                    "messages",
                    "payload bytes",
                    "as MQTT bridging",
                    "port Wi-Fi",
                    "satellite",
                    "on links",
                    "÷ payloads",
                    "÷ MQTT",
                    "satellite spend / day budget",
                ],
                rows,
            )
        )

    parts += _fleet_section(report.get("fleet_registry"))

    cust = report.get("customer")
    if cust:
        parts.append("<h2>A customer reads its own containers, and nothing else</h2>")
        ref = cust.get("refused_other") or {}
        parts.append(
            "<p>"
            + _e(
                f"customer-{cust.get('customer')} (owner codes {', '.join(cust.get('owner_codes') or [])}) "
                f"ran `shorelink consume --customer {cust.get('customer')} --follow` at HQ for the "
                "whole voyage, with its own credentials (SASL/SCRAM over TLS)."
            )
            + "</p>"
        )
        parts.append(
            _table(
                [
                    "read",
                    "identities",
                    "HQ holds of its containers",
                    "missing",
                    "read twice",
                    "other owners' records",
                    "its containers",
                    "alerts about",
                ],
                [
                    [
                        _num(cust.get("records")),
                        _num(cust.get("identities")),
                        _num(cust.get("expected")),
                        _num(cust.get("missing")),
                        _num(cust.get("duplicates")),
                        _num(cust.get("foreign")),
                        _num(cust.get("containers")),
                        _e(", ".join(cust.get("alerts_about") or []) or "-"),
                    ]
                ],
            )
        )
        parts.append(
            "<p>"
            + _e(
                f"The same consumer asking for {ref.get('customer')}'s stream: exit "
                f'{ref.get("exit")}, {ref.get("printed")} records, "{ref.get("error")}" — '
                + ("refused, as it must be." if cust.get("refused_ok") else "NOT refused.")
            )
            + "</p>"
        )

    hist = report.get("container_history")
    parts.append("<h2>One overboard container's history</h2>")
    if hist and hist.get("rows"):
        cols = [
            c
            for c in (
                "ts",
                "origin",
                "seq",
                "site",
                "temperature",
                "humidity",
                "door",
                "shock",
                "battery",
            )
            if c in hist["rows"][0]
        ]
        rows = [[_e(r.get(c)) for c in cols] for r in hist["rows"]]
        parts.append(
            f"<p>{_e(hist.get('container'))}, from {_e(hist.get('site'))}'s <code>container_readings</code> "
            f"Delta table: {len(rows)} readings (origin = the ship that carried it, site = where it entered).</p>"
        )
        shown = rows if len(rows) <= 60 else [*rows[:30], ["&hellip;"] * len(cols), *rows[-30:]]
        parts.append(_table(cols, shown))
    else:
        parts.append("<p class='muted'>not available</p>")

    parts += _ops_section(report.get("ops"))

    parts.append("<h2>Over time</h2>")
    parts.append(
        _chart(_series_chart, series.get("records") or {}, "records held at each site", "records")
    )
    parts.append(
        _chart(
            _series_chart,
            series.get("backlog") or {},
            "backlog on each ship (records no site holds yet)",
            "records",
        )
    )
    parts.append(_chart(_links_chart, series))
    parts.append("<h2>Route map</h2>")
    parts.append(_chart(_map, series, alert))
    parts.append("</body></html>")
    return "\n".join(p for p in parts if p)


def write_report(report: dict[str, Any], dir: Path) -> Path:
    """Write ``dir/report.html`` atomically; return its path."""
    path = dir / "report.html"
    write_atomic(path, render_html(report))
    return path
