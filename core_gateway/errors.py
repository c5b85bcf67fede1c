"""core_gateway's exceptions. :class:`ApiError` carries the HTTP status and the JSON
error code a client sees; everything else is an internal failure (503 or 500)."""

from __future__ import annotations

from shorelink.errors import ShorelinkError

__all__ = ["ApiError", "GatewayError", "KafkaWriteError"]


class GatewayError(ShorelinkError):
    """Root of every core_gateway error."""


class ApiError(GatewayError):
    """A request the gateway refuses: ``status`` (4xx), ``code`` for the JSON body, and
    extra fields (e.g. ``held`` on a 409)."""

    def __init__(self, status: int, code: str, message: str, **extra: object) -> None:
        super().__init__(message, retryable=status in (409, 429) or status >= 500)
        self.status = status
        self.code = code
        self.extra = extra

    def body(self) -> dict[str, object]:
        """The JSON a client gets (the body of a refused request, or of a refused
        batch's answer on an upload connection): ``{"error", "message", **extra}``."""
        return {"error": self.code, "message": str(self), **self.extra}


class KafkaWriteError(GatewayError):
    """Kafka did not take a batch (the transaction aborted, or its outcome is unknown:
    the site's holdings tell). ``fatal``: the producer is unusable; the gateway stops
    accepting until it has re-created it and re-read its cursor. ``fenced``: another
    gateway of this site took over; this one stops accepting for good."""

    retryable = True

    def __init__(self, message: str, *, fatal: bool = False, fenced: bool = False) -> None:
        super().__init__(message)
        self.fatal = fatal or fenced
        self.fenced = fenced
