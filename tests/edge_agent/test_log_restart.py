"""A log that starts again never loses new records: a ship re-flashed with an empty log,
a log restored from a backup, and a log that lost its tail in a power cut
(``synchronous = normal``) would assign seqs the shore already holds; a site would take
the new records for old ones (never stored, then deleted by retention on board). The
log detects it (a site holds seqs it never sent) and moves its new records past them.
Real SQLite logs; the sites are the in-memory implementation of the gateway seam."""

from __future__ import annotations

import shutil
import sqlite3
import time
from pathlib import Path

from edge_agent.config import EdgeConfig
from edge_agent.log import EdgeLog
from edge_agent.metrics import EdgeMetrics
from edge_agent.numbering import Renumbering, plan_renumber
from edge_agent.status import open_log
from edge_agent.uplink import Uplink
from shorelink.ranges import RangeSet
from tests.edge_agent.memory_gateway import MemoryGateway
from tests.edge_agent.uplink_helpers import fill, uplink_config


def _uplink(cfg: EdgeConfig, edge_log: EdgeLog, gw: MemoryGateway) -> Uplink:
    import asyncio

    return Uplink(cfg, edge_log, EdgeMetrics(), asyncio.Event(), gateways=[gw], clock=time.time)


def _payloads(edge_log: EdgeLog, stream: str = "containers") -> list[bytes]:
    last = edge_log.stream_state(stream).next_seq - 1
    return [r.payload for r in edge_log.read(stream, 1, last, max_records=10**6)]


def _fill_tagged(edge_log: EdgeLog, tag: str, n: int) -> None:
    from edge_agent.log import Incoming, message_digest

    batch = []
    for i in range(n):
        payload = f"{tag}-{i:05d}".encode()
        topic = f"bigblue/d1/containers/C{i % 7}/env"
        batch.append(
            Incoming("containers", f"C{i % 7}", 1, 1, topic, payload,
                     digest=message_digest(topic.encode(), payload))
        )  # fmt: skip
    edge_log.commit(batch)


def _site_payloads(gw: MemoryGateway) -> dict[int, bytes]:
    return {seq: r.payload for seq, r in gw.records.get("containers", {}).items()}


def _assert_site_holds_everything_once(gw: MemoryGateway, expected: list[bytes]) -> None:
    held = _site_payloads(gw)
    assert sorted(held.values()) == sorted(expected), "a record is missing or doubled at the site"
    assert gw.held("containers") == RangeSet([(1, len(expected))]), "a gap at the site"


def test_plan_moves_only_what_may_collide() -> None:
    assert plan_renumber(site_last=100, sent=100, renumber_from=None, next_seq=150) is None
    # re-flashed: everything in the new log moves past the site
    assert plan_renumber(100, 0, 1, 21) == Renumbering(1, 100)
    # restored: records from before the restore keep their seqs, the rest move
    assert plan_renumber(500, 300, 401, 451) == Renumbering(401, 100)
    # nothing assigned yet past the site's view: new seqs just start past it
    assert plan_renumber(500, 300, 480, 480) == Renumbering(480, 21)
    # the backup had more than the site ever got: nothing collides
    assert plan_renumber(350, 300, 401, 451) == Renumbering(401, 0)


async def test_reflashed_ship_with_an_empty_log_loses_no_new_record(tmp_path: Path) -> None:
    cfg = uplink_config(tmp_path, gateways=[("tokyo", "port_wifi")])
    first = open_log(cfg)
    _fill_tagged(first, "old", 300)
    gw = MemoryGateway("tokyo", "port_wifi")
    await _uplink(cfg, first, gw).sync_once()
    first.close()
    _wipe(tmp_path)  # re-flashed: a new, empty log
    fresh = open_log(cfg)
    _fill_tagged(fresh, "new", 40)  # at sea, before any port
    await _uplink(cfg, fresh, gw).sync_once()
    assert fresh.stream_state("containers").next_seq == 341
    _assert_site_holds_everything_once(gw, _payloads_of("old", 300) + _payloads_of("new", 40))
    assert all(p.startswith(b"old") for s, p in _site_payloads(gw).items() if s <= 300)
    fresh.close()


def _wipe(d: Path) -> None:
    for p in d.glob("edge.db*"):
        p.unlink()


def _copy_log(src: Path, dst: Path, *, wal: bool = True) -> Path:
    dst.mkdir(exist_ok=True)
    for p in src.glob("edge.db*"):
        if wal or not p.name.endswith("-wal"):
            shutil.copy(p, dst / p.name)
    return dst


def _payloads_of(tag: str, n: int) -> list[bytes]:
    return [f"{tag}-{i:05d}".encode() for i in range(n)]


async def test_log_restored_from_a_backup_loses_no_new_record(tmp_path: Path) -> None:
    cfg = uplink_config(tmp_path, gateways=[("tokyo", "port_wifi")])
    edge_log = open_log(cfg)
    gw = MemoryGateway("tokyo", "port_wifi")
    _fill_tagged(edge_log, "a", 200)
    await _uplink(cfg, edge_log, gw).sync_once()  # the site holds 1-200
    _fill_tagged(edge_log, "b", 50)  # 201-250, not sent yet
    edge_log.close()
    backup = _copy_log(tmp_path, tmp_path / "backup")
    edge_log = open_log(cfg)
    _fill_tagged(edge_log, "c", 100)  # 251-350
    await _uplink(cfg, edge_log, gw).sync_once()  # the site holds 1-350
    edge_log.close()
    _wipe(tmp_path)
    _copy_log(backup, tmp_path)  # restored: the log is back at 250, 1-200 sent
    edge_log = open_log(cfg)
    _fill_tagged(edge_log, "d", 30)  # 251-280 again: the site has c-records there
    await _uplink(cfg, edge_log, gw).sync_once()
    expected = _payloads_of("a", 200) + _payloads_of("b", 50) + _payloads_of("c", 100)
    _assert_site_holds_everything_once(gw, expected + _payloads_of("d", 30))
    # nothing older overwritten: the site's seqs 251-350 still hold the c-records
    assert [p for s, p in sorted(_site_payloads(gw).items()) if 251 <= s <= 350] == (
        _payloads_of("c", 100)
    )
    # the b-records kept their seqs (they were in the log before it restarted)
    assert [r.payload for r in edge_log.read("containers", 201, 250)] == _payloads_of("b", 50)
    edge_log.close()


async def test_log_that_lost_its_tail_in_a_power_cut_loses_no_new_record(
    tmp_path: Path,
) -> None:
    """``synchronous = normal``: commits since the last WAL checkpoint may vanish in a
    power cut; some of them may already be at the shore."""
    cfg = uplink_config(tmp_path, gateways=[("tokyo", "port_wifi")], log={"synchronous": "normal"})
    edge_log = open_log(cfg)
    gw = MemoryGateway("tokyo", "port_wifi")
    _fill_tagged(edge_log, "a", 100)
    await _uplink(cfg, edge_log, gw).sync_once()
    edge_log._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # durable up to here
    _fill_tagged(edge_log, "b", 60)  # 101-160: only in the WAL
    await _uplink(cfg, edge_log, gw).sync_once()  # ... and already at the shore
    # the power cut: the WAL's last frames never reached the disk
    image = _copy_log(tmp_path, tmp_path / "disk", wal=False)
    edge_log.close()
    _wipe(tmp_path)
    _copy_log(image, tmp_path)
    with sqlite3.connect(tmp_path / "edge.db") as conn:
        assert conn.execute("SELECT max(seq) FROM records").fetchone()[0] == 100
    edge_log = open_log(cfg)
    _fill_tagged(edge_log, "c", 20)  # 101-120 again
    await _uplink(cfg, edge_log, gw).sync_once()
    expected = _payloads_of("a", 100) + _payloads_of("b", 60) + _payloads_of("c", 20)
    _assert_site_holds_everything_once(gw, expected)
    edge_log.close()


async def test_a_log_that_did_not_restart_moves_nothing(tmp_path: Path) -> None:
    """The rule has no false alarm: a site holds no seq this log did not send, even
    when a reply was lost and the log never heard the site took a batch."""
    cfg = uplink_config(tmp_path, gateways=[("tokyo", "port_wifi")])
    edge_log = open_log(cfg)
    gw = MemoryGateway("tokyo", "port_wifi", fail_calls={2: "reply"})
    fill(edge_log, "containers", 500)
    up = _uplink(cfg, edge_log, gw)
    for _ in range(5):
        try:
            await up.sync_once()
        except Exception:
            continue
    edge_log.close()
    edge_log = open_log(cfg)  # a restart, not a restore
    fill(edge_log, "containers", 10)
    await _uplink(cfg, edge_log, gw).sync_once()
    assert gw.held("containers") == RangeSet([(1, 510)])
    assert max(gw.arrivals.values()) <= 2  # (the batch whose reply was lost, once more)
    assert edge_log.stream_state("containers").next_seq == 511
    edge_log.close()


async def test_a_log_from_before_the_rule_moves_nothing_on_upgrade(tmp_path: Path) -> None:
    """A log an older agent wrote has no ``sent_upto``: the sites hold what it sent. Its
    first session after the upgrade must learn that, not move anything."""
    cfg = uplink_config(tmp_path, gateways=[("tokyo", "port_wifi")])
    edge_log = open_log(cfg)
    gw = MemoryGateway("tokyo", "port_wifi")
    _fill_tagged(edge_log, "a", 100)
    await _uplink(cfg, edge_log, gw).sync_once()
    edge_log.close()
    with sqlite3.connect(tmp_path / "edge.db") as conn:  # as the older agent left it
        conn.execute("DELETE FROM meta WHERE key LIKE 'sent_upto:%' OR key LIKE 'renumber_from:%'")
    edge_log = open_log(cfg)
    _fill_tagged(edge_log, "b", 10)
    await _uplink(cfg, edge_log, gw).sync_once()
    _assert_site_holds_everything_once(gw, _payloads_of("a", 100) + _payloads_of("b", 10))
    assert edge_log.stream_state("containers").next_seq == 111
    edge_log.close()
