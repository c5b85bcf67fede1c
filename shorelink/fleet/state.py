"""The fleet as the registry's entries leave it: ships, groups, tokens, keys with their
history, configurations; and the one place an entry is taken (:meth:`FleetState.apply`).

An entry is taken only in its place: its version is the next one, its ``prev`` the hash
of the entry before, its signer the fleet key in force, its signature that key's; then
it must make sense (the ship exists, a bound is kept). Every check comes before the first
change, so an entry refused leaves the state as it was.

Tokens: a ship has one or two valid token hashes. A rotation (``token_issued`` with
``retire_previous`` false) keeps the old one valid beside the new one until a
``token_retired`` entry retires it: written by ``shorelink fleet run`` once the ship's
signed report names the new token (shorelink/fleet/tokens.py), or by ``shorelink fleet
retire-token``. A rotation while one is pending retires the older of the two at once, so
a ship never has more than two; ``retire_previous`` true (a leaked token) keeps only the
new one.

Keys: each key signs a ship's records from its ``from_seq`` (per stream, or one seq for
every stream; a stream not named: from 1) up to the next key's ``from_seq``, and below
its ``revoked_at`` where a revocation bounded it further. So a record is checked against
the key that was valid at its seq (:meth:`FleetState.key_at`), old records stay
provable after a rotation, and a key stolen after a rotation signs no later seq. The
newest key is never revoked alone: ``fleet rotate-key --revoke`` adds its successor and
bounds it in one command.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from shorelink.fleet.entry import (
    FLEET_ORIGIN,
    MAX_CONFIG_LINES_ASIDE_BYTES,
    MAX_GROUPS,
    MAX_KEYS_PER_SHIP,
    MAX_SHIPS,
    Entry,
    RegistryError,
    SeqBound,
    key_id,
    verify_key,
)
from shorelink.fleet.rollout import RolloutRecord, canary_order

__all__ = [
    "ConfigRecord",
    "FleetState",
    "KeyRecord",
    "ShipConfig",
    "ShipRecord",
    "TokenRecord",
    "lowest",
]


@dataclass(frozen=True, slots=True)
class TokenRecord:
    hash: str
    issued: str
    version: int


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """A ship's signing key: from ``from_seq`` on, below ``revoked_at`` (None: not
    revoked) and below the next key's ``from_seq``."""

    id: str
    public: str
    from_seq: SeqBound
    version: int
    revoked_at: SeqBound | None = None


@dataclass(slots=True)
class ShipRecord:
    name: str
    groups: tuple[str, ...]
    added: str
    version: int
    #: valid token hashes, oldest first (two while a rotation is pending)
    tokens: list[TokenRecord] = field(default_factory=list)
    #: every key the ship has had, oldest first
    keys: list[KeyRecord] = field(default_factory=list)
    revoked: bool = False
    #: the newest token issued (kept when the ship is revoked: its credential says so)
    last_token: TokenRecord | None = None
    #: its token alone is not enough: it must present a client certificate naming it
    #: (mutual TLS; ``client_cert_set``)
    require_client_cert: bool = False

    def valid_below(self, index: int) -> SeqBound | None:
        """The first seqs key ``index`` no longer proves (None: every seq from its
        ``from_seq``): the next key's ``from_seq``, lowered by a revocation."""
        key = self.keys[index]
        after = self.keys[index + 1].from_seq if index + 1 < len(self.keys) else None
        return lowest(after, key.revoked_at)


@dataclass(frozen=True, slots=True)
class ConfigRecord:
    scope: str
    name: str
    format: str
    document: str
    port_links_only: bool
    version: int
    time: str


@dataclass(frozen=True, slots=True)
class ShipConfig:
    """The configuration a ship should run: the documents that apply to it (its
    groups' in its groups' order, then its own), each as far as a rollout has reached
    the ship, and its version (the newest of their entries; None: none)."""

    version: int | None
    documents: tuple[ConfigRecord, ...]


def _at(bound: SeqBound, stream: str) -> int:
    return bound if isinstance(bound, int) else bound.get(stream, 1)


def lowest(a: SeqBound | None, b: SeqBound | None) -> SeqBound | None:
    """The tighter of two upper bounds, stream by stream (None: no bound). A stream a
    mapping does not name is bounded at 1, so it stays unnamed in the result."""
    if a is None or b is None:
        return b if a is None else a
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b)
    if isinstance(a, int):
        a, b = b, a
    assert not isinstance(a, int)
    if isinstance(b, int):
        return {s: min(n, b) for s, n in a.items()}
    return {s: min(n, b[s]) for s, n in a.items() if s in b}


@dataclass
class FleetState:
    """What the entries applied so far say. Empty until the first entry
    (``fleet_created``), which must be signed by its own key, and by ``anchor`` (the
    fleet's root public key, given out of band) when one is given."""

    anchor: str | None = None
    version: int = 0
    head: str | None = None
    fleet_key: str | None = None
    fleet_key_id: str | None = None
    ships: dict[str, ShipRecord] = field(default_factory=dict)
    groups: set[str] = field(default_factory=set)
    configs: dict[tuple[str, str], ConfigRecord] = field(default_factory=dict)
    #: every rollout by its id (its rollout_started entry's version), and each
    #: group's active one
    rollouts: dict[int, RolloutRecord] = field(default_factory=dict)
    active_rollouts: dict[str, int] = field(default_factory=dict)
    #: an active rollout's configuration (versioned by its rollout_started entry)
    rollout_configs: dict[int, ConfigRecord] = field(default_factory=dict, repr=False)
    #: configuration entries' lines by their version, as a gateway serves them to the
    #: ships (shorelink/fleet/shipconfig.py): every one in force (each scope's, each
    #: active rollout's), and beside them, up to MAX_CONFIG_LINES_ASIDE_BYTES, the
    #: newest of those superseded (a ship may hold one: the base of its delta) and of
    #: the entries that ended a configuration (config_removed, rollout_stopped: what a
    #: ship is shown to go back from it)
    config_lines: dict[int, bytes] = field(default_factory=dict, repr=False)
    #: per scope (``g:<group>``, ``s:<ship>``) the version of its newest
    #: config_removed; per stopped rollout the version of its rollout_stopped
    config_ends: dict[str, int] = field(default_factory=dict, repr=False)
    rollout_ends: dict[int, int] = field(default_factory=dict, repr=False)
    #: per ship the version of its newest ship_groups_set (it ends the configurations
    #: of the groups it left)
    group_ends: dict[str, int] = field(default_factory=dict, repr=False)
    #: the fleet_key_rotated entries' lines by version (a ship follows them from the
    #: root it pins: a few hundred bytes each, all kept)
    rotation_lines: dict[int, bytes] = field(default_factory=dict, repr=False)
    _aside: dict[int, int] = field(default_factory=dict, repr=False)
    _aside_bytes: int = field(default=0, repr=False)
    #: every fleet key the chain named, oldest first: (public key, the version of the
    #: entry that named it); each signs the entries after that one, up to the next's
    fleet_keys: list[tuple[str, int]] = field(default_factory=list)
    #: every token hash and ship key ever issued: never issued twice
    _hashes: set[str] = field(default_factory=set, repr=False)
    _publics: set[str] = field(default_factory=set, repr=False)
    _verifier: Ed25519PublicKey | None = field(default=None, repr=False)

    def apply(self, entry: Entry, *, signed: bool = False) -> None:
        """Take ``entry`` (:class:`RegistryError` naming its version if it cannot be
        taken; the state unchanged then). ``signed``: its signature was checked before
        (the caller holds the hash of a later entry it checked: the chain vouches for
        this one), so only its place and its sense are."""
        v = entry.version
        if v != self.version + 1:
            what = "replayed or reordered" if v <= self.version else "after a gap"
            raise RegistryError(f"{what}: the next entry is {self.version + 1}", version=v)
        if entry.prev != (self.head or "0" * 64):
            raise RegistryError(
                "does not follow the entry before it (prev)", version=v, reason="forked"
            )
        if v == 1:
            if entry.kind != "fleet_created":
                raise RegistryError("the first entry must be fleet_created", version=v)
            public = entry.body["fleet_key"]
            if self.anchor is not None and public != self.anchor:
                raise RegistryError("made by another fleet key than this fleet's", version=v)
            verifier = verify_key(public)
            signer: str | None = key_id(public)
        else:
            if entry.kind == "fleet_created":
                raise RegistryError("fleet_created comes first only", version=v)
            assert self._verifier is not None
            verifier, signer = self._verifier, self.fleet_key_id
        if entry.signer != signer or not (signed or entry.verify(verifier)):
            raise RegistryError(
                "its signature is not the fleet key's (forged)", version=v, reason="forged"
            )
        try:
            change = getattr(self, "_" + entry.kind)
            change(entry, entry.body)
        except RegistryError as exc:
            raise RegistryError(str(exc), version=v) from None
        self.version, self.head = v, entry.digest
        if entry.kind in ("fleet_created", "fleet_key_rotated"):
            self.fleet_key = entry.body["fleet_key"]
            self.fleet_key_id = key_id(self.fleet_key)
            self._verifier = verify_key(self.fleet_key)
            self.fleet_keys.append((self.fleet_key, v))
            if v > 1:
                self.rotation_lines[v] = entry.raw

    # -- each kind: checks first, then the change ---------------------------------------

    def _fleet_created(self, entry: Entry, body: dict[str, Any]) -> None:
        pass

    def _fleet_key_rotated(self, entry: Entry, body: dict[str, Any]) -> None:
        if body["fleet_key"] == self.fleet_key:
            raise RegistryError("the fleet key rotated to itself")

    def _live(self, ship: str) -> ShipRecord:
        rec = self.ships.get(ship)
        if rec is None:
            raise RegistryError(f"no ship {ship}")
        if rec.revoked:
            raise RegistryError(f"ship {ship} is revoked")
        return rec

    def _ship_added(self, entry: Entry, body: dict[str, Any]) -> None:
        name, groups = body["ship"], tuple(body["groups"])
        if name in self.ships:
            raise RegistryError(f"ship {name} exists (a name is never given twice)")
        if name == FLEET_ORIGIN:
            raise RegistryError(f"{FLEET_ORIGIN} is the registry's own origin, never a ship's")
        if len(self.ships) >= MAX_SHIPS:
            raise RegistryError(f"the registry holds {MAX_SHIPS} ships already")
        self._room_for(groups)
        self.groups.update(groups)
        self.ships[name] = ShipRecord(name, groups, entry.time, entry.version)

    def _ship_groups_set(self, entry: Entry, body: dict[str, Any]) -> None:
        rec, groups = self._live(body["ship"]), tuple(body["groups"])
        self._room_for(groups)
        self.groups.update(groups)
        rec.groups = groups
        self.group_ends[rec.name] = entry.version
        self.config_lines[entry.version] = entry.raw
        self._put_aside(entry.version)

    def _room_for(self, groups: tuple[str, ...]) -> None:
        if len(self.groups | set(groups)) > MAX_GROUPS:
            raise RegistryError(f"the registry names {MAX_GROUPS} groups already")

    def _token_issued(self, entry: Entry, body: dict[str, Any]) -> None:
        rec, token = self._live(body["ship"]), str(body["token_hash"])
        if token in self._hashes:
            raise RegistryError("that token was issued before")
        self._hashes.add(token)
        kept = [] if body["retire_previous"] else rec.tokens[-1:]
        rec.last_token = TokenRecord(token, entry.time, entry.version)
        rec.tokens = [*kept, rec.last_token]

    def _token_retired(self, entry: Entry, body: dict[str, Any]) -> None:
        rec = self._live(body["ship"])
        old = [t for t in rec.tokens[:-1] if t.hash == body["token_hash"]]
        if not old:
            raise RegistryError(
                f"ship {rec.name} has no previous token of that hash (its newest token is "
                "retired by revoking the ship or issuing another)"
            )
        rec.tokens = [t for t in rec.tokens if t.hash != body["token_hash"]]

    def _ship_key_added(self, entry: Entry, body: dict[str, Any]) -> None:
        rec, public = self._live(body["ship"]), str(body["public"])
        if public in self._publics:
            raise RegistryError("that key was a ship's key before")
        if len(rec.keys) >= MAX_KEYS_PER_SHIP:
            raise RegistryError(f"ship {rec.name} has had {MAX_KEYS_PER_SHIP} keys already")
        self._publics.add(public)
        rec.keys.append(KeyRecord(key_id(public), public, body["from_seq"], entry.version))

    def _key_revoked(self, entry: Entry, body: dict[str, Any]) -> None:
        rec = self.ships.get(body["ship"])
        if rec is None:
            raise RegistryError(f"no ship {body['ship']}")
        at = next((i for i, k in enumerate(rec.keys) if k.id == body["key_id"]), None)
        if at is None:
            raise RegistryError(f"ship {rec.name} has no key {body['key_id']}")
        if at == len(rec.keys) - 1:
            raise RegistryError(
                f"key {body['key_id']} is ship {rec.name}'s newest: rotate it "
                "(`shorelink fleet rotate-key --revoke`)"
            )
        key = rec.keys[at]
        bound = lowest(key.revoked_at, body["at_seq"])
        rec.keys[at] = KeyRecord(key.id, key.public, key.from_seq, key.version, bound)

    def _ship_revoked(self, entry: Entry, body: dict[str, Any]) -> None:
        rec = self._live(body["ship"])
        rec.revoked = True
        rec.tokens = []

    def _client_cert_set(self, entry: Entry, body: dict[str, Any]) -> None:
        self._live(body["ship"]).require_client_cert = bool(body["required"])

    def _config_set(self, entry: Entry, body: dict[str, Any]) -> None:
        scope, name = str(body["scope"]), str(body["name"])
        if scope == "ship":
            self._live(name)
        else:
            if name in self.active_rollouts:
                raise RegistryError(
                    f"group {name} has rollout {self.active_rollouts[name]} under way: "
                    "stop it or let it finish first"
                )
            self._room_for((name,))
            self.groups.add(name)
        old = self.configs.get((scope, name))
        self.configs[(scope, name)] = _config_record(scope, name, entry, body)
        self.config_lines[entry.version] = entry.raw
        if old is not None:
            self._put_aside(old.version)

    def _config_removed(self, entry: Entry, body: dict[str, Any]) -> None:
        scope, name = str(body["scope"]), str(body["name"])
        if scope == "group" and name in self.active_rollouts:
            raise RegistryError(
                f"group {name} has rollout {self.active_rollouts[name]} under way: "
                "stop it or let it finish first"
            )
        old = self.configs.pop((scope, name), None)
        if old is None:
            raise RegistryError(f"{scope} {name} has no configuration")
        self._put_aside(old.version)
        self.config_ends[("g:" if scope == "group" else "s:") + name] = entry.version
        self.config_lines[entry.version] = entry.raw
        self._put_aside(entry.version)

    def _put_aside(self, version: int) -> None:
        """A line no longer in force: kept beside those in force while the newest such
        lines fit MAX_CONFIG_LINES_ASIDE_BYTES (the oldest go first)."""
        line = self.config_lines.get(version)
        if line is None or version in self._aside:
            return
        self._aside[version] = len(line)
        self._aside_bytes += len(line)
        while self._aside_bytes > MAX_CONFIG_LINES_ASIDE_BYTES:
            oldest = next(iter(self._aside))
            self._aside_bytes -= self._aside.pop(oldest)
            del self.config_lines[oldest]

    def _rollout_started(self, entry: Entry, body: dict[str, Any]) -> None:
        group = str(body["group"])
        if group in self.active_rollouts:
            raise RegistryError(
                f"group {group} has rollout {self.active_rollouts[group]} under way: "
                "stop it or let it finish first"
            )
        members = [s.name for s in self.ships.values() if group in s.groups]
        if not members:
            raise RegistryError(f"group {group} has no ships")
        self.rollouts[entry.version] = RolloutRecord(
            entry.version,
            group,
            tuple(body["stages"]),
            int(body["healthy_s"]),
            int(body["stop_failure_percent"]),
            canary_order(group, members),
            [entry.time],
        )
        self.rollout_configs[entry.version] = _config_record("group", group, entry, body)
        self.config_lines[entry.version] = entry.raw
        self.active_rollouts[group] = entry.version

    def _active(self, body: dict[str, Any]) -> RolloutRecord:
        r = self.rollouts.get(body["rollout"])
        if r is None:
            raise RegistryError(f"no rollout {body['rollout']}")
        if r.state != "active":
            raise RegistryError(f"rollout {r.id} is {r.state}")
        return r

    def _rollout_advanced(self, entry: Entry, body: dict[str, Any]) -> None:
        r = self._active(body)
        if body["stage"] != r.stage + 1 or body["stage"] >= len(r.stages):
            raise RegistryError(
                f"rollout {r.id} is at stage {r.stage + 1} of {len(r.stages)}: "
                f"it advances to stage {r.stage + 2} only"
            )
        r.stage_times.append(entry.time)

    def _end(self, r: RolloutRecord, entry: Entry, state: str, reason: str | None) -> None:
        r.state, r.by, r.reason, r.ended = state, str(entry.body["by"]), reason, entry.time
        del self.active_rollouts[r.group]

    def _rollout_stopped(self, entry: Entry, body: dict[str, Any]) -> None:
        r = self._active(body)
        self._end(r, entry, "stopped", str(body["reason"]))
        del self.rollout_configs[r.id]
        self._put_aside(r.id)
        self.rollout_ends[r.id] = entry.version
        self.config_lines[entry.version] = entry.raw
        self._put_aside(entry.version)

    def _rollout_done(self, entry: Entry, body: dict[str, Any]) -> None:
        r = self._active(body)
        if not r.last:
            raise RegistryError(
                f"rollout {r.id} is at stage {r.stage + 1} of {len(r.stages)}: "
                "it is done only at its last"
            )
        self._end(r, entry, "done", None)
        old = self.configs.get(("group", r.group))
        self.configs[("group", r.group)] = self.rollout_configs.pop(r.id)
        if old is not None:
            self._put_aside(old.version)

    # -- what the state answers ----------------------------------------------------------

    def key_at(self, ship: str, stream: str, seq: int) -> KeyRecord | None:
        """The key of ``ship`` that proves its records of ``stream`` at ``seq`` (None:
        none, the seq is before its first key or past a revocation)."""
        rec = self.ships.get(ship)
        if rec is None:
            return None
        for i in range(len(rec.keys) - 1, -1, -1):
            key = rec.keys[i]
            if seq < _at(key.from_seq, stream):
                continue
            below = rec.valid_below(i)
            return key if below is None or seq < _at(below, stream) else None
        return None

    def config_for(self, ship: str) -> ShipConfig:
        """The configuration ``ship`` should run now, rollouts honoured: for each of its
        groups, the configuration of the group's active rollout if a stage reached the
        ship, else the group's own (the one before the rollout: a stopped rollout's
        ships go back to it); then the ship's own. A gateway serves this; a rollout
        judges a ship's report against its ``version``."""
        rec = self.ships[ship]
        docs = []
        for g in rec.groups:
            rid = self.active_rollouts.get(g)
            if rid is not None and self.rollouts[rid].reaches(ship):
                docs.append(self.rollout_configs[rid])
            elif ("group", g) in self.configs:
                docs.append(self.configs[("group", g)])
        if ("ship", ship) in self.configs:
            docs.append(self.configs[("ship", ship)])
        return ShipConfig(max((c.version for c in docs), default=None), tuple(docs))

    def configs_of(self, ship: str) -> list[ConfigRecord]:
        """The configurations that apply to ``ship`` (:meth:`config_for`'s documents):
        its groups' in its groups' order, then its own (how they combine is a later part
        of issue 41)."""
        return list(self.config_for(ship).documents)

    def config_version(self, ship: str) -> int | None:
        """The newest entry among the configurations that apply to ``ship``."""
        return self.config_for(ship).version

    def config_end(self, scope: str, held: int, ship: str) -> bytes | None:
        """The line of the entry that ended the configuration ``ship`` holds of
        ``scope`` at version ``held`` (the stop of the rollout ``held`` is, a later
        removal of the scope, or the ship's groups set without the scope's group), if
        kept: what shows the ship it goes back to what applies without it (None: none,
        or no longer kept)."""
        group = scope[2:] if scope[:2] == "g:" else None
        end = self.rollout_ends.get(held)
        if end is None or self.rollouts[held].group != group:
            end = self.config_ends.get(scope)
            if end is None or end <= held:
                end = self.group_ends.get(ship)
                rec = self.ships.get(ship)
                if end is None or end <= held or rec is None or group in (None, *rec.groups):
                    end = None
        return None if end is None else self.config_lines.get(end)

    def valid_tokens(self) -> Mapping[str, str]:
        """Every valid token hash and its ship."""
        return {t.hash: s.name for s in self.ships.values() for t in s.tokens}


def _config_record(scope: str, name: str, entry: Entry, body: dict[str, Any]) -> ConfigRecord:
    """The configuration an entry carries (``config_set``, ``rollout_started``)."""
    return ConfigRecord(
        scope,
        name,
        str(body["format"]),
        str(body["document"]),
        bool(body["port_links_only"]),
        entry.version,
        entry.time,
    )
