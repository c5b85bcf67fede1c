"""Upgrades and rollbacks of the agent across the newest migration of its log, on real
SQLite files (docs/edge-agent.md, "Upgrades and rollbacks"): ships upgrade in place at
sea, so an upgrade must lose nothing while the sensors publish, and a rollback must have
a way back instead of an older agent writing into columns it does not know."""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from edge_agent import migrations
from edge_agent.config import load_config
from edge_agent.errors import LogError, LogFromNewerAgent
from edge_agent.status import collect_status, open_log, render
from local_stack.mosquitto import MosquittoBroker
from tests.edge_agent.helpers import Publisher, edge_config_doc, start_agent, write_config
from tests.edge_agent.uplink_helpers import fill, uplink_config
from tests.helpers import eventually_async, write_toml

#: the schema of the agent before the newest migration: the "old agent" of these tests
OLD = len(migrations.MIGRATIONS) - 1
NEW = len(migrations.MIGRATIONS)


def _old_agent(m: pytest.MonkeyPatch) -> None:
    """This process's agent becomes the release before the newest migration."""
    m.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:OLD])


def _rows(db: Path, stream: str = "containers") -> list[tuple[int, bytes]]:
    with sqlite3.connect(db) as c:
        if not c.execute("SELECT 1 FROM sqlite_master WHERE name = 'records'").fetchone():
            return []
        return c.execute(
            "SELECT seq, payload FROM records WHERE stream = ? ORDER BY seq", [stream]
        ).fetchall()


def _schema(db: Path) -> list[int]:
    with sqlite3.connect(db) as c:
        return [r[0] for r in c.execute("SELECT id FROM _migrations ORDER BY id")]


def _copies(db: Path) -> list[str]:
    return sorted(p.name for p in db.parent.glob(f"{db.name}.schema-*"))


def _digest(*files: Path) -> list[str]:
    return [hashlib.sha256(f.read_bytes()).hexdigest() if f.exists() else "-" for f in files]


def _restore(db: Path, copy: Path) -> None:
    """The documented way back: the log (and its WAL) moved aside, the copy in its place."""
    aside = db.with_name(db.name + ".newer")
    aside.mkdir()
    for f in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
        if f.exists():
            f.rename(aside / f.name)
    shutil.copy2(copy, db)


async def test_an_upgrade_while_sensors_publish_keeps_every_acknowledged_record(
    tmp_path: Path,
    mosquitto: MosquittoBroker,
    publisher: Publisher,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The release before the newest migration ingests, is stopped and replaced by this
    one while a sensor keeps publishing: the new agent copies the log, migrates it and
    goes on, and every message the broker acknowledged is in the log once, seqs gapless;
    the copy is the old log exactly as the old agent left it."""
    cfg = write_config(tmp_path, mosquitto)
    db = tmp_path / "edge.db"
    done = threading.Event()
    sent = 0

    def publish_steadily() -> None:
        nonlocal sent
        # bounded load: about 500 a second while the agents change hands (under a loaded
        # CI, 2,000 a second made it a 20,000-message, 120 s test), 20,000 at most
        while not done.is_set() and sent < 20_000:
            publisher.publish(f"bigblue/d1/containers/c{sent % 20}/env", b'{"n": %d}' % sent)
            sent += 1
            time.sleep(0.002)

    with monkeypatch.context() as m:
        _old_agent(m)
        old, task = await start_agent(cfg)

        def probed() -> bool:  # the broker keeps messages for the agent from here on
            publisher.publish("bigblue/nav/ais", b"probe")
            return bool(_rows(db, "nav"))

        await eventually_async(probed, within=20, interval=0.2)
        feeder = threading.Thread(target=publish_steadily, daemon=True)
        feeder.start()
        await eventually_async(lambda: len(_rows(db)) >= 300, within=20)
        old.stop.set()
        await asyncio.wait_for(task, 20)
    assert _schema(db) == list(range(1, OLD + 1))
    before = _rows(db)

    new, task = await start_agent(cfg)
    try:
        assert _schema(db) == list(range(1, NEW + 1))
        await eventually_async(lambda: len(_rows(db)) >= len(before) + 300, within=20)
    finally:
        done.set()
        await asyncio.to_thread(feeder.join, 10)
        await asyncio.to_thread(publisher.wait_all_acked)
        acked = [p for p in publisher.acked if p.startswith(b'{"n"')]
        await eventually_async(lambda: len(_rows(db)) >= len(acked), within=30)
        new.stop.set()
        await asyncio.wait_for(task, 20)

    rows = _rows(db)
    assert len(acked) == sent > len(before) + 300
    assert sorted(p for _, p in rows) == sorted(acked), "a record lost or stored twice"
    assert [s for s, _ in rows] == list(range(1, len(rows) + 1)), "seqs are not gapless"
    copy = migrations.copy_path(db, OLD)
    assert _copies(db) == [copy.name]
    with sqlite3.connect(copy) as c:
        assert c.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert _schema(copy) == list(range(1, OLD + 1))
    assert _rows(copy) == before


def test_an_older_agent_refuses_the_migrated_log_untouched_and_the_copy_brings_it_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rollback: the older agent meets the log this one migrated and refuses it, naming
    the copy, without writing a byte; the copy restored in its place, the older agent
    opens it as it left it and takes new records after its own."""
    cfg = uplink_config(tmp_path)
    db = cfg.log.path
    with monkeypatch.context() as m:
        _old_agent(m)
        edge_log = open_log(cfg)
        fill(edge_log, "containers", 300)
        edge_log.close()
    edge_log = open_log(cfg)  # the upgrade
    fill(edge_log, "containers", 200)
    edge_log.close()
    files = (db, db.with_name(db.name + "-wal"))
    unchanged = _digest(*files)

    copy = migrations.copy_path(db, OLD)
    with monkeypatch.context() as m:
        _old_agent(m)
        with pytest.raises(LogFromNewerAgent) as refused:
            open_log(cfg)
        assert (refused.value.schema, refused.value.known) == (NEW, OLD)
        assert refused.value.copy == str(copy)
        message = str(refused.value)
        for words in (f"schema {NEW}", f"knows schema {OLD}", str(copy), "docs/edge-agent.md"):
            assert words in message
        assert _digest(*files) == unchanged, "the refused log was written to"
        assert _schema(db) == list(range(1, NEW + 1))
        # `status` reads it (read only) and says what the operator needs to go back
        reader = open_log(cfg, readonly=True)
        try:
            report = collect_status(cfg, reader)
        finally:
            reader.close()
        assert (report["log_schema"], report["agent_schema"]) == (NEW, OLD)
        assert report["log_copies"] == {str(OLD): str(copy)}
        assert f"a newer agent migrated it: this agent knows {OLD}" in " ".join(render(report))

        _restore(db, copy)
        edge_log = open_log(cfg)
        try:
            assert edge_log.stream_state("containers").count == 300
            assert fill(edge_log, "containers", 50) == list(range(301, 351))
            got = [r.payload[:19] for r in edge_log.read("containers", 1, 350)]
        finally:
            edge_log.close()
    assert got[:300] == [f"containers-{i:08d}".encode() for i in range(300)]
    assert got[300:] == [f"containers-{i:08d}".encode() for i in range(50)]
    assert _schema(db) == list(range(1, OLD + 1))
    assert _copies(db) == [copy.name]  # the old agent migrated nothing: no new copy


def test_run_on_a_log_from_a_newer_agent_exits_2_with_the_way_back(tmp_path: Path) -> None:
    """What the operator sees: `shorelink-edge run` exits 2 (the CLI's code for an error
    it prints) with one line that says what happened and what to do."""
    doc = edge_config_doc(tmp_path, SimpleNamespace(port=1))  # type: ignore[arg-type]
    cfg_path = write_toml(tmp_path / "edge.toml", doc)
    db = tmp_path / "edge.db"
    open_log(load_config(cfg_path)).close()
    copy = migrations.copy_path(db, NEW)
    shutil.copy2(db, copy)  # as the newer agent left it before migrating
    with sqlite3.connect(db) as c:
        c.execute(
            "INSERT INTO _migrations (id, name, applied_ms) VALUES (?, '_m999_future', 0)",
            [NEW + 1],
        )
    res = subprocess.run(
        [sys.executable, "-m", "edge_agent.cli", "run", "--config", str(cfg_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2, res.stderr
    (line,) = [x for x in res.stderr.splitlines() if x.startswith("error:")]
    assert f"{NEW + 1} _m999_future" in line and str(copy) in line


def test_a_current_or_new_log_is_never_copied(tmp_path: Path) -> None:
    """A copy costs the log's size on a small disk: it is taken only when a migration is
    about to change a log that has records' schema, never at a plain restart."""
    cfg = uplink_config(tmp_path)
    edge_log = open_log(cfg)
    fill(edge_log, "containers", 10)
    edge_log.close()
    open_log(cfg).close()
    assert _copies(cfg.log.path) == []


def test_only_the_newest_copy_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two upgrades in a row, each across a migration: the copy of the first is removed
    when the second is taken (KEEP_COPIES = 1: one way back, one log's size of disk)."""
    cfg = uplink_config(tmp_path)
    for n in (OLD - 1, OLD):
        with monkeypatch.context() as m:
            m.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:n])
            edge_log = open_log(cfg)
            fill(edge_log, "containers", 10)
            edge_log.close()
    assert _copies(cfg.log.path) == [migrations.copy_path(cfg.log.path, OLD - 1).name]
    open_log(cfg).close()
    assert _copies(cfg.log.path) == [migrations.copy_path(cfg.log.path, OLD).name]


def test_a_copy_that_cannot_be_taken_stops_the_migration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No upgrade without its way back: when the copy fails (here its name is taken by a
    directory), nothing is migrated and the error says why."""
    cfg = uplink_config(tmp_path)
    with monkeypatch.context() as m:
        _old_agent(m)
        edge_log = open_log(cfg)
        fill(edge_log, "containers", 10)
        edge_log.close()
    blocker = migrations.copy_path(cfg.log.path, OLD)
    blocker.mkdir()
    (blocker / "x").write_text("x")
    with pytest.raises(LogError, match=r"cannot copy the log .* before migrating it"):
        open_log(cfg)
    assert _schema(cfg.log.path) == list(range(1, OLD + 1))
    assert not blocker.with_name(blocker.name + ".tmp").exists()
