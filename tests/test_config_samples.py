"""Every key a deployable reads is named in its commented sample under ``deploy/``, in
the table it belongs to: an operator at sea or at a port reads the sample, not the code.

The keys come from the configs' declarations (``shorelink.config.walk``), so a key added
to a config is checked here without naming it twice.
"""

from __future__ import annotations

import copy
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core_gateway.config import GatewayConfig
from core_gateway.config import parse_config as parse_gateway
from edge_agent.config import EdgeConfig
from edge_agent.config import parse_config as parse_edge
from shorelink.config import walk
from shorelink.errors import ConfigError, ConfigErrors
from spark_core.config import SitesConfig
from spark_core.config import parse_config as parse_sites
from tests.helpers import write_toml

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


PARSERS = {"edge": parse_edge, "gateway": parse_gateway, "spark": parse_sites}


def _leaves(data: dict[str, Any], path: str = "") -> Iterator[tuple[str, tuple[str, ...]]]:
    """Every scalar or list value of a parsed file: its dotted name and its keys."""
    for key, value in data.items():
        name = f"{path}.{key}" if path else key
        if isinstance(value, dict):
            yield from ((n, (key, *keys)) for n, keys in _leaves(value, name))
        else:
            yield name, (key,)


@settings(max_examples=60, deadline=None)
@given(deployable=st.sampled_from(sorted(PARSERS)), data=st.data())
def test_every_bad_key_of_a_file_is_reported_at_once(deployable: str, data: st.DataObject) -> None:
    """A file with several bad values, in any tables: one error naming each of them
    (an operator fixes the file in one go, not one key per start)."""
    _, sample = SAMPLES[deployable]
    parsed = tomllib.loads(sample.read_text())
    leaves = dict(_leaves(parsed))
    bad = data.draw(st.lists(st.sampled_from(sorted(leaves)), min_size=1, max_size=5, unique=True))
    broken = copy.deepcopy(parsed)
    for name in bad:
        *tables, key = leaves[name]
        table = broken
        for t in tables:
            table = table[t]
        table[key] = {"not": "a value"}  # a table where every key wants a value
    with pytest.raises(ConfigError) as caught:
        PARSERS[deployable](broken, sample.parent)
    named = caught.value.errors if isinstance(caught.value, ConfigErrors) else (caught.value,)
    assert sorted({e.field for e in named}) == sorted(bad), str(caught.value)
    assert str(caught.value).count("\n") == len(named) - 1


def test_bad_keys_in_two_tables_of_one_kind_are_both_reported() -> None:
    """Found by the property test above in CI: ``[sites.S.topics.<stream>]`` tables
    were read one after the other and the first bad one stopped the rest, so a file
    with a bad ``partitions`` in two streams' tables named only the first."""
    _, sample = SAMPLES["spark"]
    parsed = tomllib.loads(sample.read_text())
    topics = parsed["sites"]["tokyo"]["topics"]
    assert len(topics) >= 2
    for table in topics.values():
        table["partitions"] = {"not": "a value"}
    with pytest.raises(ConfigError) as caught:
        PARSERS["spark"](parsed, sample.parent)
    named = caught.value.errors if isinstance(caught.value, ConfigErrors) else (caught.value,)
    assert sorted(e.field for e in named) == sorted(
        f"sites.tokyo.topics.{stream}.partitions" for stream in topics
    )


@pytest.mark.parametrize("deployable", sorted(PARSERS))
def test_check_config_prints_every_bad_key_on_a_line_of_its_own(
    deployable: str, tmp_path: Path
) -> None:
    """What the property test above shows, as an operator sees it: the command names
    each bad key on a line of its own and exits 2."""
    _, sample = SAMPLES[deployable]
    parsed = tomllib.loads(sample.read_text())
    leaves = dict(_leaves(parsed))
    bad = sorted(leaves)[:3]
    for name in bad:
        *tables, key = leaves[name]
        table = parsed
        for t in tables:
            table = table[t]
        table[key] = {"not": "a value"}
    broken = write_toml(tmp_path / sample.name, parsed)
    command = Path(sys.executable).with_name(f"shorelink-{deployable}")
    res = subprocess.run(
        [str(command), "check-config", str(broken)], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 2, res.stderr
    named = [ln.removeprefix("error: ").split(": ")[0] for ln in res.stderr.splitlines()]
    assert sorted(named) == bad, res.stderr
