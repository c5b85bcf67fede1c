"""Playing the links by the voyage plan: each ship's port Wi-Fi is up while it is
docked (and for a few hours of voyage time after it leaves, while the coast is in
reach); the satellite to HQ is always up (slow, far, on a budget); the link between
Tokyo and Singapore is cut in the middle of the voyage. Every change is noted with its
time for the report's timelines.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from local_stack.toxiproxy import Toxiproxy
from voyage.topology import HQ, OUTAGE, PORTS, SATELLITE, WIFI, ship_link, site_link

__all__ = ["COASTAL_SIM_S", "LinkPlayer"]

#: how long after leaving a port its Wi-Fi/cellular still reaches the ship (voyage time)
COASTAL_SIM_S = 6 * 3600


@dataclass
class LinkPlayer:
    toxiproxy: Toxiproxy
    plan: Any  # fleet_sim.plan.VoyagePlan
    ships: list[str]
    #: ship -> port whose Wi-Fi is up now (None: satellite only)
    wifi: dict[str, str | None] = field(default_factory=dict)
    outage_on: bool = False
    #: ship -> [(from_s, to_s or None, link)] with link "port_wifi:<port>" or "satellite"
    timeline: dict[str, list[list[Any]]] = field(default_factory=dict)
    site_outages: list[dict[str, Any]] = field(default_factory=list)

    def wifi_port(self, ship: str, t: float) -> str | None:
        phase = self.plan.phase_at(ship, t)
        if phase.kind == "port":
            return str(phase.port)
        coastal = COASTAL_SIM_S / self.plan.speed
        if phase.leg is not None and t - phase.start_s < coastal:
            return str(phase.leg[0])
        return None

    def outage_window(self) -> tuple[float, float]:
        end = self.plan.end_s()
        return OUTAGE.start * end, OUTAGE.end * end

    def apply(self, t: float) -> None:
        for ship in self.ships:
            port = self.wifi_port(ship, t)
            if ship in self.wifi and self.wifi[ship] == port:
                continue
            before = self.wifi.get(ship)
            for p in PORTS:
                if p in (before, port) or ship not in self.wifi:
                    self.toxiproxy.set_enabled(ship_link(ship, p), p == port)
            self.wifi[ship] = port
            spans = self.timeline.setdefault(ship, [])
            if spans:
                spans[-1][1] = t
            spans.append([t, None, f"{WIFI}:{port}" if port else SATELLITE])
        start, end = self.outage_window()
        cut = start <= t < end
        if cut != self.outage_on:
            for a, b in ((OUTAGE.a, OUTAGE.b), (OUTAGE.b, OUTAGE.a)):
                self.toxiproxy.set_enabled(site_link(a, b), not cut)
            if cut:
                self.site_outages.append({"a": OUTAGE.a, "b": OUTAGE.b, "from_s": t, "to_s": None})
            elif self.site_outages:
                self.site_outages[-1]["to_s"] = t
            self.outage_on = cut

    def heal(self, t: float) -> None:
        """End of the voyage: the site link is back (the ships stay docked at their last
        port, Wi-Fi up, until everything is ashore)."""
        if self.outage_on:
            for a, b in ((OUTAGE.a, OUTAGE.b), (OUTAGE.b, OUTAGE.a)):
                self.toxiproxy.set_enabled(site_link(a, b), True)
            self.site_outages[-1]["to_s"] = t
            self.outage_on = False

    def close(self, t: float) -> None:
        for spans in self.timeline.values():
            if spans and spans[-1][1] is None:
                spans[-1][1] = t
        for o in self.site_outages:
            if o["to_s"] is None:
                o["to_s"] = t

    def link_of(self, ship: str) -> str:
        port = self.wifi.get(ship)
        return f"Wi-Fi {port}" if port else f"satellite ({HQ})"
