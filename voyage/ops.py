"""Headquarters' operations page in the voyage (``shorelink ops``, docs/operations.md):
what it shows at the end, read from its JSON API as Big Blue's staff, checked against
what the voyage knows; and a picture of it for the report when a browser is at hand.

Once every site holds every record, the page must list every ship with a report, none
with records still at sea, and the overboard alert.
"""

from __future__ import annotations

import base64
import json
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from shorelink.logs import get_logger

__all__ = ["CHROMIUM", "CHROMIUM_ARGS", "OpsReader", "problems"]

log = get_logger(__name__)

CHROMIUM = Path("/usr/bin/chromium")
#: Debian's Chromium headless on a machine without the internet: no sandbox (root), no
#: GPU, none of its own connections to Google's services
CHROMIUM_ARGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
)


class OpsReader:
    """Reads one site's page as a staff principal."""

    def __init__(self, url: str, username: str, password: str) -> None:
        self.url = url.rstrip("/")
        self.auth = "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()
        self.username = username
        self.password = password

    def get(self, path: str) -> Any:
        req = urllib.request.Request(self.url + path, headers={"Authorization": self.auth})
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())

    def summary(self, ships: Iterable[str]) -> dict[str, Any]:
        """Each ship as the page shows it, its alerts, and what it says is wrong."""
        try:
            rows = {r["ship"]: r for r in self.get("/api/ships")}
            site = self.get("/api/site")
            alerts = self.get("/api/alerts")
        except (OSError, ValueError) as exc:
            return {"url": self.url + "/", "error": str(exc)}
        out: dict[str, Any] = {
            "url": self.url + "/",
            "ships": {},
            "alerts": len(alerts),
            "alert_keys": sorted({a["key"] for a in alerts}),
            "page_problems": site.get("problems", []),
            "gateway": site.get("gateway"),
        }
        for ship in ships:
            r = rows.get(ship)
            out["ships"][ship] = (
                None
                if r is None
                else {
                    "reported": r["report"] is not None,
                    "link": (r["report"] or {}).get("link"),
                    "backlog_records": r["backlog_records"],
                    "satellite": r["satellite"],
                    "via": r["via"],
                    "position": r["position"],
                }
            )
        return out

    def screenshot(self, path: Path) -> str | None:
        """The page in headless Chromium, as a PNG at ``path``; None when done, else
        why not (no browser here: the voyage does not need one)."""
        if not CHROMIUM.exists():
            return f"no {CHROMIUM}"
        try:
            from playwright.sync_api import sync_playwright
        except ImportError:
            return "playwright is not installed"
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(
                    executable_path=str(CHROMIUM),
                    args=list(CHROMIUM_ARGS),
                )
                try:
                    ctx = browser.new_context(
                        http_credentials={"username": self.username, "password": self.password},
                        viewport={"width": 1400, "height": 1000},
                    )
                    page = ctx.new_page()
                    page.goto(self.url + "/")
                    page.wait_for_selector("#ships tbody tr", timeout=15_000)
                    page.wait_for_function(
                        "document.querySelector('#map-note').textContent.includes('GSHHS')",
                        timeout=15_000,
                    )
                    page.screenshot(path=str(path), full_page=True)
                finally:
                    browser.close()
        except Exception as exc:  # a browser that fails must not fail the voyage
            log.warning("ops_screenshot_failed", error=str(exc))
            return f"screenshot failed: {exc}"
        return None


def problems(summary: dict[str, Any], overboard: Iterable[str] = ()) -> list[str]:
    """What the page got wrong at the end of the voyage."""
    if summary.get("error"):
        return [f"operations page {summary['url']}: {summary['error']}"]
    out = []
    for ship, row in summary["ships"].items():
        if row is None:
            out.append(f"operations page: {ship} is not listed")
        elif not row["reported"]:
            out.append(f"operations page: no report from {ship}")
        elif row["backlog_records"]:
            out.append(
                f"operations page: {ship} shows {row['backlog_records']} records at sea "
                "after every site holds every record"
            )
    missing = set(overboard) - set(summary.get("alert_keys", ()))
    if missing:
        out.append(f"operations page: no alert for {sorted(missing)[:3]}")
    return out
