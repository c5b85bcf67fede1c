"""Positions on the sea: great-circle distance, bearing and interpolation on a sphere,
and the sea lanes between the ports as way points (the great circle between two way
points is close enough to the lane; the way points keep it off the land).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "HQ",
    "HQ_POSITION",
    "LANES",
    "PORTS",
    "Route",
    "bearing",
    "distance_nm",
    "interpolate",
]

EARTH_RADIUS_NM = 3440.065

#: Port of Tokyo, Singapore (Keppel), Port Botany (Sydney)
PORTS: dict[str, tuple[float, float]] = {
    "tokyo": (35.62, 139.79),
    "singapore": (1.26, 103.84),
    "sydney": (-33.97, 151.21),
}
#: headquarters: Los Angeles
HQ = "hq"
HQ_POSITION = (33.74, -118.27)

#: the sea lanes as way points (lat, lon), port to port
LANES: dict[tuple[str, str], tuple[tuple[float, float], ...]] = {
    # Tokyo Bay, south of Shikoku and Kyushu, the Luzon Strait, the South China Sea,
    # the Singapore Strait
    ("tokyo", "singapore"): (
        PORTS["tokyo"],
        (34.9, 139.8),
        (33.2, 135.5),
        (30.5, 131.0),
        (24.5, 125.0),
        (20.5, 120.9),
        (16.0, 116.5),
        (10.0, 110.5),
        (5.0, 106.0),
        (1.9, 104.9),
        PORTS["singapore"],
    ),
    # the Singapore Strait, the Java Sea, the Lombok Strait, the Indian Ocean south of
    # Australia, Bass Strait, up the coast to Botany Bay
    ("singapore", "sydney"): (
        PORTS["singapore"],
        (0.6, 105.2),
        (-3.5, 108.0),
        (-6.0, 113.5),
        (-8.8, 115.8),
        (-12.0, 115.0),
        (-22.0, 111.5),
        (-32.0, 113.0),
        (-35.8, 116.5),
        (-37.0, 125.0),
        (-38.5, 140.0),
        (-39.6, 146.5),
        (-37.6, 150.3),
        (-34.1, 151.4),
        PORTS["sydney"],
    ),
}


def _rad(p: tuple[float, float]) -> tuple[float, float]:
    return math.radians(p[0]), math.radians(p[1])


def _angle(a: tuple[float, float], b: tuple[float, float]) -> float:
    """Central angle between two points (haversine)."""
    la1, lo1 = _rad(a)
    la2, lo2 = _rad(b)
    h = (
        math.sin((la2 - la1) / 2) ** 2
        + math.cos(la1) * math.cos(la2) * math.sin((lo2 - lo1) / 2) ** 2
    )
    return 2 * math.asin(min(1.0, math.sqrt(h)))


def distance_nm(a: tuple[float, float], b: tuple[float, float]) -> float:
    """Great-circle distance in nautical miles."""
    return EARTH_RADIUS_NM * _angle(a, b)


def bearing(a: tuple[float, float], b: tuple[float, float]) -> float:
    """Initial course from ``a`` to ``b``, degrees 0..360 (0 = north)."""
    la1, lo1 = _rad(a)
    la2, lo2 = _rad(b)
    y = math.sin(lo2 - lo1) * math.cos(la2)
    x = math.cos(la1) * math.sin(la2) - math.sin(la1) * math.cos(la2) * math.cos(lo2 - lo1)
    return (math.degrees(math.atan2(y, x)) + 360.0) % 360.0


def interpolate(a: tuple[float, float], b: tuple[float, float], f: float) -> tuple[float, float]:
    """The point a fraction ``f`` (0..1) of the way along the great circle from a to b."""
    d = _angle(a, b)
    if d < 1e-12:
        return a
    la1, lo1 = _rad(a)
    la2, lo2 = _rad(b)
    s1 = math.sin((1 - f) * d) / math.sin(d)
    s2 = math.sin(f * d) / math.sin(d)
    x = s1 * math.cos(la1) * math.cos(lo1) + s2 * math.cos(la2) * math.cos(lo2)
    y = s1 * math.cos(la1) * math.sin(lo1) + s2 * math.cos(la2) * math.sin(lo2)
    z = s1 * math.sin(la1) + s2 * math.sin(la2)
    lat = math.degrees(math.atan2(z, math.hypot(x, y)))
    lon = math.degrees(math.atan2(y, x))
    return lat, lon


@dataclass(frozen=True)
class Route:
    """A lane as way points; positions by distance along it."""

    points: tuple[tuple[float, float], ...]

    @property
    def legs_nm(self) -> tuple[float, ...]:
        return tuple(distance_nm(a, b) for a, b in zip(self.points, self.points[1:], strict=False))

    @property
    def length_nm(self) -> float:
        return sum(self.legs_nm)

    def position_at(self, fraction: float) -> tuple[float, float, float]:
        """(lat, lon, course) a ``fraction`` (clamped to 0..1) of the way along."""
        want = max(0.0, min(1.0, fraction)) * self.length_nm
        for (a, b), leg in zip(
            zip(self.points, self.points[1:], strict=False), self.legs_nm, strict=True
        ):
            if want <= leg or b == self.points[-1]:
                f = want / leg if leg > 0 else 1.0
                lat, lon = interpolate(a, b, min(1.0, f))
                return lat, lon, bearing(a, b)
            want -= leg
        raise AssertionError("unreachable: the last leg takes the rest")

    @classmethod
    def between(cls, a: str, b: str) -> Route:
        if (a, b) in LANES:
            return cls(LANES[(a, b)])
        if (b, a) in LANES:
            return cls(tuple(reversed(LANES[(b, a)])))
        raise ValueError(f"no sea lane between {a} and {b}")
