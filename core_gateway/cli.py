"""``shorelink-gateway``: command line of the port/HQ gateway: takes ships' batches and writes them into Kafka exactly once."""

from __future__ import annotations

import click

__all__ = ["main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="shorelink")
def main() -> None:
    """shorelink-gateway: the port/HQ gateway: takes ships' batches and writes them into Kafka exactly once."""


if __name__ == "__main__":
    main()
