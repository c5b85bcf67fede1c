"""Every key a deployable reads is named in its commented sample under ``deploy/``, in
the table it belongs to: an operator at sea or at a port reads the sample, not the code.

The keys come from the configs' declarations (``shorelink.config.walk``), so a key added
to a config is checked here without naming it twice.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from core_gateway.config import GatewayConfig
from edge_agent.config import EdgeConfig
from shorelink.config import walk
from spark_core.config import SitesConfig

ROOT = Path(__file__).resolve().parents[1]

SAMPLES = {
    "edge": (EdgeConfig, ROOT / "deploy" / "edge" / "edge.toml"),
    "gateway": (GatewayConfig, ROOT / "deploy" / "gateway" / "gateway.toml"),
    "spark": (SitesConfig, ROOT / "deploy" / "spark" / "sites.toml"),
}

_HEADER = re.compile(r"\s*(\[\[?)\s*([^\[\]]+?)\s*\]\]?\s*")


def _tables(text: str) -> dict[str, str]:
    """The sample's lines per table ("" before the first header, ``name[]`` for the
    tables of an array), comments included: a key may be shown commented out."""
    out: dict[str, list[str]] = {"": []}
    current = ""
    for line in text.splitlines():
        m = _HEADER.fullmatch(line)
        if m:
            current = m.group(2) + ("[]" if m.group(1) == "[[" else "")
            out.setdefault(current, [])
        else:
            out[current].append(line)
    return {name: "\n".join(lines) for name, lines in out.items()}


def _matches(pattern: str, table: str) -> bool:
    """``streams.*`` is every ``[streams.NAME]``."""
    return re.fullmatch(re.escape(pattern).replace(r"\*", r"[^.]+"), table) is not None


@pytest.mark.parametrize("deployable", sorted(SAMPLES))
def test_sample_names_every_key_in_its_table(deployable: str) -> None:
    config, sample = SAMPLES[deployable]
    tables = _tables(sample.read_text())
    missing = []
    checked = 0
    for table, k in walk(config):
        checked += 1
        if k.kind == "pairs":  # a free table: the sample shows the table
            inner = ".".join(p for p in (table, k.name) if p)
            found = any(_matches(inner, t) for t in tables)
        else:
            line = re.compile(rf"^[ \t]*(#[ \t]*)?{re.escape(k.name)}[ \t]*=", re.M)
            found = any(line.search(body) for t, body in tables.items() if _matches(table, t))
        if not found:
            missing.append(f"[{table}] {k.name} ({config.__name__}: {k.field})")
    assert checked > 10
    assert not missing, f"not in {sample.relative_to(ROOT)}: {missing}"


def test_sample_tables_are_read_per_table() -> None:
    """The check looks in the right table: a key shown only under another table is
    missing."""
    tables = _tables("a = 1\n[x]\n# b = 2\n[[y]]\nc = 3\n[z.one]\nd = 4\n")
    assert tables.keys() == {"", "x", "y[]", "z.one"}
    assert "b = 2" in tables["x"] and "b" not in tables["y[]"]
    assert _matches("z.*", "z.one") and not _matches("z.*", "z.one.two")
