"""A plain ``git clone`` is the whole project: no file of the checkout names a path outside
it. Data, docs and licences that lived beside the repository on one machine (a sibling
``shared`` directory, a home directory) are missing on every other, and the failure
shows up far from its cause: a test that skips, a simulator that replays nothing, a
link that leads nowhere.

Static and fast: it reads the files git would commit (tracked, and new ones not
ignored), nothing else.
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest

from fleet_sim.publisher import DEFAULT_AIS

ROOT = Path(__file__).resolve().parents[1]

#: what names a place outside the checkout; each pattern is written so that this file's
#: own text does not match it
OUTSIDE = {
    "a sibling directory of the checkout": re.compile(r"\.\./shared\b"),
    "the shared data beside the checkout": re.compile(r"\bshared[/\\]data\b"),
    "the development machine's work directory": re.compile(r"/work[/]"),
    "the design notes kept outside the checkout (docs/design.md is the design)": re.compile(
        r"\bDESIGN\.md\b"
    ),
    "a path built into a directory named shared": re.compile(
        r"/\s*[\"']shared[\"']|[\"']shared[\"']\s*/"
    ),
    "an absolute home path": re.compile(
        r"(?<![\w.~-])(?:/home/[a-z_][\w.-]*|/root[/]|/Users/[A-Za-z]|[A-Za-z]:\\Users\\)"
    ),
}


def outside_references(text: str) -> list[str]:
    """What ``text`` names outside the checkout: ``"line N: <why>: <match>"`` each."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for why, pattern in OUTSIDE.items():
            for m in pattern.finditer(line):
                found.append(f"line {number}: {why}: {m.group(0)!r}")
    return found


#: ``Path(__file__).parents[N]`` or ``Path(__file__).parent.parent…``: a path from a module up
FROM_FILE = re.compile(
    r"Path\(__file__\)(?:\.resolve\(\))?(?:\.parents\[(\d+)\]|((?:\.parent\b)+))"
)


def climbs_out(name: str, text: str) -> list[str]:
    """Where the source ``text`` of the checkout's file ``name`` (``tests/conftest.py``)
    climbs from its own file above the checkout's root: from ``a/b.py``, ``parents[1]``
    is the root and ``parents[2]`` outside it."""
    depth = len(Path(name).parts)
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for m in FROM_FILE.finditer(line):
            up = int(m.group(1)) if m.group(1) is not None else m.group(2).count(".parent") - 1
            if up >= depth:
                found.append(f"line {number}: climbs above the checkout: {m.group(0)!r}")
    return found


def _checkout_files() -> list[Path]:
    # the suite runs in a git checkout (scripts/test, CI): no git is a failure, not a skip
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
        timeout=30,
    ).stdout
    paths = sorted({ROOT / name for name in out.decode().split("\0") if name})
    return [p for p in paths if p.is_file()]


def _text(path: Path) -> str | None:
    """The file's text, or None when it is binary (an image, a wheel)."""
    data = path.read_bytes()
    if b"\0" in data:
        return None
    try:
        return data.decode()
    except UnicodeDecodeError:
        return None


@pytest.fixture(scope="module")
def texts() -> dict[str, str]:
    found = {}
    for path in _checkout_files():
        text = _text(path)
        if text is not None:
            found[path.relative_to(ROOT).as_posix()] = text
    return found


def test_no_file_names_a_path_outside_the_checkout(texts: dict[str, str]) -> None:
    """A path beside or above the checkout exists on one machine only."""
    bad = [f"{name} {ref}" for name, text in texts.items() for ref in outside_references(text)]
    assert not bad, "names outside the checkout:\n" + "\n".join(bad)


def test_no_module_climbs_above_the_checkout(texts: dict[str, str]) -> None:
    """A module finds the project's files from its own place; one step too many up
    lands beside the checkout."""
    bad = [
        f"{name} {ref}"
        for name, text in texts.items()
        if name.endswith(".py")
        for ref in climbs_out(name, text)
    ]
    assert not bad, "\n".join(bad)


#: ``[text](target)`` in Markdown; the target up to a space (a title) or the parenthesis
LINK = re.compile(r"\[[^\]]*\]\(<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\)")


def test_every_relative_link_in_the_docs_leads_to_a_file_of_the_checkout(
    texts: dict[str, str],
) -> None:
    """A link into a sibling directory or to a page not committed breaks in a clone."""
    bad = []
    for name, text in texts.items():
        if not name.endswith(".md"):
            continue
        for target in LINK.findall(text):
            if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # a URL, or a place on the same page
            path = ((ROOT / name).parent / target.split("#")[0]).resolve()
            if not (path.is_relative_to(ROOT) and path.exists()):
                bad.append(f"{name}: {target}")
    assert not bad, "links that lead outside the checkout or nowhere:\n" + "\n".join(bad)


def test_the_check_catches_what_the_checkout_used_to_name() -> None:
    """The patterns find each kind of path the project once reached for (the AIS sample
    beside the repository, the design notes, a machine's directories), and leave alone
    what only looks alike."""
    # written with \x2f for "/" and \x2e for ".", so that this file names nothing itself
    old = [
        "#: the real AIS sample beside the repository (\x2e./shared\x2fdata/ais)",
        "[--ais \x2e./shared\x2fdata/ais/nmea_data_sample.txt]",
        "AIS sample (`shared\x2fdata/ais/nmea_data_sample.txt`)",
        "The intended shape is in DESIGN\x2emd (kept beside the repository in `shared/`)",
        "cd \x2fwork\x2fmain && .venv/bin/python",
        "open('\x2fhome/alice/shorelink/plan.json')",
        "\x2froot/.cache/shorelink",
        "\x2fUsers/bob/src",
        "C:\\Users\\bob\\src",
    ]
    for text in old:
        assert outside_references(text), text
    here = "Path(__file__).resolve()"  # and the same split in two below
    assert outside_references("SHARED = " + here + ".parents[2] / " + '"shared"')
    assert climbs_out("tests/conftest.py", here + ".parents[2]")
    assert climbs_out("fleet_sim/publisher.py", "Path(__file__)" + ".parent" * 3)
    assert not climbs_out("tests/conftest.py", here + ".parents[1]")
    assert not climbs_out("spark_core/jobs/site.py", here + ".parents[2]")
    assert not climbs_out("fleet_sim/publisher.py", here + ".parent / 'data'")
    fine = [
        "~/.cache/shorelink (SHORELINK_TOOLS moves it)",
        "the shared kernel, --bandwidth-mode shared",
        "docs/design.md, the design",
        "/opt/shorelink/.venv/bin/pip install",
    ]
    for text in fine:
        assert not outside_references(text), text


def test_the_ais_sample_is_package_data_of_the_simulator() -> None:
    """The simulator's default AIS file is inside its package and listed as package
    data, so an installed wheel replays it too, with its source and licence beside it."""
    package = ROOT / "fleet_sim"
    assert DEFAULT_AIS.is_file()
    assert DEFAULT_AIS.is_relative_to(package)
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    shipped = pyproject["tool"]["setuptools"]["package-data"]["fleet_sim"]
    notice = DEFAULT_AIS.parent / "SOURCE.md"
    for path in (DEFAULT_AIS, notice):
        relative = path.relative_to(package).as_posix()
        assert any(Path(relative).match(pattern) for pattern in shipped), relative
    assert "MIT License" in notice.read_text()


def test_the_licence_files_pyproject_declares_are_in_the_checkout() -> None:
    """``license-files`` go into every wheel; a missing one fails the build."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    declared = pyproject["project"]["license-files"]
    assert "LICENSE" in declared
    for name in declared:
        assert (ROOT / name).is_file(), name
    assert (ROOT / "LICENSE").read_text().lstrip().startswith("Apache License")
