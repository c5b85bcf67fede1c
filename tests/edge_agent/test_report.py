"""The ship report (edge_agent/report.py): the agent writes its own state as a record of
the report stream, every ``report.interval``; the figures are the log's."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from edge_agent.config import load_config
from edge_agent.log import Incoming
from edge_agent.report import Reporter, build_report, write_report
from edge_agent.status import open_log
from local_stack.mosquitto import MosquittoBroker
from local_stack.process import free_port
from shorelink.errors import ConfigError
from shorelink.ranges import RangeSet
from shorelink.ship_report import REPORT_MQTT_TOPIC, ShipReport, decode_report
from shorelink.version import version
from tests.edge_agent.helpers import Publisher, write_config
from tests.helpers import eventually, run_process

EDGE = [sys.executable, "-m", "edge_agent.cli"]
REPORT = (
    '\n[streams.agent]\npriority = 5\n\n[report]\nstream = "agent"\ninterval = "{i}"\n'
    'heartbeat = "{h}"\n'
)


def _config(
    tmp_path: Path, broker: MosquittoBroker, interval: str = "10m", heartbeat: str = "6h"
) -> Path:
    cfg = write_config(tmp_path, broker)
    cfg.write_text(cfg.read_text() + REPORT.format(i=interval, h=heartbeat))
    return cfg


def test_a_report_carries_the_logs_figures(tmp_path: Path, mosquitto: MosquittoBroker) -> None:
    cfg = load_config(_config(tmp_path, mosquitto))
    log = open_log(cfg)
    try:
        log.commit(
            [Incoming("containers", f"C{i}", 1000 + i, 1000 + i, "t", b"{}") for i in range(7)]
        )
        log.set_holdings("tokyo", "containers", RangeSet.parse("1-3"))
        r = build_report(cfg, log, now_ms=5000)
        assert r.at_ms == 5000 and r.link is None
        assert r.agent == version()  # an upgrade or a rollback at sea is seen ashore
        assert r.streams["containers"] == (7, 4)
        assert r.streams["agent"] == (0, 0)
        seq = write_report(cfg, log)
        assert seq == 1
        (rec,) = log.read("agent", 1, 10)
        assert rec.key == "bigblue" and rec.topic == REPORT_MQTT_TOPIC
        written = decode_report(rec.payload)
        assert written.streams["containers"] == (7, 4)
        # a second report counts the first one as backlog of its own stream
        write_report(cfg, log)
        (_, second) = log.read("agent", 1, 10)
        assert decode_report(second.payload).streams["agent"] == (1, 1)
    finally:
        log.close()


def test_the_report_stream_must_be_configured(tmp_path: Path, mosquitto: MosquittoBroker) -> None:
    cfg = write_config(tmp_path, mosquitto)
    cfg.write_text(cfg.read_text() + '\n[report]\nstream = "agent"\n')
    with pytest.raises(ConfigError, match=r"report\.stream.*add \[streams\.agent\]"):
        load_config(cfg)
    cfg.write_text(cfg.read_text().replace('stream = "agent"', 'stream = "agent"\ninterval = "0s"'))
    with pytest.raises(ConfigError, match="interval"):
        load_config(cfg)


def test_the_running_agent_reports_when_its_state_changes_and_on_its_heartbeat(
    tmp_path: Path, mosquitto: MosquittoBroker, publisher: Publisher
) -> None:
    """A report at start; new readings change the state: reported within an interval;
    then nothing changes: none until the heartbeat (its own reports do not count)."""
    cfg = _config(tmp_path, mosquitto, interval="1s", heartbeat="4s")
    port = free_port()
    cfg.write_text(cfg.read_text().replace("[metrics]\nport = 0", f"[metrics]\nport = {port}"))
    proc = run_process("edge-agent", [*EDGE, "run", "--config", str(cfg)], tmp_path / "agent.log")
    assert proc.popen is not None
    try:

        def reports() -> int:
            st = subprocess.run(
                [*EDGE, "status", "--config", str(cfg), "--json"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            if st.returncode:  # the agent has not opened its log yet
                return 0
            return int(json.loads(st.stdout)["streams"]["agent"]["last_seq"])

        def written() -> list[ShipReport]:
            log = open_log(load_config(cfg), readonly=True)
            try:
                return [decode_report(r.payload) for r in log.read("agent", 1, 100)]
            finally:
                log.close()

        def connected() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    return b"shorelink_edge_mqtt_connected 1.0" in r.read()
            except OSError:
                return False

        eventually(connected, within=30, what="agent connected", proc=proc)
        # the first report is written as the agent starts
        eventually(lambda: reports() >= 1, within=30, what="first report", proc=proc)
        for i in range(5):
            publisher.publish(f"bigblue/d1/containers/C{i}/env", b'{"ts": 1700000000}')
        publisher.wait_all_acked()
        # reported within an interval (in two reports when the readings reach the log
        # across two intervals, as on a busy machine)
        eventually(
            lambda: written()[-1].streams.get("containers") == (5, 5),
            within=10,
            what="a report of the change",
            proc=proc,
        )
        changed = len(written())
        eventually(
            lambda: len(written()) > changed, within=15, what="the heartbeat's report", proc=proc
        )
        change, beat = written()[changed - 1 : changed + 1]
        # nothing in between: four looks at an unchanged state (its own stream does not
        # count) wrote nothing, the heartbeat wrote the next one
        assert beat.at_ms - change.at_ms >= 4000 - 50, (change, beat)
        assert beat.streams["containers"] == (5, 5)
    finally:
        proc.popen.send_signal(signal.SIGTERM)
        proc.popen.wait(15)
    assert "event=ship_report stream=agent seq=1" in (tmp_path / "agent.log").read_text()


def test_the_reporter_writes_on_change_only(tmp_path: Path, mosquitto: MosquittoBroker) -> None:
    cfg = load_config(_config(tmp_path, mosquitto, interval="1s", heartbeat="1h"))
    log = open_log(cfg)
    now = [0.0]
    r = Reporter(cfg, log, monotonic=lambda: now[0])
    try:
        assert r.tick() == 1  # at start
        assert r.tick() is None  # nothing changed (its own report does not count)
        log.commit([Incoming("containers", "C1", 1, 1, "t", b"{}")])
        assert r.tick() == 2
        assert r.tick() is None
        log.set_holdings("tokyo", "containers", RangeSet.parse("1"))  # the backlog changed
        assert r.tick() == 3
        now[0] = 3600.0  # the heartbeat
        assert r.tick() == 4
    finally:
        log.close()
