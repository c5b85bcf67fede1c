"""What every shorelink process exports about itself beside its own figures: a
Prometheus registry that starts with the process's resident memory, CPU seconds, open
file descriptors and Python's version (``process_*``, ``python_info``). Each
deployable's metrics start from :func:`process_registry` (prometheus-client is in every
deployable's extra)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector

__all__ = ["process_registry"]


def process_registry() -> CollectorRegistry:
    """A new registry holding the process's own figures."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    return registry
