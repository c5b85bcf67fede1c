"""The sites file: the commented sample loads, and a bad value is named by its field
(an operator must find the typo from the message alone)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from shorelink.errors import ConfigError
from spark_core.config import load_config, parse_config
from spark_core.packages import spark_packages
from tests.spark_core.helpers import graph_doc

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "deploy" / "spark" / "sites.toml"


@pytest.fixture(autouse=True)
def sample_secrets(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The secrets the sample names as ``${ENV}`` (it has no default for them)."""
    names = re.findall(r"\$\{([A-Z0-9_]+)\}", SAMPLE.read_text())
    env = {n: f"pw-{n.lower()}" for n in names}
    for n, v in env.items():
        monkeypatch.setenv(n, v)
    return env


def test_sample_sites_file_loads_with_its_defaults() -> None:
    cfg = load_config(SAMPLE)
    tokyo = cfg.site("tokyo")
    assert tokyo.neighbours == ("singapore", "hq")
    assert tokyo.merge.transactional_id == "shorelink-merge-tokyo"
    assert tokyo.merge.canonical_partitions == 6 and tokyo.merge.canonical_retention_ms is None
    assert cfg.site("hq").merge.transactional_id == "shorelink-merge-hq"
    assert cfg.site("hq").tables and cfg.site("hq").trigger_interval_s == 2.0
    # credentials: ${ENV} secrets, never printed
    assert tokyo.kafka.auth.protocol == "SASL_SSL" and tokyo.kafka.auth.username == "spark-tokyo"
    assert tokyo.kafka.auth.password.value == "pw-sl_spark_tokyo_password"
    assert "pw-" not in repr(tokyo)
    assert tokyo.replication.username == "site-tokyo"
    assert tokyo.access.gateway_transactional_id == "shorelink-gateway-tokyo"
    assert [p.username for p in cfg.staff] == ["ops"]
    # a site whose Kafka is plain (no credentials in its table) is reached without SASL
    assert cfg.site("singapore").kafka.auth.protocol == "PLAINTEXT"


def test_a_process_resolves_only_the_secrets_it_uses(
    monkeypatch: pytest.MonkeyPatch, sample_secrets: dict[str, str]
) -> None:
    """Review M6: the operations page loads the sites file with only its own password in
    its environment (the admin's, the gateway's and the neighbours' stay with the
    commands that use them); a secret that is not set is named, field and variable,
    where it is used."""
    for name in sample_secrets:
        if name != "SL_OPS_TOKYO_PASSWORD":
            monkeypatch.delenv(name)
    cfg = load_config(SAMPLE)
    tokyo = cfg.site("tokyo")
    ops = tokyo.kafka.as_user(tokyo.ops.kafka_username, tokyo.ops.kafka_password)
    assert ops.auth.client_config()["sasl.password"] == "pw-sl_ops_tokyo_password"
    with pytest.raises(ConfigError) as exc:
        tokyo.admin_kafka().auth.client_config()
    assert exc.value.field == "sites.tokyo.access.admin_password"
    assert "SL_KAFKA_ADMIN_TOKYO_PASSWORD is not set" in str(exc.value)
    with pytest.raises(ConfigError, match="SL_SPARK_TOKYO_PASSWORD"):
        tokyo.kafka.auth.java_config()
    assert "pw-" not in repr(tokyo) and "***" in repr(tokyo.access.admin_password)


def _site(extra: str = "", merge: str = "", name: str = "tokyo") -> dict[str, object]:
    import tomllib

    return tomllib.loads(f"""
[sites.{name}]
streams = ["nav"]
checkpoint_dir = "/tmp/c"
table_dir = "/tmp/t"
{extra}
[sites.{name}.kafka]
bootstrap = "127.0.0.1:9092"
[sites.{name}.merge]
{merge}
""")


@pytest.mark.parametrize(
    ("extra", "merge", "field"),
    [
        ('neighbours = ["nowhere"]', "", "sites.tokyo.neighbours"),
        ('neighbours = ["tokyo"]', "", "sites.tokyo.neighbours"),
        ('trigger_interval = "soon"', "", "sites.tokyo.trigger_interval"),
        ("", "canonical_partitions = 0", "sites.tokyo.merge.canonical_partitions"),
        ("", "max_offset_per_trigger = 10", "sites.tokyo.merge.max_offset_per_trigger"),
        ('streams2 = ["x"]', "", "sites.tokyo.streams2"),
    ],
)
def test_bad_value_is_named_by_its_field(extra: str, merge: str, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(_site(extra, merge))
    assert err.value.field == field


def test_offsets_timeout_sets_the_kafka_sources_wait_and_defaults_to_kafkas_own() -> None:
    """A broker killed holds a Spark query for this long (docs/data-centre.md): unset, the
    Java client's defaults stand (60 and 30 s); set, both follow it."""
    assert parse_config(_site()).site("tokyo").merge.source_options() == {
        "kafka.default.api.timeout.ms": "60000",
        "kafka.request.timeout.ms": "30000",
    }
    short = parse_config(_site(merge='offsets_timeout = "15s"')).site("tokyo").merge
    assert short.source_options() == {
        "kafka.default.api.timeout.ms": "15000",
        "kafka.request.timeout.ms": "15000",
    }
    with pytest.raises(ConfigError) as err:
        parse_config(_site(merge='offsets_timeout = "0s"'))
    assert err.value.field == "sites.tokyo.merge.offsets_timeout"


def test_unknown_site_is_an_error_naming_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="tokyo"):
        parse_config(_site()).site("osaka")


def test_site_command_dry_run_prints_the_spark_submit_line() -> None:
    """The wrapper must hand spark-submit the pinned packages and the Ivy settings."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "spark_core.cli",
            "site",
            "--site",
            "tokyo",
            "--config",
            str(SAMPLE),
            "--dry-run",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert "spark-submit" in out and ",".join(spark_packages()) in out
    assert "spark.jars.ivySettings=" in out and "spark_core/jobs/site.py --site tokyo" in out


#: prints a properties file as Java (and so spark-submit) reads it: key TAB value lines
_READ_PROPERTIES = """
import java.io.*; import java.nio.charset.StandardCharsets; import java.util.*;
public class ReadProperties { public static void main(String[] a) throws Exception {
  Properties p = new Properties();
  try (Reader r = new InputStreamReader(new FileInputStream(a[0]), StandardCharsets.UTF_8)) {
    p.load(r); }
  PrintStream out = new PrintStream(System.out, true, "UTF-8");
  for (String k : new TreeSet<>(p.stringPropertyNames()))
    out.print(k + "\\u0000" + p.getProperty(k) + "\\u0001"); } }
"""


def test_spark_conf_reaches_spark_submit_in_a_private_file_not_on_its_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review L9: ``[spark.conf]`` values (an object store's keys written as ``${ENV}``)
    were on spark-submit's command line, seen by ``ps`` and printed by ``--dry-run``.
    Now they are in a 0600 properties file that Java reads back exactly, whatever the
    characters."""
    from spark_core.cli import spark_properties_path, spark_submit_argv, write_spark_properties

    monkeypatch.setenv("SL_TEST_S3_SECRET", "s3cr3t value")
    text = SAMPLE.read_text().replace(
        "[spark.conf]\n",
        '[spark.conf]\n"spark.hadoop.fs.s3a.secret.key" = "${SL_TEST_S3_SECRET}"\n',
    )
    config = tmp_path / "sites.toml"
    config.write_text(text)
    command = [sys.executable, "-m", "spark_core.cli", "site", "--site", "tokyo"]
    dry = subprocess.run(
        [*command, "--config", str(config), "--dry-run"],
        check=True,
        capture_output=True,
        text=True,
    )
    assert "s3cr3t" not in dry.stdout + dry.stderr and "--properties-file" in dry.stdout
    assert "spark.hadoop.fs.s3a.secret.key" in dry.stderr
    cfg = load_config(config)
    path = spark_properties_path(cfg, "tokyo")
    assert path.name == "spark-submit.properties"
    odd = (" lead", "a=b:c #!x", "back\\slash", "new\nline\ttab", "ünï 漢字", "", "end ")
    conf = (*cfg.spark.conf, *((f"k{i} {v}=:", v) for i, v in enumerate(odd)))
    target = tmp_path / "private" / "spark-submit.properties"
    write_spark_properties(target, conf)
    assert target.stat().st_mode & 0o777 == 0o600
    argv = spark_submit_argv(cfg, "tokyo", config, tmp_path / "ivy", [], target)
    assert "s3cr3t" not in " ".join(argv) and argv[argv.index("--properties-file") + 1] == str(
        target
    )
    source = tmp_path / "ReadProperties.java"
    source.write_text(_READ_PROPERTIES)
    out = subprocess.run(
        ["java", str(source), str(target)], check=True, capture_output=True, timeout=120
    ).stdout.decode()
    read = dict(item.split("\0", 1) for item in out.split("\1") if item)
    assert read == dict(conf)
    assert read["spark.hadoop.fs.s3a.secret.key"] == "s3cr3t value"


def test_a_site_whose_records_reach_no_one_is_named(tmp_path: Path) -> None:
    """Review finding 18: a sites file where no chain of neighbours leads from a site to
    another leaves it without that site's records, silently; the config says which,
    the application warns at start and `status` counts it a problem."""
    line = parse_config(
        graph_doc({"tokyo": ["hq"], "hq": ["tokyo", "sydney"], "sydney": ["hq"]}, tmp_path)
    )
    assert line.unreached() == {}
    assert (
        parse_config(graph_doc({"tokyo": [], "hq": []}, tmp_path)).unreached() == {}
    )  # no replication
    one_way = parse_config(graph_doc({"tokyo": [], "hq": ["tokyo"], "sydney": ["hq"]}, tmp_path))
    assert one_way.unreached() == {"tokyo": ["hq", "sydney"], "hq": ["sydney"]}
    path = tmp_path / "sites.toml"
    path.write_text(
        '[sites.tokyo]\nstreams = ["nav"]\nneighbours = []\ncheckpoint_dir = "c1"\n'
        'table_dir = "t1"\nkafka.bootstrap = "127.0.0.1:1"\n'
        '[sites.hq]\nstreams = ["nav"]\nneighbours = ["tokyo"]\ncheckpoint_dir = "c2"\n'
        'table_dir = "t2"\nkafka.bootstrap = "127.0.0.1:1"\n'
    )
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "spark_core.cli",
            "status",
            "--site",
            "tokyo",
            "--config",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1
    assert "the records of hq never reach tokyo" in out.stdout
