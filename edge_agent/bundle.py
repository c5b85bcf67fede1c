"""A ship's install bundle: one file that installs the agent with no network.

A ship is offline most of its life, often 64-bit ARM, and shorelink is not on PyPI, so
``pip install`` on board cannot work. ``shorelink-edge bundle`` builds, ashore, one tar
holding the shorelink wheel (built from a checkout, or one given), the wheels of every
dependency of ``shorelink[edge]`` for the ship's machine and Python (``pip download
--only-binary``: a ship has no compiler, so a dependency without a wheel for the target
is named and the bundle refused), pip's own wheel, the pins (``requirements.txt``), the
systemd unit, the sysusers.d file, the sample config, ``install.sh`` (deploy/edge/) and
``SHA256SUMS`` of every file, which install.sh checks before it touches anything.

The tar is reproducible for the same inputs: names sorted, owner root, times
``SOURCE_DATE_EPOCH`` (or 0). What a bundle is for (version, machine, Python, glibc) is in
its ``bundle.env``, read by install.sh.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from edge_agent.errors import EdgeError

__all__ = [
    "SHIP_FILES",
    "Bundle",
    "BundleError",
    "Target",
    "build_bundle",
    "checkout",
    "describe",
    "platform_tags",
]

#: what a bundle carries from deploy/edge/, under the names install.sh reads
SHIP_FILES = {
    "install.sh": "install.sh",
    "shorelink-edge.service": "shorelink-edge.service",
    "shorelink.sysusers": "shorelink.sysusers",
    "edge.toml": "edge.toml",
}
#: the oldest glibc a manylinux wheel names (manylinux1: glibc 2.5)
_OLDEST_GLIBC = {"x86_64": 5, "i686": 5}
_PIP_TIMEOUT_S = 900


class BundleError(EdgeError):
    """A bundle could not be made: no checkout, a wheel missing for the target, pip
    failing. Retrying helps only where pip failed on the network."""


@dataclass(frozen=True)
class Target:
    """The ship's machine (``uname -m``), Python (``3.11``) and glibc (``2.36``)."""

    machine: str
    python: str
    glibc: str

    @classmethod
    def here(cls) -> Target:
        libc, version = platform.libc_ver()
        if libc != "glibc":
            raise BundleError(f"this machine's C library is {libc or 'unknown'}, not glibc")
        return cls(platform.machine(), f"{sys.version_info[0]}.{sys.version_info[1]}", version)

    def pip_args(self) -> list[str]:
        """pip's options that choose wheels for this target; none for this machine (pip
        then uses its own tags, which are the target's)."""
        if self == Target.here():
            return ["--only-binary=:all:"]
        abi = "cp" + self.python.replace(".", "")
        tags = [f"--platform={t}" for t in platform_tags(self.machine, self.glibc)]
        return [
            "--only-binary=:all:",
            *tags,
            f"--python-version={self.python}",
            "--implementation=cp",
            f"--abi={abi}",
            "--abi=abi3",
            "--abi=none",
        ]

    def __str__(self) -> str:
        return f"{self.machine}, Python {self.python}, glibc {self.glibc}"


def platform_tags(machine: str, glibc: str) -> list[str]:
    """The manylinux tags a Linux with ``glibc`` on ``machine`` runs, newest first,
    with the legacy aliases (manylinux2014 is 2.17, manylinux2010 2.12, manylinux1 2.5)."""
    major, minor = (int(p) for p in glibc.split(".")[:2])
    if major != 2:
        raise BundleError(f"glibc {glibc}: only glibc 2.x is known")
    tags = []
    for m in range(minor, _OLDEST_GLIBC.get(machine, 17) - 1, -1):
        tags.append(f"manylinux_2_{m}_{machine}")
        legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}.get(m)
        if legacy:
            tags.append(f"{legacy}_{machine}")
    return tags


@dataclass(frozen=True)
class Bundle:
    """What was written: the tar, its sha256, the version and the wheels it carries."""

    path: Path
    sha256: str
    version: str
    target: Target
    wheels: list[str]


def checkout() -> Path | None:
    """The source checkout this shorelink runs from, if it runs from one."""
    root = Path(__file__).resolve().parents[1]
    ok = (root / "pyproject.toml").is_file() and (root / "deploy" / "edge").is_dir()
    return root if ok else None


def _run(
    cmd: Sequence[str], what: str, *, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            list(cmd), capture_output=True, text=True, timeout=_PIP_TIMEOUT_S, cwd=cwd, env=env
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BundleError(f"{what}: {exc}") from exc


def _pip(
    *args: str, what: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """This Python's pip, without a PYTHONPATH that would put a checkout in its way."""
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return _run([sys.executable, "-m", "pip", *args], what, env={**clean, **(env or {})})


def _source_version(source: Path) -> str | None:
    """The version a build of the checkout ``source`` gets from git (setuptools-scm),
    where the version is dynamic and setuptools-scm is here to say it; else None (the
    build's own)."""
    project = tomllib.loads((source / "pyproject.toml").read_text())["project"]
    if "version" not in project.get("dynamic", []) or not (source / ".git").exists():
        return None
    res = _run([sys.executable, "-m", "setuptools_scm"], "setuptools-scm", cwd=source)
    return res.stdout.strip().splitlines()[-1] if res.returncode == 0 and res.stdout else None


def build_wheel(source: Path, out: Path) -> Path:
    """The shorelink wheel of checkout ``source``, built from a copy (pip builds in the
    source tree and would leave build/ there, whose stale files a later build packs)."""
    pyproject = tomllib.loads((source / "pyproject.toml").read_text())
    find = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    tops = sorted({p.split(".")[0].rstrip("*") for p in find})
    with tempfile.TemporaryDirectory(prefix="shorelink-src-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        for top in tops:
            shutil.copytree(source / top, src / top, ignore=shutil.ignore_patterns("__pycache__"))
        for name in ("pyproject.toml", "README.md", *pyproject["project"].get("license-files", [])):
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source / name, src / name)
        version = _source_version(source)
        env = {"SETUPTOOLS_SCM_PRETEND_VERSION_FOR_SHORELINK": version} if version else {}
        res = _pip("wheel", "-q", "--no-deps", "-w", str(out), str(src), what="pip wheel", env=env)
        if res.returncode != 0:
            raise BundleError(f"building the shorelink wheel failed:\n{res.stderr[-3000:]}")
    (wheel,) = out.glob("shorelink-*.whl")
    return wheel


def _wheel_name(filename: str) -> tuple[str, str]:
    """(normalised project name, version) of a wheel's file name."""
    name, version = filename.split("-")[:2]
    return re.sub(r"[-_.]+", "-", name).lower(), version


def _no_wheel(requirement: str, target: Target, pip_opts: Sequence[str]) -> list[str]:
    """After the target's download failed: which of the packages this machine resolves
    for ``requirement`` have no wheel for ``target`` (at the version resolved here)."""
    with tempfile.TemporaryDirectory(prefix="shorelink-resolve-") as tmp:
        report = Path(tmp) / "report.json"
        res = _pip(
            "install", "--dry-run", "--ignore-installed", "-q", "--report", str(report),
            *pip_opts, requirement, what="pip install --dry-run",
        )  # fmt: skip
        if res.returncode != 0:
            return []
        pins = [
            (i["metadata"]["name"], i["metadata"]["version"])
            for i in json.loads(report.read_text())["install"]
            if i["metadata"]["name"] != "shorelink"
        ]
        # one pip run per package missing (pip stops at the first), not one per package
        left, missing = [f"{n}=={v}" for n, v in pins], []
        while left:
            got = _pip(
                "download", "-q", "--no-deps", "-d", tmp, *target.pip_args(), *pip_opts, *left,
                what="pip download",
            )  # fmt: skip
            if got.returncode == 0:
                break
            found = re.search(r"No matching distribution found for (\S+)", got.stderr)
            if found is None or found.group(1) not in left:
                break
            missing.append(found.group(1))
            left.remove(found.group(1))
        return missing


def _download(wheel: Path, target: Target, into: Path, pip_opts: Sequence[str]) -> None:
    requirement = f"{wheel}[edge]"
    res = _pip(
        "download", "-q", "-d", str(into), *target.pip_args(), *pip_opts, requirement, "pip",
        what="pip download",
    )  # fmt: skip
    if res.returncode == 0:
        return
    said = [ln for ln in res.stderr.splitlines() if ln.startswith("ERROR")]
    missing = _no_wheel(requirement, target, pip_opts)
    if missing:
        raise BundleError(
            f"no wheel for {target} of: {', '.join(missing)} (a ship installs no sdist: "
            f"it has no compiler); pip said: {' '.join(said)[:600]}"
        )
    raise BundleError(f"pip download for {target} failed:\n{res.stderr[-3000:]}")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _tar(tree: Path, top: str, out: Path) -> None:
    """``tree`` as ``top/...`` in a reproducible tar (gzip for .tar.gz / .tgz)."""
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    gz = out.name.endswith((".tar.gz", ".tgz"))
    tmp = out.with_name(f".{out.name}.tmp")
    raw = tmp.open("wb")
    try:
        import gzip

        stream = gzip.GzipFile(fileobj=raw, mode="wb", mtime=epoch) if gz else raw
        with tarfile.open(fileobj=stream, mode="w", format=tarfile.PAX_FORMAT) as tar:
            paths = sorted(tree.rglob("*"), key=lambda p: p.relative_to(tree).as_posix())
            for p in [tree, *paths]:
                rel = p.relative_to(tree).as_posix()
                info = tar.gettarinfo(str(p), arcname=top if rel == "." else f"{top}/{rel}")
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                info.mtime = epoch
                info.mode = 0o755 if p.is_dir() or os.access(p, os.X_OK) else 0o644
                if p.is_file():
                    with p.open("rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
        if stream is not raw:
            stream.close()
        raw.flush()
        os.fsync(raw.fileno())
    finally:
        raw.close()
    tmp.replace(out)


def build_bundle(
    out: Path,
    target: Target,
    *,
    source: Path | None = None,
    wheel: Path | None = None,
    pip_opts: Sequence[str] = (),
    say: Callable[[str], None] = lambda _: None,
) -> Bundle:
    """Write the bundle for ``target`` to ``out``: the shorelink ``wheel`` given (else
    one built from ``source``), the ship's files from ``source``'s deploy/edge/ (else
    this checkout's). ``pip_opts``: index options passed to pip (``--find-links``, ...)."""
    source = source or checkout()
    if source is None:
        raise BundleError(
            "the ship's files (deploy/edge/) come from a shorelink checkout: run from one "
            "or give --source"
        )
    deploy = source / "deploy" / "edge"
    with tempfile.TemporaryDirectory(prefix="shorelink-bundle-") as tmp:
        tree = Path(tmp) / "tree"
        wheels = tree / "wheels"
        wheels.mkdir(parents=True)
        if wheel is None:
            say(f"building the shorelink wheel from {source}")
            wheel = build_wheel(source, Path(tmp))
        shutil.copy2(wheel, wheels / wheel.name)
        _, version = _wheel_name(wheel.name)
        say(f"downloading the wheels of shorelink[edge] {version} for {target}")
        _download(wheels / wheel.name, target, wheels, pip_opts)
        names = sorted(p.name for p in wheels.glob("*.whl"))
        if len(names) != len(list(wheels.iterdir())):
            raise BundleError(f"pip left files that are not wheels in {wheels}")
        pins = [_wheel_name(n) for n in names]
        lines = [f"{n}=={v}" if n != "shorelink" else f"shorelink[edge]=={v}" for n, v in pins]
        (tree / "requirements.txt").write_text(
            "# the exact versions this bundle installs (install.sh: pip --no-index)\n"
            + "\n".join(lines)
            + "\n"
        )
        for src_name, name in SHIP_FILES.items():
            shutil.copy2(deploy / src_name, tree / name)
        (tree / "install.sh").chmod(0o755)
        (tree / "bundle.env").write_text(
            f"version={version}\nmachine={target.machine}\npython={target.python}\n"
            f"glibc={target.glibc}\n"
        )
        files = sorted(
            (p for p in tree.rglob("*") if p.is_file()), key=lambda p: p.relative_to(tree)
        )
        (tree / "SHA256SUMS").write_text(
            "".join(f"{_sha256(p)}  {p.relative_to(tree).as_posix()}\n" for p in files)
        )
        top = f"shorelink-edge-{version}-{target.machine}"
        out.parent.mkdir(parents=True, exist_ok=True)
        _tar(tree, top, out)
    return Bundle(out, _sha256(out), version, target, names)


def describe(bundle: Bundle) -> str:
    """What the command prints: the file, its size and sha256, what it is for."""
    size = bundle.path.stat().st_size
    buf = io.StringIO()
    buf.write(f"wrote {bundle.path} ({size / 1e6:.1f} MB, {len(bundle.wheels)} wheels)\n")
    buf.write(f"  shorelink {bundle.version} for {bundle.target}\n")
    buf.write(f"  sha256 {bundle.sha256}\n")
    buf.write("  on the ship: tar -xf FILE && sudo ./shorelink-edge-*/install.sh")
    return buf.getvalue()
