"""edge_agent's exceptions: one root, a few subclasses that carry context."""

from __future__ import annotations

from shorelink.errors import ShorelinkError
from shorelink.ranges import RangeSet

__all__ = [
    "EdgeError",
    "GatewayGap",
    "GatewayRejected",
    "LinkError",
    "LogError",
    "LogFromNewerAgent",
    "LogFullError",
    "UnusableMessage",
    "UplinkError",
]


class EdgeError(ShorelinkError):
    """Root of every edge_agent error."""


class LogError(EdgeError):
    """The on-ship log could not be read or written."""


class LogFullError(LogError):
    """The disk (not the configured budget) is full: nothing was committed, so nothing
    is acknowledged and the broker keeps the messages; retrying after space frees helps."""

    retryable = True


class LogFromNewerAgent(LogError):
    """The log was migrated by a newer agent (its schema is past the migrations this one
    knows): this agent would write rows without the newer columns' meaning, so it refuses
    to open the log. Retrying does not help: run the newer agent again, or restore the
    copy taken before the migration (docs/edge-agent.md, "Upgrades and rollbacks")."""

    retryable = False

    def __init__(self, path: str, schema: int, known: int, newer: list[str], copy: str | None):
        self.path = path
        #: the log's schema (its newest migration) and the newest this agent knows
        self.schema = schema
        self.known = known
        #: the copy of the log taken before it left this agent's schema, if it is there
        self.copy = copy
        way_back = (
            f"to go back to this version, stop the agent, move {path} aside and restore "
            f"{copy} in its place (records received since the upgrade stay in the moved log)"
            if copy
            else f"no copy of the log at schema {known} is beside it to go back to"
        )
        super().__init__(
            f"log {path} was migrated by a newer agent (schema {schema}: {', '.join(newer)}; "
            f"this agent knows schema {known}) and this agent will not run on it: run the "
            f"newer agent again, or {way_back} (docs/edge-agent.md, Upgrades and rollbacks)"
        )


class UnusableMessage(EdgeError):
    """An MQTT message that cannot become a record (no rule maps its topic, payload too
    large, topic not UTF-8, ...). It is counted and quarantined, never a crash."""

    def __init__(self, reason: str, detail: str) -> None:
        self.reason = reason
        super().__init__(f"{reason}: {detail}")


class UplinkError(EdgeError):
    """Sending to a shore gateway failed; ``site`` names the gateway's site."""

    def __init__(self, message: str, *, site: str = "", retryable: bool | None = None) -> None:
        self.site = site
        super().__init__(f"{site}: {message}" if site else message, retryable=retryable)


class LinkError(UplinkError):
    """The link or the gateway failed (connection refused or reset, timeout, 5xx, 408,
    429): whether the batch in flight arrived is unknown. Retrying later helps; the
    next holdings probe tells what to resend."""

    retryable = True


class GatewayRejected(UplinkError):
    """The gateway refused a request (4xx other than 409): retrying the same request
    cannot help (bad token, other origin, malformed or oversized batch)."""

    retryable = False

    def __init__(
        self,
        status: int,
        error_code: str,
        message: str,
        *,
        site: str = "",
        stream: str = "",
        held: RangeSet | None = None,
    ) -> None:
        self.status = status
        self.error_code = error_code
        self.stream = stream
        self.held = held
        where = f" stream={stream}" if stream else ""
        super().__init__(f"HTTP {status} {error_code}{where}: {message}", site=site)

    @property
    def link_wide(self) -> bool:
        """True when no request to this gateway can succeed (credentials, origin)."""
        return self.status in (401, 403)


class GatewayGap(UplinkError):
    """409: the batch starts beyond what the site holds + 1 (our view of its holdings
    was stale). ``held`` is what it holds: resend from there."""

    retryable = True

    def __init__(
        self, held: RangeSet, message: str = "", *, site: str = "", stream: str = ""
    ) -> None:
        self.held = held
        self.stream = stream
        super().__init__(f"gap in {stream}: site holds {held or 'nothing'}; {message}", site=site)
