"""``shorelink-spark``: command line of the site's Spark application: merge, replication and Delta tables."""

from __future__ import annotations

import functools
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from shorelink.cli_support import fail, load_or_exit
from shorelink.errors import ShorelinkError
from shorelink.files import write_atomic
from shorelink.logs import log4j_pattern
from shorelink.shards import Shard
from shorelink.textout import table, wrap
from spark_core import session
from spark_core.config import SiteConfig, SitesConfig, load_config, shard_site
from spark_core.packages import (
    FILESYSTEMS,
    filesystem_packages,
    spark_package_conf,
    spark_packages,
    spark_submit,
)

if TYPE_CHECKING:
    from spark_core.access import AccessChanges
    from spark_core.topics import Change

__all__ = [
    "config_option",
    "main",
    "render_access_changes",
    "render_topic_changes",
    "spark_properties_path",
    "spark_submit_argv",
    "write_spark_properties",
]

SITE_JOB = Path(__file__).resolve().parent / "jobs" / "site.py"
#: the JVM's log4j2.properties (package data), given as ``LOG4J_CONFIGURATION_FILE``
LOG4J_CONFIG = Path(__file__).resolve().parent / "conf" / "log4j2.properties"


def spark_submit_bin() -> Path:
    """spark-submit of ``$SPARK_HOME`` when set (the platform's Spark), else of the
    installed pyspark (spark_core/packages.py)."""
    return spark_submit()


def spark_submit_argv(
    cfg: SitesConfig,
    site: str,
    config_path: Path,
    ivy_dir: Path,
    extra: list[str],
    properties: Path | None = None,
) -> list[str]:
    """spark-submit's command line. The packages' and scheduler's settings are on it;
    ``[spark.conf]``, whose values may be secrets (``${ENV}``: an object store's keys),
    is not: it goes in the 0600 ``properties`` file (:func:`write_spark_properties`),
    which ``ps`` and ``--dry-run`` do not show (review L9). spark-submit and the
    packages are those of the Spark that runs (``SPARK_HOME``, else pyspark's):
    :class:`~spark_core.packages.UnknownSpark` when its line has none known."""
    sites = [cfg.site(n.strip()) for n in site.split(",")]
    packages = site_packages(cfg, sites)
    conf = spark_package_conf(str(ivy_dir), packages)
    conf.pop("spark.jars.packages")  # given as --packages
    conf["spark.sql.streaming.stopTimeout"] = "60s"
    # urgent streams' queries and merge run in their own pool (spark_core/pools.xml)
    conf.update(session.SCHEDULER_CONF)
    argv = [
        str(spark_submit_bin()),
        "--master",
        cfg.spark.master,
        "--driver-memory",
        cfg.spark.driver_memory,
        "--name",
        "shorelink-" + site.replace(",", "-"),
        "--packages",
        ",".join(packages),
    ]
    if properties is not None:
        argv += ["--properties-file", str(properties)]
    for k, v in conf.items():
        if k not in dict(cfg.spark.conf):
            argv += ["--conf", f"{k}={v}"]
    return [*argv, str(SITE_JOB), "--site", site, "--config", str(config_path.resolve()), *extra]


def site_packages(cfg: SitesConfig, sites: Sequence[SiteConfig]) -> tuple[str, ...]:
    """The Maven packages of the sites' application: the Spark's Kafka connector and
    Delta, the filesystem modules of the sites' checkpoint and table URLs, then
    ``[spark] packages``."""
    urls = [str(loc) for s in sites for loc in (s.checkpoint_dir, s.table_dir)]
    return (*spark_packages(), *filesystem_packages(urls), *cfg.spark.packages)


def spark_properties_path(cfg: SitesConfig, site: str) -> Path:
    """Where ``shorelink-spark site`` keeps ``[spark.conf]`` for spark-submit: beside the
    (first) site's status files (its state_dir, by default its checkpoint_dir)."""
    return cfg.site(site.split(",")[0].strip()).state_path / "spark-submit.properties"


def write_spark_properties(path: Path, conf: Sequence[tuple[str, str]]) -> None:
    """``conf`` as a Java properties file (spark-submit ``--properties-file``), mode 0600."""
    lines = [
        "# [spark.conf] of the sites file, written by shorelink-spark site (mode 0600)\n",
        *(f"{_prop(k, key=True)}={_prop(v)}\n" for k, v in conf),
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, "".join(lines), mode=0o600)


def _prop(text: str, *, key: bool = False) -> str:
    """``text`` escaped for java.util.Properties (read as UTF-8 by spark-submit)."""
    out = text.replace("\\", "\\\\")
    for a, b in (("\n", "\\n"), ("\r", "\\r"), ("\t", "\\t"), ("\f", "\\f")):
        out = out.replace(a, b)
    if key:
        for c in "=: #!":
            out = out.replace(c, "\\" + c)
    elif out.startswith(" "):
        out = "\\" + out
    return out


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="shorelink")
def main() -> None:
    """shorelink-spark: the site's Spark application: merge, replication and Delta tables."""


@main.command("site")
@click.option(
    "--site",
    "site_name",
    required=True,
    help="This site's name in the sites file; several, comma-separated, share one application.",
)
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
@click.option("--log-json", is_flag=True, help="JSON log lines (Python's and the JVM's).")
@click.option(
    "--shard",
    default=None,
    metavar="K/N",
    help="Shard K (from 0) of the site's merge split by origin, [merge] shards = N: "
    "one application per shard.",
)
def site_cmd(
    site_name: str,
    config_path: Path,
    ivy_dir: Path | None,
    available_now: bool,
    dry_run: bool,
    log_json: bool,
    shard: str | None,
) -> None:
    """Run the site's Spark application (merge) with spark-submit."""
    cfg = load_or_exit(load_config, config_path)
    names = [n.strip() for n in site_name.split(",")]
    for name in names:
        site = load_or_exit(functools.partial(lambda n, _: cfg.site(n), name), config_path)
        try:
            shard_site(site, None if shard is None else Shard.parse(shard))
        except ValueError as exc:
            fail(ShorelinkError(f"--shard: {exc}"))
        except ShorelinkError as exc:
            fail(exc)
    if shard is not None and len(names) != 1:
        fail(ShorelinkError("--shard: a shard's application runs one site"))
    extra = [
        *(["--available-now"] if available_now else []),
        *(["--log-json"] if log_json else []),
        *(["--shard", shard] if shard is not None else []),
    ]
    properties = spark_properties_path(cfg, site_name) if cfg.spark.conf else None
    ivy = ivy_dir or session.ivy_dir()
    try:
        argv = spark_submit_argv(cfg, site_name, config_path, ivy, extra, properties)
    except ShorelinkError as exc:
        fail(exc)
    # the driver and executors run this interpreter (where shorelink is installed)
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    # the JVM's log as the Python side's (spark_core/conf/log4j2.properties), named by
    # log4j's own variable: a directory on the classpath (SPARK_CONF_DIR) would stop the
    # JVM dumping or mapping its class-data archive
    env.setdefault("LOG4J_CONFIGURATION_FILE", str(LOG4J_CONFIG))
    env["SHORELINK_SPARK_LOG_PATTERN"] = log4j_pattern(as_json=log_json)
    if dry_run:
        click.echo(f"PYSPARK_PYTHON={shlex.quote(sys.executable)} " + shlex.join(argv))
        if properties is not None:
            keys = ", ".join(k for k, _ in cfg.spark.conf)
            click.echo(f"# {properties} (mode 0600, written at start) holds: {keys}", err=True)
        return
    if properties is not None:
        try:
            write_spark_properties(properties, cfg.spark.conf)
        except OSError as exc:
            fail(ShorelinkError(f"cannot write {properties}: {exc.strerror or exc}"))
    os.execve(argv[0], argv, env)


@main.command("install")
@click.option(
    "--ivy-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Ivy cache to fill (default $SHORELINK_TOOLS/ivy).",
)
@click.option(
    "--filesystem",
    "schemes",
    multiple=True,
    type=click.Choice(sorted(FILESYSTEMS)),
    help="Also the Hadoop module of this URL scheme (s3a: hadoop-aws and the AWS SDK, "
    "686 MB with Spark 4.2). Repeatable.",
)
def install_cmd(ivy_dir: Path | None, schemes: tuple[str, ...]) -> None:
    """Resolve the Kafka connector and Delta of the Spark that runs ($SPARK_HOME, else
    pyspark's) into the Ivy cache once, so the site application, queries and tests start
    without the network. Idempotent; `shorelink stack install` runs it."""
    target = ivy_dir or session.ivy_dir()
    try:
        packages = spark_packages()
        extra = filesystem_packages(f"{s}://" for s in schemes)
    except ShorelinkError as exc:
        fail(exc)
    click.echo(f"spark packages: {', '.join((*packages, *extra))} in {target}", err=True)
    resolved = session.resolve_packages(target, extra)
    click.echo("spark packages: " + ("resolved" if resolved else "present"), err=True)


def _query_session(cfg: SitesConfig, site: SiteConfig, ivy_dir: Path | None) -> Any:
    """An in-process local Spark session with Delta (the same pinned packages)."""
    return session.local_session(
        "shorelink-query",
        packages=site_packages(cfg, [site]),
        conf={**dict(cfg.spark.conf), "spark.ui.enabled": "false"},
        ivy=ivy_dir,
        log_level="ERROR",
    )


_site_opt = click.option("--site", "site_name", required=True, help="Site whose tables to read.")
#: ``--config sites.toml`` (or ``SHORELINK_SPARK_CONFIG``) of every command of the site
config_option = click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path),
    required=True,
    envvar="SHORELINK_SPARK_CONFIG",
    help="sites.toml (env SHORELINK_SPARK_CONFIG).",
)
_ivy_opt = click.option(
    "--ivy-dir", type=click.Path(path_type=Path), default=None, help="Ivy cache (see `site`)."
)
_rows_json_opt = click.option(
    "--json", "as_json", is_flag=True, help="One JSON object per row instead of a table."
)


@main.group("query")
def query_group() -> None:
    """Read the site's Delta tables (docs/tables.md)."""


@query_group.command("container-history")
@_site_opt
@config_option
@_ivy_opt
@_rows_json_opt
@click.option("--container", required=True, help="Container id (the records' key).")
def container_history_cmd(
    site_name: str, config_path: Path, ivy_dir: Path | None, as_json: bool, container: str
) -> None:
    """One container's whole history, across ships and ports, in event-time order."""
    from spark_core.query import HISTORY_COLUMNS, container_history, format_rows, json_rows

    cfg = load_or_exit(load_config, config_path)
    site = load_or_exit(lambda _: cfg.site(site_name), config_path)
    spark = _query_session(cfg, site, ivy_dir)
    try:
        rows = container_history(spark, site, container)
    finally:
        spark.stop()
    for line in (json_rows if as_json else format_rows)(rows, HISTORY_COLUMNS):
        click.echo(line)


@query_group.command("latest-positions")
@_site_opt
@config_option
@_ivy_opt
@_rows_json_opt
def latest_positions_cmd(
    site_name: str, config_path: Path, ivy_dir: Path | None, as_json: bool
) -> None:
    """The newest position of every ship (MMSI) in ship_positions."""
    from spark_core.query import POSITION_COLUMNS, format_rows, json_rows, latest_positions

    cfg = load_or_exit(load_config, config_path)
    site = load_or_exit(lambda _: cfg.site(site_name), config_path)
    spark = _query_session(cfg, site, ivy_dir)
    try:
        rows = latest_positions(spark, site)
    finally:
        spark.stop()
    for line in (json_rows if as_json else format_rows)(rows, POSITION_COLUMNS):
        click.echo(line)


@main.group("topics")
def topics_group() -> None:
    """The site's Kafka topics and their per-stream policy (spark_core/topics.py)."""


@topics_group.command("apply")
@click.option("--site", "site_name", required=True, help="Site whose topics to apply.")
@config_option
@click.option("--dry-run", is_flag=True, help="Show what would change, change nothing.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of a table.")
@click.option(
    "--timeout",
    type=float,
    default=None,
    help="Give up on Kafka after this many seconds (default: the site's kafka.timeout).",
)
def topics_apply_cmd(
    site_name: str, config_path: Path, dry_run: bool, as_json: bool, timeout: float | None
) -> None:
    """Create and configure every topic the site needs, from its stream policy.

    Idempotent: creates missing topics, alters retention.ms, cleanup.policy,
    max.message.bytes and min.insync.replicas where they differ, adds partitions where
    the policy asks for more. Never removes partitions: a canonical or relay topic with
    more than the policy asks is an error. Exit 1 if anything failed or was refused,
    2 if Kafka cannot be reached."""
    import json

    from shorelink.cli_support import fail
    from shorelink.errors import ShorelinkError
    from spark_core.topics import apply_topics, keyed_topics, site_specs

    cfg = load_or_exit(load_config, config_path)
    site = load_or_exit(lambda _: cfg.site(site_name), config_path)
    try:
        admin = site.admin_kafka()
        changes = apply_topics(
            admin.with_timeout(timeout) if timeout else admin,
            site_specs(cfg, site),
            durability=site.durability,
            dry_run=dry_run,
            strict=keyed_topics(site, cfg),
        )
    except ShorelinkError as exc:
        fail(exc)
    errors = [c for c in changes if c.error]
    if as_json:
        doc = {
            "site": site.name,
            "bootstrap": site.kafka.bootstrap,
            "dry_run": dry_run,
            "changes": [c.as_json() for c in changes],
            "errors": len(errors),
        }
        click.echo(json.dumps(doc, indent=1))
    else:
        for line in render_topic_changes(site.name, site.kafka.bootstrap, changes, dry_run):
            click.echo(line)
        for c in errors:
            click.echo(f"error: {c.topic}: {c.error}", err=True)
    if errors:
        sys.exit(1)


@main.group("access")
def access_group() -> None:
    """The site's Kafka principals and ACLs (spark_core/access.py, docs/access-control.md)."""


@access_group.command("apply")
@click.option("--site", "site_name", required=True, help="Site whose principals and ACLs to apply.")
@config_option
@click.option("--dry-run", is_flag=True, help="Show what would change, change nothing.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of lines.")
@click.option(
    "--timeout",
    type=float,
    default=None,
    help="Give up on Kafka after this many seconds (default: the site's kafka.timeout).",
)
def access_apply_cmd(
    site_name: str, config_path: Path, dry_run: bool, as_json: bool, timeout: float | None
) -> None:
    """Create the site's principals (SCRAM users) and their ACLs, as the site's admin
    ([sites.S.access] admin_username, admin_password).

    Idempotent: a user whose password works is left alone, an existing ACL is kept, an
    ACL the file no longer grants to a principal it manages is deleted. Prints one line
    per change (+ added, - removed, ~ password set). Exit 2 if Kafka cannot be reached
    or refuses the admin."""
    import json

    from shorelink.cli_support import fail
    from shorelink.errors import ShorelinkError
    from spark_core.access import apply_access, plan_access
    from spark_core.customers import load_customers

    cfg = load_or_exit(load_config, config_path)
    site = load_or_exit(lambda _: cfg.site(site_name), config_path)
    try:
        customers = load_customers(cfg.customers_file) if cfg.customers_file else None
        plan = plan_access(cfg, site.name, customers.passwords() if customers else None)
        admin = site.admin_kafka()
        changes = apply_access(
            plan, admin.with_timeout(timeout) if timeout else admin, dry_run=dry_run
        )
    except ShorelinkError as exc:
        fail(exc)
    if as_json:
        click.echo(json.dumps({**changes.to_json(), "dry_run": dry_run}, indent=1))
        return
    for line in render_access_changes(site.kafka.bootstrap, len(plan.users), changes, dry_run):
        click.echo(line)


def render_topic_changes(
    site: str, bootstrap: str, changes: Sequence[Change], dry_run: bool, width: int | None = None
) -> list[str]:
    """``topics apply`` as text that fits ``width`` (default: the terminal's, 80 piped):
    a row per change, its detail beside it, or under it when too long."""
    done = [c for c in changes if c.action not in ("refused", "warning")]
    if not done:
        out = wrap(f"site {site}: every topic is as its policy says; nothing to change", width)
    else:
        verb = "would change" if dry_run else "changed"
        out = wrap(f"site {site} ({bootstrap}): {verb} {len(done)}", width)
    rows = [
        [c.topic, c.action if c.error is None else f"{c.action} (error)", c.detail] for c in changes
    ]
    if rows:
        out += table(["topic", "change", "detail"], rows, width)
    return out


def render_access_changes(
    bootstrap: str, users: int, changes: AccessChanges, dry_run: bool, width: int | None = None
) -> list[str]:
    """``access apply`` as text that fits ``width``: a line per change (+ added,
    - removed, ~ password set), a long one wrapped under itself."""
    if not changes.changed:
        return wrap(
            f"site {changes.site}: {users} principals and {changes.unchanged} ACLs are as "
            "the file says; nothing to change",
            width,
        )
    verb = "would change" if dry_run else "changed"
    out = wrap(f"site {changes.site} ({bootstrap}): {verb}", width)
    for line in changes.lines():
        out += wrap(line, width, "  ", "      ")
    return out


@main.command("check-config")
@click.argument("config_file", type=click.Path(path_type=Path))
@click.option("--site", "site_name", default=None, help="Check this site only.")
def check_config_cmd(config_file: Path, site_name: str | None) -> None:
    """Validate CONFIG_FILE (a sites file) and the customers file it names: every site's
    files there and private where they must be, the variables this shell lacks, where
    traffic would cross a network in clear text. Exit 2 if it does not parse, 1 on a
    problem (warnings alone pass)."""
    from spark_core.check import check_sites

    cfg = load_or_exit(load_config, config_file)
    if site_name is not None:
        load_or_exit(lambda _: cfg.site(site_name), config_file)
    report = check_sites(cfg, site_name)
    for line in report.summary:
        click.echo(line)
    for line in report.warnings:
        click.echo(f"warning: {line}", err=True)
    for line in report.problems:
        click.echo(f"error: {line}", err=True)
    if not report.ok:
        sys.exit(1)


@main.command("status")
@click.option("--site", "site_name", required=True, help="Site whose application to show.")
@config_option
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of tables.")
@click.option(
    "--max-age",
    type=float,
    default=None,
    help="Seconds after which a status file counts as stale (default 120).",
)
@click.option(
    "--shard",
    default=None,
    metavar="K/N",
    help="The application of shard K of a site whose merge is split by origin.",
)
def status_cmd(
    site_name: str, config_path: Path, as_json: bool, max_age: float | None, shard: str | None
) -> None:
    """The site application's queries and replication: per query and per neighbour and
    stream, state, lag (records, seconds), last success; the routes. Reads the status
    files in the site's state_dir (by default its checkpoint_dir; a shard's under
    shard-<k>of<N> in it). Exit 1 when they are missing or stale, a query failed, or the
    sites file leaves the site without some other site's records."""
    import json

    from spark_core.status import DEFAULT_MAX_AGE_S, read_status, render

    cfg = load_or_exit(load_config, config_path)
    site = load_or_exit(lambda _: cfg.site(site_name), config_path)
    try:
        site = shard_site(site, None if shard is None else Shard.parse(shard))
    except ValueError as exc:
        fail(ShorelinkError(f"--shard: {exc}"))
    except ShorelinkError as exc:
        fail(exc)
    status = read_status(site, max_age_s=DEFAULT_MAX_AGE_S if max_age is None else max_age)
    if missing := cfg.unreached().get(site.name):
        status.problems.append(
            f"the records of {', '.join(missing)} never reach {site.name}: no chain of "
            "neighbours in the sites file leads there"
        )
    if as_json:
        click.echo(json.dumps(status.as_json(), indent=1))
    else:
        for line in render(status):
            click.echo(line)
    if not status.ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
