"""The platform's Spark: ``shorelink-spark site`` submits with ``$SPARK_HOME``'s
spark-submit and hands it the packages of that Spark's line, since packages built for
another Spark fail at the first query, far from the cause. A Spark of no known line is
refused by name. The Spark homes here are real: pyspark's own directory (it is laid out
as a distribution) and symlink farms of it with another ``RELEASE``."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pyspark
import pytest
from click.testing import CliRunner

from spark_core.cli import main
from spark_core.packages import (
    LINES,
    SPARK_PACKAGES,
    hadoop_version,
    spark_home,
    spark_version,
)

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "deploy" / "spark" / "sites.toml"
PYSPARK = Path(pyspark.__file__).resolve().parent


@pytest.fixture(autouse=True)
def sample_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    """The secrets the sample names as ``${ENV}``."""
    for name in re.findall(r"\$\{([A-Z0-9_]+)\}", SAMPLE.read_text()):
        monkeypatch.setenv(name, f"pw-{name.lower()}")


def _farm(root: Path, release: str | None) -> Path:
    """A Spark home that is pyspark's bin/ and jars/, with ``release`` as its RELEASE."""
    root.mkdir()
    for part in ("bin", "jars", "python", "conf"):
        if (PYSPARK / part).exists():
            (root / part).symlink_to(PYSPARK / part)
    if release is not None:
        (root / "RELEASE").write_text(release)
    return root


def _dry_run(spark_home_dir: Path | None) -> tuple[int, list[str], str]:
    env = {"SPARK_HOME": str(spark_home_dir) if spark_home_dir else None}
    result = CliRunner().invoke(
        main, ["site", "--site", "tokyo", "--config", str(SAMPLE), "--dry-run"], env=env
    )
    line = result.stdout.strip().splitlines()[0] if result.stdout.strip() else ""
    return result.exit_code, shlex.split(line)[1:], result.stderr


def _packages(argv: list[str]) -> list[str]:
    return argv[argv.index("--packages") + 1].split(",")


def test_site_submits_with_spark_home_and_the_packages_of_its_line(tmp_path: Path) -> None:
    """A platform's Spark 4.2 gets its own spark-submit and the 4.2 connector and Delta
    jar, not the installed pyspark's packages."""
    home = _farm(tmp_path / "spark-4.2", "Spark 4.2.0 built for Hadoop 3.4.2\nBuild flags: x\n")
    code, argv, err = _dry_run(home)
    assert code == 0, err
    assert argv[0] == str(home / "bin" / "spark-submit")
    assert _packages(argv) == [
        "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0",
        "io.delta:delta-spark_4.2_2.13:4.4.0",
    ]


def test_site_without_spark_home_uses_pyspark_and_its_packages() -> None:
    code, argv, err = _dry_run(None)
    assert code == 0, err
    assert argv[0] == str(PYSPARK / "bin" / "spark-submit")
    assert _packages(argv) == list(SPARK_PACKAGES)


def test_pyspark_directory_as_spark_home_is_read_from_its_jars() -> None:
    """pyspark's directory has no RELEASE: its spark-core jar names the version, its
    hadoop-client-api jar the Hadoop (which hadoop-aws must match)."""
    assert not (PYSPARK / "RELEASE").exists()
    assert spark_home({"SPARK_HOME": str(PYSPARK)}) == PYSPARK
    assert spark_version(PYSPARK) == pyspark.__version__
    hadoop = hadoop_version(PYSPARK)
    assert hadoop is not None and (PYSPARK / "jars" / f"hadoop-client-api-{hadoop}.jar").is_file()
    code, argv, err = _dry_run(PYSPARK)
    assert code == 0, err
    assert _packages(argv) == list(SPARK_PACKAGES)


def test_spark_of_an_unknown_line_is_refused_by_name(tmp_path: Path) -> None:
    home = _farm(tmp_path / "spark-3.5", "Spark 3.5.1 built for Hadoop 3.3.4\n")
    code, argv, err = _dry_run(home)
    assert code == 2 and argv == []
    assert "Spark 3.5.1" in err and str(home) in err
    assert all(line in err for line in LINES) and "SPARK_HOME" in err


def test_version_from_spark_submit_when_no_file_names_it(tmp_path: Path) -> None:
    """Neither a RELEASE nor a jar named by version: the Spark's own spark-submit
    --version says (a real JVM start)."""
    home = tmp_path / "spark"
    home.mkdir()
    (home / "bin").symlink_to(PYSPARK / "bin")
    (home / "jars").mkdir()
    for jar in (PYSPARK / "jars").iterdir():
        name = "spark-core.jar" if jar.name.startswith("spark-core_") else jar.name
        (home / "jars" / name).symlink_to(jar)
    assert spark_version(home) == pyspark.__version__
