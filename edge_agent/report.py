"""The ship report (shorelink/ship_report.py): the agent writes its own state as a
record of the report stream, in its log like a sensor reading, so it reaches every site
by the way everything else does. :class:`Reporter` decides when: at start, then when
the state changed (a stream's last seq or backlog, other than the reports' own),
looked at every ``report.interval``, and at least every ``report.heartbeat``. A
ship with nothing new writes nothing new: its reports do not keep its own log busy.

It is built from the same facts as ``shorelink-edge status`` (edge_agent/status.py):
per stream the last seq and the records no site has confirmed; per link class today's
spend and budget; the link class of the gateway the ship last reached; this agent's
version; the id of the upload token it sends (so that headquarters retires the token
before it once the ship uses a new one: docs/fleet-registry.md, "Tokens").
"""

from __future__ import annotations

import time
from collections.abc import Callable

from edge_agent.config import EdgeConfig
from edge_agent.log import EdgeLog, Incoming
from edge_agent.status import collect_status
from shorelink.fleet.entry import hash_token, token_id
from shorelink.logs import get_logger
from shorelink.ship_report import REPORT_MQTT_TOPIC, ReportedConfig, ShipReport, encode_report
from shorelink.version import version

__all__ = ["Reporter", "build_report", "write_report"]

log = get_logger(__name__)


def build_report(
    cfg: EdgeConfig,
    edge_log: EdgeLog,
    now_ms: int | None = None,
    config: ReportedConfig | None = None,
) -> ShipReport:
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    st = collect_status(cfg, edge_log)
    streams = {name: (s["last_seq"], s["backlog_records"]) for name, s in st["streams"].items()}
    links: dict[str, tuple[int, int]] = {}
    latest: tuple[float, str] | None = None
    for g in st["links"]:
        links[g["link"]] = (g["today_bytes"], g["daily_budget_bytes"])
        age = g["last_success_age_s"]
        if age is not None and (latest is None or age < latest[0]):
            latest = (age, g["link"])
    return ShipReport(
        at_ms=now_ms,
        link=latest[1] if latest else None,
        streams=streams,
        links=links,
        log_bytes=st["log_record_bytes"],
        log_budget=st["log_budget_bytes"],
        agent=version(),
        config=config,
        token=_token_id(cfg),
    )


def _token_id(cfg: EdgeConfig) -> str | None:
    """The id of the token the uplink sends (None: it sends none)."""
    token = cfg.uplink.token.value
    return token_id(hash_token(token)) if token else None


def write_report(cfg: EdgeConfig, edge_log: EdgeLog, report: ShipReport | None = None) -> int:
    """Write one report (``report``, or one built now) to the log (its own transaction);
    the record's seq (0: the stream's disk budget refused it)."""
    now_ms = int(time.time() * 1000)
    payload = encode_report(report or build_report(cfg, edge_log, now_ms))
    m = Incoming(cfg.report.stream, cfg.ship, now_ms, now_ms, REPORT_MQTT_TOPIC, payload)
    result = edge_log.commit([m])
    seq = result.seqs[0]
    log.info("ship_report", stream=cfg.report.stream, seq=seq, bytes=len(payload))
    return seq


class Reporter:
    """When to write the next report (see the module's docstring)."""

    def __init__(
        self,
        cfg: EdgeConfig,
        edge_log: EdgeLog,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        config: Callable[[], ReportedConfig] | None = None,
    ) -> None:
        self.cfg = cfg
        #: the fleet configuration the ship runs (edge_agent/fleet_config.py)
        self._config = config
        self.log = edge_log
        self._monotonic = monotonic
        self._last: tuple[object, ...] | None = None
        self._last_at = 0.0

    def _key(self, r: ShipReport) -> tuple[object, ...]:
        own = self.cfg.report.stream
        # not the link: a ship in port probes the satellite too, and the last link to
        # answer flips back and forth without anything to tell
        return (r.config, *sorted((s, v) for s, v in r.streams.items() if s != own))

    def tick(self) -> int | None:
        """Write a report if one is due: its seq (0: refused by the stream's budget),
        None when nothing changed since the last and the heartbeat is not due."""
        config = self._config() if self._config is not None else None
        report = build_report(self.cfg, self.log, config=config)
        key = self._key(report)
        now = self._monotonic()
        if (
            self._last is not None
            and key == self._last
            and now - self._last_at < self.cfg.report.heartbeat_s
        ):
            return None
        seq = write_report(self.cfg, self.log, report)
        self._last, self._last_at = key, now
        return seq
