"""``shorelink fleet rollout start|advance|stop`` and what the ships' reports say in
``fleet status``, ``fleet rollout status`` and ``fleet rollout tick``
(docs/fleet-registry.md, "Rollouts").

Those three read the reports at a site's Kafka, so they are commands of
shorelink/cli.py (as ``fleet publish`` is: the kernel's Kafka commands import the wing
only there); what they show and write is here: :func:`fleet_health`,
:func:`decisions`, :func:`tick`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from shorelink.errors import ShorelinkError
from shorelink.fleet.cli import _open, _run, fleet, read_document, registry_option

if TYPE_CHECKING:
    from shorelink.fleet.log import Registry
    from shorelink.fleet.rollout import Decision, Heard, RolloutRecord
    from shorelink.fleet.state import FleetState

__all__ = ["render_rollouts", "rollout", "tick"]

_REGISTRY = registry_option()


def tick(reg: Registry, heard: Mapping[str, Heard]) -> list[str]:
    """Write what the reports decide for every active rollout of ``reg`` (advanced,
    done, stopped: entries signed by the fleet key, ``by: health``); a line each."""
    from shorelink.fleet.health import FleetView, decisions

    lines = []
    for rid, d in sorted(decisions(FleetView.of(reg.state), heard).items()):
        r = reg.state.rollouts[rid]
        if d.action == "advance":
            change = ("rollout_advanced", {"rollout": rid, "stage": r.stage + 1, "by": "health"})
        elif d.action == "done":
            change = ("rollout_done", {"rollout": rid, "by": "health"})
        elif d.action == "stop":
            change = ("rollout_stopped", {"rollout": rid, "reason": d.reason, "by": "health"})
        else:
            lines.append(f"rollout {rid}: held: {d.reason}")
            continue
        reg.append([change])
        lines.append(f"rollout {rid}: {d.action}: {d.reason}")
    return lines


def render_rollouts(
    state: FleetState, found: Mapping[int, Decision], active_only: bool = False
) -> list[str]:
    """The rollouts (each active one with what the reports decide), a line each."""
    ids = sorted(state.active_rollouts.values() if active_only else state.rollouts)
    return [_rollout_line(state.rollouts[r], found.get(r)) for r in ids]


def _rollout_line(r: RolloutRecord, decision: Decision | None) -> str:
    counts = r.stage_counts()
    line = (
        f"rollout {r.id}: group {r.group}, configuration version {r.id}, {r.state}, "
        f"stage {r.stage + 1} of {len(r.stages)} ({'/'.join(r.stages)}: "
        f"{counts[r.stage]} of {len(r.order)} ships), healthy for {r.healthy_s} s, "
        f"stops past {r.stop_failure_percent}% failed"
    )
    if r.state != "active":
        line += f"; {r.state} by {r.by} at {r.ended}" + (f": {r.reason}" if r.reason else "")
    elif decision is not None:
        line += f"; {decision.action}: {decision.reason}"
    return line


@fleet.group("rollout")
def rollout() -> None:
    """Staged rollouts of a group's configuration: a canary share first, the next stage
    when the ships reached report healthy for a stated time, stopped past a failure share
    (docs/fleet-registry.md, "Rollouts")."""


def _stages(canary: str, steps: tuple[str, ...]) -> list[str]:
    from shorelink.fleet.entry import stage_size

    out = [canary, *steps]
    for s in out:
        try:
            stage_size(s, 1)
        except ValueError as exc:
            raise ShorelinkError(f"--canary/--stage: {exc}") from None
    return out if out[-1] == "100%" else [*out, "100%"]


def _percent(text: str, name: str) -> int:
    body = text.removesuffix("%")
    if not body.isdigit() or not 0 <= int(body) <= 100:
        raise ShorelinkError(f"{name}: a whole percent, 0% to 100%, not {text!r}")
    return int(body)


@rollout.command("start")
@click.argument("file", type=click.Path(path_type=Path, dir_okay=False, exists=True))
@_REGISTRY
@click.option("--group", required=True, help="The group it is for.")
@click.option(
    "--canary",
    default="5%",
    show_default=True,
    help="The first stage: a share of the group (5%) or a count of ships (3).",
)
@click.option("--stage", "steps", multiple=True, help="A stage after the canary (repeatable).")
@click.option(
    "--healthy-for",
    default="10m",
    show_default=True,
    help="How long a stage's ships must report healthy before the next (30s, 10m, 1h).",
)
@click.option(
    "--stop-at",
    default="10%",
    show_default=True,
    help="Stop when more than this share of the ships reached failed (0%: the first failure).",
)
@click.option(
    "--port-links-only", is_flag=True, help="Fetched over port links only, never the satellite."
)
def rollout_start(
    file: Path,
    directory: Path,
    group: str,
    canary: str,
    steps: tuple[str, ...],
    healthy_for: str,
    stop_at: str,
    port_links_only: bool,
) -> None:
    """Start rolling FILE (.toml or .json) out to --group: the canary's ships get it at
    once, the rest of the group keeps its configuration until its stage."""
    from shorelink.config import parse_duration

    def start() -> RolloutRecord:
        fmt, text = read_document(file)
        healthy = parse_duration(healthy_for, "--healthy-for")
        body = {
            "group": group,
            "format": fmt,
            "document": text,
            "port_links_only": port_links_only,
            "stages": _stages(canary, steps),
            "healthy_s": int(healthy),
            "stop_failure_percent": _percent(stop_at, "--stop-at"),
        }
        reg = _open(directory)
        reg.append([("rollout_started", body)])
        return reg.state.rollouts[reg.state.version]

    r = _run(start)
    click.echo(_rollout_line(r, None))
    click.echo(
        f"canary: {', '.join(r.reached())}; next: `shorelink fleet publish`, then `shorelink "
        "fleet rollout tick` to advance or stop it on the ships' reports"
    )


def _append_one(directory: Path, rid: int, kind: str, body: dict[str, Any]) -> RolloutRecord:
    reg = _open(directory)
    reg.append([(kind, {"rollout": rid, **body})])
    return reg.state.rollouts[rid]


@rollout.command("advance")
@click.argument("rollout_id", type=int)
@_REGISTRY
def rollout_advance(rollout_id: int, directory: Path) -> None:
    """Advance rollout ROLLOUT_ID to its next stage whatever the reports say (at its
    last stage: done, the group's configuration from now on)."""

    def advance() -> RolloutRecord:
        reg = _open(directory)
        r = reg.state.rollouts.get(rollout_id)
        if r is None:
            raise ShorelinkError(f"no rollout {rollout_id}")
        if r.state == "active" and r.last:
            return _append_one(directory, rollout_id, "rollout_done", {"by": "operator"})
        body = {"stage": r.stage + 1, "by": "operator"}
        return _append_one(directory, rollout_id, "rollout_advanced", body)

    click.echo(_rollout_line(_run(advance), None))


@rollout.command("stop")
@click.argument("rollout_id", type=int)
@_REGISTRY
@click.option("--reason", required=True, help="Why (shown with the rollout).")
def rollout_stop(rollout_id: int, directory: Path, reason: str) -> None:
    """Stop rollout ROLLOUT_ID: its ships go back to the group's configuration before."""
    body = {"reason": reason, "by": "operator"}
    r = _run(lambda: _append_one(directory, rollout_id, "rollout_stopped", body))
    click.echo(_rollout_line(r, None))
