"""Benchmark: coverage-guided fuzzing of the boundaries that take outside bytes: the wire
decoder on an upload body, the log formatter and the edge agent's MQTT mapping, for a
time limit.

atheris runs libFuzzer in this Python: it mutates inputs, keeps those that reach new
lines and branches of the instrumented modules (the corpus), and stops at the first
input that fails the target's oracle, writing it out as a reproducer. libFuzzer owns its
process (it exits when done), so this script runs it in a child process of its own,
follows its progress and prints one JSON summary: executions, executions per second,
coverage (libFuzzer's edges and features, the corpus's entries), findings (0 expected),
the target's outcomes and how close any input came to its bounds.

Targets (each module's docstring states its oracle):

- ``wire`` (bench/_fuzz_wire.py): ``peek_header`` and ``decode_columns`` as the gateway
  calls them on an upload body: returns or raises ``WireError`` only (never from its
  catch-all), within ``decode_cost_bound`` (tracemalloc) and a CPU bound, and a batch
  taken obeys the format's rules and comes back the same through ``encode_batch``;
- ``logs`` (bench/_fuzz_logs.py): an event through ``shorelink/logs.py``'s formatter in
  logfmt, logfmt with the journal's priority and JSON: one line, read back by a strict
  reader, its ``ts``, ``level``, ``logger`` and ``event`` the call's, one field per value,
  every value back exactly, bounded output;
- ``mqtt`` (bench/_fuzz_mqtt.py): an MQTT topic and payload through the edge agent's
  mapping rules (``map_message``) as ingest takes them: the stream and key MQTT's own
  matching and the rule's template say, an event time in range or a listed reason, or
  ``UnusableMessage``, never another exception.

The corpus is seeded from real bodies (the encoder's batches of container telemetry and
positions, signed and plain; tests/wire_bombs.py's hostile bodies) and kept between runs
in ``--corpus`` (default ``fuzz-corpus/TARGET``, ignored by git); a finding is written to
``--crashes`` (default ``fuzz-corpus/crashes``) and replays with ``--replay FILE``.

    .venv/bin/python bench/fuzz.py --target wire --seconds 600
    .venv/bin/python bench/fuzz.py --target logs --seconds 60 --seed 7
    .venv/bin/python bench/fuzz.py --target wire --replay fuzz-corpus/crashes/wire-crash-<sha1>

Progress goes to stderr; one JSON object goes to stdout. The exit status is 1 when the
fuzzer found something (or a replayed input still fails), 0 otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the seeds' hostile bodies and the strict log reader: tests/

#: target -> (its module in bench/, the modules whose coverage guides the fuzzer)
TARGETS: dict[str, tuple[str, list[str]]] = {
    "wire": (
        "_fuzz_wire",
        [
            "shorelink.wire",
            "shorelink.wire_body",
            "shorelink.wire_ais",
            "shorelink.contract",
            "shorelink.identity",
        ],
    ),
    "logs": ("_fuzz_logs", ["shorelink.logs", "structlog"]),
    "mqtt": ("_fuzz_mqtt", ["edge_agent.rules"]),
}
#: a hidden target with a planted bug behind a 4-byte pattern that only a fuzzer guided
#: by coverage finds in seconds (tests/shorelink/test_fuzz_bench.py: the harness fuzzes)
SELFCHECK = "selfcheck"
STATS_EVERY_S = 1.0
#: how long past its time limit libFuzzer may take to stop before it is killed
GRACE_S = 120
_PROGRESS = re.compile(r"^#(\d+)\s+(\w+)\s+(.*)$")
_FIELD = re.compile(r"(cov|ft|corp|exec/s|rss): (\S+)")
_STAT = re.compile(r"^stat::(\w+):\s+(\d+)")


def say(msg: str) -> None:
    print(f"[fuzz {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- targets


def _planted(data: bytes) -> None:
    """The self-check's bug: an input starting with ``FUZZ`` fails. One branch per byte:
    each byte right is new coverage, so the fuzzer climbs to it a byte at a time."""
    if len(data) >= 4 and data[0] == 0x46:  # noqa: SIM102
        if data[1] == 0x55:  # noqa: SIM102
            if data[2] == 0x5A:  # noqa: SIM102
                if data[3] == 0x5A:
                    raise AssertionError("the planted bug: an input starting with FUZZ")


def _load(target: str, *, instrument: bool) -> Any:
    """The target's module (``check``, ``seeds``, ``DICTIONARY``, ``stats``); with
    ``instrument``, its modules under test are imported with atheris's coverage."""
    if target == SELFCHECK:
        check: Callable[[bytes], None] = _planted
        if instrument:
            import atheris

            check = atheris.instrument_func(_planted)
        return SimpleNamespace(check=check, seeds=lambda: [b"\x00"], DICTIONARY=[], stats={})
    name, modules = TARGETS[target]
    if not instrument:
        return importlib.import_module(name)
    import atheris

    with atheris.instrument_imports(include=modules):
        for module in modules:
            importlib.import_module(module)
    return importlib.import_module(name)


def _child(target: str, stats_path: Path, libfuzzer_args: list[str]) -> None:
    """In the child: libFuzzer over the target; the target's stats to ``stats_path``
    every second and at a finding (libFuzzer exits the process itself)."""
    import atheris

    # (its "RegEx" hook fails on bytes patterns: atheris 3.0)
    atheris.enabled_hooks.add("str")
    mod = _load(target, instrument=True)
    check = mod.check
    due = [time.monotonic() + STATS_EVERY_S]
    # libFuzzer ends the process without Python's atexit: the stats are written every
    # second and at the last input of a run limited in inputs
    runs = [int(a.split("=", 1)[1]) for a in libfuzzer_args if a.startswith("-runs=")]
    last = [runs[-1] if runs else -1, 0]

    def write_stats() -> None:
        tmp = stats_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(mod.stats))
        tmp.replace(stats_path)

    def one(data: bytes) -> None:
        if time.monotonic() >= due[0]:
            write_stats()
            due[0] = time.monotonic() + STATS_EVERY_S
        last[1] += 1
        try:
            check(data)
        except BaseException:
            write_stats()
            raise
        if last[1] >= last[0] > 0:
            write_stats()

    atheris.Setup([sys.argv[0], *libfuzzer_args], one)
    atheris.Fuzz()


# --------------------------------------------------------------------------- the run


def _seed_corpus(mod: Any, corpus: Path) -> int:
    """The target's seeds into ``corpus`` (named by content: idempotent); the longest."""
    corpus.mkdir(parents=True, exist_ok=True)
    longest = 0
    for data in mod.seeds():
        path = corpus / f"seed-{hashlib.sha1(data).hexdigest()[:16]}"
        if not path.exists():
            path.write_bytes(data)
        longest = max(longest, len(data))
    return longest


def _dictionary(tokens: list[bytes], path: Path) -> None:
    """libFuzzer's dictionary format: one ``"..."`` token a line, bytes as ``\\xNN``."""
    lines = ['"' + "".join(f"\\x{b:02x}" for b in token) + '"' for token in tokens]
    path.write_text("\n".join(lines) + "\n")


class _Follower:
    """Reads libFuzzer's stderr: progress (every ``every`` s to ours), final stats, a
    finding's kind, error and reproducer."""

    def __init__(self, every: float) -> None:
        self.every = every
        self.last_said = 0.0
        self.progress: dict[str, str] = {}
        self.execs = 0
        self.final: dict[str, int] = {}
        self.seed: int | None = None
        self.reproducer: str | None = None
        self.summary: str | None = None
        self.error: list[str] = []
        self._in_error = False
        self.tail: deque[str] = deque(maxlen=60)

    def line(self, text: str) -> None:
        self.tail.append(text)
        if m := _PROGRESS.match(text):
            self.execs = int(m.group(1))
            self.progress.update(_FIELD.findall(m.group(3)))
            if m.group(2) == "DONE" or time.monotonic() - self.last_said >= self.every:
                self.last_said = time.monotonic()
                p = self.progress
                say(
                    f"{self.execs:,} execs, {p.get('exec/s', '?')}/s, cov {p.get('cov', '?')},"
                    f" features {p.get('ft', '?')}, corpus {p.get('corp', '?')},"
                    f" rss {p.get('rss', '?')}"
                )
            return
        if m := _STAT.match(text):
            self.final[m.group(1)] = int(m.group(2))
        elif text.startswith("INFO: Seed: "):
            self.seed = int(text.split()[-1])
        elif "Test unit written to " in text:
            self.reproducer = text.split("Test unit written to ", 1)[1].strip()
            say(f"reproducer: {self.reproducer}")
        elif text.startswith("SUMMARY: libFuzzer: "):
            self.summary = text.removeprefix("SUMMARY: libFuzzer: ").strip()
        elif "=== Uncaught Python exception: ===" in text:
            self._in_error = True
        elif self._in_error:
            if not text.strip() or text.startswith("=="):
                self._in_error = False
            else:
                self.error.append(text)
        if self._in_error or text.startswith(("==", "ALARM", "SUMMARY", "INFO: Loaded")):
            say(text)


def _kind(summary: str | None) -> str:
    s = summary or ""
    if "timeout" in s:
        return "timeout"
    if "out-of-memory" in s:
        return "out_of_memory"
    return "crash"


def run(args: argparse.Namespace) -> int:
    target = args.target
    corpus = (args.corpus or REPO / "fuzz-corpus" / target).resolve()
    crashes = (args.crashes or REPO / "fuzz-corpus" / "crashes").resolve()
    crashes.mkdir(parents=True, exist_ok=True)
    mod = _load(target, instrument=False)
    longest = _seed_corpus(mod, corpus)
    entries_before = sum(1 for _ in corpus.iterdir())
    with tempfile.TemporaryDirectory(prefix="shorelink-fuzz-") as tmp:
        stats_path = Path(tmp) / "stats.json"
        lf = [
            f"-max_total_time={args.seconds}",
            f"-seed={args.seed}",
            f"-timeout={args.timeout}",
            f"-rss_limit_mb={args.rss_limit_mb}",
            f"-max_len={max(args.max_len, longest)}",
            f"-artifact_prefix={crashes}/{target}-",
            "-print_final_stats=1",
        ]
        if args.runs:
            lf.append(f"-runs={args.runs}")
        if mod.DICTIONARY:
            _dictionary(mod.DICTIONARY, Path(tmp) / "tokens.dict")
            lf.append(f"-dict={Path(tmp) / 'tokens.dict'}")
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--target",
            target,
            "--child",
            str(stats_path),
        ]
        say(f"{target}: {args.seconds} s, corpus {corpus} ({entries_before} entries)")
        follow = _Follower(args.progress_every)
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [*cmd, "--", *lf, str(corpus)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,  # atheris writes a finding's traceback to stdout
            text=True,
            errors="replace",
            cwd=tmp,
        )
        watchdog = threading.Timer(args.seconds + GRACE_S, proc.kill)
        watchdog.start()
        try:
            assert proc.stdout is not None
            for text in proc.stdout:
                follow.line(text.rstrip("\n"))
            rc = proc.wait()
        finally:
            watchdog.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        ran = time.monotonic() - t0
        checks = json.loads(stats_path.read_text()) if stats_path.exists() else {}
    found = follow.reproducer is not None or rc != 0
    if found and follow.reproducer is None:
        say("libFuzzer's last lines:\n" + "\n".join(follow.tail))
    execs = follow.final.get("number_of_executed_units", follow.execs)
    result = {
        "target": target,
        "time_limit_s": args.seconds,
        "runs_limit": args.runs or None,
        "ran_s": round(ran, 1),
        "seed": follow.seed,
        "executions": execs,
        "exec_per_s": round(execs / ran) if ran else None,
        "coverage": {
            "edges": _int(follow.progress.get("cov")),
            "features": _int(follow.progress.get("ft")),
            "corpus_entries": sum(1 for _ in corpus.iterdir()),
            "corpus_entries_before": entries_before,
        },
        "findings": int(found),
        "finding": None
        if not found
        else {
            "kind": _kind(follow.summary),
            "error": follow.error[0] if follow.error else follow.summary,
            "traceback": follow.error[1:][-30:],
            "reproducer": follow.reproducer,
            "exit_status": rc,
        },
        "compared_with": "0 findings: the target's oracle and bounds (bench/_fuzz_*.py)",
        "peak_rss_mb": follow.final.get("peak_rss_mb"),
        "slowest_input_s": follow.final.get("slowest_unit_time_sec"),
        "checks": checks,
        "corpus": str(corpus),
    }
    print(json.dumps(result, indent=2), flush=True)
    return 1 if found else 0


def _int(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None


def replay(args: argparse.Namespace) -> int:
    """Each file through the target's check, once, in this process."""
    mod = _load(args.target, instrument=False)
    out = []
    for path in args.replay:
        try:
            mod.check(path.read_bytes())
            out.append({"file": str(path), "fails": False})
            say(f"{path}: passes")
        except Exception as exc:
            say(f"{path}: fails\n" + "".join(traceback.format_exception(exc)).rstrip())
            out.append({"file": str(path), "fails": True, "error": f"{exc!r}"[:2000]})
    print(json.dumps({"target": args.target, "replayed": out}, indent=2), flush=True)
    return 1 if any(r["fails"] for r in out) else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    libfuzzer: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, libfuzzer = argv[:at], argv[at + 1 :]
    doc = __doc__ or ""
    p = argparse.ArgumentParser(
        prog="bench/fuzz.py",
        description=doc.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Progress goes to stderr; one JSON object goes to stdout.",
    )
    p.add_argument(
        "--target",
        required=True,
        choices=[*TARGETS, SELFCHECK],
        metavar="{" + ",".join(TARGETS) + "}",
        help="what to fuzz",
    )
    p.add_argument("--seconds", type=int, default=60, help="time limit (default 60)")
    p.add_argument(
        "--runs",
        type=int,
        default=0,
        help="stop after this many inputs, or at the time limit (default 0: the time limit)",
    )
    p.add_argument("--seed", type=int, default=0, help="libFuzzer's seed (default 0: random)")
    p.add_argument(
        "--corpus", type=Path, default=None, help="corpus directory (default fuzz-corpus/TARGET)"
    )
    p.add_argument(
        "--crashes",
        type=Path,
        default=None,
        help="where a finding's input is written (default fuzz-corpus/crashes)",
    )
    p.add_argument(
        "--replay",
        type=Path,
        nargs="+",
        default=None,
        metavar="FILE",
        help="run the target once on each FILE (a reproducer) instead of fuzzing",
    )
    p.add_argument(
        "--timeout", type=int, default=30, help="seconds one input may take (default 30)"
    )
    p.add_argument(
        "--rss-limit-mb", type=int, default=2048, help="the fuzzer's memory limit (default 2048)"
    )
    p.add_argument(
        "--max-len",
        type=int,
        default=4096,
        help="longest input (default 4096, or the longest seed)",
    )
    p.add_argument(
        "--progress-every", type=float, default=10.0, help="seconds between progress lines"
    )
    p.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.seconds < 1:
        p.error("--seconds must be at least 1")
    if args.child is not None:
        _child(args.target, args.child, libfuzzer)
        return 0
    if args.replay:
        return replay(args)
    signal.signal(signal.SIGTERM, lambda signum, _f: sys.exit(128 + signum))
    return run(args)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
