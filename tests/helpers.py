"""The tests' one harness for time, child processes and names, on ``local_stack.process``
(the code `shorelink stack` starts its components with): wait until something holds,
polled in a thread or on the event loop, and start a process in its own group with its
own log, so a test that fails says what it waited for and shows the process's last
lines; and a name (topic, client id) no other test uses."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import tomli_w

from local_stack.process import Proc
from shorelink.files import write_atomic

__all__ = [
    "eventually",
    "eventually_async",
    "grows_to",
    "kill9",
    "run_process",
    "unique",
    "write_toml",
]


def unique(prefix: str) -> str:
    """A name no other test uses (topics, client ids, ...)."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def write_toml(path: Path, doc: dict[str, Any]) -> Path:
    """Write a deployable's config file from ``doc`` (tomli-w quotes and escapes every
    value, as voyage/configs.py does), mode 0600 as a config that holds a secret must be
    (``edge_agent`` refuses a token in a file others may read); tests about particular
    TOML text write it as text."""
    write_atomic(path, tomli_w.dumps(doc), mode=0o600)
    return path


#: a check that costs time (reading whole topics, a Spark job) is asked again only after
#: this many times its own duration: the waiting test takes at most a third of a core
#: (and of the brokers it reads from), and notices the condition at most that much later
POLL_COST_FACTOR = 2.0


def _polls(
    check: Callable[[], object], within: float, what: str, proc: Proc | None, interval: float
) -> Iterator[float]:
    """Yield how long the caller sleeps until ``check()`` holds: ``interval``, or
    :data:`POLL_COST_FACTOR` times what the last check took if longer; fail naming
    ``what`` after ``within`` s, or as soon as ``proc`` has exited, with the tail of its
    log."""
    deadline = time.monotonic() + within
    while True:
        began = time.monotonic()
        if check():
            return
        spent = time.monotonic() - began
        if proc is not None and not proc.alive():
            raise AssertionError(
                f"{proc.name} exited before {what}; see {proc.log}:\n{proc.tail()}"
            )
        if time.monotonic() > deadline:
            tail = f"; see {proc.log}:\n{proc.tail()}" if proc is not None else ""
            raise AssertionError(f"timed out after {within:g}s waiting for {what}{tail}")
        yield min(max(interval, POLL_COST_FACTOR * spent), max(0.0, deadline - time.monotonic()))


def eventually(
    check: Callable[[], object],
    within: float = 20,
    what: str = "condition",
    *,
    proc: Proc | None = None,
    interval: float = 0.05,
) -> None:
    """Poll ``check`` until it is true (every ``interval`` s, or less often when the check
    itself takes long: :func:`_polls`); fail naming ``what`` after ``within`` s, or as
    soon as ``proc`` (the process that should make it true) has exited."""
    for delay in _polls(check, within, what, proc, interval):
        time.sleep(delay)


async def eventually_async(
    check: Callable[[], object],
    within: float = 20,
    what: str = "condition",
    *,
    proc: Proc | None = None,
    interval: float = 0.02,
) -> None:
    """:func:`eventually` on the event loop: servers and agents in the test keep running
    while it waits."""
    for delay in _polls(check, within, what, proc, interval):
        await asyncio.sleep(delay)


def grows_to(
    count: Callable[[], int], target: int, what: str, *, stall: float = 30, proc: Proc | None = None
) -> None:
    """Poll ``count`` until it reaches ``target``; fail only when it has not grown for
    ``stall`` s (work slowed by a busy machine is not stuck work), saying how far it got,
    or as soon as ``proc`` has exited."""
    reached, grown_at = -1, time.monotonic()
    while (now := count()) < target:
        if now > reached:
            reached, grown_at = now, time.monotonic()
        elif proc is not None and not proc.alive():
            raise AssertionError(f"{proc.name} exited at {now} of {target} {what}:\n{proc.tail()}")
        elif time.monotonic() - grown_at > stall:
            tail = f"; see {proc.log}:\n{proc.tail()}" if proc is not None else ""
            raise AssertionError(f"{what} stopped at {reached} of {target} for {stall:g}s{tail}")
        time.sleep(0.2)


def run_process(
    name: str,
    argv: list[str],
    log: Path,
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> Proc:
    """Start ``argv`` in its own process group, output appended to ``log``; stop it with
    ``Proc.stop`` (SIGTERM to the group, then SIGKILL) or :func:`kill9`."""
    return Proc.start(name, argv, log, env=env, cwd=cwd)


def kill9(proc: Proc, *, group: bool = False, timeout: float = 30) -> None:
    """SIGKILL the process and reap it: the process alone (its children see their parent
    vanish), or with ``group`` its whole process group (a JVM and its driver at once)."""
    assert proc.popen is not None
    if group:
        os.killpg(proc.pid, signal.SIGKILL)
    else:
        proc.popen.send_signal(signal.SIGKILL)
    proc.popen.wait(timeout)


def build_info_line(deployable: str, **extra: str) -> str:
    """The ``shorelink_<deployable>_build_info`` sample this installation's processes
    export (prometheus-client's text format: labels sorted by name)."""
    import platform

    from shorelink.version import version

    labels = {"python": platform.python_version(), "version": version(), **extra}
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"shorelink_{deployable}_build_info{{{inner}}} 1.0"


def build_version(tree: Path) -> str:
    """The version a build of ``tree`` gets (setuptools-scm reads its pyproject.toml and
    its git, as pip's build does)."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "setuptools_scm"],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout.strip().splitlines()[-1]
