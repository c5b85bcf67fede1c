"""The ship report (shorelink/ship_report.py): every ``report.interval`` the agent
writes its own state as a record of the report stream, in its log like a sensor
reading, so it reaches every site by the way everything else does.

It is built from the same facts as ``shorelink-edge status`` (edge_agent/status.py):
per stream the last seq and the records no site has confirmed; per link class today's
spend and budget; the link class of the gateway the ship last reached.
"""

from __future__ import annotations

import logging
import time

from edge_agent.config import EdgeConfig
from edge_agent.log import EdgeLog, Incoming
from edge_agent.status import collect_status
from shorelink.ship_report import REPORT_MQTT_TOPIC, ShipReport, encode_report

__all__ = ["build_report", "write_report"]

log = logging.getLogger(__name__)


def build_report(cfg: EdgeConfig, edge_log: EdgeLog, now_ms: int | None = None) -> ShipReport:
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
    )


def write_report(cfg: EdgeConfig, edge_log: EdgeLog) -> int:
    """Write one report to the log (its own transaction); the record's seq (0: the
    stream's disk budget refused it)."""
    now_ms = int(time.time() * 1000)
    payload = encode_report(build_report(cfg, edge_log, now_ms))
    m = Incoming(cfg.report.stream, cfg.ship, now_ms, now_ms, REPORT_MQTT_TOPIC, payload)
    result = edge_log.commit([m])
    seq = result.seqs[0]
    log.info("event=ship_report stream=%s seq=%d bytes=%d", cfg.report.stream, seq, len(payload))
    return seq
