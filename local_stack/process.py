"""Starting, watching and stopping the stack's child processes.

Each component runs in its own session (process group), writes to its own log file and
is stopped by pid: SIGTERM to the group, then SIGKILL after a grace period, so nothing
is left behind even if a JVM ignores the first signal.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from local_stack.errors import StackError

__all__ = [
    "Proc",
    "free_port",
    "pid_alive",
    "port_open",
    "stop_pid",
    "stop_pids",
    "stop_procs",
    "wait_until",
]


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free on ``host`` a moment ago (see :func:`free_ports`)."""
    return free_ports(1, host)[0]


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct ports that were free a moment ago, below the range the OS hands
    to outgoing connections: a port from that range (what ``bind(host, 0)`` gives) can
    become some client's local port before the server that was meant to listen on it
    binds it (a broker of a test run failed so, "Address already in use"). Picked at
    random, so that parallel test workers rarely try the same one, each bound while
    the others are picked, and never one this process handed out before."""
    low, high = _LISTEN_PORTS
    socks: list[socket.socket] = []
    picked: list[int] = []
    try:
        for _ in range(50 * n):
            if len(picked) == n:
                return picked
            port = _RANDOM.randint(low, high)
            if port in _handed or port in picked:
                continue
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            try:
                s.bind((host, port))
            except OSError:
                continue
            picked.append(port)
        raise StackError(f"no {n} free ports between {low} and {high} on {host}")
    finally:
        for s in socks:
            s.close()
        _handed.update(picked)


def _listen_ports() -> tuple[int, int]:
    """Ports for the stack's servers: from 20000 to below the OS's ephemeral range."""
    try:
        ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral = 32768
    return (20000, ephemeral - 1) if ephemeral > 22000 else (ephemeral // 2, ephemeral - 1)


_LISTEN_PORTS = _listen_ports()
_handed: set[int] = set()
_RANDOM = random.SystemRandom()  # not the seeded module state a test may have set


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie still "exists": reap it if it is ours, and count it as dead either way
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def group_alive(pgid: int) -> bool:
    """Is any process of the group led by ``pgid`` left (the leader, or a child it
    left behind: a Python driver whose JVM exited)?"""
    if pid_alive(pgid):
        return True
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            return True
    return False


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def stop_pids(pids: list[int], grace: float = 10.0) -> None:
    """Stop the process groups led by ``pids`` together: SIGTERM to all, wait up to
    ``grace`` s, then SIGKILL whatever is left of each group, leader or not (and wait
    for it to go)."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        live = [p for p in pids if group_alive(p)]
        for p in live:
            _signal_group(p, sig)
        deadline = time.monotonic() + wait
        while live and time.monotonic() < deadline:
            time.sleep(0.05)
            live = [p for p in live if group_alive(p)]
        if not live:
            return


def stop_pid(pid: int, grace: float = 10.0) -> None:
    stop_pids([pid], grace)


@dataclass
class Proc:
    """A started component: its name (``kafka:tokyo``), pid and log file."""

    name: str
    pid: int
    log: Path
    popen: subprocess.Popen[bytes] | None = None

    @classmethod
    def start(
        cls,
        name: str,
        argv: list[str],
        log: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> Proc:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            try:
                popen = subprocess.Popen(
                    argv,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    env=env,
                    cwd=cwd,
                )
            except OSError as exc:
                raise StackError(f"{name}: cannot start {argv[0]}: {exc}") from exc
        return cls(name, popen.pid, log, popen)

    def alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        return pid_alive(self.pid)

    def wait_ready(self, check: Callable[[], bool], timeout: float = 60.0) -> None:
        """Wait until ``check()`` is true; raise naming the component and its log if the
        process dies or the time runs out."""
        deadline = time.monotonic() + timeout
        while True:
            if not self.alive():
                raise StackError(
                    f"{self.name} exited during start-up; see {self.log}:\n{self.tail()}"
                )
            if check():
                return
            if time.monotonic() > deadline:
                raise StackError(
                    f"{self.name} not ready after {timeout:.0f}s; see {self.log}:\n{self.tail()}"
                )
            time.sleep(0.1)

    def stop(self, grace: float = 10.0) -> None:
        stop_procs([self], grace)

    def pause(self, timeout: float = 10.0) -> None:
        """SIGSTOP, and return once every thread of it has stopped. The signal stops
        a process's threads one by one as each is next scheduled, after ``kill``
        returns: on a busy machine a paused broker still answered a request sent right
        after (a transaction's commit succeeded that a test expected to hang; CI)."""
        os.kill(self.pid, signal.SIGSTOP)
        wait_until(lambda: _all_stopped(self.pid), timeout, f"{self.name} to stop (SIGSTOP)")

    def resume(self) -> None:
        """SIGCONT: a paused process goes on."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGCONT)

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def _all_stopped(pid: int) -> bool:
    """Is every thread of ``pid`` stopped (state ``T`` in /proc; a process gone counts
    as stopped: there is nothing left to answer)?"""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return True
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                stat = f.read()
        except FileNotFoundError:
            continue  # the thread ended
        # "tid (comm) S ...": the comm may hold spaces and parentheses
        if stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] not in (b"T", b"t", b"Z", b"X"):
            return False
    return True


def stop_procs(procs: list[Proc], grace: float = 10.0) -> None:
    """Stop several started components together and reap them."""
    stop_pids([p.pid for p in procs], grace)
    for p in procs:
        if p.popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.popen.wait(timeout=1)


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise StackError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.1)
