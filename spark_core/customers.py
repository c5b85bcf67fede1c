"""Customers and who owns each container when: the data behind the customer streams.

Big Blue carries containers for other lines and for manufacturers; each customer reads
the records of its own containers, and nothing else (docs/access-control.md). Who owns a
container is data, not code: the customers file (``customers_file`` in sites.toml, TOML)
lists each customer with

- ``owner_codes``: the ISO 6346 owner codes of its containers (three letters and the
  category letter U, J or Z: ``MSCU``), and
- ``[[customers.<name>.leases]]``: containers it leases for a period (``container``,
  ``from``, optional ``to``; TOML date-times or RFC 3339 strings; ``to`` excluded).

A reading belongs to whoever owns its container at the reading's own time (its ``sl.ts``
header): a lease covering that time wins, else the owner of the code. So a container
changes hands at a time, never retroactively: a reading from before a lease starts stays
with the old owner even when it arrives after the lease was added. The merge re-reads
the file when it changes (checked once per micro-batch, :meth:`Ownership.refresh`), so
changes take effect without a restart; a file that no longer reads keeps the last good
ownership, logged and counted.

A lease that would reach into the past when the file is read again (added with a
``from`` before now, removed or shortened after it began) is refused the same way
(:func:`retroactive_leases`): records of that period were merged already, at this site
and at others that read the file at other times, and a customer stream would then hold
them at one site and not at another (review finding 15). Give a new lease a ``from``
after every site will have the file.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shorelink.boundary import boundary
from shorelink.config import Secret, check_name_field, load_toml
from shorelink.errors import ConfigError
from shorelink.logs import get_logger

__all__ = [
    "DEFAULT_STREAMS",
    "Customer",
    "Customers",
    "Lease",
    "Ownership",
    "load_customers",
    "parse_customers",
    "retroactive_leases",
]

log = get_logger(__name__)

#: streams whose records are keyed by container id: what customer streams carry
DEFAULT_STREAMS = ("containers", "alerts")

_OWNER_CODE = re.compile(r"[A-Z]{3}[UJZ]")
_CONTAINER = re.compile(r"[A-Z]{3}[UJZ]\d{7}")
#: ISO 6346 character values: digits their own, letters from A=10 up, skipping the
#: multiples of 11 (fleet_sim/iso6346.py explains; the deployables do not import it)
_VALUES = {
    **{d: int(d) for d in "0123456789"},
    **dict(zip("ABCDEFGHIJKLMNOPQRSTUVWXYZ", (n for n in range(10, 39) if n % 11), strict=False)),
}


def _check_digit(prefix10: str) -> int:
    """The ISO 6346 check digit of owner code, category and serial."""
    return sum(_VALUES[c] << i for i, c in enumerate(prefix10)) % 11 % 10


@dataclass(frozen=True)
class Lease:
    container: str
    from_ms: int
    #: excluded; None: open-ended
    to_ms: int | None = None

    def covers(self, ts_ms: int) -> bool:
        return self.from_ms <= ts_ms and (self.to_ms is None or ts_ms < self.to_ms)

    def overlaps(self, other: Lease) -> bool:
        a_end = self.to_ms if self.to_ms is not None else float("inf")
        b_end = other.to_ms if other.to_ms is not None else float("inf")
        return self.from_ms < b_end and other.from_ms < a_end


@dataclass(frozen=True)
class Customer:
    name: str
    owner_codes: tuple[str, ...] = ()
    leases: tuple[Lease, ...] = ()
    #: the streams of its containers it gets (``sl.customer.<name>.<stream>``)
    streams: tuple[str, ...] = DEFAULT_STREAMS
    #: the password of its principal ``customer-<name>`` (``${ENV}``)
    password: Secret = field(default=Secret(""))


class Customers:
    """Every customer, indexed by owner code and by leased container."""

    def __init__(self, customers: dict[str, Customer] | None = None) -> None:
        self.customers = dict(customers or {})
        self._by_code = {code: c.name for c in self.customers.values() for code in c.owner_codes}
        self._leases: dict[str, list[tuple[str, Lease]]] = {}
        for c in self.customers.values():
            for lease in c.leases:
                self._leases.setdefault(lease.container, []).append((c.name, lease))
        #: every stream some customer gets (the merge looks no further for others)
        self.stream_names = frozenset(s for c in self.customers.values() for s in c.streams)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Customers) and other.customers == self.customers

    __hash__ = None  # type: ignore[assignment]

    def owner(self, container: str, ts_ms: int) -> str | None:
        """The customer owning ``container`` at ``ts_ms`` (None: Big Blue's own, or an
        id that is no container)."""
        for name, lease in self._leases.get(container, ()):
            if lease.covers(ts_ms):
                return name
        return self._by_code.get(container[:4])

    def streams(self) -> set[tuple[str, str]]:
        """Every (customer, stream) that has a customer topic."""
        return {(c.name, s) for c in self.customers.values() for s in c.streams}

    def passwords(self) -> dict[str, Secret]:
        return {c.name: c.password for c in self.customers.values() if c.password}


def _instant(value: object, where: str) -> int:
    """A TOML date-time (or an RFC 3339 string) as epoch ms; a date-time without a zone
    is an error (a lease must not move with the reader's time zone)."""
    if isinstance(value, str):
        try:
            value = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise ConfigError(where, f"{value!r} is not an RFC 3339 date-time") from None
    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        value = dt.datetime(value.year, value.month, value.day, tzinfo=dt.UTC)
    if not isinstance(value, dt.datetime):
        raise ConfigError(where, "expected a date-time (2026-05-01T00:00:00Z)")
    if value.tzinfo is None:
        raise ConfigError(where, "give the time zone (Z or +hh:mm)")
    try:
        return int(value.timestamp() * 1000)
    except (OverflowError, ValueError, OSError):
        raise ConfigError(where, f"{value.isoformat()} is out of range") from None


def _strings(table: Mapping[str, Any], key: str, where: str, default: Iterable[str]) -> list[str]:
    v = table.get(key, list(default))
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise ConfigError(f"{where}.{key}", "expected a list of strings")
    return list(v)


def parse_customers(data: Mapping[str, Any], source: str = "customers") -> Customers:
    """``[customers.<name>]`` tables of a customers file; every error names its key."""
    table = data.get("customers", {})
    extra = sorted(set(data) - {"customers"})
    if extra:
        raise ConfigError(extra[0], f"unknown key in {source}")
    if not isinstance(table, dict):
        raise ConfigError("customers", "expected a table of [customers.NAME] tables")
    out: dict[str, Customer] = {}
    code_owner: dict[str, str] = {}
    leases_of: dict[str, list[tuple[str, Lease]]] = {}
    for name, t in table.items():
        where = f"customers.{name}"
        check_name_field(where, "customer", name)
        if not isinstance(t, dict):
            raise ConfigError(where, "expected a table")
        unknown = sorted(set(t) - {"owner_codes", "leases", "streams", "password"})
        if unknown:
            raise ConfigError(f"{where}.{unknown[0]}", "unknown key")
        codes = _strings(t, "owner_codes", where, ())
        for code in codes:
            if not _OWNER_CODE.fullmatch(code):
                raise ConfigError(
                    f"{where}.owner_codes", f"{code!r}: an owner code is 3 letters and U, J or Z"
                )
            if code in code_owner:
                raise ConfigError(f"{where}.owner_codes", f"{code} is already {code_owner[code]}'s")
            code_owner[code] = name
        streams = _strings(t, "streams", where, DEFAULT_STREAMS)
        for s in streams:
            check_name_field(f"{where}.streams", "stream", s)
        leases = []
        raw = t.get("leases", [])
        if not isinstance(raw, list):
            raise ConfigError(f"{where}.leases", "expected [[customers.NAME.leases]] tables")
        for i, lt in enumerate(raw):
            lw = f"{where}.leases[{i}]"
            if not isinstance(lt, dict):
                raise ConfigError(lw, "expected a table")
            unknown = sorted(set(lt) - {"container", "from", "to"})
            if unknown:
                raise ConfigError(f"{lw}.{unknown[0]}", "unknown key")
            container = lt.get("container")
            if not isinstance(container, str) or not _CONTAINER.fullmatch(container):
                raise ConfigError(f"{lw}.container", "expected a container id (CSQU3054383)")
            if int(container[10]) != (digit := _check_digit(container[:10])):
                # a typo here would leave the container's readings with its code's owner
                raise ConfigError(
                    f"{lw}.container", f"{container}: the ISO 6346 check digit is {digit}"
                )
            if "from" not in lt:
                raise ConfigError(f"{lw}.from", "is required")
            lease = Lease(
                container,
                _instant(lt["from"], f"{lw}.from"),
                _instant(lt["to"], f"{lw}.to") if "to" in lt else None,
            )
            if lease.to_ms is not None and lease.to_ms <= lease.from_ms:
                raise ConfigError(f"{lw}.to", "must be after from")
            for other_name, other in leases_of.get(container, []):
                if other.overlaps(lease):
                    raise ConfigError(
                        f"{lw}.from",
                        f"{container} is leased to {other_name} for part of this period",
                    )
            leases_of.setdefault(container, []).append((name, lease))
            leases.append(lease)
        password = t.get("password", "")
        if not isinstance(password, str):
            raise ConfigError(f"{where}.password", "expected a string (${ENV})")
        out[name] = Customer(
            name,
            tuple(codes),
            tuple(leases),
            tuple(streams),
            Secret(password, field=f"{where}.password"),
        )
    return Customers(out)


@boundary
def load_customers(path: Path) -> Customers:
    """The customers file at ``path``."""
    return parse_customers(load_toml(path), str(path))


def retroactive_leases(old: Customers, new: Customers, now_ms: int) -> list[str]:
    """The containers whose leases in ``new`` give some time before ``now_ms`` another
    owner than in ``old`` (a lease added with a past ``from``, one removed, moved or
    shortened after it began); ending a lease later than now changes nothing past."""

    def past(c: Customers, container: str) -> list[tuple[str, int, int]]:
        return sorted(
            (name, lease.from_ms, min(now_ms, lease.to_ms if lease.to_ms is not None else now_ms))
            for name, lease in c._leases.get(container, ())
            if lease.from_ms < now_ms
        )

    return [
        container
        for container in sorted(set(old._leases) | set(new._leases))
        if past(old, container) != past(new, container)
    ]


class Ownership:
    """The customers file as the merge sees it: re-read when it changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.customers = load_customers(path)
        self._stamp = self._stat()
        #: reloads that failed (the last good ownership was kept)
        self.reload_errors = 0
        self.reloads = 0

    def _stat(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def refresh(self) -> bool:
        """Re-read the file if it changed; True when the ownership changed."""
        stamp = self._stat()
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            new = load_customers(self.path)
        except Exception as exc:
            # whatever the file holds, the merge goes on: a ConfigError names the key;
            # anything else (unreadable, not UTF-8, gone, a directory) is the file's
            # fault just as much
            self.reload_errors += 1
            log.error("customers_reload_failed", path=self.path, error=str(exc))
            return False
        moved = retroactive_leases(self.customers, new, int(time.time() * 1000))
        if moved:
            self.reload_errors += 1
            log.error(
                "customers_reload_refused",
                path=self.path,
                containers=",".join(moved[:10]),
                error="leases would give records from before now another owner (merged already, "
                "here and at other sites): give a changed lease a from/to after now",
            )
            return False
        self.reloads += 1
        changed = new != self.customers
        self.customers = new
        log.info("customers_reloaded", path=self.path, customers=len(new.customers))
        return changed
