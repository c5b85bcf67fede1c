"""The audit: read a site's canonical topics and count identities.

For every ``(origin, stream)`` it reports how many distinct identities the site holds,
how many records repeat an identity (duplicates), and which seqs between 1 and the
highest one are missing (gaps). Exactly once at a site means 0 duplicates and 0 gaps
(gaps can be legitimate only for seqs a ship dropped on board by policy).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from confluent_kafka.admin import AdminClient

from shorelink.contract import Record
from shorelink.errors import ContractError
from shorelink.kafka_io import read_to_end
from shorelink.ranges import RangeSet

__all__ = ["SourceAudit", "audit_site", "canonical_topics"]

#: canonical topics are ``sl.<stream>``: one dot, a valid stream name
_CANONICAL = re.compile(r"^sl\.([a-z0-9][a-z0-9_-]{0,62})$")
_NOT_STREAMS = {"ledger"}


@dataclass
class SourceAudit:
    origin: str
    stream: str
    seqs: Counter[int] = field(default_factory=Counter)

    @property
    def identities(self) -> int:
        return len(self.seqs)

    @property
    def duplicates(self) -> int:
        return sum(n - 1 for n in self.seqs.values())

    @property
    def held(self) -> RangeSet:
        return RangeSet.from_seqs(self.seqs)

    @property
    def gaps(self) -> RangeSet:
        return self.held.missing(1, max(self.seqs)) if self.seqs else RangeSet()

    def to_json(self) -> dict[str, object]:
        return {
            "origin": self.origin,
            "stream": self.stream,
            "identities": self.identities,
            "duplicates": self.duplicates,
            "gaps": self.gaps.count(),
            "gap_ranges": str(self.gaps),
            "held": str(self.held),
        }


def canonical_topics(bootstrap: str, streams: Iterable[str] | None = None) -> list[str]:
    names = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics
    out = []
    for t in sorted(names):
        m = _CANONICAL.match(t)
        if m and m.group(1) not in _NOT_STREAMS and (streams is None or m.group(1) in streams):
            out.append(t)
    return out


def audit_site(
    bootstrap: str, streams: Iterable[str] | None = None, timeout: float = 300
) -> tuple[list[SourceAudit], int]:
    """Audit every canonical topic at ``bootstrap``; returns the per-source results
    and the number of records that break the record contract."""
    topics = canonical_topics(bootstrap, list(streams) if streams is not None else None)
    by_source: dict[tuple[str, str], SourceAudit] = {}
    malformed = 0
    if topics:
        for msg in read_to_end(bootstrap, topics, timeout=timeout):
            try:
                rec = Record.from_kafka(msg.key(), msg.value(), msg.headers())
            except ContractError:
                malformed += 1
                continue
            i = rec.identity
            src = by_source.setdefault((i.origin, i.stream), SourceAudit(i.origin, i.stream))
            src.seqs[i.seq] += 1
    return sorted(by_source.values(), key=lambda s: (s.origin, s.stream)), malformed
