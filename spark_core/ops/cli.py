"""``shorelink ops --site S --config sites.toml``: the operations page of one site
(spark_core/ops/app.py), added to the kernel's ``shorelink`` command by the
``shorelink.commands`` entry point."""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path

import click
from aiohttp import web

from shorelink.cli_support import fail, load_or_exit
from shorelink.errors import ConfigError, ShorelinkError
from shorelink.logs import configure_logging
from shorelink.tls import TlsFile, is_loopback, server_context
from spark_core.config import load_config
from spark_core.ops.app import Ops, make_app

__all__ = ["ops"]

log = logging.getLogger(__name__)


@click.command("ops")
@click.option("--site", "site_name", required=True, help="The site whose page this is.")
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path),
    required=True,
    envvar="SHORELINK_SPARK_CONFIG",
    help="sites.toml (env SHORELINK_SPARK_CONFIG).",
)
@click.option("--host", default=None, help="Listen address (default: [sites.S.ops.listen] host).")
@click.option(
    "--port",
    type=int,
    default=None,
    help="Listen port (default: [sites.S.ops.listen] port; 0: any free).",
)
@click.option(
    "--plain-http",
    is_flag=True,
    help="Serve plain HTTP on a non-loopback address (behind a TLS proxy); refused "
    "without it, since staff passwords travel with every request.",
)
@click.option("--json-logs", is_flag=True, help="Log JSON lines instead of key=value.")
def ops(
    site_name: str,
    config_path: Path,
    host: str | None,
    port: int | None,
    plain_http: bool,
    json_logs: bool,
) -> None:
    """Serve the site's operations page: ships, replication, queries, gateway, alerts
    and a map, updated live; the same facts as JSON under /api (docs/operations.md).
    Read-only; the sites file's [[staff]] may look (HTTP Basic)."""
    sites = load_or_exit(load_config, config_path)
    configure_logging(sites.log_level, as_json=json_logs)
    try:
        cfg = sites.site(site_name)
        o = cfg.ops
        ssl = (
            server_context(
                TlsFile(o.tls_cert_file, f"sites.{site_name}.ops.listen.tls_cert_file"),
                TlsFile(o.tls_key_file, f"sites.{site_name}.ops.listen.tls_key_file"),
            )
            if o.tls_cert_file is not None and o.tls_key_file is not None
            else None
        )
        listen = host or o.host
        if ssl is None and not is_loopback(listen):
            if not plain_http:
                raise ConfigError(
                    f"sites.{site_name}.ops.listen",
                    f"plain HTTP on {listen}, a non-loopback address: staff passwords and "
                    "every customer's data would cross the network in clear text. Set "
                    "tls_cert_file and tls_key_file, listen on 127.0.0.1, or (behind a TLS "
                    "proxy) pass --plain-http",
                )
            log.warning(
                "event=plaintext_listen site=%s address=%s message=%r",
                site_name,
                listen,
                "SERVING WITHOUT TLS on a non-loopback address (--plain-http): staff "
                "passwords cross the network in clear text unless a TLS proxy is in front",
            )
        page = Ops(sites, site_name)
    except ShorelinkError as exc:
        fail(exc)
    asyncio.run(_serve(page, listen, o.port if port is None else port, ssl))


async def _serve(page: Ops, host: str, port: int, ssl: object) -> None:
    runner = web.AppRunner(make_app(page), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=ssl)  # type: ignore[arg-type]
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        fail(ShorelinkError(f"cannot listen on {host}:{port}: {exc.strerror or exc}"))
    bound = runner.addresses[0][1] if runner.addresses else port
    scheme = "https" if ssl else "http"
    click.echo(f"event=ops_listening site={page.site} url={scheme}://{host}:{bound}/", err=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


if __name__ == "__main__":
    ops()
