"""The fleet's configuration on board (docs/fleet-registry.md, "Configuration to the
ships"): learnt from a gateway's offer, fetched as a delta within the link's budget,
verified against the pinned ``fleet.pub``, checked against the schema this agent knows,
applied by a controlled restart, kept if the agent is healthy, rolled back if not.

Why a restart and not a reload: a configuration may change anything edge.toml holds
(rules, streams, links, gateways, MQTT); the agent's parts are built from one frozen
config, and a restart in the same process (:class:`~edge_agent.agent.Supervisor`:
ingest drained and acknowledged, the uplink's batch finished, the log closed, then the
parts built again) is the one way that cannot leave a mix. Under systemd the process
stays up; only its parts start again.

What the agent holds lives in one file beside its log (``<log.path>.fleet.json``),
written atomically (temporary file, fsync, rename): the entry lines of each scope it
runs, their version, the last failure, and during a trial the state before it. So a
cut link, a crash or a power cut at any moment leaves the old configuration or the new
one whole, never a mix: the file is the only thing that changes, in one rename.

The trial: applying writes the new state with ``trial: "pending"`` and restarts. The
next start marks it ``"started"`` and watches its health for ``uplink.fleet_health``:
ingest connected to its broker and a gateway reached. Healthy: the trial ends, the
change stays. Not healthy in time, or the agent found ``"started"`` at start (it died
during its trial): the state before is put back, the failure kept for the ship report,
and the agent restarts on it. A version refused or rolled back is not fetched again
until the registry offers a newer one.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from edge_agent.budget import LinkBudget
from edge_agent.config import EdgeConfig, LinkConfig, load_config, parse_config
from edge_agent.errors import GatewayRejected
from shorelink.config import load_toml
from shorelink.errors import ConfigError, ShorelinkError
from shorelink.files import write_atomic
from shorelink.fleet.entry import Entry, RegistryError, decode_entry
from shorelink.fleet.log import read_anchor
from shorelink.fleet.shipconfig import (
    ConfigOffer,
    FleetKeys,
    config_scope,
    decode_delta,
    document_of,
    merge_documents,
    request_json,
    verify_config_entry,
    verify_end,
)
from shorelink.logs import get_logger
from shorelink.ship_report import ReportedConfig

__all__ = ["ConfigSource", "FleetConfig", "ShipConfigState", "is_port_link", "load_effective"]

log = get_logger(__name__)

#: keys a fleet configuration may not set: the ship's identity and its credentials
#: stay what its provisioning bundle put in edge.toml
FORBIDDEN = (
    "ship",
    "uplink.token",
    "uplink.token_file",
    "uplink.signing_key_file",
    "uplink.fleet_pub_file",
)


@runtime_checkable
class ConfigSource(Protocol):
    """A gateway that offers the fleet's configuration (edge_agent/gateway.py)."""

    @property
    def site(self) -> str: ...
    @property
    def config_offer(self) -> ConfigOffer | None: ...
    @property
    def config_registry(self) -> int | None: ...
    async def fetch_config(self, request: str) -> bytes: ...


def is_port_link(link: LinkConfig) -> bool:
    """A port link class: not the satellite, no daily budget."""
    return link.name != "satellite" and not link.daily_budget_bytes


@dataclass
class ShipConfigState:
    """What ``<log.path>.fleet.json`` holds."""

    #: the newest entry version among those applied (0: edge.toml alone)
    version: int = 0
    #: per scope (``g:<group>``, ``s:<ship>``), the entry line applied, offer order
    lines: dict[str, str] = field(default_factory=dict)
    failure: str | None = None
    #: the offers refused or rolled back (scope -> version), not fetched again
    refused: dict[str, int] = field(default_factory=dict)
    #: during a trial: "pending" (applied, not started), "started"; else ""
    trial: str = ""
    previous: dict[str, Any] | None = None
    #: the fleet key rotations followed from the pinned root (entry lines, in order)
    rotations: list[str] = field(default_factory=list)
    #: per scope, the newest entry taken for it (a configuration, or the entry that
    #: ended one): an older one offered later is a replay unless the fleet signed why
    floor: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "lines": self.lines,
            "failure": self.failure,
            "refused": self.refused,
            "trial": self.trial,
            "previous": self.previous,
            "rotations": self.rotations,
            "floor": self.floor,
        }


def _read_state(path: Path) -> ShipConfigState:
    try:
        doc = json.loads(path.read_bytes())
        return ShipConfigState(
            int(doc["version"]),
            dict(doc["lines"]),
            doc.get("failure"),
            dict(doc.get("refused", {})),
            str(doc.get("trial", "")),
            doc.get("previous"),
            list(doc.get("rotations", [])),
            {str(k): int(v) for k, v in doc.get("floor", {}).items()},
        )
    except FileNotFoundError:
        return ShipConfigState()
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(str(path), f"not the agent's fleet configuration: {exc}") from None


def _version(line: str) -> int:
    return decode_entry(line.encode()).version


def _overlay(lines: Mapping[str, str], keys: FleetKeys) -> dict[str, Any]:
    """The documents of ``lines`` merged in order (each checked against the fleet key
    again: the file is on the ship's disk)."""
    return merge_documents(
        [document_of(verify_config_entry(line.encode(), keys, s)) for s, line in lines.items()]
    )


def _ordered(scopes: list[str]) -> list[str]:
    """Groups' scopes first (in the order given), the ship's own last."""
    return sorted(scopes, key=lambda s: s.startswith("s:"))


def _forbidden(overlay: Mapping[str, Any]) -> list[str]:
    found = []
    for key in FORBIDDEN:
        table: Any = overlay
        *parents, last = key.split(".")
        for p in parents:
            table = table.get(p, {}) if isinstance(table, dict) else {}
        if isinstance(table, dict) and last in table:
            found.append(key)
    return found


def _effective(config_path: Path, overlay: Mapping[str, Any]) -> EdgeConfig:
    """edge.toml with ``overlay`` over it, read as the agent reads its config (every
    key the agent does not know refused, naming it)."""
    bad = _forbidden(overlay)
    if bad:
        raise ConfigError(bad[0], "a fleet configuration may not set the ship's identity or keys")
    data = merge_documents([load_toml(config_path), overlay])
    return parse_config(data, base=config_path.parent)


class FleetConfig:
    """The fleet configuration of one agent's run: what it holds and the trial, the
    fetch at a gateway's offer, the health check and the rollback."""

    def __init__(self, config_path: Path, base: EdgeConfig) -> None:
        assert base.uplink.fleet_pub_file is not None
        self.config_path = config_path
        self.ship = base.ship
        self.anchor = read_anchor(base.uplink.fleet_pub_file)
        self.path = Path(f"{base.log.path}.fleet.json")
        self.state = _read_state(self.path)
        self.keys = FleetKeys(self.anchor, [r.encode() for r in self.state.rotations])
        #: set by the agent: called once a change is applied (the agent restarts)
        self.on_applied: Callable[[], None] | None = None
        self._busy = False
        self._asked: ConfigOffer | None = None
        #: the last offer :meth:`offered` looked at (asked for or not)
        self._looked: ConfigOffer | None = None
        #: (scopes, version) offered for port links only and left for one
        self.waiting_for_port: set[tuple[str, int]] = set()
        #: bytes of this run's configuration requests sent and answers received whole
        #: (both charged to the link's budget; an answer cut short is not received)
        self.sent_bytes = 0
        self.received_bytes = 0
        #: scopes to go back from that a gateway could not serve the end of, and the
        #: registry's version then: not asked again until the registry moves
        self._unserved: dict[str, int | None] = {}

    def reported(self) -> ReportedConfig:
        return ReportedConfig(self.state.version, self.state.failure)

    def _save(self) -> None:
        write_atomic(self.path, json.dumps(self.state.to_json(), sort_keys=True), mode=0o600)

    # -- at start -----------------------------------------------------------------------
    def effective(self, base: EdgeConfig) -> EdgeConfig:
        """The config to run: edge.toml with what the ship holds over it; a trial that
        a previous start began and never ended is rolled back first."""
        if self.state.trial == "started":
            self.rollback("the agent stopped during its health check")
        if not self.state.lines:
            return base
        try:
            return _effective(self.config_path, _overlay(self.state.lines, self.keys))
        except (ShorelinkError, ValueError) as exc:
            if self.state.previous is None:
                raise
            self.rollback(f"does not load: {exc}")
            return self.effective(base)

    def begin(self) -> bool:
        """At the start of a run: True if this run is a trial to watch."""
        if self.state.trial == "pending":
            self.state.trial = "started"
            self._save()
            return True
        return False

    def healthy(self) -> None:
        log.info("fleet_config_kept", version=self.state.version)
        self.state.trial, self.state.previous = "", None
        self._save()

    def rollback(self, why: str) -> None:
        prev = self.state.previous or {"version": 0, "lines": {}}
        bad, failed = dict(self.state.lines), self.state.version
        log.warning("fleet_config_rolled_back", version=failed, reason=why)
        for scope, line in bad.items():
            if prev["lines"].get(scope) != line:
                self.state.refused[scope] = _version(line)
        for scope in prev["lines"]:
            if scope not in bad:
                self.state.refused[scope] = 0  # its removal
        self.state.version = int(prev["version"])
        self.state.lines = dict(prev["lines"])
        self.state.floor = dict(prev.get("floor", self.state.floor))
        self.state.failure = f"version {failed} rolled back: {why}"
        self.state.trial, self.state.previous = "", None
        self._save()

    # -- at a gateway's offer -------------------------------------------------------------
    def _floor(self, scope: str, held: int | None) -> int:
        return max(self.state.floor.get(scope, 0), held or 0)

    def wanted(
        self, offer: ConfigOffer, link: LinkConfig, registry: int | None = None
    ) -> dict[str, int | None] | None:
        """The scopes to fetch (and the version held of each), or None: nothing new,
        refused before, or for port links only and ``link`` is not one. A scope offered
        older than the ship's (or no longer offered) is asked for only of a gateway
        whose registry (``registry``) is past what the ship holds of it: a site behind
        it cannot know."""
        held = {s: _version(line) for s, line in self.state.lines.items()}
        want: dict[str, int | None] = {}
        for s, (v, _port) in offer.items():
            h = held.get(s)
            if h == v or self.state.refused.get(s) == v:
                continue
            floor = self._floor(s, h)
            if v < floor and (h is None or registry is None or registry <= floor):
                continue
            if v < floor and self._unserved.get(s, -1) == registry:
                continue
            want[s] = h
        for s, h in held.items():
            if s in offer or self.state.refused.get(s) == 0:
                continue
            if self._unserved.get(s, -1) == registry:
                continue
            if registry is not None and registry > self._floor(s, h):
                want[s] = h
        if not want:
            return None
        if not is_port_link(link) and any(offer[s][1] for s in want if s in offer):
            key = (
                ",".join(sorted(want)),
                max((offer[s][0] for s in want if s in offer), default=0),
            )
            if key not in self.waiting_for_port:
                self.waiting_for_port.add(key)
                log.info("fleet_config_waits_for_port", link=link.name, scopes=key[0])
            return None
        return want

    def unseen(self, gw: ConfigSource) -> bool:
        """Has ``gw`` offered something :meth:`offered` has not looked at yet (a batch's
        answer brought it while the upload stays open)?"""
        offer = gw.config_offer
        return offer is not None and offer is not self._looked and not self._busy

    async def offered(self, gw: ConfigSource, link: LinkConfig, budget: LinkBudget) -> None:
        """Fetch, check and apply what ``gw`` offers, if anything is new. The bytes
        both ways are counted against ``budget``."""
        offer = gw.config_offer
        self._looked = offer
        if offer is None or self._busy or self.state.trial or offer is self._asked:
            return  # once per offer: a gateway's answer refused is not asked for again
        # on the same connection (the next one brings a new offer)
        want = self.wanted(offer, link, gw.config_registry)
        if want is None:
            return
        request = request_json(want, self.keys.since)
        if not budget.fits(len(request) + 1024):
            return  # today's budget: the configuration waits for tomorrow or a port
        self._busy, self._asked = True, offer
        try:
            await budget.charge(len(request))
            self.sent_bytes += len(request)
            try:
                answer = await gw.fetch_config(request)
            except GatewayRejected as exc:
                # not served (an end this gateway no longer keeps): the batches go on,
                # and a scope to go back from is asked again once the registry moves
                log.warning("fleet_config_not_served", site=gw.site, error=str(exc))
                for s, h in want.items():
                    if s not in offer or (h is not None and offer[s][0] < h):
                        self._unserved[s] = gw.config_registry
                return
            await budget.charge(len(answer))
            self.received_bytes += len(answer)
            log.info("fleet_config_fetched", site=gw.site, bytes=len(request) + len(answer))
            await asyncio.to_thread(self.take, offer, want, answer)
        finally:
            self._busy = False

    def _verify(
        self, offer: ConfigOffer, want: Mapping[str, int | None], lines: list[bytes]
    ) -> tuple[FleetKeys, dict[str, Entry], dict[str, int]]:
        """The entries of an answer checked: the fleet key rotations followed, then per
        scope asked for its new entry and the entry that ended what the ship holds
        (RegistryError or ValueError at the first that does not hold)."""
        keys = FleetKeys(self.anchor, [r.encode() for r in self.state.rotations])
        entries = [decode_entry(line) for line in lines if line]
        keys.follow([e for e in entries if e.kind == "fleet_key_rotated"])
        got: dict[str, Entry] = {}
        ends: dict[str, int] = {}
        for e in entries:
            if e.kind == "fleet_key_rotated":
                continue
            scope = config_scope(e)
            if scope is None:
                ended = [s for s, h in want.items() if h and verify_end(e, keys, s, h, self.ship)]
                if not ended:
                    raise RegistryError(
                        f"a {e.kind} entry that ends nothing this ship holds", version=e.version
                    )
                for s in ended:
                    ends[s] = max(ends.get(s, 0), e.version)
                continue
            if scope not in want or scope in got or scope not in offer:
                raise RegistryError(
                    f"the configuration of {scope}, not asked for", version=e.version
                )
            if e.version != offer[scope][0]:
                raise RegistryError(
                    f"version {e.version} where {offer[scope][0]} was offered", version=e.version
                )
            got[scope] = verify_config_entry(e, keys, scope)
        for scope, held in want.items():
            floor = self._floor(scope, held)
            if scope in offer and scope not in got:
                raise ValueError(f"no entry for {scope}")
            if scope in got and got[scope].version >= floor:
                continue
            if ends.get(scope, 0) <= floor:
                what = f"version {got[scope].version}" if scope in got else "no configuration"
                raise RegistryError(
                    f"{what} of {scope} where this ship holds {floor}, and no entry the fleet "
                    "signed ends it (replayed)",
                    reason="forged",
                )
        return keys, got, ends

    def take(self, offer: ConfigOffer, want: Mapping[str, int | None], answer: bytes) -> bool:
        """Check and apply an answer; True if applied (the agent then restarts)."""
        bases = [self.state.lines.get(s, "").encode() for s in want]
        try:
            keys, got, ends = self._verify(offer, want, decode_delta(answer, bases))
        except (ValueError, RegistryError) as exc:
            # a gateway that serves what the fleet did not sign, or an older entry
            # again: nothing applied, not remembered (another gateway may serve the
            # genuine entry)
            self.state.failure = f"refused: {exc}"
            log.warning("fleet_config_refused", reason=str(exc))
            self._save()
            return False
        self.state.rotations = [r.raw.decode() for r in keys.rotations]
        self.keys = keys
        held = self.state.lines
        scopes = [s for s in offer if s in got or (s in held and s not in ends)]
        scopes += [s for s in held if s not in offer and s not in ends]
        new = {s: got[s].raw.decode() if s in got else held[s] for s in _ordered(scopes)}
        floor = dict(self.state.floor)
        for s, h in want.items():
            floor[s] = max(self._floor(s, h), got[s].version if s in got else 0, ends.get(s, 0))
        version = max((_version(line) for line in new.values()), default=0)
        if new == held:  # nothing to run anew (what it learnt is kept)
            self.state.floor = floor
            self._save()
            return False
        try:
            _effective(self.config_path, _overlay(new, keys))
        except (ShorelinkError, ValueError) as exc:
            for s in want:
                self.state.refused[s] = got[s].version if s in got else 0
            self.state.failure = f"version {version} refused: {exc}"
            log.warning("fleet_config_refused", version=version, reason=str(exc))
            self._save()
            return False
        self.state.previous = {
            "version": self.state.version,
            "lines": dict(held),
            "floor": dict(self.state.floor),
        }
        self.state.version, self.state.lines, self.state.floor = version, new, floor
        self.state.failure, self.state.trial = None, "pending"
        self._save()
        log.info(
            "fleet_config_applied",
            version=version,
            scopes=",".join(got),
            ended=",".join(ends),
            rotations=len(keys.rotations),
        )
        if self.on_applied is not None:
            self.on_applied()
        return True


def load_effective(config_path: Path) -> tuple[EdgeConfig, FleetConfig | None]:
    """The agent's config at start: edge.toml, with the fleet's configuration the ship
    holds over it when ``uplink.fleet_pub_file`` is set."""
    base = load_config(config_path)
    if base.uplink.fleet_pub_file is None:
        return base, None
    fleet = FleetConfig(Path(config_path), base)
    return fleet.effective(base), fleet


def health_deadline(cfg: EdgeConfig) -> float:
    return time.monotonic() + cfg.uplink.fleet_health_s
