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
from shorelink.config import load_toml
from shorelink.errors import ConfigError, ShorelinkError
from shorelink.files import write_atomic
from shorelink.fleet.entry import RegistryError, decode_entry
from shorelink.fleet.log import read_anchor
from shorelink.fleet.shipconfig import (
    ConfigOffer,
    decode_delta,
    document_of,
    merge_documents,
    request_json,
    verify_config_entry,
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

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "lines": self.lines,
            "failure": self.failure,
            "refused": self.refused,
            "trial": self.trial,
            "previous": self.previous,
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
        )
    except FileNotFoundError:
        return ShipConfigState()
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(str(path), f"not the agent's fleet configuration: {exc}") from None


def _version(line: str) -> int:
    return decode_entry(line.encode()).version


def _overlay(lines: Mapping[str, str], anchor: str) -> dict[str, Any]:
    """The documents of ``lines`` merged in order (each checked against the fleet key
    again: the file is on the ship's disk)."""
    return merge_documents(
        [document_of(verify_config_entry(line.encode(), anchor, s)) for s, line in lines.items()]
    )


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
        self.anchor = read_anchor(base.uplink.fleet_pub_file)
        self.path = Path(f"{base.log.path}.fleet.json")
        self.state = _read_state(self.path)
        #: set by the agent: called once a change is applied (the agent restarts)
        self.on_applied: Callable[[], None] | None = None
        self._busy = False
        self._asked: ConfigOffer | None = None
        #: (scopes, version) offered for port links only and left for one
        self.waiting_for_port: set[tuple[str, int]] = set()

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
            return _effective(self.config_path, _overlay(self.state.lines, self.anchor))
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
        bad = dict(self.state.lines)
        log.warning("fleet_config_rolled_back", version=self.state.version, reason=why)
        for scope, line in bad.items():
            if prev["lines"].get(scope) != line:
                self.state.refused[scope] = _version(line)
        self.state.version = int(prev["version"])
        self.state.lines = dict(prev["lines"])
        self.state.failure = (
            f"version {max(self.state.refused.values(), default=0)} rolled back: {why}"
        )
        self.state.trial, self.state.previous = "", None
        self._save()

    # -- at a gateway's offer -------------------------------------------------------------
    def wanted(self, offer: ConfigOffer, link: LinkConfig) -> dict[str, int | None] | None:
        """The scopes to fetch (and the version held of each), or None: nothing new,
        refused before, or for port links only and ``link`` is not one."""
        held = {s: _version(line) for s, line in self.state.lines.items()}
        want = {
            s: held.get(s)
            for s, (v, _port) in offer.items()
            if held.get(s) != v and self.state.refused.get(s) != v
        }
        if not want:
            return None
        if not is_port_link(link) and any(offer[s][1] for s in want):
            key = (",".join(sorted(want)), max(offer[s][0] for s in want))
            if key not in self.waiting_for_port:
                self.waiting_for_port.add(key)
                log.info("fleet_config_waits_for_port", link=link.name, scopes=key[0])
            return None
        return want

    async def offered(self, gw: ConfigSource, link: LinkConfig, budget: LinkBudget) -> None:
        """Fetch, check and apply what ``gw`` offers, if anything is new. The bytes
        both ways are counted against ``budget``."""
        offer = gw.config_offer
        if offer is None or self._busy or self.state.trial or offer is self._asked:
            return  # once per offer: a gateway's answer refused is not asked for again
        # on the same connection (the next one brings a new offer)
        want = self.wanted(offer, link)
        if want is None:
            return
        request = request_json(want)
        if not budget.fits(len(request) + 1024):
            return  # today's budget: the configuration waits for tomorrow or a port
        self._busy, self._asked = True, offer
        try:
            await budget.charge(len(request))
            answer = await gw.fetch_config(request)
            await budget.charge(len(answer))
            log.info("fleet_config_fetched", site=gw.site, bytes=len(request) + len(answer))
            await asyncio.to_thread(self.take, offer, want, answer)
        finally:
            self._busy = False

    def take(self, offer: ConfigOffer, want: Mapping[str, int | None], answer: bytes) -> bool:
        """Check and apply an answer; True if applied (the agent then restarts)."""
        bases = [self.state.lines.get(s, "").encode() for s in want]
        try:
            lines = decode_delta(answer, bases)
            if len(lines) != len(want):
                raise ValueError(f"{len(lines)} entries for {len(want)} scopes")
            got: dict[str, str] = {}
            for scope, line in zip(want, lines, strict=True):
                entry = verify_config_entry(line, self.anchor, scope)
                if entry.version != offer[scope][0]:
                    raise RegistryError(
                        f"version {entry.version} where {offer[scope][0]} was offered",
                        version=entry.version,
                    )
                got[scope] = line.decode()
        except (ValueError, RegistryError) as exc:
            # a gateway that serves what the fleet did not sign: nothing applied, not
            # remembered (another gateway may serve the genuine entry)
            self.state.failure = f"refused: {exc}"
            log.warning("fleet_config_refused", reason=str(exc))
            self._save()
            return False
        new = {
            s: got.get(s, self.state.lines.get(s, ""))
            for s in offer
            if s in got or s in self.state.lines
        }
        version = max(offer[s][0] for s in new)
        try:
            _effective(self.config_path, _overlay(new, self.anchor))
        except (ShorelinkError, ValueError) as exc:
            for s in got:
                self.state.refused[s] = offer[s][0]
            self.state.failure = f"version {version} refused: {exc}"
            log.warning("fleet_config_refused", version=version, reason=str(exc))
            self._save()
            return False
        self.state.previous = {"version": self.state.version, "lines": dict(self.state.lines)}
        self.state.version, self.state.lines = version, new
        self.state.failure, self.state.trial = None, "pending"
        self._save()
        log.info("fleet_config_applied", version=version, scopes=",".join(got))
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
