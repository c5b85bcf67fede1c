"""Recognising a message the ship's broker sends the agent a second time.

The broker resends what it has no PUBACK for: after the agent died between commit and
PUBACK (on the next connection, with the DUP flag and the same packet id), and after
the broker itself died and restored its persistence file, which Mosquitto writes only
from time to time: everything the agent had committed since that save comes again,
with DUP if it had been sent before the save, *without* DUP if it was still queued.

Packet ids are only 16 bits and are reused, and sensors do publish identical payloads
(a door that stays open), so "same packet id, same digest" alone is not a redelivery.
The log keeps, per packet id, the digest of the last message committed under it, the
MQTT connection it arrived on and its place in commit order (table ``inflight``). A
message with packet id X and digest D on connection C is a redelivery when all of:

1. the last message committed under X had digest D and arrived on *another*
   connection (on the same connection the broker reuses X only after our PUBACK for
   it arrived, and never resends: a repeat there is a new message);
2. C resumed a session the broker kept (``session_present``): a broker that starts a
   new session has nothing to resend;
3. X is *behind* the last packet id committed, by fewer than :data:`RECENT` ids, and
   the entry is one of the last :data:`RECENT` committed. The broker numbers its
   messages to the agent in order; a new message's id lies *ahead* of the last one
   committed (by at most the receive window), while a redelivery's id was committed
   recently. This is what keeps a new message from being taken for a redelivery after
   the ids wrapped, even with an identical payload;
4. it carries DUP, or, without DUP, no message on C was new yet: a restored broker
   sends what it restored first, so the first message on C that is not recognised
   ends recognition without DUP for the rest of C.

What remains: after a broker restart from an older file, a *new* message that
reuses a packet id the agent committed since that file was written, and has the same
topic and payload as the message committed under it, while only redeliveries and such
repeats have come on the connection so far, is taken for a redelivery.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["RECENT", "Pending", "Redelivery"]

#: how far back (packet ids, and committed messages) a redelivery can reach. Must exceed
#: the messages committed between two saves of the broker's persistence file and stay
#: well below 65535 minus the receive window.
RECENT = 16384
_IDS = 65535  # packet ids 1..65535


class Arrival(Protocol):
    @property
    def mid(self) -> int: ...
    @property
    def dup(self) -> bool: ...
    @property
    def digest(self) -> bytes: ...
    @property
    def conn(self) -> int: ...
    @property
    def resumed(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class _Seen:
    digest: bytes
    conn: int
    n: int


@dataclass
class Redelivery:
    """The committed state (loaded from table ``inflight`` on first use)."""

    seen: dict[int, _Seen]
    next_n: int
    last_mid: int
    #: connections on which a message that is not a redelivery has arrived
    closed: set[int] = field(default_factory=set)

    @classmethod
    def load(cls, conn: sqlite3.Connection) -> Redelivery:
        seen = {
            mid: _Seen(digest, c, n)
            for mid, digest, c, n in conn.execute("SELECT mid, digest, conn, n FROM inflight")
        }
        last = max(seen.items(), key=lambda kv: kv[1].n, default=(0, _Seen(b"", 0, 0)))
        return cls(seen, last[1].n + 1, last[0])

    def begin(self) -> Pending:
        return Pending(self)


@dataclass
class Pending:
    """One commit's view: changes are kept aside until the transaction committed."""

    base: Redelivery
    changes: dict[int, _Seen] = field(default_factory=dict)
    closed: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.next_n = self.base.next_n
        self.last_mid = self.base.last_mid

    def _get(self, mid: int) -> _Seen | None:
        return self.changes.get(mid) or self.base.seen.get(mid)

    def is_redelivery(self, m: Arrival) -> bool:
        if not m.mid:
            return False
        seen = self._get(m.mid)
        recent = (
            seen is not None
            and seen.digest == m.digest
            and (self.last_mid - m.mid) % _IDS < RECENT
            and self.next_n - seen.n <= RECENT
        )
        if not m.conn:  # a caller without connections: the DUP rule alone
            return recent and m.dup
        if not recent or not m.resumed or seen is None or seen.conn == m.conn:
            if not m.dup:
                self.closed.add(m.conn)  # a new message: the restored ones came first
            return False
        if m.dup:
            return True
        # without DUP: only among the first messages of the connection
        return m.conn not in self.base.closed and m.conn not in self.closed

    def record(self, m: Arrival) -> None:
        """``m`` was committed (stored or refused by policy: either way acknowledged)."""
        if not m.mid:
            return
        self.changes[m.mid] = _Seen(m.digest, m.conn, self.next_n)
        self.next_n += 1
        self.last_mid = m.mid

    def write(self, conn: sqlite3.Connection) -> None:
        if self.changes:
            conn.executemany(
                "INSERT OR REPLACE INTO inflight (mid, digest, conn, n) VALUES (?, ?, ?, ?)",
                [(mid, s.digest, s.conn, s.n) for mid, s in self.changes.items()],
            )

    def apply(self) -> None:
        """The transaction committed: make the changes the state."""
        b = self.base
        b.seen.update(self.changes)
        b.next_n = self.next_n
        b.last_mid = self.last_mid
        b.closed |= self.closed
