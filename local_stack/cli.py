"""``shorelink stack ...``: install, start, inspect and stop the local stack."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

import click

from local_stack import stack as stack_mod
from local_stack import tools
from local_stack.errors import StackError
from local_stack.kafka import install_kafka_cds
from local_stack.spark import install_spark_cds
from local_stack.stack import Component
from shorelink.cli_support import BOOTSTRAP_LOCATOR
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.textout import table, wrap

__all__ = ["audit_stack_option", "render_status", "stack", "stack_kafka"]

DEFAULT_DIR = Path("stack")


def _fail(exc: StackError) -> None:
    click.echo(f"error: {exc}", err=True)
    sys.exit(1)


@click.group()
def stack() -> None:
    """Run the real infrastructure (Kafka per site, Mosquitto per ship, toxiproxy
    links) on loopback, for development, tests, the demo and benchmarks."""


@stack.command()
def install() -> None:
    """Install Kafka (Maven Central) and its class-data archive, toxiproxy (Go proxy),
    the Spark packages (Ivy cache) and a local Spark driver's class-data archive into
    ~/.cache/shorelink (or $SHORELINK_TOOLS). Idempotent."""
    try:
        tools.install_all()
        install_kafka_cds()
        install_spark_cds()
    except StackError as exc:
        _fail(exc)


@stack.command()
@click.option(
    "--sites",
    default="tokyo,singapore,sydney,hq",
    show_default=True,
    help="Comma-separated site names; one Kafka each (--brokers nodes).",
)
@click.option(
    "--ships",
    default="2",
    show_default=True,
    help="A number (ship1..shipN) or comma-separated ship names; one Mosquitto each.",
)
@click.option(
    "--dir",
    "dir_",
    type=click.Path(path_type=Path),
    default=DEFAULT_DIR,
    show_default=True,
    help="Directory for data, logs and stack.json.",
)
@click.option(
    "--brokers",
    type=click.IntRange(1, 9),
    default=1,
    show_default=True,
    help="Kafka nodes per site: 1, or 3 for a KRaft cluster as a data centre runs it "
    "(topics kept 3 times, acknowledged by 2).",
)
@click.option("--kafka-heap", default="512m", show_default=True, help="JVM heap per broker.")
@click.option(
    "--insecure",
    is_flag=True,
    help="Plain brokers (no TLS, no SASL, no ACLs) instead of SASL/SCRAM over TLS.",
)
def up(sites: str, ships: str, dir_: Path, brokers: int, kafka_heap: str, insecure: bool) -> None:
    """Start the stack and write DIR/stack.json describing every endpoint.

    Each Kafka takes SASL/SCRAM over TLS with ACLs: the CA is DIR/tls/ca.pem, the
    super user's password SL_KAFKA_ADMIN_PASSWORD in DIR/secrets.env."""
    site_list = [s.strip() for s in sites.split(",") if s.strip()]
    try:
        info = stack_mod.up(
            dir_,
            site_list,
            stack_mod.parse_ships(ships),
            kafka_heap=kafka_heap,
            secure=not insecure,
            brokers=brokers,
        )
    except StackError as exc:
        _fail(exc)
    click.echo(json.dumps(info.to_json(), indent=2))
    click.echo(
        f"stack up in {info.started_s:.1f}s; stop it with: shorelink stack down --dir {dir_}",
        err=True,
    )


@stack.command()
@click.option(
    "--dir", "dir_", type=click.Path(path_type=Path), default=DEFAULT_DIR, show_default=True
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(dir_: Path, as_json: bool) -> None:
    """Show each component's state (up, not-listening, dead), address and log file.
    Exits 1 if any component is not up."""
    try:
        rows = stack_mod.status(dir_)
    except StackError as exc:
        _fail(exc)
    if as_json:
        click.echo(
            json.dumps(
                [
                    {"name": c.name, "state": s, "pid": c.pid, "address": c.address, "log": c.log}
                    for c, s in rows
                ],
                indent=2,
            )
        )
    else:
        for line in render_status(dir_, rows):
            click.echo(line)
    if any(s != "up" for _, s in rows):
        sys.exit(1)


def render_status(
    stack_dir: Path, rows: Sequence[tuple[Component, str]], width: int | None = None
) -> list[str]:
    """``stack status`` as text that fits ``width`` (default: the terminal's, 80 piped):
    a row per component, its log (relative to the stack's directory when under it)
    beside it, or under it when too long."""
    base = stack_dir.resolve()

    def log(path: str) -> str:
        p = Path(path)
        return str(p.relative_to(base)) if p.is_relative_to(base) else path

    out = wrap(f"stack in {base} (logs relative to it)", width, "", "  ")
    header = ["name", "state", "address", "pid", "log"]
    body = [[c.name, s, c.address or "-", str(c.pid), log(c.log)] for c, s in rows]
    return out + table(header, body, width, right={3})


@stack.command()
@click.option(
    "--dir", "dir_", type=click.Path(path_type=Path), default=DEFAULT_DIR, show_default=True
)
def down(dir_: Path) -> None:
    """Stop every process the stack started (by pid) and leave none behind."""
    try:
        stopped = stack_mod.down(dir_)
    except StackError as exc:
        _fail(exc)
    click.echo(f"stopped: {', '.join(stopped) or 'nothing was running'}")


def stack_kafka(stack_dir: Path, site: str) -> KafkaEndpoint:
    """The Kafka of ``site`` in the stack at ``stack_dir`` (its stack.json), as its
    super user connects."""
    try:
        info = stack_mod.load(stack_dir)
        bootstrap: str = info.sites[site]["kafka"]
    except (StackError, KeyError) as exc:
        raise StackError(f"no site {site!r} in the stack at {stack_dir}: {exc}") from exc
    return KafkaEndpoint(bootstrap, info.admin_auth())


def _locate_in_stack(ctx: click.Context, _param: click.Parameter, value: Path | None) -> None:
    if value is not None:
        ctx.meta[BOOTSTRAP_LOCATOR] = lambda site: stack_kafka(value, site)


#: ``shorelink audit --stack DIR`` (entry point ``shorelink.options``, ``audit``)
audit_stack_option = click.option(
    "--stack",
    "stack_dir",
    type=click.Path(path_type=Path),
    default=None,
    expose_value=False,
    callback=_locate_in_stack,
    help="A local stack directory (shorelink stack up --dir): take the site's Kafka from it.",
)
