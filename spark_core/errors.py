"""spark_core's root exception: a caller catches every failure of the site's Spark
application with one clause, and the kernel's :class:`ShorelinkError` above it.

The subclasses stay beside the concept they report on:
:class:`~spark_core.merge_state.MergeError` (a batch not written, or the merge fenced) and
:class:`~spark_core.access.AccessError` (the site's Kafka refused an access change).
"""

from __future__ import annotations

from shorelink.errors import ShorelinkError

__all__ = ["SparkCoreError"]


class SparkCoreError(ShorelinkError):
    """Root of every spark_core error."""
