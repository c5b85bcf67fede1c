"""``shorelink``: the project-level command (audit; the commands other installed
packages add, such as the local stack's ``shorelink stack ...``).

The kernel imports nothing of the project above it. Another package extends this command
through two entry point groups (its pyproject's ``[project.entry-points."..."]``):

- ``shorelink.commands``: name -> a click command added to ``shorelink``;
- ``shorelink.options``: a command's name -> a click decorator that adds options to it.
  An option of ``audit`` that names a site's Kafka another way than ``--bootstrap`` (the
  local stack's ``--stack DIR``) leaves a ``site -> host:port`` function in
  ``ctx.meta[BOOTSTRAP_LOCATOR]``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from importlib.metadata import entry_points

import click

from shorelink.cli_support import BOOTSTRAP_LOCATOR, fail
from shorelink.errors import ShorelinkError

__all__ = ["COMMANDS", "OPTIONS", "main"]

COMMANDS = "shorelink.commands"
OPTIONS = "shorelink.options"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="shorelink")
def main() -> None:
    """shorelink: every sensor reading from ship to every port and HQ, exactly once."""


@main.command()
@click.option(
    "--site",
    required=True,
    help="Site name (for the report; with an option such as --stack, which site's Kafka).",
)
@click.option("--bootstrap", default=None, help="The site's Kafka bootstrap (host:port).")
@click.option("--stream", "streams", multiple=True, help="Only these streams (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def audit(
    ctx: click.Context,
    site: str,
    bootstrap: str | None,
    streams: tuple[str, ...],
    as_json: bool,
) -> None:
    """Count identities in a site's canonical topics: per (origin, stream) the
    identities, duplicates and gaps. Exits 1 if any duplicate or gap is found."""
    from shorelink.audit import audit_site

    locate: Callable[[str], str] | None = ctx.meta.get(BOOTSTRAP_LOCATOR)
    if bootstrap is None and locate is not None:
        try:
            bootstrap = locate(site)
        except ShorelinkError as exc:
            fail(exc)
    if bootstrap is None:
        fail(click.UsageError(" or ".join(["give --bootstrap", *_added_options(audit)])))
    results, malformed = audit_site(bootstrap, streams or None)
    bad = any(r.duplicates or r.gaps for r in results) or malformed > 0
    if as_json:
        click.echo(
            json.dumps(
                {
                    "site": site,
                    "sources": [r.to_json() for r in results],
                    "malformed": malformed,
                    "ok": not bad,
                },
                indent=2,
            )
        )
    else:
        click.echo(f"site {site}: {len(results)} sources, {malformed} malformed records")
        click.echo(
            f"{'origin':24} {'stream':14} {'identities':>10} {'duplicates':>10} {'gaps':>8}  gap ranges"
        )
        for r in results:
            click.echo(
                f"{r.origin:24} {r.stream:14} {r.identities:>10} {r.duplicates:>10} "
                f"{r.gaps.count():>8}  {r.gaps or '-'}"
            )
        click.echo(
            "OK: every identity once, no gaps" if not bad else "NOT OK: duplicates or gaps found"
        )
    if bad:
        sys.exit(1)


_ADDED: dict[str, list[str]] = {}


def _added_options(cmd: click.Command) -> list[str]:
    """The options other packages added to ``cmd`` (their first spelling each)."""
    return _ADDED.get(cmd.name or "", [])


def _register() -> None:
    """Add the commands and options that installed packages declare."""
    for ep in entry_points(group=COMMANDS):
        main.add_command(ep.load(), ep.name)
    for ep in entry_points(group=OPTIONS):
        cmd = main.commands[ep.name]
        before = len(cmd.params)
        ep.load()(cmd)
        _ADDED.setdefault(ep.name, []).extend(p.opts[0] for p in cmd.params[before:])


_register()

if __name__ == "__main__":
    main()
