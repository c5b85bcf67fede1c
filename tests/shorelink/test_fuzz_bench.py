"""bench/fuzz.py, short: the coverage-guided fuzzers of the wire decoder, the log
formatter and the MQTT mapping run for seconds and find nothing, and the harness does
find a planted bug. Long runs are the bench's (docs/wire-format.md, "Fuzzing"); here
each fuzzer runs long enough to show it is fuzzing (thousands of inputs, a corpus that
grows past its seeds), so that a fuzzer that silently stopped fuzzing (an import that
lost its coverage, an oracle that can never fail) fails a test instead of reporting 0
findings for ever."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
FUZZ = ROOT / "bench" / "fuzz.py"

pytestmark = pytest.mark.skipif(
    platform.machine() != "x86_64", reason="atheris has wheels for x86_64 only (the dev extra)"
)


def _fuzz(tmp_path: Path, *args: str) -> tuple[int, dict[str, Any]]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    run = subprocess.run(
        [sys.executable, str(FUZZ), *args],
        capture_output=True,
        text=True,
        timeout=150,
        env=env,
        cwd=tmp_path,
    )
    try:
        return run.returncode, json.loads(run.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"no JSON (exit {run.returncode}):\n{run.stderr[-3000:]}") from None


#: inputs per target: seconds each (the wire target makes about 2,000 a second, the log
#: target 300 to 1,000, the MQTT one 40,000), a limit in inputs rather than seconds so
#: that a loaded machine makes the test slower, not weaker (90 s at most)
RUNS = {"wire": 6000, "logs": 2000, "mqtt": 20000}


@pytest.mark.parametrize("target", sorted(RUNS))
def test_the_fuzzer_runs_thousands_of_inputs_and_finds_nothing(target: str, tmp_path: Path) -> None:
    """The decoder and the formatter keep their promises on every input of a short run
    (seeded from real bodies), and the run explores: its corpus grows past the seeds."""
    rc, out = _fuzz(
        tmp_path,
        *("--target", target, "--runs", str(RUNS[target]), "--seconds", "90", "--seed", "1"),
        *("--corpus", str(tmp_path / "corpus"), "--crashes", str(tmp_path / "crashes")),
    )
    assert out["findings"] == 0 and rc == 0, out["finding"]
    assert out["executions"] >= RUNS[target], out
    cov = out["coverage"]
    assert cov["corpus_entries"] > cov["corpus_entries_before"] and cov["edges"] > 50, cov
    outcomes = out["checks"]["outcomes"]
    if target == "wire":  # batches taken and refusals of several kinds
        assert outcomes["ok"] > 0 and len(outcomes) >= 5, outcomes
    elif target == "logs":  # our events of several levels and other libraries' records
        assert outcomes["library"] > 0 and len(outcomes) >= 5, outcomes
    else:  # messages mapped, with and without their event time, and refused
        assert outcomes["ok"] > 0 and outcomes["unmapped_topic"] > 0, outcomes
    assert not list((tmp_path / "crashes").iterdir())


def test_the_fuzzer_finds_a_planted_bug_and_its_reproducer_replays(tmp_path: Path) -> None:
    """A hidden target fails only on inputs starting with ``FUZZ``: random inputs would
    take about four billion tries, a coverage-guided fuzzer a fraction of a second. The
    run stops at it, says so (exit 1) and writes the input, which ``--replay`` fails on."""
    rc, out = _fuzz(
        tmp_path,
        *("--target", "selfcheck", "--seconds", "30", "--seed", "1"),
        *("--corpus", str(tmp_path / "corpus"), "--crashes", str(tmp_path / "crashes")),
    )
    assert rc == 1 and out["findings"] == 1, out
    assert out["ran_s"] < 25 and "planted bug" in out["finding"]["error"], out
    reproducer = Path(out["finding"]["reproducer"])
    assert reproducer.read_bytes().startswith(b"FUZZ")
    rc, replayed = _fuzz(tmp_path, "--target", "selfcheck", "--replay", str(reproducer))
    assert rc == 1 and replayed["replayed"][0]["fails"], replayed
