"""``python -m fleet_sim``: plan a voyage, or sail one against real brokers."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from pathlib import Path

import click
import structlog

from fleet_sim.plan import VoyagePlan, plan_voyage
from fleet_sim.publisher import DEFAULT_AIS, run_fleet

__all__ = ["main"]


@click.group()
def main() -> None:
    """The fleet simulator: container sensors and ships at sea (docs/fleet-sim.md)."""


def _broker(value: str) -> tuple[str, tuple[str, int]]:
    ship, sep, address = value.partition("=")
    host, colon, port = address.rpartition(":")
    if not sep or not colon or not port.isdigit():
        raise click.BadParameter(f"{value!r}: expected SHIP=HOST:PORT")
    return ship, (host, int(port))


@main.command()
@click.option("--ships", default=3, show_default=True, type=click.IntRange(1, 50))
@click.option("--minutes", type=float, default=None, help="Wall minutes of the voyage.")
@click.option("--speed", type=float, default=None, help="Voyage seconds per wall second.")
@click.option("--containers", default=40, show_default=True, type=click.IntRange(4, 5000))
@click.option("--seed", default=1, show_default=True, type=int)
@click.option("--json", "as_json", is_flag=True, help="The plan as JSON (what `run --plan` reads).")
def plan(
    ships: int,
    minutes: float | None,
    speed: float | None,
    containers: int,
    seed: int,
    as_json: bool,
) -> None:
    """Print a voyage plan: each ship's phases (docked, at sea) in wall seconds."""
    if minutes is None and speed is None:
        minutes = 4.0
    try:
        p = plan_voyage(
            [f"ship{i}" for i in range(1, ships + 1)],
            minutes=minutes,
            speed=speed,
            containers=containers,
            seed=seed,
            start_wall=time.time(),
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    if as_json:
        click.echo(json.dumps(p.to_json(), indent=1))
        return
    click.echo(
        f"speed {p.speed:.0f}x, {p.end_s():.0f}s; overboard: {p.overboard.ship} at {p.overboard.at_s:.0f}s"
    )
    click.echo(f"{'ship':<8} {'phase':<5} {'where':<20} {'from_s':>8} {'to_s':>8}")
    for s in p.ships:
        for ph in s.phases:
            where = ph.port if ph.kind == "port" else f"{ph.leg[0]}->{ph.leg[1]}" if ph.leg else ""
            click.echo(f"{s.name:<8} {ph.kind:<5} {where:<20} {ph.start_s:8.1f} {ph.end_s:8.1f}")


@main.command()
@click.option(
    "--plan",
    "plan_path",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    required=True,
)
@click.option(
    "--broker", "brokers", multiple=True, required=True, help="SHIP=HOST:PORT, one per ship."
)
@click.option(
    "--events",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Events file (JSON lines) to append to.",
)
@click.option(
    "--ais",
    type=click.Path(path_type=Path, dir_okay=False),
    default=DEFAULT_AIS,
    show_default=True,
    help="Real AIS sentences for the AIS ship.",
)
def run(plan_path: Path, brokers: tuple[str, ...], events: Path | None, ais: Path) -> None:
    """Sail a plan: publish every ship's sensors to its Mosquitto (QoS 1) in wall time."""
    # the simulated sea stands apart from shorelink (tests/test_layout.py): structlog's own
    # logfmt, with the time, level and event first as shorelink writes them
    structlog.configure(
        processors=[
            structlog.processors.TimeStamper(fmt="iso", utc=True, key="ts"),
            structlog.processors.add_log_level,
            structlog.processors.LogfmtRenderer(key_order=["ts", "level", "event"]),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )
    try:
        p = VoyagePlan.from_json(json.loads(plan_path.read_text()))
    except ValueError as exc:
        raise click.UsageError(f"{plan_path}: {exc}") from exc
    mapping = dict(_broker(b) for b in brokers)
    if not ais.exists():
        click.echo(f"warning: {ais} not found: no AIS replay", err=True)
    try:
        stats = asyncio.run(
            run_fleet(p, mapping, events=events, ais_file=ais if ais.exists() else None)
        )
    except ValueError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
    for name, s in stats.ships.items():
        click.echo(f"{name}: {s.messages} messages, {s.payload_bytes} payload bytes")
