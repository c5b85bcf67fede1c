"""edge_agent's exceptions: one root, a few subclasses that carry context."""

from __future__ import annotations

from shorelink.errors import ShorelinkError

__all__ = ["EdgeError", "LogError", "LogFullError", "UnusableMessage"]


class EdgeError(ShorelinkError):
    """Root of every edge_agent error."""


class LogError(EdgeError):
    """The on-ship log could not be read or written."""


class LogFullError(LogError):
    """The disk (not the configured budget) is full: nothing was committed, so nothing
    is acknowledged and the broker keeps the messages; retrying after space frees helps."""

    retryable = True


class UnusableMessage(EdgeError):
    """An MQTT message that cannot become a record (no rule maps its topic, payload too
    large, topic not UTF-8, ...). It is counted and quarantined, never a crash."""

    def __init__(self, reason: str, detail: str) -> None:
        self.reason = reason
        super().__init__(f"{reason}: {detail}")
