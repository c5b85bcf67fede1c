"""This installation's version: what ``--version`` prints, what every deployable's
``*_build_info`` metric and the ship report carry.

It is set when the distribution is built, from git (setuptools-scm, ``pyproject.toml``):
a commit tagged ``v1.2.0`` builds ``1.2.0``; a later commit ``1.2.1.devN+g<hash>`` (N
commits past the tag), with ``.d<date>`` when the tree had uncommitted changes. A
clone without tags counts from the fallback, ``0.1.0``: ``0.1.1.devN+g<hash>``; a tree
without git metadata at all (a copied folder) builds ``0.1.0`` exactly. An sdist and a
wheel carry the version they were built with. CHANGELOG.md says what each release
changed.
"""

from __future__ import annotations

import platform
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _dist_version

__all__ = ["DISTRIBUTION", "UNKNOWN", "build_info", "version"]

DISTRIBUTION = "shorelink"
#: the version of code run from a folder no installation describes
UNKNOWN = "0+unknown"


def version() -> str:
    """The installed distribution's version (:data:`UNKNOWN` when not installed)."""
    try:
        return _dist_version(DISTRIBUTION)
    except PackageNotFoundError:
        return UNKNOWN


def build_info(**extra: str) -> dict[str, str]:
    """The labels of a ``*_build_info`` metric: this version, Python's, and ``extra``
    (the site application adds Spark's)."""
    return {"version": version(), "python": platform.python_version(), **extra}
