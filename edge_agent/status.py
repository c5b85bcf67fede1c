"""What ``shorelink-edge status`` reports: per stream, what the log holds and what shore
has confirmed; read from the log file, so it works while the agent runs."""

from __future__ import annotations

import time
from typing import Any

from edge_agent.config import EdgeConfig
from edge_agent.log import EdgeLog

__all__ = ["collect_status", "open_log"]


def open_log(cfg: EdgeConfig, *, readonly: bool = False) -> EdgeLog:
    return EdgeLog(cfg.log.path, cfg.ship, cfg.streams, cfg.log, readonly=readonly)


def collect_status(cfg: EdgeConfig, edge_log: EdgeLog) -> dict[str, Any]:
    now_ms = int(time.time() * 1000)
    holdings = edge_log.holdings()
    streams: dict[str, Any] = {}
    names = [s.name for s in cfg.by_priority()]
    names += [n for n in edge_log.stream_names() if n not in cfg.streams]
    for name in names:
        st = edge_log.stream_state(name)
        n, nbytes, oldest = edge_log.backlog(name)
        streams[name] = {
            "priority": cfg.streams[name].priority if name in cfg.streams else None,
            "last_seq": st.next_seq - 1,
            "first_seq": edge_log.first_seq(name),
            "records": st.count,
            "bytes": st.bytes,
            "held": {site: str(per[name]) for site, per in sorted(holdings.items()) if name in per},
            "backlog_records": n,
            "backlog_bytes": nbytes,
            "oldest_undelivered_age_s": round((now_ms - oldest) / 1000, 1)
            if oldest is not None
            else None,
            "dropped": st.dropped,
            "retired": st.retired,
            "rejected": st.rejected,
        }
    return {
        "ship": cfg.ship,
        "log": str(cfg.log.path),
        "log_record_bytes": edge_log.total_bytes(),
        "log_budget_bytes": cfg.log.max_bytes,
        "log_file_bytes": edge_log.file_bytes(),
        "quarantined": edge_log.quarantine_count(),
        "streams": streams,
    }
