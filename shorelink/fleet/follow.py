"""A site's registry as a long-running reader holds it: its ``sl.registry`` followed
(read_committed), each entry verified in its place of the chain from the pinned root key
(``fleet.pub``) and applied in memory (docs/fleet-registry.md, "How it travels").

The topic is a stream of *candidates*: what the merge wrote there is an entry only once
:meth:`FleetState.apply` takes it. A candidate ahead of its place waits (at most
:data:`MAX_WAITING`); one that is forged, replayed, of another chain or malformed is
refused: counted per reason (:attr:`RegistryFollower.refused`), logged, kept in the
quarantine (the newest :data:`QUARANTINE`; :meth:`RegistryFollower.quarantined` is what
the gateway's ``/registry`` and the Spark application's status file show), never applied; the follower reads on, so a
genuine entry after it is taken. A record's identity is not trusted either: an entry is
taken by its version, not by its seq.

The gateway and the Spark application take from it what they enforce when its version
moves (``on_change``: called on the thread that reads the topic with the new state; whatever it
builds, it swaps in whole). :meth:`current` gives the ship keys the registry says, so a
follower stands where a :class:`~shorelink.proof.WatchedShipKeys` stood.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

from shorelink.contract import Record
from shorelink.errors import ContractError
from shorelink.fleet.entry import FLEET_ORIGIN, REGISTRY_STREAM, Entry, RegistryError, decode_entry
from shorelink.fleet.state import FleetState
from shorelink.fleet.views import site_ship_keys
from shorelink.logs import RateLimitedLog, get_logger
from shorelink.proof import ShipKeys

__all__ = ["MAX_WAITING", "MAX_WHY_CHARS", "QUARANTINE", "REASONS", "RegistryFollower"]

log = get_logger(__name__)

#: candidates kept ahead of their place (a version past the next one) at most
MAX_WAITING = 10_000
#: refused candidates kept for an operator to look at (version, reason), newest
QUARANTINE = 100
#: characters of a refusal's text kept (a hostile record's bytes may be quoted in it)
MAX_WHY_CHARS = 300
#: why a candidate is refused
REASONS = ("forged", "replayed", "forked", "malformed", "foreign", "invalid", "too_far_ahead")


class RegistryFollower:
    """A site's registry: :meth:`take` each record of its ``sl.registry``, then
    :meth:`changed` when one moved the version (shorelink/kafka/registry.py
    ``RegistryFeed`` reads the topic); no Kafka here."""

    def __init__(
        self, anchor: str, *, on_change: Callable[[FleetState], None] | None = None
    ) -> None:
        self.state = FleetState(anchor=anchor)
        self.on_change = on_change
        self.refused: Counter[str] = Counter()
        #: (version or None, reason, why, when: epoch s), oldest first
        self.quarantine: deque[tuple[int | None, str, str, float]] = deque(maxlen=QUARANTINE)
        #: records read from the topic
        self.records = 0
        self._waiting: dict[int, list[Entry]] = {}
        self._keys = site_ship_keys(self.state)  # the pinned root's only, at first
        #: as :class:`~shorelink.proof.WatchedShipKeys` has them: never stale (nothing
        #: to read that could fail), no failed read
        self.stale = False
        self.failures = 0
        self._limited = RateLimitedLog(log)

    @property
    def version(self) -> int:
        """The version of the newest entry taken: what this reader enforces."""
        return self.state.version

    @property
    def waiting(self) -> int:
        return sum(len(c) for c in self._waiting.values())

    def current(self) -> ShipKeys:
        """The ship keys the registry says now (the fleet's records' keys among them)."""
        return self._keys

    def quarantined(self, newest: int = QUARANTINE) -> list[dict[str, Any]]:
        """The ``newest`` refused candidates, newest first, as an operator reads them
        outside the process: the entry's version (None: not an entry at all), why (one
        of :data:`REASONS` and the text), when (UTC, to the second)."""
        picked = list(self.quarantine)[-newest:] if newest > 0 else []
        return [
            {
                "version": version,
                "reason": reason,
                "error": why,
                "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at)),
            }
            for version, reason, why, at in reversed(picked)
        ]

    # -- the decision ---------------------------------------------------------------------
    def take(self, key: bytes | None, value: bytes | None, headers: object) -> bool:
        """Take one record of the topic; True if the state's version moved."""
        self.records += 1
        try:
            rec = Record.from_kafka(key, value, headers)  # type: ignore[arg-type]
        except ContractError as exc:
            self._refuse(None, "malformed", str(exc))
            return False
        ident = rec.identity
        if (ident.origin, ident.stream) != (FLEET_ORIGIN, REGISTRY_STREAM):
            self._refuse(None, "foreign", f"a record of {ident.origin}/{ident.stream}")
            return False
        try:
            entry = decode_entry(rec.value)
        except RegistryError as exc:
            self._refuse(ident.seq, "malformed", str(exc))
            return False
        before = self.state.version
        if entry.version <= before:
            self._refuse(entry.version, "replayed", f"the registry is at version {before}")
            return False
        if entry.version > before + 1:
            if self.waiting >= MAX_WAITING:
                self._refuse(entry.version, "too_far_ahead", f"{MAX_WAITING} entries wait")
            else:
                self._waiting.setdefault(entry.version, []).append(entry)
            return False
        self._apply(entry)
        while (nxt := self._waiting.pop(self.state.version + 1, None)) is not None:
            at = self.state.version
            for candidate in nxt:
                if self.state.version == at:
                    self._apply(candidate)
                else:
                    self._refuse(candidate.version, "replayed", "another copy was taken")
            if self.state.version == at:
                break
        return self.state.version != before

    def _apply(self, entry: Entry) -> None:
        try:
            self.state.apply(entry)
        except RegistryError as exc:
            self._refuse(entry.version, exc.reason, str(exc))

    def _refuse(self, version: int | None, reason: str, why: str) -> None:
        self.refused[reason] += 1
        self.quarantine.append((version, reason, why[:MAX_WHY_CHARS], time.time()))
        self._limited.warning(
            f"refused-{reason}",
            "registry_entry_refused",
            reason=reason,
            version=version,
            error=why,
            registry_version=self.state.version,
        )

    def changed(self) -> None:
        """The state moved: the keys and whatever ``on_change`` builds, made again."""
        self._keys = site_ship_keys(self.state)
        if self.on_change is not None:
            self.on_change(self.state)
        log.info("registry_applied", version=self.state.version, ships=len(self.state.ships))
