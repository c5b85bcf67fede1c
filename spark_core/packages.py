"""Maven coordinates Spark needs on its classpath, matched to the installed pyspark.

Spark 4.0.0 with Delta 4.0.0, both Scala 2.13. Newer complete sets exist: Maven Central
serves ``spark-sql-kafka-0-10_2.13`` and ``spark-token-provider-kafka-0-10_2.13`` for
4.1.1 and 4.2.0 too, and ``delta-spark_2.13`` up to 4.4.0 (its PyPI half asks for
pyspark >= 4.0.1, <= 4.2.0). They are not taken because nothing here needs them:
replication no longer runs Spark streaming queries between sites (spark_core/pull.py),
so Real-time Mode (4.1+) has no hop to speed up, and the alert and steady-lag goals
are met on 4.0.0 (docs/replication.md). Bump these together with the pins in
pyproject.toml, and run ``shorelink stack install`` again (the drivers' class-data
archive is made from the installed pyspark).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["DELTA_VERSION", "SPARK_PACKAGES", "SPARK_VERSION", "spark_package_conf"]

SPARK_VERSION = "4.0.0"
DELTA_VERSION = "4.0.0"
SCALA = "2.13"

SPARK_PACKAGES = (
    f"org.apache.spark:spark-sql-kafka-0-10_{SCALA}:{SPARK_VERSION}",
    f"io.delta:delta-spark_{SCALA}:{DELTA_VERSION}",
)


#: Resolve from Maven Central only (see the comment in the file): package data, so an
#: installed wheel finds it as a checkout does.
IVY_SETTINGS = Path(__file__).resolve().parent / "ivysettings.xml"


def spark_package_conf(ivy_dir: str | None) -> dict[str, str]:
    """Spark conf entries that put the Kafka connector and Delta on the classpath,
    resolved through (and cached in) ``ivy_dir``."""
    conf = {
        "spark.jars.packages": ",".join(SPARK_PACKAGES),
        "spark.jars.ivySettings": str(IVY_SETTINGS),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    }
    if ivy_dir:
        conf["spark.jars.ivy"] = ivy_dir
    return conf
