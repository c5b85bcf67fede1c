"""The ship's agent (``shorelink-edge``): MQTT in, a durable log, uploads to gateways.

Its modules, one concept each, are listed in docs/ARCHITECTURE.md; it imports only
``shorelink`` of the project.
"""

__all__ = [
    "agent",
    "alarms",
    "batching",
    "budget",
    "bundle",
    "cli",
    "clock",
    "config",
    "errors",
    "fleet_config",
    "gateway",
    "ingest",
    "latest",
    "linkstate",
    "log",
    "metrics",
    "migrations",
    "numbering",
    "quarantine",
    "redelivery",
    "report",
    "retention",
    "rules",
    "sealing",
    "segments",
    "session",
    "status",
    "systemd",
    "uplink",
]
