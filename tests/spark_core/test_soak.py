"""The seeded fault soak (``bench/soak.py``): its schedule is a function of the seed
alone (a failing seed replays the same faults) and meets every kind of fault; and one
short seed on real Kafka, gateways, site applications, Mosquitto and edge agents ends
with every identity the ship holds once at every site."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from bench._faults import KINDS, draw, kinds_of, world

ROOT = Path(__file__).resolve().parents[2]

#: the CI seed: over 1.5 minutes of a line of three sites and one ship it draws every
#: kind (a canonical topic's records deleted and its broker killed 15 s later, within
#: Kafka's checkpoint interval; the ship's key replaced twice, two applications
#: restarted without their checkpoints)
CI_SEED = 1


@pytest.mark.parametrize("topology", ["mesh", "line"])
def test_the_same_seed_draws_the_same_schedule_and_another_seed_another(topology: str) -> None:
    """A failing seed is worth something only if it replays the faults it failed under."""
    w = world(topology)
    first = draw(11, 5, w)
    assert draw(11, 5, w) == first
    assert [str(f) for f in draw(11, 5, w)] == [str(f) for f in first]
    assert draw(12, 5, w) != first
    assert draw(11, 5, world("line" if topology == "mesh" else "mesh")) != first


@pytest.mark.parametrize("seed", range(10))
def test_every_kind_of_fault_is_drawn_within_two_minutes(seed: int) -> None:
    """A short run (the CI's) still kills, cuts, slows, pauses, deletes, loses
    checkpoints and changes keys."""
    for topology in ("mesh", "line"):
        counts = kinds_of(draw(seed, 2, world(topology)))
        assert all(counts[k] > 0 for k in KINDS), (topology, counts)


@pytest.mark.parametrize("seed", range(20))
def test_faults_heal_within_the_run_and_never_overlap_on_one_target(seed: int) -> None:
    """The checker runs after everything healed; two faults on one process at once
    (a kill of a paused broker) would make the schedule say less than what ran."""
    w = world("mesh")
    faults = draw(seed, 5, w, max_active=3)
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for f in faults:
        assert f.target in w.targets(f.kind)
        assert f.at > 0 and f.end <= 5 * 60
        assert sum(1 for g in faults if g.at <= f.at < g.end) <= 3
        spans[w.holds(f.kind, f.target)].append((f.at, f.end))
    for held in spans.values():
        held.sort()
        assert all(a_end <= b_at for (_, a_end), (b_at, _) in itertools.pairwise(held))


@pytest.mark.parametrize("topology", ["mesh", "line"])
def test_a_sites_broker_is_killed_or_paused_within_a_minute_of_a_deletion_there(
    topology: str,
) -> None:
    """Kafka writes a partition's new start offset down once a minute: a broker killed
    before brings the deleted records back, the case the self-check's settle waits out
    (review 9, finding 13: a rule kept it out of every schedule, so the soak never met
    the fault its fix handles)."""
    w = world(topology)
    drawn = 0
    for seed in range(20):
        faults = draw(seed, 5, w)
        drawn += any(
            f.kind in ("kill", "pause")
            and f.target == "kafka:" + d.target.split(":", 1)[1].split("/")[0]
            and d.at <= f.at < d.at + 60
            for d in faults
            if d.kind == "retention"
            for f in faults
        )
    assert drawn >= 5, drawn


@pytest.mark.timeout(600)
def test_a_short_seed_ends_with_every_identity_once_at_every_site(tmp_path: Path) -> None:
    """Three sites in a line and a ship under 90 s of seeded faults: once they heal,
    every site holds every record of the ship's log, none twice. The schedule and the
    sites' differences are in the failure message: ``bench/soak.py --seed`` replays it.

    Its convergence bound holds the self-check's settle: a site forgets what its own
    canonical topic lost only once the deletion has held ``self_check_settle`` (90 s)
    since its application's last start (spark_core/repair.py, ``SelfCheck``). The CI
    seed deletes 85% of south's alerts, then restarts south's application 35 s later:
    south lacked 15 records until 125.5 s after the heal on a loaded machine (10:15 on
    2026-11-30; 1.9 s on an idle one, where the broker killed after the deletion had
    brought the records back), against a bound of 150 s."""
    argv = [
        sys.executable,
        str(ROOT / "bench" / "soak.py"),
        *("--seed", str(CI_SEED), "--minutes", "1.5", "--topology", "line"),
        *("--ships", "1", "--rate", "3", "--converge-timeout", "240", "--settle", "5"),
        *("--keep", str(tmp_path / "soak")),
    ]
    with open(tmp_path / "soak.err", "wb") as err_file:
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=err_file, start_new_session=True, cwd=ROOT
        )
        try:  # under the test's timeout, which would end the test inside communicate
            out, _ = proc.communicate(timeout=540)
        finally:
            if proc.returncode is None:  # the soak stops every process it started
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.communicate(timeout=50)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.communicate()
    err = (tmp_path / "soak.err").read_text(errors="replace")
    assert out, f"no result; the soak's progress:\n{err[-5000:]}"
    result = json.loads(out)
    (run,) = result["runs"]
    summary = json.dumps(
        {k: run.get(k) for k in ("schedule", "sites", "errors", "exits", "deleted")}, indent=1
    )
    assert run["verdict"] == "clean", f"{summary}\n{err[-3000:]}"
    assert all(run["applied"][k] > 0 for k in KINDS), run["applied"]
    assert sum(run["records"].values()) > 100
    assert proc.returncode == 0
