"""The JVM of a local-mode Spark driver (the voyage's, the tests', the benchmarks'; its
executors run inside it): the client compiler only, and a class-data-sharing archive of
the classes a site application loads.

:func:`spark_driver_conf` is the ``[spark.conf]`` entry such a driver gets.
:func:`install_spark_cds` (run by ``shorelink stack install``, after the Kafka tools)
makes the archive once: one real site application (``shorelink-spark site
--available-now``, merge and Delta tables) over a few records in a broker of its own,
with ``-XX:ArchiveClassesAtExit``. A driver that maps it starts with about half the CPU
(a Spark session and one count: 9.5 s of CPU without it, 4.9 s with it; the driver
killed three times, ``tests/spark_core/test_crash.py``: 111 s of CPU, 88 s with a smaller
archive). The archive holds paths into the Python environment's pyspark, so each
environment (a clone's ``.venv``) has its own; the JVM checks it against its class path,
jars and JDK and starts without it (one warning line) when they no longer match.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import tomli_w

from local_stack.errors import StackError
from local_stack.kafka import CLIENT_COMPILER, start_kafka
from local_stack.tools import archive_flags, cds_flags, keep_cds_archive, say, tools_dir
from shorelink.contract import Record, ingress_topic
from shorelink.identity import Identity
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.topics import TopicSpec, ensure_topics, producer

__all__ = ["install_spark_cds", "spark_cds_archive", "spark_driver_conf"]

_OPTIONS = "spark.driver.extraJavaOptions"
_SITE = "cds"
_STREAM = "containers"


def _pyspark_home() -> Path | None:
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).resolve().parent


def spark_cds_archive() -> Path | None:
    """Where this environment's Spark class-data archive lives (None without pyspark):
    under the tools directory, named after the pyspark it was made from, its place and
    its install (the jars directory's time: a venv made again at the same path has new
    jars, which an older archive does not match, and ``-Xshare:on`` refuses it)."""
    home = _pyspark_home()
    if home is None:
        return None
    version = importlib.metadata.version("pyspark")
    installed = (home / "jars").stat().st_mtime_ns if (home / "jars").is_dir() else 0
    digest = hashlib.sha256(f"{home}:{installed}".encode()).hexdigest()[:12]
    return tools_dir() / f"spark-{version}" / f"classes-{digest}.jsa"


def spark_driver_conf() -> dict[str, str]:
    """The ``[spark.conf]`` entry of a small, short-lived local driver: the client
    compiler only (C2's compiling costs a 2-core machine more CPU than it wins back: a
    session doing ten small aggregations and Delta writes took 46 s of JVM CPU with it,
    65 s without, and no longer) and, when ``shorelink stack install`` made it, the
    class-data archive."""
    archive = spark_cds_archive()
    flags = [*CLIENT_COMPILER, *(cds_flags(archive) if archive else ())]
    return {_OPTIONS: " ".join(flags)}


def install_spark_cds() -> None:
    """Make this environment's Spark class-data archive (see the module's doc). Best
    effort: without it the drivers start as before."""
    archive = spark_cds_archive()
    if archive is None:
        say("spark class-data archive: no pyspark here (the [spark] extra); none made")
        return
    if cds_flags(archive):
        say("spark class-data archive: present")
        return
    say("spark class-data archive: one site application run over a few records")
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(f"{archive.name}.{os.getpid()}.tmp")
    with tempfile.TemporaryDirectory(prefix="shorelink-spark-cds-") as tmp:
        try:
            _site_run(Path(tmp), partial)
        except StackError as exc:
            say(f"spark class-data archive: not made ({exc}); drivers start without it")
            partial.unlink(missing_ok=True)
            return
    check = [  # -Xshare:on fails rather than run without the archive
        *(str(_spark_submit()), "--conf"),
        f"{_OPTIONS}=-Xshare:on {' '.join(archive_flags(partial))}",
        "--version",
    ]
    keep_cds_archive("spark", partial, archive, check)


def _spark_submit() -> Path:
    home = _pyspark_home()
    assert home is not None
    return home / "bin" / "spark-submit"


def _site_run(tmp: Path, partial: Path) -> None:
    """One broker, a few records in its ingress topic, and one site application that
    merges them and writes its Delta tables, then exits and dumps its classes."""
    broker = start_kafka("spark-cds", tmp / "kafka", tmp / "logs", heap="384m")
    try:
        kafka = KafkaEndpoint.plaintext(broker.bootstrap)
        ensure_topics(kafka, [TopicSpec(ingress_topic(_STREAM), partitions=2)])
        _write_records(kafka)
        config = tmp / "sites.toml"
        config.write_text(tomli_w.dumps(_sites_doc(tmp, broker.bootstrap, partial)))
        run = subprocess.run(
            [
                *(sys.executable, "-m", "spark_core.cli", "site"),
                *("--site", _SITE, "--config", str(config), "--available-now"),
            ],
            cwd=tmp,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
            # the archive is of this environment's pyspark, not of a SPARK_HOME's Spark
            env={k: v for k, v in os.environ.items() if k != "SPARK_HOME"},
        )
        if run.returncode != 0:
            raise StackError(f"the site application failed: {run.stderr[-300:]}")
    finally:
        broker.proc.stop(grace=30)


def _write_records(kafka: KafkaEndpoint) -> None:
    out = producer(kafka, {"enable.idempotence": True})
    for seq in range(1, 51):
        key = f"c{seq % 5}"
        r = Record(
            Identity("cds-ship", _STREAM, seq),
            key.encode(),
            b'{"temp": 4.5}',
            1_700_000_000_000 + seq,
            _SITE,
            f"ship/cds-ship/{key}",
        )
        headers: list[tuple[str, str | bytes | None]] = [*r.headers()]
        out.produce(ingress_topic(_STREAM), key=r.key, value=r.value, headers=headers)
    if out.flush(30) != 0:
        raise StackError("the warm-up records were not written")


def _sites_doc(tmp: Path, bootstrap: str, partial: Path) -> dict[str, object]:
    options = " ".join([*CLIENT_COMPILER, f"-XX:ArchiveClassesAtExit={partial}"])
    return {
        "spark": {
            "master": "local[2]",
            "driver_memory": "1g",
            "conf": {
                "spark.sql.shuffle.partitions": "2",
                "spark.ui.enabled": "false",
                _OPTIONS: options,
            },
        },
        "sites": {
            _SITE: {
                "streams": [_STREAM],
                "checkpoint_dir": str(tmp / "checkpoints"),
                "table_dir": str(tmp / "tables"),
                "tables": True,
                "kafka": {"bootstrap": bootstrap, "timeout": "20s"},
            }
        },
    }
