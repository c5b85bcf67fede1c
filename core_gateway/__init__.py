"""A site's gateway (``shorelink-gateway``): ships' batches in, ``sl.ingress.*`` out,
exactly once.

Its modules, one concept each, are listed in docs/ARCHITECTURE.md; it imports only
``shorelink`` of the project.
"""

__all__ = [
    "admission",
    "app",
    "auth",
    "cli",
    "config",
    "decoding",
    "errors",
    "holdings",
    "ingress",
    "ledger",
    "metrics",
    "service",
    "upload",
]
