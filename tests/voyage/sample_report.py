"""A realistic ``report.json`` as a dict, shaped like :mod:`voyage.report` writes it, for
the report page and summary tests (no voyage needs to run to check how one is shown)."""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["failed_report", "minimal_report", "sample_report"]

SITES = ["tokyo", "singapore", "sydney", "hq"]
SHIPS = ["ship1", "ship2", "ship3"]
PORTS = {"tokyo": [35.62, 139.79], "singapore": [1.26, 103.84], "sydney": [-33.97, 151.21]}


def _site(i: int) -> dict[str, Any]:
    return {
        "produced": 52000,
        "held": 52000,
        "duplicates": 0,
        "gaps": 0,
        "missing": 0,
        "latency_s": {"p50": 12.1 + i, "p99": 40.2 + i, "n": 52000},
        "per_stream": {
            "containers": {
                "produced": 50000,
                "held": 50000,
                "latency_s": {"p50": 12.0, "p99": 40.0},
            },
            "alerts": {"produced": 3, "held": 3},
            "nav": {"produced": 1500, "held": 1500},
            "cargo": {"produced": 497, "held": 497},
        },
    }


def _track(start: list[float], end: list[float], n: int = 48) -> list[list[float]]:
    return [
        [i * 5.0, start[0] + (end[0] - start[0]) * i / n, start[1] + (end[1] - start[1]) * i / n]
        for i in range(n + 1)
    ]


def sample_report() -> dict[str, Any]:
    """A passing voyage of three ships with an overboard alert."""
    return {
        "ok": True,
        "problems": [],
        "run": {
            "started": "2026-11-23T02:40:00Z",
            "wall_s": 512.3,
            "voyage_s": 240.0,
            "ships": SHIPS,
            "speed": 5400.0,
            "sites": SITES,
            "hq": "hq",
            "command": "shorelink demo --ships 3",
            "dir": "/tmp/voyage",
        },
        "sites": {name: _site(i) for i, name in enumerate(SITES)},
        "port_calls": [
            {
                "ship": "ship1",
                "port": "singapore",
                "docked_s": 200.1,
                "manifest_s": 150.0,
                "earlier_data_s": 160.2,
                "lead_s": 40.1,
                "earlier_records": 5000,
                "ok": True,
            },
            {
                "ship": "ship2",
                "port": "sydney",
                "docked_s": 230.0,
                "manifest_s": 100.0,
                "earlier_data_s": None,
                "lead_s": -3.5,
                "earlier_records": 0,
                "ok": False,
            },
        ],
        "alert": {
            "ship": "ship3",
            "containers": ["BBLU1234565", "MSCU7654321"],
            "event_s": 123.4,
            "raised_s": 125.0,
            "position": [10.0, 120.0],
            "sites": {
                "tokyo": {"latency_s": 8.2, "all_s": 9.0, "alerts": 2},
                "singapore": {"latency_s": 9.0, "all_s": 9.5, "alerts": 2},
                "sydney": {"latency_s": None, "all_s": None, "alerts": 0},
                "hq": {"latency_s": 3.1, "all_s": 3.3, "alerts": 2},
            },
            "timeline": [
                {"hop": "overboard", "after_s": 0.0, "took_s": None},
                {"hop": "raised on the ship (shock + silence)", "after_s": 1.6, "took_s": 1.6},
                {"hop": "written at hq's gateway", "after_s": 2.4, "took_s": 0.8},
                {"hop": "merged at hq", "after_s": 3.1, "took_s": 0.7},
                {"hop": "merged at tokyo", "after_s": 8.2, "took_s": 5.1},
                {"hop": "merged at singapore", "after_s": 9.0, "took_s": 0.8},
            ],
        },
        "links": {
            ship: {
                "messages": 20000,
                "raw_payload_bytes": 4000000,
                "mqtt_bridge_bytes": 4800000,
                "sent_bytes": {"satellite": 120000, "port_wifi": 900000},
                "total_sent_bytes": 1020000,
                "vs_raw": 0.255,
                "vs_mqtt": 0.21,
                "satellite": {"spent_bytes": 120000, "budget_bytes": 20000000, "share": 0.006},
            }
            for ship in SHIPS
        },
        "container_history": {
            "container": "BBLU1234565",
            "site": "hq",
            "rows": [
                {
                    "ts": f"2026-11-24T03:{m:02d}:00Z",
                    "origin": "ship3",
                    "site": "tokyo",
                    "temperature": 4.1,
                    "humidity": 60.0,
                    "door": "closed",
                    "shock": 0.3,
                    "battery": 3.6,
                }
                for m in range(10)
            ],
        },
        "series": {
            "records": {s: [[t * 5.0, t * 1000] for t in range(50)] for s in SITES},
            "backlog": {s: [[t * 5.0, (t % 7) * 100] for t in range(50)] for s in SHIPS},
            "links": {
                ship: [
                    {"from_s": 0.0, "to_s": 30.0, "link": "port_wifi:tokyo"},
                    {"from_s": 30.0, "to_s": 120.0, "link": "satellite"},
                    {"from_s": 120.0, "to_s": 125.0, "link": None},
                    {"from_s": 125.0, "to_s": None, "link": "satellite"},
                ]
                for ship in SHIPS
            },
            "site_links": [
                {"a": "tokyo", "b": "singapore", "from_s": 100.0, "to_s": 160.0, "up": False}
            ],
            "tracks": {
                "ship1": _track(PORTS["tokyo"], PORTS["singapore"]),
                "ship2": _track(PORTS["singapore"], PORTS["sydney"]),
                "ship3": _track(PORTS["sydney"], PORTS["tokyo"]),
            },
            "ports": PORTS,
            "hq_position": [33.74, -118.27],
            "alerts": [[123.4, "ship3", "BBLU1234565", "overboard"]],
            "docked": {"ship1": [{"port": "tokyo", "from_s": 0.0, "to_s": 30.0}]},
        },
    }


def failed_report() -> dict[str, Any]:
    """The sample with singapore short of records and a duplicate at sydney."""
    r = copy.deepcopy(sample_report())
    r["ok"] = False
    r["problems"] = [
        "singapore lacks 12 records of ship2/containers",
        "sydney holds ship1/nav seq 17 twice",
    ]
    r["sites"]["singapore"].update(held=51988, missing=12, gaps=1)
    r["sites"]["sydney"].update(held=52001, duplicates=1)
    return r


def minimal_report() -> dict[str, Any]:
    """Only the parts every report has: a run that ended early."""
    r = sample_report()
    return {k: r[k] for k in ("ok", "problems", "run", "sites")} | {"ok": False}
