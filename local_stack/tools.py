"""Where the local stack's third-party programs live, and how they get there.

Everything comes from the registries this project may use: the Kafka broker and
MirrorMaker 2 as jars from Maven Central (``deploy/kafka/pom.xml``), toxiproxy from the
Go module proxy, Prometheus's rules and PromQL checker built from its Go module
(``local_stack/promcheck/``), Quadlet's generator (podman's ``cmd/quadlet``) from the
Go module proxy where the machine's podman has none (Debian 12's 4.3 predates Quadlet),
Mosquitto from Debian, Spark's Kafka connector and Delta into an Ivy
cache (by ``shorelink-spark install``). Each install is idempotent: a marker file per
pinned version makes a second run a no-op. ``SHORELINK_TOOLS`` moves the tools directory
(default ``~/.cache/shorelink``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from local_stack.errors import StackError

__all__ = [
    "KAFKA_VERSION",
    "TOXIPROXY_VERSION",
    "archive_flags",
    "cds_flags",
    "install_all",
    "kafka_cds_archive",
    "kafka_classpath",
    "kafka_log4j_config",
    "keep_cds_archive",
    "mosquitto_bin",
    "promcheck_bin",
    "quadlet_bin",
    "say",
    "tools_dir",
    "toxiproxy_bin",
]

KAFKA_VERSION = "4.1.1"
TOXIPROXY_VERSION = "v2.12.0"
#: the last podman 4 line: its Quadlet reads the units podman 4.4 and later run
QUADLET_VERSION = "v4.9.5"
#: where a podman with Quadlet keeps its generator
SYSTEM_QUADLET = Path("/usr/libexec/podman/quadlet")

REPO = Path(__file__).resolve().parents[1]
KAFKA_POM = REPO / "deploy" / "kafka" / "pom.xml"
#: the Go program that reads alert rules and dashboards with Prometheus's own code, its
#: module pinned in its go.mod and go.sum
PROMCHECK_SRC = REPO / "local_stack" / "promcheck"


def tools_dir() -> Path:
    return Path(os.environ.get("SHORELINK_TOOLS", Path.home() / ".cache" / "shorelink"))


def _kafka_dir() -> Path:
    return tools_dir() / f"kafka-{KAFKA_VERSION}"


def _toxiproxy_dir() -> Path:
    return tools_dir() / f"toxiproxy-{TOXIPROXY_VERSION}"


def _promcheck_dir() -> Path:
    """Named after its sources: a change of main.go, go.mod or go.sum builds it anew."""
    digest = hashlib.sha256()
    for name in ("main.go", "go.mod", "go.sum"):
        digest.update((PROMCHECK_SRC / name).read_bytes())
    return tools_dir() / f"promcheck-{digest.hexdigest()[:12]}"


def _missing(what: str) -> StackError:
    return StackError(f"{what} is not installed: run scripts/setup (or `shorelink stack install`)")


def kafka_classpath() -> str:
    libs = _kafka_dir() / "libs"
    if not (_kafka_dir() / ".complete").exists():
        raise _missing(f"Kafka {KAFKA_VERSION}")
    return str(libs / "*")


def kafka_cds_archive() -> Path:
    """Where the Kafka JVMs' class-data-sharing archive lives (made by
    ``local_stack.kafka.install_kafka_cds``; absent: the JVMs load their classes from
    the jars)."""
    return _kafka_dir() / "kafka-classes.jsa"


def cds_flags(archive: Path) -> list[str]:
    """The JVM flags that map ``archive``, or none when it is missing or not the file
    ``local_stack.kafka.install_kafka_cds`` checked (its size is in ``<archive>.ok``): the JVM ignores
    a stale or bit-flipped archive (with ``VerifySharedSpaces``) but crashes on a
    truncated one."""
    try:
        if int(archive.with_name(archive.name + ".ok").read_text()) != archive.stat().st_size:
            return []
    except (OSError, ValueError):
        return []
    return archive_flags(archive)


def archive_flags(archive: Path) -> list[str]:
    """The JVM flags that map ``archive``, unchecked (:func:`cds_flags` checks first)."""
    return [f"-XX:SharedArchiveFile={archive}", "-XX:+VerifySharedSpaces"]


def keep_cds_archive(what: str, partial: Path, archive: Path, check: list[str]) -> None:
    """Put the archive a JVM just dumped at ``partial`` in place as ``archive``, its size
    beside it for :func:`cds_flags`, if ``check`` (a JVM run that maps ``partial`` with
    ``-Xshare:on``, so it fails rather than run without it) succeeds; else drop it."""
    if not partial.exists() or partial.stat().st_size == 0:
        say(f"{what} class-data archive: none written; they start without it")
        return
    run = subprocess.run(check, capture_output=True, text=True, timeout=120, check=False)
    if run.returncode != 0:
        say(f"{what} class-data archive: unusable ({(run.stdout + run.stderr)[-200:]}); not kept")
        partial.unlink(missing_ok=True)
        return
    size = partial.stat().st_size
    partial.replace(archive)
    archive.with_name(archive.name + ".ok").write_text(f"{size}\n")


def kafka_log4j_config() -> Path:
    return REPO / "deploy" / "kafka" / "log4j2.properties"


def toxiproxy_bin() -> str:
    path = _toxiproxy_dir() / "toxiproxy-server"
    if not path.exists():
        raise _missing(f"toxiproxy {TOXIPROXY_VERSION}")
    return str(path)


def promcheck_bin() -> str:
    path = _promcheck_dir() / "promcheck"
    if not path.exists():
        raise _missing("promcheck (Prometheus's rules and PromQL checker)")
    return str(path)


def _quadlet_dir() -> Path:
    return tools_dir() / f"quadlet-{QUADLET_VERSION}"


def quadlet_bin() -> str:
    """Quadlet's generator: the machine's podman's, else the one built here."""
    if SYSTEM_QUADLET.exists():
        return str(SYSTEM_QUADLET)
    path = _quadlet_dir() / "quadlet"
    if not path.exists():
        raise _missing(f"quadlet {QUADLET_VERSION}")
    return str(path)


def mosquitto_bin() -> str:
    found = shutil.which("mosquitto") or next(
        (p for p in ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto") if Path(p).exists()), None
    )
    if not found:
        raise _missing("mosquitto (Debian package `mosquitto`)")
    return found


# -- installers ---------------------------------------------------------------------------


def say(msg: str) -> None:
    """One line of the installers' progress, on stderr."""
    print(f"[setup] {msg}", file=sys.stderr, flush=True)


def _run(cmd: list[str], **kw: object) -> None:
    try:
        subprocess.run(cmd, check=True, **kw)  # type: ignore[call-overload]
    except FileNotFoundError as exc:
        raise StackError(f"{cmd[0]} not found: it is needed to install the local stack") from exc
    except subprocess.CalledProcessError as exc:
        raise StackError(f"command failed ({exc.returncode}): {' '.join(cmd)}") from exc


def install_kafka() -> None:
    target = _kafka_dir()
    if (target / ".complete").exists():
        say(f"kafka {KAFKA_VERSION}: present")
        return
    say(f"kafka {KAFKA_VERSION}: resolving broker jars from Maven Central")
    libs = target / "libs"
    shutil.rmtree(target, ignore_errors=True)
    libs.mkdir(parents=True)
    _run(
        [
            "mvn",
            "-q",
            "-B",
            "-f",
            str(KAFKA_POM),
            "dependency:copy-dependencies",
            f"-Dkafka.version={KAFKA_VERSION}",
            f"-DoutputDirectory={libs}",
        ]
    )
    (target / ".complete").write_text(KAFKA_VERSION + "\n")


def install_toxiproxy() -> None:
    target = _toxiproxy_dir()
    if (target / "toxiproxy-server").exists():
        say(f"toxiproxy {TOXIPROXY_VERSION}: present")
        return
    say(f"toxiproxy {TOXIPROXY_VERSION}: go install")
    target.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, GOBIN=str(target / "bin"), GOFLAGS="-mod=mod")
    _run(
        ["go", "install", f"github.com/Shopify/toxiproxy/v2/cmd/server@{TOXIPROXY_VERSION}"],
        env=env,
    )
    (target / "bin" / "server").rename(target / "toxiproxy-server")


def install_promcheck() -> None:
    """Build ``local_stack/promcheck`` (Prometheus's rulefmt and PromQL parser, from the
    Go module proxy at the versions its go.sum pins: about 50 MB of modules, 2 minutes
    of compiling on two cores, once)."""
    target = _promcheck_dir()
    if (target / "promcheck").exists():
        say(f"promcheck {target.name}: present")
        return
    say(f"promcheck {target.name}: go build")
    target.mkdir(parents=True, exist_ok=True)
    # go.sum pins every module: nothing resolved anew, go.mod never rewritten
    env = dict(os.environ, GOFLAGS="-mod=readonly -buildvcs=false")
    _run(
        ["go", "build", "-trimpath", "-o", str(target / "promcheck.partial"), "."],
        env=env,
        cwd=PROMCHECK_SRC,
    )
    (target / "promcheck.partial").rename(target / "promcheck")


def install_quadlet() -> None:
    """podman's Quadlet generator, built from the Go module proxy when the machine's
    podman has none (tests/test_deploy_files.py checks deploy/gateway's unit with it).
    ``go install`` of podman is refused (the proxy will not list its versions), so it
    is built from a module of its own that requires it."""
    target = _quadlet_dir()
    if SYSTEM_QUADLET.exists() or (target / "quadlet").exists():
        say(f"quadlet: present ({quadlet_bin()})")
        return
    if shutil.which("podman") is None:  # scripts/setup --demo: no podman, no unit to check
        say("quadlet: skipped (no podman)")
        return
    say(f"quadlet {QUADLET_VERSION}: go build")
    work = target / "src"
    work.mkdir(parents=True, exist_ok=True)
    (work / "go.mod").write_text(
        f"module quadletbuild\n\ngo 1.22\n\nrequire github.com/containers/podman/v4 {QUADLET_VERSION}\n"
    )
    env = dict(os.environ, GOFLAGS="-mod=mod")
    tags = "remote exclude_graphdriver_btrfs btrfs_noversion exclude_graphdriver_devicemapper"
    _run(
        [
            "go",
            "build",
            "-tags",
            f"{tags} containers_image_openpgp",
            "-o",
            str(target / "quadlet.partial"),
            "github.com/containers/podman/v4/cmd/quadlet",
        ],
        env=env,
        cwd=work,
    )
    (target / "quadlet.partial").rename(target / "quadlet")
    shutil.rmtree(work, ignore_errors=True)


def install_spark_packages() -> None:
    """Resolve the Spark Kafka connector and Delta into the Ivy cache once, so tests and
    jobs start without touching the network. The Spark application owns its packages and
    their cache: the tooling runs its command (``shorelink-spark install``), never imports
    it."""
    say("spark packages: shorelink-spark install")
    _run([sys.executable, "-m", "spark_core.cli", "install"])


def install_all() -> None:
    install_kafka()
    install_toxiproxy()
    install_promcheck()
    install_quadlet()
    mosquitto_bin()  # apt installs it (scripts/setup); fail early with a clear message
    install_spark_packages()
