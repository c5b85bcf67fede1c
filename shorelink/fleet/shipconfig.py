"""A ship's fleet configuration on its way from a gateway to the ship (docs/
fleet-registry.md, "Configuration to the ships"): what the gateway offers, what the ship
asks for, the delta that crosses the link, and the checks the ship makes.

A ship's configuration is the entries that apply to it (its groups' in its groups'
order, then its own, rollouts honoured: :meth:`FleetState.config_for`; a group's is a
``config_set`` or, while a rollout's stage reaches the ship, a ``rollout_started``
entry), each a *scope*
(``g:<group>``, ``s:<ship>``). The entries travel as they are, their fleet signature
with them, so a gateway serves bytes it cannot forge and the ship trusts nothing but
its pinned ``fleet.pub``.

- The **offer** rides on the upload's first message (``"config"`` beside the holdings):
  per scope, the version of its entry and whether it is for port links only. An offer
  is a few dozen bytes; a gateway from before sends none, and a ship from before
  ignores it.
- The **request** (a text message on the upload) names the scopes the ship wants and
  the version it holds of each: ``{"type": "config", "have": {"g:north": 5, "s:bigblue":
  null}}``.
- The **answer** (one binary message, in order with the batches' answers) is the new
  entry lines, one a line, compressed with zlib against the lines the ship holds of the
  same scopes as its preset dictionary (:func:`encode_delta`): an entry whose document
  changed by one key costs the bytes of that key, its new signature and its header,
  not the document again. The first byte says whether the dictionary was used (a
  gateway that lacks a base the ship names sends the lines compressed on their own).
- A request that says ``since`` (the version of the newest fleet key rotation the
  ship follows; 0: the root only) gets an answer of signed entries that say what they
  are (:func:`answer_lines`): the new configuration entries, the entry that *ended* a
  configuration the ship holds (a ``config_removed`` of its scope, the
  ``rollout_stopped`` of the rollout it runs, the ship's ``ship_groups_set`` without
  the group) where its scope went away or back to an older entry, and every ``fleet_key_rotated`` entry after ``since``. So the ship
  follows the fleet key from the root it pins (:class:`FleetKeys`), goes back from a
  configuration only when the fleet signed why, and refuses an older entry replayed at
  it. A request without ``since`` (an agent from before) gets the configuration
  entries alone, one per scope, as before.

Every function here is pure; the gateway (core_gateway/upload.py) and the agent
(edge_agent/fleet_config.py) do the I/O.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shorelink import strict_json
from shorelink.boundary import boundary
from shorelink.config import parse_toml
from shorelink.errors import ConfigError
from shorelink.fleet.entry import (
    MAX_CONFIG_BYTES,
    MAX_ENTRY_BYTES,
    Entry,
    RegistryError,
    decode_entry,
    key_id,
    verify_key,
)
from shorelink.fleet.state import ConfigRecord, FleetState

__all__ = [
    "MAX_SCOPES",
    "ConfigOffer",
    "ConfigRequest",
    "FleetKeys",
    "answer_lines",
    "decode_delta",
    "encode_delta",
    "merge_documents",
    "offer_for",
    "parse_offer",
    "parse_request",
    "scope_of",
    "verify_config_entry",
    "verify_end",
]

#: a ship's scopes at most: its groups (MAX_GROUPS_PER_SHIP) and itself
MAX_SCOPES = 17
#: the answer decompressed at most (every scope's entry at its largest)
MAX_ANSWER_BYTES = MAX_SCOPES * MAX_ENTRY_BYTES

#: per scope: (the version of its entry, for port links only)
ConfigOffer = dict[str, tuple[int, bool]]


def scope_of(rec: ConfigRecord) -> str:
    return ("g:" if rec.scope == "group" else "s:") + rec.name


def offer_for(state: FleetState, ship: str) -> ConfigOffer | None:
    """What a gateway offers ``ship``: its scopes' versions (None: not a ship the
    registry knows, or no configuration for it)."""
    if ship not in state.ships:
        return None
    offer = {scope_of(c): (c.version, c.port_links_only) for c in state.configs_of(ship)}
    return offer or None


def offer_json(offer: ConfigOffer) -> dict[str, list[object]]:
    return {s: [v, port] for s, (v, port) in offer.items()}


@boundary
def parse_offer(value: object) -> ConfigOffer | None:
    """The offer in a gateway's first message (None: none); ValueError if malformed."""
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) > MAX_SCOPES:
        raise ValueError(f"config offer: expected at most {MAX_SCOPES} scopes")
    out: ConfigOffer = {}
    for scope, pair in value.items():
        if (
            not isinstance(scope, str)
            or scope[:2] not in ("g:", "s:")
            or not isinstance(pair, list)
            or len(pair) != 2
            or not isinstance(pair[0], int)
            or isinstance(pair[0], bool)
            or pair[0] < 1
            or not isinstance(pair[1], bool)
        ):
            raise ValueError(f"config offer: bad scope {scope!r:.40}")
        out[scope] = (pair[0], pair[1])
    return out


@dataclass(frozen=True)
class ConfigRequest:
    """A ship's request: per scope the version it holds (None: none), and the version
    of the newest fleet key rotation it follows (None: an agent from before, that
    takes configuration entries only)."""

    have: dict[str, int | None]
    since: int | None = None


def _version_or_none(what: str, v: object) -> int | None:
    if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
        raise ValueError(f"bad version for {what!r:.40}")
    return v


@boundary
def parse_request(data: bytes | str) -> ConfigRequest:
    """A ship's request; ValueError if it is not one."""
    doc = strict_json.loads(data)
    if not isinstance(doc, dict) or doc.get("type") != "config":
        raise ValueError("not a configuration request")
    have = doc.get("have")
    if not isinstance(have, dict) or not 0 < len(have) <= MAX_SCOPES:
        raise ValueError(f"a configuration request names 1 to {MAX_SCOPES} scopes")
    out: dict[str, int | None] = {}
    for scope, v in have.items():
        if _version_or_none(scope, v) == 0:
            raise ValueError(f"bad version for {scope!r:.40}")
        out[str(scope)] = v
    return ConfigRequest(out, _version_or_none("since", doc.get("since")))


def request_json(have: Mapping[str, int | None], since: int | None = None) -> str:
    doc: dict[str, object] = {"type": "config", "have": dict(have)}
    if since is not None:
        doc["since"] = since
    return json.dumps(doc, separators=(",", ":"))


def answer_lines(
    state: FleetState, offer: ConfigOffer, request: ConfigRequest, ship: str
) -> tuple[list[bytes], list[bytes] | None]:
    """What a gateway answers ``ship``'s ``request`` with (its ``offer`` from ``state``):
    the entry lines, and the bases of the delta (the lines the ship holds of the
    scopes asked for; None: one of them is no longer kept). ValueError if a scope asked
    for is not the ship's (nor one it held whose end the registry keeps)."""
    lines = state.config_lines
    new: list[bytes] = []
    bases: list[bytes] | None = []
    for scope, held in request.have.items():
        offered = offer.get(scope)
        if request.since is None or (offered is not None and (held is None or offered[0] >= held)):
            if offered is None:
                raise ValueError(f"no configuration of {scope} for this ship")
            new.append(lines[offered[0]])
        else:  # gone, or back to an older entry: what ended the one the ship holds
            end = state.config_end(scope, held, ship) if held is not None else None
            if end is None:
                raise ValueError(f"no end of {scope} at {held} kept here")
            if offered is not None:
                new.append(lines[offered[0]])
            new.append(end)
        if bases is not None:
            base = lines.get(held) if held is not None else b""
            bases = None if base is None else [*bases, base]
    if request.since is not None:
        new += [line for v, line in state.rotation_lines.items() if v > request.since]
    return new, bases


def _dictionary(bases: Sequence[bytes]) -> bytes:
    return b"\n".join(bases)


def encode_delta(new: Sequence[bytes], bases: Sequence[bytes] | None) -> bytes:
    """The answer: ``new`` (entry lines, the requested scopes' order) compressed
    against ``bases`` (the lines the ship holds of them, same order; None: a base is
    missing here, so no dictionary)."""
    body = b"\n".join(new)
    if bases and any(bases):
        c = zlib.compressobj(9, zlib.DEFLATED, 15, 9, zlib.Z_DEFAULT_STRATEGY, _dictionary(bases))
        return b"\x01" + c.compress(body) + c.flush()
    return b"\x00" + zlib.compress(body, 9)


@boundary
def decode_delta(answer: bytes, bases: Sequence[bytes]) -> list[bytes]:
    """The entry lines of an answer; ValueError if it is not one (never more than
    :data:`MAX_ANSWER_BYTES` decompressed)."""
    if not answer or answer[0] not in (0, 1):
        raise ValueError("not a configuration answer")
    try:
        d = zlib.decompressobj(15, _dictionary(bases)) if answer[0] else zlib.decompressobj(15)
        body = d.decompress(answer[1:], MAX_ANSWER_BYTES)
        if d.unconsumed_tail or not d.eof:
            raise ValueError("configuration answer cut short or too large")
    except zlib.error as exc:
        raise ValueError(f"configuration answer does not decompress: {exc}") from None
    return body.split(b"\n")


class FleetKeys:
    """The fleet keys a ship follows: the root it pins (``fleet.pub``), then each
    ``fleet_key_rotated`` entry it verified, in order. The key in force at a version is
    the one the last rotation before it named (the root before any); a rotation is
    taken only after the last one held, signed by the key in force at its version. So
    a gateway can neither forge a rotation nor move a ship back to a key the fleet
    retired; a ship that never saw a rotation, though, takes entries signed by the key
    before it until a gateway serves it (as a site that never saw the real log cannot
    tell a fork by a stolen root key: docs/fleet-registry.md)."""

    def __init__(self, root: str, rotations: Sequence[bytes] = ()) -> None:
        self.root = root
        self.rotations: list[Entry] = []
        self.follow([decode_entry(line) for line in rotations])

    @property
    def since(self) -> int:
        """The version of the newest rotation followed (0: the root only)."""
        return self.rotations[-1].version if self.rotations else 0

    def key_at(self, version: int) -> str:
        """The fleet key that signs the entry at ``version``."""
        key = self.root
        for r in self.rotations:
            if r.version >= version:
                break
            key = r.body["fleet_key"]
        return key

    def check(self, entry: Entry) -> Entry:
        """``entry``, signed by the key in force at its version; RegistryError if not."""
        key = self.key_at(entry.version)
        if entry.signer != key_id(key) or not entry.verify(verify_key(key)):
            raise RegistryError(
                "its signature is not the fleet key's in force at its version (forged, or "
                "a rotation this ship was not shown)",
                version=entry.version,
                reason="forged",
            )
        return entry

    def follow(self, rotations: Sequence[Entry]) -> list[Entry]:
        """Take the rotations after the last one held (in version order, each checked);
        the ones taken. RegistryError (nothing taken) if one is not genuine or not
        after the last held."""
        taken: list[Entry] = []
        try:
            for r in sorted(rotations, key=lambda e: e.version):
                if r.kind != "fleet_key_rotated":
                    raise RegistryError(f"a {r.kind} entry, not a rotation", version=r.version)
                if r.version <= self.since:
                    held = {e.version: e.raw for e in self.rotations}
                    if held.get(r.version) == r.raw:
                        continue  # one held already
                    raise RegistryError(
                        "a rotation before the newest this ship follows (replayed or forked)",
                        version=r.version,
                        reason="forged",
                    )
                self.check(r)
                self.rotations.append(r)
                taken.append(r)
        except RegistryError:
            del self.rotations[len(self.rotations) - len(taken) :]
            raise
        return taken


def _keys(keys: FleetKeys | str) -> FleetKeys:
    return keys if isinstance(keys, FleetKeys) else FleetKeys(keys)


def config_scope(entry: Entry) -> str | None:
    """The scope a configuration entry is for (None: not a configuration)."""
    if entry.kind == "config_set":
        return ("g:" if entry.body["scope"] == "group" else "s:") + entry.body["name"]
    if entry.kind == "rollout_started":  # a group's configuration in stages
        return "g:" + entry.body["group"]
    return None


def verify_config_entry(line: bytes | Entry, keys: FleetKeys | str, scope: str) -> Entry:
    """The ``config_set`` (or ``rollout_started``: a group's configuration in stages)
    entry of ``line`` for ``scope``, signed by the fleet key in force at its version
    (``keys``: the ship's, or its pinned root alone); :class:`RegistryError` why
    not."""
    entry = line if isinstance(line, Entry) else decode_entry(line)
    got = config_scope(entry)
    if got is None:
        raise RegistryError(f"a {entry.kind} entry, not a configuration", version=entry.version)
    if got != scope:
        raise RegistryError(f"the configuration of {got}, not {scope}", version=entry.version)
    return _keys(keys).check(entry)


def verify_end(
    entry: Entry, keys: FleetKeys | str, scope: str, held: int, ship: str | None = None
) -> bool:
    """Whether ``entry`` (checked signed: RegistryError if not) ended the configuration
    ``ship`` holds of ``scope`` at version ``held``: a later ``config_removed`` of the
    scope, the ``rollout_stopped`` of rollout ``held`` (a group's), or the ship's
    ``ship_groups_set`` without the scope's group."""
    if entry.kind == "config_removed":
        ends = ("g:" if entry.body["scope"] == "group" else "s:") + entry.body["name"] == scope
    elif entry.kind == "rollout_stopped":
        ends = entry.body["rollout"] == held and scope.startswith("g:")
    elif entry.kind == "ship_groups_set":
        ends = (
            entry.body["ship"] == ship
            and scope.startswith("g:")
            and scope[2:] not in entry.body["groups"]
        )
    else:
        return False
    if not ends or entry.version <= held:
        return False
    _keys(keys).check(entry)
    return True


def document_of(entry: Entry) -> dict[str, Any]:
    """The configuration document of a ``config_set`` or ``rollout_started`` entry, as
    a table."""
    text = str(entry.body["document"])
    if len(text.encode()) > MAX_CONFIG_BYTES:
        raise ConfigError("document", f"more than {MAX_CONFIG_BYTES} bytes")
    if entry.body["format"] == "json":
        doc = strict_json.loads(text)
        if not isinstance(doc, dict):
            raise ConfigError("document", "a JSON configuration must be an object")
        return doc
    return parse_toml(text)


def merge_documents(docs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Tables merged in order, a later one's key over an earlier one's (tables merged
    key by key, anything else, arrays too, replaced whole)."""
    out: dict[str, Any] = {}
    for doc in docs:
        _merge_into(out, doc)
    return out


def _merge_into(into: dict[str, Any], doc: Mapping[str, Any]) -> None:
    for k, v in doc.items():
        if isinstance(v, Mapping) and isinstance(into.get(k), dict):
            _merge_into(into[k], v)
        elif isinstance(v, Mapping):
            into[k] = {}
            _merge_into(into[k], v)
        else:
            into[k] = v
