"""A site's Spark application (``shorelink-spark``): the merge into canonical topics and
the Delta tables.

Its modules, one concept each, are listed in docs/ARCHITECTURE.md; it imports only
``shorelink`` of the project.
"""

__all__ = [
    "access",
    "ais",
    "check",
    "cli",
    "config",
    "contract_sql",
    "customers",
    "errors",
    "feed",
    "feed_guard",
    "feed_loop",
    "ingest_pull",
    "jobs",
    "location",
    "merge",
    "merge_batch",
    "merge_queue",
    "merge_state",
    "metrics",
    "neighbour_admin",
    "ops",
    "packages",
    "progress",
    "pull",
    "pull_plan",
    "purge",
    "quarantine",
    "query",
    "redrive",
    "relay_index",
    "repair",
    "replication",
    "routing",
    "session",
    "status",
    "tables",
    "topics",
]
