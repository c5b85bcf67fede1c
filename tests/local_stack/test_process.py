"""Stopping a component stops its whole process group, even when the leader is gone
and a child it started is left (a Python driver whose spark-submit JVM exited)."""

from __future__ import annotations

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
