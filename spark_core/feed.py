"""A feed: topics read into a merge, a batch at a time, from the merge's own cursors.

Two kinds share this loop: a neighbour's puller (spark_core/pull.py: its relay topics,
its canonical topics for history) and a merge's ingest puller
(spark_core/ingest_pull.py: the site's own ingress topics, a record's way from the
gateway into the merge without waiting for a Spark micro-batch). A feed has one
consumer, the Kafka room's :class:`~shorelink.kafka.reading.PartitionReader`; an
ingest puller runs in a thread of its own (:meth:`Feed.run`), a merge's pullers of
every neighbour in one thread (spark_core/feed_loop.py: a round read by
:meth:`Feed.read_round`, written with the others', counted by :meth:`Feed.finish_round`). Every round it reads what its topics
hold past the cursors, at most ``replication.max_offsets_per_trigger`` records or
``merge.max_batch_bytes``, and hands them to the merge (``Merger.write_pulled``), which
drops what the site already holds and writes the rest, the ledger and the cursors in one
transaction (docs/replication.md, "Why nothing is lost or doubled").

The cursor is not a streaming checkpoint: it is the offset the merge committed, per
partition, in the marker (:mod:`spark_core.pull_plan` names the source). So it moves
only with what the site holds and is reloaded with the merge's state after any failure.

Gaps are never silent: the reader runs with ``auto.offset.reset=error``, so an offset a
partition no longer holds (retention, ``delete_records``) is reported wherever it is met,
at the assignment or in the middle of a read (a slow catch-up that retention overtakes),
as a :class:`~shorelink.kafka.errors.DataLoss`; the feed counts it (``gaps``), logs it
(``event=pull_gap``) and lets its kind react (a neighbour's puller reads the stream's
history). Before, the consumer moved such a partition to its start without a word
(``auto.offset.reset=earliest``) and the gap was looked for only at the first record
after an assignment: the cursor committed past the hole (replication review N2).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from confluent_kafka import Message

from shorelink.contract import KAFKA_MAX_MESSAGE_BYTES
from shorelink.kafka.admin import Admin
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.errors import DataLoss, KafkaClientError
from shorelink.kafka.reading import PartitionReader, written_ms
from shorelink.logs import get_logger
from shorelink.retry import Backoff
from spark_core.access import pull_group
from spark_core.config import SiteConfig
from spark_core.feed_guard import FeedGuard
from spark_core.merge import Merger
from spark_core.merge_state import BatchPlan, Headers, MergeError, SourceRow
from spark_core.neighbour_admin import SharedAdmin
from spark_core.pull_plan import Part, plan_parts, plan_starts

__all__ = [
    "FEED_BATCHES",
    "PREFETCH_MIN_BYTES",
    "ByteBudget",
    "Feed",
    "Turn",
    "feed_prefetch",
]

log = get_logger(__name__)

#: how long a round waits for its first record before it ends with none (its poll
#: returns as that record arrives: the wait costs a record nothing)
WAIT_S = 0.2
#: waits after a feed's turns failed in a row (it starts again from what the merge
#: committed)
FEED_BACKOFF = Backoff(first_s=0.5, cap_s=10.0)
#: how often a feed asks for its topics' ids and partitions
DESCRIBE_EVERY_S = 5.0


#: the batches' worth of records (``merge.max_batch_bytes``) a site's bulk feeds hold at
#: once, together, and librdkafka's prefetch of all its feeds together
FEED_BATCHES = 2
#: a feed's prefetch, at least (a record of the size limit, and then some)
PREFETCH_MIN_BYTES = 2 * 1024 * 1024


def feed_prefetch(max_batch_bytes: int, feeds: int) -> dict[str, object]:
    """librdkafka settings that bound what each of a site's ``feeds`` readers fetches
    ahead: together :data:`FEED_BATCHES` batches, each at least
    :data:`PREFETCH_MIN_BYTES` (librdkafka's default is 64 MiB per consumer, whatever
    the number of neighbours). A fetch returns at least one record batch, so a record
    at the size limit is always read."""
    each = max(PREFETCH_MIN_BYTES, FEED_BATCHES * max_batch_bytes // max(feeds, 1))
    return {
        "queued.max.messages.kbytes": each // 1024,
        "fetch.max.bytes": max(each, KAFKA_MAX_MESSAGE_BYTES),
        "message.max.bytes": KAFKA_MAX_MESSAGE_BYTES,
    }


class ByteBudget:
    """The bytes of records a site's feeds hold at once, read and not yet written,
    shared by all of them (one per site application): a feed's round takes from it what
    it reads and gives it back once the merge wrote the batch (or failed). Each feed
    already stops a round at ``merge.max_batch_bytes``, but there are ``n·m + m`` feeds
    (a puller per neighbour and merge, an ingest puller per merge), and each could hold
    a batch waiting for the merge's lock: 40 batches of 64 MiB in a mesh of 20
    (replication review N12). A round's first record always goes, so every feed moves;
    the rest of a round waits, in order, for the next one."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.used = 0
        #: the most held at once
        self.peak = 0
        self._lock = threading.Lock()

    def take(self, n: int, *, first: bool = False) -> bool:
        """Take ``n`` bytes if they fit (always, with ``first``)."""
        with self._lock:
            if not first and self.used + n > self.cap:
                return False
            self.used += n
            self.peak = max(self.peak, self.used)
            return True

    def give(self, n: int) -> None:
        with self._lock:
            self.used -= n


@dataclass(eq=False)
class Turn:
    """A round read and not yet written (:meth:`Feed.read_round`): its rows, and the
    bytes they hold of the site's budget until the merge wrote them or failed."""

    rows: list[SourceRow]
    size: int
    budget: ByteBudget | None

    def release(self) -> None:
        """Give the bytes back (once)."""
        if self.budget is not None:
            self.budget.give(self.size)
            self.budget = None


@dataclass
class Feed:
    """Reads topics at ``kafka`` into ``merger``; see the module docstring. What to read
    and how to react is its kind's (the methods marked "a kind's")."""

    site: SiteConfig
    #: whose Kafka is read (this site's own name for an ingest puller)
    neighbour: str
    #: that Kafka as this site reaches it (its neighbour principal there)
    kafka: KafkaEndpoint
    streams: tuple[str, ...]
    urgent: bool
    merger: Merger
    #: records read, batches handed to the merge
    read: int = 0
    batches: int = 0
    #: records lost to retention before they were read
    gaps: int = 0
    #: of ``read``: from a neighbour's canonical topics (history), and from this site's
    #: own relay topics there (taking back what entered here); relay offsets a first
    #: read skipped, the neighbour's relay index proving their records held here (a
    #: neighbour's puller counts these; an ingest puller has none)
    read_history: int = 0
    read_back: int = 0
    skipped_held: int = 0
    last_success: float | None = None
    #: the records the merge found unproved in this feed, and its parking
    #: (spark_core/feed_guard.py: too many unproved, the feed is not read a while)
    guard: FeedGuard = field(default_factory=FeedGuard)
    error: str | None = None
    #: since when (monotonic) every round has failed (None: the last round did not)
    failing_since: float | None = None
    #: per topic: records behind its end (None: not known yet)
    lag: dict[str, int | None] = field(default_factory=dict)
    #: per topic: when it fell behind (None: caught up)
    behind_since: dict[str, float] = field(default_factory=dict)
    #: the last round read nothing and every assigned partition is at its end
    idle: bool = False
    #: more librdkafka settings for the reader (fetch and prefetch sizes)
    reader_config: dict[str, object] = field(default_factory=dict)
    #: the bytes the site's feeds hold at once (None: only this feed's round bound)
    budget: ByteBudget | None = None
    #: the admin client this feed shares with the other feeds and repairers of its
    #: Kafka (None: its own, made at its first question)
    shared_admin: SharedAdmin | None = field(default=None, repr=False)
    _reader: PartitionReader | None = field(default=None, repr=False)
    _admin: Admin | None = field(default=None, repr=False)
    #: topic -> its source name at the merge
    _sources: dict[str, str] = field(default_factory=dict, repr=False)
    #: per assigned partition: the next offset to read (negative: its start)
    _assigned: dict[Part, int] = field(default_factory=dict, repr=False)
    _described_at: float = field(default=0.0, repr=False)
    _wanted: frozenset[str] = field(default=frozenset(), repr=False)
    #: records read past their partition's share of the last batch, in order
    _carry: list[Message] = field(default_factory=list, repr=False)
    _waiting: set[Part] = field(default_factory=set, repr=False)
    #: per topic: the id it had when last described ("" once it was gone)
    _ids: dict[str, str] = field(default_factory=dict, repr=False)
    #: per partition: the offset its end was last found at
    _at_end: dict[Part, int] = field(default_factory=dict, repr=False)
    #: per partition: where reading it stops (history: the rest comes through relays)
    _stop_at: dict[Part, int] = field(default_factory=dict, repr=False)
    #: the gaps counted: (topic, partition, cursor, oldest)
    _counted: set[tuple[str, int, int, int]] = field(default_factory=set, repr=False)
    #: per partition: the timestamp of the last record it delivered (:meth:`_align`)
    _last_ts: dict[Part, int] = field(default_factory=dict, repr=False)
    #: per partition: when (monotonic) it last delivered a record or its end
    _heard: dict[Part, float] = field(default_factory=dict, repr=False)
    #: turns that failed in a row
    _failures: int = field(default=0, repr=False)

    @property
    def name(self) -> str:
        raise NotImplementedError

    @property
    def reading_history(self) -> list[str]:
        """The streams whose history this feed reads now."""
        return []

    # -- a kind's ---------------------------------------------------------------------------
    def wanted(self) -> frozenset[str]:
        """The topics to read now (a kind's)."""
        raise NotImplementedError

    def source(self, topic: str, topic_id: str) -> str:
        """The merge's source name of ``topic`` (a kind's)."""
        raise NotImplementedError

    def prepare_round(self) -> None:
        """Before each round (a kind's: a neighbour's puller decides on recovery)."""

    def described(self, ids: Mapping[str, str]) -> list[str]:
        """The wanted topics' ids as just described ("": not there), before the feed
        assigns them; returns the topics whose cursors were dropped (a kind's: the
        site's own ingress, recreated under it)."""
        return []

    def narrow(
        self, parts: dict[Part, str], sources: dict[str, str]
    ) -> tuple[dict[Part, str], dict[str, str]]:
        """The partitions read now of those described (a kind's: history, recovery)."""
        return parts, sources

    def first_reads(self, parts: Mapping[Part, str]) -> dict[Part, int]:
        """Where partitions without a cursor start, when not at their oldest record (a
        kind's: the relay index)."""
        return {}

    @property
    def from_zero(self) -> bool:
        """Whether partitions without a cursor start at offset 0, so that one retention
        already cut is a gap (a kind's)."""
        return False

    def on_gap(self, topic: str, part: int) -> None:
        """Retention took records of ``topic`` before they were read (a kind's)."""

    def after_round(self, rows: list[SourceRow]) -> None:
        """After each round, with what it wrote (a kind's)."""

    def after_turn(self) -> None:
        """After each turn of :meth:`run`, when it did not fail (a kind's)."""

    # -- the loop ---------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Read until ``stop`` (or the merge stops); a failure closes the reader and is
        retried with backoff from what the merge committed. (A neighbour's pullers of
        one merge share a thread instead: spark_core/feed_loop.py.)"""
        while not stop.is_set() and not self.merger.stopping.is_set():
            try:
                began = time.monotonic()
                if not self.round():
                    # a round that read nothing waited WAIT_S in its poll, which wakes
                    # on a record: no pause on top of it, where a record arriving would
                    # wait for the next round. One that ended sooner (nothing assigned,
                    # parked) waits out the rest here, so an idle feed never spins
                    stop.wait(max(0.0, self.pace(WAIT_S) - (time.monotonic() - began)))
                self.after_turn()
            except Exception as exc:  # never let one feed die silently
                wait = self.fail(exc)
                if wait is None:
                    break
                stop.wait(wait)
                continue
            self.ok()
        self.close()

    def pace(self, idle_s: float) -> float:
        """The seconds from an idle turn's start to the next: ``idle_s`` while
        partitions are assigned, else the probe interval (nothing to read yet)."""
        return idle_s if self._assigned else self.site.replication.probe_interval_s

    def ok(self) -> None:
        """A turn went through: the failures in a row end."""
        self._failures = 0
        self.error = self.failing_since = None

    def at_end(self) -> bool:
        """Is every partition read found at its end (each end known: a reader just
        assigned has fetched nothing yet)?"""
        return bool(self.lag) and all(n == 0 for n in self.lag.values())

    def fail(self, exc: Exception) -> float | None:
        """A turn failed with ``exc`` (called in its ``except``): the reader is closed
        (the next round starts from what the merge committed), the failure counted and
        logged; returns the wait before the next turn, or None when the feed ends (its
        merge is stopping, or failed for good)."""
        merge_error = isinstance(exc, MergeError)
        if merge_error and self.merger.stopping.is_set():
            return None
        if not merge_error and not isinstance(exc, KafkaClientError):
            log.exception("pull_failed", site=self.site.name, puller=self.name)
        self._failures += 1
        wait = FEED_BACKOFF.delay(self._failures)
        self._failed(exc, wait)
        if isinstance(exc, MergeError) and exc.fatal:
            return None
        return wait

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

    def round(self, wait: float | None = None) -> int:
        """One batch: read what the topics have past the cursors (waiting up to ``wait``
        for a first record, :data:`WAIT_S` by default), hand it to the merge. Returns
        the records read."""
        turn = self.read_round(wait)
        if turn is None:
            return 0
        try:
            plan = self.merger.write_pulled(turn.rows) if turn.rows else None
        except BaseException:
            turn.release()
            raise
        return self.finish_round(turn, plan)

    def read_round(self, wait: float | None = None) -> Turn | None:
        """The first half of :meth:`round`: the batch read, not written (None: nothing
        assigned, or the feed parked). Its bytes stay taken from the site's budget
        until :meth:`finish_round` (or :meth:`Turn.release` on a failure)."""
        self.prepare_round()
        if self.guard.parked():  # too many unproved records of late: not read a while
            self.idle = False
            return None
        wanted = self.wanted()
        now = time.monotonic()
        if wanted != self._wanted or now >= self._described_at + DESCRIBE_EVERY_S:
            self._assign(wanted)
            self._described_at = now
        if not self._assigned:
            self.idle = True
            return None
        reader = self._reader
        assert reader is not None
        limit = self.site.replication.max_offsets_per_trigger
        budget = self.site.merge.max_batch_bytes
        # each partition its share of the batch, and no record newer than what every
        # other partition of its topic has been read to (_align): one origin's seqs are
        # spread over the partitions by key, so a batch that took one partition far
        # ahead of the others would leave holes in the ledger (bounded:
        # MAX_HOLDINGS_RANGES); what waits, waits in order for the next round
        share = max(1, limit // len(self._assigned))
        taken: Counter[Part] = Counter()
        rows: list[SourceRow] = []
        picked: list[Message] = []  # the message of each row
        heard_at = time.monotonic()
        size = 0
        carried, self._carry = self._carry, []
        paused: list[Part] = []
        full = False  # the batch has its bytes: the rest waits for the next round
        shared = self.budget

        def take(m: Message) -> None:
            nonlocal size, full
            tp = (str(m.topic()), m.partition() or 0)
            self._heard[tp] = heard_at
            offset = m.offset() or 0
            stop_at = self._stop_at.get(tp)
            if stop_at is not None and offset >= stop_at:
                # read up to where it stops (history: the rest of the neighbour's
                # canonical topic comes through its relays); pause: no more is fetched
                self._assigned[tp] = max(self._assigned.get(tp, 0), stop_at)
                reader.pause([tp])
                return
            key, value = m.key(), m.value()
            ts = written_ms(m)
            if ts is not None:
                self._last_ts[tp] = ts
            headers: Headers = list(m.headers() or [])  # type: ignore[arg-type]
            nbytes = len(key or b"") + len(value or b"")
            nbytes += sum(len(k) + len(v or b"") for k, v in headers)
            full = full or (bool(rows) and size + nbytes > budget)  # one record always goes
            if not full and not (taken[tp] >= share or tp in self._waiting) and shared:
                full = not shared.take(nbytes, first=not rows)
            if full or taken[tp] >= share or tp in self._waiting:  # order: after its carry
                self._carry.append(m)
                if tp not in self._waiting:
                    self._waiting.add(tp)
                    paused.append(tp)
                    reader.pause([tp])
                return
            taken[tp] += 1
            rows.append(SourceRow(self._sources[tp[0]], tp[1], offset, key, value, headers, ts))
            picked.append(m)
            size += nbytes
            self._assigned[tp] = offset + 1

        self._waiting = set()
        try:
            wait_s = WAIT_S if wait is None else wait
            rows = self._read(take, carried, rows, picked, paused, lambda: full, wait_s)
        except BaseException:
            if shared is not None:
                shared.give(size)
            raise
        return Turn(rows, size, shared)

    def _read(
        self,
        take: Callable[[Message], None],
        carried: list[Message],
        rows: list[SourceRow],
        picked: list[Message],
        paused: list[Part],
        full: Callable[[], bool],
        wait_s: float,
    ) -> list[SourceRow]:
        """The rest of :meth:`read_round`: read (``take`` each record; ``full()`` says
        when the batch has its bytes), the rows that go now."""
        reader = self._reader
        assert reader is not None
        limit = self.site.replication.max_offsets_per_trigger
        for m in carried:
            take(m)
        # until the first record, the round waits up to wait_s for one, and its poll
        # returns as it arrives (``wake``: librdkafka's batch consume would hold it to
        # the end of the wait); then it takes what is there now, no more waiting.
        # No bound on the carry here: a partition is paused once past its share, so it
        # waits with at most its share and one fetch; one that _align holds back (a
        # cold partition ahead in time) must not stop the others being read
        deadline = time.monotonic() + wait_s
        while len(rows) < limit and not full():
            wait = 0.0 if rows else max(0.0, deadline - time.monotonic())
            got = reader.poll(min(limit - len(rows), 5000), timeout=wait, wake=True)
            for gap in got.gaps:
                self._gap(gap)
            if got.errors:
                raise got.errors[0]
            for end in got.ends:  # past the last record (and any transaction marker)
                self._at_end[(end.topic, end.partition)] = end.offset
                self._heard[(end.topic, end.partition)] = time.monotonic()
            if not got.records and not got.gaps and (rows or wait <= 0.0 or not got.ends):
                break  # nothing more now (an end alone: the wait goes on)
            for m in got.records:
                take(m)
        if paused:
            reader.resume(paused)
        return self._align(rows, picked)

    def finish_round(self, turn: Turn, plan: BatchPlan | None) -> int:
        """The second half of :meth:`round`, once the merge wrote ``turn``'s rows
        (``plan``; None: it had none): the budget given back, the round counted.
        Returns the records read."""
        turn.release()
        rows = turn.rows
        if rows:
            assert plan is not None
            if self.guard.note(plan.unproved):
                log.warning(
                    "pull_parked",
                    site=self.site.name,
                    puller=self.name,
                    unproved=self.guard.unproved,
                    park_s=round(self.guard.park_s),
                )
            self.read += len(rows)
            self.batches += 1
            self.last_success = time.time()
        self._measure_lag(len(rows))
        self.after_round(rows)
        return len(rows)

    def _align(self, rows: list[SourceRow], picked: list[Message]) -> list[SourceRow]:
        """The rows no newer than every other partition of their topic has been read
        to; the rest go back to the carry, in order, and are read again next round.

        A partition has been read to the time of the first record it has waiting (what
        it brought past its share), else of the last record it delivered; one at its end
        (or past where its reading stops) holds nothing back. One that has delivered
        nothing yet holds its whole topic until it does (its first fetch), or until it
        has been silent for the Kafka timeout (a partition whose leader is gone holds
        nothing up for good). An equal count per partition was not enough (review N3):
        after an outage, a cold partition (a ship's few containers there, among other
        ships' busy ones) ran days ahead of the busy ones, its seqs came in isolated,
        the ship's ledger entry reached the bound on holes and the merge dead-lettered
        records the gateway had acknowledged. Timestamps are compared only within one
        topic, whose partitions one writer fills (the gateway, or the neighbour's
        merge)."""
        if not rows:
            return rows
        waiting: dict[Part, int] = {}
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
                or (tp in self._stop_at and nxt >= self._stop_at[tp])
                or now - self._heard.get(tp, now) > silent_s  # its leader gone: not waited for
            ):
                bound = float("inf")
            else:
                last = self._last_ts.get(tp)
                bound = float("-inf") if last is None else last
            cut[tp[0]] = min(cut.get(tp[0], float("inf")), bound)
        kept: list[SourceRow] = []
        back: list[Message] = []
        moved: set[Part] = set()
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

    def reached(self, ends: Mapping[Part, int]) -> bool:
        """Has every partition of ``ends`` been read (or found at its end) up to there?"""
        carried = self._carried()
        return all(self._read_to(tp, carried) >= end for tp, end in ends.items())

    def _carried(self) -> set[Part]:
        return {(str(m.topic()), m.partition() or 0) for m in self._carry}

    def _read_to(self, tp: Part, carried: set[Part]) -> int:
        """The next offset of ``tp`` not yet handed to the merge: past its last record
        the end found (a transaction marker may follow the last record), unless records
        wait in the carry. One poll can bring a partition's last records and its end
        together (a busy machine polls late, the fetcher has found the end meanwhile):
        the end found does not mean what it found was written (CI found this: a batch
        written through returned with records in the carry)."""
        read = self._assigned.get(tp, -1)
        return read if tp in carried else max(read, self._at_end.get(tp, -1))

    def _gap(self, gap: DataLoss) -> None:
        """Retention deleted records past where the feed was: counted (once, though the
        cursor may meet it again at the next assignment), logged, and its kind reacts
        (:meth:`on_gap`). The reader went on from the oldest record left. A partition
        that now ends below what was read (a log lost under the same topic id) is only
        logged: nothing it held is missing here."""
        tp = (gap.topic, gap.partition)
        self._heard[tp] = time.monotonic()
        if tp in self._assigned:
            self._assigned[tp] = max(self._assigned[tp], gap.reset_to)
        if gap.reset_to < gap.consumed_to:
            log.warning(
                "pull_truncated", site=self.site.name, neighbour=self.neighbour, error=str(gap)
            )
            return
        key = (gap.topic, gap.partition, gap.consumed_to, gap.reset_to)
        if key in self._counted:
            # met again from the same cursor (a new assignment before the merge moved
            # it): known, and what its kind did about it stands (a neighbour's puller
            # taking its history again for it would never get past it)
            return
        self._counted.add(key)
        self.gaps += gap.reset_to - gap.consumed_to
        log.warning(
            "pull_gap",
            site=self.site.name,
            neighbour=self.neighbour,
            topic=gap.topic,
            partition=gap.partition,
            cursor=gap.consumed_to,
            oldest=gap.reset_to,
        )
        self.on_gap(gap.topic, gap.partition)

    # -- assignment -------------------------------------------------------------------------
    def admin(self) -> Admin:
        if self._admin is None:
            shared = self.shared_admin or SharedAdmin.of_neighbour(self.site, self.kafka)
            self._admin = shared()
        return self._admin

    def describe(self, topics: frozenset[str]) -> dict[str, tuple[str, list[int]]]:
        """Each of ``topics`` that exists: its id and partitions."""
        described = self.admin().describe(topics, f" at {self.neighbour}")
        return {t: (str(d.topic_id), [p.id for p in d.partitions]) for t, d in described.items()}

    def _assign(self, wanted: frozenset[str]) -> None:
        """Assign the wanted topics that exist, each partition at the merge's cursor for
        the topic's current id (:mod:`spark_core.pull_plan`)."""
        self._wanted = wanted
        if not wanted:
            if self._reader is not None:
                self._reader.unassign()
            self._assigned, self._sources = {}, {}
            return
        sources, parts, self._ids, renewed = plan_parts(
            self.describe(wanted), wanted, self._ids, self.source
        )
        renewed |= bool(self.described({t: i for t, i in self._ids.items() if t in wanted}))
        if renewed and self._reader is not None:
            # a topic deleted and created again (or a neighbour's whole Kafka rebuilt):
            # the consumer's cached metadata (leader epochs) belongs to the old one and
            # it would wait for ever; a new reader starts from what the merge holds
            log.warning("pull_topic_recreated", site=self.site.name, neighbour=self.neighbour)
            self.close()
            self._wanted = wanted
        parts, sources = self.narrow(parts, sources)
        if sources == self._sources and set(parts) == set(self._assigned):
            return  # nothing changed: keep the reader where it is
        cursors = self.merger.ready().offsets
        first = self.first_reads(
            {tp: src for tp, src in parts.items() if (src, tp[1]) not in cursors}
        )
        starts = plan_starts(parts, cursors, first, from_zero=self.from_zero)
        reader = self._reader or self._new_reader()
        reader.assign(starts)
        # a partition paused once (a history read at its end) stays paused through a
        # new assignment: a second history read from the same neighbour read nothing
        reader.resume(starts)
        self._carry, self._at_end, self._last_ts = [], {}, {}  # again from the cursors
        self._sources = sources
        self._assigned = dict(starts)
        self._heard = dict.fromkeys(self._assigned, time.monotonic())
        log.info(
            "pull_assigned",
            site=self.site.name,
            puller=self.name,
            topics=len(sources),
            partitions=len(starts),
        )

    def _new_reader(self) -> PartitionReader:
        self._reader = PartitionReader(
            self.kafka,
            group=pull_group(self.site.name),  # never joined or committed
            what=f"pull from {self.neighbour}",
            # fetch.wait.max.ms stays Kafka's 500 ms: a fetch parked at the end of a
            # topic returns as soon as a record commits there, so a shorter wait brings
            # nothing sooner; it only has the neighbour answer empty fetches 10-20 times
            # a second per puller. No probe timeout here: a fetch of a few MiB over a
            # slow link takes seconds, and cut short it would be asked again for ever
            # (the link probes of spark_core/routing.py tell a neighbour gone)
            extra={"client.id": f"shorelink-{self.site.name}-{self.name}", **self.reader_config},
        )
        return self._reader

    def _measure_lag(self, read: int) -> None:
        """Per topic, records between what was read and its end (the end the last fetch
        saw: no request)."""
        reader = self._reader
        if reader is None:
            return
        per_topic: dict[str, int | None] = {}
        carried = self._carried()
        for topic, part in self._assigned:
            pos = self._read_to((topic, part), carried)
            hi = reader.known_end(topic, part)
            if hi is None or (pos < 0 and hi > 0):
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
        r, self._reader = self._reader, None
        self._assigned, self._sources = {}, {}
        self._wanted, self._carry, self._at_end, self._last_ts = frozenset(), [], {}, {}
        self._described_at = 0.0
        if r is not None:
            r.close()
