"""``shorelink-edge``: command line of the ship's edge agent: MQTT ingest into a durable log, upload to shore."""

from __future__ import annotations

import click

__all__ = ["main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="shorelink")
def main() -> None:
    """shorelink-edge: the ship's edge agent: MQTT ingest into a durable log, upload to shore."""


if __name__ == "__main__":
    main()
