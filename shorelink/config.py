"""Configuration building blocks shared by every deployable.

Configs are TOML files validated at load into frozen dataclasses; defaults live in code.
String values may use ``${ENV}`` (or ``${ENV:-default}``); secrets are :class:`Secret`
and never print. Every error is a :class:`~shorelink.errors.ConfigError` naming the bad
field with its full dotted path (``streams.alerts.on_full``).
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shorelink.errors import ConfigError

__all__ = [
    "Secret",
    "Section",
    "expand_env",
    "load_toml",
    "parse_duration",
    "parse_size",
]

_ENV_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


@dataclass(frozen=True)
class Secret:
    """A credential: compares and hashes normally, prints as ``Secret('***')``."""

    value: str

    def __repr__(self) -> str:
        return "Secret('***')" if self.value else "Secret('')"

    __str__ = __repr__

    def __bool__(self) -> bool:
        return bool(self.value)


def expand_env(value: str, field: str) -> str:
    def sub(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(2)
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return default
        raise ConfigError(field, f"environment variable {name} is not set")

    return _ENV_RE.sub(sub, value)


def load_toml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        with open(p, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(str(p), "file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(p), f"not valid TOML: {exc}") from exc


_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_DUR_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_size(value: object, field: str) -> int:
    """``1048576``, ``"512MiB"``, ``"2 GB"`` -> bytes."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str):
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", value)
        if m and m.group(2).lower() in _SIZE_UNITS:
            return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])
    raise ConfigError(field, f"expected a size like 1048576 or '512MiB', got {value!r}")


def parse_duration(value: object, field: str) -> float:
    """``30`` (seconds), ``"5ms"``, ``"30d"``, ``"1h"`` -> seconds."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        return float(value)
    if isinstance(value, str):
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*", value)
        if m:
            return float(m.group(1)) * _DUR_UNITS[m.group(2)]
    raise ConfigError(field, f"expected a duration like 30, '5ms' or '30d', got {value!r}")


class Section:
    """Typed, path-aware access to one TOML table; unknown keys are an error, so a typo
    never silently falls back to a default."""

    def __init__(self, data: Mapping[str, Any], path: str = "") -> None:
        if not isinstance(data, Mapping):
            raise ConfigError(path or "(top)", f"expected a table, got {type(data).__name__}")
        self._data = dict(data)
        self._path = path
        self._used: set[str] = set()

    @property
    def path(self) -> str:
        """Dotted path of this table in the file (``streams.alerts``)."""
        return self._path

    def field(self, key: str) -> str:
        return f"{self._path}.{key}" if self._path else key

    def has(self, key: str) -> bool:
        return key in self._data

    def _get(self, key: str, default: Any, types: type | tuple[type, ...], what: str) -> Any:
        self._used.add(key)
        if key not in self._data:
            if default is _REQUIRED:
                raise ConfigError(self.field(key), "is required")
            return default
        v = self._data[key]
        if isinstance(v, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
            raise ConfigError(self.field(key), f"expected {what}, got {v!r}")
        if not isinstance(v, types):
            raise ConfigError(self.field(key), f"expected {what}, got {v!r}")
        return v

    def text(self, key: str, default: Any = None, *, env: bool = True) -> str:
        v = self._get(key, _REQUIRED if default is None else default, str, "a string")
        return expand_env(v, self.field(key)) if env else str(v)

    def opt_str(self, key: str) -> str | None:
        v = self._get(key, None, str, "a string")
        return expand_env(v, self.field(key)) if isinstance(v, str) else None

    def secret(self, key: str) -> Secret:
        v = self._get(key, "", str, "a string")
        return Secret(expand_env(v, self.field(key)))

    def integer(
        self, key: str, default: Any = None, *, min: int | None = None, max: int | None = None
    ) -> int:
        v = self._get(key, _REQUIRED if default is None else default, int, "an integer")
        if (min is not None and v < min) or (max is not None and v > max):
            raise ConfigError(self.field(key), f"{v} is out of range [{min}, {max}]")
        return int(v)

    def flag(self, key: str, default: bool) -> bool:
        return bool(self._get(key, default, bool, "true or false"))

    def size(self, key: str, default: Any = None) -> int:
        v = self._get(key, _REQUIRED if default is None else default, (int, str), "a size")
        return parse_size(v, self.field(key))

    def duration(self, key: str, default: Any = None) -> float:
        v = self._get(
            key, _REQUIRED if default is None else default, (int, float, str), "a duration"
        )
        return parse_duration(v, self.field(key))

    def choice(self, key: str, choices: tuple[str, ...], default: str) -> str:
        v = self.text(key, default)
        if v not in choices:
            raise ConfigError(self.field(key), f"{v!r} is not one of {', '.join(choices)}")
        return str(v)

    def strings(self, key: str, default: list[str] | None = None) -> list[str]:
        v = self._get(key, _REQUIRED if default is None else default, list, "a list of strings")
        if not all(isinstance(x, str) for x in v):
            raise ConfigError(self.field(key), "expected a list of strings")
        return [expand_env(x, self.field(key)) for x in v]

    def section(self, key: str) -> Section:
        v = self._get(key, {}, dict, "a table")
        return Section(v, self.field(key))

    def sections(self, key: str) -> dict[str, Section]:
        """A table of tables (``[streams.alerts]``, ``[streams.nav]``)."""
        v = self._get(key, {}, dict, "a table of tables")
        return {k: Section(sub, f"{self.field(key)}.{k}") for k, sub in v.items()}

    def array(self, key: str) -> list[Section]:
        """An array of tables (``[[rules]]``)."""
        v = self._get(key, [], list, "an array of tables")
        return [Section(item, f"{self.field(key)}[{i}]") for i, item in enumerate(v)]

    def done(self) -> None:
        """Raise if the table has keys that nothing read (typos, removed options)."""
        extra = sorted(set(self._data) - self._used)
        if extra:
            raise ConfigError(self.field(extra[0]), "unknown key")


_REQUIRED: Any = object()
