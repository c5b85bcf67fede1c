"""Sailing the plan against real brokers: every ship's sensors publish to that ship's
Mosquitto as MQTT QoS 1, in wall time, with aiomqtt (the maintained asyncio client).

:func:`ship_messages` is the whole schedule of one ship, pure and in time order: a
position every ``position_interval_sim_s`` of voyage time, a reading of every container
on board every ``reading_interval_sim_s`` (also in port), a cargo manifest on arrival
and departure, the overboard spike, and on one ship the real AIS sentences spread over
its voyage. :func:`run_fleet` publishes them and writes what happened to an events file
(JSON lines) that the orchestrator follows: positions, arrivals and departures, the
overboard event with the wall time of the spike, and cumulative byte counts (the raw
payloads, and what MQTT QoS 1 would put on a wire for the same messages, which is what
bridging them from ship to shore would send).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import aiomqtt
import structlog

from fleet_sim.plan import VoyagePlan
from fleet_sim.sensors import reading

__all__ = [
    "DEFAULT_AIS",
    "FleetStats",
    "Message",
    "mqtt_publish_bytes",
    "position_payload",
    "read_ais",
    "run_fleet",
    "ship_messages",
]

log = structlog.get_logger("fleet_sim")

#: the real AIS sample, package data of fleet_sim (its source and licence: data/SOURCE.md)
DEFAULT_AIS = Path(__file__).resolve().parent / "data" / "nmea_data_sample.txt"
EVENTS_EVERY_S = 2.0
#: publishes awaiting their PUBACK at once (aiomqtt warns above 10 pending calls)
PUBLISH_AT_ONCE = 10


def mqtt_publish_bytes(topic: str, payload_len: int) -> int:
    """Bytes of one QoS 1 MQTT 3.1.1 PUBLISH (fixed header, remaining length, topic,
    packet id, payload) plus its 4-byte PUBACK."""
    remaining = 2 + len(topic.encode()) + 2 + payload_len
    varint = 1
    while remaining >= 128**varint:
        varint += 1
    return 1 + varint + remaining + 4


@dataclass(frozen=True)
class Message:
    t_s: float  # wall seconds since the start
    topic: str
    payload: bytes
    stream: str  # containers | nav | cargo (what the topic is about)
    overboard: tuple[str, ...] = ()  # the spike of these containers


def _stream_of(topic: str) -> str:
    parts = topic.split("/")
    return {"containers": "containers", "nav": "nav", "cargo": "cargo"}.get(parts[2], "other")


def position_payload(plan: VoyagePlan, ship: str, t: float) -> bytes:
    """The ship's own position report (its ``nav/position`` payload: time, MMSI,
    position, speed and course over ground) at wall offset ``t``."""
    lat, lon, sog, cog = plan.position_at(ship, t)
    body = {
        "ts": int(plan.sim_time(t) * 1000),
        "mmsi": plan.ship(ship).mmsi,
        "lat": round(lat, 5),
        "lon": round(lon, 5),
        "sog": sog,
        "cog": round(cog, 1),
    }
    return json.dumps(body, separators=(",", ":")).encode()


def ship_messages(
    plan: VoyagePlan,
    ship: str,
    *,
    reading_interval_sim_s: float = 3600.0,
    position_interval_sim_s: float = 600.0,
    ais_lines: list[bytes] | None = None,
) -> list[Message]:
    """Every message ``ship`` publishes, in time order."""
    sp = plan.ship(ship)
    end = plan.end_s()
    out: list[Message] = []
    prefix = f"bigblue/{ship}"

    def ts_ms(t: float) -> int:
        return int(plan.sim_time(t) * 1000)

    def manifest(t: float, port: str, event: str) -> Message:
        change = next((c for c in sp.cargo if c.port == port and event == "departure"), None)
        body = {
            "ts": ts_ms(t),
            "ship": ship,
            "port": port,
            "event": event,
            "on_board": sorted(sp.on_board(t)),
            "loaded": sorted(change.loaded) if change else [],
            "unloaded": sorted(change.unloaded) if change else [],
        }
        payload = json.dumps(body, separators=(",", ":")).encode()
        return Message(t, f"{prefix}/cargo/manifest", payload, "cargo")

    for p in sp.phases:
        if p.kind == "port" and p.port:
            out.append(manifest(p.start_s, p.port, "arrival"))
            if p is not sp.phases[-1]:
                out.append(manifest(p.end_s, p.port, "departure"))

    def env(
        box: str, t: float, lat: float, lon: float, at_sea: bool, *, overboard: bool = False
    ) -> Message:
        """The next reading of ``box`` (its overboard spike with ``overboard``)."""
        n = counters[box] = counters.get(box, 0) + 1
        payload = reading(
            plan.boxes[box],
            n,
            ts_ms=ts_ms(t),
            lat=lat,
            lon=lon,
            at_sea=at_sea or overboard,
            seed=plan.seed,
            overboard=overboard,
        )
        spike = (box,) if overboard else ()
        return Message(t, f"{prefix}/containers/{box}/env", payload, "containers", spike)

    counters: dict[str, int] = {}
    step = position_interval_sim_s / plan.speed
    every = max(1, round(reading_interval_sim_s / position_interval_sim_s))
    spiked = False
    k = 0
    while k * step <= end:
        t = k * step
        lat, lon, _sog, _cog = plan.position_at(ship, t)
        out.append(Message(t, f"{prefix}/nav/position", position_payload(plan, ship, t), "nav"))
        at_sea = plan.phase_at(ship, t).kind == "sea"

        where = (t, lat, lon, at_sea)
        if sp.lost and sp.lost_at_s is not None and not spiked and t >= sp.lost_at_s:
            spiked = True
            out += [env(c, *where, overboard=True) for c in sp.lost]
        if k % every == 0:
            out += [env(c, *where) for c in sorted(sp.on_board(t))]
        k += 1

    if ais_lines and ship == plan.ais_ship:
        gap = end / len(ais_lines)
        out += [
            Message((j + 0.5) * gap, f"{prefix}/nav/ais", line, "nav")
            for j, line in enumerate(ais_lines)
        ]
    out.sort(key=lambda m: m.t_s)  # stable: a moment's messages keep their order
    return out


def read_ais(path: Path) -> list[bytes]:
    """The sentences of an AIS file, unchanged, one per non-empty line."""
    return [line for line in path.read_bytes().splitlines() if line.strip()]


@dataclass
class ShipStats:
    messages: int = 0
    payload_bytes: int = 0
    mqtt_bytes: int = 0
    streams: dict[str, dict[str, int]] = field(default_factory=dict)

    def add(self, m: Message) -> None:
        wire = mqtt_publish_bytes(m.topic, len(m.payload))
        self.messages += 1
        self.payload_bytes += len(m.payload)
        self.mqtt_bytes += wire
        s = self.streams.setdefault(m.stream, {"messages": 0, "payload_bytes": 0, "mqtt_bytes": 0})
        s["messages"] += 1
        s["payload_bytes"] += len(m.payload)
        s["mqtt_bytes"] += wire


@dataclass
class FleetStats:
    ships: dict[str, ShipStats] = field(default_factory=dict)
    overboard_s: float | None = None


class _Events:
    def __init__(self, path: Path | None) -> None:
        self.file: TextIO | None = open(path, "a") if path else None  # noqa: SIM115

    def write(self, **event: Any) -> None:
        if self.file is not None:
            self.file.write(json.dumps(event, separators=(",", ":")) + "\n")
            self.file.flush()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


async def _sail(
    plan: VoyagePlan,
    ship: str,
    broker: tuple[str, int],
    messages: list[Message],
    stats: ShipStats,
    fleet: FleetStats,
    events: _Events,
) -> None:
    host, port = broker
    i = 0
    phase = None
    last_event = 0.0
    while i < len(messages):
        try:
            async with aiomqtt.Client(
                host, port, identifier=f"fleet-sim-{ship}", keepalive=30
            ) as client:
                while i < len(messages):
                    delay = plan.start_wall + messages[i].t_s - time.time()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    now = time.time() - plan.start_wall
                    j = i + 1
                    while j < len(messages) and messages[j].t_s <= now and j - i < PUBLISH_AT_ONCE:
                        j += 1
                    batch = messages[i:j]
                    spikes = [m for m in batch if m.overboard]
                    spike_s = time.time() - plan.start_wall
                    await asyncio.gather(
                        *(client.publish(m.topic, m.payload, qos=1) for m in batch)
                    )
                    for m in batch:
                        stats.add(m)
                    i = j
                    if spikes:
                        fleet.overboard_s = spike_s
                        lat, lon, _sog, _cog = plan.position_at(ship, batch[0].t_s)
                        events.write(
                            t=round(spike_s, 3),
                            ship=ship,
                            kind="overboard",
                            containers=[c for m in spikes for c in m.overboard],
                            position=[round(lat, 4), round(lon, 4)],
                        )
                    ph = plan.phase_at(ship, now)
                    if ph != phase:
                        if phase is not None and phase.kind == "port":
                            events.write(t=round(now, 3), ship=ship, kind="depart", port=phase.port)
                        if ph.kind == "port":
                            events.write(t=round(now, 3), ship=ship, kind="arrive", port=ph.port)
                        phase = ph
                    if now - last_event >= EVENTS_EVERY_S or i == len(messages):
                        last_event = now
                        lat, lon, sog, cog = plan.position_at(ship, now)
                        where = (
                            ph.port
                            if ph.kind == "port"
                            else f"{ph.leg[0]}->{ph.leg[1]}"
                            if ph.leg
                            else ""
                        )
                        events.write(
                            t=round(now, 3),
                            ship=ship,
                            kind="position",
                            lat=round(lat, 4),
                            lon=round(lon, 4),
                            sog=sog,
                            cog=round(cog, 1),
                            phase=ph.kind,
                            where=where,
                        )
                        events.write(
                            t=round(now, 3),
                            ship=ship,
                            kind="stats",
                            messages=stats.messages,
                            payload_bytes=stats.payload_bytes,
                            mqtt_bytes=stats.mqtt_bytes,
                            streams=stats.streams,
                        )
        except aiomqtt.MqttError as exc:
            # what was not acknowledged is published again: the sensor retries too
            log.warning("ship_reconnecting", ship=ship, broker=f"{host}:{port}", error=str(exc))
            await asyncio.sleep(1.0)


async def run_fleet(
    plan: VoyagePlan,
    brokers: Mapping[str, tuple[str, int]],
    *,
    events: Path | None = None,
    reading_interval_sim_s: float = 3600.0,
    position_interval_sim_s: float = 600.0,
    ais_file: Path | None = DEFAULT_AIS,
) -> FleetStats:
    """Publish every ship's messages at their time; return when the plan is over."""
    missing = [s.name for s in plan.ships if s.name not in brokers]
    if missing:
        raise ValueError(f"no broker given for {', '.join(missing)}")
    ais = read_ais(ais_file) if ais_file is not None else None
    fleet = FleetStats()
    out = _Events(events)
    try:
        tasks = []
        for sp in plan.ships:
            msgs = ship_messages(
                plan,
                sp.name,
                reading_interval_sim_s=reading_interval_sim_s,
                position_interval_sim_s=position_interval_sim_s,
                ais_lines=ais,
            )
            stats = fleet.ships[sp.name] = ShipStats()
            tasks.append(_sail(plan, sp.name, brokers[sp.name], msgs, stats, fleet, out))
        await asyncio.gather(*tasks)
    finally:
        out.close()
    return fleet
