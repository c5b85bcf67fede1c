"""Where batches are built: the child process, and the fallback to a thread when the
machine cannot give the agent one (here: a read-only /dev/shm in a mount namespace of
this test's own, where Python's multiprocessing cannot make its semaphores); and how
(AIS sentences as fields, or not: ``uplink.ais_fields``)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from edge_agent.batching import BatchBuilder, BuildSpec, SealSpec
from edge_agent.status import open_log
from shorelink.ranges import RangeSet
from shorelink.wire import FLAG_AIS, decode_batch, peek_header
from tests.edge_agent.uplink_helpers import fill_ais, uplink_config

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


def test_ais_sentences_go_as_fields_unless_uplink_ais_fields_is_off(tmp_path: Path) -> None:
    """``uplink.ais_fields = false`` is how a ship talks to a gateway from before the
    coding (it refuses FLAG_AIS as bad_version): neither the batches it builds nor the
    segments it seals carry it, and a segment sealed with it before is encoded again
    rather than sent."""
    log = open_log(uplink_config(tmp_path, gateways=[("tokyo", "satellite")]))
    fill_ais(log, "nav", 200)
    spec = BuildSpec("nav", 200, None, None, RangeSet(), False, 100, 1 << 20, None)
    on, off = BatchBuilder(log, workers=0), BatchBuilder(log, workers=0, ais_fields=False)
    try:
        for builder, flagged in ((on, True), (off, False)):
            built = asyncio.run(builder.build(spec))
            assert built.body is not None and not built.sealed
            assert bool(peek_header(built.body).flags & FLAG_AIS) is flagged
            assert [r.payload for r in decode_batch(built.body).records] == [
                r.payload for r in log.read("nav", 1, 100)
            ]
        seal_spec = SealSpec("nav", 1, 200, 100, 1 << 20)
        sealed = asyncio.run(on.seal(seal_spec))
        assert sealed is not None and sealed.flags & FLAG_AIS
        assert log.segments.add("nav", sealed)
        assert asyncio.run(on.build(spec)).sealed
        assert asyncio.run(off.seal(seal_spec)).flags & FLAG_AIS == 0  # type: ignore[union-attr]
        built = asyncio.run(off.build(spec))
        assert built.body is not None and not built.sealed
        assert not peek_header(built.body).flags & FLAG_AIS
    finally:
        on.close()
        off.close()
        log.close()
