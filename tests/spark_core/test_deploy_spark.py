"""The site application's image recipe (deploy/spark/) and its SparkApplication for the
Spark operator (deploy/kubernetes/spark/site.yaml), held to each other and to
`shorelink-spark site`: the operator runs spark-submit itself, so a package, setting or
path that drifted from what the command would run fails only in a cluster, which this
machine has none of. Neither is run here: the structure is what is tested."""

from __future__ import annotations

import os
import re
import subprocess
import tomllib
from pathlib import Path

import pyspark
import pytest
import yaml

import spark_core
from spark_core.cli import spark_submit_argv
from spark_core.config import load_config
from spark_core.packages import LINES, packages_for

ROOT = Path(__file__).resolve().parents[2]
CONTAINERFILE = ROOT / "deploy" / "spark" / "Containerfile"
IGNORE = ROOT / "deploy" / "spark" / "containerignore"
ENTRYPOINT = ROOT / "deploy" / "spark" / "entrypoint.sh"
MANIFEST = ROOT / "deploy" / "kubernetes" / "spark" / "site.yaml"
SAMPLE = ROOT / "deploy" / "spark" / "sites.toml"
#: where the image's venv keeps the installed packages (Debian 12: Python 3.11)
IMAGE_PACKAGES = "/opt/shorelink/.venv/lib/python3.11/site-packages"


@pytest.fixture(autouse=True)
def sample_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in re.findall(r"\$\{([A-Z0-9_]+)\}", SAMPLE.read_text()):
        monkeypatch.setenv(name, "x")
    monkeypatch.delenv("SPARK_HOME", raising=False)


def _env(name: str) -> str:
    """A value the Containerfile's ENV sets."""
    m = re.search(rf"\b{name}=(\S+)", CONTAINERFILE.read_text())
    assert m, f"the Containerfile sets no {name}"
    return m.group(1)


def _in_image(value: str) -> str:
    """A path of this checkout's spark_core as the image has it."""
    return value.replace(
        str(Path(spark_core.__file__).resolve().parent), f"{IMAGE_PACKAGES}/spark_core"
    )


def test_spark_application_submits_what_the_site_command_would() -> None:
    spec = yaml.safe_load(MANIFEST.read_text())["spec"]
    cfg = load_config(SAMPLE)
    site, config = spec["arguments"][1], Path(spec["arguments"][3])
    ivy = Path(spec["sparkConf"]["spark.jars.ivy"])
    argv = spark_submit_argv(cfg, site, config, ivy, [], None)
    assert spec["deps"]["packages"] == argv[argv.index("--packages") + 1].split(",")
    confs = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--conf")
    for key, value in [*confs.items(), *cfg.spark.conf]:
        assert spec["sparkConf"].get(key) == _in_image(value), key
    job = argv.index(next(a for a in argv if a.endswith("jobs/site.py")))
    assert spec["mainApplicationFile"] == "local://" + _in_image(argv[job])
    assert spec["arguments"] == argv[job + 1 :]
    # the image's Spark, its packages' line, its Ivy cache and interpreter
    assert spec["sparkVersion"] == pyspark.__version__ and spec["type"] == "Python"
    assert tuple(spec["deps"]["packages"]) == packages_for(spec["sparkVersion"])
    assert spec["image"].endswith(":" + spec["sparkVersion"])
    assert str(ivy) == _env("SHORELINK_TOOLS") + "/ivy"
    assert spec["sparkConf"]["spark.pyspark.python"] == _env("PYSPARK_PYTHON")
    # the sites file and the status files are where mounted volumes put them
    mounts = [m["mountPath"] for m in spec["driver"]["volumeMounts"]]
    assert str(config.parent) in mounts
    assert any(str(cfg.site(site).state_path).startswith(m + "/") for m in mounts)
    named = {v["name"] for v in spec["volumes"]}
    assert {m["name"] for m in spec["driver"]["volumeMounts"]} <= named
    user = re.search(r"^USER (\d+):", CONTAINERFILE.read_text(), re.M)
    assert user and spec["driver"]["securityContext"]["runAsUser"] == int(user.group(1))


def test_image_recipe_copies_only_what_its_context_lets_in_and_runs_its_spark() -> None:
    text = CONTAINERFILE.read_text()
    allowed = [ln[1:] for ln in IGNORE.read_text().splitlines() if ln.startswith("!")]
    for src in (s for line in re.findall(r"^COPY (.+) \S+$", text, re.M) for s in line.split()):
        assert (ROOT / src).exists(), src
        assert any(src == a or src.startswith(a + "/") for a in allowed), src
    # every file pyproject's license-files names is in the context (setuptools needs it)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for lic in project.get("license-files", []):
        assert any(lic == a or lic.startswith(a + "/") for a in allowed), lic
    assert "'/tmp/src[spark]'" in text and "ln -s" in text and _env("SPARK_HOME") == "/opt/spark"
    assert "COPY deploy/spark/entrypoint.sh /opt/entrypoint.sh" in text
    assert re.search(r'^ENTRYPOINT \[.*"/opt/entrypoint.sh"\]', text, re.M)
    assert re.search(r"^ARG BASE=\S*3\.11\S*bookworm", text, re.M)  # Python 3.11, as IMAGE_PACKAGES
    assert "shorelink-spark install" in text


def _fake(tmp_path: Path, name: str) -> Path:
    """A command that prints its arguments one per line."""
    tool = tmp_path / name
    tool.parent.mkdir(parents=True, exist_ok=True)
    tool.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    tool.chmod(0o755)
    return tool


def test_entrypoint_runs_a_driver_executor_or_command_as_spark_on_kubernetes_calls_it(
    tmp_path: Path,
) -> None:
    home = tmp_path / "spark"
    _fake(home, "bin/spark-submit")
    _fake(tmp_path / "path", "java")
    env = {
        "PATH": f"{tmp_path / 'path'}:{os.environ['PATH']}",
        "SPARK_HOME": str(home),
        "SPARK_DRIVER_BIND_ADDRESS": "10.0.0.5",
    }

    def run(*args: str, **extra: str) -> list[str]:
        out = subprocess.run(
            ["bash", str(ENTRYPOINT), *args],
            env={**env, **extra},
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        )
        return out.stdout.splitlines()

    driver = run("driver", "--properties-file", "/opt/spark/conf/spark.properties", "app.py")
    assert driver[-4:] == [
        "client",
        "--properties-file",
        "/opt/spark/conf/spark.properties",
        "app.py",
    ]
    assert "spark.driver.bindAddress=10.0.0.5" in driver
    executor = run(
        "executor",
        SPARK_JAVA_OPT_1="-Dsecond=b c",
        SPARK_JAVA_OPT_0="-Dfirst=a",
        SPARK_EXECUTOR_MEMORY="1g",
        SPARK_DRIVER_URL="spark://driver:7078",
        SPARK_EXECUTOR_ID="3",
        SPARK_EXECUTOR_CORES="1",
        SPARK_APPLICATION_ID="app-1",
        SPARK_EXECUTOR_POD_IP="10.0.0.9",
    )
    assert executor[:4] == ["-Dfirst=a", "-Dsecond=b c", "-Xms1g", "-Xmx1g"]
    assert "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend" in executor
    assert executor[executor.index("--executor-id") + 1] == "3"
    assert run("echo", "as it is") == ["as it is"]
    assert set(LINES) >= {".".join(pyspark.__version__.split(".")[:2])}
