"""``shorelink-gateway``: the port/HQ gateway that takes ships' batches into Kafka, and
the ship-credential tools."""

from __future__ import annotations

import asyncio
import json
import signal
import ssl
import sys
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import click

from core_gateway.auth import Credentials, ShipCredential
from core_gateway.config import GatewayConfig, load_config
from shorelink.cli_support import config_option, fail, load_or_exit
from shorelink.errors import ConfigError, ShorelinkError
from shorelink.kafka.endpoint import name_clients
from shorelink.logs import configure_logging, get_logger
from shorelink.proof import ShipKeys, signature_mode
from shorelink.textout import table
from shorelink.tls import is_loopback

__all__ = ["main", "render_ships"]

CONFIG = config_option("Gateway", "SHORELINK_GATEWAY_CONFIG")

log = get_logger(__name__)

#: the health check's whole request (the container's HEALTHCHECK gives it 3 s)
HEALTH_TIMEOUT_S = 2.0


def _load(path: Path) -> GatewayConfig:
    return load_or_exit(load_config, path)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="shorelink")
def main() -> None:
    """shorelink-gateway: takes ships' uploads at a port or HQ and writes them into Kafka."""


@main.command("check-config")
@click.argument("config_file", type=click.Path(path_type=Path))
def check_config(config_file: Path) -> None:
    """Validate CONFIG_FILE."""
    cfg = _load(config_file)
    keys = None
    if cfg.ship_keys_file is not None:
        keys = load_or_exit(ShipKeys.load, cfg.ship_keys_file)
    signatures, unenforced = signature_mode(keys, cfg.ship_keys_file)
    if cfg.fleet_pub_file is not None:  # the keys come with the registry, once followed
        signatures, unenforced = f"fleet_registry {cfg.fleet_pub_file}", []
    click.echo(
        f"ok: site={cfg.site} listen={cfg.host}:{cfg.port} "
        f"metrics={f'{cfg.metrics_host}:{cfg.metrics_port}' if cfg.metrics_port else 'off'} "
        f"kafka={cfg.kafka.bootstrap} "
        f"streams={','.join(cfg.streams)} tls={_tls_mode(cfg)} signatures={signatures}"
        f" dictionaries={_dictionaries(cfg)}"
    )
    for warning in [*_in_clear(cfg), *unenforced]:
        click.echo(f"warning: {warning}", err=True)


def _in_clear(cfg: GatewayConfig) -> list[str]:
    """Where this gateway's traffic would cross a network in clear text."""
    out = []
    if cfg.tls_cert_file is None and not is_loopback(cfg.host):
        out.append(
            f"listening on {cfg.host}:{cfg.port} without TLS: ships' bearer tokens and data "
            "cross the network in clear text (set listen.tls_cert_file and tls_key_file)"
        )
    if (kafka := cfg.kafka.in_clear()) is not None:
        out.append(kafka)
    return out


def _dictionaries(cfg: GatewayConfig) -> str:
    """The dictionaries the gateway holds, as ``stream:id`` (``none``)."""
    try:
        held = cfg.dictionaries()
    except ShorelinkError as exc:
        fail(exc)
    return ",".join(f"{d.stream}:{d.dict_id}" for d in held) or "none"


def _tls_mode(cfg: GatewayConfig) -> str:
    if cfg.tls_cert_file is None:
        return "off"
    return "mutual" if cfg.client_ca_file is not None else "on"


@main.command()
@CONFIG
def health(config_path: Path) -> None:
    """Exit 0 when this host's gateway answers /healthz, 1 when it does not (the
    container's health check). Over HTTPS when the config has TLS; the gateway's own
    certificate is not verified there: the probe goes to this host, carries nothing
    secret and asks only whether the server answers."""
    cfg = _load(config_path)
    host = "127.0.0.1" if cfg.host in ("0.0.0.0", "::", "") else cfg.host
    scheme, context = "http", None
    if cfg.tls_cert_file is not None:
        scheme, context = "https", ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    netloc = f"[{host}]" if ":" in host else host
    url = f"{scheme}://{netloc}:{cfg.port}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=HEALTH_TIMEOUT_S, context=context) as r:
            status = r.status
    except (OSError, ValueError) as exc:
        click.echo(f"unhealthy: {url}: {exc}", err=True)
        sys.exit(1)
    click.echo(f"ok: {url} answered {status}")


@main.command()
@CONFIG
@click.option("--log-json", is_flag=True, help="Log JSON lines instead of logfmt.")
def run(config_path: Path, log_json: bool) -> None:
    """Serve the API until SIGTERM or SIGINT."""
    cfg = _load(config_path)
    configure_logging(cfg.log_level, as_json=log_json)
    name_clients(f"shorelink-gateway-{cfg.site}")
    try:
        asyncio.run(serve(cfg))
    except ShorelinkError as exc:
        fail(exc)


async def serve(
    cfg: GatewayConfig,
    *,
    install_signals: bool = True,
    started: asyncio.Event | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    from aiohttp import web

    from core_gateway.app import create_app, create_metrics_app
    from core_gateway.service import GatewayService
    from shorelink.listen import CappedSite

    ctx = cfg.ssl_context()  # first: a bad certificate is a ConfigError before anything
    service = GatewayService(cfg)
    runner = web.AppRunner(
        create_app(service), access_log=None, keepalive_timeout=cfg.idle_timeout_s
    )
    await runner.setup()
    site = CappedSite(
        runner,
        cfg.host,
        cfg.port,
        limit=cfg.max_connections,
        refused=service.metrics.connections_refused.inc,
        ssl_context=ctx,
    )
    await site.start()
    operators = web.AppRunner(create_metrics_app(service), access_log=None)
    await operators.setup()
    if cfg.metrics_port:
        try:
            await web.TCPSite(operators, cfg.metrics_host, cfg.metrics_port).start()
        except OSError as exc:
            await runner.cleanup()
            await operators.cleanup()
            raise ConfigError(
                "metrics.port",
                f"cannot listen on {cfg.metrics_host}:{cfg.metrics_port}: {exc.strerror or exc}",
            ) from exc
    stop = stop or asyncio.Event()
    if install_signals:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    starter = asyncio.create_task(service.start())
    log.info(
        "gateway_listening",
        site=cfg.site,
        address=f"{cfg.host}:{cfg.port}",
        tls=_tls_mode(cfg),
        metrics=f"{cfg.metrics_host}:{cfg.metrics_port}" if cfg.metrics_port else "off",
    )
    if ctx is None and not is_loopback(cfg.host):
        log.warning(
            "plaintext_listen",
            address=f"{cfg.host}:{cfg.port}",
            message="SERVING WITHOUT TLS on a non-loopback address: ships' bearer tokens and "
            "data cross the network in clear text. Set listen.tls_cert_file and "
            "listen.tls_key_file, or listen on 127.0.0.1 behind a TLS proxy.",
        )
    if (kafka := cfg.kafka.in_clear()) is not None:
        log.warning("kafka_without_tls", site=cfg.site, message=kafka)
    keys = None if service.ship_keys is None else service.ship_keys.current()
    signatures, unenforced = signature_mode(keys, cfg.ship_keys_file)
    log.info(
        "signature_mode",
        site=cfg.site,
        signatures=signatures,
        ship_keys_file=cfg.ship_keys_file or "-",
    )
    for why in unenforced:
        log.warning("signatures_not_enforced", site=cfg.site, message=why)
    if started is not None:
        started.set()
    try:
        # a fenced gateway keeps running, unready (503 not_ready, /readyz says why):
        # exiting would let a supervisor restart it, and its restart would fence the
        # gateway that took over, which would do the same: a fencing loop
        await stop.wait()
    finally:
        starter.cancel()
        await operators.cleanup()
        await runner.cleanup()
        await service.stop()


@main.group()
def ships() -> None:
    """Manage ships' credentials (bearer tokens, stored hashed)."""


@ships.command("add")
@click.argument("ship")
@click.option(
    "--require-client-cert/--no-require-client-cert",
    default=None,
    help="The ship must also present a client certificate naming it (mutual TLS; "
    "needs listen.client_ca_file). Default: as before for a replaced credential, "
    "not required for a new one.",
)
@CONFIG
def ships_add(ship: str, require_client_cert: bool | None, config_path: Path) -> None:
    """Create (or replace) SHIP's credential and print its token once."""
    cfg = _load(config_path)
    try:
        creds = _file_credentials(cfg)
        token = creds.add(ship, require_client_cert=require_client_cert)
    except ShorelinkError as exc:
        fail(exc)
    _warn_without_client_ca(cfg, creds, ship)
    click.echo(token)
    click.echo(
        f"stored the hash for ship {ship} in {cfg.credentials_file}; the token is not shown again. "
        "Put it in the ship's token_file (mode 0600).",
        err=True,
    )


@ships.command("list")
@CONFIG
@click.option("--json", "as_json", is_flag=True, help="One JSON object per ship, in a list.")
def ships_list(config_path: Path, as_json: bool) -> None:
    """List ships with a credential: active or revoked, whether a client certificate is
    required, when created (never the tokens, nor their hashes)."""
    cfg = _load(config_path)
    try:
        creds = _file_credentials(cfg).list()
    except ShorelinkError as exc:
        fail(exc)
    if as_json:
        doc = [
            {
                "ship": c.ship,
                "revoked": c.revoked,
                "require_client_cert": c.require_client_cert,
                "created": c.created,
            }
            for c in creds
        ]
        click.echo(json.dumps(doc, indent=2))
        return
    if not creds:
        click.echo(f"no ship has a credential in {cfg.credentials_file}")
    for line in render_ships(creds):
        click.echo(line)


def render_ships(creds: Sequence[ShipCredential], width: int | None = None) -> list[str]:
    """``ships list`` as text that fits ``width`` (default: the terminal's, 80 piped):
    a row per ship, or a block per ship when names are long."""
    rows = [
        [
            c.ship,
            "revoked" if c.revoked else "active",
            "client-cert required" if c.require_client_cert else "token only",
            c.created,
        ]
        for c in creds
    ]
    return table(["ship", "state", "auth", "created"], rows, width) if rows else []


@ships.command("client-cert")
@click.argument("ship")
@click.argument("need", type=click.Choice(["required", "optional"]))
@CONFIG
def ships_client_cert(ship: str, need: str, config_path: Path) -> None:
    """Whether SHIP must present a client certificate naming it (mutual TLS, besides
    its token): required or optional. The token stays as it is."""
    cfg = _load(config_path)
    creds = _file_credentials(cfg)
    try:
        found = creds.require_client_cert(ship, need == "required")
    except ShorelinkError as exc:
        fail(exc)
    if not found:
        fail(ShorelinkError(f"no credential for ship {ship!r}"))
    _warn_without_client_ca(cfg, creds, ship)
    click.echo(f"client certificate {need} for {ship}")


def _file_credentials(cfg: GatewayConfig) -> Credentials:
    """The credentials file of a site run alone; a gateway following the fleet registry
    has none (its ships are the registry's: ``shorelink fleet ...`` at headquarters)."""
    if cfg.credentials_file is None:
        fail(
            ShorelinkError(
                "this gateway follows the fleet registry (fleet_pub_file): ships are "
                "provisioned and revoked at headquarters with `shorelink fleet ...`"
            )
        )
    return Credentials(cfg.credentials_file)


def _warn_without_client_ca(cfg: GatewayConfig, creds: Credentials, ship: str) -> None:
    if cfg.client_ca_file is None and creds.requires_client_cert(ship):
        click.echo(
            f"warning: this gateway asks for no client certificates (listen.client_ca_file "
            f"is not set): every request of {ship} will be refused 401 until it does",
            err=True,
        )


@ships.command("revoke")
@click.argument("ship")
@CONFIG
def ships_revoke(ship: str, config_path: Path) -> None:
    """Revoke SHIP's credential (a running gateway notices within a second)."""
    cfg = _load(config_path)
    if not _file_credentials(cfg).revoke(ship):
        fail(ShorelinkError(f"no credential for ship {ship!r}"))
    click.echo(f"revoked {ship}")


if __name__ == "__main__":
    main()
