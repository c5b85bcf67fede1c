"""``shorelink demo``: the voyage, the main job (docs/voyage.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from local_stack.errors import StackError

__all__ = ["demo"]

DEFAULT_MINUTES = 6.0


@click.command()
@click.option(
    "--ships", default=3, show_default=True, type=click.IntRange(1, 8), help="Ships in the fleet."
)
@click.option(
    "--minutes",
    type=click.FloatRange(0.5, 120),
    default=None,
    help=f"Wall minutes from the first departure until the last ship docks at Sydney [default: {DEFAULT_MINUTES:g}].",
)
@click.option(
    "--speed",
    type=click.FloatRange(1, 1_000_000),
    default=None,
    help="Voyage seconds per wall second, instead of --minutes (the voyage then lasts as long as it takes).",
)
@click.option(
    "--containers",
    default=24,
    show_default=True,
    type=click.IntRange(4, 2000),
    help="Containers per ship.",
)
@click.option(
    "--dir",
    "dir_",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("voyage-run"),
    show_default=True,
    help="Where the stack, logs, report.json and report.html go (an earlier voyage there is replaced).",
)
@click.option(
    "--keep", is_flag=True, help="Leave the stack running and print the commands to explore it."
)
@click.option(
    "--drain-timeout",
    type=click.FloatRange(10, 3600),
    default=300.0,
    show_default=True,
    help="Seconds after the voyage to wait for every site to hold every record.",
)
@click.option("--seed", default=1, show_default=True, type=int, help="Seed of the simulation.")
@click.option(
    "--spark-per-site",
    is_flag=True,
    help="One Spark application (JVM) per site as in production, instead of the four sites in one (needs more than 2 cores).",
)
@click.option(
    "--live/--no-live",
    default=None,
    help="The live view (default: when the output is a terminal; else a line every 10 s).",
)
def demo(
    ships: int,
    minutes: float | None,
    speed: float | None,
    containers: int,
    dir_: Path,
    keep: bool,
    drain_timeout: float,
    seed: int,
    live: bool | None,
    spark_per_site: bool,
) -> None:
    """Run a voyage of the whole system on this machine: ships sail Tokyo -> Singapore ->
    Sydney (headquarters in Los Angeles) with container sensors, Mosquitto and an edge
    agent each; every site has Kafka, a gateway and a Spark application; toxiproxy plays
    the satellite, port Wi-Fi and the links between sites. Ends with DIR/report.html,
    DIR/report.json and a summary; exits 0 only if every site holds every record exactly
    once, the overboard alert reached every site and each port held a ship's earlier data
    before the ship docked."""
    # imported here: every `shorelink` command loads this module to register `demo`
    from voyage.run import Options, run_voyage

    if minutes is not None and speed is not None:
        raise click.UsageError("give --minutes or --speed, not both")
    if minutes is None and speed is None:
        minutes = DEFAULT_MINUTES
    opts = Options(
        dir=dir_,
        ships=ships,
        minutes=minutes,
        speed=speed,
        containers=containers,
        seed=seed,
        keep=keep,
        drain_timeout=drain_timeout,
        live=live,
        spark_per_site=spark_per_site,
        command="shorelink demo " + " ".join(sys.argv[2:]),
    )
    try:
        code = run_voyage(opts)
    except StackError as exc:
        click.echo(f"error: {exc}", err=True)
        code = 2
    sys.exit(code)
