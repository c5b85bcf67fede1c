"""A ship's day as the fleet bench sends it: every stream a ship's agent uploads, in
the proportions of a real day, from the voyage's own generators (``fleet_sim``).

A real day of one large container ship (issue "A fleet's worth"):

==================  ======================================  ===========  ========
what                generator                               stream, key  a day
==================  ======================================  ===========  ========
2,500 containers    ``fleet_sim.sensors.reading`` (reefers  containers,  60,000
reporting hourly    at their setpoint, doors, shocks...)    container
AIS every 10 s      the real sample ``fleet_sim/data/``     nav, ais     8,640
                    (``read_ais``), each ship from its own
                    place in it
ship sensors        ``fleet_sim.publisher.position_payload`` nav,        1,440
once a minute       (position, speed, course on its leg)    position
the ship report     ``shorelink.ship_report.encode_report`` agent, ship  144
every 10 minutes    (the edge agent's default interval)
==================  ======================================  ===========  ========

:func:`ship_day` scales that day to ``records`` records of one ship (each kind at
least one record), the last one at ``now``: a ship **at sea** uploads them in the
satellite link's batches (``DEFAULT_LINKS["satellite"]``: 200 records, 32 KiB); a ship
**docking** with a month's backlog holds ``backlog`` times as many (a month to a day,
at the bench's scale) and uploads them in the port link's batches (50,000 records,
8 MiB). The MQTT topics and keys are the voyage's rules (``voyage/configs.py``), so the
site's tables read them as they read the voyage's. Pure and deterministic (the ship's
index seeds it); the bench builds every ship's batches before the load, in worker
processes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import cache

from edge_agent.config import DEFAULT_LINKS, LinkConfig
from fleet_sim.plan import VoyagePlan, plan_voyage
from fleet_sim.publisher import DEFAULT_AIS, position_payload, read_ais
from fleet_sim.sensors import reading
from shorelink.ship_report import REPORT_MQTT_TOPIC, ShipReport, encode_report
from shorelink.wire import Batch, WireRecord, encode_batch

__all__ = ["DAY", "STREAMS", "ShipDay", "link_of", "ship_day"]

#: containers on board a large container ship, each reporting once an hour
CONTAINERS = 2500
#: a real day of one ship, per kind of record: (stream, records a day)
DAY = {
    "containers": ("containers", CONTAINERS * 24),
    "ais": ("nav", 86400 // 10),
    "sensors": ("nav", 86400 // 60),
    "report": ("agent", 86400 // 600),
}
#: the streams a ship uploads, in the agent's priority order (edge.toml's)
STREAMS = ("agent", "nav", "containers")
#: seconds between two records of each kind, in the ship's own time
_EVERY_S = {"containers": 3600 / CONTAINERS, "ais": 10.0, "sensors": 60.0, "report": 600.0}


def link_of(docking: bool) -> LinkConfig:
    """The link a ship uploads over: the port's when docking, else the satellite."""
    return DEFAULT_LINKS["port_wifi" if docking else "satellite"]


def split(records: int) -> dict[str, int]:
    """``records`` of one ship shared among the kinds as in a real day, each at least 1."""
    total = sum(n for _, n in DAY.values())
    out = {k: max(1, round(records * n / total)) for k, (_, n) in DAY.items()}
    out["containers"] = max(1, records - sum(v for k, v in out.items() if k != "containers"))
    return out


@dataclass(frozen=True)
class ShipDay:
    """One ship's records as upload bodies: per stream, (last seq, body) in seq order."""

    ship: str
    docking: bool
    batches: dict[str, list[tuple[int, bytes]]]
    #: records per kind (containers, ais, sensors, report)
    kinds: dict[str, int]

    @property
    def last(self) -> dict[str, int]:
        return {s: b[-1][0] for s, b in self.batches.items() if b}

    @property
    def records(self) -> int:
        return sum(self.kinds.values())


@cache
def _ais() -> tuple[bytes, ...]:
    return tuple(read_ais(DEFAULT_AIS))


def _plan(ship: str, seed: int, boxes: int) -> VoyagePlan:
    """The ship's voyage (Tokyo, Singapore, Sydney) in voyage time, with its boxes."""
    return plan_voyage([ship], speed=1.0, containers=max(4, boxes), seed=seed, start_wall=0.0)


def ship_day(
    ship: str, index: int, records: int, *, docking: bool, backlog: int, now: float | None = None
) -> ShipDay:
    """``ship``'s records (``records`` at sea; ``records * backlog`` docking), the last
    at ``now`` (epoch s), as the batches its agent would upload; ``index`` seeds it."""
    now = time.time() if now is None else now
    n = records * backlog if docking else records
    kinds = split(n)
    plan = _plan(ship, index + 1, min(CONTAINERS, kinds["containers"]))
    sp = plan.ships[0]
    sea = sp.phases[1]  # Tokyo -> Singapore
    # the ship's "now" in its plan: arriving at Singapore when docking, else mid-leg;
    # every record's time in the plan then moved so that the last one is at ``now``
    end = sp.phases[2].start_s if docking else (sea.start_s + sea.end_s) / 2
    span = max(kinds[k] * _EVERY_S[k] for k in kinds)
    end = max(end, sea.start_s + span)
    shift_ms = int((now - end) * 1000)
    prefix = f"bigblue/{ship}"
    out: dict[str, list[tuple[float, str, str, bytes]]] = {s: [] for s in STREAMS}

    boxes = sorted(sp.on_board(end))
    counters = dict.fromkeys(boxes, 0)
    where: dict[int, tuple[float, float, bool]] = {}  # the ship's place, minute by minute
    for j in range(kinds["containers"]):
        t = end - (kinds["containers"] - 1 - j) * _EVERY_S["containers"]
        box = boxes[j % len(boxes)]
        counters[box] += 1
        minute = int(t // 60)
        if minute not in where:
            lat, lon, _sog, _cog = plan.position_at(ship, minute * 60.0)
            where[minute] = (lat, lon, plan.phase_at(ship, t).kind == "sea")
        lat, lon, at_sea = where[minute]
        payload = reading(
            plan.boxes[box],
            counters[box],
            ts_ms=int(t * 1000) + shift_ms,
            lat=lat,
            lon=lon,
            at_sea=at_sea,
            seed=plan.seed,
        )
        out["containers"].append((t, box, f"{prefix}/containers/{box}/env", payload))
    ais = _ais()
    for j in range(kinds["ais"]):
        t = end - (kinds["ais"] - 1 - j) * _EVERY_S["ais"]
        line = ais[(index * 997 + j) % len(ais)]
        out["nav"].append((t, "ais", f"{prefix}/nav/ais", line))
    for j in range(kinds["sensors"]):
        t = end - (kinds["sensors"] - 1 - j) * _EVERY_S["sensors"]
        out["nav"].append(
            (t, "position", f"{prefix}/nav/position", position_payload(plan, ship, t))
        )
    for j in range(kinds["report"]):
        t = end - (kinds["report"] - 1 - j) * _EVERY_S["report"]
        sent = {s: len(out[s]) for s in STREAMS}
        report = ShipReport(
            at_ms=int(t * 1000) + shift_ms,
            link=None if docking else "satellite",
            streams={s: (sent[s], sent[s]) for s in STREAMS},
            links={"satellite": (0, link_of(False).daily_budget_bytes)},
        )
        out["agent"].append((t, ship, REPORT_MQTT_TOPIC, encode_report(report)))
    link = link_of(docking)
    batches = {s: _batches(ship, s, sorted(out[s]), shift_ms, link) for s in STREAMS}
    return ShipDay(ship, docking, batches, kinds)


def _batches(
    ship: str,
    stream: str,
    rows: list[tuple[float, str, str, bytes]],
    shift_ms: int,
    link: LinkConfig,
) -> list[tuple[int, bytes]]:
    """``rows`` (in time order) as wire batches of at most the link's records and
    payload bytes, seqs from 1: (last seq, body)."""
    recs = [
        WireRecord(seq, key, int(t * 1000) + shift_ms, topic, payload)
        for seq, (t, key, topic, payload) in enumerate(rows, 1)
    ]
    out: list[tuple[int, bytes]] = []
    i = 0
    while i < len(recs):
        size, j = 0, i
        while j < len(recs) and j - i < link.batch_max_records:
            r = recs[j]
            size += len(r.payload) + len(r.key) + len(r.topic)
            if size > link.batch_max_bytes and j > i:
                break
            j += 1
        out.append((recs[j - 1].seq, encode_batch(Batch(ship, stream, tuple(recs[i:j])))))
        i = j
    return out
