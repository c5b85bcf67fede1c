"""The version a build gets from git (setuptools-scm with pyproject.toml's settings,
shorelink/version.py): a release tag is the version, every commit after it sorts after
it, a clone without tags sorts after the 0.1.0 every build said before, a tree with no
git at all builds the fallback, and an unpacked sdist the version it was made with. Ships are upgraded and rolled back by these numbers
(the ship report and ``*_build_info`` carry them): one that went backwards would make a
newer build look older to pip and to an operator."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from packaging.version import Version

from tests.helpers import build_version

ROOT = Path(__file__).resolve().parents[1]


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args],
        cwd=repo,
        check=True,
        capture_output=True,
        timeout=30,
    )


def test_a_release_tag_is_the_version_and_every_later_build_sorts_after_it(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copy2(ROOT / "pyproject.toml", repo)
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "one")
    untagged = build_version(repo)  # a clone without tags (a shallow CI checkout)
    assert re.fullmatch(r"0\.1\.1\.dev1\+g[0-9a-f]{7,}", untagged), untagged
    assert Version(untagged) > Version("0.1.0")

    _git(repo, "tag", "-a", "v0.2.0", "-m", "release 0.2.0")
    assert build_version(repo) == "0.2.0"
    (repo / "CHANGELOG.md").write_text("next\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "two")
    after = build_version(repo)
    assert re.fullmatch(r"0\.2\.1\.dev1\+g[0-9a-f]{7,}", after), after
    assert Version(after) > Version("0.2.0")

    copied = tmp_path / "copied"  # a folder without git: the fallback, as it is
    copied.mkdir()
    shutil.copy2(ROOT / "pyproject.toml", copied)
    assert build_version(copied) == "0.1.0"
    # an unpacked sdist has no git either, and builds the version it was made with
    (copied / "PKG-INFO").write_text("Metadata-Version: 2.4\nName: shorelink\nVersion: 0.2.0\n")
    assert build_version(copied) == "0.2.0"
