"""The fault soak's schedule: a pure function of (seed, minutes, world) that draws the
faults ``bench/soak.py`` applies to real processes, in the spirit of Jepsen's nemesis.

Nothing here touches a process: :func:`draw` returns a list of :class:`Fault` (when,
what, on what, for how long), printable and JSON-able, so a failing seed shows its
schedule and the same seed replays it exactly. What a fault means on the machine (a
signal, a toxiproxy call, ``delete_records``) is the runner's (``bench/soak.py``).

Kinds (every one heals: a process restarts, a link comes back, a broker resumes):

- ``kill``: SIGKILL to a process group (a site's Kafka, its application, its gateway;
  a ship's edge agent or Mosquitto), restarted ``duration`` seconds later;
- ``cut``: a link down (a link between two sites, both directions; or a ship's link to
  one site's gateway);
- ``slow``: a link's latency (and jitter) raised for ``duration``;
- ``pause``: a broker (a site's Kafka, a ship's Mosquitto) stopped with SIGSTOP, and
  SIGCONT after ``duration``;
- ``retention``: records deleted from the start of a site's relay or canonical topic of
  a stream up to ``fraction`` of each partition (Kafka's ``delete_records``; on a
  canonical topic only what another site holds, see ``bench/soak.py``). Its broker may
  be killed or paused at any time after: one killed before Kafka checkpoints the new
  start offset (once a minute) brings the deleted records back, the case the
  self-check's ``replication.self_check_settle`` waits out;
- ``wipe``: a site's application killed, its checkpoint directory removed, started
  again;
- ``ship_key``: a ship's key replaced (``shorelink ship-key new --replace``), its agent
  restarted with the new key, the new keys file reaching each site after its own delay.

Draws: a fault every ``mean_gap`` seconds on average (exponential gaps, bounded),
kinds dealt from a shuffled deck (every kind once before any twice: a short run still
meets them all), targets among those not already under a fault, at most ``max_active``
faults at once, every fault healed by the end of the run.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "KINDS",
    "Fault",
    "World",
    "draw",
    "kinds_of",
    "world",
]

KINDS = ("kill", "cut", "slow", "pause", "retention", "wipe", "ship_key")

#: per kind, (shortest, longest) seconds a fault lasts
DURATION: dict[str, tuple[float, float]] = {
    "kill": (1.0, 20.0),
    "cut": (3.0, 40.0),
    "slow": (5.0, 40.0),
    "pause": (2.0, 15.0),
    "retention": (0.0, 0.0),
    "wipe": (1.0, 10.0),
    "ship_key": (0.0, 30.0),
}


@dataclass(frozen=True)
class World:
    """What the soak runs: sites linked as ``topology`` (``mesh``: every pair;
    ``line``: each to the next), ships each uploading to some of the sites."""

    topology: str
    sites: tuple[str, ...]
    ships: tuple[tuple[str, tuple[str, ...]], ...]
    streams: tuple[str, ...]

    def site_links(self) -> list[tuple[str, str]]:
        """Undirected links between sites."""
        s = self.sites
        if self.topology == "line":
            return [(s[i], s[i + 1]) for i in range(len(s) - 1)]
        return [(a, b) for i, a in enumerate(s) for b in s[i + 1 :]]

    def neighbours(self, site: str) -> list[str]:
        return sorted(
            {b for a, b in self.site_links() if a == site}
            | {a for a, b in self.site_links() if b == site}
        )

    def ship_sites(self, ship: str) -> tuple[str, ...]:
        return dict(self.ships)[ship]

    def processes(self) -> list[str]:
        return [
            *(f"{role}:{s}" for s in self.sites for role in ("kafka", "site", "gateway")),
            *(f"{role}:{ship}" for ship, _ in self.ships for role in ("edge", "mosquitto")),
        ]

    def links(self) -> list[str]:
        """``site:a~b`` (between two sites) and ``ship:SHIP>SITE`` (a ship's link)."""
        return [f"site:{a}~{b}" for a, b in self.site_links()] + [
            f"ship:{ship}>{s}" for ship, sites in self.ships for s in sites
        ]

    def targets(self, kind: str) -> list[str]:
        if kind == "kill":
            return self.processes()
        if kind in ("cut", "slow"):
            return self.links()
        if kind == "pause":
            return [p for p in self.processes() if p.split(":")[0] in ("kafka", "mosquitto")]
        if kind == "retention":
            return [
                f"{where}:{s}/{stream}"
                for s in self.sites
                for stream in self.streams
                for where in ("relay", "canonical")
            ]
        if kind == "wipe":
            return [f"site:{s}" for s in self.sites]
        if kind == "ship_key":
            return [ship for ship, _ in self.ships]
        raise ValueError(f"unknown fault kind {kind!r}")

    def holds(self, kind: str, target: str) -> str:
        """What a fault keeps busy while it lasts (no other fault there meanwhile): a
        process (a key change restarts the ship's agent), a link, a topic."""
        if kind == "ship_key":
            return f"edge:{target}"
        return target

    def to_json(self) -> dict[str, Any]:
        return {
            "topology": self.topology,
            "sites": list(self.sites),
            "ships": {ship: list(sites) for ship, sites in self.ships},
            "streams": list(self.streams),
            "site_links": [f"{a}~{b}" for a, b in self.site_links()],
        }


def world(topology: str, ships: int = 2) -> World:
    """Three sites (``north``, ``middle``, ``south``; in a line, ``middle`` between the
    other two) and ``ships`` ships: ``ship1`` uploads to ``north`` and ``middle``, ``ship2``
    to ``south`` and ``north`` (each ship to two sites: the same seq may enter twice)."""
    if topology not in ("mesh", "line"):
        raise ValueError(f"topology {topology!r}: mesh or line")
    sites = ("north", "middle", "south")
    uploads = [("north", "middle"), ("south", "north")]
    return World(
        topology,
        sites,
        tuple((f"ship{i + 1}", uploads[i % len(uploads)]) for i in range(ships)),
        ("containers", "alerts"),
    )


@dataclass(frozen=True)
class Fault:
    """One fault: from ``at`` (seconds after the faults start) for ``duration`` s."""

    at: float
    kind: str
    target: str
    duration: float
    #: kind-specific: ``latency_ms``/``jitter_ms`` (slow), ``fraction`` (retention),
    #: ``reach`` (ship_key: site -> seconds after ``at`` its keys file is updated)
    detail: dict[str, Any] = field(default_factory=dict, hash=False, compare=True)

    @property
    def end(self) -> float:
        return round(self.at + self.duration, 1)

    def to_json(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "kind": self.kind,
            "target": self.target,
            "duration": self.duration,
            **({"detail": self.detail} if self.detail else {}),
        }

    def __str__(self) -> str:
        extra = f" {json.dumps(self.detail, sort_keys=True)}" if self.detail else ""
        return f"t={self.at:7.1f}s {self.kind:<9} {self.target} for {self.duration:.1f}s{extra}"


def _detail(
    rng: random.Random, kind: str, target: str, w: World, duration: float
) -> dict[str, Any]:
    if kind == "slow":
        return {"latency_ms": rng.choice((200, 500, 1000, 3000)), "jitter_ms": rng.choice((0, 100))}
    if kind == "retention":
        return {"fraction": round(rng.uniform(0.2, 1.0), 2)}
    if kind == "ship_key":
        sites = list(w.sites)
        rng.shuffle(sites)
        # the file reaches the sites one by one (copied by hand), the last at `duration`
        delays = sorted(round(rng.uniform(0, duration), 1) for _ in sites)
        if delays:
            delays[-1] = duration
        return {"reach": dict(zip(sites, delays, strict=True))}
    return {}


def draw(
    seed: int,
    minutes: float,
    w: World,
    *,
    mean_gap: float = 10.0,
    max_active: int = 3,
) -> list[Fault]:
    """The faults of a run of ``minutes`` minutes over ``w``, drawn from ``seed`` alone
    (the same arguments give the same list). Every fault ends within the run."""
    rng = random.Random(f"shorelink-soak/{seed}/{w.topology}")
    horizon = minutes * 60.0
    out: list[Fault] = []
    busy: dict[str, float] = {}  # what a fault holds -> until when
    deck: list[str] = []
    t = rng.uniform(1.0, mean_gap)
    # bounded: each turn either adds a fault or moves t forward by at least a second
    for _ in range(int(horizon) * 4 + 100):
        t = round(t, 1)  # the times a fault is printed with: what replays
        if t >= horizon - 1.0:
            break
        active = sorted(f.end for f in out if f.at <= t < f.end)
        if len(active) >= max_active:
            t = max(t + 1.0, active[0])
            continue
        if not deck:
            deck = list(KINDS)
            rng.shuffle(deck)
        kind = deck.pop()
        free = [x for x in w.targets(kind) if busy.get(w.holds(kind, x), -1.0) <= t]
        if free:
            target = rng.choice(free)
            lo, hi = DURATION[kind]
            duration = round(min(rng.uniform(lo, hi), max(0.0, horizon - t - 1.0)), 1)
            fault = Fault(t, kind, target, duration, _detail(rng, kind, target, w, duration))
            out.append(fault)
            busy[w.holds(kind, target)] = fault.end + 2.0  # a moment to recover
        else:
            deck.insert(0, kind)  # dealt again later
        t += min(max(rng.expovariate(1.0 / mean_gap), 1.0), 3 * mean_gap)
    return out


def kinds_of(faults: list[Fault]) -> dict[str, int]:
    """How many faults of each kind (every kind named, 0 where none)."""
    c = Counter(f.kind for f in faults)
    return {k: c.get(k, 0) for k in KINDS}
