"""Errors of the local stack manager."""

from __future__ import annotations

from shorelink.errors import ShorelinkError

__all__ = ["StackError"]


class StackError(ShorelinkError):
    """A stack component could not be installed, started or found. The message names
    the component and, when there is one, its log file."""
