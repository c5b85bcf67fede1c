"""What the registry says a ship's key may sign (``shorelink fleet audit-key``): per
stream, the seqs from the key's ``from_seq`` up to the next key's ``from_seq``, lowered
by a revocation (:meth:`~shorelink.fleet.state.ShipRecord.valid_below`). Pure: what a
site holds under the key and what it refused is read at its Kafka
(shorelink/kafka/key_audit.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from shorelink.fleet.entry import RegistryError, SeqBound
from shorelink.fleet.state import FleetState, KeyRecord

__all__ = ["ANY_STREAM", "KeyValidity", "key_validity"]

#: the streams a key's bounds do not name
ANY_STREAM = "*"


@dataclass(frozen=True, slots=True)
class KeyValidity:
    """A ship's key and, per stream it names (and :data:`ANY_STREAM` for the others),
    the seqs it proves: ``[from, below)``, ``below`` None for no bound, and an empty
    range (``from >= below``) for none."""

    ship: str
    key: KeyRecord
    #: the key's place among the ship's keys (1 its first) and how many it has had
    index: int
    keys: int
    ranges: dict[str, tuple[int, int | None]]

    def range_of(self, stream: str) -> tuple[int, int | None]:
        return self.ranges.get(stream, self.ranges[ANY_STREAM])

    def proves(self, stream: str, seq: int) -> bool:
        lo, hi = self.range_of(stream)
        return lo <= seq and (hi is None or seq < hi)


def _named(bound: SeqBound | None) -> set[str]:
    return set(bound) if isinstance(bound, dict) else set()


def _at(bound: SeqBound, stream: str) -> int:
    if isinstance(bound, int):
        return bound
    return bound.get(stream, 1)


def key_validity(state: FleetState, ship: str, key_id: str) -> KeyValidity:
    """What ``ship``'s key ``key_id`` proves (:class:`RegistryError` naming the ship's
    keys if it has no such key)."""
    rec = state.ships.get(ship)
    if rec is None:
        raise RegistryError(f"no ship {ship}")
    at = next((i for i, k in enumerate(rec.keys) if k.id == key_id), None)
    if at is None:
        ids = ", ".join(k.id for k in rec.keys) or "none"
        raise RegistryError(f"ship {ship} has no key {key_id} (its keys: {ids})")
    key, below = rec.keys[at], rec.valid_below(at)
    ranges: dict[str, tuple[int, int | None]] = {}
    for stream in [*sorted(_named(key.from_seq) | _named(below)), ANY_STREAM]:
        # a stream a mapping does not name (ANY_STREAM among them): from 1, below 1
        hi = None if below is None else _at(below, stream)
        ranges[stream] = (_at(key.from_seq, stream), hi)
    return KeyValidity(ship, key, at + 1, len(rec.keys), ranges)
