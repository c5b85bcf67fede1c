"""Configuration building blocks shared by every deployable.

Configs are TOML files validated at load into frozen dataclasses; defaults live in code.
Values may use ``${ENV}`` (or ``${ENV:-default}``): a string's text, or the whole of a
number, flag, size or duration (``port = "${PORT}"``, read as TOML reads the value once
expanded); secrets are :class:`Secret`
and never print. Every error is a :class:`~shorelink.errors.ConfigError` naming the bad
field with its full dotted path (``streams.alerts.on_full``); :func:`read` goes on past
a bad key and reports every one it found at once (:class:`~shorelink.errors.ConfigErrors`).

Each key is declared once, on its dataclass field: the field's type says how the value
is read, and :func:`key` in the field's metadata says what the file calls it when the
name differs (``interval_s`` is ``interval``), its bounds and its choices. :func:`read`
reads a table into its dataclass from those declarations alone, so a deployable's
config module writes by hand only what depends on other keys (cross-field checks,
defaults made of other values); ``tests/test_config_samples.py`` walks the same
declarations to check that the commented sample under ``deploy/`` names every key.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from shorelink.boundary import boundary
from shorelink.errors import ConfigError, ConfigErrors
from shorelink.identity import check_name

__all__ = [
    "LOG_LEVELS",
    "Errors",
    "Key",
    "Secret",
    "Section",
    "check_name_field",
    "expand_env",
    "key",
    "keys_of",
    "load_config",
    "load_toml",
    "parse_duration",
    "parse_size",
    "read",
    "read_key",
    "relative",
    "resolve_secrets",
    "walk",
]

T = TypeVar("T")
U = TypeVar("U")

#: the ``log_level`` key of every deployable
LOG_LEVELS = ("debug", "info", "warning", "error")

_ENV_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class Secret:
    """A credential: prints as ``Secret('***')``, never as its value.

    ``Secret(text)`` holds a literal. One read from a config file
    (:meth:`Section.secret`) keeps its ``${ENV}`` references unresolved until
    :attr:`value` is read: a process resolves only the secrets it uses, so the
    operations page or a customer's consumer loads the whole sites file without the
    admin's or a neighbour's password in its environment (review M6). A variable that
    is not set is then a :class:`~shorelink.errors.ConfigError` naming the field, at
    the first use. Equal secrets have equal values."""

    __slots__ = ("_field", "_text")

    def __init__(self, text: str, *, field: str | None = None) -> None:
        #: as written; with ``field`` set, ``${ENV}`` references are resolved at use
        self._text = text
        self._field = field

    @property
    def value(self) -> str:
        if self._field is None:
            return self._text
        return expand_env(self._text, self._field)

    @property
    def in_file(self) -> bool:
        """Read from a config file that holds the value itself (no ``${ENV}``): that
        file is then as secret as the value."""
        return self._field is not None and bool(self._text) and not _ENV_RE.search(self._text)

    def __repr__(self) -> str:
        return "Secret('***')" if self._text else "Secret('')"

    __str__ = __repr__

    def __bool__(self) -> bool:
        """Whether the value is not empty (an unset ``${VAR:-}`` is empty)."""
        return bool(self.value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)


def resolve_secrets(cfg: Any) -> None:
    """Resolve every :class:`Secret` in the dataclass ``cfg`` (nested dataclasses,
    tuples and dicts of them): a ``ConfigError`` naming the first whose variable is
    not set. A deployable that uses every secret of its file (the edge agent, the
    gateway) calls it at load, so ``check-config`` and the start fail at once; the sites
    file, read by many commands each with its own secrets, does not."""
    if isinstance(cfg, Secret):
        bool(cfg)
    elif dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        for f in dataclasses.fields(cfg):
            resolve_secrets(getattr(cfg, f.name))
    elif isinstance(cfg, (tuple, list)):
        for x in cfg:
            resolve_secrets(x)
    elif isinstance(cfg, dict):
        for x in cfg.values():
            resolve_secrets(x)


@boundary
def expand_env(value: str, field: str) -> str:
    def sub(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(2)
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return default
        raise ConfigError(field, f"environment variable {name} is not set")

    return _ENV_RE.sub(sub, value)


#: the most levels a TOML key may have (``a.b.c = 1``, ``[a.b.c]``): tomllib keeps
#: every prefix of a dotted key, so its memory grows with the square of the depth (a
#: 16 KB file of one key 8,000 levels deep took 259 MB). No config of ours needs 8.
MAX_KEY_DEPTH = 32
_STRING = re.compile(r'"""[\s\S]*?"""|\'\'\'[\s\S]*?\'\'\'|"(?:[^"\\\n]|\\.)*"|\'[^\'\n]*\'')
#: tried only where a bare word starts: tried inside one too, a long word cost the
#: square of its length (64 KiB of letters took 30 s)
_DEEP_KEY = re.compile(rf"(?<![\w-])(?:[\w-]+\s*\.\s*){{{MAX_KEY_DEPTH}}}[\w-]")


@boundary
def parse_toml(text: str) -> dict[str, Any]:
    """``tomllib.loads(text)``, refusing (``ValueError``) a key deeper than
    :data:`MAX_KEY_DEPTH` before tomllib reads it, and nesting past the parser's
    recursion limit (a ``ValueError``, not a ``RecursionError``). Raises
    ``tomllib.TOMLDecodeError`` (a ``ValueError``) for the rest."""
    if _DEEP_KEY.search(_STRING.sub("s", text)):
        raise ValueError(f"a key has more than {MAX_KEY_DEPTH} levels")
    try:
        return tomllib.loads(text)
    except RecursionError:  # arrays or inline tables nested past the parser's limit
        raise ValueError("nested too deep") from None


@boundary
def load_toml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        with open(p, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise ConfigError(str(p), "file not found") from None
    try:
        return parse_toml(raw.decode())
    except UnicodeDecodeError as exc:
        raise ConfigError(str(p), f"not UTF-8: {exc}") from None
    except ValueError as exc:
        raise ConfigError(str(p), f"not valid TOML: {exc}") from None


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
#: the largest size and duration a config may give: past them a number is a typo or a
#: hostile file (a float of 400 digits is infinity, and ``int()`` of it raises)
MAX_SIZE = 2**63 - 1
MAX_DURATION_S = 100 * 365 * 86400.0


def parse_size(value: object, field: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_SIZE:
        return value
    if isinstance(value, str):
        m = re.fullmatch(r"\s*(\d{1,30}(?:\.\d{1,30})?)\s*([A-Za-z]*)\s*", value)
        if m and m.group(2).lower() in _SIZE_UNITS:
            size = float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()]
            if size <= MAX_SIZE:
                return int(size)
    raise ConfigError(field, f"expected a size like 1048576 or '512MiB', got {value!r:.80}")


def parse_duration(value: object, field: str) -> float:
    """``30`` (seconds), ``"5ms"``, ``"30d"``, ``"1h"`` -> seconds (at most
    :data:`MAX_DURATION_S`)."""
    seconds = None
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        seconds = float(value)
    elif isinstance(value, str):
        m = re.fullmatch(r"\s*(\d{1,30}(?:\.\d{1,30})?)\s*(ms|s|m|h|d)\s*", value)
        if m:
            seconds = float(m.group(1)) * _DUR_UNITS[m.group(2)]
    if seconds is not None and seconds <= MAX_DURATION_S:  # NaN and infinity too
        return seconds
    raise ConfigError(
        field, f"expected a duration like 30, '5ms' or '30d' (at most 100 years), got {value!r:.80}"
    )


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

    def keys(self) -> list[str]:
        return list(self._data)

    def mark(self, key: str) -> None:
        """Count ``key`` as read."""
        self._used.add(key)

    def _get(self, key: str, default: Any, types: type | tuple[type, ...], what: str) -> Any:
        self._used.add(key)
        if key not in self._data:
            if default is _REQUIRED:
                raise ConfigError(self.field(key), "is required")
            return default
        v = self._data[key]
        kinds = types if isinstance(types, tuple) else (types,)
        if isinstance(v, str) and str not in kinds and _ENV_RE.search(v):
            v = self._from_env(key, v, what)
        if isinstance(v, bool) and bool not in kinds:
            raise ConfigError(self.field(key), f"expected {what}, got {v!r}")
        if not isinstance(v, types):
            raise ConfigError(self.field(key), f"expected {what}, got {v!r}")
        return v

    def _from_env(self, key: str, text: str, what: str) -> Any:
        """A value that is not a string, written as ``${ENV}`` (``port = "${PORT}"``):
        the expanded text read as TOML reads a value (``8443``, ``true``, ``2.5``)."""
        expanded = expand_env(text, self.field(key))
        try:
            return tomllib.loads(f"v = {expanded}")["v"]
        except (tomllib.TOMLDecodeError, RecursionError):  # RecursionError: nested too deep
            raise ConfigError(
                self.field(key), f"expected {what}, got {expanded!r} (from {text})"
            ) from None

    def text(self, key: str, default: Any = None, *, env: bool = True) -> str:
        v = self._get(key, _REQUIRED if default is None else default, str, "a string")
        return expand_env(v, self.field(key)) if env else str(v)

    def opt_str(self, key: str) -> str | None:
        v = self._get(key, None, str, "a string")
        return expand_env(v, self.field(key)) if isinstance(v, str) else None

    def secret(self, key: str) -> Secret:
        v = self._get(key, "", str, "a string")
        return Secret(v, field=self.field(key))

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
        return parse_size(
            expand_env(v, self.field(key)) if isinstance(v, str) else v, self.field(key)
        )

    def duration(self, key: str, default: Any = None) -> float:
        v = self._get(
            key, _REQUIRED if default is None else default, (int, float, str), "a duration"
        )
        if isinstance(v, str):
            v = expand_env(v, self.field(key))
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
        """Raise if the table has keys that nothing read (typos, removed options), naming
        each."""
        extra = sorted(set(self._data) - self._used)
        if extra:
            raise ConfigErrors.of([ConfigError(self.field(k), "unknown key") for k in extra])


_REQUIRED: Any = object()


def check_name_field(field: str, kind: str, value: str) -> str:
    """``value`` if it is a valid ``kind`` name (``shorelink.identity``), else an error
    naming ``field``."""
    try:
        return check_name(kind, value)
    except Exception as exc:
        raise ConfigError(field, str(exc)) from None


class Errors:
    """A file's errors, gathered so that its reader reports every one at once:
    :meth:`attempt` reads one part and gives ``fallback`` in its place when the part is
    bad (the next parts are read all the same); :meth:`check` raises what was found
    (:class:`~shorelink.errors.ConfigErrors` when more than one)."""

    def __init__(self) -> None:
        self.found: list[ConfigError] = []

    def attempt(self, read_one: Callable[[], T], fallback: U) -> T | U:
        try:
            return read_one()
        except ConfigError as exc:
            self.found.append(exc)
            return fallback

    def add(self, field: str, message: str) -> None:
        """A finding of the caller's own (a check across keys)."""
        self.found.append(ConfigError(field, message))

    def check(self) -> None:
        if self.found:
            raise ConfigErrors.of(self.found)

    def result(self, value: T | None) -> T:
        """``value``, read with :meth:`attempt`, once nothing was found (it is None
        only when something was)."""
        self.check()
        assert value is not None
        return value


def relative(path: Path, base: Path | None) -> Path:
    """A path as the file wrote it: relative paths are relative to the file's directory."""
    return base / path if base is not None and not path.is_absolute() else path


def load_config(path: str | Path, parse: Callable[[dict[str, Any], Path], T]) -> T:
    """Load a TOML file and validate it with ``parse(data, base)``, ``base`` being the
    file's directory (relative paths in the file are relative to the file)."""
    p = Path(path)
    return parse(load_toml(p), p.resolve().parent)


# ---------------------------------------------------------------------------------------
# Keys declared on dataclass fields

_META = "shorelink.config.key"


@dataclass(frozen=True)
class Key:
    """How one dataclass field is read from its TOML table (see :func:`key`)."""

    #: the key in the file; dotted for a key of a sub-table (``listen.port``); "" until
    #: resolved by :func:`keys_of`: the field's name
    name: str = ""
    #: str, choice, int, bool, size, duration (seconds, a float), duration_ms (an int), secret,
    #: path (relative to the file), custom (a string read by its type's
    #: ``from_config(text, base, field)``), strings, section, inline (a nested dataclass
    #: whose keys sit in this table, beside the others), sections (a table of tables),
    #: array (of tables), pairs (a free table of strings), name (the entry's name in its
    #: table: not a key); "": from the field's type
    kind: str = ""
    #: bounds of an int, size or duration (inclusive); ``gt``: exclusive lower bound
    min: float | None = None
    max: float | None = None
    gt: float | None = None
    #: the error when out of bounds (``{v}``: the value); default: "v is out of range"
    why: str | None = None
    choices: tuple[str, ...] = ()
    #: every value must be a valid name of this kind (``site``, ``stream``: identity rules)
    names: str | None = None
    #: a word in the file that stands for ``None`` (``"forever"``); a duration beside
    #: it is then written as a string too
    none: str | None = None
    #: read a section by hand from its table (the table's :class:`Section`)
    parse: Callable[[Section], Any] | None = None
    #: keys of a nested dataclass declared elsewhere (its field name -> :func:`key`)
    keys: Mapping[str, Mapping[str, Key]] = dataclasses.field(default_factory=dict)
    # resolved by keys_of:
    field: str = ""
    of: Any = None
    optional: bool = False


def key(
    name: str = "",
    *,
    kind: str = "",
    min: float | None = None,
    max: float | None = None,
    gt: float | None = None,
    why: str | None = None,
    choices: tuple[str, ...] = (),
    names: str | None = None,
    none: str | None = None,
    parse: Callable[[Section], Any] | None = None,
    keys: Mapping[str, Mapping[str, Key]] | None = None,
) -> dict[str, Key]:
    """Field metadata declaring a config key: ``field(default=10.0,
    metadata=key("interval", min=0.05))``. A field without it is the key of its name."""
    return {_META: Key(name, kind, min, max, gt, why, choices, names, none, parse, keys or {})}


def _shape(tp: Any) -> tuple[str, Any, bool]:
    """(kind, element dataclass, optional) of a field's type."""
    optional = False
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(tp) if a is not type(None)]
        optional = len(members) < len(typing.get_args(tp))
        tp = members[0]
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    simple = {bool: "bool", int: "int", float: "duration", str: "str", Path: "path"}
    if tp in simple:
        return simple[tp], None, optional
    if tp is Secret:
        return "secret", None, optional
    if hasattr(tp, "from_config"):  # a value type of its own: from_config(text, base, field)
        return "custom", tp, optional
    if dataclasses.is_dataclass(tp):
        return "section", tp, optional
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        if args[0] is str:
            return "strings", None, optional
        if typing.get_origin(args[0]) is tuple:
            return "pairs", None, optional
        if dataclasses.is_dataclass(args[0]):
            return "array", args[0], optional
    if origin is dict and dataclasses.is_dataclass(args[1]):
        return "sections", args[1], optional
    raise TypeError(f"no config kind for {tp!r}")


def keys_of(cls: type, keys: Mapping[str, Mapping[str, Key]] | None = None) -> list[Key]:
    """The keys a config dataclass declares, resolved (name, kind, element type); fields
    whose name starts with ``_`` are not keys. ``keys`` overrides fields' metadata."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if f.name.startswith("_"):
            continue
        meta = (keys or {}).get(f.name) or f.metadata
        k = meta.get(_META, Key())
        kind, of, optional = _shape(hints[f.name])
        if k.choices and not k.kind:
            kind = "choice"
        out.append(
            dataclasses.replace(
                k,
                name=k.name or f.name,
                kind=k.kind or kind,
                field=f.name,
                of=of,
                optional=optional,
            )
        )
    return out


def read_key(cls: type, field: str, sec: Section) -> Any:
    """The one key ``field`` of ``cls`` from ``sec``, read as :func:`read` reads it: for
    a key that other keys' defaults are made of (``ship``, ``site``)."""
    k = next(k for k in keys_of(cls) if k.field == field)
    f = next(f for f in dataclasses.fields(cls) if f.name == field)
    head, _, name = k.name.rpartition(".")
    return _value(k, sec.section(head) if head else sec, name, _default(f), None)


def _defaults(obj: Any) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return _REQUIRED


def read(
    cls: type[T],
    sec: Section,
    *,
    base: Path | None = None,
    defaults: Mapping[str, Any] | None = None,
    keys: Mapping[str, Mapping[str, Key]] | None = None,
    done: bool = True,
    **given: Any,
) -> T:
    """Read ``cls`` from the table ``sec`` by the keys its fields declare.

    ``given`` fields are the caller's (read by hand from ``sec`` before); ``defaults``
    replace the fields' defaults (values made of other keys); ``base`` is the directory
    relative paths start from. With ``done``, keys nothing read are an error."""
    tables: dict[str, Section] = {}

    def table(path: str) -> Section:
        if not path:
            return sec
        if path not in tables:
            head, _, name = path.rpartition(".")
            tables[path] = table(head).section(name)
        return tables[path]

    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    values = dict(given)
    errors = Errors()
    unread: set[int] = set()  # tables a hand-written parser left part-way: not "done"
    for k in keys_of(cls, keys):
        if k.field in given:
            continue
        default = (defaults or {}).get(k.field, _REQUIRED)
        if default is _REQUIRED:
            default = _default(fields[k.field])
        head, _, name = k.name.rpartition(".")
        try:
            if k.kind in ("section", "inline"):
                sub = table(k.name if k.kind == "section" else head)
                if k.parse is not None:
                    unread.add(id(sub))
                    values[k.field] = k.parse(sub)
                    unread.discard(id(sub))
                else:
                    nested = _defaults(default) if dataclasses.is_dataclass(default) else None
                    values[k.field] = read(
                        k.of, sub, base=base, defaults=nested, keys=k.keys, done=False
                    )
            elif k.kind == "pairs":  # every pair read, each bad one named
                sub = table(k.name)
                texts = {p: errors.attempt(partial(sub.text, p), "") for p in sorted(sub.keys())}
                values[k.field] = tuple(texts.items())
            else:
                values[k.field] = _value(k, table(head), name, default, base)
        except ConfigError as exc:  # the next keys are read all the same: every error at once
            errors.found.append(exc)
    for t in [*reversed(tables.values()), *([sec] if done else [])]:
        if id(t) not in unread:
            errors.attempt(t.done, None)
    errors.check()
    try:
        return cls(**values)
    except ValueError as exc:  # the dataclass's own check of its values (Limits' bounds)
        raise ConfigError(sec.path or cls.__name__, str(exc)) from None


def _value(k: Key, sec: Section, name: str, default: Any, base: Path | None) -> Any:
    """One key's value (of any kind but a section) from its table."""
    kind, field = k.kind, sec.field(name)
    if k.optional and not sec.has(name):
        sec.mark(name)
        return None
    if k.none is not None and kind in ("duration", "duration_ms") and sec.has(name):
        # a word or a duration: a string either way ("forever", "365d")
        text = sec.text(name)
        if text == k.none:
            return None
        seconds = parse_duration(text, field)
        given = int(seconds * 1000) if kind == "duration_ms" else seconds
        _check_bounds(k, field, given)
        return given
    d = None if default is _REQUIRED else default
    v: Any
    if kind in ("str", "choice"):
        v = sec.text(name, d)
        if k.choices and v not in k.choices:
            raise ConfigError(field, f"{v!r} is not one of {', '.join(k.choices)}")
    elif kind == "int":
        v = sec.integer(name, d)
    elif kind == "bool":
        v = sec.flag(name, _REQUIRED if d is None else d)
    elif kind == "size":
        v = sec.size(name, d)
    elif kind == "duration":
        v = sec.duration(name, d)
    elif kind == "duration_ms":
        v = int(sec.duration(name, None if d is None else d / 1000) * 1000)
    elif kind == "secret":
        v = sec.secret(name)
    elif kind == "path":
        text = sec.text(name, None if d is None else str(d))
        if not text and k.optional:
            return None
        return relative(Path(text), base)
    elif kind == "custom":
        text = sec.text(name, None if d is None else str(d))
        if not text and k.optional:
            return None
        return k.of.from_config(text, base, field)
    elif kind == "strings":
        v = tuple(sec.strings(name, None if d is None else list(d)))
    elif kind == "sections":
        # every table read, each bad one named (not only the first table's errors)
        entries = dict(d or {})
        errors = Errors()
        for entry, sub in sec.sections(name).items():

            def read_entry(entry: str = entry, sub: Section = sub) -> Any:
                if k.names:
                    check_name_field(sub.path, k.names, entry)
                named: dict[str, Any] = {}
                if any(e.kind == "name" for e in keys_of(k.of)):
                    named["name"] = entry
                d_entry = entries.get(entry)
                return read(
                    k.of,
                    sub,
                    base=base,
                    keys=k.keys,
                    defaults=_defaults(d_entry) if d_entry is not None else None,
                    **named,
                )

            got = errors.attempt(read_entry, None)
            if got is not None:
                entries[entry] = got
        errors.check()
        return entries
    elif kind == "array":
        errors = Errors()
        items = [
            errors.attempt(partial(read, k.of, sub, base=base, keys=k.keys), None)
            for sub in sec.array(name)
        ]
        errors.check()
        return tuple(items)
    else:
        raise TypeError(f"{field}: no config kind {kind!r}")
    if k.names:
        for one in v if isinstance(v, tuple) else (v,):
            check_name_field(field, k.names, one)
    if kind in ("int", "size", "duration", "duration_ms"):
        _check_bounds(k, field, v)
    return v


def _check_bounds(k: Key, field: str, v: float) -> None:
    low = (k.min is not None and v < k.min) or (k.gt is not None and v <= k.gt)
    if low or (k.max is not None and v > k.max):
        why = k.why.format(v=v) if k.why else f"{v} is out of range [{k.min}, {k.max}]"
        raise ConfigError(field, why)


def walk(
    cls: type, table: str = "", keys: Mapping[str, Mapping[str, Key]] | None = None
) -> Iterator[tuple[str, Key]]:
    """Every key ``cls`` declares, with the dotted path of its table (``*``: each entry
    of a table of tables, ``[]``: each table of an array): what the sample must name."""
    for k in keys_of(cls, keys):
        head, _, name = k.name.rpartition(".")
        where = ".".join(p for p in (table, head) if p)
        inner = ".".join(p for p in (where, name) if p)
        if k.kind == "name":
            continue
        if k.kind == "section":
            yield from walk(k.of, inner, k.keys)
        elif k.kind == "inline":
            yield from walk(k.of, where, k.keys)
        elif k.kind == "sections":
            yield from walk(k.of, f"{inner}.*", k.keys)
        elif k.kind == "array":
            yield from walk(k.of, f"{inner}[]", k.keys)
        else:
            yield where, dataclasses.replace(k, name=name)
