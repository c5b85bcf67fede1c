"""A command in an install without its extra says, in one line, which extra brings what
it lacks (review, ecosystem §4: ``shorelink demo`` on a gateway ended in a traceback, and
``shorelink stack`` advised ``[all]`` for a package only ``[demo]`` has). The lean
installs are simulated here by hiding the packages their extras leave out (fast);
``tests/test_install.py`` runs ``shorelink demo`` in a real one."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from shorelink.extras import EXTRAS, PROJECT

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

#: the top-level modules each lean install lacks (what the other extras bring)
LACKS = {
    "edge": "confluent_kafka,pyspark,pyarrow,delta,pyais,aiomqtt,rich,matplotlib,tomli_w",
    "gateway": "paho,sqlite_utils,pyspark,pyarrow,delta,pyais,aiomqtt,rich,matplotlib,tomli_w",
}

#: runs ``module:function`` with ``argv`` after hiding the modules a lean install lacks
#: (an import of one then fails as it would there)
RUNNER = """
import importlib, sys
lacks, target, *argv = sys.argv[1:]
for name in lacks.split(","):
    sys.modules[name] = None
module, _, function = target.partition(":")
sys.argv = [target, *argv]
getattr(importlib.import_module(module), function)()
"""


def _run(install: str, target: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", RUNNER, LACKS[install], target, *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


@pytest.mark.parametrize(
    ("install", "script", "argv", "needs", "extra"),
    [
        ("gateway", "shorelink", ["demo", "--ships", "1"], "rich", "[demo]"),
        ("gateway", "shorelink", ["stack", "status"], "tomli_w", "[demo]"),
        (
            "edge",
            "shorelink",
            ["audit", "--site", "s", "--bootstrap", "h:1"],
            "confluent_kafka",
            "[gateway] or [spark]",
        ),
        ("edge", "shorelink-gateway", ["--help"], "confluent_kafka", "[gateway]"),
        (
            "gateway",
            "shorelink-spark",
            ["install", "--ivy-dir", "ivy-never-made"],
            "pyspark",
            "[spark]",
        ),
    ],
)
def test_a_command_without_its_extra_names_the_extra_in_one_line(
    install: str, script: str, argv: list[str], needs: str, extra: str
) -> None:
    """The demo case first: ``shorelink demo`` in a gateway's install (rich, which only
    ``[demo]`` brings, is missing) is one ``error:`` line naming ``[demo]``, exit 2."""
    target = PYPROJECT["project"]["scripts"][script]
    res = _run(install, target, *argv)
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr, res.stderr
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, res.stderr
    command = " ".join([script, argv[0]]) if script == "shorelink" else script
    assert f"`{command}` needs {needs}" in errors[0]
    assert f"comes with shorelink's {extra} extra" in errors[0]


def test_every_program_and_command_has_its_extra() -> None:
    """Each console script starts through the guard, and each of its commands (and the
    ``shorelink`` commands other packages add) has an extra that pyproject defines."""
    scripts = PYPROJECT["project"]["scripts"]
    assert scripts["shorelink"] == "shorelink.cli:main"
    for name in ("shorelink-edge", "shorelink-gateway", "shorelink-spark"):
        assert scripts[name].startswith("shorelink.extras:"), name
        assert name in EXTRAS
    added = PYPROJECT["project"]["entry-points"]["shorelink.commands"]
    for name in [*added, "audit", "consume"]:
        assert f"shorelink {name}" in EXTRAS, name
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert all(e in extras for named in EXTRAS.values() for e in named)


#: each program or command -> the module its code starts from
STARTS = {
    "shorelink-edge": "edge_agent.cli",
    "shorelink-gateway": "core_gateway.cli",
    "shorelink-spark": "spark_core.cli",
    "shorelink audit": "shorelink.kafka.audit",
    "shorelink consume": "shorelink.kafka.consumer",
    "shorelink ops": "spark_core.ops.cli",
    "shorelink ops-users": "spark_core.ops.cli",
    "shorelink stack": "local_stack.cli",
    "shorelink demo": "voyage.cli",
}


def _brings(extra: str) -> set[str]:
    """The distributions ``extra`` installs by name (the kernel's, the extras it names)."""
    out = {canonicalize_name(Requirement(r).name) for r in PYPROJECT["project"]["dependencies"]}
    for spec in PYPROJECT["project"]["optional-dependencies"][extra]:
        req = Requirement(spec)
        if canonicalize_name(req.name) == "shorelink":
            for inner in req.extras:
                out |= _brings(inner)
        else:
            out.add(canonicalize_name(req.name))
    return out


def _module_path(module: str) -> Path:
    base = ROOT.joinpath(*module.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def _optional(tree: ast.AST) -> set[int]:
    """The imports inside ``try: ... except ImportError`` (the code does without them:
    the voyage's screenshot without playwright)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
            isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError")
            for h in node.handlers
        ):
            out |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return out


def _third_party(start: str) -> set[str]:
    """The third parties' top-level modules that ``start`` and every project module it
    reaches import (type-only imports included: they name the same packages; optional
    ones not)."""
    seen: set[str] = set()
    found: set[str] = set()
    todo = [start]
    while todo:
        module = todo.pop()
        path = _module_path(module)
        if module in seen or not path.is_file():
            continue
        seen.add(module)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        tree = ast.parse(path.read_text())
        optional = _optional(tree)
        for node in ast.walk(tree):
            if id(node) in optional:
                continue
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    base = f"{anchor}.{base}" if base else anchor
                names = [base, *(f"{base}.{a.name}" for a in node.names)]
            else:
                continue
            for name in names:
                top = name.partition(".")[0]
                if top in PROJECT:
                    todo.append(name)
                elif top not in sys.stdlib_module_names and top != "__future__":
                    found.add(top)
    return found


@pytest.mark.parametrize("command", sorted(STARTS))
def test_the_extra_a_command_names_brings_what_its_code_imports(command: str) -> None:
    """The message names the right extra: every third-party package the command's code
    imports is a requirement of each extra the message names (or of the kernel)."""
    owners = packages_distributions()
    imported = _third_party(STARTS[command])
    assert imported, command  # the walk reaches the code
    for extra in EXTRAS[command]:
        brings = _brings(extra)
        missing = {
            top: owners.get(top)
            for top in imported
            if not {canonicalize_name(d) for d in owners.get(top, [])} & brings
        }
        assert not missing, f"{command}: [{extra}] does not bring {missing}"
