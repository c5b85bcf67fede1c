"""Ship credentials: one bearer token per ship, stored only as a SHA-256 hash.

Tokens are 256-bit random strings, so a plain SHA-256 (no salt, no slow KDF) is enough
to make a leaked credentials file useless, and cheap to check on every request. The
file (``credentials_file`` in the gateway config) is JSON, written atomically (temp
file, fsync, rename) with mode 0600.

A ship's entry may also say ``"require_client_cert": true``: then the token alone is not
enough, the request must come over a TLS connection on which the ship presented a
client certificate that names it (mutual TLS; checked in app.py, the CA is the
gateway's ``listen.client_ca_file``).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from core_gateway.errors import GatewayError
from shorelink import strict_json
from shorelink.boundary import boundary
from shorelink.files import FileWatch, locked, write_json_atomic
from shorelink.fleet.state import FleetState
from shorelink.identity import check_name
from shorelink.logs import get_logger

__all__ = ["Credentials", "ShipCredential", "hash_token"]

TOKEN_PREFIX = "slk_"


log = get_logger(__name__)


def hash_token(token: str) -> str:
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class ShipCredential:
    ship: str
    token_hash: str
    created: str
    revoked: bool = False
    #: the ship must present a client certificate whose common name is its name
    require_client_cert: bool = False


class Credentials:
    """The ships allowed to upload, loaded from (and saved to) one JSON file."""

    def __init__(self, path: Path | None) -> None:
        #: None: no file, the credentials given by :meth:`take_registry` (a gateway
        #: following the fleet registry)
        self.path = path
        self._by_ship: dict[str, ShipCredential] = {}
        self._by_hash: dict[str, ShipCredential] = {}
        self._watch = None if path is None else FileWatch(path)
        if path is not None:
            self.reload()

    def take_registry(self, state: FleetState) -> None:
        """The credentials the fleet registry's ``state`` says, swapped in whole: every
        valid token of a ship (both while a rotation is pending), none of a revoked one,
        and whether it must present a client certificate (``client_cert_set``)."""
        by_ship, by_hash = {}, {}
        for name, rec in state.ships.items():
            if rec.last_token is None:
                continue
            by_ship[name] = ShipCredential(
                name,
                rec.last_token.hash,
                rec.last_token.issued,
                rec.revoked,
                require_client_cert=rec.require_client_cert,
            )
            for t in rec.tokens:
                by_hash[t.hash] = ShipCredential(name, t.hash, t.issued)
        self._by_ship, self._by_hash = by_ship, by_hash

    def maybe_reload(self) -> None:
        """Pick up `ships add/revoke` made by another process (checked once a second).
        A file that does not parse (a hand edit's typo) keeps the credentials the
        gateway has: logged at every check until it is mended, never a 500, and never
        forgotten (a changed file is told by its inode, size and mtime, and remembered
        only once it has been read)."""
        if self._watch is None or not self._watch.due():
            return
        try:
            self.reload()
        except GatewayError as exc:
            log.error(
                "credentials_unreadable",
                path=self.path,
                ships_kept=len(self._by_ship),
                error=str(exc),
            )

    @boundary
    def reload(self) -> None:
        """Read the file (raises :class:`GatewayError` if it does not parse)."""
        if self.path is None or self._watch is None:
            return
        stamp = self._watch.stamp()
        if not self.path.exists():
            self._by_ship, self._by_hash = {}, {}
            self._watch.read_at(stamp)
            return
        try:
            data = strict_json.loads(self.path.read_bytes())
            ships = {
                name: ShipCredential(
                    name,
                    c["token_hash"],
                    c.get("created", ""),
                    bool(c.get("revoked", False)),
                    _flag(c, "require_client_cert"),
                )
                for name, c in data.get("ships", {}).items()
            }
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise GatewayError(f"credentials file {self.path} is unreadable: {exc}") from exc
        self._by_ship = ships
        self._by_hash = {c.token_hash: c for c in ships.values() if not c.revoked}
        self._watch.read_at(stamp)

    def ship_for_token(self, token: str) -> str | None:
        """The ship this token belongs to, or None (unknown or revoked)."""
        wanted = hash_token(token)
        cred = self._by_hash.get(wanted)
        # compare_digest keeps the comparison itself constant-time
        if cred is not None and hmac.compare_digest(cred.token_hash, wanted):
            return cred.ship
        return None

    def list(self) -> list[ShipCredential]:
        return sorted(self._by_ship.values(), key=lambda c: c.ship)

    def requires_client_cert(self, ship: str) -> bool:
        """Must ``ship`` present a client certificate naming it (besides its token)?"""
        cred = self._by_ship.get(ship)
        return cred is not None and cred.require_client_cert

    def add(self, ship: str, *, require_client_cert: bool | None = None) -> str:
        """Create (or replace) ``ship``'s credential; returns the token, shown once.
        ``require_client_cert`` None: as the credential it replaces said (a new token
        does not drop a ship's mutual TLS), False for a new ship."""
        check_name("ship", ship)
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)

        def change(ships: dict[str, ShipCredential]) -> bool:
            mtls = require_client_cert
            if mtls is None:
                old = ships.get(ship)
                mtls = old is not None and old.require_client_cert
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            ships[ship] = ShipCredential(ship, hash_token(token), now, require_client_cert=mtls)
            return True

        self._modify(change)
        return token

    def require_client_cert(self, ship: str, required: bool) -> bool:
        """Set whether ``ship`` must present a client certificate; False if it has no
        credential. Its token is unchanged."""
        return self._modify(
            lambda ships: _set(ships, ship, lambda c: replace(c, require_client_cert=required))
        )

    def revoke(self, ship: str) -> bool:
        return self._modify(lambda ships: _set(ships, ship, lambda c: replace(c, revoked=True)))

    def _modify(self, change: Callable[[dict[str, ShipCredential]], bool]) -> bool:
        """Read the file, apply ``change`` to its ships, write it back if it says so:
        under an exclusive lock on ``<file>.lock``, so two ``ships`` commands at once
        neither undo each other (a revocation stays revoked) nor lose a ship. Not
        the gateway's reads: they see the old file or the new one, never half."""
        if self.path is None:
            raise GatewayError("the fleet registry gives this gateway's credentials")
        with locked(self.path):
            self.reload()  # what the last writer left, not what this object read before
            changed = change(self._by_ship)
            if changed:
                self._save()
            return changed

    def _save(self) -> None:
        data = {
            "ships": {
                c.ship: {
                    "token_hash": c.token_hash,
                    "created": c.created,
                    "revoked": c.revoked,
                    "require_client_cert": c.require_client_cert,
                }
                for c in self.list()
            }
        }
        assert self.path is not None
        write_json_atomic(self.path, data, indent=2, mode=0o600)
        self.reload()


def _set(
    ships: dict[str, ShipCredential],
    ship: str,
    change: Callable[[ShipCredential], ShipCredential],
) -> bool:
    """Change ``ship``'s credential; False if it has none."""
    cred = ships.get(ship)
    if cred is None:
        return False
    ships[ship] = change(cred)
    return True


def _flag(entry: dict[str, object], name: str) -> bool:
    """A true/false of a ship's entry (absent: false); anything else is refused, so
    ``"false"`` in a hand-edited file does not read as true."""
    v = entry.get(name, False)
    if not isinstance(v, bool):
        raise ValueError(f"{name} must be true or false, got {v!r}")
    return v
