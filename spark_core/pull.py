"""Pullers: a site takes other sites' records straight from its neighbours' relay
topics into its own merge, one hop in one Kafka transaction.

One puller per (neighbour, merge): the urgent merge's streams and the rest each have
their own, so an alert never waits behind a containers catch-up. A puller is a thread
of the site's application with one Kafka consumer at the neighbour (as the site's
neighbour principal, read_committed). Every round it reads the relay topics
``sl.relay.<entry>.<stream>`` of the entries whose route points at its neighbour
(spark_core/routing.py), at most ``replication.max_offsets_per_trigger`` records or
``merge.max_batch_bytes``, and hands them to the merge (``Merger.write_pulled``), which
drops what the site already holds and writes the rest, the ledger and the cursors in
one transaction (docs/replication.md, "Why nothing is lost or doubled").

The cursor is not a streaming checkpoint: it is the offset the merge committed, per
partition, in the marker, under the name ``<neighbour>/<topic id>/<topic>``
(``spark_core.merge_state.pulled_source``). So it moves only with what the site holds,
it is reloaded with the merge's state after any failure, and a topic deleted and
recreated (a new id) is a new source, read from its start: nothing of it is skipped,
and the merge drops what it already holds. A cursor below what retention kept reads
from the oldest record left, counted and logged (``event=pull_gap``), instead of
stalling.

Each round takes each partition's share, and no record newer than every other
partition of its topic has been read to (:meth:`Puller._align`): one ship's seqs are
spread over the partitions, and read out of time order they leave holes in the ledger,
which is bounded (review N3).

Gaps are never silent. The consumer runs with ``auto.offset.reset=error``: an offset
the partition no longer holds stops that partition with an error event, whenever it is
found, at the assignment or in the middle of a read (retention or ``delete_records``
passing the fetch position of a slow catch-up), and the puller steps over to the
oldest record left and treats the jump as a gap (:meth:`Puller._reset`). With
``earliest`` librdkafka moved such a partition to its start without a word, and the
gap was checked only at the first record after an assignment: the cursor committed
past the hole, ``gaps`` stayed 0 and no history was read (review N2). Every other jump
between two records (transaction markers take offsets too) is checked against the
partition's start as the last fetch saw it, at no cost.

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

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    IsolationLevel,
    KafkaError,
    Message,
    TopicPartition,
)
from confluent_kafka.admin import OffsetSpec

from shorelink.contract import canonical_topic, ingress_topic, relay_topic
from shorelink.kafka.admin import Admin
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.errors import (
    DataLoss,
    KafkaClientError,
    UnknownTopic,
    classify,
    kafka_errors,
)
from shorelink.kafka.reading import written_ms
from shorelink.logs import get_logger
from spark_core.access import pull_group
from spark_core.config import SiteConfig
from spark_core.feed_guard import FeedGuard
from spark_core.merge import Merger
from spark_core.merge_state import (
    Headers,
    MergeError,
    SourceRow,
    history_stream,
    pulled_source,
    source_entry,
)
from spark_core.relay_index import oldest_written_ms, read_segments, start_offsets

__all__ = ["Puller", "write_through"]

log = get_logger(__name__)

#: how long a round waits for the first record (an alert's latency on an idle link)
_WAIT_S = 0.2
#: how often a puller asks the neighbour for its relay topics' ids and partitions
_DESCRIBE_EVERY_S = 5.0


@dataclass
class Puller:
    """Pulls ``streams`` from ``neighbour``'s relay topics into ``merger``, for the
    entries ``routes()`` sends through that neighbour."""

    site: SiteConfig
    neighbour: str
    #: the neighbour's Kafka as this site reaches it (its neighbour principal there)
    kafka: KafkaEndpoint
    streams: tuple[str, ...]
    urgent: bool
    merger: Merger
    routes: Callable[[], Mapping[str, str | None]]
    #: read this site's own ingress topics instead (``neighbour`` is the site itself):
    #: a record's way from the gateway into the merge without waiting for a Spark
    #: micro-batch (the merge's Spark query still reads them; the cursors are the same
    #: marker offsets, so whichever reads a record first writes it)
    local: bool = False
    #: with ``local``: the topics read (default: the ingress topics of ``streams``)
    topics: tuple[str, ...] = ()
    #: streams whose history (canonical topic) a site that starts with nothing reads
    #: from this neighbour, once: the neighbour that keeps them longest
    history: tuple[str, ...] = ()
    #: every site of the file (the entries of the neighbour's relay topics)
    sites: tuple[str, ...] = ()
    #: records read from the neighbour, batches handed to the merge
    read: int = 0
    #: of ``read``: from the neighbour's canonical topics (history), and from this
    #: site's own relay topics there (taking back what entered here)
    read_history: int = 0
    read_back: int = 0
    batches: int = 0
    #: relay records lost to the neighbour's retention before they were read
    gaps: int = 0
    #: relay offsets a first read skipped, the neighbour's relay index proving their
    #: records held here (spark_core/relay_index.py)
    skipped_held: int = 0
    last_success: float | None = None
    #: the records the merge found unproved in this feed, and its parking
    #: (spark_core/feed_guard.py: too many unproved, the neighbour is not read a while)
    guard: FeedGuard = field(default_factory=FeedGuard)
    error: str | None = None
    #: since when (monotonic) every round has failed (None: the last round did not)
    failing_since: float | None = None
    #: per relay topic: records behind the neighbour's end (None: not known yet)
    lag: dict[str, int | None] = field(default_factory=dict)
    #: per relay topic: when it fell behind (None: caught up)
    behind_since: dict[str, float] = field(default_factory=dict)
    #: the last round read nothing and every assigned partition is at its end
    idle: bool = False
    _consumer: Consumer | None = field(default=None, repr=False)
    _admin: Admin | None = field(default=None, repr=False)
    #: relay topic -> its source name at the merge (with the topic id)
    _sources: dict[str, str] = field(default_factory=dict, repr=False)
    #: per assigned partition: the next offset to read (negative: its start)
    _assigned: dict[tuple[str, int], int] = field(default_factory=dict, repr=False)
    #: per partition assigned at a cursor: the cursor, until the first record is read
    _expected: dict[tuple[str, int], int] = field(default_factory=dict, repr=False)
    #: per partition stepped over a gap (:meth:`_reset`): where it went on, until a
    #: record or end there is read (records carried from before come first)
    _stepped: dict[tuple[str, int], int] = field(default_factory=dict, repr=False)
    #: the gaps counted: (topic, partition, cursor, oldest)
    _counted: set[tuple[str, int, int, int]] = field(default_factory=set, repr=False)
    #: a history read's horizon moved (a gap met meanwhile): start again from the cursors
    _renew: bool = field(default=False, repr=False)
    #: per partition: the timestamp of the last record it delivered (:meth:`_align`)
    _last_ts: dict[tuple[str, int], int] = field(default_factory=dict, repr=False)
    #: per partition: when (monotonic) it last delivered a record or its end
    _heard: dict[tuple[str, int], float] = field(default_factory=dict, repr=False)
    _described_at: float = field(default=0.0, repr=False)
    _wanted: frozenset[str] = field(default=frozenset(), repr=False)
    #: records read past their partition's share of the last batch, in order
    _carry: list[Message] = field(default_factory=list, repr=False)
    _waiting: set[tuple[str, int]] = field(default_factory=set, repr=False)
    #: taking back what entered here (None: not decided yet, before the merge loaded)
    _recovering: bool | None = field(default=None, repr=False)
    #: per relay topic: the id it had when last described ("" once it was gone)
    _ids: dict[str, str] = field(default_factory=dict, repr=False)
    #: per partition: the offset the consumer last found its end at
    _at_end: dict[tuple[str, int], int] = field(default_factory=dict, repr=False)
    #: per partition of this site's own relay topics: its end when recovery began
    _recover_to: dict[tuple[str, int], int] | None = field(default=None, repr=False)
    #: streams whose history is being read: per partition of the canonical topic, its
    #: end when the reading began (None: not described yet)
    _history: dict[str, dict[tuple[str, int], int] | None] = field(default_factory=dict, repr=False)

    @classmethod
    def ingest(cls, merger: Merger, topics: tuple[str, ...] = ()) -> Puller:
        """A puller of ``merger``'s own ingress topics (``topics``: these instead)."""
        site = merger.site
        return cls(
            site,
            site.name,
            site.kafka,
            merger.streams,
            urgent=all(s in site.urgent_streams for s in merger.streams),
            merger=merger,
            routes=dict,
            local=True,
            topics=topics,
        )

    @property
    def name(self) -> str:
        lane = "urgent" if self.urgent else "bulk"
        return f"ingest-{lane}" if self.local else f"pull-{self.neighbour}-{lane}"

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

    # -- the loop -------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Pull until ``stop`` (or the merge stops); a failure closes the consumer and
        is retried with backoff from what the merge committed."""
        backoff = 0.5
        while not stop.is_set() and not self.merger.stopping.is_set():
            try:
                with kafka_errors(f"pull from {self.neighbour}"):
                    read = self.round()
                if not read:
                    stop.wait(_WAIT_S if self._assigned else self.site.replication.probe_interval_s)
                if self.local:  # the merge's own loop: its relay index, when due
                    self.merger.write_index()
                backoff = 0.5
                self.error = self.failing_since = None
            except MergeError as exc:
                if self.merger.stopping.is_set():
                    break
                self._failed(exc, backoff)
                if exc.fatal:
                    break
            except KafkaClientError as exc:
                self._failed(exc, backoff)
            except Exception as exc:  # never let one neighbour's puller die silently
                log.exception("pull_failed", site=self.site.name, puller=self.name)
                self._failed(exc, backoff)
            if self.error is not None:
                stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)
        self.close()

    def _failed(self, exc: BaseException, backoff: float) -> None:
        self.error = str(exc)[:2000]
        if self.failing_since is None:
            self.failing_since = time.monotonic()
        self.idle = False
        self.close()  # the next round starts from what the merge committed
        log.warning(
            "pull_failed",
            site=self.site.name,
            puller=self.name,
            retry_in_s=round(backoff, 1),
            error=self.error,
        )

    def round(self) -> int:
        """One batch: read what the relay topics have past the cursors, hand it to the
        merge. Returns the records read."""
        self._decide()
        if self.guard.parked():  # too many unproved records of late: not read a while
            self.idle = False
            return 0
        if self.local:
            wanted = frozenset(self.topics or (ingress_topic(s) for s in self.streams))
        else:
            wanted = frozenset(relay_topic(e, s) for e in self.entries() for s in self.streams)
            wanted |= {canonical_topic(s) for s in self._history}
        now = time.monotonic()
        if wanted != self._wanted or now >= self._described_at + _DESCRIBE_EVERY_S:
            self._assign(wanted)
            self._described_at = now
        if not self._assigned:
            self.idle = True
            return 0
        consumer = self._consumer
        assert consumer is not None
        limit = self.site.replication.max_offsets_per_trigger
        budget = self.site.merge.max_batch_bytes
        # each partition its share of the batch, and no record newer than what every
        # other partition of its topic has been read to (_align): one origin's seqs are
        # spread over the partitions by key, so a batch that took one partition far
        # ahead of the others would leave holes in the ledger (bounded:
        # MAX_HOLDINGS_RANGES); what waits, waits in order for the next round
        share = max(1, limit // len(self._assigned))
        taken: Counter[tuple[str, int]] = Counter()
        rows: list[SourceRow] = []
        picked: list[Message] = []  # the message of each row
        size = 0
        carried, self._carry = self._carry, []
        paused: list[TopicPartition] = []

        history_ends = {
            tp: end for ends in self._history.values() if ends for tp, end in ends.items()
        }

        full = False  # the batch has its bytes: the rest waits for the next round
        heard_at = time.monotonic()

        def take(m: Message) -> None:
            nonlocal size, full
            tp = (str(m.topic()), m.partition() or 0)
            self._heard[tp] = heard_at
            end = history_ends.get(tp)
            if end is not None and (m.offset() or 0) >= end:
                # history is read up to where it ended: the rest of the neighbour's
                # canonical topic comes through its relays (pause: no more is fetched)
                self._assigned[tp] = max(self._assigned.get(tp, 0), end)
                consumer.pause([TopicPartition(*tp)])
                return
            key, value = m.key(), m.value()
            ts = written_ms(m)
            if ts is not None:
                self._last_ts[tp] = ts
            headers: Headers = list(m.headers() or [])  # type: ignore[arg-type]
            nbytes = len(key or b"") + len(value or b"")
            nbytes += sum(len(k) + len(v or b"") for k, v in headers)
            full = full or (bool(rows) and size + nbytes > budget)  # one record always goes
            if full or taken[tp] >= share or tp in self._waiting:  # order: after its carry
                self._carry.append(m)
                if tp not in self._waiting:
                    self._waiting.add(tp)
                    paused.append(TopicPartition(*tp))
                    consumer.pause([paused[-1]])
                return
            taken[tp] += 1
            offset = m.offset() or 0
            source = self._sources[tp[0]]
            rows.append(SourceRow(source, tp[1], offset, key, value, headers, ts))
            picked.append(m)
            size += nbytes
            self._note_read(tp[0], tp[1], offset)

        self._waiting = set()
        for m in carried:
            take(m)
        wait = _WAIT_S
        # no bound on the carry here: a partition is paused once past its share, so it
        # waits with at most its share and one fetch; one that _align holds back (a
        # cold partition ahead in time) must not stop the others being read
        while len(rows) < limit and not full:
            msgs = consumer.consume(min(limit - len(rows), 5000), timeout=wait)
            if not msgs:
                break
            wait = 0.0  # what is there now, no more waiting
            for m in msgs:
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:  # past the last record
                        end = (str(m.topic()), m.partition() or 0)
                        self._at_end[end] = m.offset() or 0
                        self._heard[end] = heard_at
                        # a cursor below a relay that retention emptied reads nothing
                        self._check_gap(*end, m.offset() or 0)
                        continue
                    if err.code() == KafkaError._AUTO_OFFSET_RESET:  # an offset gone
                        self._reset(str(m.topic()), m.partition() or 0, m.offset())
                        continue
                    raise classify(err, f"pull from {self.neighbour}")
                take(m)
        if paused:
            consumer.resume(paused)
        rows = self._align(rows, picked, history_ends)
        if rows:
            unproved = self.merger.write_pulled(rows).unproved
            if self.guard.note(unproved):
                log.warning(
                    "pull_parked",
                    site=self.site.name,
                    puller=self.name,
                    unproved=self.guard.unproved,
                    park_s=round(self.guard.park_s),
                )
            self.read += len(rows)
            for row in rows:  # the kinds of read beside a relay's: history, recovery
                if history_stream(row.topic) is not None:
                    self.read_history += 1
                elif row.topic.endswith(self._own_suffixes):
                    self.read_back += 1
            self.batches += 1
            self.last_success = time.time()
        self._measure_lag(len(rows))
        if self._recovering and self.reached(self._recover_to or {}):
            self._recover_done()
        for stream, ends in list(self._history.items()):
            if ends is not None and self.reached(ends):
                self._history_done(stream)
        if self._renew:  # a history read to a horizon moved since: from the cursors
            self._renew = False
            self.close()
        return len(rows)

    def _align(
        self,
        rows: list[SourceRow],
        picked: list[Message],
        history_ends: Mapping[tuple[str, int], int],
    ) -> list[SourceRow]:
        """The rows no newer than every other partition of their topic has been read
        to; the rest go back to the carry, in order, and are read again next round.

        A partition has been read to the time of the first record it has waiting (what
        it brought past its share), else of the last record it delivered; one at its end
        (or a history partition past its end) holds nothing back. One that has
        delivered nothing yet holds its whole topic until it does (its first fetch), or
        until it has been silent for the Kafka timeout (a partition whose leader is
        gone holds nothing up for good).
        An equal count per partition was not enough (review N3): after an outage, a
        cold partition (a ship's few containers there, among other ships' busy ones)
        ran days ahead of the busy ones, its seqs came in isolated, the ship's ledger
        entry reached the bound on holes and the merge dead-lettered records the
        gateway had acknowledged. Timestamps are compared only within one topic,
        whose partitions one writer fills (the gateway, or the neighbour's merge)."""
        if not rows:
            return rows
        waiting: dict[tuple[str, int], int] = {}
        for m in self._carry:
            tp = (str(m.topic()), m.partition() or 0)
            if tp not in waiting and (ts := written_ms(m)) is not None:
                waiting[tp] = ts
        cut: dict[str, float] = {}
        now, silent_s = time.monotonic(), self.kafka.timeout_s
        for tp, nxt in self._assigned.items():
            bound: float
            if tp in waiting:
                bound = waiting[tp]
            elif (
                self._at_end.get(tp, -1) >= nxt
                or (tp in history_ends and nxt >= history_ends[tp])
                or now - self._heard.get(tp, now) > silent_s  # (its leader gone: not waited for)
            ):
                bound = float("inf")
            else:
                last = self._last_ts.get(tp)
                bound = float("-inf") if last is None else last
            cut[tp[0]] = min(cut.get(tp[0], float("inf")), bound)
        kept: list[SourceRow] = []
        back: list[Message] = []
        moved: set[tuple[str, int]] = set()
        topics = {src: t for t, src in self._sources.items()}
        for row, m in zip(rows, picked, strict=True):
            limit = cut.get(topics.get(row.topic, ""), float("inf"))
            if row.written_ms is None or row.written_ms <= limit:
                kept.append(row)
                continue
            tp = (str(m.topic()), m.partition() or 0)
            if tp not in moved:
                moved.add(tp)
                self._assigned[tp] = row.offset  # read again from there
            back.append(m)
        if back:
            self._carry = back + self._carry
        return kept

    def _decide(self) -> None:
        """Once, with the merge's state loaded: does this run take back what entered
        here (its merge started with nothing in Kafka) and read history?"""
        if self._recovering is None:
            self.merger.ready()
            self._recovering = bool(self.merger.fresh) and not self.local
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

    def _partitions(self, topics: Iterable[str]) -> dict[tuple[str, int], str]:
        """The partitions of those of ``topics`` that exist at the neighbour."""
        described = self._admin_client().describe(topics, f" at {self.neighbour}")
        return {(t, p.id): t for t, desc in described.items() for p in desc.partitions}

    def reached(self, ends: Mapping[tuple[str, int], int]) -> bool:
        """Has every partition of ``ends`` been read (or found at its end) up to there?"""
        return all(
            max(self._assigned.get(tp, -1), self._at_end.get(tp, -1)) >= end
            for tp, end in ends.items()
        )

    def _read_history(self, streams: Iterable[str], why: str) -> None:
        """Read the history of ``streams`` from this neighbour (once at a time). A gap
        found while a history read of the stream is under way lies past the horizon
        that read ends at (taken before the gap): the read is taken again from the
        cursors, to the horizon as it is now, after this round (a fresh site's first
        history, read over a slow link, ended short of a gap its relays met meanwhile)."""
        for stream in streams:
            if why == "gap" and self._history.get(stream) is not None:
                self._history[stream] = None
                self._renew = True
                log.info(
                    "pull_history",
                    site=self.site.name,
                    neighbour=self.neighbour,
                    stream=stream,
                    reason="gap_during_history",
                )
            elif stream in self.streams and stream not in self._history:
                self._history[stream] = None
                log.info(
                    "pull_history",
                    site=self.site.name,
                    neighbour=self.neighbour,
                    stream=stream,
                    reason=why,
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

    def _history_ends(self, stream: str, parts: list[int]) -> dict[tuple[str, int], int]:
        """Per partition of the neighbour's canonical topic of ``stream`` holding
        history: the offset of its first record newer than the neighbour's relay topics
        of the stream reach back to (its end when they have nothing). Newer, not "not
        older": a merge writes many records in one millisecond, and a record deleted
        from a relay can share the horizon's millisecond with the first one kept (its
        canonical copy is never later than its relay copy); those are read as history
        too, and what the site holds of them is dropped."""
        topic = canonical_topic(stream)
        marks = self._marks((topic, p) for p in parts)
        horizon = self._relay_horizon(stream)
        if horizon is None or not marks:
            return {tp: hi for tp, (_, hi) in marks.items()}
        assert self._admin is not None
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

    def _ends(self, parts: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """Where each partition of ``parts`` that holds records ends now."""
        return {tp: hi for tp, (_, hi) in self._marks(parts).items()}

    def _marks(self, parts: Iterable[tuple[str, int]]) -> dict[tuple[str, int], tuple[int, int]]:
        """Where each partition of ``parts`` that holds committed records starts and
        ends now: its last stable offset, so a transaction still open there (records
        the neighbour is writing now, in its relay topics too) is not counted."""
        tps = [TopicPartition(t, p) for t, p in parts]
        if not tps:
            return {}
        admin = self._admin_client()
        first = admin.client.list_offsets({tp: OffsetSpec.earliest() for tp in tps})
        stable = admin.client.list_offsets(
            {tp: OffsetSpec.latest() for tp in tps}, isolation_level=IsolationLevel.READ_COMMITTED
        )
        marks = {}
        for tp in tps:
            what = f"offsets of {tp.topic} at {self.neighbour}"
            lo = admin.wait(first[tp], what).offset
            hi = admin.wait(stable[tp], what).offset
            if hi > lo:
                marks[(tp.topic, tp.partition)] = (lo, hi)
        return marks

    def _admin_client(self) -> Admin:
        if self._admin is None:
            self._admin = Admin(self.kafka.with_timeout(self.site.replication.probe_timeout_s))
        return self._admin

    def _recovery_targets(self, parts: Mapping[tuple[str, int], str]) -> dict[tuple[str, int], int]:
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
    def _assign(self, wanted: frozenset[str]) -> None:
        """Assign the wanted relay topics that exist at the neighbour, each partition at
        the merge's cursor for the topic's current id (its start when there is none)."""
        self._wanted = wanted
        if not wanted:
            if self._consumer is not None:
                self._consumer.unassign()
            self._assigned, self._sources = {}, {}
            return
        described = self._admin_client().describe(wanted, f" at {self.neighbour}")
        sources: dict[str, str] = {}
        parts: dict[tuple[str, int], str] = {}
        renewed = False
        for topic in sorted(wanted):
            desc = described.get(topic)
            if desc is None:  # the neighbour's merge creates it with its first record
                if topic in self._ids:
                    self._ids[topic] = ""  # gone: whatever comes back is a new topic
                continue
            topic_id = str(desc.topic_id)
            renewed |= self._ids.get(topic, topic_id) != topic_id
            self._ids[topic] = topic_id
            sources[topic] = topic if self.local else pulled_source(self.neighbour, topic_id, topic)
            for p in desc.partitions:
                parts[(topic, p.id)] = sources[topic]
        if renewed and self._consumer is not None:
            # a topic deleted and created again (or a neighbour's whole Kafka rebuilt):
            # the consumer's cached metadata (leader epochs) belongs to the old one and
            # it would wait for ever; a new consumer starts from what the merge holds
            log.warning("pull_topic_recreated", site=self.site.name, neighbour=self.neighbour)
            self.close()
            self._wanted = wanted
        for stream, ends in list(self._history.items()):
            topic = canonical_topic(stream)
            if ends is None and topic in sources:
                self._history[stream] = self._history_ends(
                    stream, [p for t, p in parts if t == topic]
                )
                if not self._history[stream]:  # nothing there: nothing to read
                    self._history_done(stream)
                    parts = {tp: src for tp, src in parts.items() if tp[0] != topic}
                    del sources[topic]
                    self._wanted = frozenset(self._wanted - {topic})
        # only the partitions of a canonical topic that hold history are read
        history = {tp for ends in self._history.values() if ends for tp in ends}
        parts = {
            tp: src for tp, src in parts.items() if history_stream(src) is None or tp in history
        }
        sources = {t: src for t, src in sources.items() if t in {tp[0] for tp in parts}}
        if self._recovering and self._recover_to is None:
            self._recover_to = self._recovery_targets(parts)
            if not self._recover_to:  # the neighbour holds nothing that entered here
                self._recover_done()
                own = self._own_topics
                parts = {tp: src for tp, src in parts.items() if tp[0] not in own}
                sources = {t: src for t, src in sources.items() if t not in own}
                self._wanted = frozenset(wanted - own)
        if sources == self._sources and set(parts) == set(self._assigned):
            return  # nothing changed: keep the consumer where it is
        cursors = self.merger.ready().offsets
        first = self._first_reads(
            {
                tp: src
                for tp, src in parts.items()
                if (src, tp[1]) not in cursors and source_entry(src) is not None
            }
        )
        assignment = []
        for (topic, part), source in sorted(parts.items()):
            start = cursors.get((source, part), first.get((topic, part)))
            assignment.append(
                TopicPartition(topic, part, OFFSET_BEGINNING if start is None else start)
            )
        consumer = self._consumer or self._new_consumer()
        consumer.assign(assignment)
        # a partition paused once (a history read at its end) stays paused through an
        # unassign and a new assign: a second history read from this neighbour then
        # read nothing, for ever
        consumer.resume(assignment)
        self._carry, self._at_end, self._last_ts = [], {}, {}  # again from the cursors
        self._sources = sources
        self._assigned = {(tp.topic, tp.partition): tp.offset for tp in assignment}
        self._heard = dict.fromkeys(self._assigned, time.monotonic())
        # a site that starts with nothing reads relays from their start: one that
        # retention already cut is a gap too (what it lost comes from history)
        fresh = bool(self._recovering)
        self._expected = {k: max(v, 0) for k, v in self._assigned.items() if v >= 0 or fresh}
        self._stepped = {}
        log.info(
            "pull_assigned",
            site=self.site.name,
            puller=self.name,
            topics=len(sources),
            partitions=len(assignment),
        )

    def _first_reads(self, parts: Mapping[tuple[str, int], str]) -> dict[tuple[str, int], int]:
        """Where relay partitions read for the first time (no cursor) start: past what
        the neighbour's relay index proves this site holds (spark_core/relay_index.py).
        A partition it proves nothing of, or any when the index cannot be read, is not
        named: read from its start. Not while taking back what entered here (the site
        lost what it held)."""
        if not parts or self.local or self._recovering:
            return {}
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
                )
            )
        except UnknownTopic:
            return {}  # a neighbour that keeps no index
        except KafkaClientError as exc:
            log.warning(
                "relay_index_unread", site=self.site.name, neighbour=self.neighbour, error=str(exc)
            )
            return {}
        state = self.merger.ready()
        starts: dict[tuple[str, int], int] = {}
        for topic in topics:
            _, _, entry, stream = topic.split(".")  # sl.relay.<entry>.<stream>
            at = start_offsets(
                segments,
                topic,
                self._ids.get(topic, ""),
                {p: lo for (t, p), lo in lows.items() if t == topic},
                state.skips(entry, stream, relays=bool(self.merger.entries)),
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

    def _new_consumer(self) -> Consumer:
        self._consumer = Consumer(
            self.kafka.client_config(
                {
                    "group.id": pull_group(self.site.name),  # never joined or committed
                    "enable.auto.commit": False,
                    "enable.auto.offset.store": False,
                    "isolation.level": "read_committed",
                    # an offset the partition no longer holds stops it with an error
                    # event (_reset: a gap), never a silent move to its start
                    "auto.offset.reset": "error",
                    # where a partition ends (past transaction markers): recovery's end
                    "enable.partition.eof": True,
                    # fetch.wait.max.ms stays Kafka's 500 ms: a fetch parked at the
                    # end of a relay returns as soon as a record commits there, so a
                    # shorter wait brings nothing sooner; it only has the neighbour
                    # answer empty fetches 10-20 times a second per puller
                    # no probe timeout here: a fetch of a few MiB over a slow link takes
                    # seconds, and cut short it would be asked again for ever (the link
                    # probes of spark_core/routing.py tell a neighbour gone)
                    "client.id": f"shorelink-{self.site.name}-{self.name}",
                }
            )
        )
        return self._consumer

    def _note_read(self, topic: str, part: int, offset: int) -> None:
        """Count what retention deleted between the cursor and the first record read."""
        self._check_gap(topic, part, offset)
        self._assigned[(topic, part)] = offset + 1

    def _check_gap(self, topic: str, part: int, offset: int) -> None:
        """A record read, or the end found, at ``offset`` past the next offset expected
        (the cursor, after an assignment; the last record's next): did retention delete
        what lay between? Offsets are not dense (transaction markers take some), so a
        jump is only a suspect: the first after an assignment asks where the partition
        starts, every later one compares with the start the last fetch saw (no
        request). A position that retention passes between two fetches is an error
        event instead (:meth:`_reset`)."""
        tp = (topic, part)
        first = self._expected.pop(tp, None)
        expected = first if first is not None else self._assigned.get(tp, -1)
        stepped = self._stepped.get(tp)
        if stepped is not None and offset >= stepped:  # that gap is counted already
            del self._stepped[tp]
            expected = max(expected, stepped)
        if expected < 0 or offset <= expected:
            return
        lo = self._low(topic, part) if first is not None else self._cached_low(topic, part)
        if lo is not None and lo > expected:
            self._gap(topic, part, expected, lo)

    def _reset(self, topic: str, part: int, offset: int | None) -> None:
        """The partition stopped at an offset it no longer holds (librdkafka's reset
        error: ``auto.offset.reset=error``): go on from its oldest record (from its end,
        when it was truncated below the position), and what was skipped is a gap.
        A stopped partition takes no seek: it is assigned anew. Raises the tree's error
        when its offsets cannot be asked (the round fails; the next starts from the
        cursors, and meets the same reset)."""
        tp = (topic, part)
        consumed_to = offset if offset is not None and offset >= 0 else self._assigned.get(tp, 0)
        consumed_to = max(consumed_to, 0)
        if consumed_to < self._assigned.get(tp, -1):
            return  # an event from before the last step over (a fetch in flight then)
        consumer = self._consumer
        assert consumer is not None
        with kafka_errors(f"offsets of {topic}[{part}] at {self.neighbour}"):
            lo, hi = consumer.get_watermark_offsets(
                TopicPartition(topic, part), timeout=self.site.replication.probe_timeout_s
            )
            reset_to = lo if consumed_to < lo else hi if consumed_to > hi else consumed_to
            consumer.incremental_unassign([TopicPartition(topic, part)])
            consumer.incremental_assign([TopicPartition(topic, part, reset_to)])
            consumer.resume([TopicPartition(topic, part)])
        self._expected.pop(tp, None)
        self._assigned[tp] = reset_to
        self._stepped[tp] = reset_to
        self._heard[tp] = time.monotonic()
        self._at_end.pop(tp, None)
        if reset_to > consumed_to:
            self._gap(topic, part, consumed_to, reset_to)
        elif reset_to < consumed_to:
            # the partition now ends below what was read (a log lost under the same
            # topic id, review N18): nothing to count, read on from its end
            log.warning(
                "pull_truncated",
                site=self.site.name,
                neighbour=self.neighbour,
                error=str(DataLoss(topic, part, consumed_to, reset_to)),
            )

    def _gap(self, topic: str, part: int, cursor: int, oldest: int) -> None:
        """Retention deleted records of ``topic`` past the cursor: counted, logged, and
        for a relay topic its stream's history is read from this neighbour. A gap found
        again (the cursor did not move before a new assignment) is counted once."""
        if (topic, part, cursor, oldest) in self._counted:
            return
        self._counted.add((topic, part, cursor, oldest))
        relay = topic.split(".")
        if len(relay) == 4 and relay[:2] == ["sl", "relay"] and not self.local:
            self._read_history([relay[3]], "gap")
        self.gaps += oldest - cursor
        log.warning(
            "pull_gap",
            site=self.site.name,
            neighbour=self.neighbour,
            topic=topic,
            partition=part,
            cursor=cursor,
            oldest=oldest,
        )

    def _low(self, topic: str, part: int) -> int | None:
        """Where the partition starts now (asked; None: no answer)."""
        assert self._consumer is not None
        try:
            with kafka_errors():
                lo, _ = self._consumer.get_watermark_offsets(
                    TopicPartition(topic, part), timeout=self.site.replication.probe_timeout_s
                )
        except KafkaClientError:
            return None
        return lo

    def _cached_low(self, topic: str, part: int) -> int | None:
        """Where the partition started as its last fetch saw it (no request; None: not
        known)."""
        assert self._consumer is not None
        try:
            with kafka_errors():
                lo, _ = self._consumer.get_watermark_offsets(
                    TopicPartition(topic, part), cached=True
                )
        except KafkaClientError:
            return None
        return lo if lo >= 0 else None

    def _measure_lag(self, read: int) -> None:
        """Per relay topic, records between what was read and the neighbour's end (the
        end the last fetch saw: no request)."""
        consumer = self._consumer
        if consumer is None:
            return
        per_topic: dict[str, int | None] = {}
        for (topic, part), read_to in self._assigned.items():
            # past the last record there may be a transaction marker: the end found counts
            pos = max(read_to, self._at_end.get((topic, part), -1))
            try:
                with kafka_errors():
                    _, hi = consumer.get_watermark_offsets(TopicPartition(topic, part), cached=True)
            except KafkaClientError:
                hi = -1
            if hi < 0 or (pos < 0 and hi > 0):
                per_topic.setdefault(topic, None)  # not fetched yet
                continue
            known = per_topic.get(topic) or 0
            per_topic[topic] = known + max(0, hi - max(pos, 0))
        now = time.time()
        for topic, n in per_topic.items():
            if n:
                self.behind_since.setdefault(topic, now)
            elif n == 0:
                self.behind_since.pop(topic, None)
        self.lag = per_topic
        self.idle = not read and all(not n for n in per_topic.values())

    def close(self) -> None:
        c, self._consumer = self._consumer, None
        self._assigned, self._expected, self._sources = {}, {}, {}
        self._stepped = {}
        self._wanted, self._carry, self._at_end, self._last_ts = frozenset(), [], {}, {}
        # history being read is read again from the cursors, to a new end
        self._history = dict.fromkeys(self._history)
        self._described_at = 0.0
        if c is not None:
            with contextlib.suppress(KafkaClientError, RuntimeError), kafka_errors():
                c.close()


def write_through(merger: Merger, ends: Mapping[tuple[str, int], int]) -> None:
    """Write the source partitions of a merge's Spark batch up to ``ends`` (next offsets)
    through a puller of the site's own Kafka: slices of at most ``merge.max_batch_bytes``,
    each one transaction with its cursors (``Merger.write_pulled``). How the merge takes a
    batch too big for the driver (``Merger.process_batch``). A slice that fails fails the
    batch (Spark replays it; the slices committed stay, and are skipped as written)."""
    site = merger.site
    puller = Puller.ingest(merger, tuple(sorted({topic for topic, _ in ends})))
    stalled_after = site.kafka.timeout_s * 2
    progress = time.monotonic()
    try:
        while not puller.reached(ends):
            if merger.stopping.is_set():
                raise MergeError("merge is stopping; batch left for the next run")
            if puller.round():
                progress = time.monotonic()
            elif time.monotonic() - progress > stalled_after:
                raise MergeError(f"no record of the batch read for {stalled_after:.0f}s")
    finally:
        puller.close()
