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

Every function here is pure; the gateway (core_gateway/upload.py) and the agent
(edge_agent/fleet_config.py) do the I/O.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping, Sequence
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
    "decode_delta",
    "encode_delta",
    "merge_documents",
    "offer_for",
    "parse_offer",
    "parse_request",
    "scope_of",
    "verify_config_entry",
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


@boundary
def parse_request(data: bytes | str) -> dict[str, int | None]:
    """A ship's request (scope -> the version it holds, None: none); ValueError if it
    is not one."""
    doc = strict_json.loads(data)
    if not isinstance(doc, dict) or doc.get("type") != "config":
        raise ValueError("not a configuration request")
    have = doc.get("have")
    if not isinstance(have, dict) or not 0 < len(have) <= MAX_SCOPES:
        raise ValueError(f"a configuration request names 1 to {MAX_SCOPES} scopes")
    out: dict[str, int | None] = {}
    for scope, v in have.items():
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise ValueError(f"bad version for {scope!r:.40}")
        out[str(scope)] = v
    return out


def request_json(have: Mapping[str, int | None]) -> str:
    return json.dumps({"type": "config", "have": dict(have)}, separators=(",", ":"))


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


def verify_config_entry(line: bytes, anchor: str, scope: str) -> Entry:
    """The ``config_set`` (or ``rollout_started``: a group's configuration in stages)
    entry of ``line`` for ``scope``, its signature the fleet
    root key's (``anchor``, the ship's pinned fleet.pub); :class:`RegistryError` why
    not. (An entry signed by a later fleet key is refused: the ship follows no fleet
    key rotation yet.)"""
    entry = decode_entry(line)
    if entry.kind == "config_set":
        got = ("g:" if entry.body["scope"] == "group" else "s:") + entry.body["name"]
    elif entry.kind == "rollout_started":  # a group's configuration in stages
        got = "g:" + entry.body["group"]
    else:
        raise RegistryError(f"a {entry.kind} entry, not a configuration", version=entry.version)
    if got != scope:
        raise RegistryError(f"the configuration of {got}, not {scope}", version=entry.version)
    if entry.signer != key_id(anchor) or not entry.verify(verify_key(anchor)):
        raise RegistryError(
            "its signature is not the fleet key's (forged)", version=entry.version, reason="forged"
        )
    return entry


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
