"""The agent as operators run it: systemd readiness and watchdog, metrics, status and
tail on the live log."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

from local_stack.mosquitto import MosquittoBroker
from local_stack.process import free_port
from tests.edge_agent.helpers import Publisher, write_config
from tests.helpers import build_info_line, eventually, run_process

EDGE = [sys.executable, "-m", "edge_agent.cli"]


def test_systemd_notify_ready_watchdog_and_stopping(
    tmp_path: Path, mosquitto: MosquittoBroker
) -> None:
    """Type=notify: systemd starts dependants only after READY=1 and restarts a hung
    agent when WATCHDOG=1 stops coming."""
    cfg = write_config(tmp_path, mosquitto)
    sock_path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(sock_path)
    sock.settimeout(15)
    env = dict(os.environ, NOTIFY_SOCKET=sock_path, WATCHDOG_USEC="400000")
    proc = run_process(
        "edge-agent", [*EDGE, "run", "--config", str(cfg)], tmp_path / "agent.log", env=env
    )
    assert proc.popen is not None
    try:
        got: list[str] = []
        while "WATCHDOG=1" not in got:
            got.append(sock.recv(256).decode())
        assert got[0] == "READY=1"
        proc.popen.send_signal(signal.SIGTERM)
        while got[-1] != "STOPPING=1":
            got.append(sock.recv(256).decode())
        assert proc.popen.wait(15) == 0
    finally:
        proc.stop(grace=0)
        sock.close()


def test_metrics_status_and_tail(
    tmp_path: Path, mosquitto: MosquittoBroker, publisher: Publisher
) -> None:
    port = free_port()
    cfg = write_config(tmp_path, mosquitto)
    cfg.write_text(cfg.read_text().replace("[metrics]\nport = 0", f"[metrics]\nport = {port}"))
    proc = run_process("edge-agent", [*EDGE, "run", "--config", str(cfg)], tmp_path / "agent.log")
    assert proc.popen is not None
    try:

        def scrape() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                return str(r.read().decode())

        def connected() -> bool:
            try:
                return "shorelink_edge_mqtt_connected 1.0" in scrape()
            except OSError:
                return False

        eventually(connected, what="agent connected", proc=proc)
        for i in range(30):
            publisher.publish(
                f"bigblue/d1/containers/C{i % 3}/env", f'{{"ts": 1700000000, "i": {i}}}'.encode()
            )
        publisher.publish("unmapped/x", b"?")
        publisher.wait_all_acked()
        eventually(
            lambda: 'shorelink_edge_ingested_records_total{stream="containers"} 30.0' in scrape(),
            what="ingest metric",
        )
        metrics = scrape()
        assert 'shorelink_edge_quarantined_messages_total{reason="unmapped_topic"} 1.0' in metrics
        assert "shorelink_edge_receive_to_ack_seconds_bucket" in metrics
        # the process's own figures, as every exporter has them
        rss = next(ln for ln in metrics.splitlines() if ln.startswith("process_resident_memory"))
        assert float(rss.split()[-1]) > 10e6 and "process_open_fds" in metrics
        # and the build it runs (an upgrade seen on a dashboard)
        assert build_info_line("edge") in metrics

        st = subprocess.run(
            [*EDGE, "status", "--config", str(cfg), "--json"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        report = json.loads(st.stdout)
        c = report["streams"]["containers"]
        assert (c["last_seq"], c["backlog_records"], c["held"]) == (30, 30, {})
        assert report["quarantined"] == 1
        assert c["oldest_undelivered_age_s"] is not None
        human = subprocess.run(
            [*EDGE, "status", "--config", str(cfg)],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        # piped, as in an 80-column terminal: every line fits, every figure whole
        assert all(len(line) <= 80 for line in human.stdout.splitlines()), human.stdout
        assert "stream containers" in human.stdout and "last seq 30" in human.stdout
        assert "backlog 30 records" in human.stdout and "quarantined: 1" in human.stdout

        tail = subprocess.run(
            [*EDGE, "tail", "--config", str(cfg), "--stream", "containers", "-n", "2"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        lines = tail.stdout.strip().splitlines()
        assert [ln.split("\t")[0] for ln in lines] == ["29", "30"]
        assert lines[-1].split("\t")[1:3] == ["C2", "1700000000000"]
    finally:
        proc.popen.send_signal(signal.SIGTERM)
        proc.popen.wait(15)


def test_every_command_has_help() -> None:
    for cmd in ([], ["run"], ["status"], ["tail"], ["check-config"]):
        res = subprocess.run([*EDGE, *cmd, "--help"], capture_output=True, text=True, timeout=60)
        assert res.returncode == 0 and "Usage:" in res.stdout
