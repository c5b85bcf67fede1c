"""Every config file loader over the whole input space (docs/boundaries.md): any file
is a config or a ConfigError naming what is wrong, within the loader's bound. A config
error that escapes as a TypeError or a RecursionError is a traceback to an operator
at sea, with no field named."""

from __future__ import annotations

import copy
import math
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core_gateway.config import load_config as load_gateway
from edge_agent.config import load_config as load_edge
from shorelink.errors import ConfigError
from shorelink.kafka.sites import fleet_login, load_sites
from spark_core.config import load_config as load_spark
from spark_core.customers import load_customers
from tests.bounds import KIB, Bound, within
from tests.strategies import HUGE_INTS, any_bytes, any_text, mutated

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"

LOADERS: dict[str, tuple[Callable[[Path], Any], Path]] = {
    "edge": (load_edge, DEPLOY / "edge" / "edge.toml"),
    "gateway": (load_gateway, DEPLOY / "gateway" / "gateway.toml"),
    "sites": (load_spark, DEPLOY / "spark" / "sites.toml"),
    "kernel-sites": (load_sites, DEPLOY / "spark" / "sites.toml"),
    "fleet-login": (lambda path: fleet_login(path, "tokyo"), DEPLOY / "spark" / "sites.toml"),
    "customers": (load_customers, DEPLOY / "spark" / "customers.toml"),
}
#: as load_toml's row, and what the values make (a few objects per byte of a value)
BOUND = Bound(2048 * KIB, 64, cpu_s=2.0, cpu_per_mib=8)
SETTINGS = settings(
    max_examples=15,
    deadline=5000,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def _load(name: str, path: Path, data: bytes) -> object:
    path.write_bytes(data)
    path.chmod(0o600)
    loader, _ = LOADERS[name]
    return within(BOUND, (ConfigError,), loader, path, size=len(data))


@pytest.mark.parametrize("name", sorted(LOADERS))
@SETTINGS
@given(data=st.data())
def test_any_config_file_is_loaded_or_refused_with_a_config_error(
    tmp_path: Path, name: str, data: st.DataObject
) -> None:
    sample = LOADERS[name][1].read_bytes()
    raw = data.draw(st.one_of(any_bytes(300), mutated(sample, 8)))
    _load(name, tmp_path / "config.toml", raw)


_VALUES = st.one_of(
    any_text(60),
    HUGE_INTS.filter(lambda n: n < 2**64),
    st.integers(),
    st.floats(),
    st.sampled_from([math.inf, -math.inf, math.nan, True, "", "${SL_NOT_SET}", "1 GiB", "-5s"]),
    st.lists(any_text(10), max_size=4),
    st.integers(1, 200).map(lambda n: _nested(n)),
    st.dictionaries(any_text(8), st.integers(), max_size=3),
)


def _nested(n: int) -> list[Any]:
    out: list[Any] = []
    for _ in range(n):
        out = [out]
    return out


def _leaves(doc: dict[str, Any], path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    for k, v in doc.items():
        if isinstance(v, dict):
            out += _leaves(v, (*path, k))
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            out += _leaves(v[0], (*path, k, "0"))
        else:
            out.append((*path, k))
    return out


def _set(doc: Any, keys: tuple[str, ...], value: object) -> None:
    for k in keys[:-1]:
        doc = doc[int(k)] if isinstance(doc, list) else doc[k]
    doc[keys[-1]] = value


@pytest.mark.parametrize("name", ["edge", "gateway", "sites"])
@SETTINGS
@given(data=st.data())
def test_a_sample_config_with_a_value_replaced_is_loaded_or_refused(
    tmp_path: Path, name: str, data: st.DataObject
) -> None:
    """The sample, every key in place, one to three values replaced by text of any
    category, huge numbers, NaN, lists nested deep, tables: the parsers behind the
    TOML reader see what a wrong or hostile file holds."""
    doc = tomllib.loads(LOADERS[name][1].read_text())
    leaves = _leaves(doc)
    broken = copy.deepcopy(doc)
    for keys in data.draw(st.lists(st.sampled_from(leaves), min_size=1, max_size=3)):
        _set(broken, keys, data.draw(_VALUES))
    raw = tomli_w.dumps(broken).encode("utf-8", "surrogatepass")
    _load(name, tmp_path / "config.toml", raw)
