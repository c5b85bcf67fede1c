"""The container-telemetry workload the benchmarks share: a fleet of containers (ISO
6346 ids; reefers holding a setpoint, dry boxes following the weather) whose sensors
report temperature, humidity, door, shock and battery once a minute."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

__all__ = ["OWNERS", "Container", "fleet", "iso6346"]

OWNERS = ["MSCU", "MEDU", "MAEU", "MSKU", "CMAU", "HLXU", "TGHU", "TCLU", "SEGU", "CAIU"]


def iso6346(owner: str, serial: int) -> str:
    """A container id with its check digit (ISO 6346: letter values skip multiples of 11)."""
    values: dict[str, int] = {}
    v = 10
    for ch in "ABCDEFGHIJKLMNOPQRSTUVWXYZ":
        if v % 11 == 0:
            v += 1
        values[ch] = v
        v += 1
    body = f"{owner}{serial:06d}"
    total = sum((values[c] if c.isalpha() else int(c)) * 2**i for i, c in enumerate(body))
    return f"{body}{total % 11 % 10}"


@dataclass
class Container:
    id: str
    deck: int
    phase_ms: int
    setpoint: float | None  # reefers hold a setpoint; dry boxes follow the weather
    temp: float
    humidity: float
    battery: float
    drain: float
    door_open_for: int = 0

    def topic(self, ship: str) -> str:
        return f"{ship}/deck{self.deck}/containers/{self.id}/env"

    def reading(self, rng: random.Random, ts_ms: int, style: str = "compact") -> bytes:
        """Advance one minute; the payload as the sensor publishes it. ``style``
        "python" is json.dumps of rounded floats (varying decimals, ", " and ": ")."""
        if self.setpoint is not None:  # a reefer's controller pulls back to the setpoint
            self.temp += 0.2 * (self.setpoint - self.temp) + rng.gauss(0, 0.08)
        else:
            self.temp += rng.gauss(0, 0.03)
        self.humidity = min(100.0, max(0.0, self.humidity + rng.gauss(0, 0.15)))
        self.battery = max(0.0, self.battery - self.drain)
        if self.door_open_for:
            self.door_open_for -= 1
        elif rng.random() < 1 / 20_000:
            self.door_open_for = rng.randint(1, 5)
            self.temp += 1.5
        shock = abs(rng.gauss(0, 0.02)) + (rng.uniform(0.5, 4.0) if rng.random() < 1 / 2000 else 0)
        door = "open" if self.door_open_for else "closed"
        if style == "python":
            doc = {
                "ts": ts_ms / 1000,
                "temperature": round(self.temp, 2),
                "humidity": round(self.humidity, 1),
                "door": door,
                "shock": round(shock, 2),
                "battery": round(self.battery, 1),
            }
            return json.dumps(doc).encode()
        return (
            f'{{"ts":{ts_ms / 1000:.3f},"temperature":{self.temp:.2f},'
            f'"humidity":{self.humidity:.1f},"door":"{door}","shock":{shock:.2f},'
            f'"battery":{self.battery:.1f}}}'
        ).encode()


def fleet(rng: random.Random, n: int) -> list[Container]:
    """``n`` containers with their own reporting phase within the minute."""
    out = []
    for serial in rng.sample(range(1_000_000), n):
        reefer = rng.random() < 0.3
        setpoint = rng.choice([-25.0, -18.0, 2.0, 4.0, 13.0]) if reefer else None
        out.append(
            Container(
                id=iso6346(rng.choice(OWNERS), serial),
                deck=rng.randint(1, 12),
                phase_ms=rng.randrange(60_000),
                setpoint=setpoint,
                temp=setpoint if setpoint is not None else rng.uniform(15, 32),
                humidity=rng.uniform(85, 95) if reefer else rng.uniform(45, 80),
                battery=rng.uniform(60, 100),
                drain=rng.uniform(0.003, 0.02),
            )
        )
    return out
