"""Ship signatures: what proves that a record is the ship's own (docs/replication.md,
"What a hostile neighbour can and cannot do").

A site takes other sites' records from its neighbours, and the first copy of an
identity wins. A neighbour is an entry site: a key of the entry site would prove only
what that neighbour claims. So the ship signs what it sends, with its own Ed25519 key,
and every site holds the public half in one file, the *ship keys* (:class:`ShipKeys`).

What the ship signs, cheaply on the satellite: the records of a batch are cut into
*chunks* of at most :data:`CHUNK_RECORDS` consecutive seqs; the ship signs each chunk's
``(origin, stream, first seq, count)`` and the Merkle root of its records' hashes
(:func:`record_hash`: seq, event time, key, MQTT topic, payload). That is 64 bytes per
128 records on the wire (docs/wire-format.md, ``FLAG_SIGNED``), half a byte a record.

What a record carries beyond the gateway: a ``sl.proof`` header
(:data:`shorelink.contract.H_PROOF`; :class:`Proof`): its chunk, the chunk's signature,
the record's Merkle path (at most 7 hashes of 16 bytes) and the id of the key that
signed it (:data:`KEY_ID_BYTES`: the first 8 bytes of SHA-256 of the public key, the
registry's key id). Any site checks a record alone with it (:meth:`ShipKeys.check`):
the path gives the root, the root and the chunk the signed message, the key it names
the verdict. Records of one chunk share a signature, so a site checks one signature per
chunk (cached) and a few hashes per record.

The key id is not signed (the ship's chunk message was fixed before it existed): it
says which key to try, and the site takes the record only if *that* key verifies it,
so what a site holds under a key id that key signed (``shorelink fleet audit-key``).
A proof written before key ids (no id: its length tells) is tried against each of the
ship's keys as before.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from shorelink.boundary import boundary
from shorelink.config import parse_toml
from shorelink.contract import MAX_INT64
from shorelink.errors import ConfigError, ContractError, ShorelinkError
from shorelink.files import FileWatch, read_private, write_atomic
from shorelink.identity import check_name
from shorelink.logs import get_logger

__all__ = [
    "CHUNK_RECORDS",
    "HASH_BYTES",
    "KEY_CAUSES",
    "KEY_ID_BYTES",
    "MAX_PREVIOUS_KEYS",
    "MAX_UNSIGNED_BELOW",
    "PROOF_HELD_BYTES",
    "SIGNATURE_BYTES",
    "PreviousKey",
    "Proof",
    "ShipKey",
    "ShipKeys",
    "SignatureError",
    "WatchedShipKeys",
    "chunk_message",
    "chunks",
    "key_cause",
    "key_id_of",
    "leaves_of",
    "load_private_key",
    "merkle_levels",
    "merkle_path",
    "merkle_root",
    "path_length",
    "proofs",
    "record_hash",
    "root_from_path",
    "save_private_key",
    "sign_records",
    "signature_mode",
]

log = get_logger(__name__)

#: records per signed chunk at most: a record's Merkle path is at most log2 of it
CHUNK_RECORDS = 128
SIGNATURE_BYTES = 64
HASH_BYTES = 16
#: a key's id in a proof: the first 8 bytes of SHA-256 of its 32 bytes (the registry's
#: 16 hex digits, shorelink/fleet/entry.py ``key_id``); not a multiple of
#: :data:`HASH_BYTES`, so a proof's length says whether it names its key
KEY_ID_BYTES = 8
#: what one record's proof holds in memory at most: its bytes (the chunk, the signature,
#: a path of at most 7 hashes, the key id) and the bytes object around them (the gateway
#: charges it to a batch's share of its memory budget)
PROOF_HELD_BYTES = 10 + SIGNATURE_BYTES + 7 * HASH_BYTES + KEY_ID_BYTES + 48
_LEAF = b"sl.record"
_NODE = b"sl.node"
_MESSAGE = b"shorelink chunk v1\x00"
_PROOF = struct.Struct("<QH")  # the chunk's first seq and count, then signature and path
if CHUNK_RECORDS > 2**7:
    raise ImportError("PROOF_HELD_BYTES counts a path of at most 7 hashes")
_LEN = struct.Struct("<I")
#: how a ship's private key file begins (a public key, bare base64, is refused)
_SECRET_PREFIX = b"ed25519-secret:"
_SEQ_TS = struct.Struct("<Qq")


def record_hash(
    seq: int, ts_ms: int, key: str | bytes, topic: str | bytes, payload: bytes
) -> bytes:
    """A record's leaf: BLAKE2b-128 over its seq, event time, key, MQTT topic and
    payload, each length-prefixed (origin and stream are in the chunk's message)."""
    k = key.encode() if isinstance(key, str) else key
    t = topic.encode() if isinstance(topic, str) else topic
    h = hashlib.blake2b(digest_size=HASH_BYTES, person=_LEAF)
    h.update(_SEQ_TS.pack(seq, ts_ms))
    for part in (k, t, payload):
        h.update(_LEN.pack(len(part)))
        h.update(part)
    return h.digest()


def _node(left: bytes, right: bytes) -> bytes:
    return hashlib.blake2b(left + right, digest_size=HASH_BYTES, person=_NODE).digest()


def merkle_levels(leaves: Sequence[bytes]) -> list[list[bytes]]:
    """Every level of the tree over ``leaves``, the leaves first, the root last. A node
    without a sibling moves up unchanged."""
    if not leaves:
        raise ValueError("a Merkle tree needs at least one leaf")
    levels = [list(leaves)]
    while len(levels[-1]) > 1:
        below = levels[-1]
        up = [_node(below[i], below[i + 1]) for i in range(0, len(below) - 1, 2)]
        if len(below) % 2:
            up.append(below[-1])
        levels.append(up)
    return levels


def merkle_root(leaves: Sequence[bytes]) -> bytes:
    return merkle_levels(leaves)[-1][0]


def merkle_path(levels: Sequence[Sequence[bytes]], index: int) -> list[bytes]:
    """The siblings from leaf ``index`` up to the root (none where a node moves up alone)."""
    path = []
    for level in levels[:-1]:
        sibling = index ^ 1
        if sibling < len(level):
            path.append(level[sibling])
        index //= 2
    return path


def path_length(count: int, index: int) -> int:
    """How many siblings leaf ``index`` of ``count`` has on its way up."""
    n = 0
    while count > 1:
        if index ^ 1 < count:
            n += 1
        index //= 2
        count = (count + 1) // 2
    return n


def root_from_path(leaf: bytes, count: int, index: int, path: Sequence[bytes]) -> bytes:
    """The root that ``leaf`` at ``index`` of ``count`` leaves and its ``path`` give;
    ValueError if the path has not the length that place needs."""
    if len(path) != path_length(count, index):
        raise ValueError(f"a path of {len(path)} hashes for leaf {index} of {count}")
    node = leaf
    it = iter(path)
    while count > 1:
        if index ^ 1 < count:
            sibling = next(it)
            node = _node(sibling, node) if index & 1 else _node(node, sibling)
        index //= 2
        count = (count + 1) // 2
    return node


def chunk_message(origin: str, stream: str, first_seq: int, count: int, root: bytes) -> bytes:
    """The bytes a ship signs for one chunk."""
    o, s = origin.encode(), stream.encode()
    return b"".join(
        (_MESSAGE, bytes([len(o)]), o, bytes([len(s)]), s, _PROOF.pack(first_seq, count), root)
    )


def chunks(first_seq: int, count: int) -> list[tuple[int, int]]:
    """A batch's chunks: ``(first seq, count)``, :data:`CHUNK_RECORDS` at most each,
    from the batch's first seq."""
    return [(first_seq + i, min(CHUNK_RECORDS, count - i)) for i in range(0, count, CHUNK_RECORDS)]


@dataclass(frozen=True, slots=True)
class Proof:
    """A record's ``sl.proof``: its chunk, the chunk's signature, its Merkle path, and
    the id of the key that signed the chunk (None: a proof written before key ids)."""

    first_seq: int
    count: int
    signature: bytes
    path: tuple[bytes, ...]
    key_id: bytes | None = None

    def encode(self) -> bytes:
        head = _PROOF.pack(self.first_seq, self.count)
        return b"".join((head, self.signature, *self.path, self.key_id or b""))

    @classmethod
    def decode(cls, raw: bytes, seq: int) -> Proof:
        """The proof of the record ``seq``; ValueError if ``raw`` is not one."""
        if len(raw) < _PROOF.size + SIGNATURE_BYTES:
            raise ValueError(f"proof of {len(raw)} bytes is too short")
        first, count = _PROOF.unpack_from(raw)
        if not 1 <= count <= CHUNK_RECORDS or not first <= seq < first + count:
            raise ValueError(f"proof for seqs {first}+{count} does not hold seq {seq}")
        n = path_length(count, seq - first)
        at = _PROOF.size + SIGNATURE_BYTES
        end = at + n * HASH_BYTES
        if len(raw) not in (end, end + KEY_ID_BYTES):
            raise ValueError(
                f"proof of {len(raw)} bytes; a path of {n} hashes needs {end} "
                f"(or {end + KEY_ID_BYTES} with its key id)"
            )
        path = tuple(raw[at + i * HASH_BYTES : at + (i + 1) * HASH_BYTES] for i in range(n))
        return cls(first, count, raw[_PROOF.size : at], path, raw[end:] or None)


def proofs(
    first_seq: int,
    leaves: Sequence[bytes],
    signatures: bytes,
    key_ids: Sequence[bytes | None] | None = None,
) -> list[Proof]:
    """Every record's proof, for a batch from ``first_seq`` whose records' hashes are
    ``leaves`` and whose chunks' signatures are ``signatures`` (concatenated, as the
    wire format carries them); ``key_ids``: the id of the key that signed each chunk
    (:func:`key_id_of`; None: proofs that name no key)."""
    out: list[Proof] = []
    for j, (first, count) in enumerate(chunks(first_seq, len(leaves))):
        at = first - first_seq
        sig = signatures[j * SIGNATURE_BYTES : (j + 1) * SIGNATURE_BYTES]
        kid = None if key_ids is None else key_ids[j]
        levels = merkle_levels(leaves[at : at + count])
        out += [Proof(first, count, sig, tuple(merkle_path(levels, i)), kid) for i in range(count)]
    return out


def _public_text(key: Ed25519PublicKey) -> str:
    """A public key as the ship keys file writes it (base64 of 32 bytes)."""
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode()


def key_id_of(key: Ed25519PublicKey) -> bytes:
    """A public key's id as a proof carries it (:data:`KEY_ID_BYTES`); its hex is the
    registry's key id."""
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).digest()[:KEY_ID_BYTES]


def load_private_key(
    path: Path, field: str, prefix: bytes, what: str, made_by: str
) -> Ed25519PrivateKey:
    """The Ed25519 private key in ``path``, written as ``prefix`` and the base64 of its
    32-byte seed (:func:`save_private_key`); a :class:`ConfigError` naming ``field`` if
    others may read the file or it holds anything else (a public key, another kind of
    key, whose prefix differs)."""
    raw = read_private(path, field).strip()
    if not raw.startswith(prefix):
        raise ConfigError(
            field,
            f"{path} holds no {what} (made by `{made_by}`; it starts with "
            f"{prefix.decode()!r}: a public key is not one)",
        )
    try:
        seed = base64.b64decode(raw.removeprefix(prefix), validate=True)
        return Ed25519PrivateKey.from_private_bytes(seed)
    except ValueError:
        raise ConfigError(field, f"{path} holds no Ed25519 key (base64 of 32 bytes)") from None


def save_private_key(key: Ed25519PrivateKey, path: Path, prefix: bytes) -> None:
    """Write ``key`` to ``path`` as :func:`load_private_key` reads it, mode 0600 from
    its creation."""
    seed = key.private_bytes(
        serialization.Encoding.Raw,
        serialization.PrivateFormat.Raw,
        serialization.NoEncryption(),
    )
    write_atomic(path, prefix + base64.b64encode(seed) + b"\n", mode=0o600)


class ShipKey:
    """A ship's private key (on board only): signs the chunks of what it sends."""

    def __init__(self, key: Ed25519PrivateKey) -> None:
        self._key = key
        self._public = _public_text(key.public_key())
        #: its id as a proof names it (:func:`key_id_of`)
        self.id = key_id_of(key.public_key())

    @classmethod
    def generate(cls) -> ShipKey:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    @boundary
    def load(cls, path: Path, field: str = "signing_key_file") -> ShipKey:
        """The key in ``path`` (``ed25519-secret:`` and the base64 of its 32-byte
        seed, as :meth:`save` writes it), refused if others may read it or if it holds
        anything else (a public key copied from the ship keys file, say)."""
        key = load_private_key(
            path, field, _SECRET_PREFIX, "ship's private key", "shorelink ship-key new"
        )
        return cls(key)

    def save(self, path: Path) -> None:
        """Write the key to ``path``, mode 0600 from its creation (never a chmod by
        name afterwards, which would follow a link planted there)."""
        save_private_key(self._key, path, _SECRET_PREFIX)

    def public(self) -> str:
        """The public half as the ship keys file writes it (base64 of 32 bytes)."""
        return self._public

    def proofs(
        self, origin: str, stream: str, first_seq: int, leaves: Sequence[bytes]
    ) -> list[bytes]:
        """Each record's ``sl.proof`` for a batch this key signs (records' hashes
        ``leaves`` from ``first_seq``): what a gateway writes for it. For benchmarks and
        tests that stand in for a ship and its gateway at once."""
        sigs = sign_records(self, origin, stream, first_seq, leaves)
        ids = [self.id] * len(chunks(first_seq, len(leaves)))
        return [p.encode() for p in proofs(first_seq, leaves, sigs, ids)]

    def sign(self, message: bytes) -> bytes:
        return self._key.sign(message)


def sign_records(
    key: ShipKey, origin: str, stream: str, first_seq: int, leaves: Sequence[bytes]
) -> bytes:
    """The chunks' signatures of a batch, concatenated (what the wire format carries)."""
    return b"".join(
        key.sign(chunk_message(origin, stream, first, count, merkle_root(leaves[at : at + count])))
        for first, count in chunks(first_seq, len(leaves))
        for at in [first - first_seq]
    )


#: The largest ``unsigned_below`` the ship keys file takes: 2**40 (about 10**12, a ship
#: sending 1,000 records a second for 35 years). A bound near 2**63 would take every
#: record of that stream without a proof for good: signatures off without a word
#: (review N10).
MAX_UNSIGNED_BELOW = 2**40


def _check_not_writable_by_others(path: Path, st: os.stat_result, field_name: str) -> None:
    mode = st.st_mode
    if mode & stat.S_IWOTH:
        raise ConfigError(
            field_name,
            f"{path} is world-writable (mode {stat.S_IMODE(mode):o}): anyone could add a "
            "key for any ship; chmod o-w it",
        )
    if mode & stat.S_IWGRP and st.st_gid != os.getegid():
        raise ConfigError(
            field_name,
            f"{path} is writable by group {st.st_gid}, not this process's own "
            f"({os.getegid()}; mode {stat.S_IMODE(mode):o}): chmod g-w it or chgrp it",
        )


def _ship_entry(field_name: str, entry: object) -> tuple[str, dict[str, int], list[object]]:
    """A ship's entry in the keys file: its key, or ``{ key = "...", unsigned_below =
    { stream = seq, ... }, previous = [ { key = "...", valid_below = ... }, ... ] }``."""
    if isinstance(entry, str):
        return entry, {}, []
    if not isinstance(entry, dict) or set(entry) - {"key", "unsigned_below", "previous"}:
        raise ConfigError(
            field_name,
            'must be "<public key>" or { key = "...", unsigned_below = {...}, previous = [...] }',
        )
    bounds = entry.get("unsigned_below", {})
    if not isinstance(bounds, dict) or not all(
        isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= MAX_UNSIGNED_BELOW
        for n in bounds.values()
    ):
        raise ConfigError(
            f"{field_name}.unsigned_below",
            f"must be {{ stream = seq, ... }}, seqs 1 to {MAX_UNSIGNED_BELOW} (a ship's "
            "next seq when it got its key)",
        )
    for stream in bounds:
        try:
            check_name("stream", stream)
        except ContractError as exc:
            raise ConfigError(f"{field_name}.unsigned_below", str(exc)) from None
    previous = entry.get("previous", [])
    if not isinstance(previous, list) or len(previous) > MAX_PREVIOUS_KEYS:
        raise ConfigError(
            f"{field_name}.previous",
            f"must be a list of at most {MAX_PREVIOUS_KEYS} {{ key = ..., valid_below = ... }}",
        )
    return str(entry.get("key", "")), dict(bounds), previous


def _seq_bound(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_INT64


def _public_key(where: str, text: object) -> Ed25519PublicKey:
    try:
        if not isinstance(text, str):
            raise ValueError("not a string")
        return Ed25519PublicKey.from_public_bytes(base64.b64decode(text, validate=True))
    except ValueError as exc:
        raise ConfigError(where, f"not an Ed25519 public key: {exc}") from None


#: previous keys a ship's entry holds at most (each one more signature check for a
#: chunk no key signed, once: :meth:`ShipKeys.check` remembers it)
MAX_PREVIOUS_KEYS = 16


@dataclass(frozen=True, slots=True)
class PreviousKey:
    """A key a ship had before its current one (``ship-key new --replace``): what it
    signed stays provable where a site lacks it (a relay, history, a site rebuilt).

    ``valid_below``: None, the key proves records at every seq (it was replaced, not
    revoked: a lost key, or a routine rotation); an int, only seqs below it, of every
    stream; a mapping, per stream, only seqs below the stream's bound, and nothing of a
    stream it does not name (``--revoke``: a stolen key signs no record above the seq
    the ship had reached). The current key proves every seq: only the ship holds it."""

    public: str
    key: Ed25519PublicKey = field(compare=False, repr=False)
    valid_below: int | Mapping[str, int] | None = None

    def valid_at(self, stream: str, seq: int) -> bool:
        bound = self.bound(stream)
        return bound is None or seq < bound

    def bound(self, stream: str) -> int | None:
        """The first seq of ``stream`` this key no longer proves (None: none)."""
        if self.valid_below is None or isinstance(self.valid_below, int):
            return self.valid_below
        return self.valid_below.get(stream, 1)

    def entry(self) -> dict[str, object]:
        """As the keys file writes it."""
        out: dict[str, object] = {"key": self.public}
        if self.valid_below is not None:
            vb = self.valid_below
            out["valid_below"] = vb if isinstance(vb, int) else dict(vb)
        return out

    @classmethod
    def parse(cls, where: str, item: object) -> PreviousKey:
        if not isinstance(item, dict) or set(item) - {"key", "valid_below"} or "key" not in item:
            raise ConfigError(where, '{ key = "<public key>", valid_below = ... } expected')
        key = _public_key(where, item["key"])
        vb = item.get("valid_below")
        if vb is None or _seq_bound(vb):
            return cls(str(item["key"]), key, vb)
        if not isinstance(vb, dict) or not all(_seq_bound(n) for n in vb.values()):
            raise ConfigError(
                f"{where}.valid_below",
                f"must be a seq (every stream) or {{ stream = seq, ... }}, seqs 1 to {MAX_INT64}",
            )
        for stream in vb:
            try:
                check_name("stream", stream)
            except ContractError as exc:
                raise ConfigError(f"{where}.valid_below", str(exc)) from None
        return cls(str(item["key"]), key, dict(vb))


class SignatureError(ShorelinkError):
    """A batch its ship's key does not prove; ``reason``: ``unsigned`` (the ship has a
    key and the batch no signatures), ``unknown_ship`` (no key, and keys are required)
    or ``bad_signature``."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(f"{reason}: {message}")


#: what a refusal of :meth:`ShipKeys.check` begins with when the ship keys file is its
#: cause, so a change of the file can turn it into a proof (a merge dead-letters it and
#: re-drives it when the file changes): the ship has no key and keys are required; a
#: record without a proof of a ship that signs; a proof no key of the ship verifies; a
#: proof of a previous key past its ``valid_below``
UNKNOWN_SHIP = "unknown_ship"
UNSIGNED = "unsigned"
BAD_SIGNATURE = "bad_signature"
REVOKED = "revoked"
KEY_CAUSES = frozenset({UNKNOWN_SHIP, UNSIGNED, BAD_SIGNATURE, REVOKED})
UNPROVED = f"{BAD_SIGNATURE}: proof does not verify: not the ship's record"


#: how the refusals began before they named their cause (dead letters written by an
#: older merge are re-driven too)
_LEGACY_CAUSES = (
    ("has no key and signatures are required", UNKNOWN_SHIP),
    ("signs its records; this one has no proof", UNSIGNED),
    ("proof does not verify: not the ship's record", BAD_SIGNATURE),
)


def key_cause(reason: str) -> str | None:
    """The ship keys file cause of a refusal of :meth:`ShipKeys.check` (one of
    :data:`KEY_CAUSES`), or None when no change of the file can prove the record."""
    cause = reason.partition(":")[0]
    if cause in KEY_CAUSES:
        return cause
    for text, legacy in _LEGACY_CAUSES:
        if reason == text or (reason.startswith("ship ") and reason.endswith(text)):
            return legacy
    return None


#: chunks whose root a :class:`ShipKeys` remembers once their signature held (about 250
#: bytes each)
_ROOTS_MAX = 65_536
#: (chunk, root) pairs a :class:`ShipKeys` remembers once their signature failed: a
#: forged proof offered again (by one neighbour or several) costs a lookup, not an
#: Ed25519 check (about 80 µs for a signature that looks canonical; review N5)
_FAILED_MAX = 65_536


@dataclass
class ShipKeys:
    """The ship keys file (TOML; sample ``deploy/spark/ship_keys.toml``): every ship's
    public key, and whether a ship without one is refused.

    A ship with a key: its records must carry a valid proof, at the gateway (its
    batches signed) and at every merge. A ship without: refused if
    ``require_signatures``, else taken without a proof (a fleet moving to signatures)."""

    ships: dict[str, Ed25519PublicKey] = field(default_factory=dict)
    require_signatures: bool = False
    #: per ship and stream, the seqs below which a record without a proof is still taken:
    #: what the ship sent before it had its key (a fleet moving over, a site rebuilt
    #: taking that history back); a record with a proof is always checked
    unsigned_below: dict[str, dict[str, int]] = field(default_factory=dict)
    #: per ship, the keys it had before its current one, newest first (:class:`PreviousKey`)
    previous: dict[str, tuple[PreviousKey, ...]] = field(default_factory=dict)
    #: the root of each chunk whose signature held, by (origin, stream, chunk and
    #: signature), and which of the ship's keys signed it (0: the current one, i: the
    #: ``previous[i-1]``): a record of it is checked by its path and that key's
    #: validity at its seq alone (oldest forgotten first)
    _roots: dict[tuple[str, str, bytes], tuple[bytes, int]] = field(
        default_factory=dict, repr=False
    )
    #: (chunk, root) pairs whose signature failed (oldest forgotten first)
    _failed: dict[tuple[str, str, bytes, bytes], None] = field(default_factory=dict, repr=False)
    #: Ed25519 verifications made by :meth:`check` (what checking pulled records costs)
    signature_checks: int = 0

    @classmethod
    @boundary
    def load(cls, path: Path, field_name: str = "ship_keys_file") -> ShipKeys:
        """The file at ``path``; refused if others may write it (world-writable, or
        group-writable by a group other than this process's own): whoever may write it
        may add a key of theirs for any ship (review N10). Others may read it: it holds
        public keys only."""
        try:
            with open(path, "rb") as f:
                _check_not_writable_by_others(path, os.fstat(f.fileno()), field_name)
                data = parse_toml(f.read().decode())
        except OSError as exc:
            raise ConfigError(field_name, f"cannot read {path}: {exc.strerror or exc}") from None
        except ValueError as exc:  # not UTF-8 or not TOML (nested too deep, too)
            raise ConfigError(field_name, f"{path} is not TOML: {exc}") from None
        return cls.parse(data, f"{field_name} {path}")

    @classmethod
    def parse(cls, data: Mapping[str, object], where: str = "ship keys") -> ShipKeys:
        unknown = set(data) - {"require_signatures", "ships"}
        if unknown:
            raise ConfigError(where, f"unknown keys {sorted(unknown)}")
        require = data.get("require_signatures", False)
        if not isinstance(require, bool):
            raise ConfigError(f"{where}: require_signatures", "must be true or false")
        ships = data.get("ships", {})
        if not isinstance(ships, dict):
            raise ConfigError(f"{where}: ships", 'must be a table: ship = "<public key>"')
        keys = {}
        below: dict[str, dict[str, int]] = {}
        before: dict[str, tuple[PreviousKey, ...]] = {}
        for ship, entry in ships.items():
            where_ship = f"{where}: ships.{ship}"
            text, bounds, previous = _ship_entry(where_ship, entry)
            try:
                check_name("origin", ship)
            except ContractError as exc:
                raise ConfigError(where_ship, f"not an Ed25519 public key: {exc}") from None
            keys[ship] = _public_key(where_ship, text)
            if bounds:
                below[ship] = bounds
            if previous:
                before[ship] = tuple(
                    PreviousKey.parse(f"{where_ship}.previous[{i}]", item)
                    for i, item in enumerate(previous)
                )
        return cls(keys, require, below, before)

    @staticmethod
    def render(
        ships: Mapping[str, str],
        require_signatures: bool,
        unsigned_below: Mapping[str, Mapping[str, int]] | None = None,
        previous: Mapping[str, Sequence[PreviousKey]] | None = None,
    ) -> str:
        def table(bounds: Mapping[str, int]) -> str:
            return "{ " + ", ".join(f"{st} = {n}" for st, n in sorted(bounds.items())) + " }"

        def old(p: PreviousKey) -> str:
            vb = p.valid_below
            if vb is None:
                return f'{{ key = "{p.public}" }}'
            bound = str(vb) if isinstance(vb, int) else table(vb)
            return f'{{ key = "{p.public}", valid_below = {bound} }}'

        def entry(ship: str, key: str) -> str:
            bounds = (unsigned_below or {}).get(ship)
            before = (previous or {}).get(ship)
            if not bounds and not before:
                return f'{ship} = "{key}"'
            parts = [f'key = "{key}"']
            if bounds:
                parts.append(f"unsigned_below = {table(bounds)}")
            if before:
                parts.append("previous = [" + ", ".join(old(p) for p in before) + "]")
            return f"{ship} = {{ {', '.join(parts)} }}"

        lines = [
            "# shorelink ship keys: every ship's public Ed25519 key (base64). Every site's",
            "# gateway and Spark application read the same file (docs/replication.md).",
            "# Managed with: shorelink ship-key new SHIP --key-file ... --ship-keys this-file",
            "# previous = [...]: keys a ship had before (--replace), each proving the records it",
            "# signed below valid_below (none: every seq); the current key proves every seq.",
            f"require_signatures = {'true' if require_signatures else 'false'}",
            "",
            "[ships]",
            *(entry(s, k) for s, k in sorted(ships.items())),
        ]
        return "\n".join(lines) + "\n"

    def fingerprint(self) -> str:
        """What the file says, as a short hash (the same keys, the same fingerprint,
        whatever the file's layout): a merge records the one its dead letters were last
        tried again under (spark_core/redrive.py)."""
        doc = {"require_signatures": self.require_signatures, "ships": self.entries()}
        text = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
        return hashlib.blake2b(text, digest_size=12).hexdigest()

    def public_keys(self, ships: Iterable[str] | None = None) -> dict[str, str]:
        """The public keys (base64) of ``ships`` that have one (default: all)."""
        names = self.ships if ships is None else [s for s in ships if s in self.ships]
        return {s: _public_text(self.ships[s]) for s in names}

    def signed(self, origin: str) -> bool:
        """Must records of ``origin`` carry a proof?"""
        return origin in self.ships

    def refuses(self, origin: str) -> bool:
        """Is ``origin`` refused whatever it carries (no key, and keys are required)?"""
        return self.require_signatures and origin not in self.ships

    def verify_chunk(
        self, origin: str, stream: str, first_seq: int, count: int, root: bytes, sig: bytes
    ) -> bool:
        """Did a key of ``origin`` valid for every seq of this chunk sign it? (The
        gateway's check of a batch.)"""
        return self._chunk_signer(origin, stream, first_seq, count, root, sig) is not None

    def _chunk_signer(
        self, origin: str, stream: str, first_seq: int, count: int, root: bytes, sig: bytes
    ) -> int | None:
        """:meth:`verify_chunk`, and which key signed it (None: no valid one)."""
        signer = self.signer(origin, stream, first_seq, count, root, sig)
        if signer is None or not self._valid(origin, stream, first_seq + count - 1, signer):
            return None
        return signer

    def keys_of(self, origin: str) -> list[Ed25519PublicKey]:
        """``origin``'s keys as :meth:`signer` numbers them: its current one, then its
        previous ones, newest first."""
        key = self.ships.get(origin)
        if key is None:
            return []
        return [key, *(p.key for p in self.previous.get(origin, ()))]

    def key_id(self, origin: str, signer: int) -> bytes:
        """The id (:func:`key_id_of`) of ``origin``'s key ``signer`` (:meth:`signer`)."""
        return key_id_of(self.keys_of(origin)[signer])

    def signer(
        self,
        origin: str,
        stream: str,
        first_seq: int,
        count: int,
        root: bytes,
        sig: bytes,
        named: bytes | None = None,
    ) -> int | None:
        """Which of ``origin``'s keys signed this chunk: 0 its current key, i its
        ``previous[i-1]``, None none (one Ed25519 check per key tried: :meth:`check`
        remembers the answer per chunk). ``named``: the key id the proof names; only
        that key is tried (None if the ship has no key of that id)."""
        keys = self.keys_of(origin)
        if not keys or len(sig) != SIGNATURE_BYTES:
            return None
        message = chunk_message(origin, stream, first_seq, count, root)
        for i, k in enumerate(keys):
            if named is not None and key_id_of(k) != named:
                continue
            self.signature_checks += 1
            try:
                k.verify(sig, message)
            except InvalidSignature:
                continue
            return i
        return None

    def _valid(self, origin: str, stream: str, seq: int, signer: int) -> bool:
        """Does key ``signer`` of ``origin`` (:meth:`signer`) prove records at ``seq``?"""
        return signer == 0 or self.previous[origin][signer - 1].valid_at(stream, seq)

    def entries(self, ships: Iterable[str] | None = None) -> dict[str, object]:
        """The entries of ``ships`` that have a key (default: all) as the keys file
        holds them (what :meth:`parse` reads back: a worker process's copy)."""
        names = self.ships if ships is None else [s for s in ships if s in self.ships]
        out: dict[str, object] = {}
        for s in names:
            entry: dict[str, object] = {"key": _public_text(self.ships[s])}
            if s in self.unsigned_below:
                entry["unsigned_below"] = dict(self.unsigned_below[s])
            if s in self.previous:
                entry["previous"] = [p.entry() for p in self.previous[s]]
            out[s] = entry
        return out

    def verify_batch(
        self, origin: str, stream: str, first_seq: int, leaves: Sequence[bytes], sigs: bytes
    ) -> str | None:
        """None if ``sigs`` (the wire batch's) sign every chunk of the batch, else why not."""
        why = self._batch_signers(origin, stream, first_seq, leaves, sigs)
        return why if isinstance(why, str) else None

    def _batch_signers(
        self, origin: str, stream: str, first_seq: int, leaves: Sequence[bytes], sigs: bytes
    ) -> str | list[bytes]:
        """The id of the key that signed each chunk of the batch, or why one fails."""
        parts = chunks(first_seq, len(leaves))
        if len(sigs) != len(parts) * SIGNATURE_BYTES:
            return f"{len(sigs)} signature bytes for {len(parts)} chunks"
        ids = []
        for j, (first, count) in enumerate(parts):
            at = first - first_seq
            root = merkle_root(leaves[at : at + count])
            sig = sigs[j * SIGNATURE_BYTES : (j + 1) * SIGNATURE_BYTES]
            signer = self._chunk_signer(origin, stream, first, count, root, sig)
            if signer is None:
                return f"seqs {first}-{first + count - 1}: signature does not verify"
            ids.append(self.key_id(origin, signer))
        return ids

    @boundary
    def prove_batch(
        self,
        origin: str,
        stream: str,
        first_seq: int,
        columns: Sequence[Sequence[object]],
        sigs: bytes,
    ) -> list[bytes] | None:
        """What a gateway does with a decoded batch: each record's ``sl.proof`` (None
        for a ship without a key, where keys are not required); raise
        :class:`SignatureError` if the ship's key does not prove every record."""
        if origin not in self.ships:
            if self.require_signatures:
                raise SignatureError(
                    "unknown_ship", f"ship {origin} has no key and signatures are required"
                )
            return None
        if not sigs:
            raise SignatureError("unsigned", f"ship {origin} signs its batches; this one is not")
        keys, times, topics, payloads = columns
        leaves = leaves_of(first_seq, keys, times, topics, payloads)  # type: ignore[arg-type]
        ids = self._batch_signers(origin, stream, first_seq, leaves, sigs)
        if isinstance(ids, str):
            raise SignatureError("bad_signature", ids)
        return [p.encode() for p in proofs(first_seq, leaves, sigs, ids)]

    @boundary
    def check(
        self,
        origin: str,
        stream: str,
        seq: int,
        ts_ms: int,
        key: str | bytes,
        topic: str | bytes,
        payload: bytes,
        proof: bytes | None,
    ) -> str | None:
        """None if the record may be taken (its proof holds, or its ship signs nothing
        and keys are not required), else why not. Never raises, whatever a neighbour
        put in the record: a record that cannot be checked is not proved (a raise would
        stop the puller at that record for good)."""
        if not isinstance(seq, int) or not 1 <= seq <= MAX_INT64:
            # no identity has it; below 1 it would pass for a seq sent before the ship
            # had its key (unsigned_below)
            return f"bad record: seq {seq!r:.30} is not 1 to 2**63-1"
        try:
            return self._check(origin, stream, seq, ts_ms, key, topic, payload, proof)
        except (ValueError, TypeError, OverflowError, struct.error, UnicodeError) as exc:
            return f"bad record: {exc}"

    def _check(
        self,
        origin: str,
        stream: str,
        seq: int,
        ts_ms: int,
        key: str | bytes,
        topic: str | bytes,
        payload: bytes,
        proof: bytes | None,
    ) -> str | None:
        if origin not in self.ships:
            return (
                f"{UNKNOWN_SHIP}: ship {origin} has no key and signatures are required"
                if self.refuses(origin)
                else None
            )
        if proof is None:
            if seq < self.unsigned_below.get(origin, {}).get(stream, 0):
                return None  # sent before the ship had its key (unsigned_below)
            return f"{UNSIGNED}: ship {origin} signs its records; this one has no proof"
        if not (1 <= seq <= MAX_INT64 and 0 <= ts_ms <= MAX_INT64):
            return f"seq {seq} or ts {ts_ms} is beyond the contract's 0..2**63-1"
        try:
            p = Proof.decode(proof, seq)
        except ValueError as exc:
            return f"bad proof: {exc}"
        leaf = record_hash(seq, ts_ms, key, topic, payload)
        root = root_from_path(leaf, p.count, seq - p.first_seq, p.path)
        # the chunk's other records: its root is known once its signature was checked
        chunk = (origin, stream, proof[: _PROOF.size + SIGNATURE_BYTES] + (p.key_id or b""))
        known = self._roots.get(chunk)
        if known is not None:
            if known[0] != root:
                return UNPROVED
            return self._revoked(origin, stream, seq, known[1])
        failed = (*chunk, root)
        if failed in self._failed:
            return self._unproved(origin, p.key_id)
        signer = self.signer(origin, stream, p.first_seq, p.count, root, p.signature, p.key_id)
        if signer is None:
            self._failed[failed] = None
            if len(self._failed) > _FAILED_MAX:
                self._failed.pop(next(iter(self._failed)))
            return self._unproved(origin, p.key_id)
        self._roots[chunk] = (root, signer)
        if len(self._roots) > _ROOTS_MAX:
            self._roots.pop(next(iter(self._roots)))
        return self._revoked(origin, stream, seq, signer)

    def _unproved(self, origin: str, named: bytes | None) -> str:
        """Why a proof no key verifies is refused: it names a key the ship has not
        (here, yet: a key that reaches this site later proves it then), or no key of
        the ship verifies it."""
        if named is not None and all(key_id_of(k) != named for k in self.keys_of(origin)):
            return f"{BAD_SIGNATURE}: proof names key {named.hex()}, not a key of {origin} here"
        return UNPROVED

    def _revoked(self, origin: str, stream: str, seq: int, signer: int) -> str | None:
        if self._valid(origin, stream, seq, signer):
            return None
        bound = self.previous[origin][signer - 1].bound(stream)
        kid = self.key_id(origin, signer).hex()
        return f"{REVOKED}: signed by key {kid}, a previous key of {origin} valid below seq {bound} only"


def signature_mode(
    keys: ShipKeys | None, path: Path | None = None, *, checks: str = "batches"
) -> tuple[str, list[str]]:
    """How a gateway (``checks="batches"``) or a merge (``"pulled records"``) enforces
    ships' signatures with ``keys`` read from ``path`` (None: no ``ship_keys_file``): one
    phrase for a summary or start line (``required ships=3 unsigned_below=1``, or
    ``off``), and what an operator should be warned of (review N10)."""
    if keys is None:
        return "off", [
            f"ship_keys_file is not set: ships' signatures are not checked; {checks} of any "
            "ship are taken without a proof, so whoever holds a ship's token (or, at a "
            "merge, a hostile neighbour) can write records in its name"
        ]
    warnings = []
    if not keys.require_signatures:
        warnings.append(
            f"require_signatures = false in {path}: a ship without a key is taken unsigned "
            "(and `shorelink ship-key remove` makes a ship unsigned without a word); set it "
            "true once every ship signs"
        )
    below = sum(len(b) for b in keys.unsigned_below.values())
    mode = "required" if keys.require_signatures else "per_ship"
    phrase = f"{mode} ships={len(keys.ships)} unsigned_below={below}"
    if keys.previous:
        phrase += f" previous_keys={sum(len(p) for p in keys.previous.values())}"
    return phrase, warnings


def leaves_of(
    first_seq: int,
    keys: Iterable[str | bytes],
    times: Iterable[int],
    topics: Iterable[str | bytes],
    payloads: Iterable[bytes],
) -> list[bytes]:
    """The records' hashes of a batch given as columns (seqs from ``first_seq``)."""
    return [
        record_hash(first_seq + i, ts, k, t, p)
        for i, (k, ts, t, p) in enumerate(zip(keys, times, topics, payloads, strict=True))
    ]


class WatchedShipKeys:
    """The ship keys file as a long-running reader holds it: re-read when it changes
    (looked at once a second), so a ship's key added by ``shorelink ship-key new`` is
    taken without a restart. A file that no longer parses keeps the keys read before,
    logged at every look until it is mended."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._watch = FileWatch(path)
        stamp = self._watch.stamp()
        self._keys = ShipKeys.load(path)
        self._watch.read_at(stamp)
        #: reads of a changed file that failed (it did not parse, or others may write
        #: it); while ``stale``, the keys read before are in force: a revoked or
        #: replaced key among them still counts (metric ``ship_keys_stale``)
        self.failures = 0
        self.stale = False

    def current(self) -> ShipKeys:
        if self._watch.due():
            stamp = self._watch.stamp()
            try:
                keys = ShipKeys.load(self.path)
            except ConfigError as exc:
                self.failures += 1
                self.stale = True
                log.error(
                    "ship_keys_unreadable",
                    path=self.path,
                    keys_in_force="previous",
                    failures=self.failures,
                    error=str(exc),
                )
            else:
                self._keys = keys
                self.stale = False
                self._watch.read_at(stamp)
                log.info("ship_keys_reloaded", path=self.path, ships=len(keys.ships))
        return self._keys
