"""Staged rollouts that stop themselves: a group's new configuration reaches a canary
share of its ships first, and the next stage only when every ship reached so far has
reported it applied and healthy for a stated time; past a stated share of failures the
rollout stops, and its ships go back to the group's configuration before it.

A rollout is entries of the registry (docs/fleet-registry.md, "Rollouts"):
``rollout_started`` (the configuration itself, its stages, ``healthy_s``,
``stop_failure_percent``; the rollout's id is this entry's version, and so is the
configuration's version), then ``rollout_advanced`` (stage by stage), and
``rollout_stopped`` or ``rollout_done``, each saying whether an operator or the ships'
health (``shorelink fleet rollout tick``) moved it. A change that is in the chain is
the same at every site: which ship has which configuration is a function of the entries
alone (:meth:`shorelink.fleet.state.FleetState.config_for`).

Which ships a stage reaches is fixed when the rollout starts: the group's ships of that
moment (revoked ones too, so a later revocation moves no ship into or out of a stage),
ordered by SHA-256 of the group's and the ship's names. The order is the same for every
rollout of a group and every reader: a group's canaries are the same ships each time,
and a ship added later is outside the rollout (it gets the new configuration when the
rollout is done). Stage ``k`` reaches the first ``stage_size`` ships of that order.

Whether to advance is :func:`decide`, pure: the ships' newest reports
(:class:`Heard`, from the report stream's ``config`` field) and the clock in, one
:class:`Decision` out. A ship counts as healthy when its report, written at least
``healthy_s`` after the stage that reached it began, says it runs the configuration it
should and no failure; as failed when a report written since that stage began says a
failure and another version. A ship never heard since its stage began holds the
rollout, it never advances it.
"""

from __future__ import annotations

import calendar
import hashlib
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from shorelink.fleet.entry import stage_size

__all__ = [
    "Decision",
    "Heard",
    "RolloutRecord",
    "ShipVerdict",
    "canary_order",
    "decide",
    "entry_ms",
    "judge",
]


def canary_order(group: str, ships: Iterable[str]) -> tuple[str, ...]:
    """``ships`` in the order a rollout of ``group`` reaches them: by SHA-256 of the
    group's and the ship's names (the same order at every run and every reader)."""
    prefix = group.encode() + b"\x00"
    return tuple(sorted(ships, key=lambda s: (hashlib.sha256(prefix + s.encode()).digest(), s)))


def entry_ms(stamp: str) -> int:
    """An entry's ``time`` (``2026-11-30T01:02:03Z``) as epoch ms."""
    return calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")) * 1000


@dataclass(slots=True)
class RolloutRecord:
    """A rollout as the registry's entries leave it."""

    id: int
    group: str
    stages: tuple[str, ...]
    healthy_s: int
    stop_failure_percent: int
    #: the group's ships when it started, in :func:`canary_order`
    order: tuple[str, ...]
    #: the time each stage reached so far began (entry times)
    stage_times: list[str]
    #: active, stopped or done
    state: str = "active"
    #: who ended it (operator, health) and why it stopped
    by: str | None = None
    reason: str | None = None
    ended: str | None = None
    #: ship -> the first stage that reaches it
    _reach: dict[str, int] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._reach = {}
        done = 0
        for k, stage in enumerate(self.stages):
            upto = max(done, stage_size(stage, len(self.order)))
            for ship in self.order[done:upto]:
                self._reach[ship] = k
            done = upto

    @property
    def stage(self) -> int:
        """The stage reached (0: the canary)."""
        return len(self.stage_times) - 1

    @property
    def last(self) -> bool:
        return self.stage == len(self.stages) - 1

    def reaches(self, ship: str) -> bool:
        """Whether ``ship`` has the rollout's configuration now (an active rollout's
        reached stages; every ship of it once done; none once stopped)."""
        if self.state == "stopped":
            return False
        k = self._reach.get(ship)
        return k is not None and (self.state == "done" or k <= self.stage)

    def reached_ms(self, ship: str) -> int | None:
        """When the stage that reached ``ship`` began (None: not reached)."""
        k = self._reach.get(ship)
        if k is None or k > self.stage:
            return None
        return entry_ms(self.stage_times[k])

    def reached(self) -> list[str]:
        """The ships the stages so far reach, in order."""
        return [s for s in self.order if self._reach[s] <= self.stage]

    def stage_counts(self) -> list[int]:
        """How many ships each stage reaches in all (cumulative)."""
        counts, done = [], 0
        for k in range(len(self.stages)):
            done += sum(1 for v in self._reach.values() if v == k)
            counts.append(done)
        return counts


@dataclass(frozen=True, slots=True)
class Heard:
    """A ship's newest report as a rollout reads it."""

    #: when the ship wrote it (its clock, epoch ms)
    at_ms: int
    #: the configuration version it runs (None: an agent that does not say)
    version: int | None
    #: why its last configuration was refused or rolled back (None: none)
    failure: str | None


#: a ship's state in a rollout
WAITING = "waiting"  # not heard since its stage began
PENDING = "pending"  # heard, not running the configuration yet
SETTLING = "settling"  # running it, not yet for healthy_s
HEALTHY = "healthy"
FAILED = "failed"


@dataclass(frozen=True, slots=True)
class ShipVerdict:
    ship: str
    state: str
    failure: str | None = None


def judge(expected: int | None, reached_ms: int, healthy_ms: int, heard: Heard | None) -> str:
    """One ship's state in a rollout: ``expected`` the configuration version it should
    run, ``reached_ms`` when its stage began."""
    if heard is None or heard.at_ms < reached_ms:
        return WAITING
    if heard.version == expected and heard.failure is None:
        return HEALTHY if heard.at_ms >= reached_ms + healthy_ms else SETTLING
    if heard.failure is not None:
        return FAILED
    return PENDING


@dataclass(frozen=True, slots=True)
class Decision:
    """What :func:`decide` says: ``advance`` (to the next stage), ``done`` (the last
    stage healthy), ``stop`` (past the failure share), ``hold``; and why."""

    action: str
    reason: str
    ships: tuple[ShipVerdict, ...] = ()

    def count(self, state: str) -> int:
        return sum(1 for v in self.ships if v.state == state)


def decide(
    rollout: RolloutRecord,
    expected: Mapping[str, int | None],
    heard: Mapping[str, Heard],
    revoked: frozenset[str] | set[str] = frozenset(),
) -> Decision:
    """Advance, hold or stop ``rollout``: ``expected`` the configuration version each
    reached ship should run (:meth:`FleetState.config_for`), ``heard`` each ship's
    newest report. Stops when the failed ships are more than ``stop_failure_percent``
    of the ships reached (revoked ones left out); advances (or is done) only when every
    one of them is healthy; else holds."""
    if rollout.state != "active":
        return Decision("hold", f"the rollout is {rollout.state}")
    healthy_ms = rollout.healthy_s * 1000
    verdicts = []
    for ship in rollout.reached():
        if ship in revoked:
            continue
        at = rollout.reached_ms(ship)
        assert at is not None
        h = heard.get(ship)
        state = judge(expected.get(ship), at, healthy_ms, h)
        verdicts.append(ShipVerdict(ship, state, h.failure if state == FAILED and h else None))
    d = Decision("hold", "", tuple(verdicts))
    n, failed = len(verdicts), d.count(FAILED)
    share = rollout.stop_failure_percent
    if failed * 100 > share * n:
        first = next(v for v in verdicts if v.state == FAILED)
        why = (
            f"{failed} of {n} ships failed, past {share}% (stage {rollout.stage + 1} of "
            f"{len(rollout.stages)}); {first.ship}: {first.failure}"
        )
        return Decision("stop", why[:300], d.ships)
    if d.count(HEALTHY) == n:
        if rollout.last:
            return Decision("done", f"all {n} ships healthy", d.ships)
        return Decision(
            "advance",
            f"all {n} ships of stage {rollout.stage + 1} healthy for {rollout.healthy_s} s",
            d.ships,
        )
    parts = [f"{d.count(s)} {s}" for s in (FAILED, WAITING, PENDING, SETTLING) if d.count(s)]
    return Decision("hold", f"{d.count(HEALTHY)} of {n} healthy; " + ", ".join(parts), d.ships)
