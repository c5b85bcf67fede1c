"""The registry's directory at headquarters: the log of entries and the fleet key.

``DIR/registry.log``: one entry a line (shorelink/fleet/entry.py), appended under a lock
on ``registry.log.lock`` (two commands at once each see the other's entries before they
sign the next) and fsynced; mode 0600, as the gateway's credentials file (it holds token
hashes). A write cut short leaves a last line without its newline: every reader refuses
the log there, naming the version, until an operator cuts the torn line off.

``DIR/registry.verified`` (0600): the version and hash of the newest entry a reader
checked (:data:`CHECKED`). Whoever can change it can change ``fleet.key`` beside it, so
it vouches for nothing a thief of the directory could not sign anyway.

``DIR/fleet.key`` (0600): the fleet key in force, which signs the next entry.
``DIR/fleet.pub``: the fleet's *root* key, the first entry's, which every reader pins: a
reader checks the chain from that first entry, so a later key is trusted only because
the key before it signed its rotation. A rotation writes the new key to
``fleet.key.next`` first, then the entry, then renames it over ``fleet.key``: cut short
after the entry, the next command finishes the rename.

``DIR/fleet.retired`` (0644: signatures only): before a fleet key is given up, it signs
the records of every entry it signed, rotation included, in chunks of 128
(:func:`~shorelink.fleet.travel.sign_retired`), one line a chunk: ``first count key_id
signature``. ``shorelink fleet publish`` proves those entries' records with them, so
entries signed before a rotation are published after it (a site rebuilt, a publish
that was not run), without the retired key kept anywhere.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from shorelink.boundary import boundary
from shorelink.errors import ConfigError
from shorelink.files import locked, write_atomic
from shorelink.fleet.entry import (
    MAX_ENTRY_BYTES,
    Entry,
    FleetKey,
    RegistryError,
    decode_entry,
    sign_entry,
    verify_key,
)
from shorelink.fleet.state import FleetState
from shorelink.fleet.travel import RetiredChunk, sign_retired

__all__ = ["CHECKED", "LOG", "Registry", "read_anchor", "read_log"]

LOG = "registry.log"
KEY = "fleet.key"
PUB = "fleet.pub"
#: the version and hash of the newest entry whose signature and chain a reader of this
#: directory checked: the next reader checks only the entries past it (``fleet status``
#: in well under a second for 700 ships); ``fleet verify`` checks every one
CHECKED = "registry.verified"
_NEXT_KEY = "fleet.key.next"
#: the chunk signatures of the records of entries signed by retired fleet keys
RETIRED = "fleet.retired"


@boundary
def read_log(
    path: Path, state: FleetState, offset: int = 0, checked: tuple[int, str] | None = None
) -> int:
    """Apply to ``state`` the entries of the log at ``path`` from byte ``offset`` on
    (the end of what ``state`` holds); return the offset of the log's end. Raises
    :class:`RegistryError` (naming the version) at the first line that is not an entry
    in its place (forged, replayed, out of order, after a gap, malformed, cut short),
    whatever the file holds; ``state`` then holds the entries before it.

    ``checked``: the version and hash of an entry whose signature and every one before
    it were checked before (``registry.verified``): the entries up to it are taken
    without their signature check, and the log must hold exactly that entry there (the
    hash chain then vouches for every one before it)."""
    upto, digest = checked or (0, "")
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            while line := f.readline(MAX_ENTRY_BYTES + 2):
                if not line.endswith(b"\n"):
                    if len(line) > MAX_ENTRY_BYTES:
                        raise RegistryError(f"longer than {MAX_ENTRY_BYTES} bytes")
                    raise RegistryError(
                        f"cut short (a write that did not finish): the log holds "
                        f"{state.version} whole entries before it; cut the torn line off",
                        version=state.version + 1,
                    )
                entry = decode_entry(line[:-1])
                state.apply(entry, signed=entry.version <= upto)
                if entry.version == upto and entry.digest != digest:
                    raise RegistryError(
                        f"is not the entry checked before ({CHECKED}): the log was changed "
                        "below what was verified; `shorelink fleet verify` names where",
                        version=upto,
                    )
                offset += len(line)
    except OSError as exc:
        raise RegistryError(f"cannot read {path}: {exc.strerror or exc}") from None
    if state.version < upto:
        raise RegistryError(f"{path} holds {state.version} entries; {upto} were checked before")
    return offset


class Registry:
    """A registry directory, its log read and checked from its first entry
    (:meth:`open`), and appended to (:meth:`append`)."""

    def __init__(self, directory: Path, anchor: str | None) -> None:
        self.directory = directory
        self.path = directory / LOG
        self.state = FleetState(anchor=anchor)
        self._offset = 0
        self._inode = 0

    @classmethod
    def init(cls, directory: Path) -> Registry:
        """A new registry in ``directory`` (made 0700 if missing): a fleet key and the
        log's first entry. Refused where a registry is already."""
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        if (directory / LOG).exists() or (directory / KEY).exists():
            raise RegistryError(f"{directory} holds a registry already")
        key = FleetKey.generate()
        key.save(directory / KEY)
        first = sign_entry(key, 1, None, "fleet_created", {"fleet_key": key.public})
        write_atomic(directory / LOG, first.raw + b"\n", mode=0o600)
        write_atomic(directory / PUB, key.public + "\n", mode=0o644)
        return cls.open(directory)

    @classmethod
    def open(cls, directory: Path, anchor: str | None = None, *, every: bool = False) -> Registry:
        """The registry in ``directory``, checked entry by entry against ``anchor``
        (the fleet's root public key; default: ``DIR/fleet.pub``): every signature when
        ``every`` or an ``anchor`` is given, else those past ``registry.verified``
        (which it then moves up)."""
        trusted = anchor is None and not every
        if anchor is None:
            anchor = read_anchor(directory / PUB)
        reg = cls(directory, anchor)
        if not reg.path.exists():
            raise RegistryError(f"{directory} holds no registry (shorelink fleet init)")
        checked = _read_checked(directory / CHECKED) if trusted else None
        reg._offset = read_log(reg.path, reg.state, 0, checked)
        reg._inode = reg.path.stat().st_ino
        if reg.state.version == 0:
            raise RegistryError(f"{reg.path} holds no entry")
        if checked is None or reg.state.version > checked[0]:
            reg._write_checked()
        return reg

    def _write_checked(self) -> None:
        with contextlib.suppress(OSError):  # a reader that may not write: checks all next time
            text = f"{self.state.version} {self.state.head}\n"
            write_atomic(self.directory / CHECKED, text, mode=0o600)

    def refresh(self) -> None:
        """Take the entries appended since the last read (by this or another process).
        A log replaced whole is read again from its start, and must not go back."""
        try:
            st = self.path.stat()
        except OSError as exc:
            raise RegistryError(f"cannot read {self.path}: {exc.strerror or exc}") from None
        if self._inode and (st.st_ino != self._inode or st.st_size < self._offset):
            had = self.state.version
            self.state, self._offset = FleetState(anchor=self.state.anchor), 0
            self._offset = read_log(self.path, self.state)
            if self.state.version < had:
                raise RegistryError(
                    f"{self.path} went back from version {had} to {self.state.version}"
                )
        else:
            self._offset = read_log(self.path, self.state, self._offset)
        self._inode = st.st_ino

    def append(
        self, changes: Sequence[tuple[str, Mapping[str, Any]]], key: FleetKey | None = None
    ) -> list[Entry]:
        """Sign ``changes`` (kind, body) as the next entries and append them in one
        write, each checked against the state first (refused: nothing written)."""
        with locked(self.path):
            self.refresh()
            key = key or self.fleet_key()
            entries = []
            try:
                for kind, body in changes:
                    e = sign_entry(key, self.state.version + 1, self.state.head, kind, body)
                    self.state.apply(e)
                    entries.append(e)
            except RegistryError:
                self._reread()  # the entries taken before the refused one were not written
                raise
            data = b"".join(e.raw + b"\n" for e in entries)
            flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(self.path, flags)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            self._offset += len(data)
        self._write_checked()
        return entries

    def entries(self) -> list[Entry]:
        """Every entry of the log up to what was read and checked (:meth:`open`,
        :meth:`refresh`), in order."""
        try:
            with open(self.path, "rb") as f:
                data = f.read(self._offset)
        except OSError as exc:
            raise RegistryError(f"cannot read {self.path}: {exc.strerror or exc}") from None
        return [decode_entry(line) for line in data.splitlines()]

    def _reread(self) -> None:
        self.state, self._offset, self._inode = FleetState(anchor=self.state.anchor), 0, 0
        self.refresh()

    def fleet_key(self) -> FleetKey:
        """The fleet key in force, from ``DIR/fleet.key`` (a rotation cut short after
        its entry is finished here)."""
        key = FleetKey.load(self.directory / KEY)
        if key.id == self.state.fleet_key_id:
            return key
        nxt = self.directory / _NEXT_KEY
        if nxt.exists():
            new = FleetKey.load(nxt)
            if new.id == self.state.fleet_key_id:
                self._retire(key)
                os.replace(nxt, self.directory / KEY)
                return new
        raise RegistryError(
            f"{self.directory / KEY} holds key {key.id}; the registry's key in force is "
            f"{self.state.fleet_key_id}"
        )

    def rotate_fleet_key(self) -> FleetKey:
        """A new fleet key, its rotation signed by the key in force."""
        with locked(self.directory / KEY):
            old = self.fleet_key()
            new = FleetKey.generate()
            new.save(self.directory / _NEXT_KEY)
            self.append([("fleet_key_rotated", {"fleet_key": new.public})], key=old)
            self._retire(old)
            os.replace(self.directory / _NEXT_KEY, self.directory / KEY)
        return new

    def _retire(self, old: FleetKey) -> None:
        """Before ``old`` is given up: the records of every entry it signed (its
        rotation the last), signed in chunks into ``fleet.retired``."""
        signed = [e for e in self.entries() if e.signer == old.id]
        kept = [c for c in self.retired() if c[2] != old.id]
        lines = [f"{f} {n} {kid} {sig.hex()}\n" for f, n, kid, sig in kept]
        lines += [f"{f} {n} {kid} {sig.hex()}\n" for f, n, kid, sig in sign_retired(signed, old)]
        write_atomic(self.directory / RETIRED, "".join(lines), mode=0o644)

    def retired(self) -> list[RetiredChunk]:
        """``fleet.retired``'s chunks (none: no fleet key was rotated)."""
        try:
            text = (self.directory / RETIRED).read_text()
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise RegistryError(f"cannot read {self.directory / RETIRED}: {exc}") from None
        out = []
        for n, line in enumerate(text.splitlines(), 1):
            try:
                first, count, kid, sig = line.split()
                out.append((int(first), int(count), kid, bytes.fromhex(sig)))
            except ValueError:
                raise RegistryError(f"{self.directory / RETIRED} line {n} is not a chunk") from None
        return out


def _read_checked(path: Path) -> tuple[int, str] | None:
    """``registry.verified``'s version and hash; None when missing or not one (every
    entry is checked then)."""
    try:
        version, digest = path.read_text()[:100].split()
        if not version.isdigit() or len(digest) != 64:
            return None
        return int(version), digest
    except (OSError, ValueError):
        return None


@boundary
def read_anchor(path: Path, field: str = "fleet_pub") -> str:
    """The fleet's root public key in ``path`` (``fleet.pub``: base64 of 32 bytes); a
    :class:`ConfigError` naming ``field`` (the key that names the file) if it holds none."""
    try:
        text = path.read_bytes()[:200].decode("ascii").strip()
        verify_key(text)
    except OSError as exc:
        raise ConfigError(field, f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError:
        raise ConfigError(field, f"{path} holds no Ed25519 public key") from None
    return text
