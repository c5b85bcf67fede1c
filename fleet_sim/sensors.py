"""Container sensor readings: temperature, humidity, door, shock, battery.

Reefers are held near their setpoint (-18 C frozen, +4 C chilled) with a little noise
and, now and then, an excursion of a few degrees for a few readings; dry boxes follow
the air, warmer near the equator. Doors are closed, and open for a single reading once
in a long while. Shock is small, with an occasional bump under 3 g at sea; a container
going overboard reports one spike of 25-40 g and then nothing. Batteries drain slowly.
Every value is a function of (seed, container, reading number): the same plan gives the
same readings.
"""

from __future__ import annotations

import json
import math
import random

from fleet_sim.plan import Box

__all__ = ["OVERBOARD_SHOCK_G", "reading"]

OVERBOARD_SHOCK_G = (25.0, 40.0)


def _ambient(lat: float) -> float:
    """Air temperature by latitude: about 30 C at the equator, 12 C at 40 degrees."""
    return 30.0 - 18.0 * (abs(lat) / 40.0) ** 1.5


def reading(
    box: Box,
    n: int,
    *,
    ts_ms: int,
    lat: float,
    lon: float,
    at_sea: bool,
    seed: int,
    overboard: bool = False,
) -> bytes:
    """The ``n``-th reading of ``box`` as its sensor's JSON payload."""
    rng = random.Random(f"{seed}:{box.id}:{n}")
    if box.reefer and box.setpoint is not None:
        excursion = random.Random(f"{seed}:{box.id}:exc:{n // 6}").random() < 0.02
        temperature = box.setpoint + rng.gauss(0, 0.3) + (rng.uniform(4, 9) if excursion else 0.0)
        humidity = 85 + rng.gauss(0, 3)
    else:
        temperature = _ambient(lat) + 4 * math.sin(n / 4) + rng.gauss(0, 0.8)
        humidity = 60 + 15 * math.sin(n / 7) + rng.gauss(0, 4)
    shock = abs(rng.gauss(0.2, 0.15))
    if at_sea and rng.random() < 0.01:
        shock = rng.uniform(1.0, 3.0)
    if overboard:
        shock = rng.uniform(*OVERBOARD_SHOCK_G)
    door = "open" if rng.random() < 0.003 else "closed"
    battery = max(3.0, 3.7 - 0.0004 * n + rng.gauss(0, 0.005))
    body = {
        "ts": ts_ms,
        "container": box.id,
        "reefer": box.reefer,
        "setpoint": box.setpoint,
        "temperature": round(temperature, 2),
        "humidity": round(min(100.0, max(0.0, humidity)), 1),
        "door": door,
        "shock": round(shock, 2),
        "battery": round(battery, 3),
        "lat": round(lat, 4),
        "lon": round(lon, 4),
    }
    return json.dumps(body, separators=(",", ":")).encode()
