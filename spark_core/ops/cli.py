"""``shorelink ops --site S --config sites.toml``: the operations page of one site
(spark_core/ops/app.py), added to the kernel's ``shorelink`` command by the
``shorelink.commands`` entry point."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path
from ssl import SSLContext

import click
from aiohttp import web

from shorelink.cli_support import fail, load_or_exit
from shorelink.errors import ConfigError, ShorelinkError
from shorelink.kafka.endpoint import name_clients
from shorelink.listen import CappedSite
from shorelink.logs import configure_logging, get_logger, logfmt
from shorelink.tls import TlsFile, is_loopback, server_context
from spark_core.cli import config_option
from spark_core.config import OpsConfig, load_config
from spark_core.ops.app import Ops, make_app
from spark_core.ops.users import (
    MAX_PASSWORD_BYTES,
    MIN_PASSWORD_CHARS,
    OpsUsers,
    change_users,
    check_login_name,
    hash_password,
)

__all__ = ["ops", "ops_users"]

log = get_logger(__name__)


@click.command("ops")
@click.option("--site", "site_name", required=True, help="The site whose page this is.")
@config_option
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
    "without it, since the logins' passwords travel with every request.",
)
@click.option("--log-json", is_flag=True, help="Log JSON lines instead of logfmt.")
def ops(
    site_name: str,
    config_path: Path,
    host: str | None,
    port: int | None,
    plain_http: bool,
    log_json: bool,
) -> None:
    """Serve the site's operations page: ships, replication, queries, gateway, alerts
    and a map, updated live; the same facts as JSON under /api (docs/operations.md).
    Read-only; the logins of [sites.S.ops] users_file may look (HTTP Basic; made with
    `shorelink ops-users add`)."""
    sites = load_or_exit(load_config, config_path)
    configure_logging(sites.log_level, as_json=log_json)
    name_clients(f"shorelink-ops-{site_name}")
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
        if o.users_file is None and not is_loopback(listen):
            raise ConfigError(
                f"sites.{site_name}.ops.users_file",
                f"not set, and {listen} is a non-loopback address: the page would be open "
                "to whoever reaches it. Make logins with `shorelink ops-users add NAME "
                f"--site {site_name} --config {config_path}` and name their file here, "
                "or listen on 127.0.0.1",
            )
        if ssl is None and not is_loopback(listen):
            if not plain_http:
                raise ConfigError(
                    f"sites.{site_name}.ops.listen",
                    f"plain HTTP on {listen}, a non-loopback address: logins' passwords and "
                    "every customer's data would cross the network in clear text. Set "
                    "tls_cert_file and tls_key_file, listen on 127.0.0.1, or (behind a TLS "
                    "proxy) pass --plain-http",
                )
            log.warning(
                "plaintext_listen",
                site=site_name,
                address=listen,
                message="SERVING WITHOUT TLS on a non-loopback address (--plain-http): logins' "
                "passwords cross the network in clear text unless a TLS proxy is in front",
            )
        page = Ops(sites, site_name)
    except ShorelinkError as exc:
        fail(exc)
    asyncio.run(_serve(page, listen, o.port if port is None else port, ssl, o))


def _connections_refused() -> None:
    """(Logged, rate-limited, by shorelink/listen.py; the page keeps no metrics.)"""


async def _serve(page: Ops, host: str, port: int, ssl: SSLContext | None, o: OpsConfig) -> None:
    # the gateway's listener hardening (review N7): connections capped from accept,
    # TLS handshakes included, a handshake timeout, headers within the idle timeout
    runner = web.AppRunner(make_app(page), access_log=None, keepalive_timeout=o.idle_timeout_s)
    await runner.setup()
    site = CappedSite(
        runner,
        host,
        port,
        limit=o.max_connections,
        refused=_connections_refused,
        ssl_context=ssl,
        what="ops.listen.max_connections",
    )
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        fail(ShorelinkError(f"cannot listen on {host}:{port}: {exc.strerror or exc}"))
    bound = runner.addresses[0][1] if runner.addresses else port
    scheme = "https" if ssl else "http"
    log.info("ops_listening", site=page.site, url=f"{scheme}://{host}:{bound}/")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


def _users_file(site_name: str, config_path: Path) -> Path:
    sites = load_or_exit(load_config, config_path)
    try:
        path = sites.site(site_name).ops.users_file
    except ShorelinkError as exc:
        fail(exc)
    if path is None:
        fail(ConfigError(f"sites.{site_name}.ops.users_file", "not set: name the logins' file"))
    return path


_site_opt = click.option("--site", "site_name", required=True, help="The page's site.")


@click.group("ops-users", context_settings={"help_option_names": ["-h", "--help"]})
def ops_users() -> None:
    """The operations page's logins: its own, never Kafka passwords. Stored as scrypt
    hashes in [sites.S.ops] users_file (mode 0600); a running page picks up a change
    within a second."""


@ops_users.command("add")
@click.argument("name")
@_site_opt
@config_option
@click.option("--password-stdin", is_flag=True, help="Read the password from stdin (first line).")
def users_add(name: str, site_name: str, config_path: Path, password_stdin: bool) -> None:
    """Add NAME, or give NAME a new password (asked twice, not echoed)."""
    path = _users_file(site_name, config_path)
    if password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = click.prompt(f"password for {name}", hide_input=True, confirmation_prompt=True)
    if not (len(password) >= MIN_PASSWORD_CHARS and len(password.encode()) <= MAX_PASSWORD_BYTES):
        fail(
            ShorelinkError(
                f"a password of {MIN_PASSWORD_CHARS} characters to {MAX_PASSWORD_BYTES} "
                "bytes, please"
            )
        )
    try:
        check_login_name(name, "NAME")
        stored = hash_password(password)

        def put(users: dict[str, str]) -> bool:
            users[name] = stored
            return True

        change_users(path, put)
    except ShorelinkError as exc:
        fail(exc)
    click.echo(logfmt({"event": "ops_user_added", "name": name, "file": path}), err=True)


@ops_users.command("remove")
@click.argument("name")
@_site_opt
@config_option
def users_remove(name: str, site_name: str, config_path: Path) -> None:
    """Remove NAME: a page that has it open is refused within a second."""
    path = _users_file(site_name, config_path)
    try:
        removed = change_users(path, lambda users: users.pop(name, None) is not None)
    except ShorelinkError as exc:
        fail(exc)
    if not removed:
        fail(ShorelinkError(f"no login {name} in {path}"))
    click.echo(logfmt({"event": "ops_user_removed", "name": name, "file": path}), err=True)


@ops_users.command("list")
@_site_opt
@config_option
def users_list(site_name: str, config_path: Path) -> None:
    """The logins' names, one per line."""
    path = _users_file(site_name, config_path)
    try:
        names = OpsUsers(path, str(path)).names if path.exists() else []
    except ShorelinkError as exc:
        fail(exc)
    for n in names:
        click.echo(n)


if __name__ == "__main__":
    ops()
