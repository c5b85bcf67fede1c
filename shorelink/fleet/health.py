"""What the ships' reports say of the fleet: each ship's health (the configuration
version it runs against the one it should, its last failure, when it was last heard
of) and what each rollout's next tick decides; for ``shorelink fleet status``,
``fleet rollout status|tick`` and the operations page's fleet section.

:class:`FleetView` is the registry's part, copied out of a
:class:`~shorelink.fleet.state.FleetState` when it changes: a page's thread reads it
while a follower's thread applies the next entries to the state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shorelink.fleet.rollout import Decision, Heard, RolloutRecord, decide
from shorelink.fleet.state import FleetState
from shorelink.ship_report import ShipReport

__all__ = ["FleetView", "decisions", "fleet_health", "heard_from", "rollout_json"]


@dataclass(frozen=True, slots=True)
class ShipLine:
    groups: tuple[str, ...]
    revoked: bool
    #: the configuration version it should run (rollouts honoured; None: none)
    expected: int | None


@dataclass(frozen=True, slots=True)
class FleetView:
    """The registry's part of the fleet's health, a copy no later entry changes."""

    version: int
    ships: Mapping[str, ShipLine]
    #: every rollout, oldest first (copies)
    rollouts: tuple[RolloutRecord, ...]

    @classmethod
    def of(cls, state: FleetState) -> FleetView:
        ships = {
            name: ShipLine(rec.groups, rec.revoked, state.config_for(name).version)
            for name, rec in state.ships.items()
        }
        rollouts = tuple(
            dataclasses.replace(r, stage_times=list(r.stage_times))
            for _, r in sorted(state.rollouts.items())
        )
        return cls(state.version, ships, rollouts)

    def active(self) -> list[RolloutRecord]:
        return [r for r in self.rollouts if r.state == "active"]


def heard_from(reports: Mapping[str, ShipReport]) -> dict[str, Heard]:
    """Each ship's newest report as a rollout reads it (its ``config`` field)."""
    out = {}
    for ship, report in reports.items():
        c = report.config
        if c is None:
            out[ship] = Heard(report.at_ms, None, None)
        else:
            out[ship] = Heard(report.at_ms, c.version, c.failure)
    return out


def decisions(view: FleetView, heard: Mapping[str, Heard]) -> dict[int, Decision]:
    """What the reports decide for every active rollout."""
    revoked = {name for name, s in view.ships.items() if s.revoked}
    out = {}
    for r in view.active():
        expected = {s: view.ships[s].expected for s in r.reached()}
        out[r.id] = decide(r, expected, heard, revoked)
    return out


def _health(expected: int | None, h: Heard | None) -> str:
    if h is None:
        return "never heard"
    if h.failure is not None:
        return "failed"
    if h.version is None:
        return "unknown"
    return "ok" if h.version == (expected or 0) else "behind"


def fleet_health(
    view: FleetView, heard: Mapping[str, Heard], heard_ms: Mapping[str, int], now_ms: int
) -> dict[str, dict[str, Any]]:
    """Per ship: the version its report says it runs, its health (``ok``, ``failed``,
    ``behind``: not on the version it should run, ``unknown``: its agent does not say,
    ``never heard``) with the failure, and the seconds since its site last heard of it."""
    out = {}
    for name, line in view.ships.items():
        h = heard.get(name)
        at = heard_ms.get(name)
        out[name] = {
            "applied": None if h is None else h.version,
            "health": _health(line.expected, h),
            "failure": None if h is None else h.failure,
            "heard_s_ago": None if at is None else max(0, (now_ms - at) // 1000),
        }
    return out


def rollout_json(r: RolloutRecord, decision: Decision | None = None) -> dict[str, Any]:
    """A rollout as ``--json`` and the operations page show it."""
    counts = r.stage_counts()
    out: dict[str, Any] = {
        "id": r.id,
        "group": r.group,
        "config_version": r.id,
        "state": r.state,
        "stage": r.stage + 1,
        "stages": list(r.stages),
        "stage_ships": counts,
        "reached": counts[r.stage] if r.state == "active" else None,
        "ships": len(r.order),
        "healthy_s": r.healthy_s,
        "stop_failure_percent": r.stop_failure_percent,
        "started": r.stage_times[0],
        "by": r.by,
        "reason": r.reason,
        "ended": r.ended,
    }
    if decision is not None:
        out["decision"] = {
            "action": decision.action,
            "reason": decision.reason,
            "ships": {v.ship: {"state": v.state, "failure": v.failure} for v in decision.ships},
        }
    return out
