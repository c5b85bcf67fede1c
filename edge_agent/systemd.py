"""sd_notify without a dependency: readiness, watchdog pings and status for systemd's
``Type=notify`` services (a no-op when not run by systemd)."""

from __future__ import annotations

import os
import socket

__all__ = ["notify", "watchdog_interval"]


def notify(state: str) -> bool:
    """Send ``state`` (``READY=1``, ``WATCHDOG=1``, ``STATUS=...``, ``STOPPING=1``) to
    systemd; returns False when there is no ``NOTIFY_SOCKET``."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return False
    if addr.startswith("@"):
        addr = "\0" + addr[1:]  # abstract namespace
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        try:
            s.sendto(state.encode(), addr)
        except OSError:
            return False
    return True


def watchdog_interval() -> float | None:
    """Seconds between watchdog pings (half of ``WatchdogSec``), or None if disabled."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return int(usec) / 1e6 / 2
    except ValueError:
        return None
