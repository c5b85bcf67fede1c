"""The fleet bench (``bench/fleet.py``): its ships send a real day's streams in a real
day's proportions (the figures it prints are about that profile, not about container
readings alone), docking ships in the port link's batches, and a tiny fleet's run ends
with every record of every stream once at the gateway's ingress and, merged by the
site's application, once in the canonical topics."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bench._shipday import DAY, STREAMS, ship_day, split
from shorelink.wire import decode_batch

ROOT = Path(__file__).resolve().parents[1]


def test_a_ships_records_follow_a_real_day_and_every_kind_is_sent() -> None:
    """Containers dominate as 2,500 hourly readings do against AIS, the ship's sensors
    and its report; none of the smaller streams is rounded away at a bench's scale."""
    got = split(1000)
    assert sum(got.values()) == 1000
    assert all(n >= 1 for n in got.values())
    total = sum(n for _, n in DAY.values())
    for kind, (_, per_day) in DAY.items():
        assert abs(got[kind] - 1000 * per_day / total) <= 1, (kind, got)


def test_a_docking_ship_sends_its_backlog_in_port_batches_and_a_ship_at_sea_in_satellite_ones() -> (
    None
):
    """The gateway's cost per record depends on the batch: the profile must carry both."""
    sea = ship_day("fleet0001", 0, 600, docking=False, backlog=10, now=1.7e9)
    dock = ship_day("fleet0002", 1, 600, docking=True, backlog=10, now=1.7e9)
    assert set(sea.batches) == set(dock.batches) == set(STREAMS)
    assert sea.records == 600 and dock.records == 6000
    for day, most in ((sea, 200), (dock, 50_000)):
        for stream, batches in day.batches.items():
            first = 1
            for end, body in batches:
                b = decode_batch(body)
                assert (b.origin, b.stream) == (day.ship, stream)
                assert [r.seq for r in b.records] == list(range(first, end + 1))
                assert len(b.records) <= most
                first = end + 1
    assert len(dock.batches["containers"]) == 1 < len(sea.batches["containers"])


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_a_tiny_fleet_run_holds_every_stream_exactly_once_at_the_gateway_and_after_the_merge(
    tmp_path: Path,
) -> None:
    """bench/fleet.py end to end at 3 ships (one docking), the site's application
    merging behind the gateway: its result says every stream was checked and held once
    at the gateway's ingress and in the canonical topics, with the merge's figures."""
    argv = [
        sys.executable,
        str(ROOT / "bench" / "fleet.py"),
        *("--ships", "3", "--records-per-ship", "200", "--docking-share", "0.34"),
        *("--backlog", "5", "--alert-every", "0.2", "--keep", str(tmp_path / "fleet")),
    ]
    with open(tmp_path / "fleet.err", "wb") as err_file:
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=err_file, start_new_session=True, cwd=ROOT
        )
        try:
            out, _ = proc.communicate(timeout=260)
        finally:
            if proc.returncode is None:  # the bench stops every process it started
                os.killpg(proc.pid, signal.SIGTERM)
                proc.communicate(timeout=30)
    err = (tmp_path / "fleet.err").read_text(errors="replace")
    assert out, f"no result; the bench's progress:\n{err[-4000:]}"
    (size,) = json.loads(out)["sizes"]
    assert size["docking_ships"] == 1
    assert size["records"] == 2 * 200 + 5 * 200
    assert set(size["streams"]) == set(STREAMS)
    assert all(s["exactly_once"] and s["records"] > 0 for s in size["streams"].values()), size
    merge = size["merge"]
    assert set(merge["streams"]) == {*STREAMS, "alerts"}
    assert all(s["exactly_once"] for s in merge["streams"].values()), merge
    assert merge["records"] == size["records"] + size["alert_ms"]["count"]
    assert merge["records_s"] > 0 and merge["lag_ms"]["p99"] is not None
    assert size["exactly_once"]
    assert size["alert_ms"]["count"] >= 1
    assert proc.returncode == 0
