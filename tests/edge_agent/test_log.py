"""The on-ship log: gapless seqs, duplicates recognised, the disk budget kept per stream
policy (alerts always get in), nothing accepted lost when the disk is full."""

from __future__ import annotations

import dataclasses
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from edge_agent.config import LogConfig, StreamConfig
from edge_agent.errors import LogError, LogFullError
from edge_agent.log import EdgeLog, Incoming, message_digest
from shorelink.ranges import RangeSet

STREAMS = {
    "alerts": StreamConfig("alerts", priority=0, on_full="reject"),
    "nav": StreamConfig("nav", priority=10, on_full="reject"),
    "containers": StreamConfig("containers", priority=50, on_full="drop_oldest"),
}


def _log(tmp_path: Path, **cfg: object) -> EdgeLog:
    return EdgeLog(tmp_path / "edge.db", "bigblue", STREAMS, LogConfig(**cfg))  # type: ignore[arg-type]


def _msg(stream: str, n: int, *, size: int = 60, mid: int = 0, dup: bool = False) -> Incoming:
    payload = f"{n:08d}".encode().ljust(size, b".")
    topic = f"bigblue/d/{stream}/c{n % 7}/env"
    return Incoming(
        stream,
        f"c{n % 7}",
        1000 + n,
        2000 + n,
        topic,
        payload,
        mid=mid,
        dup=dup,
        digest=message_digest(topic.encode(), payload),
    )


def _seqs(log: EdgeLog, stream: str) -> list[int]:
    return [r.seq for r in log.read(stream, 1, 10**9, max_records=10**6)]


def test_seqs_are_gapless_per_stream_and_survive_reopen(tmp_path: Path) -> None:
    log = _log(tmp_path)
    res = log.commit(
        [_msg("containers", i) for i in range(5)] + [_msg("nav", 1), _msg("containers", 5)]
    )
    assert res.seqs == [1, 2, 3, 4, 5, 1, 6]
    log.close()
    log = _log(tmp_path)
    assert log.commit([_msg("containers", 6), _msg("nav", 2)]).seqs == [7, 2]
    assert _seqs(log, "containers") == list(range(1, 8))
    assert log.tail("containers", 2)[-1].payload.startswith(b"00000006")


def test_redelivered_duplicate_is_recognised_by_packet_id_and_digest(tmp_path: Path) -> None:
    """A message committed just before a crash comes back with DUP and the same packet
    id: storing it again would double a reading."""
    log = _log(tmp_path)
    log.commit([_msg("containers", 1, mid=17)])
    log.close()
    log = _log(tmp_path)  # as after a restart
    again = log.commit([_msg("containers", 1, mid=17, dup=True), _msg("containers", 2, mid=18)])
    assert again.outcomes == ["duplicate", "stored"]
    # same packet id reused for a different message later: stored
    assert log.commit([_msg("containers", 3, mid=17)]).outcomes == ["stored"]
    # a DUP whose content differs from what was committed under that id: stored
    assert log.commit([_msg("containers", 4, mid=18, dup=True)]).outcomes == ["stored"]
    assert _seqs(log, "containers") == [1, 2, 3, 4]


def test_duplicate_within_one_group_is_recognised(tmp_path: Path) -> None:
    log = _log(tmp_path)
    res = log.commit([_msg("nav", 1, mid=5), _msg("nav", 1, mid=5, dup=True)])
    assert res.outcomes == ["stored", "duplicate"]


def test_full_budget_drops_oldest_bulk_but_alerts_still_get_in(tmp_path: Path) -> None:
    """At sea for weeks with the link down: telemetry may age out, alerts never."""
    log = _log(tmp_path, max_bytes=20_000, alerts_reserve_bytes=4_000)
    for i in range(0, 400, 20):
        log.commit([_msg("containers", n) for n in range(i, i + 20)])
    assert log.sizes().records <= 20_000 - 4_000
    kept = _seqs(log, "containers")
    assert kept == list(range(kept[0], 401)), "drop_oldest keeps a contiguous newest window"
    assert kept[0] > 1 and log.stream_state("containers").dropped == kept[0] - 1
    # alerts use the reserve...
    res = log.commit([_msg("alerts", n) for n in range(30)])
    assert res.outcomes == ["stored"] * 30
    # ...and beyond it they are still accepted (over budget), never refused or dropped
    res = log.commit([_msg("alerts", n) for n in range(30, 200)])
    assert set(res.outcomes) == {"stored"}
    assert res.over_budget > 0
    assert _seqs(log, "alerts") == list(range(1, 201))


def test_reject_stream_refuses_new_records_when_full_and_counts_them(tmp_path: Path) -> None:
    log = _log(tmp_path, max_bytes=10_000, alerts_reserve_bytes=2_000)
    outcomes: list[str] = []
    for i in range(0, 200, 10):
        outcomes += log.commit([_msg("nav", n) for n in range(i, i + 10)]).outcomes
    assert "rejected" in outcomes
    n_stored = outcomes.count("stored")
    assert _seqs(log, "nav") == list(range(1, n_stored + 1)), "no gap, nothing dropped"
    assert log.stream_state("nav").rejected == outcomes.count("rejected")


def test_delivered_records_are_removed_first(tmp_path: Path) -> None:
    log = _log(tmp_path, max_bytes=20_000, alerts_reserve_bytes=1_000)
    log.commit([_msg("nav", n) for n in range(100)])  # ~10 KB, reject policy
    log.set_holdings("tokyo", "nav", RangeSet.parse("1-80"))
    assert log.backlog("nav")[0] == 20
    for i in range(0, 100, 10):
        log.commit([_msg("containers", n) for n in range(i, i + 10)])
    nav = _seqs(log, "nav")
    assert nav[-20:] == list(range(81, 101)), "undelivered nav records are all still there"
    assert log.stream_state("nav").dropped == 0 and log.stream_state("nav").retired > 0


def test_age_retention_spares_undelivered_reject_streams(tmp_path: Path) -> None:
    streams = {
        **STREAMS,
        "containers": StreamConfig("containers", max_age_s=1, on_full="drop_oldest"),
        "nav": StreamConfig("nav", max_age_s=1, on_full="reject"),
    }
    log = EdgeLog(tmp_path / "edge.db", "bigblue", streams, LogConfig())
    log.commit([_msg("containers", n) for n in range(10)] + [_msg("nav", n) for n in range(10)])
    log.set_holdings("hq", "nav", RangeSet.parse("1-4"))
    removed = log.expire(now_ms=10**13)
    assert removed == {"containers": 10, "nav": 4}
    assert _seqs(log, "nav") == list(range(5, 11))


def test_disk_full_stores_nothing_and_loses_no_seq(tmp_path: Path) -> None:
    """SQLITE_FULL: the commit fails whole (so the broker keeps the messages) and the
    next successful commit continues the seqs without a gap."""
    log = _log(tmp_path)
    log.commit([_msg("containers", 0)])
    pages = log._conn.execute("PRAGMA page_count").fetchone()[0]
    log._conn.execute(f"PRAGMA max_page_count = {pages}")
    with pytest.raises(LogFullError) as exc:
        log.commit([_msg("containers", n, size=3000) for n in range(1, 50)])
    assert exc.value.retryable
    assert log.stream_state("containers").next_seq == 2
    log._conn.execute("PRAGMA max_page_count = 1073741823")
    assert log.commit([_msg("containers", 1)]).seqs == [2]
    assert _seqs(log, "containers") == [1, 2]


def test_quarantine_is_bounded(tmp_path: Path) -> None:
    from edge_agent.quarantine import Quarantined

    log = _log(tmp_path, quarantine_max=5)
    for i in range(12):
        log.commit([], [Quarantined(i, b"t", "unmapped_topic", "d", b"x" * 5000)])
    assert log.quarantine.count() == 5
    assert all(len(q.payload) <= 1024 for q in log.quarantine.newest())


def test_log_of_another_ship_is_refused(tmp_path: Path) -> None:
    _log(tmp_path).close()
    with pytest.raises(LogError, match="belongs to ship 'bigblue'"):
        EdgeLog(tmp_path / "edge.db", "redstar", STREAMS, LogConfig())


def test_commit_survives_kill9_right_after_commit(tmp_path: Path) -> None:
    """What commit() returned is on disk even if the process dies the next instant."""
    code = (
        "import os, sys\n"
        f"sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})\n"
        "from tests.edge_agent.test_log import _log, _msg\n"
        "from pathlib import Path\n"
        f"log = _log(Path({str(tmp_path)!r}))\n"
        "for i in range(50): log.commit([_msg('containers', i)])\n"
        "print('committed', flush=True)\n"
        "os.kill(os.getpid(), 9)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -9 and "committed" in proc.stdout
    with sqlite3.connect(tmp_path / "edge.db") as c:
        assert c.execute("SELECT count(*), max(seq) FROM records").fetchone() == (50, 50)


# -- redeliveries (edge_agent/redelivery.py) ---------------------------------------------


def _on(m: Incoming, conn: int, *, resumed: bool = True, dup: bool | None = None) -> Incoming:
    """``m`` as it arrived on MQTT connection ``conn``."""
    return dataclasses.replace(m, conn=conn, resumed=resumed, dup=m.dup if dup is None else dup)


def test_broker_restored_from_an_older_file_redelivers_without_dup_and_it_is_recognised(
    tmp_path: Path,
) -> None:
    """Mosquitto restored from a persistence file written before the agent committed
    these sends them again without DUP (they were still queued at the save)."""
    log = _log(tmp_path)
    first = [_on(_msg("containers", n, mid=n), conn=1) for n in range(1, 6)]
    assert log.commit(first).outcomes == ["stored"] * 5
    log.close()
    log = _log(tmp_path)  # the power cut took the agent too
    again = [_on(m, conn=2, dup=False) for m in first[2:]]
    new = _on(_msg("containers", 6, mid=6), conn=2)
    assert log.commit([*again, new]).outcomes == ["duplicate"] * 3 + ["stored"]
    assert _seqs(log, "containers") == [1, 2, 3, 4, 5, 6]


def test_identical_payload_after_packet_ids_wrapped_is_stored_even_with_dup(
    tmp_path: Path,
) -> None:
    """Sensors repeat payloads (a door that stays open): once the broker has reused
    every packet id, the same id and payload is a new message, not a redelivery, even
    when it comes with DUP because the agent died before committing it."""
    log = _log(tmp_path, max_bytes=10**9)
    door = _on(_msg("alerts", 0, mid=5), conn=1)
    log.commit([door])
    # 65534 other messages: the broker's ids went round once (6..65535, 1..4)
    mids = [*range(6, 65536), *range(1, 5)]
    log.commit([_on(_msg("nav", i, mid=mid, size=8), conn=1) for i, mid in enumerate(mids)])
    log.close()
    log = _log(tmp_path, max_bytes=10**9)
    res = log.commit([_on(door, conn=2, dup=True), _on(door, conn=2, dup=False)])
    assert res.outcomes == ["stored", "stored"]
    assert _seqs(log, "alerts") == [1, 2, 3]


def test_repeats_on_the_same_connection_or_a_new_session_are_new_messages(
    tmp_path: Path,
) -> None:
    """The broker reuses a packet id on one connection only after our PUBACK, and a
    broker that lost the session has nothing to redeliver."""
    log = _log(tmp_path)
    door = _msg("alerts", 1, mid=7)
    assert log.commit([_on(door, conn=1)]).outcomes == ["stored"]
    assert log.commit([_on(door, conn=1)]).outcomes == ["stored"]
    assert log.commit([_on(door, conn=2, resumed=False, dup=True)]).outcomes == ["stored"]
    assert log.commit([_on(door, conn=3, dup=True)]).outcomes == ["duplicate"]
    assert _seqs(log, "alerts") == [1, 2, 3]


def test_recognition_without_dup_ends_at_the_first_new_message_of_a_connection(
    tmp_path: Path,
) -> None:
    """A restored broker sends what it restored first: after a new message, a repeat
    without DUP is a sensor repeating itself."""
    log = _log(tmp_path)
    old = [_on(_msg("containers", n, mid=n), conn=1) for n in range(1, 4)]
    log.commit(old)
    res = log.commit(
        [
            _on(old[0], conn=2, dup=False),
            _on(_msg("containers", 99, mid=2), conn=2),
            _on(old[2], conn=2, dup=False),
        ]
    )
    assert res.outcomes == ["duplicate", "stored", "stored"]
    assert log.commit([_on(old[2], conn=2, dup=False)]).outcomes == ["stored"]
