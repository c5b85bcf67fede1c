"""The shared kernel's exceptions. Each deployable has its own root that subclasses
:class:`ShorelinkError`, so a caller can catch one package's failures or all of them."""

from __future__ import annotations

__all__ = ["ConfigError", "ContractError", "ShorelinkError"]


class ShorelinkError(Exception):
    """Root of every shorelink exception.

    ``retryable`` says whether trying the same thing again later can succeed (a link that
    is down) or not (a malformed batch).
    """

    retryable: bool = False

    def __init__(self, message: str, *, retryable: bool | None = None) -> None:
        super().__init__(message)
        if retryable is not None:
            self.retryable = retryable


class ConfigError(ShorelinkError):
    """A configuration file or value is invalid; ``field`` names the offending key."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


class ContractError(ShorelinkError):
    """A Kafka record or identity does not follow the record contract (docs/design.md, "The
    record contract")."""
