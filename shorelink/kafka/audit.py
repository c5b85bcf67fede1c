"""The audit: read canonical topics and count identities, at one site or across sites.

For every ``(origin, stream)`` it reports how many distinct identities the site holds,
how many records repeat an identity (duplicates), and which seqs between 1 and the
highest one are missing (gaps). Exactly once at a site means 0 duplicates and 0 gaps
(gaps can be legitimate only for seqs a ship dropped on board by policy).

Across sites (:func:`audit_sites`, ``shorelink audit --all-sites``) it also compares:
per stream, the union of what the sites carrying it hold, and what each site lacks of
that union. Sites that have converged hold the same identities, each once.

Memory: identities are held as a :class:`~shorelink.ranges.RangeSet` per ``(origin,
stream)`` and site (a few numbers each while seqs are gapless), never one entry per
record; duplicated seqs are ranges too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from shorelink.contract import Record, canonical_topic
from shorelink.errors import ContractError, ShorelinkError
from shorelink.identity import NAME_RE, NOT_STREAMS
from shorelink.kafka.admin import Admin
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.errors import KafkaClientError
from shorelink.kafka.reading import read_to_end
from shorelink.ranges import RangeSet

__all__ = [
    "AuditError",
    "SiteStreamAudit",
    "SitesAudit",
    "SourceAudit",
    "audit_site",
    "audit_sites",
    "canonical_topics",
]

#: canonical topics are ``sl.<stream>``: one dot, a valid stream name
_CANONICAL = re.compile(rf"sl\.({NAME_RE.pattern})")


class AuditError(ShorelinkError):
    """A site's Kafka could not be read for the audit."""

    retryable = True


@dataclass
class SourceAudit:
    """One ``(origin, stream)`` at one site: seqs held, and records that repeat one."""

    origin: str
    stream: str
    held: RangeSet = field(default_factory=RangeSet)
    #: records that repeat an identity already read
    duplicates: int = 0
    #: the seqs that appear more than once
    duplicated: RangeSet = field(default_factory=RangeSet)

    def add(self, seq: int) -> None:
        if seq in self.held:
            self.duplicates += 1
            self.duplicated.add(seq)
        else:
            self.held.add(seq)

    @property
    def identities(self) -> int:
        return self.held.count()

    @property
    def records(self) -> int:
        return self.identities + self.duplicates

    @property
    def gaps(self) -> RangeSet:
        last = self.held.last
        return self.held.missing(1, last) if last is not None else RangeSet()

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


def canonical_topics(kafka: KafkaEndpoint, streams: Iterable[str] | None = None) -> list[str]:
    names = Admin(kafka).metadata(timeout=10, what=f"Kafka at {kafka.bootstrap}").topics
    out = []
    for t in sorted(names):
        m = _CANONICAL.fullmatch(t)
        if m and m.group(1) not in NOT_STREAMS and (streams is None or m.group(1) in streams):
            out.append(t)
    return out


def audit_site(
    kafka: KafkaEndpoint, streams: Iterable[str] | None = None, timeout: float = 300
) -> tuple[list[SourceAudit], int]:
    """Audit every canonical topic at ``kafka``; returns the per-source results and
    the number of records that break the record contract. Raises
    :class:`~shorelink.kafka.errors.KafkaClientError` when that Kafka cannot be read."""
    topics = canonical_topics(kafka, list(streams) if streams is not None else None)
    by_source: dict[tuple[str, str], SourceAudit] = {}
    malformed = 0
    if topics:
        for msg in read_to_end(kafka, topics, timeout=timeout):
            try:
                rec = Record.from_kafka(msg.key(), msg.value(), msg.headers())
            except ContractError:
                malformed += 1
                continue
            i = rec.identity
            src = by_source.get((i.origin, i.stream))
            if src is None:
                src = by_source[(i.origin, i.stream)] = SourceAudit(i.origin, i.stream)
            src.add(i.seq)
    return sorted(by_source.values(), key=lambda s: (s.origin, s.stream)), malformed


@dataclass
class SiteStreamAudit:
    """One stream's canonical topic at one site, and what it lacks of the union of the
    sites that carry the stream (filled in by :func:`audit_sites`)."""

    site: str
    stream: str
    #: origin -> its seqs here
    sources: dict[str, SourceAudit] = field(default_factory=dict)
    malformed: int = 0
    #: the topic exists at the site (a missing one holds nothing)
    present: bool = True
    #: origin -> seqs that another site carrying the stream holds and this one lacks
    missing: dict[str, RangeSet] = field(default_factory=dict)

    def add(self, origin: str, seq: int) -> None:
        src = self.sources.get(origin)
        if src is None:
            src = self.sources[origin] = SourceAudit(origin, self.stream)
        src.add(seq)

    @property
    def records(self) -> int:
        return sum(s.records for s in self.sources.values()) + self.malformed

    @property
    def identities(self) -> int:
        return sum(s.identities for s in self.sources.values())

    @property
    def duplicates(self) -> int:
        return sum(s.duplicates for s in self.sources.values())

    @property
    def missing_count(self) -> int:
        return sum(r.count() for r in self.missing.values())

    @property
    def ok(self) -> bool:
        return not (self.duplicates or self.missing_count or self.malformed)

    def to_json(self) -> dict[str, object]:
        return {
            "site": self.site,
            "stream": self.stream,
            "topic_exists": self.present,
            "records": self.records,
            "identities": self.identities,
            "duplicates": self.duplicates,
            "malformed": self.malformed,
            "missing": self.missing_count,
            "duplicated_ranges": {
                o: str(s.duplicated) for o, s in sorted(self.sources.items()) if s.duplicates
            },
            "missing_ranges": {o: str(r) for o, r in sorted(self.missing.items()) if r},
        }


@dataclass
class SitesAudit:
    """Every site's canonical topics compared, stream by stream."""

    results: list[SiteStreamAudit]

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    def problems(self) -> list[str]:
        """One line per problem, naming the site, the source and the seqs."""
        out: list[str] = []
        for r in self.results:
            for o, s in sorted(r.sources.items()):
                if s.duplicates:
                    out.append(
                        f"duplicates at {r.site}: {o}/{r.stream} seqs {s.duplicated} "
                        f"({s.duplicates} extra records)"
                    )
            for o, missing in sorted(r.missing.items()):
                if missing:
                    out.append(f"missing at {r.site}: {o}/{r.stream} seqs {missing}")
            if r.malformed:
                out.append(f"malformed at {r.site}: {r.malformed} records in sl.{r.stream}")
        return out

    def to_json(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "results": [r.to_json() for r in self.results],
            "problems": self.problems(),
        }


def audit_sites(
    sites: Mapping[str, tuple[KafkaEndpoint, Iterable[str]]],
    streams: Iterable[str] | None = None,
    *,
    timeout: float = 300,
    connect_timeout: float = 10,
) -> SitesAudit:
    """Audit ``sites`` (name -> (its Kafka, the streams it carries)) and compare them:
    per stream, each site carrying it against the union of all of them. Only the
    streams in ``streams`` when given. Raises :class:`AuditError` naming a site whose
    Kafka cannot be read."""
    only = set(streams) if streams is not None else None
    results: list[SiteStreamAudit] = []
    for site, (kafka, carried) in sites.items():
        wanted = [s for s in dict.fromkeys(carried) if only is None or s in only]
        if wanted:
            results += _read_site(site, kafka, wanted, timeout, connect_timeout)
    by_stream: dict[str, list[SiteStreamAudit]] = {}
    for r in results:
        by_stream.setdefault(r.stream, []).append(r)
    for group in by_stream.values():
        union: dict[str, RangeSet] = {}
        for r in group:
            for o, src in r.sources.items():
                union.setdefault(o, RangeSet()).update(src.held)
        for r in group:
            for o, all_seqs in union.items():
                mine = r.sources.get(o)
                held = mine.held if mine is not None else RangeSet()
                lacking = RangeSet()
                for lo, hi in all_seqs:
                    lacking.update(held.missing(lo, hi))
                if lacking:
                    r.missing[o] = lacking
    results.sort(key=lambda r: (r.stream, r.site))
    return SitesAudit(results)


def _read_site(
    site: str, kafka: KafkaEndpoint, streams: list[str], timeout: float, connect_timeout: float
) -> list[SiteStreamAudit]:
    bootstrap = kafka.bootstrap
    try:
        names = Admin(kafka).metadata(timeout=connect_timeout)
    except KafkaClientError as exc:
        raise AuditError(
            f"site {site}: Kafka at {bootstrap} did not answer within {connect_timeout:g}s: {exc}",
            retryable=exc.retryable,
        ) from exc
    by_topic = {canonical_topic(s): SiteStreamAudit(site, s) for s in streams}
    present = [t for t in by_topic if t in names.topics]
    for t, r in by_topic.items():
        r.present = t in names.topics
    try:
        for msg in read_to_end(kafka, present, timeout=timeout) if present else ():
            r = by_topic[msg.topic() or ""]
            try:
                rec = Record.from_kafka(msg.key(), msg.value(), msg.headers())
            except ContractError:
                r.malformed += 1
                continue
            r.add(rec.identity.origin, rec.identity.seq)
    except KafkaClientError as exc:
        raise AuditError(f"site {site}: {exc}", retryable=exc.retryable) from exc
    return list(by_topic.values())
