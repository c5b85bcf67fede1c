"""Pullers: a site takes other sites' records straight from its neighbours' relay
topics into its own merge, one hop in one Kafka transaction.

One puller per (neighbour, merge): the urgent merge's streams and the rest each have
their own, so an alert never waits behind a containers catch-up. A puller is a feed
(spark_core/feed.py: the read loop, the reader, the cursors, gaps and lag) of the relay
topics ``sl.relay.<entry>.<stream>`` of the entries whose route points at its neighbour
(spark_core/routing.py), read as the site's neighbour principal there; this module is
what is a neighbour's: routes, taking back what entered here, history, and where a
first read starts (the neighbour's relay index). Its decisions are
:mod:`spark_core.pull_plan`'s.

The cursor is not a streaming checkpoint: it is the offset the merge committed, per
partition, in the marker, under the name ``<neighbour>/<topic id>/<topic>``
(``spark_core.merge_state.pulled_source``). So it moves only with what the site holds,
it is reloaded with the merge's state after any failure, and a topic deleted and
recreated (a new id) is a new source, read from its start: nothing of it is skipped,
and the merge drops what it already holds. A cursor below what retention kept, found
at the assignment or in the middle of a read, reads from the oldest record left,
counted and logged (``event=pull_gap``), instead of stalling, and the stream's history
is read.

History: what no relay topic has any more (a site that lost everything, or a gap) is
read once from a neighbour's canonical topic ``sl.<stream>``, which keeps a stream
longer (at headquarters: for ever): the records older than what the neighbour's relay
topics of the stream reach back to (``_history_ends``: the rest is in those relays),
as they stood when the reading began (for a site that starts with nothing: when it
started, before its merge wrote a record, ``Puller.begin``). The merge drops what
the site holds and relays what it lacked under the entry each record names
(``Merger._entry``): the sites behind this one lack it too. A site whose merge starts
with nothing in Kafka reads each stream's history from the neighbour that keeps it
longest (``Puller.history``, chosen by the replicator), and treats a relay it reads
from its start that retention already cut as a gap; a puller that meets a gap in a
relay topic reads that stream's history from the same neighbour, from its cursor there
(``event=pull_history``, ``pull_history_done``). In a system whose relays have lost
nothing, history is empty and costs a few offset requests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from confluent_kafka import IsolationLevel, TopicPartition
from confluent_kafka.admin import OffsetSpec

from shorelink.contract import (
    CANONICAL_INDEX_TOPIC,
    RELAY_INDEX_TOPIC,
    canonical_topic,
    relay_topic,
)
from shorelink.kafka.errors import KafkaClientError, UnknownTopic
from shorelink.logs import get_logger
from spark_core.access import pull_group
from spark_core.feed import Feed
from spark_core.merge_state import SourceRow, history_stream, pulled_source
from spark_core.pull_plan import Part, keep_parts
from spark_core.relay_index import oldest_written_ms, read_segments, start_offsets

__all__ = ["Puller"]

log = get_logger(__name__)


@dataclass
class Puller(Feed):
    """Pulls ``streams`` from ``neighbour``'s relay topics into ``merger``, for the
    entries ``routes()`` sends through that neighbour."""

    routes: Callable[[], Mapping[str, str | None]] = dict
    #: streams whose history (canonical topic) a site that starts with nothing reads
    #: from this neighbour, once: the neighbour that keeps them longest
    history: tuple[str, ...] = ()
    #: every site of the file (the entries of the neighbour's relay topics)
    sites: tuple[str, ...] = ()
    #: taking back what entered here (None: not decided yet, before the merge loaded)
    _recovering: bool | None = field(default=None, repr=False)
    #: per partition of this site's own relay topics: its end when recovery began
    _recover_to: dict[Part, int] | None = field(default=None, repr=False)
    #: streams whose history is being read: per partition of the canonical topic, its
    #: end when the reading began (None: not described yet)
    _history: dict[str, dict[Part, int] | None] = field(default_factory=dict, repr=False)
    #: a history read's horizon moved (a gap met meanwhile): start again from the cursors
    _renew: bool = field(default=False, repr=False)

    @property
    def name(self) -> str:
        return f"pull-{self.neighbour}-{'urgent' if self.urgent else 'bulk'}"

    @property
    def _own_topics(self) -> set[str]:
        """This site's own relay topics at the neighbour (what recovery takes back)."""
        return {relay_topic(self.site.name, s) for s in self.streams}

    @property
    def _own_suffixes(self) -> tuple[str, ...]:
        return tuple(f"/{t}" for t in self._own_topics)

    @property
    def reading_history(self) -> list[str]:
        """The streams whose history this puller reads now."""
        return sorted(self._history)

    def entries(self) -> list[str]:
        """The entry sites routed through this neighbour now; this site itself too while
        it recovers what entered here (its merge started with nothing in Kafka)."""
        routed = {
            e for e, n in self.routes().items() if n == self.neighbour and e != self.site.name
        }
        if self._recovering:
            routed.add(self.site.name)
        return sorted(routed)

    # -- the feed's questions -------------------------------------------------------------
    def wanted(self) -> frozenset[str]:
        topics = {relay_topic(e, s) for e in self.entries() for s in self.streams}
        return frozenset(topics | {canonical_topic(s) for s in self._history})

    def source(self, topic: str, topic_id: str) -> str:
        return pulled_source(self.neighbour, topic_id, topic)

    def prepare_round(self) -> None:
        self._decide()

    @property
    def from_zero(self) -> bool:
        # a site that starts with nothing reads relays from their start: one that
        # retention already cut is a gap too (what it lost comes from history)
        return bool(self._recovering)

    def on_gap(self, topic: str, part: int) -> None:
        """A relay topic's gap: its stream's history is read from this neighbour."""
        relay = topic.split(".")
        if len(relay) == 4 and relay[:2] == ["sl", "relay"]:
            self._read_history([relay[3]], "gap")

    def after_round(self, rows: list[SourceRow]) -> None:
        for row in rows:  # the kinds of read beside a relay's: history, recovery
            if history_stream(row.topic) is not None:
                self.read_history += 1
            elif row.topic.endswith(self._own_suffixes):
                self.read_back += 1
        if self._recovering and self.reached(self._recover_to or {}):
            self._recover_done()
        for stream, ends in list(self._history.items()):
            if ends is not None and self.reached(ends):
                self._history_done(stream)
        if self._renew:  # a history read to a horizon moved since: from the cursors
            self._renew = False
            self.close()

    def narrow(
        self, parts: dict[Part, str], sources: dict[str, str]
    ) -> tuple[dict[Part, str], dict[str, str]]:
        """History (canonical topics: only the partitions that hold it, up to where it
        ends) and recovery (this site's own relays: up to where they ended when it
        began, none when they hold nothing)."""
        dropped: set[str] = set()
        for stream, ends in list(self._history.items()):
            topic = canonical_topic(stream)
            if ends is None and topic in sources:
                self._history[stream] = self._history_ends(
                    stream, [p for t, p in parts if t == topic]
                )
                if not self._history[stream]:  # nothing there: nothing to read
                    self._history_done(stream)
                    dropped.add(topic)
        if self._recovering and self._recover_to is None:
            self._recover_to = self._recovery_targets(parts)
            if not self._recover_to:  # the neighbour holds nothing that entered here
                self._recover_done()
                dropped |= self._own_topics
        self._wanted = frozenset(self._wanted - dropped)
        self._stop_at = {
            tp: end for ends in self._history.values() if ends for tp, end in ends.items()
        }
        return keep_parts(parts, sources, set(self._stop_at), dropped)

    # -- recovery and history ---------------------------------------------------------------
    def _decide(self) -> None:
        """Once, with the merge's state loaded: does this run take back what entered
        here (its merge started with nothing in Kafka) and read history?"""
        if self._recovering is None:
            self.merger.ready()
            self._recovering = bool(self.merger.fresh)
            if self._recovering:
                self._read_history(self.history, "fresh")

    def begin(self) -> None:
        """Before any puller of the site runs (so before its merge writes a record), if
        the site starts with nothing: where this site's own relay topics at the
        neighbour end (recovery reads up to there) and which history it holds. What the
        neighbour writes later, it pulled from this run's merge (or from sites that
        did): a site that starts with records waiting in its ingress, or beside other
        sites starting, would otherwise read its own new records back from every
        neighbour, and its neighbours' new records twice. A neighbour that does not
        answer now is asked at its first round (what it wrote of this run by then is
        read once more and dropped as held)."""
        self._decide()
        history = [s for s, ends in self._history.items() if ends is None]
        recover = bool(self._recovering) and self._recover_to is None
        if not (history or recover):
            return
        try:
            topics = [canonical_topic(s) for s in history]
            parts = self._partitions([*topics, *(self._own_topics if recover else ())])
            for stream, topic in zip(history, topics, strict=True):
                ends = self._history_ends(stream, [p for t, p in parts if t == topic])
                self._history[stream] = ends
                if not ends:  # the neighbour holds no history (yet): nothing to read
                    self._history_done(stream)
            if recover:
                self._recover_to = self._recovery_targets(parts)
        except KafkaClientError as exc:
            log.info(
                "pull_begin_deferred", site=self.site.name, neighbour=self.neighbour, error=str(exc)
            )
            return
        if recover and not self._recover_to:  # the neighbour holds nothing that entered here
            self._recover_done()

    def _partitions(self, topics: Iterable[str]) -> dict[Part, str]:
        """The partitions of those of ``topics`` that exist at the neighbour."""
        described = self.admin().describe(topics, f" at {self.neighbour}")
        return {(t, p.id): t for t, desc in described.items() for p in desc.partitions}

    def _read_history(self, streams: Iterable[str], why: str) -> None:
        """Read the history of ``streams`` from this neighbour (once at a time). A gap
        found while a history read of the stream is under way lies past the horizon
        that read ends at (taken before the gap): the read is taken again from the
        cursors, to the horizon as it is now, after this round (a fresh site's first
        history, read over a slow link, ended short of a gap its relays met meanwhile)."""
        for stream in streams:
            if why == "gap" and self._history.get(stream) is not None:
                self._renew, reason = True, "gap_during_history"
            elif stream in self.streams and stream not in self._history:
                reason = why
            else:
                continue
            self._history[stream] = None
            log.info(
                "pull_history",
                site=self.site.name,
                neighbour=self.neighbour,
                stream=stream,
                reason=reason,
            )

    def _history_done(self, stream: str) -> None:
        ends = self._history.pop(stream, None) or {}
        log.info(
            "pull_history_done",
            site=self.site.name,
            neighbour=self.neighbour,
            stream=stream,
            partitions=len(ends),
        )

    def _history_ends(self, stream: str, parts: list[int]) -> dict[Part, int]:
        """Per partition of the neighbour's canonical topic of ``stream`` holding
        history: the offset of its first record newer than the neighbour's relay topics
        of the stream reach back to (its end when they have nothing)."""
        topic = canonical_topic(stream)
        marks = self._marks((topic, p) for p in parts)
        horizon = self._relay_horizon(stream)
        if horizon is None or not marks:
            return {tp: hi for tp, (_, hi) in marks.items()}
        assert self._admin is not None
        # newer than the horizon's millisecond, not "not older": a merge writes many
        # records in one millisecond, and a record deleted from a relay can share it
        # with the first one kept (its canonical copy is never later than its relay
        # copy); those are read as history too, and what the site holds is dropped
        spec = OffsetSpec.for_timestamp(horizon + 1)
        found = self._admin.client.list_offsets(
            {TopicPartition(*tp): spec for tp in marks},
            isolation_level=IsolationLevel.READ_COMMITTED,
        )
        out = {}
        for tp, future in found.items():
            first = self._admin.wait(future, f"offsets of {tp.topic} at {self.neighbour}").offset
            lo, hi = marks[(tp.topic, tp.partition)]
            end = hi if first < 0 else first
            if end > lo:
                out[(tp.topic, tp.partition)] = end
        return out

    def _relay_horizon(self, stream: str) -> int | None:
        """How far back (epoch ms) the neighbour's relay topics of ``stream`` hold
        every record it merged: the first record of a relay that retention cut (a cut
        relay that is empty: nothing is held, None), else the oldest relay record
        (before it the neighbour wrote no relays); None when no relay holds a record."""
        assert self._admin is not None
        relays = [relay_topic(e, stream) for e in self.sites]
        tps = [
            TopicPartition(t, p.id)
            for t, desc in self._admin.describe(relays, f" at {self.neighbour}").items()
            for p in desc.partitions
        ]
        if not tps:
            return None
        client, committed = self._admin.client, IsolationLevel.READ_COMMITTED
        # the first record at or after timestamp 1: to timestamp 0 Kafka answers a
        # read_committed ListOffsets with no offset at all (4.1, measured), and the
        # horizon was never found (docs/replication.md, "A site that lost everything")
        first = client.list_offsets(
            {tp: OffsetSpec.for_timestamp(1) for tp in tps}, isolation_level=committed
        )
        start = client.list_offsets({tp: OffsetSpec.earliest() for tp in tps})
        cut: list[int] = []
        begun: list[int] = []
        for tp in tps:
            got = self._admin.wait(first[tp], f"offsets of {tp.topic} at {self.neighbour}")
            lo = self._admin.wait(start[tp], f"offsets of {tp.topic} at {self.neighbour}").offset
            if lo > 0 and got.offset < 0:
                return None  # cut to nothing: every record of the canonical topic counts
            if lo > 0:
                cut.append(got.timestamp)
            elif got.offset >= 0:
                begun.append(got.timestamp)
        if not cut and not begun:
            return None
        return max([*cut, min(begun, default=0)])

    def _ends(self, parts: Iterable[Part]) -> dict[Part, int]:
        """Where each partition of ``parts`` that holds records ends now."""
        return {tp: hi for tp, (_, hi) in self._marks(parts).items()}

    def _marks(self, parts: Iterable[Part]) -> dict[Part, tuple[int, int]]:
        """Where each partition of ``parts`` that holds committed records starts and
        ends now: its last stable offset, so a transaction still open there (records
        the neighbour is writing now, in its relay topics too) is not counted."""
        return self.admin().spans(parts, f" at {self.neighbour}")

    def _recovery_targets(self, parts: Mapping[Part, str]) -> dict[Part, int]:
        """Where this site's own relay topics at the neighbour end now, per partition
        holding records: what the recovery reads up to (what comes later, the
        neighbour pulled from here after the restart: nothing to take back)."""
        own = self._own_topics
        return self._ends(tp for tp in parts if tp[0] in own)

    def _recover_done(self) -> None:
        self._recovering = False
        log.info(
            "pull_recovered",
            site=self.site.name,
            neighbour=self.neighbour,
            puller=self.name,
            partitions=len(self._recover_to or {}),
        )

    # -- assignment -------------------------------------------------------------------------
    # -- first reads ------------------------------------------------------------------
    def first_reads(self, parts: Mapping[Part, str]) -> dict[Part, int]:
        """Where partitions read for the first time (no cursor) start: a relay's past
        what the neighbour's relay index proves this site holds, history (a canonical
        topic) past what its canonical index does (spark_core/relay_index.py). A
        partition it proves nothing of, or any when the index cannot be read, is not
        named: read from its start. Not while taking back what entered here (the site
        lost what it held)."""
        if not parts or self._recovering:
            return {}
        relays = {tp: src for tp, src in parts.items() if history_stream(src) is None}
        history = {tp: src for tp, src in parts.items() if history_stream(src) is not None}
        starts = self._walk(relays, RELAY_INDEX_TOPIC) if relays else {}
        if history:
            # review N10: a route parked longer than the relay retention met a gap and
            # read the neighbour's whole canonical topic, though the site lacked only
            # what the relay lost; it starts past the segments whose seqs it holds
            starts.update(self._walk(history, CANONICAL_INDEX_TOPIC))
        return starts

    def _walk(self, parts: Mapping[Part, str], index: str) -> dict[Part, int]:
        """Per partition of ``parts`` (of topics ``index`` indexes), the end of the
        chain of segments from its oldest offset whose seqs this site holds (and, for a
        relay, has relayed under that entry when it relays: ``MergeState.skips``)."""
        lows = {tp: lo for tp, (lo, _) in self._marks(parts).items()}
        if not lows:
            return {}
        topics = sorted({t for t, _ in lows})
        try:
            segments = list(
                read_segments(
                    self.kafka,
                    topics,
                    timeout=self.kafka.timeout_s,
                    limit_bytes=self.site.merge.max_batch_bytes,
                    # not the segments of what retention deleted (review N8)
                    since_ms=oldest_written_ms(self.kafka, lows),
                    index=index,
                    # the group the neighbour's ACLs let this site's pullers name
                    group=pull_group(self.site.name),
                )
            )
        except UnknownTopic:
            return {}  # a neighbour that keeps no index
        except KafkaClientError as exc:
            log.warning(
                "relay_index_unread",
                site=self.site.name,
                neighbour=self.neighbour,
                index=index,
                error=str(exc),
            )
            return {}
        state = self.merger.ready()
        starts: dict[Part, int] = {}
        for topic in topics:
            names = topic.split(".")
            if len(names) == 2:  # sl.<stream>: history, held is enough
                stream = names[1]
                holds = state.skips("", stream, relays=False)
            else:  # sl.relay.<entry>.<stream>
                holds = state.skips(names[2], names[3], relays=bool(self.merger.entries))
            at = start_offsets(
                segments,
                topic,
                self._ids.get(topic, ""),
                {p: lo for (t, p), lo in lows.items() if t == topic},
                holds,
            )
            for part, offset in at.items():
                skipped = offset - lows[(topic, part)]
                if skipped > 0:
                    starts[(topic, part)] = offset
                    self.skipped_held += skipped
                    log.info(
                        "pull_first_read",
                        site=self.site.name,
                        neighbour=self.neighbour,
                        topic=topic,
                        partition=part,
                        oldest=lows[(topic, part)],
                        start=offset,
                    )
        return starts

    def close(self) -> None:
        super().close()
        # history being read is read again from the cursors, to a new end
        self._history = dict.fromkeys(self._history)
        self._stop_at = {}
