"""The live view in the terminal (rich): each ship, where it is, its link, its backlog;
records per site and how far each is behind; the links between sites; alerts. Where
the output is not a terminal (CI, a pipe), a progress line every few seconds instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

__all__ = ["LiveState", "progress_line", "render"]


@dataclass
class ShipRow:
    name: str
    where: str = ""
    position: str = ""
    link: str = ""
    backlog: int = 0
    produced: int = 0


@dataclass
class LiveState:
    t: float = 0.0
    voyage_s: float = 0.0
    phase: str = "starting"
    ships: list[ShipRow] = field(default_factory=list)
    sites: dict[str, int] = field(default_factory=dict)  # records held
    duplicates: dict[str, int] = field(default_factory=dict)
    produced: int = 0
    site_links: str = "all up"
    alerts: list[str] = field(default_factory=list)


def render(s: LiveState) -> Any:
    head = Text(
        f"shorelink voyage  {s.phase}  t={s.t:5.0f}s / {s.voyage_s:.0f}s  "
        f"site links: {s.site_links}",
        style="bold",
    )
    ships = Table(title="ships", expand=False)
    for col in ("ship", "where", "position", "link", "backlog", "made"):
        ships.add_column(col, no_wrap=True)
    for r in s.ships:
        ships.add_row(r.name, r.where, r.position, r.link, f"{r.backlog:,}", f"{r.produced:,}")
    sites = Table(title="sites", expand=False)
    for col in ("site", "records", "behind", "dups"):
        sites.add_column(col, no_wrap=True)
    for name, held in s.sites.items():
        behind = max(0, s.produced - held)
        sites.add_row(name, f"{held:,}", f"{behind:,}", str(s.duplicates.get(name, 0)))
    alerts = Text("\n".join(s.alerts[-5:]) or "no alerts yet", style="red" if s.alerts else "dim")
    return Group(head, ships, sites, Text("alerts", style="bold"), alerts)


def progress_line(s: LiveState) -> str:
    ships = " ".join(f"{r.name}:{r.where}/{r.link}/backlog {r.backlog}" for r in s.ships)
    sites = " ".join(f"{n}={h}" for n, h in s.sites.items())
    return (
        f"t={s.t:.0f}s {s.phase} | {ships} | held {sites} of {s.produced} | {len(s.alerts)} alerts"
    )
