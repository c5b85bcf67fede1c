"""One entry of the fleet registry: its kinds, its bytes, its signature, its bounds.

The registry (docs/fleet-registry.md) is an append-only log of entries written at
headquarters. Each entry names its ``version`` (1, 2, ...) and the hash of the entry
before it (``prev``), and is signed by the fleet key in force (Ed25519, like a ship's
key). So a forged entry fails its signature, a replayed or reordered one its version
or its ``prev``, a missing one leaves a gap, and a log cut or edited anywhere fails at
the first entry that no longer follows: a reader checks the whole chain from the
first entry, whose key (the fleet's root key, ``fleet.pub``) it was given on its own.

An entry is one line of canonical JSON (keys sorted, no spaces, ASCII): what is signed
is that line without its ``sig``, behind a versioned prefix; its hash is SHA-256 of the
whole line. A line that is not in canonical form is refused, so one entry has one
encoding and one hash.

Every size the registry holds is bounded here, once (:data:`MAX_ENTRY_BYTES`,
:data:`MAX_SHIPS`, :data:`MAX_GROUPS`, :data:`MAX_GROUPS_PER_SHIP`,
:data:`MAX_KEYS_PER_SHIP`, :data:`MAX_CONFIG_BYTES`, :data:`MAX_STREAM_BOUNDS`,
:data:`MAX_ENTRIES`); :func:`decode_entry` checks an entry's form and its values'
bounds, :class:`shorelink.fleet.state.FleetState` its place in the chain and its sense.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from shorelink import strict_json
from shorelink.boundary import boundary
from shorelink.contract import MAX_INT64
from shorelink.errors import ContractError, ShorelinkError
from shorelink.identity import check_name
from shorelink.proof import MAX_PREVIOUS_KEYS, load_private_key, save_private_key

__all__ = [
    "FLEET_ORIGIN",
    "KINDS",
    "MAX_CONFIG_BYTES",
    "MAX_CONFIG_LINES_ASIDE_BYTES",
    "MAX_ENTRIES",
    "MAX_ENTRY_BYTES",
    "MAX_GROUPS",
    "MAX_GROUPS_PER_SHIP",
    "MAX_KEYS_PER_SHIP",
    "MAX_REASON_CHARS",
    "MAX_SHIPS",
    "MAX_STAGES",
    "MAX_STREAM_BOUNDS",
    "REGISTRY_STREAM",
    "TOKEN_ID_HEX",
    "TOKEN_PREFIX",
    "Entry",
    "FleetKey",
    "RegistryError",
    "SeqBound",
    "canonical",
    "decode_entry",
    "hash_token",
    "key_id",
    "new_token",
    "sign_entry",
    "stage_size",
    "token_id",
    "verify_key",
]

#: one entry's line at most (a configuration document and its escapes, with room)
MAX_CONFIG_BYTES = 64 * 1024
MAX_ENTRY_BYTES = 8 * MAX_CONFIG_BYTES
#: the configuration entries' lines a reader keeps beside those in force (superseded
#: ones a ship may still hold, as a delta's base; the ends of configurations), at most:
#: the oldest go first (:attr:`shorelink.fleet.state.FleetState.config_lines`)
MAX_CONFIG_LINES_ASIDE_BYTES = 16 * MAX_ENTRY_BYTES
#: ships a registry holds (revoked ones included: a name is never given twice)
MAX_SHIPS = 10_000
#: groups a registry names, and groups one ship belongs to
MAX_GROUPS = 1_000
MAX_GROUPS_PER_SHIP = 16
#: keys a ship has had: its current one and the previous keys the ship keys file holds
MAX_KEYS_PER_SHIP = MAX_PREVIOUS_KEYS + 1
#: streams one per-stream seq bound names (``--from-seq nav=10 --from-seq alerts=3``)
MAX_STREAM_BOUNDS = 64
#: entries a registry holds (versions run 1 to this)
MAX_ENTRIES = 10_000_000
#: a rollout's stages (its canary, the steps after it, the whole group last), the
#: longest time its ships must report healthy, and a stop's reason in characters
MAX_STAGES = 10
MAX_HEALTHY_S = 30 * 24 * 3600
MAX_REASON_CHARS = 300

#: the registry as records (shorelink/fleet/travel.py): their origin, never a ship's
#: name, and their stream, never a gateway's; seq = the entry's version
FLEET_ORIGIN = "fleet"
REGISTRY_STREAM = "registry"

#: how a ship's bearer token begins (the gateway's ``ships add`` makes the same)
TOKEN_PREFIX = "slk_"
_MESSAGE = b"shorelink fleet entry v1\x00"
_SECRET_PREFIX = b"fleet-ed25519-secret:"
_GENESIS_PREV = "0" * 64
_HEX64 = re.compile(r"[0-9a-f]{64}")
_KEY_ID = re.compile(r"[0-9a-f]{16}")
_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")
_TOKEN_HASH = re.compile(r"sha256:[0-9a-f]{64}")
#: a rollout's stage: a share of the group (``5%``) or a count of its ships (``3``)
_STAGE = re.compile(r"([1-9][0-9]{0,4})(%?)")
_FIELDS = frozenset({"body", "kind", "prev", "signer", "time", "version", "sig"})

#: a seq bound: one seq for every stream, or one per named stream (a stream not named:
#: 1), as the ship keys file's ``valid_below`` reads it
SeqBound = int | Mapping[str, int]


class RegistryError(ShorelinkError):
    """A registry entry or log that cannot be taken: malformed, forged, out of its
    chain, or against the registry's state. ``version``: the entry's place (None when
    the log as a whole is unreadable). Never retryable: the same bytes fail again."""

    def __init__(
        self, message: str, *, version: int | None = None, reason: str = "invalid"
    ) -> None:
        self.version = version
        #: what a reader counts it as: ``forged`` (its signature), ``forked`` (its
        #: ``prev``), ``invalid`` (anything else against the state)
        self.reason = reason
        super().__init__(message if version is None else f"entry {version}: {message}")


def canonical(obj: object) -> bytes:
    """The one encoding of an entry: JSON, keys sorted, no spaces, ASCII."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def hash_token(token: str) -> str:
    """A bearer token as the registry and the gateway's credentials file keep it."""
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


#: hex digits of a token's id: the head of its hash, named in a ship's report
TOKEN_ID_HEX = 16


def token_id(token_hash: str) -> str:
    """A token's id (the first :data:`TOKEN_ID_HEX` hex digits of its SHA-256): what a
    ship's report names to say which token it uploads with. It shows nothing of the
    token (256 random bits) and is no credential: only the report's signature, by the
    ship's key, makes it the ship's word."""
    return token_hash.removeprefix("sha256:")[:TOKEN_ID_HEX]


def new_token() -> str:
    """A fresh bearer token (256 random bits), shown once."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def _raw_public(text: str) -> bytes:
    raw = base64.b64decode(text, validate=True)
    if len(raw) != 32:
        raise ValueError(f"{len(raw)} bytes, not 32")
    return raw


def key_id(public: str) -> str:
    """A public key's id: 16 hex digits of SHA-256 of its 32 bytes."""
    return hashlib.sha256(_raw_public(public)).hexdigest()[:16]


def verify_key(public: str) -> Ed25519PublicKey:
    """The Ed25519 public key of its base64 text (ValueError if it is none)."""
    return Ed25519PublicKey.from_public_bytes(_raw_public(public))


def _public_text(key: Ed25519PublicKey) -> str:
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode()


class FleetKey:
    """The fleet's private key (at headquarters only): signs every registry entry."""

    def __init__(self, key: Ed25519PrivateKey) -> None:
        self._key = key
        self.public = _public_text(key.public_key())
        self.id = key_id(self.public)

    @classmethod
    def generate(cls) -> FleetKey:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    @boundary
    def load(cls, path: Path, field: str = "fleet_key") -> FleetKey:
        """The key in ``path`` as :meth:`save` writes it, refused (``ConfigError``) if
        others may read it or it holds anything else (a ship's key, a public key)."""
        return cls(
            load_private_key(path, field, _SECRET_PREFIX, "fleet key", "shorelink fleet init")
        )

    def save(self, path: Path) -> None:
        """Write the key to ``path``, mode 0600 from its creation."""
        save_private_key(self._key, path, _SECRET_PREFIX)

    def sign(self, message: bytes) -> bytes:
        return self._key.sign(message)


@dataclass(frozen=True, slots=True)
class Entry:
    """One registry entry, its form checked (:func:`decode_entry`); ``raw`` its line
    (without the newline)."""

    version: int
    prev: str
    kind: str
    body: dict[str, Any]
    signer: str
    time: str
    sig: bytes
    raw: bytes

    @property
    def digest(self) -> str:
        """The hash the next entry names as its ``prev``."""
        return hashlib.sha256(self.raw).hexdigest()

    def message(self) -> bytes:
        """What the fleet key signed: the entry without ``sig``, canonical."""
        unsigned = {
            "body": self.body,
            "kind": self.kind,
            "prev": self.prev,
            "signer": self.signer,
            "time": self.time,
            "version": self.version,
        }
        return _MESSAGE + canonical(unsigned)

    def verify(self, key: Ed25519PublicKey) -> bool:
        try:
            key.verify(self.sig, self.message())
        except InvalidSignature:
            return False
        return True


def sign_entry(
    key: FleetKey,
    version: int,
    prev: str | None,
    kind: str,
    body: Mapping[str, Any],
    at: float | None = None,
) -> Entry:
    """A new entry signed by ``key`` (``prev``: the last entry's digest, None for the
    first), read back through :func:`decode_entry`: what is written reads back."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
    unsigned = {
        "body": dict(body),
        "kind": kind,
        "prev": prev or _GENESIS_PREV,
        "signer": key.id,
        "time": stamp,
        "version": version,
    }
    sig = key.sign(_MESSAGE + canonical(unsigned))
    return decode_entry(canonical({**unsigned, "sig": base64.b64encode(sig).decode()}))


# -- form: each kind's body -------------------------------------------------------------


def _exactly(where: str, body: object, keys: set[str]) -> dict[str, Any]:
    if not isinstance(body, dict) or set(body) != keys:
        raise ValueError(f"{where} must hold exactly {sorted(keys)}")
    return body


def _name(kind: str, value: object) -> str:
    try:
        return check_name(kind, value)  # type: ignore[arg-type]
    except ContractError as exc:
        raise ValueError(str(exc)) from None


def _flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false")
    return value


def _seq(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_INT64:
        raise ValueError(f"{name} must be a seq, 1 to 2**63-1")
    return value


def _seq_bound(name: str, value: object) -> SeqBound:
    if not isinstance(value, dict):
        return _seq(name, value)
    if not 1 <= len(value) <= MAX_STREAM_BOUNDS:
        raise ValueError(f"{name} must name 1 to {MAX_STREAM_BOUNDS} streams")
    return {_name("stream", s): _seq(f"{name}.{s}", n) for s, n in value.items()}


def _public(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a public key's base64")
    try:
        verify_key(value)
    except ValueError as exc:
        raise ValueError(f"{name} is no Ed25519 public key: {exc}") from None
    return value


def _ship(body: dict[str, Any]) -> None:
    _name("ship", body["ship"])


def _fleet_key(body: dict[str, Any]) -> None:
    _public("fleet_key", body["fleet_key"])


def _ship_added(body: dict[str, Any]) -> None:
    _ship(body)
    groups = body["groups"]
    if not isinstance(groups, list) or not 1 <= len(groups) <= MAX_GROUPS_PER_SHIP:
        raise ValueError(f"groups must be a list of 1 to {MAX_GROUPS_PER_SHIP} names")
    for g in groups:
        _name("group", g)
    if len(set(groups)) != len(groups):
        raise ValueError("groups names a group twice")


def _token_hash(body: dict[str, Any]) -> None:
    _ship(body)
    if not isinstance(body["token_hash"], str) or not _TOKEN_HASH.fullmatch(body["token_hash"]):
        raise ValueError("token_hash must be sha256: and 64 hex digits")


def _token_issued(body: dict[str, Any]) -> None:
    _token_hash(body)
    _flag("retire_previous", body["retire_previous"])


def _ship_key_added(body: dict[str, Any]) -> None:
    _ship(body)
    _public("public", body["public"])
    _seq_bound("from_seq", body["from_seq"])


def _key_revoked(body: dict[str, Any]) -> None:
    _ship(body)
    if not isinstance(body["key_id"], str) or not _KEY_ID.fullmatch(body["key_id"]):
        raise ValueError("key_id must be 16 hex digits")
    _seq_bound("at_seq", body["at_seq"])


def _client_cert_set(body: dict[str, Any]) -> None:
    _ship(body)
    _flag("required", body["required"])


def _config_set(body: dict[str, Any]) -> None:
    if body["scope"] not in ("group", "ship"):
        raise ValueError('scope must be "group" or "ship"')
    _name(body["scope"], body["name"])
    _config_body(body)


def _config_body(body: dict[str, Any]) -> None:
    if body["format"] not in ("toml", "json"):
        raise ValueError('format must be "toml" or "json"')
    doc = body["document"]
    if not isinstance(doc, str) or len(doc.encode("utf-8", "surrogatepass")) > MAX_CONFIG_BYTES:
        raise ValueError(f"document must be text of at most {MAX_CONFIG_BYTES} bytes")
    _flag("port_links_only", body["port_links_only"])


def _config_removed(body: dict[str, Any]) -> None:
    if body["scope"] not in ("group", "ship"):
        raise ValueError('scope must be "group" or "ship"')
    _name(body["scope"], body["name"])


def stage_size(stage: str, members: int) -> int:
    """How many of a group's ``members`` a stage (``5%``, ``3``) reaches: a share
    rounded up (at least one ship), a count at most the group."""
    m = _STAGE.fullmatch(stage)
    if m is None:
        raise ValueError(f"a stage is a share (5%) or a count (3), not {stage!r:.20}")
    n = int(m.group(1))
    if m.group(2):
        return min(members, max(1, -(-n * members // 100))) if n <= 100 else members
    return min(n, members)


def _stages(value: object) -> None:
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_STAGES:
        raise ValueError(f"stages must be a list of 1 to {MAX_STAGES} stages")
    for stage in value:
        if not isinstance(stage, str) or not _STAGE.fullmatch(stage):
            raise ValueError("each stage is a share (5%) or a count (3)")
        if stage.endswith("%") and int(stage[:-1]) > 100:
            raise ValueError("a stage's share is at most 100%")
    if value[-1] != "100%":
        raise ValueError("the last stage is the whole group (100%)")


def _percent(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 100:
        raise ValueError(f"{name} must be a whole percent, 0 to 100")
    return value


def _rollout_started(body: dict[str, Any]) -> None:
    _name("group", body["group"])
    _config_body(body)
    _stages(body["stages"])
    h = body["healthy_s"]
    if not isinstance(h, int) or isinstance(h, bool) or not 0 <= h <= MAX_HEALTHY_S:
        raise ValueError(f"healthy_s must be 0 to {MAX_HEALTHY_S} seconds")
    _percent("stop_failure_percent", body["stop_failure_percent"])


def _rollout_id(body: dict[str, Any]) -> None:
    r = body["rollout"]
    if not isinstance(r, int) or isinstance(r, bool) or not 1 <= r <= MAX_ENTRIES:
        raise ValueError("rollout must be the version of its rollout_started entry")
    if body["by"] not in ("operator", "health"):
        raise ValueError('by must be "operator" or "health"')


def _rollout_advanced(body: dict[str, Any]) -> None:
    _rollout_id(body)
    s = body["stage"]
    if not isinstance(s, int) or isinstance(s, bool) or not 1 <= s < MAX_STAGES:
        raise ValueError(f"stage must be 1 to {MAX_STAGES - 1}")


def _rollout_stopped(body: dict[str, Any]) -> None:
    _rollout_id(body)
    reason = body["reason"]
    if not isinstance(reason, str) or not 1 <= len(reason) <= MAX_REASON_CHARS:
        raise ValueError(f"reason must be text of 1 to {MAX_REASON_CHARS} characters")


#: every kind of entry: its body's keys, and the check of their form
KINDS: dict[str, tuple[frozenset[str], Any]] = {
    "fleet_created": (frozenset({"fleet_key"}), _fleet_key),
    "fleet_key_rotated": (frozenset({"fleet_key"}), _fleet_key),
    "ship_added": (frozenset({"ship", "groups"}), _ship_added),
    # a ship's groups from now on (the configurations of those it left no longer apply)
    "ship_groups_set": (frozenset({"ship", "groups"}), _ship_added),
    "token_issued": (frozenset({"ship", "token_hash", "retire_previous"}), _token_issued),
    "token_retired": (frozenset({"ship", "token_hash"}), _token_hash),
    "ship_key_added": (frozenset({"ship", "public", "from_seq"}), _ship_key_added),
    "key_revoked": (frozenset({"ship", "key_id", "at_seq"}), _key_revoked),
    "ship_revoked": (frozenset({"ship"}), _ship),
    # the ship must present a client certificate naming it (mutual TLS) besides its token
    "client_cert_set": (frozenset({"ship", "required"}), _client_cert_set),
    "config_set": (
        frozenset({"scope", "name", "format", "document", "port_links_only"}),
        _config_set,
    ),
    "config_removed": (frozenset({"scope", "name"}), _config_removed),
    # a rollout (shorelink/fleet/rollout.py): a group's configuration in stages
    "rollout_started": (
        frozenset(
            {
                "group",
                "format",
                "document",
                "port_links_only",
                "stages",
                "healthy_s",
                "stop_failure_percent",
            }
        ),
        _rollout_started,
    ),
    "rollout_advanced": (frozenset({"rollout", "stage", "by"}), _rollout_advanced),
    "rollout_stopped": (frozenset({"rollout", "reason", "by"}), _rollout_stopped),
    "rollout_done": (frozenset({"rollout", "by"}), _rollout_id),
}


@boundary
def decode_entry(line: bytes) -> Entry:
    """The entry of one log line (without its newline): its form and every value's
    bound checked, its signature and chain not (:meth:`FleetState.apply` does that).
    Raises :class:`RegistryError`, nothing else, whatever ``line`` holds."""
    if len(line) > MAX_ENTRY_BYTES:
        raise RegistryError(f"an entry of {len(line)} bytes, more than {MAX_ENTRY_BYTES}")
    try:
        obj = strict_json.loads(line)
        if not isinstance(obj, dict) or set(obj) != _FIELDS:
            raise ValueError(f"an entry must hold exactly {sorted(_FIELDS)}")
        version = obj["version"]
        if not isinstance(version, int) or isinstance(version, bool):
            raise ValueError("version must be an integer")
        if not 1 <= version <= MAX_ENTRIES:
            raise ValueError(f"version must be 1 to {MAX_ENTRIES}")
        for name, pattern in (("prev", _HEX64), ("signer", _KEY_ID), ("time", _TIME)):
            if not isinstance(obj[name], str) or not pattern.fullmatch(obj[name]):
                raise ValueError(f"{name} is malformed")
        kind = obj["kind"]
        if not isinstance(kind, str) or kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r:.40}")
        keys, check = KINDS[kind]
        body = _exactly(f"a {kind} body", obj["body"], set(keys))
        check(body)
        if not isinstance(obj["sig"], str):
            raise ValueError("sig must be base64")
        sig = base64.b64decode(obj["sig"], validate=True)
        if len(sig) != 64:
            raise ValueError("sig must be 64 bytes")
        if canonical(obj) != line:
            raise ValueError("not in canonical form (keys sorted, no spaces, ASCII)")
    except (ValueError, TypeError) as exc:
        raise RegistryError(str(exc), version=_peek_version(line)) from None
    return Entry(version, obj["prev"], kind, body, obj["signer"], obj["time"], sig, line)


def _peek_version(line: bytes) -> int | None:
    m = re.search(rb'"version":(\d{1,8})[,}]', line[-64:])
    return int(m.group(1)) if m else None
