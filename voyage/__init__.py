"""The voyage: the whole system on one machine, the main job (``shorelink demo``,
docs/voyage.md). Not a deployable: it starts the deployables through their command
lines and judges them from the outside. Its modules are its surface."""

__all__ = [
    "cli",
    "configs",
    "html",
    "launch",
    "links",
    "live",
    "observe",
    "report",
    "run",
    "summary",
    "topology",
]
