"""``shorelink``: the project-level command (local stack; audit and demo as they land)."""

from __future__ import annotations

import click

__all__ = ["main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="shorelink")
def main() -> None:
    """shorelink: every sensor reading from ship to every port and HQ, exactly once."""


def _register() -> None:
    from local_stack.cli import stack

    main.add_command(stack)


_register()

if __name__ == "__main__":
    main()
