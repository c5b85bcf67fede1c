"""``shorelink-edge``: the ship's edge agent (MQTT ingest into a durable log; upload to
shore) and the tools to inspect it."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import click

from edge_agent.config import EdgeConfig, load_config, load_dictionaries, load_signing_key
from edge_agent.status import collect_status, open_log, render
from shorelink.cli_support import config_option, fail, load_or_exit
from shorelink.errors import ShorelinkError
from shorelink.logs import configure_logging

__all__ = ["main"]

CONFIG = config_option("Edge", "SHORELINK_EDGE_CONFIG")


def _load(path: Path) -> EdgeConfig:
    return load_or_exit(load_config, path)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="shorelink")
def main() -> None:
    """shorelink-edge: the ship's edge agent."""


@main.command("check-config")
@click.argument("config_file", type=click.Path(path_type=Path))
def check_config(config_file: Path) -> None:
    """Validate CONFIG_FILE; print the effective settings (secrets masked)."""
    cfg = _load(config_file)
    gateways = ",".join(f"{g.site}/{g.link}" for g in cfg.gateways) or "none (ingest only)"
    click.echo(
        f"ok: ship={cfg.ship} log={cfg.log.path} mqtt={cfg.mqtt.host}:{cfg.mqtt.port} "
        f"streams={','.join(s.name for s in cfg.by_priority())} rules={len(cfg.rules)} "
        f"gateways={gateways}"
    )
    path = cfg.uplink.signing_key_file
    key = None if path is None else load_or_exit(load_signing_key, path)  # (checked by _load)
    if key is None:
        click.echo("signing: off (batches go unsigned: uplink.signing_key_file is not set)")
    else:
        click.echo(
            f"signing: every batch signed; public key {key.public()} (the sites' ship keys "
            f"file must hold it for {cfg.ship})"
        )
    held = load_or_exit(load_dictionaries, cfg.uplink.dictionaries_dir)  # type: ignore[arg-type]
    click.echo(
        "dictionaries: "
        + (", ".join(f"{d.stream} {d.dict_id} ({len(d.data)} bytes)" for d in held) or "none")
    )
    if cfg.gateways and not cfg.uplink.token:
        click.echo(
            "warning: uplink.token is empty: `run` refuses to start until it is set", err=True
        )


@main.command()
@CONFIG
@click.option("--log-json", is_flag=True, help="Log JSON lines instead of logfmt.")
def run(config_path: Path, log_json: bool) -> None:
    """Run the agent (systemd: Type=notify) until SIGTERM or SIGINT."""
    from edge_agent.agent import Supervisor

    cfg = _load(config_path)
    configure_logging(cfg.log_level, as_json=log_json)

    async def _main() -> None:
        # runs the agent again after a fleet configuration is applied or rolled back
        await Supervisor(config_path).run()

    try:
        asyncio.run(_main())
    except ShorelinkError as exc:
        fail(exc)


@main.command()
@CONFIG
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(config_path: Path, as_json: bool) -> None:
    """Per stream: last seq, what shore holds, backlog, oldest undelivered age; per
    gateway: link up or down, last success, today's bytes against the link's budget; and
    the quarantine count. Reads the log, so it works while the agent runs."""
    cfg = _load(config_path)
    try:
        edge_log = open_log(cfg, readonly=True)
        report = collect_status(cfg, edge_log)
        edge_log.close()
    except ShorelinkError as exc:
        fail(exc)
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    for line in render(report):
        click.echo(line)


@main.command()
@CONFIG
@click.option("--stream", required=True, help="Stream to show.")
@click.option("-n", "count", default=10, show_default=True, help="How many of the newest records.")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new records.")
def tail(config_path: Path, stream: str, count: int, follow: bool) -> None:
    """Print the newest records of a stream (seq, key, event time, topic, payload)."""
    cfg = _load(config_path)
    try:
        edge_log = open_log(cfg, readonly=True)
        last = 0
        while True:
            recs = (
                edge_log.tail(stream, count)
                if not last
                else edge_log.read(stream, last + 1, 1 << 62)
            )
            for r in recs:
                payload = r.payload.decode("utf-8", "backslashreplace")
                click.echo(f"{r.seq}\t{r.key}\t{r.ts_ms}\t{r.topic}\t{payload}")
                last = r.seq
            if not follow:
                break
            if not recs and not last:
                last = edge_log.stream_state(stream).next_seq - 1
            time.sleep(1)
            edge_log.close()
            edge_log = open_log(cfg, readonly=True)  # see the writer's newest commits
    except ShorelinkError as exc:
        fail(exc)


@main.command()
@click.option(
    "--out",
    required=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="The bundle to write: a .tar (or .tar.gz).",
)
@click.option(
    "--arch",
    default=None,
    help="The ship's machine, as uname -m says (x86_64, aarch64). [default: this machine's]",
)
@click.option(
    "--python",
    "python_version",
    default=None,
    help="The ship's Python, X.Y (Debian 12: 3.11). [default: this machine's]",
)
@click.option(
    "--glibc",
    default=None,
    help="The ship's glibc, X.Y (Debian 12: 2.36): wheels for a newer one are not taken. [default: this machine's]",
)
@click.option(
    "--source",
    type=click.Path(path_type=Path, file_okay=False, exists=True),
    default=None,
    help="The shorelink checkout to take the wheel and deploy/edge/ from. [default: the one this command runs from]",
)
@click.option(
    "--wheel",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    default=None,
    help="A shorelink wheel to carry instead of building one from the checkout.",
)
@click.option(
    "--find-links",
    multiple=True,
    help="Passed to pip: a folder or page of wheels to take from too.",
)
@click.option("--index-url", default=None, help="Passed to pip: the index (a mirror of PyPI).")
@click.option("--no-index", is_flag=True, help="Passed to pip: only --find-links, no index.")
def bundle(
    out: Path,
    arch: str | None,
    python_version: str | None,
    glibc: str | None,
    source: Path | None,
    wheel: Path | None,
    find_links: tuple[str, ...],
    index_url: str | None,
    no_index: bool,
) -> None:
    """Build one file that installs the agent on a ship with no network: the wheels of
    shorelink[edge] for the ship's machine and Python, the systemd unit, a sysusers.d
    file, the sample config, install.sh and SHA256SUMS (checked by install.sh). Needs
    the index ashore (PyPI or --index-url, --find-links); a dependency with no wheel for
    the target is named and nothing is written. On the ship: tar -xf FILE && sudo
    ./shorelink-edge-*/install.sh (docs/edge-agent.md, "Installing a ship from a
    bundle")."""
    from edge_agent.bundle import Target, build_bundle, describe

    pip_opts = [f"--find-links={f}" for f in find_links]
    pip_opts += [f"--index-url={index_url}"] if index_url else []
    pip_opts += ["--no-index"] if no_index else []
    try:
        here = Target.here()
        target = Target(arch or here.machine, python_version or here.python, glibc or here.glibc)
        made = build_bundle(
            out, target, source=source, wheel=wheel, pip_opts=pip_opts,
            say=lambda s: click.echo(s, err=True),
        )  # fmt: skip
    except ShorelinkError as exc:
        fail(exc)
    click.echo(describe(made))


if __name__ == "__main__":
    main()
