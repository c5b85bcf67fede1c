"""Files replaced whole: a reader sees the old content or the new, never half of it.

Status files, positions, the gateway's ship credentials, the stack's certificates and
``stack.json`` are read by other processes while their writer runs and must survive a
crash mid-write, so each is written to a temporary name, fsynced, renamed over the old
one, and the directory fsynced so the rename itself survives a power cut (one place, so
no writer forgets a step).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shorelink.errors import ConfigError

__all__ = ["FileWatch", "locked", "read_private", "write_atomic", "write_json_atomic"]


def read_private(path: Path, field: str) -> bytes:
    """The bytes of a file that holds a secret (a token, password hashes), refused with
    a :class:`ConfigError` naming ``field`` when others may read it: world-readable, or
    group-readable by a group other than this process's own (a unit's ``Group=``)."""
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            mode = st.st_mode
            if mode & stat.S_IROTH:
                raise ConfigError(
                    field,
                    f"{path} is world-readable (mode {stat.S_IMODE(mode):o}): chmod o-r it first",
                )
            if mode & stat.S_IRGRP and st.st_gid != os.getegid():
                raise ConfigError(
                    field,
                    f"{path} is readable by group {st.st_gid}, not this process's own "
                    f"({os.getegid()}; mode {stat.S_IMODE(mode):o}): chmod g-r it or chgrp it",
                )
            return f.read()
    except OSError as exc:
        raise ConfigError(field, f"cannot read {path}: {exc.strerror or exc}") from None


def write_atomic(path: Path, data: bytes | str, *, mode: int = 0o666) -> None:
    """Replace ``path`` with ``data`` (text as UTF-8): written to a temporary file of a
    random name beside it (``.<name>.<random>.tmp``, created with ``mode``, less the
    umask, from the start), fsynced, renamed over ``path``, then the directory fsynced.
    A crash leaves the old file or the new one.

    The temporary file is made with ``O_CREAT | O_EXCL | O_NOFOLLOW``: in a directory
    others may write, a name planted there beforehand (a symlink to a file of theirs, a
    file they can read) is never written through (review N9: a private key once landed
    in a planted ``ship.key.tmp``'s target). The rename replaces ``path`` itself, a
    symlink there included, never what it points to."""
    raw = data.encode() if isinstance(data, str) else data
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
        try:
            fd = os.open(tmp, flags, mode)
            break
        except FileExistsError:
            continue  # a name taken (planted, or a crash's leftover): another one
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_json_atomic(
    path: Path,
    obj: Any,
    *,
    indent: int | None = None,
    sort_keys: bool = False,
    newline: bool = False,
    mode: int = 0o666,
) -> None:
    """Write ``obj`` as JSON to ``path`` as :func:`write_atomic` does (its directory
    made if missing).

    The JSON is encoded before anything is written, so an object that cannot be
    serialised leaves the old file (and no temporary file) behind."""
    text = json.dumps(obj, indent=indent, sort_keys=sort_keys) + ("\n" if newline else "")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text, mode=mode)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``<path>.lock`` (mode 0600) for a read-modify-write of
    ``path``: two commands at once neither undo each other nor lose a change. Readers
    need none (they see the old file or the new one, never half)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = path.with_name(path.name + ".lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # and the lock with it


class FileWatch:
    """Tells a reader when a file another process rewrites has changed: looked at no
    more than once every ``every`` seconds; a change is told by the file's inode, size
    and mtime (an atomic rename is a new inode, so a same-tick rewrite is seen), and is
    remembered only once the reader says it has read the file (:meth:`read_at`): a
    file that did not parse is tried again at the next look."""

    def __init__(self, path: Path, every: float = 1.0) -> None:
        self.path = path
        self.every = every
        self._read: tuple[int, int, int] = (0, 0, 0)
        self._looked = 0.0

    def stamp(self) -> tuple[int, int, int]:
        """The file's (inode, size, mtime in ns) now; zeros when it is missing."""
        try:
            st = self.path.stat()
        except OSError:
            return (0, 0, 0)
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def due(self) -> bool:
        """Whether the file should be read again: it is time to look, and it changed
        since the read last told to :meth:`read_at`."""
        now = time.monotonic()
        if now - self._looked < self.every:
            return False
        self._looked = now
        return self.stamp() != self._read

    def read_at(self, stamp: tuple[int, int, int]) -> None:
        """The file as it was at ``stamp`` (taken before reading it) has been read."""
        self._read = stamp
