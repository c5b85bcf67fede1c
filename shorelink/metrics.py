"""What every shorelink process exports about itself beside its own figures: a
Prometheus registry that starts with the process's resident memory, CPU seconds, open
file descriptors and Python's version (``process_*``, ``python_info``), and the build it
runs (``shorelink_<deployable>_build_info{version, python, ...} 1``: an upgrade seen on
a dashboard, a fleet's versions counted by an alert rule). Each deployable's metrics
start from :func:`process_registry` (prometheus-client is in every deployable's extra)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Info, PlatformCollector, ProcessCollector

from shorelink.version import build_info

__all__ = ["process_registry"]


def process_registry(deployable: str, **info: str) -> CollectorRegistry:
    """A new registry holding the process's own figures and
    ``shorelink_<deployable>_build_info`` (version, python and ``info``)."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    Info(
        f"shorelink_{deployable}_build",
        "The shorelink build this process runs (version from git tags, Python's version)",
        registry=registry,
    ).info(build_info(**info))
    return registry
