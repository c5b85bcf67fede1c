"""Helpers for uplink tests: a config built in code, a log filled with records."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from edge_agent.config import EdgeConfig, parse_config
from edge_agent.gateway import HttpGateway
from edge_agent.log import EdgeLog, Incoming, message_digest
from edge_agent.metrics import EdgeMetrics
from edge_agent.status import open_log
from edge_agent.uplink import Uplink
from tests.helpers import eventually_async

STREAMS = ("alerts", "nav", "containers")


def uplink_config(
    tmp_path: Path,
    *,
    gateways: list[tuple[str, str]] = (),  # type: ignore[assignment]
    links: dict[str, dict[str, Any]] | None = None,
    uplink: dict[str, Any] | None = None,
    log: dict[str, Any] | None = None,
    streams: dict[str, dict[str, Any]] | None = None,
) -> EdgeConfig:
    data: dict[str, Any] = {
        "ship": "bigblue",
        "log": {"path": str(tmp_path / "edge.db"), **(log or {})},
        "metrics": {"port": 0},
        "streams": streams
        or {
            "alerts": {"priority": 0},
            "nav": {"priority": 10},
            "containers": {"priority": 50},
        },
        "rules": [{"filter": "bigblue/+/containers/+/env", "stream": "containers", "key": "{4}"}],
        "uplink": {
            "token": "s3cret-token",
            "interval": "200ms",
            "linger": "5ms",
            "probe_timeout": "2s",
            "retry_min": "10ms",
            "retry_max": "100ms",
            # batches built in a thread here (no child process per test); the agent
            # tests run the default, a child process
            "encode_workers": 0,
            **(uplink or {}),
        },
        "links": links or {},
        "gateways": [
            {"site": site, "url": f"http://127.0.0.1:9/{i}", "link": link}
            for i, (site, link) in enumerate(gateways)
        ],
    }
    return parse_config(data)


def fill(
    edge_log: EdgeLog, stream: str, n: int, *, size: int = 100, random: bool = False
) -> list[int]:
    """Commit ``n`` records of ``stream`` (payloads of ``size`` bytes, incompressible
    when ``random``); return their seqs."""
    out: list[int] = []
    for start in range(0, n, 500):
        batch = []
        for i in range(start, min(n, start + 500)):
            payload = os.urandom(size) if random else f"{stream}-{i:08d}".encode().ljust(size, b".")
            topic = f"bigblue/d1/{stream}/C{i % 7}/env"
            batch.append(
                Incoming(
                    stream,
                    f"C{i % 7}",
                    1_700_000_000_000 + i,
                    1_700_000_000_000 + i,
                    topic,
                    payload,
                    digest=message_digest(topic.encode(), payload),
                )
            )
        out += edge_log.commit(batch).seqs
    return out


#: fleet_sim's real AIS sample: 898 sentences, CRLF ended
AIS_SAMPLE = Path(__file__).resolve().parents[2] / "fleet_sim" / "data" / "nmea_data_sample.txt"


def fill_ais(edge_log: EdgeLog, stream: str, n: int) -> list[bytes]:
    """Commit the first ``n`` sentences of the AIS sample (one a record, CRLF kept, one
    every 3 s, key ``ais``); return their payloads."""
    lines = AIS_SAMPLE.read_bytes().splitlines(keepends=True)[:n]
    topic = "bigblue/ship1/nav/ais"
    at = 1_767_225_600_000
    edge_log.commit(
        [
            Incoming(
                stream,
                "ais",
                at + 3000 * i,
                at + 3000 * i,
                topic,
                line,
                digest=message_digest(topic.encode(), line),
            )
            for i, line in enumerate(lines)
        ]
    )
    return lines


def open_edge_log(cfg: EdgeConfig) -> EdgeLog:
    return open_log(cfg)


async def send_all(
    cfg: EdgeConfig,
    edge_log: EdgeLog,
    http: HttpGateway,
    stream: str,
    gateway: tuple[asyncio.Event, asyncio.Task[None]],
) -> Uplink:
    """Run an uplink over ``http`` until the site holds every record of ``stream`` (at
    most 60 s); then stop it, and the gateway (its stop event and task)."""
    up = Uplink(cfg, edge_log, EdgeMetrics(), asyncio.Event(), gateways=[http])
    up_stop = asyncio.Event()
    task = asyncio.create_task(up.run(up_stop))
    try:
        await eventually_async(
            lambda: edge_log.backlog(stream)[0] == 0, 60, "the site holds every record"
        )
    finally:
        up_stop.set()
        await asyncio.wait_for(task, 10)
        await http.close()
        up.builder.close()
        gateway[0].set()
        await gateway[1]
    return up
