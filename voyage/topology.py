"""The voyage's world: four sites (three ports and headquarters), the links between
sites, and the links each ship has.

Ports are where ships dock (Tokyo, Singapore, Sydney): each runs a gateway that ships
reach over port Wi-Fi while docked, and a Kafka + Spark data centre. Headquarters in Los
Angeles is reached by every ship over the satellite at sea (alerts and positions only,
on a daily budget). Sites are linked in a line Tokyo - Singapore - Sydney with each also
linked to HQ, so that when the Singapore - Sydney link is cut in the middle of the
voyage, Sydney still gets Singapore's records (through HQ).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "HQ",
    "OUTAGE",
    "PORTS",
    "SATELLITE",
    "SITES",
    "SITE_LINKS",
    "STREAMS",
    "WIFI",
    "Outage",
    "neighbours",
    "ship_link",
    "site_link",
]

PORTS = ("tokyo", "singapore", "sydney")
HQ = "hq"
SITES = (*PORTS, HQ)
#: the streams every site carries; ``alerts`` is replicated ahead of the others
#: ``agent``: each ship's own reports (edge ``[report]``), for the operations page
STREAMS = ("alerts", "agent", "nav", "cargo", "containers")

#: undirected links between sites (each direction is its own proxy, cut together)
SITE_LINKS: tuple[tuple[str, str], ...] = (
    ("tokyo", "singapore"),
    ("singapore", "sydney"),
    ("tokyo", HQ),
    ("singapore", HQ),
    ("sydney", HQ),
)

#: link classes of the ship's edge agent (deploy/edge/edge.toml)
SATELLITE = "satellite"
WIFI = "port_wifi"


@dataclass(frozen=True)
class Outage:
    """A site link cut from ``start`` to ``end`` (fractions of the voyage)."""

    a: str
    b: str
    start: float
    end: float


#: the outage in the middle of the voyage: while it lasts, Sydney pulls what entered at
#: Singapore (the ships' port call there) another way, through HQ
OUTAGE = Outage("singapore", "sydney", 0.3, 0.55)


def neighbours(site: str) -> list[str]:
    return sorted({b for a, b in SITE_LINKS if a == site} | {a for a, b in SITE_LINKS if b == site})


def site_link(source: str, reader: str) -> str:
    """The proxy ``reader`` reaches ``source``'s Kafka through."""
    return f"site-{source}-for-{reader}"


def ship_link(ship: str, site: str) -> str:
    """The proxy ``ship`` reaches ``site``'s gateway through (satellite for HQ, port Wi-Fi
    for a port)."""
    return f"{ship}-to-{site}"
