"""The uplink sends what a site lacks, once, highest priority first, within each link's
policy, and resumes after a broken link without resending what a reply confirmed.
Real SQLite logs; the gateway is the in-memory implementation of the seam."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from tenacity import RetryCallState

from edge_agent.batching import BuildFailed
from edge_agent.config import EdgeConfig
from edge_agent.log import EdgeLog
from edge_agent.metrics import EdgeMetrics
from edge_agent.status import open_log
from edge_agent.uplink import Uplink
from shorelink.ranges import RangeSet
from tests.edge_agent.memory_gateway import MemoryGateway
from tests.edge_agent.uplink_helpers import fill, uplink_config
from tests.helpers import eventually_async

PRIORITY = {"alerts": 0, "nav": 10, "containers": 50}


def _uplink(
    cfg: EdgeConfig,
    edge_log: EdgeLog,
    gateways: list[MemoryGateway],
    clock: Callable[[], float] = time.time,
) -> Uplink:
    return Uplink(cfg, edge_log, EdgeMetrics(), asyncio.Event(), gateways=gateways, clock=clock)


def _all(n: int) -> RangeSet:
    return RangeSet([(1, n)])


async def test_sends_everything_once_highest_priority_first(tmp_path: Path) -> None:
    """Alerts must not wait behind a bulk backlog, and a record sent twice is bandwidth
    a ship at sea does not have."""
    cfg = uplink_config(
        tmp_path, gateways=[("tokyo", "port_wifi")], links={"port_wifi": {"batch_max_records": 100}}
    )
    log = open_log(cfg)
    fill(log, "containers", 1000)
    fill(log, "nav", 250)
    fill(log, "alerts", 30)
    gw = MemoryGateway("tokyo", "port_wifi")
    up = _uplink(cfg, log, [gw])
    await up.sync_once()
    for stream, n in (("alerts", 30), ("nav", 250), ("containers", 1000)):
        assert gw.held(stream) == _all(n)
        assert log.holdings()["tokyo"][stream] == _all(n)
    assert max(gw.arrivals.values()) == 1
    order = [r.stream for r in gw.log]
    assert order == sorted(order, key=PRIORITY.__getitem__)
    assert all(r.last - r.first < 100 for r in gw.log)
    sent = len(gw.log)
    await up.sync_once()  # caught up: nothing more goes out
    assert len(gw.log) == sent
    log.close()


@pytest.mark.parametrize(("stream", "at"), [("alerts", 3), ("nav", 4)])
async def test_only_an_alert_overtakes_the_batch_built_ahead(
    tmp_path: Path, stream: str, at: int
) -> None:
    """An alert is worth more than the whole container backlog in front of it: it goes
    right after the batch in flight, not behind the one built ahead of it too (on the
    satellite, a batch is a round trip of 0.6 s and more). A position does not: it goes
    after the batch built ahead (were it to overtake, a container backlog in port would
    go as a trickle of small batches, positions coming every few seconds)."""
    cfg = uplink_config(
        tmp_path,
        gateways=[("tokyo", "port_wifi")],
        links={"port_wifi": {"batch_max_records": 50, "in_flight": 1}},
    )
    log = open_log(cfg)
    fill(log, "containers", 1000)

    def built() -> float:
        (metric,) = up.metrics.uplink_build_seconds.collect()
        return next(x.value for x in metric.samples if x.name.endswith("_count"))

    class Midway(MemoryGateway):
        async def send(self, stream_: str, body: bytes):  # type: ignore[no-untyped-def]
            if len(self.log) == 2:  # batch 3 is on its way
                # the batch after it is built meanwhile, then the record comes
                await eventually_async(lambda: built() >= 4, what="batch 4 built ahead")
                fill(log, stream, 2)
            return await super().send(stream_, body)

    gw = Midway("tokyo", "port_wifi")
    up = _uplink(cfg, log, [gw])
    await up.sync_once()
    order = [r.stream for r in gw.log[:6]]
    assert order.index(stream) == at and order.count(stream) == 1, order
    assert gw.held("containers") == _all(1000) and gw.held(stream) == _all(2)
    assert max(gw.arrivals.values()) == 1
    log.close()


@pytest.mark.parametrize("in_flight", [1, 3])
async def test_an_alert_goes_on_the_wire_while_the_window_is_full_of_bulk(
    tmp_path: Path, in_flight: int
) -> None:
    """An alert committed while every slot of the window holds a bulk batch waiting for
    its answer used to wait for one of those answers: on the satellite a round trip
    plus the batch's transfer, 0.5 s and more. It takes one slot beyond ``in_flight``
    and goes at once; nor does it hold back the next bulk batch while it waits for its
    answer (the site answers in the order batches came); every record arrives once."""
    cfg = uplink_config(
        tmp_path,
        gateways=[("tokyo", "port_wifi")],
        links={"port_wifi": {"batch_max_records": 50, "in_flight": in_flight}},
    )
    log = open_log(cfg)
    fill(log, "containers", 1000)
    gate = asyncio.Semaphore(0)  # one bulk answer per release

    class Slow(MemoryGateway):
        """Stores each batch as it comes, answers in that order, bulk when let."""

        sending = 0
        most = 0
        before: asyncio.Future[None] | None = None
        answered: list[str] = []

        async def send(self, stream_: str, body: bytes):  # type: ignore[no-untyped-def]
            self.sending += 1
            self.most = max(self.most, self.sending)
            before, mine = self.before, asyncio.get_running_loop().create_future()
            self.before = mine
            try:
                result = await super().send(stream_, body)
                if before is not None:
                    await before
                if stream_ != "alerts":
                    await gate.acquire()
                self.answered.append(stream_)
                return result
            finally:
                self.sending -= 1
                mine.set_result(None)

    gw = Slow("tokyo", "port_wifi")
    up = _uplink(cfg, log, [gw])
    task = asyncio.create_task(up.sync_once())

    def bulk_sent() -> int:
        return sum(r.stream == "containers" for r in gw.log)

    try:
        await eventually_async(lambda: gw.sending == in_flight, what="a window full of bulk")
        fill(log, "alerts", 2)
        await eventually_async(lambda: gw.held("alerts") == _all(2), within=5, what="the alert")
        assert [r.stream for r in gw.log] == ["containers"] * in_flight + ["alerts"]
        gate.release()  # the first bulk answer: the next bulk batch goes at once
        await eventually_async(lambda: bulk_sent() == in_flight + 1, within=5, what="bulk")
        if in_flight > 1:
            assert "alerts" not in gw.answered  # (it is behind the bulk in flight)
    finally:
        for _ in range(1000):
            gate.release()
        await asyncio.wait_for(task, 20)
    assert gw.most == in_flight + 1
    assert gw.held("containers") == _all(1000) and gw.held("alerts") == _all(2)
    assert max(gw.arrivals.values()) == 1 and gw.resent_after_confirm == []
    log.close()


async def test_encoded_batches_stay_under_batch_max_bytes(tmp_path: Path) -> None:
    """Records that do not compress: a batch is cut to fit ``batch_max_bytes`` encoded
    (a gateway refuses a larger one), and still everything arrives once."""
    cfg = uplink_config(
        tmp_path,
        gateways=[("tokyo", "port_wifi")],
        links={"port_wifi": {"batch_max_records": 1000, "batch_max_bytes": "8KiB"}},
    )
    log = open_log(cfg)
    fill(log, "containers", 300, size=500, random=True)
    gw = MemoryGateway("tokyo", "port_wifi")
    await _uplink(cfg, log, [gw]).sync_once()
    assert gw.held("containers") == _all(300) and max(gw.arrivals.values()) == 1
    assert max(r.nbytes for r in gw.log) <= 8 * 1024
    assert len(gw.log) >= 300 * 500 // (8 * 1024)
    log.close()


async def test_batches_built_in_a_child_process_which_is_replaced_if_it_dies(
    tmp_path: Path,
) -> None:
    """The default builder: a child process with its own read-only view of the log
    (it must see records committed after it started); killed, it is replaced."""
    cfg = uplink_config(
        tmp_path,
        gateways=[("tokyo", "port_wifi")],
        links={"port_wifi": {"batch_max_records": 100}},
        uplink={"encode_workers": 1},
    )
    log = open_log(cfg)
    fill(log, "containers", 250)
    gw = MemoryGateway("tokyo", "port_wifi")
    up = _uplink(cfg, log, [gw])
    try:
        await up.sync_once()
        assert gw.held("containers") == _all(250)
        (child,) = up.builder.pids()
        assert child != os.getpid()
        fill(log, "containers", 150)
        os.kill(child, signal.SIGKILL)
        with pytest.raises(BuildFailed):
            await up.sync_once()
        await up.sync_once()  # a new child
        assert gw.held("containers") == _all(400) and max(gw.arrivals.values()) == 1
        assert up.builder.pids() not in ([], [child])
    finally:
        up.close()
        log.close()
    assert up.builder.pids() == []


async def test_satellite_carries_only_alerts_and_nav_in_small_batches(tmp_path: Path) -> None:
    """Satellite bytes are expensive: bulk telemetry waits for a port."""
    cfg = uplink_config(tmp_path, gateways=[("hq", "satellite")])
    log = open_log(cfg)
    fill(log, "alerts", 450)
    fill(log, "nav", 300)
    fill(log, "containers", 500)
    gw = MemoryGateway("hq", "satellite")
    await _uplink(cfg, log, [gw]).sync_once()
    assert gw.held("alerts") == _all(450) and gw.held("nav") == _all(300)
    assert not gw.held("containers") and "containers" not in {r.stream for r in gw.log}
    assert max(r.last - r.first + 1 for r in gw.log) <= 200
    log.close()


async def test_daily_budget_holds_within_2_percent_and_survives_restart(tmp_path: Path) -> None:
    """A ship's satellite plan is paid per byte: the budget is a hard limit, and a
    restart (or a crash) must not hand the link a fresh day's worth."""
    budget = 100_000
    cfg = uplink_config(
        tmp_path,
        gateways=[("hq", "satellite")],
        links={"satellite": {"daily_budget_bytes": budget}},
    )
    now = [1_714_564_800.0]  # 2024-05-01T12:00:00Z

    def clock() -> float:
        return now[0]

    log = open_log(cfg)
    fill(log, "alerts", 300, size=200, random=True)
    fill(log, "nav", 300, size=200, random=True)
    gw = MemoryGateway("hq", "satellite")
    await _uplink(cfg, log, [gw], clock).sync_once()
    sent = gw.bytes_received()
    assert budget * 0.98 <= sent <= budget
    assert log.links.spend("satellite", "2024-05-01") == sent
    assert gw.held("alerts") == _all(300)  # alerts first
    log.close()

    log = open_log(cfg)  # restart: today's spend is read back from the log
    up = _uplink(cfg, log, [gw], clock)
    await up.sync_once()
    assert gw.bytes_received() <= budget
    assert log.links.spend("satellite", "2024-05-01") == gw.bytes_received()

    now[0] += 86_400  # the next UTC day: a fresh budget
    await up.sync_once()
    today = log.links.spend("satellite", "2024-05-02")
    assert 0 < today <= budget
    assert gw.bytes_received() == log.links.spend("satellite", "2024-05-01") + today
    assert max(gw.arrivals.values()) == 1
    log.close()


async def test_409_adopts_the_sites_holdings_and_resends_from_there(tmp_path: Path) -> None:
    """A site whose view we had wrong (restored from an older state) tells us what it
    holds; the uplink fills exactly the difference, in the same round (the link is slow
    enough that the batch after the window is looked for before the 409s come back),
    instead of giving up or looping."""
    cfg = uplink_config(
        tmp_path,
        gateways=[("tokyo", "port_wifi")],
        links={"port_wifi": {"batch_max_records": 50, "in_flight": 3}},
    )
    log = open_log(cfg)
    fill(log, "containers", 300)
    log.note_sent("containers", 100)  # the history: 1-100 went out before
    gw = MemoryGateway("tokyo", "port_wifi", latency=0.05)
    gw.written["containers"] = _all(50)
    gw.stale_holdings = {"containers": _all(100)}
    up = _uplink(cfg, log, [gw])
    await up.sync_once()
    assert gw.held("containers") == _all(300)
    assert next(r.first for r in gw.log if r.outcome == "gap") == 101
    assert all(gw.arrivals[("containers", s)] == 1 for s in range(51, 101))
    assert log.holdings()["tokyo"]["containers"] == _all(300)
    log.close()


async def _run_until_delivered(up: Uplink, gw: MemoryGateway, n: int) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(up.run(stop))
    try:
        await eventually_async(lambda: gw.held("containers") == _all(n), what="all delivered")
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def test_broken_link_is_retried_and_nothing_confirmed_is_resent(tmp_path: Path) -> None:
    """A link that breaks mid-way costs at most the batch in flight: the next attempt
    asks the site what arrived, so nothing a reply confirmed goes out again."""
    cfg = uplink_config(
        tmp_path,
        gateways=[("tokyo", "port_wifi")],
        links={"port_wifi": {"batch_max_records": 100, "in_flight": 1}},
    )
    log = open_log(cfg)
    fill(log, "containers", 2000)
    # request lost on the way (resent), reply lost (stored: not resent), probe lost
    gw = MemoryGateway("tokyo", "port_wifi", fail_calls={4: "request", 9: "reply", 12: "x"})
    await _run_until_delivered(_uplink(cfg, log, [gw]), gw, 2000)
    assert gw.resent_after_confirm == []
    # two sends broke: the lost request is resent (one batch), the lost reply is not
    # (the next probe shows the site has it)
    assert gw.records_transmitted() - 2000 == 100
    assert log.holdings()["tokyo"]["containers"] == _all(2000)
    assert log.delivered("containers") == _all(2000)
    log.close()


async def test_pipelined_link_failure_costs_at_most_the_batches_in_flight(tmp_path: Path) -> None:
    """Pipelining helps on high-latency links; a broken connection then costs at most
    ``in_flight`` batches, and still nothing a reply confirmed."""
    cfg = uplink_config(
        tmp_path,
        gateways=[("tokyo", "cellular")],
        links={"cellular": {"batch_max_records": 100, "in_flight": 3}},
    )
    log = open_log(cfg)
    fill(log, "containers", 3000)
    gw = MemoryGateway(
        "tokyo", "cellular", latency=0.01, fail_calls={5: "reply", 6: "request", 15: "request"}
    )
    await _run_until_delivered(_uplink(cfg, log, [gw]), gw, 3000)
    assert gw.resent_after_confirm == []
    assert max(gw.arrivals.values()) == 1
    # two broken connections, each costing at most the 3 batches in flight
    assert 0 < gw.records_transmitted() - 3000 <= 2 * 3 * 100
    log.close()


async def test_confirmed_records_become_retention_eligible(tmp_path: Path) -> None:
    """Records shore holds are the first to go when the disk fills, so what a reply
    confirms must reach the log's holdings; nothing undelivered is dropped meanwhile."""
    cfg = uplink_config(
        tmp_path,
        gateways=[("tokyo", "port_wifi")],
        log={"max_bytes": 80_000, "alerts_reserve_bytes": 1000},
    )
    log = open_log(cfg)
    fill(log, "containers", 300)  # ~50 KB of the 80 KB budget
    gw = MemoryGateway("tokyo", "port_wifi")
    await _uplink(cfg, log, [gw]).sync_once()
    assert log.delivered("containers") == _all(300)
    assert log.backlog("containers")[0] == 0
    fill(log, "containers", 300)  # needs room: delivered records go, none is dropped
    st = log.stream_state("containers")
    assert st.retired > 0 and st.dropped == 0
    log.close()


async def test_first_available_lets_the_site_skip_what_the_ship_dropped(tmp_path: Path) -> None:
    """Records dropped on board by policy can never arrive: the site is told where the
    ship's log starts and stops waiting for the rest."""
    cfg = uplink_config(
        tmp_path,
        gateways=[("tokyo", "port_wifi")],
        log={"max_bytes": 60_000, "alerts_reserve_bytes": 1000},
    )
    log = open_log(cfg)
    fill(log, "containers", 1000)  # drop_oldest: the early ones are dropped
    first, last = log.first_seq("containers"), log.stream_state("containers").next_seq - 1
    assert first > 1
    gw = MemoryGateway("tokyo", "port_wifi")
    await _uplink(cfg, log, [gw]).sync_once()
    assert gw.held("containers") == RangeSet([(first, last)])
    assert gw.abandoned["containers"] == RangeSet([(1, first - 1)])
    assert {r.first_available for r in gw.log} == {first}
    log.close()


async def test_records_retired_after_another_site_confirmed_them_are_skipped(
    tmp_path: Path,
) -> None:
    """A hole in the ship's log (records another site confirmed, then retired) must not
    stall a second site with 409s; it gets the rest, and replication fills the hole."""
    cfg = uplink_config(
        tmp_path,
        gateways=[("tokyo", "port_wifi")],
        log={"max_bytes": 80_000, "alerts_reserve_bytes": 1000},
    )
    log = open_log(cfg)
    fill(log, "containers", 300)
    log.set_holdings("hq", "containers", RangeSet([(101, 200)]))
    fill(log, "containers", 200)  # room is made from hq's 101-200 first
    hole = log.delivered("containers").missing(1, 500)
    assert log.read("containers", 101, 101) == [] and log.first_seq("containers") == 1
    gw = MemoryGateway("tokyo", "port_wifi", streams=("containers",))
    await _uplink(cfg, log, [gw]).sync_once()
    assert not [r for r in gw.log if r.outcome != "ok"]
    present = RangeSet.from_seqs(r.seq for r in log.read("containers", 1, 500, max_records=1000))
    assert gw.held("containers") == present
    held_anywhere = gw.held("containers")
    held_anywhere.update(log.holdings()["hq"]["containers"])
    assert held_anywhere == _all(500) and hole.count() < 500
    log.close()


async def test_cheapest_reachable_link_wins_and_a_cheaper_one_is_picked_up(
    tmp_path: Path,
) -> None:
    """Port Wi-Fi costs nothing and carries everything: the ship uses it as soon as it
    answers, and falls back to satellite (alerts and nav only) while it does not."""
    cfg = uplink_config(tmp_path, gateways=[("hq", "satellite"), ("tokyo", "port_wifi")])
    log = open_log(cfg)
    fill(log, "alerts", 5)
    fill(log, "containers", 100)
    sat = MemoryGateway("hq", "satellite")
    wifi = MemoryGateway("tokyo", "port_wifi", down=True)
    up = _uplink(cfg, log, [sat, wifi])
    await up.sync_once()
    assert sat.held("alerts") == _all(5) and not wifi.held("alerts")
    states = {s.site: s for s in log.links.states()}
    assert not states["tokyo"].up and "refused" in states["tokyo"].last_error
    assert states["hq"].up
    wifi.down = False
    await asyncio.sleep(cfg.uplink.interval_s)
    await up.sync_once()
    assert up.session is not None and up.session.gateway is wifi
    assert wifi.held("containers") == _all(100) and wifi.held("alerts") == _all(5)
    log.close()


async def test_a_session_kept_busy_at_sea_still_notices_port_wifi(tmp_path: Path) -> None:
    """Positions keep arriving at sea, so the satellite session always has something to
    send; it must still break off to probe port Wi-Fi when the probe is due, or a ship
    in port would carry its whole backlog home over the satellite's budget."""
    cfg = uplink_config(
        tmp_path,
        gateways=[("hq", "satellite"), ("tokyo", "port_wifi")],
        links={"satellite": {"batch_max_records": 5, "in_flight": 1}},
        uplink={"interval": "200ms"},
    )
    log = open_log(cfg)
    fill(log, "containers", 50)
    sat = MemoryGateway("hq", "satellite", latency=0.1)
    wifi = MemoryGateway("tokyo", "port_wifi", down=True)
    up = _uplink(cfg, log, [sat, wifi])
    stop = asyncio.Event()

    async def positions() -> None:
        while not stop.is_set():
            fill(log, "nav", 10)  # faster than the satellite's 5 records a round trip
            await asyncio.sleep(0.01)

    feeder = asyncio.create_task(positions())
    try:
        # without breaking off, this pass would send positions for as long as they come
        await asyncio.wait_for(up.sync_once(), timeout=5)
        assert up.session is not None and up.session.gateway is sat
        assert sat.held("nav").count() > 0
    finally:
        stop.set()
        await feeder
    wifi.down = False
    await asyncio.sleep(0.2)
    await asyncio.wait_for(up.sync_once(), timeout=5)
    assert up.session is not None and up.session.gateway is wifi
    assert wifi.held("containers") == _all(50)
    log.close()


async def test_gateway_refusing_our_token_is_set_aside_for_the_next(tmp_path: Path) -> None:
    """401 means no request to that gateway can succeed: use another link meanwhile."""
    cfg = uplink_config(tmp_path, gateways=[("tokyo", "port_wifi"), ("hq", "satellite")])
    log = open_log(cfg)
    fill(log, "alerts", 3)
    wifi = MemoryGateway("tokyo", "port_wifi", reject=(401, "unauthorized"))
    sat = MemoryGateway("hq", "satellite")
    up = _uplink(cfg, log, [wifi, sat])
    await up.sync_once()
    assert sat.held("alerts") == _all(3)
    calls = wifi.calls
    await up.sync_once()
    assert wifi.calls == calls  # set aside, not asked again at once
    assert "401" in {s.site: s for s in log.links.states()}["tokyo"].last_error
    log.close()


async def test_rejected_batch_stalls_only_its_stream(tmp_path: Path) -> None:
    """A stream the site does not take (404) is counted and skipped; the others go."""
    cfg = uplink_config(tmp_path, gateways=[("tokyo", "port_wifi")])
    log = open_log(cfg)
    fill(log, "nav", 10)
    fill(log, "containers", 10)

    class NoNav(MemoryGateway):
        async def holdings(self):  # type: ignore[no-untyped-def]
            held = await super().holdings()
            held["nav"] = RangeSet()  # claims to take nav, then refuses it
            return held

    gw = NoNav("tokyo", "port_wifi", streams=("alerts", "containers"))
    up = _uplink(cfg, log, [gw])
    await up.sync_once()
    assert gw.held("containers") == _all(10)
    assert [r.outcome for r in gw.log if r.stream == "nav"] == ["rejected"]
    failed = up.metrics.uplink_failed.labels("tokyo", "nav", "unknown_stream")._value.get()
    assert failed == 1
    log.close()


async def test_retry_backoff_starts_afresh_after_progress(tmp_path: Path) -> None:
    """A long drain crosses many short outages; if the backoff kept growing across
    them, each 2 s outage would idle the link for up to retry_max."""
    cfg = uplink_config(
        tmp_path,
        gateways=[("tokyo", "port_wifi")],
        links={"port_wifi": {"batch_max_records": 100, "in_flight": 1}},
        uplink={"retry_min": "20ms", "retry_max": "10s"},
    )
    log = open_log(cfg)
    fill(log, "containers", 1500)
    # a failed request every few calls, with accepted batches in between
    gw = MemoryGateway("tokyo", "port_wifi", fail_calls={n: "request" for n in range(4, 40, 5)})
    up = _uplink(cfg, log, [gw])
    waits: list[float] = []
    real_before_sleep = up._before_sleep

    def recording(state: RetryCallState) -> None:
        assert state.next_action is not None
        waits.append(state.next_action.sleep)
        real_before_sleep(state)

    up._before_sleep = recording  # type: ignore[method-assign]
    await _run_until_delivered(up, gw, 1500)
    assert len(waits) >= 5
    # every wait is a first retry (20 ms plus up to 20 ms jitter), never 2**n * 20 ms
    assert max(waits) < 0.045, waits
    log.close()


async def test_a_session_that_breaks_off_to_probe_a_cheaper_link_leaves_no_gap(
    tmp_path: Path,
) -> None:
    """At sea the satellite session breaks off every ``uplink.interval`` to see whether
    port Wi-Fi came up. The batch it had built ahead (while the one in flight waited
    for its answer) was dropped, but its stream's position had already moved past it:
    the next batch then started beyond what the site held and was refused as a gap
    (409), one satellite round trip and one batch of bytes wasted each time, and after
    three in a row the stream, alerts included, waited for the next session (a voyage
    logged 27-36 such gaps per ship in three minutes). Now a batch dropped unsent gives
    its seqs back: no gap, nothing sent twice."""
    cfg = uplink_config(
        tmp_path,
        gateways=[("tokyo", "port_wifi"), ("hq", "satellite")],
        links={"satellite": {"batch_max_records": 5, "in_flight": 1}},
        uplink={"interval": "50ms"},
    )
    log = open_log(cfg)
    fill(log, "nav", 200)
    wifi = MemoryGateway("tokyo", "port_wifi", down=True)  # at sea: no Wi-Fi
    sat = MemoryGateway("hq", "satellite", latency=0.02)
    up = _uplink(cfg, log, [wifi, sat])
    stop = asyncio.Event()
    task = asyncio.create_task(up.run(stop))
    try:
        await eventually_async(lambda: sat.held("nav") == _all(200), what="nav delivered")
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    assert wifi.calls > 3, "the session never broke off to probe the cheaper link"
    assert [r for r in sat.log if r.outcome != "ok"] == []
    assert max(sat.arrivals.values()) == 1
    log.close()
