"""``shorelink-spark``: command line of the site's Spark application: merge, replication and Delta tables."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import click

from shorelink.cli_support import load_or_exit
from spark_core.config import SitesConfig, load_config
from spark_core.packages import SPARK_PACKAGES, spark_package_conf

__all__ = ["main", "spark_submit_argv"]

SITE_JOB = Path(__file__).resolve().parent / "jobs" / "site.py"


def default_ivy_dir() -> Path:
    """The Ivy cache ``scripts/setup`` fills (``$SHORELINK_TOOLS/ivy``)."""
    tools = os.environ.get("SHORELINK_TOOLS", str(Path.home() / ".cache" / "shorelink"))
    return Path(tools) / "ivy"


def spark_submit_bin() -> Path:
    """spark-submit of the installed pyspark (its version matches the pinned packages)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "bin" / "spark-submit"


def spark_submit_argv(
    cfg: SitesConfig, site: str, config_path: Path, ivy_dir: Path, extra: list[str]
) -> list[str]:
    conf = spark_package_conf(str(ivy_dir))
    conf.pop("spark.jars.packages")  # given as --packages
    conf["spark.sql.streaming.stopTimeout"] = "60s"
    conf.update(dict(cfg.spark.conf))
    argv = [
        str(spark_submit_bin()),
        "--master",
        cfg.spark.master,
        "--driver-memory",
        cfg.spark.driver_memory,
        "--name",
        f"shorelink-{site}",
        "--packages",
        ",".join(SPARK_PACKAGES),
    ]
    for k, v in conf.items():
        argv += ["--conf", f"{k}={v}"]
    return [*argv, str(SITE_JOB), "--site", site, "--config", str(config_path.resolve()), *extra]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="shorelink")
def main() -> None:
    """shorelink-spark: the site's Spark application: merge, replication and Delta tables."""


@main.command("site")
@click.option("--site", "site_name", required=True, help="This site's name in the sites file.")
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path),
    required=True,
    envvar="SHORELINK_SPARK_CONFIG",
    help="sites.toml (env SHORELINK_SPARK_CONFIG).",
)
@click.option(
    "--ivy-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Ivy cache for the Kafka connector and Delta jars (default $SHORELINK_TOOLS/ivy).",
)
@click.option("--available-now", is_flag=True, help="Process what is there, then exit.")
@click.option("--dry-run", is_flag=True, help="Print the spark-submit command, run nothing.")
def site_cmd(
    site_name: str, config_path: Path, ivy_dir: Path | None, available_now: bool, dry_run: bool
) -> None:
    """Run the site's Spark application (merge) with spark-submit."""
    cfg = load_or_exit(load_config, config_path)
    load_or_exit(lambda _: cfg.site(site_name), config_path)
    extra = ["--available-now"] if available_now else []
    argv = spark_submit_argv(cfg, site_name, config_path, ivy_dir or default_ivy_dir(), extra)
    # the driver and executors run this interpreter (where shorelink is installed)
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    if dry_run:
        click.echo(f"PYSPARK_PYTHON={shlex.quote(sys.executable)} " + shlex.join(argv))
        return
    os.execve(argv[0], argv, env)


if __name__ == "__main__":
    main()
