"""What ships do to computers over a long voyage: the agent restarted with a config that
renames or removes a stream, the disk filling up while the link is down and then space
freed. Each with a clear log line and counters; nothing acknowledged is lost."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from edge_agent.agent import Agent
from edge_agent.clock import SteadyClock
from edge_agent.config import load_config
from edge_agent.status import open_log
from local_stack.mosquitto import MosquittoBroker
from shorelink.ranges import RangeSet
from tests.edge_agent.helpers import Publisher, edge_config_doc
from tests.edge_agent.memory_gateway import MemoryGateway
from tests.helpers import eventually_async, write_toml


def _uplink(link: str = "port_wifi") -> dict[str, Any]:
    """The ``[uplink]`` and ``[[gateways]]`` sections: one gateway, ``tokyo``, over ``link``."""
    return {
        "uplink": {
            "token": "t",
            "interval": "200ms",
            "linger": "10ms",
            "retry_min": "50ms",
            "retry_max": "300ms",
        },
        "gateways": [{"site": "tokyo", "url": "http://127.0.0.1:9", "link": link}],
    }


async def _ingest_only(cfg_path: Path, publisher: Publisher, n: int) -> None:
    """The agent without gateways (at sea, link down): ``n`` container readings."""
    agent = Agent(load_config(cfg_path))
    task = asyncio.create_task(agent.run(install_signals=False))
    await asyncio.wait_for(agent.ingest.connected.wait(), 20)
    await asyncio.to_thread(publisher.readings, 1, n, keys=7)
    await eventually_async(lambda: agent.log.stream_state("containers").count == n, within=20)
    agent.stop.set()
    await asyncio.wait_for(task, 15)


@pytest.mark.parametrize("change", ["removed", "renamed"])
async def test_a_stream_removed_or_renamed_in_the_config_still_sends_its_backlog(
    tmp_path: Path,
    mosquitto: MosquittoBroker,
    publisher: Publisher,
    change: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The ship's operator edits the config while 60 readings of ``containers`` wait
    for a link, and restarts the agent: the old stream's backlog still goes ashore under
    its own name (its records' identity), once; a renamed stream's new readings start
    their own seqs."""
    doc = edge_config_doc(tmp_path, mosquitto)
    cfg_path = write_toml(tmp_path / "edge.toml", doc)
    await _ingest_only(cfg_path, publisher, 60)
    streams, rules = doc["streams"], doc["rules"]
    if change == "removed":
        # the stream and its rule go; the sensors' topic is then quarantined
        del streams["containers"]
        rules[:] = [r for r in rules if r["stream"] != "containers"]
    else:
        streams["boxes"] = streams.pop("containers")
        for r in rules:
            if r["stream"] == "containers":
                r["stream"] = "boxes"
    write_toml(cfg_path, {**doc, **_uplink()})
    cfg = load_config(cfg_path)
    assert "containers" not in cfg.streams
    gw = MemoryGateway("tokyo", "port_wifi", streams=("alerts", "nav", "containers", "boxes"))
    caplog.set_level(logging.WARNING, logger="edge_agent.uplink")
    agent = Agent(cfg, gateways=[gw])
    task = asyncio.create_task(agent.run(install_signals=False))
    try:
        await asyncio.wait_for(agent.ingest.connected.wait(), 20)
        await eventually_async(lambda: gw.held("containers") == RangeSet([(1, 60)]), within=20)
        if change == "renamed":
            await asyncio.to_thread(publisher.readings, 61, 70, keys=7)
            await eventually_async(lambda: gw.held("boxes") == RangeSet([(1, 10)]), within=20)
        assert max(gw.arrivals.values()) == 1  # every record once
        metrics = generate_latest(agent.metrics.registry).decode()
        assert 'shorelink_edge_backlog_records{stream="containers"}' in metrics
    finally:
        agent.stop.set()
        await asyncio.wait_for(task, 15)
    lines = [r.getMessage() for r in caplog.records if "stream_unconfigured" in r.getMessage()]
    assert lines and "stream=containers backlog_records=60" in lines[0]
    # the log still answers for it: status lists the stream, nothing waiting
    edge_log = open_log(cfg, readonly=True)
    try:
        assert edge_log.backlog("containers")[0] == 0
    finally:
        edge_log.close()


# -- the disk fills up while the link is down ---------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 8 MB filesystem (tmpfs) for the log, 6 MB of it taken by ``ballast``
    (something else on the ship's disk): the disk really fills up."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], check=True)
    try:
        (mnt / "ballast").write_bytes(b"\0" * 6 * 1024 * 1024)
        yield mnt
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            subprocess.run(["umount", "-l", str(mnt)], check=True)


async def test_the_disk_fills_while_the_link_is_down_then_space_is_freed(
    tmp_path: Path,
    small_disk: Path,
    mosquitto: MosquittoBroker,
    publisher: Publisher,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Days of readings pile up at sea until the disk is full (something else on the
    ship's disk took most of it): the agent stops acknowledging (the broker keeps the
    readings), says so (``shorelink_edge_log_full`` 1, a log line) and keeps running;
    when space is freed it takes in what the broker kept, and once the link is back
    every reading the sensors published is ashore exactly once."""
    ballast = small_disk / "ballast"
    doc = edge_config_doc(tmp_path, mosquitto, log_path=small_disk / "edge.db")
    cfg_path = write_toml(tmp_path / "edge.toml", {**doc, **_uplink()})
    cfg = load_config(cfg_path)
    gw = MemoryGateway("tokyo", "port_wifi", down=True)  # at sea: no link
    caplog.set_level(logging.WARNING)
    agent = Agent(cfg, gateways=[gw])
    task = asyncio.create_task(agent.run(install_signals=False))
    published = 0
    try:
        await asyncio.wait_for(agent.ingest.connected.wait(), 20)

        def full() -> bool:
            return "shorelink_edge_log_full 1.0" in generate_latest(agent.metrics.registry).decode()

        # publish in rounds (bounded) until the disk is full: the broker stops getting
        # acknowledgements for what the agent cannot store, and keeps it
        big = "x" * 2000
        for _round in range(40):
            lo = published + 1
            published += 200
            for i in range(lo, published + 1):
                publisher.publish(
                    f"bigblue/d1/containers/C{i % 7}/env",
                    f'{{"ts": 1700000000, "i": {i}, "pad": "{big}"}}'.encode(),
                )
            await asyncio.sleep(0.3)
            if full():
                break
        assert full(), "the disk never filled"
        stored_when_full = agent.log.stream_state("containers").count
        assert 0 < stored_when_full < published
        assert any("full" in r.getMessage() for r in caplog.records)
        await asyncio.sleep(1.0)
        assert task.done() is False  # still running, still holding on

        # space freed, then the link comes back
        os.unlink(ballast)
        await eventually_async(lambda: not full(), within=30)
        await eventually_async(
            lambda: agent.log.stream_state("containers").count == published, within=60
        )
        gw.down = False
        await eventually_async(
            lambda: gw.held("containers") == RangeSet([(1, published)]), within=60
        )
        assert max(gw.arrivals.values()) == 1
        received = sorted(
            int(r.payload.split(b'"i": ')[1].split(b",")[0])
            for r in gw.records["containers"].values()
        )
        assert received == list(range(1, published + 1))  # every reading, none twice
    finally:
        agent.stop.set()
        await asyncio.wait_for(task, 30)
        shutil.rmtree(small_disk / "edge.db-wal", ignore_errors=True)


# -- a day at sea, time sped up -----------------------------------------------------------

#: 24 hours of the ship's clock in about 24 s of wall time
SPEED = 3600.0
DAY_START = 1_767_268_800.0  # 2026-01-01T12:00:00Z: the voyage crosses one UTC midnight
#: far less than the day's positions take, however well they compress
SAT_BUDGET = 6_000


class FastClock(SteadyClock):
    """The ship's clock running ``SPEED`` times faster, from ``DAY_START``."""

    def __init__(self) -> None:
        m0 = time.monotonic()
        super().__init__(
            wall=lambda: DAY_START + (time.monotonic() - m0) * SPEED,
            monotonic=lambda: (time.monotonic() - m0) * SPEED,
        )

    def hours(self) -> float:
        return (self.now() - DAY_START) / 3600


async def test_a_day_at_sea_holds_the_satellite_budget_each_utc_day(
    tmp_path: Path, mosquitto: MosquittoBroker, publisher: Publisher
) -> None:
    """24 hours at sea, on the satellite only, with more position reports than the
    budget carries: each UTC day's spend stays within the day's budget, the budget is
    used again after midnight, the log stays within its size, nothing is refused."""
    doc = edge_config_doc(tmp_path, mosquitto, max_bytes=3_000_000, reserve=500_000)
    satellite = {
        "daily_budget_bytes": SAT_BUDGET,
        "batch_max_records": 50,
        "batch_max_bytes": "8KiB",
    }
    cfg_path = write_toml(
        tmp_path / "edge.toml",
        {**doc, **_uplink("satellite"), "links": {"satellite": satellite}},
    )
    cfg = load_config(cfg_path)
    clock = FastClock()
    gw = MemoryGateway("tokyo", "satellite")
    agent = Agent(cfg, gateways=[gw], clock=clock)
    task = asyncio.create_task(agent.run(install_signals=False))
    published = 0
    try:
        await asyncio.wait_for(agent.ingest.connected.wait(), 20)
        # positions every few ship minutes, in rounds, until 24 h have passed
        while clock.hours() < 24 and published < 8000:
            for _ in range(20):
                published += 1
                publisher.publish(
                    "bigblue/nav/ais",
                    f'{{"lat": {published % 90}.5, "lon": 140.25, "n": {published}, '
                    f'"fix": "{os.urandom(8).hex()}"}}'.encode(),
                )
            await asyncio.sleep(0.1)
        await asyncio.to_thread(publisher.wait_all_acked)
        await eventually_async(lambda: agent.log.stream_state("nav").count == published, within=20)
        days = {d: agent.log.links.spend("satellite", d) for d in ("2026-01-01", "2026-01-02")}
        held = gw.held("nav").count()
    finally:
        agent.stop.set()
        await asyncio.wait_for(task, 15)
    assert all(0 < spent <= SAT_BUDGET for spent in days.values()), days
    # the budget binds (not everything went), and it was used again after midnight
    assert 0 < held < published
    assert days["2026-01-02"] > SAT_BUDGET // 2, days
    st = agent.log.stream_state("nav")
    assert st.rejected == 0 and st.bytes <= cfg.log.max_bytes
