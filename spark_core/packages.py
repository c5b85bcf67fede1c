"""Which Spark runs the site application, and the Maven packages that match it.

A data centre's Spark is the platform's (a Spark distribution at ``SPARK_HOME``, as on
YARN, EMR, Dataproc or a Kubernetes image), not necessarily the pyspark this
environment installed. :func:`spark_home` is the Spark that runs: ``SPARK_HOME`` when
set (pyspark itself then launches that Spark's JVM), else the installed pyspark's own
directory, which is laid out like a distribution (``bin/spark-submit``, ``jars/``).
:func:`spark_version` reads that Spark's version from its ``RELEASE`` file, else from
the name of its ``spark-core`` jar, else from ``spark-submit --version``.

The packages follow that version's line (:data:`LINES`): Spark's Kafka connector (which
brings ``spark-token-provider-kafka-0-10`` of its own version) and Delta's jar. Each row
is a set checked to resolve from Maven Central with its dependencies (docs/data-centre.md,
"Which Spark", says how): the connector is the line's version that Central serves with
its token provider (4.0.1 and 4.0.2 lack one), and Delta is the newest whose jar is
served for that line (Delta 4.0.x goes with Spark 4.0.x; Delta 4.4.0 is built for 4.1
and 4.2, with the line in the jar's name). A Spark of another line is refused by name
(:class:`UnknownSpark`) rather than handed packages built for another Spark.

The project's own environment installs the 4.2 line (pyspark 4.2.0 with delta-spark
4.4; pyproject.toml), and :data:`SPARK_PACKAGES` is the installed pyspark's row. After
a move to another line, run ``shorelink stack install`` again (the drivers' class-data
archive is made from the installed pyspark, and the new packages go into the Ivy cache).
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from spark_core.errors import SparkCoreError

__all__ = [
    "FILESYSTEMS",
    "LINES",
    "SPARK_PACKAGES",
    "SparkLine",
    "UnknownSpark",
    "filesystem_packages",
    "hadoop_version",
    "packages_for",
    "spark_home",
    "spark_package_conf",
    "spark_packages",
    "spark_submit",
    "spark_version",
]

SCALA = "2.13"


@dataclass(frozen=True)
class SparkLine:
    """The packages of one Spark line (``major.minor``): the Kafka connector's version
    and Delta's Maven coordinate."""

    kafka: str
    delta: str

    def packages(self) -> tuple[str, str]:
        return (f"org.apache.spark:spark-sql-kafka-0-10_{SCALA}:{self.kafka}", self.delta)


#: Spark line -> its packages, each set resolved here from Maven Central (see the doc)
LINES: Mapping[str, SparkLine] = {
    "4.0": SparkLine(kafka="4.0.0", delta=f"io.delta:delta-spark_{SCALA}:4.0.0"),
    "4.1": SparkLine(kafka="4.1.1", delta=f"io.delta:delta-spark_4.1_{SCALA}:4.4.0"),
    "4.2": SparkLine(kafka="4.2.0", delta=f"io.delta:delta-spark_4.2_{SCALA}:4.4.0"),
}


class UnknownSpark(SparkCoreError):
    """The Spark at hand is of a line whose packages shorelink does not know, or its
    version cannot be read."""


def packages_for(version: str, where: str = "") -> tuple[str, ...]:
    """The Maven packages for Spark ``version`` (``4.1.3``): its line's row of
    :data:`LINES`; :class:`UnknownSpark` for any other line."""
    line = ".".join(version.split(".")[:2])
    if line not in LINES:
        at = f" at {where}" if where else ""
        raise UnknownSpark(
            f"Spark {version}{at} has no known Kafka connector and Delta: shorelink knows "
            f"the packages of Spark {', '.join(LINES)} (docs/data-centre.md, 'Which Spark'); "
            "set SPARK_HOME to a Spark of one of those lines, or unset it to use pyspark's"
        )
    return LINES[line].packages()


def spark_home(environ: Mapping[str, str] | None = None) -> Path:
    """The Spark that runs: ``$SPARK_HOME`` when set, else the installed pyspark's
    directory."""
    env = os.environ if environ is None else environ
    if env.get("SPARK_HOME"):
        return Path(env["SPARK_HOME"])
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def spark_submit(environ: Mapping[str, str] | None = None) -> Path:
    """``bin/spark-submit`` of :func:`spark_home`."""
    return spark_home(environ) / "bin" / "spark-submit"


_RELEASE = re.compile(r"^Spark (\d+\.\d+\.\d+\S*)", re.MULTILINE)
_CORE_JAR = re.compile(r"^spark-core_\d+\.\d+-(\d+\.\d+\.\d+\S*)\.jar$")
_HADOOP_JAR = re.compile(r"^hadoop-client-api-(\d+\.\d+\.\d+\S*)\.jar$")
_SUBMIT = re.compile(r"version (\d+\.\d+\.\d+\S*)")


def _jar_version(home: Path, pattern: re.Pattern[str]) -> str | None:
    jars = home / "jars"
    if not jars.is_dir():
        return None
    for entry in sorted(os.listdir(jars)):
        if m := pattern.match(entry):
            return m.group(1)
    return None


def spark_version(home: Path) -> str:
    """The version of the Spark at ``home``: its ``RELEASE`` file (``Spark 4.1.1 built for
    Hadoop 3.4.2``, as a distribution has), else its ``jars/spark-core_*`` (pyspark's
    directory has no RELEASE), else ``bin/spark-submit --version`` (a JVM start)."""
    release = home / "RELEASE"
    if release.is_file() and (m := _RELEASE.search(release.read_text(errors="replace"))):
        return m.group(1)
    if found := _jar_version(home, _CORE_JAR):
        return found
    submit = home / "bin" / "spark-submit"
    try:
        run = subprocess.run(
            [str(submit), "--version"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env=dict(os.environ, SPARK_HOME=str(home)),
        )
    except OSError as exc:
        raise UnknownSpark(f"no Spark at {home}: {submit}: {exc.strerror or exc}") from exc
    except subprocess.TimeoutExpired as exc:
        raise UnknownSpark(f"{submit} --version did not answer in 120 s") from exc
    if m := _SUBMIT.search(run.stdout + run.stderr):
        return m.group(1)
    raise UnknownSpark(
        f"cannot tell the version of the Spark at {home}: no RELEASE file, no "
        f"jars/spark-core_*.jar, and {submit} --version said nothing of it"
    )


def hadoop_version(home: Path) -> str | None:
    """The Hadoop the Spark at ``home`` carries (``jars/hadoop-client-api-*``; its
    ``hadoop-aws`` must be of the same version), or None when it names none."""
    return _jar_version(home, _HADOOP_JAR)


def spark_packages(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The packages of the Spark that runs (:func:`spark_home`)."""
    home = spark_home(environ)
    return packages_for(spark_version(home), str(home))


#: URL scheme -> the Hadoop module that serves it (a Spark carries ``hdfs://`` and
#: ``file://`` itself). Each brings its own SDK: ``hadoop-aws`` 3.5.0 (pyspark 4.2's
#: Hadoop) the AWS SDK's ``bundle`` 2.35.4, one jar of 686 MB (docs/data-centre.md,
#: "Object stores").
FILESYSTEMS: Mapping[str, str] = {
    "s3a": "hadoop-aws",
    "abfs": "hadoop-azure",
    "abfss": "hadoop-azure",
}


def filesystem_packages(
    urls: Iterable[str], environ: Mapping[str, str] | None = None
) -> tuple[str, ...]:
    """The Hadoop filesystem modules ``urls`` need (``s3a://``: ``hadoop-aws``), of the
    Hadoop the Spark that runs carries (its ``jars/hadoop-client-api-*``: a module of
    another Hadoop fails at its first call), unless that Spark has the module already
    (a platform's distribution often does)."""
    schemes = sorted({u.split("://", 1)[0].lower() for u in urls if "://" in u})
    modules = sorted({FILESYSTEMS[s] for s in schemes if s in FILESYSTEMS})
    if not modules:
        return ()
    home = spark_home(environ)
    jars = os.listdir(home / "jars") if (home / "jars").is_dir() else []
    needed = [m for m in modules if not any(j.startswith(f"{m}-") for j in jars)]
    if not needed:
        return ()
    hadoop = hadoop_version(home)
    if hadoop is None:
        raise UnknownSpark(
            f"cannot tell which Hadoop the Spark at {home} carries (no "
            f"jars/hadoop-client-api-*.jar), so not which {', '.join(needed)} to add for "
            f"{', '.join(s + '://' for s in schemes)}: add it to [spark] packages"
        )
    return tuple(f"org.apache.hadoop:{m}:{hadoop}" for m in needed)


#: the line pyproject.toml installs, for an environment without pyspark
_INSTALLED_LINE = "4.2"


def _installed_packages() -> tuple[str, ...]:
    try:
        version = importlib.metadata.version("pyspark")
    except importlib.metadata.PackageNotFoundError:
        version = _INSTALLED_LINE
    return packages_for(version, "the installed pyspark")


#: the packages of the installed pyspark's line (pyproject.toml installs 4.2), whatever
#: ``SPARK_HOME`` says (:func:`spark_packages` follows the Spark that runs)
SPARK_PACKAGES = _installed_packages()


#: Resolve from Maven Central only (see the comment in the file): package data, so an
#: installed wheel finds it as a checkout does.
IVY_SETTINGS = Path(__file__).resolve().parent / "ivysettings.xml"


def spark_package_conf(
    ivy_dir: str | None, packages: tuple[str, ...] | None = None
) -> dict[str, str]:
    """Spark conf entries that put the Kafka connector and Delta (``packages``, by
    default :func:`spark_packages`) on the classpath, resolved through (and cached in)
    ``ivy_dir``."""
    conf = {
        "spark.jars.packages": ",".join(spark_packages() if packages is None else packages),
        "spark.jars.ivySettings": str(IVY_SETTINGS),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    }
    if ivy_dir:
        conf["spark.jars.ivy"] = ivy_dir
    return conf
