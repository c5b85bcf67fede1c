"""Where batches are built: the child process, and the fallback to a thread when the
machine cannot give the agent one (here: a read-only /dev/shm in a mount namespace of
this test's own, where Python's multiprocessing cannot make its semaphores)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import asyncio, sys
from pathlib import Path
from edge_agent.batching import BatchBuilder, BuildSpec
from edge_agent.status import open_log
from shorelink.ranges import RangeSet
from shorelink.wire import decode_batch
from tests.edge_agent.uplink_helpers import fill, uplink_config

cfg = uplink_config(Path(sys.argv[1]), gateways=[("tokyo", "port_wifi")])
log = open_log(cfg)
fill(log, "containers", 50)
spec = BuildSpec("containers", 50, None, None, RangeSet(), False, 100, 1 << 20, None)
b = BatchBuilder(log, workers=1)
built = asyncio.run(b.build(spec))
b.close()
assert built.body is not None
print(b.workers, built.first, built.last, len(decode_batch(built.body).records))
"""


def test_without_a_usable_dev_shm_batches_are_built_in_a_thread(tmp_path: Path) -> None:
    run = subprocess.run(
        [
            "unshare",
            "--mount",
            "sh",
            "-c",
            'mount -t tmpfs -o ro,size=1m tmpfs /dev/shm && exec "$0" -c "$1" "$2"',
            sys.executable,
            SCRIPT,
            str(tmp_path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == ["0", "1", "50", "50"]  # workers fell back to 0
    assert "event=workers_unavailable pool=batch_builder fallback=thread" in run.stderr
