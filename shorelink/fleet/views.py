"""The registry as the files today's readers take: the gateway's credentials file and
the ship keys file, written from the state byte for byte as their own writers write
them (``core_gateway/auth.py`` ``Credentials._save``, :meth:`ShipKeys.render`), so a
gateway and a Spark application run unchanged on what ``shorelink fleet export`` makes.

What those files cannot say, and so what a site reading them enforces less strictly
than the registry (a later part of issue 41 has the sites read the registry itself):

- one token hash per ship: during a token rotation the file carries the *newest*
  token, so a ship still sending the old one is refused there from the export on
  (export once the ship has the new token, or accept the cut);
- no lower bound on a key: the newest key proves every seq, and a previous key every
  seq below its bound (only the ship holds its newest key, so what it signs below its
  ``from_seq`` is its own);
- a revoked ship keeps its keys (what it signed stays provable); its token is refused.
"""

from __future__ import annotations

import json

from shorelink.config import parse_toml
from shorelink.fleet.entry import FLEET_ORIGIN, verify_key
from shorelink.fleet.state import FleetState
from shorelink.proof import PreviousKey, ShipKeys

__all__ = ["gateway_credentials", "ship_keys", "site_ship_keys"]


def gateway_credentials(state: FleetState) -> str:
    """The gateway's credentials file (``credentials_file``; JSON, written 0600): each
    ship with a token, its newest valid token's hash; a revoked ship, revoked."""
    ships = {}
    for name in sorted(state.ships):
        rec = state.ships[name]
        newest = rec.last_token
        if newest is None:
            continue
        ships[name] = {
            "token_hash": newest.hash,
            "created": newest.issued,
            "revoked": rec.revoked,
            "require_client_cert": rec.require_client_cert,
        }
    return json.dumps({"ships": ships}, indent=2)


def ship_keys(state: FleetState, require_signatures: bool = True) -> str:
    """The ship keys file (TOML): each ship with a key, its newest key as the current
    one and the others, newest first, as its previous keys, each valid below the next
    key's ``from_seq`` (and its revocation)."""
    current: dict[str, str] = {}
    previous: dict[str, tuple[PreviousKey, ...]] = {}
    for name, rec in state.ships.items():
        if not rec.keys:
            continue
        current[name] = rec.keys[-1].public
        before = []
        for i in range(len(rec.keys) - 2, -1, -1):
            bound = rec.valid_below(i)
            if isinstance(bound, dict) and not bound:
                bound = 1  # no stream named: it proves nothing
            key = rec.keys[i]
            before.append(PreviousKey(key.public, verify_key(key.public), bound))
        if before:
            previous[name] = tuple(before)
    return ShipKeys.render(current, require_signatures, {}, previous)


def site_ship_keys(state: FleetState) -> ShipKeys:
    """The ship keys a site following the registry enforces (no file between): every
    ship's as :func:`ship_keys` writes them, and the origin ``fleet``'s, the registry's
    records (shorelink/fleet/travel.py): its fleet key in force, and each earlier one
    valid below the entry after its rotation (it signed the entries up to that one);
    before the first entry, the pinned root ``state.anchor``."""
    keys = ShipKeys.parse(parse_toml(ship_keys(state)))
    named = state.fleet_keys or ([(state.anchor, 0)] if state.anchor else [])
    if named:
        keys.ships[FLEET_ORIGIN] = verify_key(named[-1][0])
        before = [
            PreviousKey(pub, verify_key(pub), named[i + 1][1] + 1)
            for i, (pub, _) in reversed(list(enumerate(named[:-1])))
        ]
        if before:
            keys.previous[FLEET_ORIGIN] = tuple(before)
    return keys
