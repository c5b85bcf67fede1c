"""What every benchmark script here shares: progress lines on stderr, a work directory
that is removed afterwards (or kept with --keep), and signals that unwind through the
scripts' finally blocks so every process they started stops."""

from __future__ import annotations

import argparse
import contextlib
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

__all__ = ["exit_on_signals", "progress", "require_at_least_one", "work_dir"]


def progress(name: str) -> Callable[[str], None]:
    """A ``say(msg)`` that prints ``[name HH:MM:SS] msg`` to stderr."""

    def say(msg: str) -> None:
        print(f"[{name} {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    return say


@contextlib.contextmanager
def work_dir(keep: Path | None, prefix: str) -> Iterator[Path]:
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep.resolve()
        return
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def exit_on_signals(say: Callable[[str], None]) -> None:
    """SIGTERM/SIGHUP raise SystemExit, so the finally blocks stop what was started."""

    def _exit(signum: int, _frame: object) -> None:
        say(f"stopping on signal {signum}: cleaning up")
        sys.exit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit)


def require_at_least_one(p: argparse.ArgumentParser, args: argparse.Namespace, *names: str) -> None:
    """Exit with a usage error naming the option if any of ``names`` is below 1."""
    for name in names:
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
