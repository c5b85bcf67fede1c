"""A Debian 12 base image for the tests that build or run containers: the gateway's
image (tests/test_deploy_files.py) and a ship's bundle installed with no network
(tests/edge_agent/test_bundle.py). Made once with debootstrap and kept in podman's
storage; the session fixture ``debian_base`` (tests/conftest.py) finds or makes it and
finds the OCI runtime that can start it, once per session."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONTAINERFILE = ROOT / "deploy" / "gateway" / "Containerfile"
PODMAN = shutil.which("podman")
#: Docker Hub is out of reach in some build rooms; a Debian 12 rootfs from Debian's own
#: mirror (debootstrap) is a base the Containerfile accepts (ARG BASE)
LOCAL_BASE = "localhost/shorelink-base:bookworm"
#: rlimits below any host's: podman asks for more than some sandboxes allow
ULIMITS = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]


@dataclass(frozen=True)
class DebianBase:
    """The base image and podman's global options that start a container here."""

    image: str
    #: ``[]`` or ``["--runtime", "runc"]``
    runtime: list[str]


def podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    assert PODMAN is not None
    return subprocess.run([PODMAN, *args], capture_output=True, text=True, timeout=timeout)


def base_image() -> str:
    """The Containerfile's base: SHORELINK_IMAGE_BASE, else a local Debian base, else its
    default if it can be pulled, else a Debian base made here with debootstrap."""
    if os.environ.get("SHORELINK_IMAGE_BASE"):
        return os.environ["SHORELINK_IMAGE_BASE"]
    if podman("image", "exists", LOCAL_BASE).returncode == 0:
        return LOCAL_BASE
    default = re.search(r"^ARG BASE=(\S+)", CONTAINERFILE.read_text(), re.M)
    assert default is not None
    if podman("pull", "-q", default.group(1), timeout=300).returncode == 0:
        return default.group(1)
    debootstrap = shutil.which("debootstrap")
    if debootstrap is None or os.geteuid() != 0:
        # scripts/setup installs debootstrap: its absence is a broken set-up, not a skip
        pytest.fail(f"{default.group(1)} cannot be pulled and no debootstrap (as root)")
    return LOCAL_BASE


def make_local_base(tmp_path: Path) -> None:
    """Debian 12 with python3-venv from Debian's mirror, imported as LOCAL_BASE and kept
    (a minute to make; later builds take ~15 s)."""
    rootfs = tmp_path / "rootfs"
    subprocess.run(
        [
            "debootstrap",
            "--variant=minbase",
            "--include=python3,python3-venv,ca-certificates",
            "bookworm",
            str(rootfs),
            "http://deb.debian.org/debian",
        ],
        check=True,
        capture_output=True,
        timeout=400,
    )
    tar = tmp_path / "rootfs.tar"
    subprocess.run(["tar", "-C", str(rootfs), "-cf", str(tar), "."], check=True, timeout=300)
    shutil.rmtree(rootfs, ignore_errors=True)
    assert PODMAN is not None
    subprocess.run([PODMAN, "import", str(tar), LOCAL_BASE], check=True, timeout=300)
    tar.unlink()


def runtime(base: str) -> list[str]:
    """podman's default OCI runtime, or runc where that cannot start a container (crun
    refuses a host with cgroups in hybrid mode); fail if neither can."""
    tried = []
    for rt in [[], *([["--runtime", "runc"]] if shutil.which("runc") else [])]:
        res = podman(*rt, "run", "--rm", *ULIMITS, base, "python3", "-c", "pass")
        if res.returncode == 0:
            return rt
        tried.append(res.stderr.strip()[-300:])
    pytest.fail(f"podman cannot run a container here: {tried}")


def ensure_base(tmp_path: Path) -> DebianBase:
    """The base (made with debootstrap in ``tmp_path`` if it is nowhere) and its runtime.
    Sessions on several pytest-xdist workers take turns: one makes it, the others find
    it."""
    assert PODMAN is not None, "podman is not installed: scripts/setup installs it"
    with (Path(tempfile.gettempdir()) / "shorelink-debian-base.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        base = base_image()
        if base == LOCAL_BASE and podman("image", "exists", LOCAL_BASE).returncode != 0:
            make_local_base(tmp_path)
    return DebianBase(base, runtime(base))
