"""``shorelink fleet ...``: the fleet registry at headquarters (docs/fleet-registry.md).

Every command names the registry's directory (``--registry DIR``, or
``SHORELINK_FLEET_REGISTRY``), reads its log from the first entry (every signature and
link of the chain checked) and, for a change, appends the entries it signs with the
fleet key (``shorelink fleet publish``, which reaches Kafka, is in shorelink/cli.py).
Secrets (a token, a ship's private key) are written owner-only and printed
nowhere but where the command says.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from shorelink.cli_support import fail, seq_bound
from shorelink.errors import ShorelinkError

if TYPE_CHECKING:
    from shorelink.fleet.entry import SeqBound
    from shorelink.fleet.log import Registry
    from shorelink.fleet.state import FleetState, ShipRecord

__all__ = ["fleet", "registry_option", "render_status", "status_json"]


def registry_option() -> Callable[[Any], Any]:
    """``--registry DIR`` (or ``SHORELINK_FLEET_REGISTRY``): every command's, and
    ``shorelink fleet publish``'s (shorelink/cli.py)."""
    return click.option(
        "--registry",
        "directory",
        type=click.Path(path_type=Path, file_okay=False),
        required=True,
        envvar="SHORELINK_FLEET_REGISTRY",
        help="The registry's directory (env SHORELINK_FLEET_REGISTRY).",
    )


_REGISTRY = registry_option()
_FROM_SEQ = click.option(
    "--from-seq",
    "from_seq",
    multiple=True,
    required=True,
    metavar="[STREAM=]SEQ",
    help="Per STREAM (repeatable; a stream not named: from 1), or one SEQ for every stream.",
)


@click.group("fleet")
def fleet() -> None:
    """The fleet registry at headquarters: ships, their groups, token hashes, signing
    keys with their history and configurations, as one log of entries signed by the
    fleet key (docs/fleet-registry.md)."""


def _open(directory: Path) -> Registry:
    from shorelink.fleet.log import Registry

    return Registry.open(directory)


def _run(action: Callable[[], Any]) -> Any:
    try:
        return action()
    except ShorelinkError as exc:
        fail(exc)


@fleet.command("init")
@_REGISTRY
def fleet_init(directory: Path) -> None:
    """Make a registry in DIR (0700): the fleet key (fleet.key, 0600), its public half
    (fleet.pub, the root key every site and ship pins) and the log's first entry."""
    from shorelink.fleet.log import Registry

    reg = _run(lambda: Registry.init(directory))
    click.echo(
        f"registry {directory}: fleet key {reg.state.fleet_key_id} (fleet.key, mode 0600; "
        f"keep it at headquarters), root public key in {directory / 'fleet.pub'}"
    )


@fleet.command("provision")
@click.argument("ship")
@_REGISTRY
@click.option("--group", "groups", multiple=True, required=True, help="A group (repeatable).")
@click.option(
    "--out",
    type=click.Path(path_type=Path, file_okay=False),
    help="The bundle's directory (default: DIR/bundles/SHIP; never overwritten).",
)
@click.option(
    "--tar",
    "tar_path",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Also write the bundle as one tar (mode 0600) to carry on board.",
)
@click.option(
    "--require-client-cert",
    is_flag=True,
    help="Its token alone is not enough: it must present a client certificate naming it.",
)
def fleet_provision(
    ship: str,
    directory: Path,
    groups: tuple[str, ...],
    out: Path | None,
    tar_path: Path | None,
    require_client_cert: bool,
) -> None:
    """Add SHIP in one step: its identity and groups, a token (only its hash in the
    registry), a signing key, and a bundle to carry on board (token and key 0600,
    the fleet's root key, edge.toml's lines for them)."""
    from shorelink.fleet.bundle import provision

    def provisioned() -> Path:
        return provision(
            _open(directory), ship, groups, out, tar_path, require_client_cert=require_client_cert
        )

    bundle = _run(provisioned)
    click.echo(f"ship {ship}: provisioned in groups {', '.join(groups)}; bundle {bundle}")
    if tar_path is not None:
        click.echo(f"bundle as a tar: {tar_path} (mode 0600)")
    click.echo(
        "next: carry the bundle on board (it holds the only copy of the token), delete it "
        "here, and `shorelink fleet export` for the sites"
    )


@fleet.command("rotate-key")
@click.argument("ship")
@_REGISTRY
@_FROM_SEQ
@click.option(
    "--revoke",
    is_flag=True,
    help="The old key was stolen: say so (it is bounded at --from-seq either way).",
)
@click.option(
    "--key-file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Where the new private key goes (0600, never overwritten; default: "
    "DIR/bundles/SHIP/ship-KEYID.key).",
)
def fleet_rotate_key(
    ship: str, directory: Path, from_seq: tuple[str, ...], revoke: bool, key_file: Path | None
) -> None:
    """Give SHIP a new signing key that signs from --from-seq on. The old key proves
    the ship's records below it, at every site, and none at or above it."""
    from shorelink.fleet.entry import key_id
    from shorelink.proof import ShipKey

    def rotate() -> tuple[str, Path]:
        bound = seq_bound(from_seq, "--from-seq")
        reg = _open(directory)
        key = ShipKey.generate()
        kid = key_id(key.public())
        path = key_file or directory / "bundles" / ship / f"ship-{kid}.key"
        if path.exists():
            raise ShorelinkError(f"{path} exists: a ship's key is never overwritten")
        rec = reg.state.ships.get(ship)
        changes: list[tuple[str, dict[str, Any]]] = [
            ("ship_key_added", {"ship": ship, "public": key.public(), "from_seq": bound})
        ]
        if revoke and rec is not None and rec.keys:
            old = rec.keys[-1].id
            changes.append(("key_revoked", {"ship": ship, "key_id": old, "at_seq": bound}))
        reg.append(changes)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        key.save(path)
        return kid, path

    kid, path = _run(rotate)
    click.echo(f"ship {ship}: key {kid} signs from {' '.join(from_seq)}; private key in {path}")
    click.echo("next: carry it on board (uplink.signing_key_file), then `shorelink fleet export`")


@fleet.command("revoke")
@click.argument("ship")
@_REGISTRY
@click.option("--key", "kid", metavar="KEY_ID", help="Revoke this previous key, not the ship.")
@click.option(
    "--from-seq",
    "from_seq",
    multiple=True,
    metavar="[STREAM=]SEQ",
    help="With --key: the first seq it may not sign (per STREAM, or one SEQ; 1: nothing).",
)
def fleet_revoke(ship: str, directory: Path, kid: str | None, from_seq: tuple[str, ...]) -> None:
    """Revoke SHIP (its tokens refused everywhere; what it signed stays provable), or
    with --key one of its previous keys from a seq on (a key found stolen)."""

    def revoke() -> str:
        if kid is None:
            if from_seq:
                raise ShorelinkError("--from-seq bounds a key: give --key with it")
            _open(directory).append([("ship_revoked", {"ship": ship})])
            return f"ship {ship}: revoked"
        if not from_seq:
            raise ShorelinkError("--key needs --from-seq: the first seq it may not sign")
        bound = seq_bound(from_seq, "--from-seq")
        _open(directory).append([("key_revoked", {"ship": ship, "key_id": kid, "at_seq": bound})])
        return f"ship {ship}: key {kid} proves nothing from {' '.join(from_seq)} on"

    click.echo(_run(revoke) + "; next: `shorelink fleet export` for the sites")


@fleet.command("rotate-token")
@click.argument("ship")
@_REGISTRY
@click.option(
    "--at-once",
    is_flag=True,
    help="The old token leaked: refuse it now (default: valid until the ship reports the new one, or `retire-token`).",
)
@click.option(
    "--token-file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Where the new token goes (0600, never overwritten; default: "
    "DIR/bundles/SHIP/gateway-VERSION.token).",
)
def fleet_rotate_token(ship: str, directory: Path, at_once: bool, token_file: Path | None) -> None:
    """Issue SHIP a new token; the old one stays valid beside it until the ship's report
    names the new one (`fleet run` retires it then) or `fleet retire-token` (or, with
    --at-once, is refused from now on)."""
    from shorelink.files import write_atomic
    from shorelink.fleet.entry import hash_token, new_token

    def rotate() -> Path:
        reg = _open(directory)
        token = new_token()
        path = token_file or directory / "bundles" / ship / f"gateway-{reg.state.version + 1}.token"
        if path.exists():
            raise ShorelinkError(f"{path} exists: a token file is never overwritten")
        body = {"ship": ship, "token_hash": hash_token(token), "retire_previous": at_once}
        reg.append([("token_issued", body)])
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_atomic(path, token + "\n", mode=0o600)
        return path

    path = _run(rotate)
    old = (
        "refused from now on"
        if at_once
        else "valid until the ship reports using the new one (`shorelink fleet run` then"
        " retires it) or `shorelink fleet retire-token`"
    )
    click.echo(f"ship {ship}: new token in {path} (mode 0600); the old one is {old}")


@fleet.command("retire-token")
@click.argument("ship")
@_REGISTRY
def fleet_retire_token(ship: str, directory: Path) -> None:
    """Retire SHIP's previous token (the ship uses its new one now)."""

    def retire() -> None:
        reg = _open(directory)
        rec = reg.state.ships.get(ship)
        if rec is None or len(rec.tokens) < 2:
            raise ShorelinkError(f"ship {ship} has no token rotation pending")
        reg.append([("token_retired", {"ship": ship, "token_hash": rec.tokens[0].hash})])

    _run(retire)
    click.echo(f"ship {ship}: previous token retired; next: `shorelink fleet export`")


@fleet.command("client-cert")
@click.argument("ship")
@click.argument("need", type=click.Choice(["required", "optional"]))
@_REGISTRY
def fleet_client_cert(ship: str, need: str, directory: Path) -> None:
    """Say whether SHIP must present a client certificate naming it besides its token
    (mutual TLS; every gateway following the registry enforces it)."""
    body = {"ship": ship, "required": need == "required"}
    _run(lambda: _open(directory).append([("client_cert_set", body)]))
    click.echo(f"ship {ship}: client certificate {need}; next: `shorelink fleet publish`")


@fleet.group("config")
def fleet_config() -> None:
    """Configurations for a group of ships or one ship (opaque TOML or JSON documents
    for now; their schema and their way to the ships are later parts of issue 41)."""


def read_document(file: Path) -> tuple[str, str]:
    """A configuration file's format (by its suffix) and text, checked to parse and to
    fit the registry's bound."""
    from shorelink import strict_json
    from shorelink.config import parse_toml
    from shorelink.fleet.entry import MAX_CONFIG_BYTES

    fmt = {".toml": "toml", ".json": "json"}.get(file.suffix)
    if fmt is None:
        raise ShorelinkError(f"{file}: a .toml or .json file")
    raw = file.read_bytes()
    if len(raw) > MAX_CONFIG_BYTES:
        raise ShorelinkError(f"{file}: {len(raw)} bytes, more than {MAX_CONFIG_BYTES}")
    try:
        text = raw.decode()
        strict_json.loads(text) if fmt == "json" else parse_toml(text)
    except ValueError as exc:
        raise ShorelinkError(f"{file} does not parse as {fmt}: {exc}") from None
    return fmt, text


@fleet_config.command("set")
@click.argument("file", type=click.Path(path_type=Path, dir_okay=False, exists=True))
@_REGISTRY
@click.option("--group", help="The group it is for.")
@click.option("--ship", help="The ship it is for.")
@click.option(
    "--port-links-only", is_flag=True, help="Fetched over port links only, never the satellite."
)
def fleet_config_set(
    file: Path, directory: Path, group: str | None, ship: str | None, port_links_only: bool
) -> None:
    """Set the configuration of a group (--group) or a ship (--ship) to FILE (.toml or
    .json; it must parse)."""

    def set_config() -> int:
        if (group is None) == (ship is None):
            raise ShorelinkError("give one of --group G or --ship S")
        fmt, text = read_document(file)
        scope, name = ("group", group) if group is not None else ("ship", ship)
        body = {
            "scope": scope,
            "name": name,
            "format": fmt,
            "document": text,
            "port_links_only": port_links_only,
        }
        reg = _open(directory)
        reg.append([("config_set", body)])
        return reg.state.version

    version = _run(set_config)
    target = f"group {group}" if group is not None else f"ship {ship}"
    click.echo(f"{target}: configuration {file.name} is version {version}")


@fleet.command("set-groups")
@click.argument("ship")
@_REGISTRY
@click.option("--group", "groups", multiple=True, required=True, help="A group (repeatable).")
def fleet_set_groups(ship: str, directory: Path, groups: tuple[str, ...]) -> None:
    """Set SHIP's groups (in order: a later group's configuration over an earlier
    one's): the configurations of the groups it leaves no longer apply to it."""

    def set_groups() -> int:
        reg = _open(directory)
        reg.append([("ship_groups_set", {"ship": ship, "groups": list(groups)})])
        return reg.state.version

    version = _run(set_groups)
    click.echo(f"ship {ship}: groups {', '.join(groups)} from version {version}")


@fleet_config.command("remove")
@_REGISTRY
@click.option("--group", help="The group whose configuration goes.")
@click.option("--ship", help="The ship whose own configuration goes.")
def fleet_config_remove(directory: Path, group: str | None, ship: str | None) -> None:
    """Remove the configuration of a group (--group) or a ship (--ship): its ships go
    back to what applies without it (their other scopes, edge.toml)."""

    def remove_config() -> int:
        if (group is None) == (ship is None):
            raise ShorelinkError("give one of --group G or --ship S")
        scope, name = ("group", group) if group is not None else ("ship", ship)
        reg = _open(directory)
        reg.append([("config_removed", {"scope": scope, "name": name})])
        return reg.state.version

    version = _run(remove_config)
    target = f"group {group}" if group is not None else f"ship {ship}"
    click.echo(f"{target}: configuration removed at version {version}")


def _bound_text(bound: SeqBound | None) -> str:
    if bound is None:
        return ""
    if isinstance(bound, int):
        return str(bound)
    return ",".join(f"{s}={n}" for s, n in sorted(bound.items()))


def _ship_json(state: FleetState, rec: ShipRecord) -> dict[str, Any]:
    return {
        "ship": rec.name,
        "groups": list(rec.groups),
        "revoked": rec.revoked,
        "tokens": len(rec.tokens),
        "require_client_cert": rec.require_client_cert,
        "keys": [
            {
                "id": k.id,
                "from_seq": k.from_seq,
                "valid_below": rec.valid_below(i),
                "revoked_at": k.revoked_at,
            }
            for i, k in enumerate(rec.keys)
        ],
        "config_version": state.config_version(rec.name),
    }


def status_json(
    state: FleetState, health: dict[str, dict[str, Any]] | None = None
) -> dict[str, Any]:
    """``fleet status --json``: the registry's version and fleet key, every ship (with
    ``health``: what its reports say, shorelink/fleet/rollout_cli.py)."""
    ships = []
    for s in sorted(state.ships):
        ship = _ship_json(state, state.ships[s])
        if health is not None:
            ship.update(health[s])
        ships.append(ship)
    return {"version": state.version, "fleet_key": state.fleet_key_id, "ships": ships}


def _ago(seconds: int | None) -> str:
    if seconds is None:
        return "never"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


def _health_columns(health: dict[str, Any]) -> list[str]:
    """``fleet status``'s three columns of a ship's health."""
    applied = "" if health["applied"] is None else str(health["applied"])
    return [applied, health["health"], _ago(health["heard_s_ago"])]


def render_status(
    state: FleetState,
    width: int | None = None,
    health: dict[str, dict[str, Any]] | None = None,
) -> list[str]:
    """``fleet status`` for people: a row a ship (with ``health``: the version its
    reports say it runs, its health and when it was last heard of)."""
    from shorelink.textout import table

    rows = []
    for name in sorted(state.ships):
        rec = state.ships[name]
        token = "revoked" if rec.revoked else ("rotating" if len(rec.tokens) > 1 else "ok")
        keys = " ".join(
            k.id + (f"<{_bound_text(b)}" if (b := rec.valid_below(i)) is not None else "")
            for i, k in enumerate(rec.keys)
        )
        config = state.config_version(name)
        row = [name, ",".join(rec.groups), token, "" if config is None else str(config)]
        if health is not None:
            row += _health_columns(health[name])
        rows.append([*row, keys])
    head = f"registry version {state.version}, fleet key {state.fleet_key_id}, {len(rows)} ships"
    if not rows:
        return [head]
    columns = ["ship", "groups", "token", "config"]
    right = [3]
    if health is not None:
        columns += ["applied", "health", "heard"]
        right.append(4)
    return [head, *table([*columns, "keys"], rows, width, right=right)]


@fleet.command("export")
@_REGISTRY
@click.option(
    "--gateway-credentials",
    "credentials",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Write the gateway's credentials file here (credentials_file; mode 0600).",
)
@click.option(
    "--ship-keys",
    "keys",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Write the ship keys file here (ship_keys_file of gateway.toml and sites.toml).",
)
@click.option(
    "--require-signatures/--no-require-signatures",
    default=True,
    help="Whether the ship keys file refuses ships without a key (default: refuse).",
)
def fleet_export(
    directory: Path, credentials: Path | None, keys: Path | None, require_signatures: bool
) -> None:
    """Write the registry as the files today's gateways and Spark applications read,
    for a site run without the registry's replication (docs/fleet-registry.md)."""
    from shorelink.files import write_atomic
    from shorelink.fleet.views import gateway_credentials, ship_keys

    def export() -> int:
        if credentials is None and keys is None:
            raise ShorelinkError("give --gateway-credentials PATH, --ship-keys PATH or both")
        reg = _open(directory)
        if credentials is not None:
            write_atomic(credentials, gateway_credentials(reg.state), mode=0o600)
        if keys is not None:
            write_atomic(keys, ship_keys(reg.state, require_signatures), mode=0o644)
        return reg.state.version

    version = _run(export)
    written = " and ".join(str(p) for p in (credentials, keys) if p is not None)
    click.echo(f"registry version {version} written to {written}; copy them to every site")


@fleet.command("verify")
@_REGISTRY
@click.option(
    "--fleet-pub",
    type=click.Path(path_type=Path, dir_okay=False),
    help="The fleet's root public key to check against (default: DIR/fleet.pub).",
)
def fleet_verify(directory: Path, fleet_pub: Path | None) -> None:
    """Check every entry's signature and link in the chain from the first; say the
    version (exit 2 naming the first entry that fails)."""
    from shorelink.fleet.log import Registry, read_anchor

    def verify() -> Registry:
        anchor = read_anchor(fleet_pub) if fleet_pub is not None else None
        return Registry.open(directory, anchor, every=True)

    reg = _run(verify)
    click.echo(
        f"registry {directory}: version {reg.state.version}, {len(reg.state.ships)} ships, "
        f"fleet key {reg.state.fleet_key_id}: every signature and link holds"
    )


@fleet.command("rotate-fleet-key")
@_REGISTRY
def fleet_rotate_fleet_key(directory: Path) -> None:
    """Replace the fleet key: the new one's entry is signed by the old one, so every
    reader follows it from the root key it pins."""
    new = _run(lambda: _open(directory).rotate_fleet_key())
    click.echo(
        f"fleet key {new.id} signs from now on (fleet.key); fleet.pub, the root, is unchanged"
    )
