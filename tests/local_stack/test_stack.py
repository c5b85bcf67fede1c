"""`shorelink stack up/status/down` through the real CLI: the demo, benchmarks and
developers use it, so it must start everything, describe it, and leave nothing behind."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from local_stack.process import pid_alive, port_open
from local_stack.stack import load
from shorelink.kafka.endpoint import KafkaEndpoint

CLI = [sys.executable, "-m", "shorelink.cli"]


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=180, check=check)


def test_stack_up_status_down_leaves_nothing_behind(tmp_path: Path) -> None:
    d = tmp_path / "st"
    _run("stack", "up", "--sites", "a,b", "--ships", "1", "--dir", str(d), "--kafka-heap", "256m")
    info = json.loads((d / "stack.json").read_text())
    assert set(info["sites"]) == {"a", "b"}
    assert set(info["ships"]) == {"ship1"}
    assert set(info["links"]) == {"ship1-to-a", "ship1-to-b"}
    assert info["links"]["ship1-to-a"]["upstream"] == info["sites"]["a"]["gateway"]

    addresses = [s["kafka"] for s in info["sites"].values()] + [info["ships"]["ship1"]["mqtt"]]
    addresses += [info["toxiproxy"]["api"].removeprefix("http://")]
    addresses += [link["listen"] for link in info["links"].values()]
    pids = [s["pid"] for s in info["sites"].values()] + [
        info["ships"]["ship1"]["pid"],
        info["toxiproxy"]["pid"],
    ]
    for addr in addresses:
        host, port = addr.rsplit(":", 1)
        assert port_open(host, int(port)), addr

    st = _run("stack", "status", "--dir", str(d), "--json")
    assert {r["state"] for r in json.loads(st.stdout)} == {"up"}

    # a crashed component is named, with its log file, and status fails
    os.kill(info["ships"]["ship1"]["pid"], signal.SIGKILL)
    bad = _run("stack", "status", "--dir", str(d), check=False)
    assert bad.returncode == 1
    lines = bad.stdout.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("mosquitto:ship1"))
    # its log, relative to the stack's directory, beside it or under it (80 columns)
    log = str(Path(info["ships"]["ship1"]["log"]).relative_to(d.resolve()))
    assert "dead" in lines[at] and log in " ".join(lines[at : at + 2]).split()

    # the brokers take SASL/SCRAM over TLS only: the stack's admin (DIR/secrets.env,
    # 0600) gets in, a plain client does not
    assert info["security"]["ca_file"] == str(d / "tls" / "ca.pem")
    assert stat.S_IMODE((d / "secrets.env").stat().st_mode) == 0o600
    admin = load(d).admin_auth()
    md = AdminClient(KafkaEndpoint(info["sites"]["a"]["kafka"], admin).client_config()).list_topics(
        timeout=20
    )
    assert md.brokers
    with pytest.raises(KafkaException):
        plain = {"bootstrap.servers": info["sites"]["a"]["kafka"], "socket.timeout.ms": 3000}
        AdminClient(plain).list_topics(timeout=5)
    audit = _run("audit", "--stack", str(d), "--site", "a", "--json")
    assert json.loads(audit.stdout)["ok"] is True

    down = _run("stack", "down", "--dir", str(d))
    assert "kafka:a" in down.stdout
    assert not any(pid_alive(p) for p in pids)
    for addr in addresses:
        host, port = addr.rsplit(":", 1)
        assert not port_open(host, int(port)), f"{addr} still listening"


def test_stack_status_without_a_stack_is_a_clear_error(tmp_path: Path) -> None:
    res = _run("stack", "status", "--dir", str(tmp_path / "none"), check=False)
    assert res.returncode == 1
    assert "no stack in" in res.stderr
