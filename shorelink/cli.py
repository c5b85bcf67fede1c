"""``shorelink``: the project-level command (local stack; audit and demo as they land)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

__all__ = ["main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="shorelink")
def main() -> None:
    """shorelink: every sensor reading from ship to every port and HQ, exactly once."""


@main.command()
@click.option(
    "--site", required=True, help="Site name (for the report; with --stack, which site's Kafka)."
)
@click.option("--bootstrap", default=None, help="The site's Kafka bootstrap (host:port).")
@click.option(
    "--stack",
    "stack_dir",
    type=click.Path(path_type=Path),
    default=None,
    help="A local stack directory (shorelink stack up --dir): take the site's Kafka from it.",
)
@click.option("--stream", "streams", multiple=True, help="Only these streams (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def audit(
    site: str,
    bootstrap: str | None,
    stack_dir: Path | None,
    streams: tuple[str, ...],
    as_json: bool,
) -> None:
    """Count identities in a site's canonical topics: per (origin, stream) the
    identities, duplicates and gaps. Exits 1 if any duplicate or gap is found."""
    from shorelink.audit import audit_site
    from shorelink.cli_support import fail

    if bootstrap is None and stack_dir is not None:
        from local_stack.errors import StackError
        from local_stack.stack import load

        try:
            bootstrap = load(stack_dir).sites[site]["kafka"]
        except (StackError, KeyError) as exc:
            fail(StackError(f"no site {site!r} in the stack at {stack_dir}: {exc}"))
    if bootstrap is None:
        fail(click.UsageError("give --bootstrap or --stack"))
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


def _register() -> None:
    from local_stack.cli import stack

    main.add_command(stack)


_register()

if __name__ == "__main__":
    main()
