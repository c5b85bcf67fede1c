"""A day at sea, time sped up: the ship's agent over 24 hours of its own clock (run
``--speed`` times faster), on the satellite only, against a real gateway and Kafka. The
figures: each UTC day's satellite spend against its budget, and whether the log's size,
the agent's RSS and its CPU per ship-hour stay flat from the first hours to the last.

The agent runs as a process of its own (``--role agent``), with its clock sped up
(edge_agent/clock.py ``SteadyClock`` over a faster wall and monotonic time), so its RSS
and CPU are its own; the sensors publish to its Mosquitto from this process at a ship's
rate (container readings that wait for port, and positions and alerts the satellite
carries), for 24 ship-hours, then stop. The log's budget is small so that it fills
within the day: from then on its size must hold.

Peers side by side: hours 12 to 18 of the day (the log has filled by then) against
hours 18 to 24 (RSS, CPU per ship-hour, log bytes), each UTC day's spend against the
budget, and per stream what the sensors published against what the log numbered
(kept, or dropped oldest-first by the budget: never refused, never missing).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tomli_w
from _common import (
    add_run_options,
    agent_metrics_and_streams,
    bench_parser,
    fill_defaults,
    progress,
    r3,
    run_bench,
)
from _stack import Stack, start_role

from local_stack.mosquitto import start_mosquitto
from local_stack.process import Proc
from shorelink.files import write_atomic

SHIP = "bigblue"
DAY_START = 1_767_268_800.0  # 2026-01-01T12:00:00Z: the day crosses one UTC midnight
CLK_TICK = 100  # /proc/<pid>/stat counts CPU in clock ticks (USER_HZ)


def edge_toml(
    work: Path, mqtt_port: int, gw_url: str, token: str, budget: int, log_bytes: int
) -> str:
    return tomli_w.dumps(
        {
            "ship": SHIP,
            "log_level": "warning",
            "mqtt": {"port": mqtt_port},
            "log": {
                "path": str(work / "edge.db"),
                "max_bytes": log_bytes,
                "alerts_reserve_bytes": log_bytes // 10,
            },
            "uplink": {
                "token": token,
                "interval": "1s",
                "retry_min": "100ms",
                "retry_max": "2s",
                "encode_workers": 0,
                "seal_records": 0,
            },
            "links": {
                "satellite": {
                    "streams": ["alerts", "nav"],
                    "daily_budget_bytes": budget,
                    "batch_max_records": 200,
                    "batch_max_bytes": "16KiB",
                }
            },
            "gateways": [{"site": "hq", "url": gw_url, "link": "satellite"}],
            **agent_metrics_and_streams(0),
            "rules": [
                {"filter": f"{SHIP}/containers/+/env", "stream": "containers", "key": "{3}"},
                {"filter": f"{SHIP}/nav/position", "stream": "nav", "key": "position"},
            ],
        }
    )


async def agent_role(config: Path, speed: float) -> None:
    """The agent with its clock ``speed`` times faster from :data:`DAY_START`."""
    from edge_agent.agent import Agent
    from edge_agent.clock import SteadyClock
    from edge_agent.config import load_config
    from shorelink.logs import configure_logging

    cfg = load_config(config)
    configure_logging(cfg.log_level)
    m0 = time.monotonic()
    clock = SteadyClock(
        wall=lambda: DAY_START + (time.monotonic() - m0) * speed,
        monotonic=lambda: (time.monotonic() - m0) * speed,
    )
    agent = Agent(cfg, clock=clock)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, agent.stop.set)
    await agent.run(install_signals=False)


def _proc_sample(pid: int) -> tuple[float, float]:
    """(RSS in MB, CPU seconds) of ``pid``."""
    rss_kb = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss_kb = int(line.split()[1])
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / CLK_TICK
    return rss_kb / 1024, cpu


def _query(db: Path, sql: str) -> list[tuple[Any, ...]]:
    """Rows of ``sql`` from the agent's log, read-only (the agent may be writing)."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def _spend(db: Path) -> dict[str, int]:
    rows = _query(db, "SELECT day, bytes FROM link_budget WHERE link = 'satellite'")
    return {d: int(b) for d, b in sorted(rows)}


def _stored(db: Path) -> dict[str, Any]:
    """Per stream: the last seq the log handed out and what its budget dropped."""
    rows = _query(db, "SELECT name, next_seq - 1, count, dropped, rejected FROM streams")
    return {n: {"last_seq": s, "kept": c, "dropped": d, "rejected": r} for n, s, c, d, r in rows}


def _log_bytes(work: Path) -> int:
    return sum(p.stat().st_size for p in work.glob("edge.db*") if p.is_file())


class Bench:
    def __init__(self, work: Path, a: argparse.Namespace, say: Any) -> None:
        self.work = work
        self.a = a
        self.say = say
        self.stack = Stack(work, [SHIP], say)
        self.procs: list[Proc] = []

    def cleanup(self) -> None:
        for p in self.procs:
            p.stop(grace=10)
        self.stack.cleanup()

    def run(self) -> dict[str, Any]:
        a, say = self.a, self.say
        self.stack.start()
        self.procs += self.stack.procs
        broker = start_mosquitto(SHIP, self.work / "mosquitto", self.work / "logs")
        self.procs.append(broker.proc)
        config = self.work / "edge.toml"
        text = edge_toml(
            self.work,
            broker.port,
            self.stack.gw_url,
            self.stack.tokens[SHIP],
            a.budget,
            a.log_bytes,
        )
        write_atomic(config, text, mode=0o600)  # it holds the ship's token
        agent = start_role(
            __file__, "agent", "agent", config, self.work / "logs", "--speed", str(a.speed)
        )
        self.procs.append(agent)
        time.sleep(2)
        pub = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="sensors", clean_session=True)
        pub.connect("127.0.0.1", broker.port)
        pub.loop_start()
        hour_s = 3600 / a.speed  # wall seconds per ship-hour
        samples: list[dict[str, Any]] = []
        published = {"containers": 0, "nav": 0}
        t0 = time.monotonic()
        next_sample = t0
        hours = 0.0
        say(f"24 ship-hours at {a.speed:g}x: {24 * hour_s:.0f} s")
        while hours < 24:
            # a ship-minute of readings per round: every container once, a position
            for c in range(a.containers):
                pub.publish(
                    f"{SHIP}/containers/C{c:05d}/env",
                    json.dumps({"t": 4.5, "h": 60, "door": 0, "shock": 0.1, "c": c}),
                    qos=1,
                )
            published["containers"] += a.containers
            pub.publish(f"{SHIP}/nav/position", json.dumps({"lat": 10.5, "lon": 140.25}), qos=1)
            published["nav"] += 1
            # one ship-minute of wall time per round
            time.sleep(max(0.0, t0 + (published["nav"] * hour_s / 60) - time.monotonic()))
            hours = (time.monotonic() - t0) / hour_s
            if time.monotonic() >= next_sample:
                next_sample += hour_s / 2
                rss, cpu = _proc_sample(agent.pid)
                samples.append(
                    {
                        "hour": round(hours, 2),
                        "rss_mb": round(rss, 1),
                        "cpu_s": cpu,
                        "log_bytes": _log_bytes(self.work),
                    }
                )
                if len(samples) % 8 == 0:
                    say(
                        f"hour {hours:.1f}: rss {rss:.0f} MB, log {samples[-1]['log_bytes'] / 1e6:.1f} MB"
                    )
        pub.loop_stop()
        pub.disconnect()
        spend = _spend(self.work / "edge.db")
        stored = _stored(self.work / "edge.db")
        agent.stop(grace=15)
        # peers: six hours once the log has filled (its file stops growing by hour ~11 of
        # the quick run) against the last six
        first = [r for r in samples if 12 <= r["hour"] < 18]
        last = [r for r in samples if r["hour"] >= 18]

        def mean(rows: list[dict[str, Any]], k: str) -> float:
            return sum(r[k] for r in rows) / len(rows)

        def cpu_per_hour(rows: list[dict[str, Any]]) -> float | None:
            if len(rows) < 2:
                return None
            return (rows[-1]["cpu_s"] - rows[0]["cpu_s"]) / (rows[-1]["hour"] - rows[0]["hour"])

        return {
            "benchmark": "day_at_sea",
            "speed": a.speed,
            "containers": a.containers,
            "published": published,
            "satellite": {
                "daily_budget_bytes": a.budget,
                "spent_per_utc_day": spend,
                "within_budget": all(v <= a.budget for v in spend.values()),
            },
            "log_budget_bytes": a.log_bytes,
            "stored": stored,
            "hours_12_to_18": {
                "rss_mb": r3(mean(first, "rss_mb")),
                "cpu_s_per_ship_hour": r3(cpu_per_hour(first)),
                "log_bytes": int(mean(first, "log_bytes")),
            },
            "hours_18_to_24": {
                "rss_mb": r3(mean(last, "rss_mb")),
                "cpu_s_per_ship_hour": r3(cpu_per_hour(last)),
                "log_bytes": int(mean(last, "log_bytes")),
            },
            "samples": samples,
        }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = bench_parser("day_at_sea", __doc__)
    p.add_argument("--role", choices=["bench", "agent"], default="bench", help=argparse.SUPPRESS)
    p.add_argument("--config", type=Path, help=argparse.SUPPRESS)
    p.add_argument(
        "--speed",
        type=float,
        default=None,
        help="ship seconds per wall second (default 240; quick 720)",
    )
    p.add_argument(
        "--containers", type=int, default=None, help="containers on board (default 300; quick 100)"
    )
    p.add_argument(
        "--budget", type=int, default=60_000, help="satellite bytes a UTC day (default 60000)"
    )
    p.add_argument(
        "--log-bytes", type=int, default=8_000_000, help="the log's budget (default 8 MB)"
    )
    add_run_options(
        p, "24 ship-hours at 720x with 100 containers (about 2 minutes)", "logs, the log"
    )
    a = p.parse_args(argv)
    fill_defaults(a, {"speed": (720.0, 240.0), "containers": (100, 300)})
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.role == "agent":
        asyncio.run(agent_role(a.config, a.speed))
        return 0
    say = progress("day_at_sea")
    return run_bench(say, a.keep, "day-at-sea-", lambda work: Bench(work, a, say))


if __name__ == "__main__":
    sys.exit(main())
