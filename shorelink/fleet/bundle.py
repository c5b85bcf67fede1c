"""What a ship carries on board from ``shorelink fleet provision``: its token, its
signing key and the fleet's root key, in a directory (0700) or a tar (0600).

- ``gateway.token`` (0600): the bearer token, the only copy (the registry keeps its
  hash): ``uplink.token_file`` of edge.toml;
- ``ship.key`` (0600): the ship's Ed25519 signing key: ``uplink.signing_key_file``;
- ``fleet.pub``: the fleet's root public key, which the agent will check registry
  entries against (a later part of issue 41);
- ``ship.json``: the ship's name, groups, key id and the registry version it was made at;
- ``edge.toml.part``: the lines of edge.toml that name them, at the paths
  deploy/edge/install.sh makes.

The names match deploy/edge/edge.toml's samples (``/etc/shorelink/gateway.token``,
``/etc/shorelink/ship.key``).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from shorelink.files import write_atomic
from shorelink.fleet.entry import RegistryError, hash_token, key_id, new_token
from shorelink.fleet.log import PUB, Registry
from shorelink.proof import ShipKey

__all__ = ["BUNDLE_FILES", "provision", "write_tar"]

ETC = "/etc/shorelink"
BUNDLE_FILES = ("gateway.token", "ship.key", "fleet.pub", "ship.json", "edge.toml.part")


def provision(
    reg: Registry,
    ship: str,
    groups: Sequence[str],
    out: Path | None = None,
    tar_path: Path | None = None,
    *,
    require_client_cert: bool = False,
) -> Path:
    """Add ``ship`` to the registry in one append (its identity and groups, a new
    token's hash, a new signing key from seq 1, and with ``require_client_cert`` that
    its token alone is not enough: mutual TLS) and write its bundle to ``out``
    (default: ``DIR/bundles/SHIP``), and as a tar to ``tar_path`` if given.

    The token and the key are written first, into a hidden directory beside ``out``
    (0700); the append follows, then the directory takes its name. A refused append
    leaves no bundle; a bundle that cannot be written leaves no entry."""
    bundle = out or reg.directory / "bundles" / ship
    if bundle.exists():
        raise RegistryError(f"{bundle} exists: a bundle is never overwritten")
    bundle.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{bundle.name}.", suffix=".tmp", dir=bundle.parent))
    try:
        token, key = new_token(), ShipKey.generate()
        write_atomic(tmp / "gateway.token", token + "\n", mode=0o600)
        key.save(tmp / "ship.key")
        changes: list[tuple[str, dict[str, Any]]] = [
            ("ship_added", {"ship": ship, "groups": list(groups)}),
            (
                "token_issued",
                {"ship": ship, "token_hash": hash_token(token), "retire_previous": False},
            ),
            ("ship_key_added", {"ship": ship, "public": key.public(), "from_seq": 1}),
        ]
        if require_client_cert:
            changes.append(("client_cert_set", {"ship": ship, "required": True}))
        reg.append(changes)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    pub = (reg.directory / PUB).read_text().strip()
    _write_facts(tmp, ship, groups, key_id(key.public()), pub, reg.state.version)
    os.rename(tmp, bundle)
    if tar_path is not None:
        write_tar(bundle, tar_path)
    return bundle


def _write_facts(
    out: Path, ship: str, groups: Sequence[str], key_id: str, fleet_pub: str, version: int
) -> None:
    """The bundle's public files: the fleet's root key, the ship's facts, edge.toml's
    lines."""
    write_atomic(out / "fleet.pub", fleet_pub + "\n", mode=0o644)
    facts = {"ship": ship, "groups": list(groups), "key_id": key_id, "registry_version": version}
    write_atomic(out / "ship.json", json.dumps(facts, indent=2) + "\n", mode=0o644)
    part = (
        f"# from `shorelink fleet provision {ship}`: copy gateway.token and ship.key to\n"
        f"# {ETC}/ (0640 root:shorelink) and merge these lines into edge.toml\n"
        f'ship = "{ship}"\n\n[uplink]\n'
        f'token_file = "{ETC}/gateway.token"\n'
        f'signing_key_file = "{ETC}/ship.key"\n'
    )
    write_atomic(out / "edge.toml.part", part, mode=0o644)


def write_tar(bundle: Path, tar_path: Path) -> None:
    """The bundle directory as one tar (mode 0600: it holds the token and the key),
    files in :data:`BUNDLE_FILES` order with their modes, owner root, time 0."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in BUNDLE_FILES:
            path = bundle / name
            info = tarfile.TarInfo(f"{bundle.name}/{name}")
            data = path.read_bytes()
            info.size, info.mode = len(data), os.stat(path).st_mode & 0o777
            tar.addfile(info, io.BytesIO(data))
    write_atomic(tar_path, buf.getvalue(), mode=0o600)
