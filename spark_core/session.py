"""A local Spark session and the Ivy cache its JVM packages come from, built in one place.

``shorelink-spark query``, the tests and the merge benchmark all run Spark in their own
process; each needs the same packages (``spark_core/packages.py``: those of the Spark
that runs) resolved from the Ivy cache ``scripts/setup`` fills, so none of them spells
the cache's place or the session's make-up again. The site application itself goes through ``spark-submit``
(``spark_core/cli.py``), which takes :func:`ivy_dir` too. :func:`resolve_packages` fills
that cache once (``shorelink-spark install``, which ``shorelink stack install`` runs).

Every streaming query of a site starts the same way too: :func:`trigger` (the site's
trigger interval, or AvailableNow for catch-up runs) and :func:`scheduler_pool` (the
FAIR scheduler's pool its jobs run in: urgent streams apart from the rest).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_core.packages import spark_package_conf, spark_packages

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "SCHEDULER_CONF",
    "ivy_dir",
    "local_session",
    "resolve_packages",
    "scheduler_pool",
    "trigger",
]

#: The FAIR scheduler and its pools (spark_core/pools.xml: urgent served first), for
#: every Spark session that runs a site's queries
SCHEDULER_CONF = {
    "spark.scheduler.mode": "FAIR",
    "spark.scheduler.allocation.file": str(Path(__file__).resolve().parent / "pools.xml"),
}


def trigger(writer: Any, interval_s: float, available_now: bool) -> Any:
    """A streaming writer's trigger: every ``interval_s``, or AvailableNow (process
    what is there, then finish)."""
    if available_now:
        return writer.trigger(availableNow=True)
    return writer.trigger(processingTime=f"{int(interval_s * 1000)} milliseconds")


@contextlib.contextmanager
def scheduler_pool(spark: Any, pool: str | None) -> Iterator[None]:
    """Queries started inside run their jobs in ``pool`` (``spark.scheduler.mode=FAIR``;
    a streaming query takes the local properties of the thread that starts it)."""
    sc = spark.sparkContext
    sc.setLocalProperty("spark.scheduler.pool", pool)
    try:
        yield
    finally:
        sc.setLocalProperty("spark.scheduler.pool", None)


def ivy_dir() -> Path:
    """The Ivy cache ``scripts/setup`` fills (``$SHORELINK_TOOLS/ivy``, by default
    ``~/.cache/shorelink/ivy``)."""
    tools = os.environ.get("SHORELINK_TOOLS", str(Path.home() / ".cache" / "shorelink"))
    return Path(tools) / "ivy"


def local_session(
    app: str,
    master: str = "local[2]",
    *,
    conf: Mapping[str, str] | None = None,
    ivy: Path | None = None,
    log_level: str = "WARN",
    packages: Sequence[str] | None = None,
) -> SparkSession:
    """A Spark session in this process with ``packages`` on its classpath (default: the
    Kafka connector and Delta of the Spark that runs), resolved through ``ivy`` (default
    :func:`ivy_dir`). ``conf`` is applied after the package settings, so it may override
    them."""
    from pyspark.sql import SparkSession

    settings = spark_package_conf(
        str(ivy or ivy_dir()), None if packages is None else tuple(packages)
    )
    settings.update(conf or {})
    builder = SparkSession.builder.master(master).appName(app)
    for k, v in settings.items():
        builder = builder.config(k, v)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(log_level)
    return session


def resolve_packages(ivy: Path | None = None, extra: Sequence[str] = ()) -> bool:
    """Resolve the packages of the Spark that runs, and ``extra``, into the Ivy cache
    ``ivy`` (default :func:`ivy_dir`) once, so the site application, queries and tests
    start without the network. A marker per set of packages makes a second call a no-op:
    True when this call resolved them, False when they were there."""
    ivy = ivy or ivy_dir()
    packages = (*spark_packages(), *extra)
    digest = hashlib.sha256(",".join(packages).encode()).hexdigest()[:12]
    marker = ivy / f".resolved-{digest}"
    if marker.exists():
        return False
    ivy.mkdir(parents=True, exist_ok=True)
    spark = local_session("shorelink-resolve", "local[1]", ivy=ivy, packages=packages)
    try:
        spark.range(1).count()
    finally:
        spark.stop()
    marker.write_text(",".join(packages) + "\n")
    return True
