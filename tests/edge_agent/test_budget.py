"""Link budgets: a UTC day's bytes are persisted in the log, a new day starts afresh,
and the rate limit spaces request bodies to ``max_rate``."""

from __future__ import annotations

import time
from pathlib import Path

from edge_agent.budget import LinkBudget, utc_day
from edge_agent.config import LinkConfig
from edge_agent.status import open_log
from tests.edge_agent.uplink_helpers import uplink_config


def test_utc_day_is_utc() -> None:
    assert utc_day(1_714_607_999) == "2024-05-01"  # 23:59:59Z
    assert utc_day(1_714_608_000) == "2024-05-02"


async def test_spend_is_persisted_per_day_and_a_new_day_starts_afresh(tmp_path: Path) -> None:
    """The satellite plan is per day; a restart must not forget what today cost."""
    cfg = uplink_config(tmp_path)
    now = [1_714_564_800.0]  # 2024-05-01T12:00Z
    log = open_log(cfg)
    link = LinkConfig("satellite", daily_budget_bytes=10_000)
    b = LinkBudget(link, log.links, clock=lambda: now[0])
    await b.charge(4000)
    await b.charge(3000)
    assert (b.spent, b.remaining(), b.fits(3000), b.fits(3001)) == (7000, 3000, True, False)
    assert b.seconds_to_next_day() == 12 * 3600
    log.close()
    log = open_log(cfg)
    b = LinkBudget(link, log.links, clock=lambda: now[0])
    assert b.spent == 7000
    b.mark_spent_out()
    assert b.spent_out
    now[0] += 12 * 3600
    assert (b.day, b.spent, b.remaining(), b.spent_out) == ("2024-05-02", 0, 10_000, False)
    assert log.links.spend("satellite", "2024-05-01") == 7000
    log.close()


async def test_unlimited_link_always_fits(tmp_path: Path) -> None:
    log = open_log(uplink_config(tmp_path))
    b = LinkBudget(LinkConfig("port_wifi"), log.links)
    await b.charge(10**9)
    assert b.remaining() is None and b.fits(10**12)
    log.close()


async def test_rate_limit_spaces_bodies_to_max_rate(tmp_path: Path) -> None:
    """A ship's link is shared with the crew and the bridge: the uplink keeps to its rate."""
    log = open_log(uplink_config(tmp_path))
    b = LinkBudget(LinkConfig("cellular", max_rate=20_000), log.links)
    t0 = time.monotonic()
    for _ in range(5):
        await b.pace(5000)  # 25 kB at 20 kB/s: the first goes at once, 4 x 0.25 s after
    assert 0.95 <= time.monotonic() - t0 < 2.0
    log.close()
