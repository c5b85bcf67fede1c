"""Who may look at the operations page: its own logins, not Kafka passwords (review M6).

``[sites.S.ops] users_file`` names a file of one login per line, ``name scrypt$...``:
the name, then an scrypt hash of the password with its parameters and salt. Only
``shorelink ops-users`` writes it (atomically, mode 0600, under a lock so two commands
at once lose nothing); the page reads it again within a second of a change, so adding
or removing a person needs no restart. A leaked file gives no password and no access to
Kafka; the page itself reads Kafka as its own read-only principal.

Checking a password costs an scrypt (about 16 MiB and tens of milliseconds): one at a
time, off the event loop, and a name and password that passed are remembered (as a
SHA-256 of the pair) until the file changes, so a page that polls pays it once. At most
:data:`MAX_WAITING_CHECKS` checks wait for their turn: one more is refused at once
(:class:`LoginsBusy`, the page answers ``503`` with ``Retry-After``), so a flood of
guesses neither grows a queue without bound nor holds a person's login behind it for
minutes (review N11). A name the file does not hold is checked against a hash of the
same cost, so the answer takes as long as for a name it holds: the page does not tell
which names exist.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import secrets
from collections.abc import Callable
from pathlib import Path

from shorelink.boundary import boundary
from shorelink.errors import ConfigError
from shorelink.files import FileWatch, locked, read_private, write_atomic
from shorelink.logs import get_logger
from spark_core.errors import SparkCoreError

__all__ = [
    "MAX_PASSWORD_BYTES",
    "MAX_WAITING_CHECKS",
    "MIN_PASSWORD_CHARS",
    "LoginsBusy",
    "OpsUsers",
    "change_users",
    "check_login_name",
    "hash_password",
    "verify_password",
]

log = get_logger(__name__)

#: scrypt's cost (N, r, p): 16 MiB of memory per check
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1
_MAXMEM = 64 * 1024 * 1024
#: a password longer than this is refused before it is hashed (what a check may cost)
MAX_PASSWORD_BYTES = 1024
#: ``shorelink ops-users add`` refuses a shorter one
MIN_PASSWORD_CHARS = 12
#: password checks that may wait for the one running; one more is refused at once
MAX_WAITING_CHECKS = 8
_HEADER = "# shorelink ops-users: name scrypt$N$r$p$salt$hash (written by `shorelink ops-users`)\n"


def hash_password(password: str) -> str:
    """``scrypt$N$r$p$salt$hash`` (salt and hash in unpadded base64)."""
    salt = secrets.token_bytes(16)
    key = _scrypt(password.encode(), salt, SCRYPT_N, SCRYPT_R, SCRYPT_P)
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${_b64(salt)}${_b64(key)}"


def verify_password(stored: str, password: str) -> bool:
    """Whether ``password`` is the one ``stored`` (a :func:`hash_password`) was made of."""
    raw = password.encode()
    if len(raw) > MAX_PASSWORD_BYTES:
        return False
    _, n, r, p, salt, key = stored.split("$")
    want = _unb64(key)
    got = _scrypt(raw, _unb64(salt), int(n), int(r), int(p), len(want))
    return hmac.compare_digest(got, want)


def _scrypt(raw: bytes, salt: bytes, n: int, r: int, p: int, length: int = 32) -> bytes:
    return hashlib.scrypt(raw, salt=salt, n=n, r=r, p=p, maxmem=_MAXMEM, dklen=length)


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode().rstrip("=")


def check_login_name(name: str, where: str) -> str:
    """A login name: 1-64 printable characters, no space and no ``:`` (HTTP Basic's
    separator)."""
    if not (0 < len(name) <= 64 and name.isprintable() and " " not in name and ":" not in name):
        raise ConfigError(where, f"{name!r} is not a login name (1-64 characters, no space or :)")
    return name


def _unb64(text: str) -> bytes:
    return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)


@boundary
def _parse(text: str, where: str) -> dict[str, str]:
    users: dict[str, str] = {}
    for i, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, stored = line.partition(" ")
        parts = stored.split("$")
        if len(parts) != 6 or parts[0] != "scrypt" or not all(x.isdigit() for x in parts[1:4]):
            raise ConfigError(where, f"line {i}: expected `name scrypt$N$r$p$salt$hash`")
        if not (1 < int(parts[1]) <= 2**16 and 0 < int(parts[2]) <= 16 and 0 < int(parts[3]) <= 4):
            raise ConfigError(where, f"line {i}: scrypt parameters out of range")
        try:
            if len(_unb64(parts[5])) < 16:
                raise ValueError("short")
            _unb64(parts[4])
        except ValueError:
            raise ConfigError(where, f"line {i}: salt or hash is not base64") from None
        check_login_name(name, f"{where}: line {i}")
        users[name] = stored
    return users


class LoginsBusy(SparkCoreError):
    """:data:`MAX_WAITING_CHECKS` password checks wait already: try again in a moment
    (``retryable``)."""

    retryable = True


class OpsUsers:
    """The page's logins, read from ``path`` (refused when readable by others)."""

    def __init__(self, path: Path, field: str) -> None:
        self.path = path
        self.field = field
        self._users: dict[str, str] = {}
        #: SHA-256 of (name, password) pairs that passed, until the file changes
        self._passed: set[bytes] = set()
        self._watch = FileWatch(path)
        self._one_at_a_time = asyncio.Semaphore(1)
        #: checks running or waiting for their turn (at most 1 + MAX_WAITING_CHECKS)
        self._queued = 0
        #: scrypt checks made (a name the file lacks costs one too)
        self.scrypt_checks = 0
        #: what a name the file lacks is checked against: a hash of the same cost
        self._decoy = hash_password(secrets.token_urlsafe(16))
        self.reload()

    @property
    def names(self) -> list[str]:
        return sorted(self._users)

    def reload(self) -> None:
        """Read the file (a :class:`ConfigError` naming the field if it cannot be)."""
        stamp = self._watch.stamp()
        self._users = _parse(read_private(self.path, self.field).decode(), self.field)
        self._passed = set()
        self._watch.read_at(stamp)

    def maybe_reload(self) -> None:
        """Pick up ``shorelink ops-users`` changes (checked once a second). A file that
        cannot be read keeps the logins the page has, logged at every check."""
        if not self._watch.due():
            return
        try:
            self.reload()
        except ConfigError as exc:
            log.error("ops_users_unreadable", users_kept=len(self._users), error=str(exc))

    async def check(self, name: str, password: str) -> bool:
        """Whether ``name`` may look with ``password``; raises :class:`LoginsBusy`
        when :data:`MAX_WAITING_CHECKS` checks wait already. A name the file lacks
        costs the same scrypt as one it holds, and is refused."""
        self.maybe_reload()
        stored = self._users.get(name)
        pair = hashlib.sha256(f"{len(name)}:{name}:{password}".encode()).digest()
        if stored is not None and pair in self._passed:
            return True
        if self._queued > MAX_WAITING_CHECKS:
            raise LoginsBusy(f"{self._queued} password checks in progress; try again shortly")
        self._queued += 1
        try:
            async with self._one_at_a_time:
                self.scrypt_checks += 1
                ok = await asyncio.to_thread(verify_password, stored or self._decoy, password)
        finally:
            self._queued -= 1
        if stored is None:
            return False
        if ok and self._users.get(name) == stored:
            self._passed.add(pair)
        return ok


def change_users(path: Path, change: Callable[[dict[str, str]], bool]) -> bool:
    """Read ``path``'s logins (none if it does not exist), apply ``change``, write them
    back if it says so: under the file's lock (:func:`~shorelink.files.locked`), mode
    0600."""
    with locked(path):
        users = _parse(read_private(path, str(path)).decode(), str(path)) if path.exists() else {}
        changed = change(users)
        if changed:
            lines = "".join(f"{n} {users[n]}\n" for n in sorted(users))
            write_atomic(path, _HEADER + lines, mode=0o600)
        return changed
