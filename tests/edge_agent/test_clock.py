"""Clocks that jump: a ship's clock set days ahead must not expire every undelivered
record or open a fresh satellite budget, and one set back must not reopen a day already
spent. Durations follow monotonic time, dates follow the wall clock only while it
moves with it."""

from __future__ import annotations

from pathlib import Path

from edge_agent.agent import Agent
from edge_agent.budget import LinkBudget
from edge_agent.clock import SteadyClock
from edge_agent.config import LinkConfig, load_config
from edge_agent.log import Incoming
from edge_agent.status import open_log
from tests.edge_agent.memory_gateway import MemoryGateway
from tests.edge_agent.uplink_helpers import uplink_config
from tests.helpers import write_toml

DAY = 86_400.0
T0 = 1_714_564_800.0  # 2024-05-01T12:00Z


class FakeTime:
    """A wall clock and a monotonic clock the test moves (separately: a jump)."""

    def __init__(self) -> None:
        self.wall_s = T0
        self.mono_s = 1000.0

    def wall(self) -> float:
        return self.wall_s

    def mono(self) -> float:
        return self.mono_s

    def elapse(self, seconds: float) -> None:
        """Time passes: both clocks move."""
        self.wall_s += seconds
        self.mono_s += seconds

    def jump(self, seconds: float) -> None:
        """Someone sets the wall clock: only it moves."""
        self.wall_s += seconds


def _config(tmp_path: Path) -> Path:
    return write_toml(
        tmp_path / "edge.toml",
        {
            "ship": "bigblue",
            "mqtt": {"port": 1},
            "log": {"path": str(tmp_path / "edge.db")},
            "metrics": {"port": 0},
            "streams": {
                "alerts": {"priority": 0},
                "containers": {"priority": 50, "max_age": "2d", "on_full": "drop_oldest"},
            },
            "rules": [{"filter": "#", "stream": "containers"}],
        },
    )


def _record(n: int, recv_s: float) -> Incoming:
    ms = int(recv_s * 1000)
    return Incoming("containers", "c1", ms, ms, "bigblue/c1/env", f"{n}".encode())


def test_forward_jump_does_not_expire_undelivered_records_but_time_passing_does(
    tmp_path: Path,
) -> None:
    """A clock set five days ahead used to drop every undelivered drop_oldest record
    (max_age 2 days) at the next sweep."""
    t = FakeTime()
    agent = Agent(load_config(_config(tmp_path)), clock=SteadyClock(t.wall, t.mono))
    agent.log.commit([_record(n, t.wall_s) for n in range(10)])
    agent.expire()  # the first sweep: nothing is old
    t.elapse(60)
    t.jump(5 * DAY)
    assert agent.expire() == {}
    assert agent.log.stream_state("containers").count == 10
    # a record received after the jump carries the jumped clock's time
    agent.log.commit([_record(10, t.wall_s)])
    t.elapse(DAY)
    assert agent.expire() == {}
    t.elapse(DAY + 60)  # two days and two minutes since the first ten arrived
    assert agent.expire() == {"containers": 10}
    assert [r.payload for r in agent.log.read("containers", 1, 100)] == [b"10"]
    assert agent.metrics.clock_skew._value.get() == 5 * DAY
    agent.log.close()


def test_backward_jump_expires_nothing_early(tmp_path: Path) -> None:
    """Set back a day, the clock makes new records look a day older than the old ones:
    ages must not shrink either way into an early drop."""
    t = FakeTime()
    agent = Agent(load_config(_config(tmp_path)), clock=SteadyClock(t.wall, t.mono))
    agent.log.commit([_record(0, t.wall_s)])
    agent.expire()
    t.elapse(60)
    t.jump(-DAY)
    agent.log.commit([_record(1, t.wall_s)])
    t.elapse(2 * DAY - 120)  # neither is two days old, by any clock
    assert agent.expire() == {}
    # both are two days old by the clock that stamped them once it shows two days more
    # than the first's stamp (the first expires a day late: never early)
    t.elapse(DAY + 240)
    assert agent.expire() == {"containers": 2}
    agent.log.close()


async def test_budget_day_follows_time_passing_not_the_clock_jumping(tmp_path: Path) -> None:
    """The satellite plan allows 10 kB a day: setting the clock ahead must not hand the
    link another 10 kB, setting it back must not reopen a spent day."""
    t = FakeTime()
    cfg = uplink_config(
        tmp_path,
        gateways=[("hq", "satellite")],
        links={"satellite": {"daily_budget_bytes": 10_000}},
    )
    agent = Agent(
        cfg, gateways=[MemoryGateway("hq", "satellite")], clock=SteadyClock(t.wall, t.mono)
    )
    assert agent.uplink is not None
    b = agent.uplink.budgets["satellite"]
    log = agent.log
    await b.charge(10_000)
    b.mark_spent_out()
    assert (b.day, b.remaining(), b.spent_out) == ("2024-05-01", 0, True)
    t.elapse(60)
    t.jump(3 * DAY)
    assert (b.day, b.remaining(), b.spent_out) == ("2024-05-01", 0, True)
    t.elapse(60)
    t.jump(-5 * DAY)
    assert (b.day, b.remaining(), b.spent_out) == ("2024-05-01", 0, True)
    assert b.seconds_to_next_day() == 12 * 3600 - 120
    t.elapse(12 * 3600)  # midnight passes for real
    assert (b.day, b.remaining(), b.spent_out) == ("2024-05-02", 10_000, False)
    await b.charge(4000)
    assert log.links.spend("satellite", "2024-05-02") == 4000
    log.close()


def test_budget_day_never_goes_back_even_on_a_clock_it_is_given(tmp_path: Path) -> None:
    now = [T0 + DAY]
    log = open_log(uplink_config(tmp_path))
    b = LinkBudget(
        LinkConfig("satellite", daily_budget_bytes=10_000), log.links, clock=lambda: now[0]
    )
    assert b.day == "2024-05-02"
    now[0] -= DAY
    assert b.day == "2024-05-02"
    log.close()


def test_steady_clock_follows_the_wall_clock_while_it_moves_with_monotonic_time() -> None:
    t = FakeTime()
    c = SteadyClock(t.wall, t.mono)
    assert c.now() == T0
    t.elapse(3600)
    t.jump(2)  # NTP-size corrections are not jumps
    assert c.now() == T0 + 3602 and c.jumps == 0
    t.jump(-DAY)
    t.elapse(10)
    assert c.now() == T0 + 3612 and c.jumps == 1
    assert c.retention_now() == T0 + 3612 - DAY
