"""Stopping a component stops its whole process group, even when the leader is gone
and a child it started is left (a Python driver whose spark-submit JVM exited); a
component paused is paused whole when ``pause`` returns."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from local_stack.process import Proc, group_alive
from tests.helpers import eventually


def test_stop_kills_what_the_leader_left_in_its_group(tmp_path: Path) -> None:
    proc = Proc.start(
        "orphan-maker", ["bash", "-c", "(trap '' TERM; sleep 300) & exit 0"], tmp_path / "p.log"
    )
    assert proc.popen is not None
    proc.popen.wait(10)  # the leader is gone at once
    eventually(lambda: group_alive(proc.pid), 5, "the child still in the group")
    proc.stop(grace=0.5)  # SIGTERM is ignored: SIGKILL must reach the child
    assert not group_alive(proc.pid)


#: eight threads that each count as fast as they can
BUSY = """
import threading
def spin():
    n = 0
    while True:
        n += 1
for _ in range(8):
    threading.Thread(target=spin, daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
"""


def _states(pid: int) -> list[str]:
    """Each thread's state letter, as ``/proc/PID/task/TID/status`` says it."""
    out = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        out.append(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("State:")))
    return out


def test_a_paused_process_has_every_thread_stopped_when_pause_returns(tmp_path: Path) -> None:
    """CI: a broker paused with SIGSTOP answered a commit sent right after ``kill``
    returned: the signal stops each thread only when it is next scheduled. Here eight
    busy threads on two cores: when ``pause`` returns, every one is stopped (``T``);
    after ``resume`` they run again."""
    log = tmp_path / "busy.log"
    proc = Proc.start("busy", [sys.executable, "-c", BUSY], log)
    try:
        eventually(lambda: "ready" in log.read_text(), 30, "the threads started")
        for _ in range(5):
            proc.pause()
            states = _states(proc.pid)
            assert len(states) == 9 and set(states) == {"T"}, states
            proc.resume()
            eventually(lambda: "R" in _states(proc.pid), 10, "the threads running again")
    finally:
        proc.stop(grace=1)
