"""A voyage started and stopped by hand: Ctrl-C half-way leaves no process behind, and
``--dir`` never clears a directory the voyage did not make. Apart from the short voyage
(``test_voyage.py``), which runs alone: these start a stack but run no voyage, so they
share the machine with the other heavy files (tests/conftest.py)."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest

from local_stack.process import pid_alive
from tests.helpers import eventually, kill9, run_process
from voyage.run import prepare_dir


def test_a_voyage_never_clears_a_directory_it_did_not_make(tmp_path: Path) -> None:
    """`--dir` pointing at someone's files must not delete them."""
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(Exception, match="holds no earlier voyage"):
        prepare_dir(tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "mine"
    fresh = prepare_dir(tmp_path / "v")
    (fresh / "report.json").write_text("{}")
    again = prepare_dir(tmp_path / "v")
    assert not (again / "report.json").exists()


@pytest.mark.timeout(600)
def test_ctrl_c_stops_every_process_the_voyage_started(tmp_path: Path) -> None:
    """A demo interrupted half-way must not leave brokers, JVMs or agents behind. It is
    interrupted once every process has started and the Spark applications' JVMs are
    still starting up (the launch's own clean-up; the voyage's run stops the same
    recorded processes, `test_the_voyage_stops_every_process_it_started`)."""
    run = tmp_path / "run"
    out = tmp_path / "out.txt"
    demo = [sys.executable, "-m", "shorelink.cli", "demo", "--ships", "1", "--minutes", "2"]
    proc = run_process("demo", [*demo, "--dir", str(run), "--no-live"], out)
    assert proc.popen is not None
    try:
        eventually(
            lambda: b"waiting for the Spark applications" in out.read_bytes(),
            within=400,
            what="every process to start",
            proc=proc,
            interval=1,
        )
        started = json.loads((run / "stack.json").read_text())
        proc.popen.send_signal(signal.SIGINT)  # Ctrl-C
        assert proc.popen.wait(timeout=120) == 130
    finally:
        if proc.alive():
            kill9(proc)
    pids = [c["pid"] for c in started["sites"].values()]
    pids += [c["pid"] for c in started["ships"].values()]
    pids += [p["pid"] for p in started["processes"].values()]
    pids.append(started["toxiproxy"]["pid"])
    assert len(started["processes"]) >= 4 + 1 + 1  # gateways, Spark, the agent
    assert not [p for p in pids if pid_alive(p)]
    assert not (run / "stack.json").exists() and (run / "stack.stopped.json").exists()
