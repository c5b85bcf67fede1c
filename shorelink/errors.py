"""The shared kernel's exceptions. Each deployable has its own root that subclasses
:class:`ShorelinkError`, so a caller can catch one package's failures or all of them."""

from __future__ import annotations

__all__ = ["ConfigError", "ConfigErrors", "ContractError", "ShorelinkError"]


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


class ConfigErrors(ConfigError):
    """Several keys of one file are invalid at once: ``errors``, each a
    :class:`ConfigError` naming its key, one per line of the message (a file's reader
    reports every bad key, not only the first). ``field`` is the first one's."""

    def __init__(self, errors: list[ConfigError]) -> None:
        self.errors = tuple(errors)
        self.field = self.errors[0].field
        ShorelinkError.__init__(self, "\n".join(str(e) for e in self.errors))

    @staticmethod
    def of(errors: list[ConfigError]) -> ConfigError:
        """One error as itself, several as one :class:`ConfigErrors` (nested ones
        flattened, each message once)."""
        flat: dict[str, ConfigError] = {}
        for e in errors:
            for one in e.errors if isinstance(e, ConfigErrors) else (e,):
                flat.setdefault(str(one), one)
        return next(iter(flat.values())) if len(flat) == 1 else ConfigErrors(list(flat.values()))


class ContractError(ShorelinkError):
    """A Kafka record or identity does not follow the record contract (docs/design.md, "The
    record contract")."""
