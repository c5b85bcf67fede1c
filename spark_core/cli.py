"""``shorelink-spark``: command line of the site's Spark application: merge, replication and Delta tables."""

from __future__ import annotations

import click

__all__ = ["main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="shorelink")
def main() -> None:
    """shorelink-spark: the site's Spark application: merge, replication and Delta tables."""


if __name__ == "__main__":
    main()
