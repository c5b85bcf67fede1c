"""Every CLI command is documented (README or docs/): a command nobody can find does
not exist for an operator. Every module is named in docs/ARCHITECTURE.md: the page is
where a reader looks for a concept's file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from core_gateway.cli import main as gateway_main
from edge_agent.cli import main as edge_main
from shorelink.cli import main as shorelink_main
from spark_core.cli import main as spark_main

ROOT = Path(__file__).resolve().parents[1]


def _docs() -> str:
    parts = [(ROOT / "README.md").read_text()]
    parts += [p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))]
    return "\n".join(parts)


def _commands(name: str, cmd: click.Command) -> Iterator[str]:
    if isinstance(cmd, click.Group):
        ctx = click.Context(cmd)  # the commands other packages add are loaded when listed
        for sub_name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, sub_name)
            assert sub is not None, f"{name} lists {sub_name} but cannot load it"
            yield from _commands(f"{name} {sub_name}", sub)
    else:
        yield name


ALL = [
    c
    for prog, group in [
        ("shorelink", shorelink_main),
        ("shorelink-edge", edge_main),
        ("shorelink-gateway", gateway_main),
        ("shorelink-spark", spark_main),
    ]
    for c in _commands(prog, group)
]


@pytest.mark.parametrize("command", ALL)
def test_every_cli_command_is_documented(command: str) -> None:
    assert f"`{command}" in _docs(), f"{command} is not documented in README.md or docs/"


def test_architecture_names_only_files_that_exist() -> None:
    import re

    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    for path in re.findall(
        r"`((?:shorelink|edge_agent|core_gateway|spark_core|local_stack|deploy)/[\w/.-]+\.\w+)`",
        text,
    ):
        line = next(ln for ln in text.splitlines() if path in ln)
        if "(planned)" in line:
            continue
        assert (ROOT / path).exists(), f"ARCHITECTURE.md names {path}, which does not exist"


PACKAGES = (
    "shorelink",
    "edge_agent",
    "core_gateway",
    "spark_core",
    "local_stack",
    "fleet_sim",
    "voyage",
)
MODULES = sorted(
    p.relative_to(ROOT).as_posix()
    for pkg in PACKAGES
    for p in (ROOT / pkg).rglob("*.py")
    if p.name != "__init__.py"
)


@pytest.mark.parametrize("module", MODULES)
def test_architecture_names_every_module(module: str) -> None:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    assert f"`{module}`" in text, f"{module} is not named in docs/ARCHITECTURE.md"
