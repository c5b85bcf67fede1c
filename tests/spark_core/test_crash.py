"""The merge driver killed with SIGKILL at random moments, five times, while ingress
keeps arriving (with duplicates): the canonical topic still holds every identity
exactly once with no gap. This is the promise the whole site rests on."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from local_stack.kafka import KafkaBroker
from spark_core.config import SiteConfig
from tests.conftest import unique
from tests.spark_core.conftest import (
    assert_exactly_once,
    canonical,
    create_ingress,
    ledger,
    make_site,
    produce,
    record,
)

pytestmark = pytest.mark.spark

SPARK = [sys.executable, "-m", "spark_core.cli", "site"]


def _start(site: SiteConfig, config: Path, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [*SPARK, "--site", site.name, "--config", str(config), *extra],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: spark-submit JVM + python driver
        )


def _status(site: SiteConfig) -> dict[str, object]:
    try:
        return dict(json.loads((site.checkpoint_dir / "merge.status.json").read_text()))
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _wait(
    what: str, cond: object, proc: subprocess.Popen[bytes], log: Path, timeout: float = 120
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return
        if proc.poll() is not None:
            raise AssertionError(
                f"site job exited ({proc.returncode}) before {what}:\n" + log.read_text()[-3000:]
            )
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}:\n" + log.read_text()[-3000:])


def _batch_done_since(site: SiteConfig, old_pid: object) -> bool:
    """A driver other than ``old_pid`` has committed a batch."""
    st = _status(site)
    return st.get("pid") not in (None, old_pid) and bool(st.get("last_batch"))


def _holds(bootstrap: str, expected: dict[tuple[str, str], int]) -> bool:
    held = ledger(bootstrap)
    return all(str(held.get(k, "")) == f"1-{n}" for k, n in expected.items())


class Feeder(threading.Thread):
    """Gateway-like uploads: ship3 in small transactions, each resending part of the last."""

    def __init__(self, bootstrap: str, stream: str) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.stream = bootstrap, stream
        self.last = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            lo = max(1, self.last - 5)
            hi = self.last + 20
            produce(
                self.bootstrap,
                [record("ship3", self.stream, q, key=f"c{q % 4}") for q in range(lo, hi + 1)],
            )
            self.last = hi
            self.stop.wait(0.5)


def test_driver_killed_five_times_canonical_exactly_once(
    kafka: KafkaBroker, tmp_path: Path
) -> None:
    b = kafka.bootstrap
    s = unique("s")
    create_ingress(b, [s])
    site, config = make_site(b, tmp_path, [s], max_offsets=150)
    produce(b, [record("ship1", s, q) for q in range(1, 401)])
    produce(b, [record("ship1", s, q) for q in range(200, 301)])  # a second upload
    produce(b, [record("ship2", s, q, key="c9") for q in reversed(range(1, 201))])
    feeder = Feeder(b, s)
    feeder.start()
    log = tmp_path / "site.log"
    rng = random.Random()
    pid = None
    for run in range(5):
        proc = _start(site, config, log)
        try:
            # running, with at least one batch of this run behind it
            _wait(
                f"a batch in run {run}",
                lambda old=pid: _batch_done_since(site, old),
                proc,
                log,
            )
            pid = _status(site)["pid"]
            time.sleep(rng.uniform(0.0, 2.0))
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    feeder.stop.set()
    feeder.join(30)
    expected = {("ship1", s): 400, ("ship2", s): 200, ("ship3", s): feeder.last}

    proc = _start(site, config, log)
    try:
        _wait(
            "the merge to catch up",
            lambda: _holds(b, expected),
            proc,
            log,
            timeout=180,
        )
        # a clean stop: SIGTERM to the driver, which stops its query between batches
        driver = int(_status(site)["pid"])  # type: ignore[call-overload]
        os.kill(driver, signal.SIGTERM)
        proc.wait(60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    assert _status(site)["state"] == "stopped"
    assert_exactly_once(canonical(b, s), expected)
    text = log.read_text()
    assert "event=merge_batch" in text
