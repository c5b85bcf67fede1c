"""Which extra of the package brings what each command needs, and the one line an install
without it prints instead of a traceback (docs/install.md).

One package, one extra per deployable (pyproject.toml): a ship installs ``[edge]``, a
gateway ``[gateway]``, a site's application ``[spark]``, a developer ``[demo]``. Every
install has all four programs, though, and the ``shorelink`` command loads the others'
subcommands by entry point, so a lean install can meet a command whose packages it lacks
(``shorelink demo`` on a gateway: rich; ``shorelink-gateway`` on a ship: confluent-kafka).
The review found that ending in a traceback, or in advice to install ``[all]`` when the
package was in ``[demo]``. Here, once: the extra of each program and command
(``EXTRAS``), the message (``missing_extra``), and the guard every program runs under
(``needs_extra``; ``launch`` for the console scripts, which must start it before the
deployable's own imports).

The console scripts name their deployable's ``main`` as a string, loaded as an entry
point is: the kernel imports nothing above it (tests/test_layout.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from importlib.metadata import EntryPoint

from shorelink.cli_support import fail
from shorelink.errors import ShorelinkError

__all__ = [
    "EXTRAS",
    "MissingExtra",
    "edge",
    "gateway",
    "launch",
    "missing_extra",
    "needs_extra",
    "spark",
]

#: the extras of pyproject.toml that bring each program's (or ``shorelink`` command's)
#: packages, the first the one to name; ``tests/test_extras.py`` checks each against
#: pyproject and the imports
EXTRAS: dict[str, tuple[str, ...]] = {
    "shorelink-edge": ("edge",),
    "shorelink-gateway": ("gateway",),
    "shorelink-spark": ("spark",),
    "shorelink audit": ("gateway", "spark"),
    "shorelink consume": ("gateway", "spark"),
    "shorelink ops": ("spark",),
    "shorelink ops-users": ("spark",),
    "shorelink stack": ("demo",),
    "shorelink demo": ("demo",),
}

#: the project's own top-level packages: one of them missing is a broken install (or a
#: bug), not an extra left out, and keeps its traceback
PROJECT = frozenset(
    {"shorelink", "edge_agent", "core_gateway", "spark_core", "local_stack", "fleet_sim", "voyage"}
)


class MissingExtra(ShorelinkError):
    """A command ran in an install without the extra that brings its packages."""

    def __init__(self, command: str, module: str, extras: tuple[str, ...]) -> None:
        self.command, self.module, self.extras = command, module, extras
        which = " or ".join(f"[{e}]" for e in extras)
        super().__init__(
            f"`{command}` needs {module}, which this install lacks: it comes with "
            f"shorelink's {which} extra (from a clone: pip install '.[{extras[0]}]'; "
            "docs/install.md)"
        )


def missing_extra(command: str, exc: ImportError) -> MissingExtra | None:
    """The error to print for ``command`` failing on ``exc``; None when the module is
    not a third party's or the command's extra is unknown (the traceback stays)."""
    module = (exc.name or "").split(".")[0]
    extras = EXTRAS.get(command)
    if not module or module in PROJECT or extras is None:
        return None
    return MissingExtra(command, module, extras)


@contextlib.contextmanager
def needs_extra(command: str) -> Iterator[None]:
    """Run ``command``'s code; a third-party module missing ends it with one line naming
    the extra that brings it (``error: ...``, exit 2)."""
    try:
        yield
    except ImportError as exc:
        error = missing_extra(command, exc)
        if error is None:
            raise
        fail(error)


def launch(command: str, target: str) -> None:
    """Import ``target`` (``module:function``, a deployable's click group) and run it,
    both under ``needs_extra(command)``."""
    with needs_extra(command):
        EntryPoint(name=command, value=target, group="console_scripts").load()()


def edge() -> None:
    """``shorelink-edge``: the ship's agent (``edge_agent.cli``)."""
    launch("shorelink-edge", "edge_agent.cli:main")


def gateway() -> None:
    """``shorelink-gateway``: a site's gateway (``core_gateway.cli``)."""
    launch("shorelink-gateway", "core_gateway.cli:main")


def spark() -> None:
    """``shorelink-spark``: a site's Spark application (``spark_core.cli``)."""
    launch("shorelink-spark", "spark_core.cli:main")
