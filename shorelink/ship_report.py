"""The ship report: what a ship's agent says about itself, as a record of its own.

Every ``report.interval`` the edge agent writes one record to its report stream
(``[report] stream``, ``agent`` in the samples) in its own log, keyed by the ship's name.
It travels like any other record (uploaded by priority, merged, replicated to every
site), so every site's operations page (spark_core/ops/) knows each ship's last word,
whichever port or satellite carried it: where the ship's log is (the last seq of each
stream and how much of it no site has confirmed: the backlog at sea), the link class it
last reached a site over, today's spend of each link class against its budget, and the
agent's version (an upgrade or a rollback at sea seen ashore).

The value is compact JSON (a few hundred bytes: the satellite carries it):

    {"v": 1, "at": <epoch ms>, "link": "satellite" | null,
     "streams": {"nav": [last_seq, backlog_records], ...},
     "links": {"satellite": [spent_today, daily_budget], ...},
     "log": [record_bytes, budget_bytes], "agent": "0.2.0",
     "config": {"version": 7, "failure": null}, "token": "3f0c9a2e71d4b855"}

``agent`` (the agent's version, shorelink/version.py) came after version 1 was out: a
report without it is still a version 1 report (an agent from before), and a site from
before ignores it. ``config`` came after it the same way: the fleet configuration the
ship runs (``version``: the registry version of the configuration applied, 0 for the
one it was installed with) and why the last one it fetched was not applied or was
rolled back (``failure``, at most ``MAX_FAILURE_CHARS`` characters; null: none since it
last applied one). Rollouts (issue 41) read it. ``token`` came after it too: the id of
the upload token the agent sends (the first 16 hex digits of its SHA-256,
``shorelink.fleet.entry.token_id``; never the token): signed by the ship's key like
every record of the ship, it is the ship's word that it uses that token, and
headquarters retires the token before it on it (docs/fleet-registry.md, "Tokens").

:func:`decode_report` is the one reader, and a site reads what arrives from the sea:
anything that is not a report of this shape is a :class:`~shorelink.errors.ContractError`
naming what is wrong, never another exception.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from shorelink import strict_json
from shorelink.boundary import boundary
from shorelink.contract import Record
from shorelink.errors import ContractError
from shorelink.identity import Identity, check_name

__all__ = [
    "MAX_FAILURE_CHARS",
    "MAX_REPORT_BYTES",
    "REPORT_MQTT_TOPIC",
    "REPORT_VERSION",
    "ReportedConfig",
    "ShipReport",
    "decode_report",
    "encode_report",
    "report_record",
]

REPORT_VERSION = 1
#: the record's MQTT topic header: it did not come from the broker, the agent wrote it
REPORT_MQTT_TOPIC = "$shorelink/report"
#: a report larger than this is refused by both sides (a ship with hundreds of streams
#: still fits; far below the record limit of every hop, MAX_RECORD_BYTES)
MAX_REPORT_BYTES = 64 * 1024
#: seqs, byte counts and times are non-negative and fit a signed 64-bit integer
_MAX_INT = 2**63 - 1
#: an agent's version: PEP 440's characters (a local part included), at most 64 of them
_VERSION = re.compile(r"[0-9A-Za-z][0-9A-Za-z.+!_-]{0,63}")
#: a token's id: hex digits of the head of its SHA-256 (shorelink.fleet.entry.token_id)
_TOKEN_ID = re.compile(r"[0-9a-f]{16}")
#: a configuration failure's text: one line an operator reads, cut to this by the writer
MAX_FAILURE_CHARS = 300


@dataclass(frozen=True)
class ReportedConfig:
    """The fleet configuration a ship runs, as its report says it."""

    #: the registry version of the configuration applied (0: the installed edge.toml)
    version: int
    #: why the last configuration fetched was refused or rolled back (None: none was)
    failure: str | None = None

    def __post_init__(self) -> None:
        if self.failure is not None and len(self.failure) > MAX_FAILURE_CHARS:
            cut = self.failure[: MAX_FAILURE_CHARS - 3] + "..."
            object.__setattr__(self, "failure", cut)


@dataclass(frozen=True)
class ShipReport:
    """One ship report, decoded and checked."""

    #: when the agent wrote it (the ship's clock, epoch ms)
    at_ms: int
    #: the link class the ship last reached a site over (None: never)
    link: str | None
    #: per stream: (last seq in the ship's log, records no site has confirmed)
    streams: dict[str, tuple[int, int]]
    #: per link class: (bytes sent today, UTC, daily budget; 0: none)
    links: dict[str, tuple[int, int]]
    #: the log's record bytes and its budget
    log_bytes: int = 0
    log_budget: int = 0
    #: the version of the agent that wrote it (None: an agent from before it said so)
    agent: str | None = None
    #: the fleet configuration it runs (None: an agent from before it said so)
    config: ReportedConfig | None = None
    #: the id of the upload token the agent sends (None: an agent from before it said so)
    token: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The report as the operations page's API shows it."""
        return {
            "at_ms": self.at_ms,
            "link": self.link,
            "streams": {
                s: {"last_seq": last, "backlog": backlog}
                for s, (last, backlog) in sorted(self.streams.items())
            },
            "links": {
                name: {"spent_today": spent, "daily_budget": budget}
                for name, (spent, budget) in sorted(self.links.items())
            },
            "log_bytes": self.log_bytes,
            "log_budget": self.log_budget,
            "agent": self.agent,
            "config": (
                None
                if self.config is None
                else {"version": self.config.version, "failure": self.config.failure}
            ),
            "token": self.token,
        }


def encode_report(report: ShipReport) -> bytes:
    body: dict[str, object] = {
        "v": REPORT_VERSION,
        "at": report.at_ms,
        "link": report.link,
        "streams": {s: list(v) for s, v in sorted(report.streams.items())},
        "links": {s: list(v) for s, v in sorted(report.links.items())},
        "log": [report.log_bytes, report.log_budget],
    }
    if report.agent is not None:
        body["agent"] = report.agent
    if report.config is not None:
        body["config"] = {"version": report.config.version, "failure": report.config.failure}
    if report.token is not None:
        body["token"] = report.token
    out = json.dumps(body, separators=(",", ":")).encode()
    decode_report(out)  # what this side writes, the other side reads
    return out


@boundary
def decode_report(payload: bytes) -> ShipReport:
    """The report in ``payload``; :class:`ContractError` saying why it is not one."""
    if len(payload) > MAX_REPORT_BYTES:
        raise ContractError(f"ship report of {len(payload)} bytes (at most {MAX_REPORT_BYTES})")
    try:
        doc = strict_json.loads(payload)
    except ValueError as exc:  # NaN, nesting too deep, invalid UTF-8 too
        raise ContractError(f"ship report is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ContractError("ship report is not a JSON object")
    if doc.get("v") != REPORT_VERSION:
        raise ContractError(f"ship report version {doc.get('v')!r} (this reads {REPORT_VERSION})")
    link = doc.get("link")
    if link is not None:
        link = _name("link", link, "link")
    log = doc.get("log", [0, 0])
    log_bytes, log_budget = _pair("log", log)
    agent = doc.get("agent")
    if agent is not None and (not isinstance(agent, str) or not _VERSION.fullmatch(agent)):
        raise ContractError(f"ship report agent: expected a version, got {agent!r:.40}")
    token = doc.get("token")
    if token is not None and (not isinstance(token, str) or not _TOKEN_ID.fullmatch(token)):
        raise ContractError(f"ship report token: expected a token's id, got {token!r:.40}")
    return ShipReport(
        at_ms=_count("at", doc.get("at")),
        link=link,
        streams=_pairs("streams", doc.get("streams"), "stream"),
        links=_pairs("links", doc.get("links"), "link"),
        log_bytes=log_bytes,
        log_budget=log_budget,
        agent=agent,
        config=_config(doc.get("config")),
        token=token,
    )


def _config(value: object) -> ReportedConfig | None:
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {"version", "failure"}:
        raise ContractError(f"ship report config: expected {{version, failure}}, got {value!r:.40}")
    failure = value["failure"]
    if failure is not None and (not isinstance(failure, str) or len(failure) > MAX_FAILURE_CHARS):
        raise ContractError(
            f"ship report config.failure: expected text of at most {MAX_FAILURE_CHARS}"
            f" characters or null, got {failure!r:.40}"
        )
    return ReportedConfig(_count("config.version", value["version"]), failure)


def _count(where: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_INT:
        raise ContractError(f"ship report {where}: expected a count, got {value!r:.40}")
    return value


def _name(where: str, value: object, kind: str) -> str:
    if not isinstance(value, str):
        raise ContractError(f"ship report {where}: expected a {kind} name, got {value!r:.40}")
    try:
        return check_name(kind, value)
    except ContractError as exc:
        raise ContractError(f"ship report {where}: {exc}") from None


def _pair(where: str, value: object) -> tuple[int, int]:
    if not isinstance(value, list) or len(value) != 2:
        raise ContractError(f"ship report {where}: expected [a, b], got {value!r:.40}")
    return _count(where, value[0]), _count(where, value[1])


def _pairs(where: str, value: object, kind: str) -> dict[str, tuple[int, int]]:
    if not isinstance(value, dict):
        raise ContractError(f"ship report {where}: expected an object")
    return {_name(where, k, kind): _pair(f"{where}.{k:.63}", v) for k, v in value.items()}


def report_record(ship: str, stream: str, seq: int, report: ShipReport, site: str) -> Record:
    """``report`` as the record a site holds of it, entered at ``site`` (fleet status's
    bench and tests write ship reports into Kafka as a site's merge would)."""
    return Record(
        Identity(ship, stream, seq),
        ship.encode(),
        encode_report(report),
        report.at_ms,
        site,
        REPORT_MQTT_TOPIC,
    )
