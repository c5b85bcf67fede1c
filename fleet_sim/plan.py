"""The voyage plan: when each ship is where, what it carries, and the scripted event at
sea. Pure and deterministic (a seed), and a JSON document, so the simulator that sails
the ships and the orchestrator that plays their links read the same schedule.

Every ship starts docked at Tokyo (loading), sails to Singapore (about 2,900 nm at 20
knots), stays a day (unloading some containers, loading others: some of them unloaded
there by the ship before, transshipment), sails on to Sydney (about 4,600 nm, south of
Australia) and stays. Ships leave Tokyo a day apart. Times in the plan are wall seconds
since the voyage started; voyage time runs ``speed`` times faster and starts at the same
instant (``start_wall``), so an event time converts to wall time and back exactly.

The scripted event: on the last ship's Singapore -> Sydney leg, 40% of the way, three
containers are lost overboard (one of them transshipped at Singapore when there are two
ships or more, so its history spans two ships).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from fleet_sim.geo import HQ_POSITION, PORTS, Route
from fleet_sim.iso6346 import checksum, container_number

__all__ = [
    "Box",
    "CargoChange",
    "Overboard",
    "Phase",
    "ShipPlan",
    "VoyagePlan",
    "plan_voyage",
]

KNOTS = 20.0
CALLS = ("tokyo", "singapore", "sydney")
TOKYO_STAY_H = 12.0
SINGAPORE_STAY_H = 24.0
STAGGER_H = 24.0
SYDNEY_STAY_H = 6.0  # after the last ship docks: its arrival manifest, the last readings
OVERBOARD_AT = 0.4
OVERBOARD_COUNT = 3
UNLOAD_SHARE = 0.25
#: Big Blue's own boxes and those of the lines and shippers it carries for
OWNERS = ("BBL", "MSC", "MAE", "CMA", "HLX", "ONE", "EGL", "TGH", "SEG", "CSQ")


@dataclass(frozen=True)
class Phase:
    start_s: float
    end_s: float
    kind: str  # "port" | "sea"
    port: str | None = None
    leg: tuple[str, str] | None = None


@dataclass(frozen=True)
class Box:
    """A container: its ISO 6346 number and whether it is a reefer held at a setpoint."""

    id: str
    reefer: bool
    setpoint: float | None


@dataclass(frozen=True)
class CargoChange:
    """At ``at_s`` (the departure from ``port``), ``unloaded`` left and ``loaded`` came
    on board."""

    port: str
    at_s: float
    loaded: tuple[str, ...]
    unloaded: tuple[str, ...]


@dataclass(frozen=True)
class Overboard:
    ship: str
    at_s: float
    containers: tuple[str, ...]


@dataclass(frozen=True)
class ShipPlan:
    name: str
    mmsi: int
    phases: tuple[Phase, ...]
    cargo: tuple[CargoChange, ...]
    lost: tuple[str, ...] = ()  # containers lost overboard (from the plan's event on)
    lost_at_s: float | None = None

    def on_board(self, t_s: float) -> set[str]:
        """Containers on board at ``t_s``: loaded at a departure at or before it, not
        unloaded since, not lost."""
        boxes: set[str] = set()
        for change in self.cargo:
            if change.at_s <= t_s:
                boxes -= set(change.unloaded)
                boxes |= set(change.loaded)
        if self.lost_at_s is not None and t_s >= self.lost_at_s:
            boxes -= set(self.lost)
        return boxes

    def ever_on_board(self) -> set[str]:
        return {c for change in self.cargo for c in change.loaded}


@dataclass(frozen=True)
class VoyagePlan:
    ships: tuple[ShipPlan, ...]
    speed: float  # voyage seconds per wall second
    start_wall: float  # epoch seconds; voyage time equals wall time at the start
    overboard: Overboard
    boxes: dict[str, Box] = field(default_factory=dict)
    transshipped: tuple[str, ...] = ()
    ais_ship: str | None = None
    seed: int = 1
    hq_position: tuple[float, float] = HQ_POSITION

    # -- time --------------------------------------------------------------------------
    def sim_time(self, t_s: float) -> float:
        """Voyage time (epoch seconds) at wall offset ``t_s``."""
        return self.start_wall + t_s * self.speed

    def wall_offset(self, sim_epoch_s: float) -> float:
        """Wall seconds since the start at voyage time ``sim_epoch_s``."""
        return (sim_epoch_s - self.start_wall) / self.speed

    def end_s(self) -> float:
        return max(s.phases[-1].end_s for s in self.ships)

    # -- where ---------------------------------------------------------------------------
    def ship(self, name: str) -> ShipPlan:
        for s in self.ships:
            if s.name == name:
                return s
        raise KeyError(f"no ship {name!r} in the plan")

    def phase_at(self, ship: str, t_s: float) -> Phase:
        phases = self.ship(ship).phases
        for p in phases:
            if t_s < p.end_s:
                return p
        return phases[-1]

    def position_at(self, ship: str, t_s: float) -> tuple[float, float, float, float]:
        """(lat, lon, speed over ground in knots, course)."""
        p = self.phase_at(ship, t_s)
        if p.kind == "port" or p.leg is None:
            lat, lon = PORTS[str(p.port)]
            return lat, lon, 0.0, 0.0
        f = (t_s - p.start_s) / (p.end_s - p.start_s) if p.end_s > p.start_s else 1.0
        lat, lon, course = Route.between(*p.leg).position_at(f)
        return lat, lon, KNOTS, course

    def port_position(self, port: str) -> tuple[float, float]:
        return PORTS[port]

    # -- JSON ----------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "speed": self.speed,
            "start_wall": self.start_wall,
            "seed": self.seed,
            "ais_ship": self.ais_ship,
            "transshipped": list(self.transshipped),
            "overboard": {
                "ship": self.overboard.ship,
                "at_s": self.overboard.at_s,
                "containers": list(self.overboard.containers),
            },
            "boxes": {
                b.id: {"reefer": b.reefer, "setpoint": b.setpoint} for b in self.boxes.values()
            },
            "ships": [
                {
                    "name": s.name,
                    "mmsi": s.mmsi,
                    "lost": list(s.lost),
                    "lost_at_s": s.lost_at_s,
                    "phases": [
                        {
                            "start_s": p.start_s,
                            "end_s": p.end_s,
                            "kind": p.kind,
                            "port": p.port,
                            "leg": list(p.leg) if p.leg else None,
                        }
                        for p in s.phases
                    ],
                    "cargo": [
                        {
                            "port": c.port,
                            "at_s": c.at_s,
                            "loaded": list(c.loaded),
                            "unloaded": list(c.unloaded),
                        }
                        for c in s.cargo
                    ],
                }
                for s in self.ships
            ],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> VoyagePlan:
        try:
            ships = tuple(
                ShipPlan(
                    s["name"],
                    int(s["mmsi"]),
                    tuple(
                        Phase(
                            float(p["start_s"]),
                            float(p["end_s"]),
                            p["kind"],
                            p.get("port"),
                            (p["leg"][0], p["leg"][1]) if p.get("leg") else None,
                        )
                        for p in s["phases"]
                    ),
                    tuple(
                        CargoChange(
                            c["port"], float(c["at_s"]), tuple(c["loaded"]), tuple(c["unloaded"])
                        )
                        for c in s["cargo"]
                    ),
                    tuple(s.get("lost", ())),
                    s.get("lost_at_s"),
                )
                for s in d["ships"]
            )
            ob = d["overboard"]
            return cls(
                ships,
                float(d["speed"]),
                float(d["start_wall"]),
                Overboard(ob["ship"], float(ob["at_s"]), tuple(ob["containers"])),
                {k: Box(k, bool(v["reefer"]), v["setpoint"]) for k, v in d["boxes"].items()},
                tuple(d.get("transshipped", ())),
                d.get("ais_ship"),
                int(d.get("seed", 1)),
            )
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise ValueError(f"not a voyage plan: {exc!r}") from exc


def _hours(ships: int) -> float:
    """Voyage hours from the start until the last ship has docked at Sydney (+ stay)."""
    sail = sum(Route.between(a, b).length_nm / KNOTS for a, b in itertools.pairwise(CALLS))
    return TOKYO_STAY_H + (ships - 1) * STAGGER_H + sail + SINGAPORE_STAY_H + SYDNEY_STAY_H


def plan_voyage(
    ships: Sequence[str],
    *,
    minutes: float | None = None,
    speed: float | None = None,
    containers: int = 40,
    seed: int = 1,
    start_wall: float,
) -> VoyagePlan:
    """The plan for ``ships``: ``minutes`` (wall, until the last ship has docked at
    Sydney) or ``speed`` (voyage seconds per wall second), exactly one of them."""
    if (minutes is None) == (speed is None):
        raise ValueError("give minutes or speed, exactly one")
    if not ships or len(set(ships)) != len(ships):
        raise ValueError(f"ships must be distinct names, at least one: {list(ships)}")
    if containers < OVERBOARD_COUNT + 1:
        raise ValueError(f"at least {OVERBOARD_COUNT + 1} containers per ship")
    total_h = _hours(len(ships))
    if minutes is not None:
        if minutes <= 0:
            raise ValueError("minutes must be > 0")
        speed = total_h * 3600 / (minutes * 60)
    assert speed is not None
    if speed <= 0:
        raise ValueError("speed must be > 0")
    rng = random.Random(seed)
    h = 3600.0 / speed  # wall seconds per voyage hour
    serials = iter(rng.sample(range(100_000, 999_999), containers * len(ships) * 2 + 10))
    boxes: dict[str, Box] = {}

    def new_box() -> str:
        owner = rng.choice(OWNERS)
        serial = next(serials)
        while checksum(f"{owner}U{serial:06d}") == 10:  # the serials the standard avoids
            serial = next(serials)
        number = container_number(owner, serial)
        reefer = rng.random() < 0.3
        boxes[number] = Box(number, reefer, rng.choice((-18.0, 4.0)) if reefer else None)
        return number

    yard: list[str] = []  # unloaded at Singapore, waiting for a later ship
    transshipped: list[str] = []
    plans: list[ShipPlan] = []
    legs = [Route.between(a, b).length_nm / KNOTS for a, b in itertools.pairwise(CALLS)]
    end = total_h * h
    for k, name in enumerate(ships):
        depart_tokyo = (TOKYO_STAY_H + k * STAGGER_H) * h
        arrive_sin = depart_tokyo + legs[0] * h
        depart_sin = arrive_sin + SINGAPORE_STAY_H * h
        arrive_syd = depart_sin + legs[1] * h
        phases = (
            Phase(0.0, depart_tokyo, "port", port="tokyo"),
            Phase(depart_tokyo, arrive_sin, "sea", leg=("tokyo", "singapore")),
            Phase(arrive_sin, depart_sin, "port", port="singapore"),
            Phase(depart_sin, arrive_syd, "sea", leg=("singapore", "sydney")),
            Phase(arrive_syd, end, "port", port="sydney"),
        )
        first = tuple(new_box() for _ in range(containers))
        unload = tuple(sorted(rng.sample(first, max(1, int(containers * UNLOAD_SHARE)))))
        from_yard = yard[: len(unload) // 2 + (1 if yard else 0)]
        del yard[: len(from_yard)]
        transshipped += from_yard
        fresh = tuple(new_box() for _ in range(len(unload) - len(from_yard)))
        loaded_sin = (*from_yard, *fresh)
        yard += list(unload)
        plans.append(
            ShipPlan(
                name,
                mmsi=211_000_000 + 100 * (k + 1) + rng.randrange(100),
                phases=phases,
                cargo=(
                    CargoChange("tokyo", 0.0, first, ()),
                    CargoChange("singapore", depart_sin, loaded_sin, unload),
                ),
            )
        )
    # the overboard event: the last ship, 40% along Singapore -> Sydney
    last = plans[-1]
    sea = last.phases[3]
    at = sea.start_s + OVERBOARD_AT * (sea.end_s - sea.start_s)
    aboard = sorted(last.on_board(at))
    lost = [c for c in aboard if c in transshipped][:1]
    lost += [c for c in aboard if c not in lost][: OVERBOARD_COUNT - len(lost)]
    plans[-1] = ShipPlan(last.name, last.mmsi, last.phases, last.cargo, tuple(lost), at)
    return VoyagePlan(
        tuple(plans),
        speed,
        start_wall,
        Overboard(last.name, at, tuple(lost)),
        boxes,
        tuple(transshipped),
        ais_ship=ships[0],
        seed=seed,
    )
