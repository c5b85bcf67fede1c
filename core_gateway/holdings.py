"""What this site holds of each ship's streams.

Two sources, kept apart because they mean different things:
- ``written``: what this site's gateway itself wrote to ``sl.ingress.*`` (restored at
  start-up from the cursor topic, which is committed in the same Kafka transaction as
  the records; see ingress.py), plus ``abandoned`` seqs the ship declared it no longer
  has (dropped on board by policy; they can never arrive);
- ``replicated``: what the site's canonical topics hold per ``sl.ledger`` (replication
  from other sites; written by the site's Spark merge).

A ship is told ``written | replicated``; a batch is accepted if it starts at most one
past the contiguous end of ``written | replicated | abandoned``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from shorelink import strict_json
from shorelink.boundary import boundary
from shorelink.ranges import RangeSet

__all__ = ["Holdings", "SourceHoldings"]


@dataclass
class SourceHoldings:
    written: RangeSet = field(default_factory=RangeSet)
    abandoned: RangeSet = field(default_factory=RangeSet)
    replicated: RangeSet = field(default_factory=RangeSet)

    def held(self) -> RangeSet:
        out = self.written.copy()
        out.update(self.replicated)
        return out

    def settled(self) -> RangeSet:
        out = self.held()
        out.update(self.abandoned)
        return out

    def cursor_value(self) -> bytes:
        return json.dumps({"written": str(self.written), "abandoned": str(self.abandoned)}).encode()


class Holdings:
    def __init__(self) -> None:
        self._by_source: dict[tuple[str, str], SourceHoldings] = {}

    def get(self, origin: str, stream: str) -> SourceHoldings:
        return self._by_source.setdefault((origin, stream), SourceHoldings())

    @boundary
    def restore_cursor(self, origin: str, stream: str, value: bytes) -> None:
        """Restore one cursor record of ``sl.gateway.cursors``; ``ValueError`` if it
        is not one (nothing restored: the start fails naming it rather than guess)."""
        data = strict_json.loads(value)  # nesting too deep: a ValueError too
        if not isinstance(data, dict):
            raise ValueError(f"gateway cursor {origin}/{stream} is not a JSON object")
        written, abandoned = data.get("written", ""), data.get("abandoned", "")
        if not isinstance(written, str) or not isinstance(abandoned, str):
            raise ValueError(f"gateway cursor {origin}/{stream}: ranges are not text")
        written_set, abandoned_set = RangeSet.parse(written), RangeSet.parse(abandoned)
        h = self.get(origin, stream)
        h.written, h.abandoned = written_set, abandoned_set

    def set_replicated(self, origin: str, stream: str, held: RangeSet) -> None:
        self.get(origin, stream).replicated = held

    def for_ship(self, origin: str, streams: tuple[str, ...]) -> dict[str, RangeSet]:
        out = {s: RangeSet() for s in streams}
        for (o, s), h in self._by_source.items():
            if o == origin:
                out[s] = h.held()
        return out
