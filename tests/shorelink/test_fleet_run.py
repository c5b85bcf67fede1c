"""``shorelink fleet run``: headquarters' loop that publishes every new registry entry
and ticks the rollouts by itself (shorelink/kafka/fleet_run.py). Nobody runs `fleet
publish` or `fleet rollout tick` by hand in a fleet at sea: an entry must reach HQ's
``sl.ingress.registry`` within a check of its writing, a healthy canary must advance and
its entries be published without an operator, and the loop must stop cleanly on
SIGTERM within a bounded wait (systemd's stop)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from local_stack.kafka import KafkaBroker
from shorelink.contract import ingress_topic
from shorelink.fleet.entry import REGISTRY_STREAM, decode_entry
from shorelink.fleet.log import Registry
from shorelink.kafka.errors import UnknownTopic
from shorelink.kafka.fleet_run import HeadquartersLoop
from shorelink.kafka.reading import read_to_end
from tests.helpers import eventually
from tests.shorelink.test_fleet_cli import _ok
from tests.shorelink.test_rollout_cli import _Sea


def _published(kafka: KafkaBroker, reg: Registry) -> list[str]:
    """The kinds of ``reg``'s entries in sl.ingress.registry, in the order written."""
    reg.refresh()
    mine = {e.raw for e in reg.entries()}
    try:
        held = list(read_to_end(kafka.endpoint, [ingress_topic(REGISTRY_STREAM)], settled=True))
    except UnknownTopic:  # before the loop's first publish made it
        return []
    return [decode_entry(m.value() or b"").kind for m in held if (m.value() or b"") in mine]


def test_the_loop_publishes_new_entries_and_moves_a_healthy_rollout_by_itself(
    tmp_path: Path, kafka: KafkaBroker
) -> None:
    r = ["--registry", str(tmp_path / "registry")]
    _ok("init", *r)
    reg = Registry.open(tmp_path / "registry")
    sea = _Sea(kafka)
    # published=0: the shared test broker's sl.registry holds other tests' fleets
    loop = HeadquartersLoop(
        reg.directory,
        kafka.endpoint,
        "hq",
        report_stream=sea.stream,
        tick_every=0.5,
        check_every=0.1,
        published=0,
    )
    thread = threading.Thread(target=loop.run, daemon=True)
    thread.start()
    try:
        for s in ("ship1", "ship2"):
            _ok("provision", s, "--group", "north", *r)
        written = time.monotonic()
        eventually(lambda: len(_published(kafka, reg)) == 7, 20, "the ships' entries published")
        assert time.monotonic() - written < 10, "an entry travels like an alert"

        new = tmp_path / "new.toml"
        new.write_text("[alarms]\nthreshold = 5\n")
        start = ["--group", "north", "--canary", "1", "--healthy-for", "0s", "--stop-at", "0%"]
        out = _ok("rollout", "start", str(new), *start, *r).output
        rid = Registry.open(reg.directory).state.version
        canary = out.split("canary: ")[1].split(";")[0]
        sea.report(canary, rid)

        def advanced() -> bool:
            return Registry.open(reg.directory).state.rollouts[rid].stage == 1

        eventually(advanced, 20, "the loop's tick advanced the healthy canary")
        for s in ("ship1", "ship2"):
            sea.report(s, rid)
        eventually(lambda: "rollout_done" in _published(kafka, reg), 20, "done, and published")
        state = Registry.open(reg.directory).state
        assert state.rollouts[rid].by == "health"
        assert _published(kafka, reg)[-3:] == [
            "rollout_started",
            "rollout_advanced",
            "rollout_done",
        ]
    finally:
        loop.stop.set()
        thread.join(10)
    assert not thread.is_alive(), "the loop stops within a check"


def test_fleet_run_stops_cleanly_on_sigterm(tmp_path: Path, kafka: KafkaBroker) -> None:
    reg = tmp_path / "registry"
    _ok("init", "--registry", str(reg))
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "shorelink.cli", "fleet", "run", "--registry", str(reg)),
            *("--kafka", kafka.bootstrap, "--site", "hq", "--tick-every", "0"),
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if "event=fleet_loop_started" in line:
                break
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        assert proc.wait(30) == 0
        assert time.monotonic() - t0 < 15
        assert "event=fleet_loop_stopped" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
