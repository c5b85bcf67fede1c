"""The merge: the only writer of a site's canonical topics ``sl.<stream>`` and ``sl.ledger``.

One streaming query reads ``sl.ingress.*`` (read_committed, headers included); the
site's pullers hand it what they read from the neighbours' relay topics and its ingest
puller what it read from the same ``sl.ingress.*`` first (``write_pulled``,
spark_core/pull.py), between its batches. Each micro-batch is handed to the driver as
Arrow, without the rows already written (``maxOffsetsPerTrigger`` bounds it;
spark_core/merge_batch.py), checked against the record contract, deduplicated on
identity against the ranges already written, and written in ONE Kafka transaction: the new records in seq order per
``(origin, stream)``, the malformed ones to ``sl.dead.<stream>``, the new ranges to
``sl.ledger`` and the batch marker to ``sl.merge.marker``. The dedup state is rebuilt from
the ledger (read_committed) at start-up and after any failed transaction, so a batch that
Spark replays after a crash finds its identities already written. docs/exactly-once.md
explains why that is exactly once.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka.admin import OffsetSpec

from shorelink.contract import (
    DEAD_UNKNOWN_TOPIC,
    H_SITE,
    H_TS,
    HEADER_LAYOUT,
    KAFKA_MAX_MESSAGE_BYTES,
    LEDGER_TOPIC,
    MARKER_TOPIC,
    RELAYED_TOPIC,
    canonical_topic,
    customer_topic,
    ingress_topic,
    marker_key,
    relay_topic,
)
from shorelink.files import write_json_atomic
from shorelink.fleet.entry import REGISTRY_STREAM
from shorelink.fleet.follow import RegistryFollower
from shorelink.kafka.admin import Admin
from shorelink.kafka.errors import Fenced, KafkaClientError, KafkaTransactionError, UnknownTopic
from shorelink.kafka.reading import read_to_end
from shorelink.kafka.topics import (
    TopicSpec,
    ensure_topics,
    ingress_spec,
    producer,
    producer_config,
)
from shorelink.kafka.transactions import TransactionalProducer
from shorelink.ledger import MAX_HOLDINGS_RANGES, encode_entry
from shorelink.logs import get_logger
from shorelink.proof import WatchedShipKeys
from shorelink.ranges import RangeSet
from shorelink.shards import Shard
from spark_core import location
from spark_core.config import SiteConfig, SitesConfig
from spark_core.merge_batch import (
    ArrowBatch,
    batch_frame,
    batch_sizes,
    cyclic_gc_paused,
    unwritten,
)
from spark_core.merge_queue import Waiting, WriteQueue, settle
from spark_core.merge_state import (
    BatchPlan,
    MergeError,
    MergeState,
    Relayed,
    RowBatch,
    Source,
    SourceBatch,
    SourceRow,
    encode_relayed,
    forgettable,
    held_back_after,
    history_stream,
    plan_batch,
    source_entry,
    superseded_sources,
    topic_stream,
    tried_seqs,
)
from spark_core.purge import SourcePurger, below, spark_position
from spark_core.quarantine import CONTRACT, dead_cause
from spark_core.relay_index import INDEX_EVERY_S, SegmentOf, Tail, encode_round, index_topic
from spark_core.session import trigger
from spark_core.topics import (
    canonical_index_spec,
    customer_ownership,
    customer_specs,
    relay_entries,
    relay_index_spec,
    stream_specs,
)

__all__ = [
    "MERGE_QUERIES",
    "BatchPlan",
    "Merger",
    "SourceRow",
    "fence_predecessors",
    "merge_layout",
    "merge_transactional_id",
    "plan_batch",
    "reset_changed_checkpoints",
    "reset_reassigned_checkpoint",
    "reset_recreated_checkpoint",
    "start_merge",
    "topic_stream",
]

log = get_logger(__name__)


@dataclass
class Totals:
    batches: int = 0
    input: int = 0
    written: int = 0
    duplicates: int = 0
    dead: int = 0
    skipped: int = 0
    failures: int = 0
    #: records also written to a customer's stream
    customer: int = 0
    #: batches a puller wrote (records read from a neighbour's relay topics)
    pulled: int = 0
    #: records the site held already, written to the relay topic of the other entry
    #: they came through (merge_state.plan_batch)
    relayed_again: int = 0
    #: where the driver's time went, in seconds: Spark computing the batch and handing
    #: it over as Arrow, the plan (dedup, order, fetching the rows written), the
    #: Kafka transaction
    fetch_s: float = 0.0
    plan_s: float = 0.0
    txn_s: float = 0.0
    #: Spark batches over ``merge.max_batch_bytes``, written in slices instead
    sliced: int = 0
    #: the most the driver took of one Spark batch, in Arrow bytes
    largest_fetch_bytes: int = 0
    #: segments written to the relay index (spark_core/relay_index.py)
    index_segments: int = 0
    #: times the index's tails started again, their pending seqs too many (N9)
    index_restarts: int = 0
    #: pulled records whose ship's proof failed (dead-lettered, among ``dead``)
    unproved: int = 0
    #: dead letters tried again after a change of the ship keys (spark_core/redrive.py),
    #: per ``cause:outcome`` (written, duplicate, refused), and the passes that did
    redriven: dict[str, int] = field(default_factory=dict)
    redrive_passes: int = 0
    #: records of origins another shard of the site takes, passed (a merge split by
    #: origin: ``merge_state.plan_batch``'s ``foreign``)
    foreign: int = 0
    #: records this merge's batches quarantined, per ``stream:cause``
    #: (spark_core/quarantine.py; a re-drive's refusals are among ``redriven``)
    quarantined: dict[str, int] = field(default_factory=dict)


#: pending seqs (ranges over every relay topic and origin) past which the relay index is
#: written at once, and past which the tails start again (``Merger._bounded``): about
#: 30 bytes each in a marker that must stay well below the record size limit
PENDING_EARLY_RANGES = 4096
PENDING_MAX_RANGES = 16384

#: the merges a site may run (spark_core/jobs/site.py ``mergers``): one for every
#: stream, or ``merge-urgent`` beside ``merge`` when some streams are urgent
MERGE_QUERIES = ("merge", "merge-urgent")


def merge_transactional_id(site: SiteConfig, query: str) -> str:
    """The ``transactional.id`` of the site's merge ``query``."""
    base = site.merge.transactional_id
    return base if query == "merge" else f"{base}-{query.removeprefix('merge-')}"


#: the key in ``sl.merge.marker`` of how the site's merge was split last
#: (``{"shards": N}``): kept in Kafka, since the shards' drivers may run on other hosts
LAYOUT_PART = "layout"


def marker_spec() -> TopicSpec:
    return TopicSpec(MARKER_TOPIC, partitions=1, compacted=True)


def layout_key(site: SiteConfig) -> bytes:
    return marker_key(site.name, LAYOUT_PART)


def merge_layout(site: SiteConfig) -> int | None:
    """The shard count the site's merge ran with last, as its layout record says (None:
    no record: one merge, as every site before merges were split by origin)."""
    key = layout_key(site)
    shards: int | None = None
    try:
        for msg in read_to_end(
            site.kafka,
            [MARKER_TOPIC],
            timeout=site.kafka.timeout_s,
            extra={"fetch.wait.max.ms": 10},
        ):
            if msg.key() == key:
                value = msg.value()
                shards = None if not value else int(json.loads(value)["shards"])
    except UnknownTopic:
        return None  # a new site: no merge has run here
    except (KafkaClientError, ValueError, KeyError, TypeError) as exc:
        raise MergeError(f"cannot read the merge's layout ({key.decode()}): {exc}") from exc
    return shards


def _check_merged_whole(site: SiteConfig) -> None:
    """Before a site that ran one merge is split: that merge has merged its ingress to
    the end (its cursors at every partition's last stable offset), or the split is
    refused, naming what is left. Its ingress was written by key, so a partition holds
    every shard's origins, and a shard reads only its own partitions: what the one merge
    left would be merged by none. Asked before anything is fenced, so the one merge
    goes on while it finishes (stop the gateway meanwhile, or switch it to
    ``kafka.ingress_by_origin`` first)."""
    cursors: dict[tuple[str, int], int] = {}
    found = False
    for query in MERGE_QUERIES:
        state = MergeState.load(site.kafka, site.name, site.kafka.timeout_s * 2, query=query)
        found |= state.last_batch is not None or bool(state.offsets)
        for tp, offset in state.offsets.items():
            cursors[tp] = max(cursors.get(tp, 0), offset)
    if not found:
        return  # no merge ran here whole: nothing it left
    admin = Admin(site.kafka)
    try:
        described = admin.describe(ingress_topic(s) for s in site.streams)
        parts = [(t, p.id) for t, d in described.items() for p in d.partitions]
        ends = admin.offsets(parts, OffsetSpec.latest(), committed=True)
        starts = admin.offsets(parts, OffsetSpec.earliest())
    except KafkaClientError as exc:
        raise MergeError(f"cannot read where the ingress ends: {exc}") from exc
    left = {
        tp: ends[tp].offset - max(cursors.get(tp, 0), starts[tp].offset)
        for tp in parts
        if ends[tp].offset > max(cursors.get(tp, 0), starts[tp].offset)
    }
    if left:
        named = ", ".join(f"{t}[{p}]: {n}" for (t, p), n in sorted(left.items())[:5])
        raise MergeError(
            f"the site's one merge has not merged its ingress to the end ({named}"
            f"{', ...' if len(left) > 5 else ''} records left): those were written by key, "
            "in any shard's partitions, and no shard would merge them. Let it finish (with "
            "the gateway stopped, or writing by origin: kafka.ingress_by_origin), then "
            "start the shards",
            fatal=True,
        )


def layout_ids(site: SiteConfig, shards: int) -> list[str]:
    """Every ``transactional.id`` the site's merges take when split into ``shards``."""
    if shards == 1:
        return [merge_transactional_id(site, q) for q in MERGE_QUERIES]
    return [
        merge_transactional_id(site, q + Shard(k, shards).suffix)
        for k in range(shards)
        for q in MERGE_QUERIES
    ]


def fence_predecessors(site: SiteConfig, shard: Shard | None = None) -> None:
    """Fence every merge of ``site`` that an earlier run may have left writing, whatever
    its layout, before this run's merges write anything. A merge fences only the older
    holder of its own ``transactional.id``: when ``urgent`` changed between two runs,
    the old ``merge`` (every stream) kept writing the alerts beside the new
    ``merge-urgent``, or the old ``merge-urgent`` beside the new ``merge`` (replication
    review N17: duplicates, and ledger entries overwriting each other). Each id is
    taken once by a producer that writes nothing (``init_transactions`` aborts what the
    old one left open); this run's merges then take their own ids back.

    A merge split by origin (``shard``: this application's shard) fences its own ids,
    never another live shard's; when the site's layout record (:func:`merge_layout`)
    names another shard count, every id of that layout too (the merge that ran whole,
    or the shards of the old count), and the record then names this one. One merge
    with no record does as it always did."""
    count = 1 if shard is None else shard.count
    old = merge_layout(site)
    if shard is None:
        ids = layout_ids(site, 1)
    else:
        ids = [merge_transactional_id(site, q + shard.suffix) for q in MERGE_QUERIES]
    if old is not None and old != count:
        ids += layout_ids(site, old)
    elif old is None and count > 1:
        ids += layout_ids(site, 1)  # the one merge a site ran before it was split
    if count > 1 and old in (None, 1):
        _check_merged_whole(site)
    for tid in dict.fromkeys(ids):
        p = TransactionalProducer(
            producer_config(site.kafka, {"transactional.id": tid}), timeout=site.kafka.timeout_s
        )
        try:
            p.init()
        except KafkaClientError as exc:
            raise MergeError(f"cannot fence an earlier merge ({tid}): {exc}") from exc
        finally:
            p.close()
        log.info("merge_predecessor_fenced", site=site.name, transactional_id=tid)
    if old != count and not (old is None and count == 1):
        ensure_topics(site.kafka, [marker_spec()], site.durability)
        writer = producer(site.kafka, {"enable.idempotence": True})
        value = json.dumps({"shards": count}, separators=(",", ":")).encode()
        writer.produce(MARKER_TOPIC, key=layout_key(site), value=value)
        if writer.flush(site.kafka.timeout_s):
            raise MergeError(f"cannot write the merge's layout ({layout_key(site).decode()})")
        log.info("merge_layout_changed", site=site.name, shards=count, was=old or 1)


#: how long the index waits after its Kafka did not answer (seconds)
INDEX_BACKOFF_S = 60.0


class Merger:
    """The driver-side half of the merge query: state, topics, the transactional
    producer, per-batch logic (``process_batch`` is the ``foreachBatch`` function)."""

    def __init__(
        self,
        site: SiteConfig,
        *,
        query: str = "merge",
        streams: Sequence[str] = (),
        sites: SitesConfig | None = None,
        shard: Shard | None = None,
    ) -> None:
        self.site = site
        #: this merge's shard of the site's merge split by origin (None: whole); its
        #: query, transactional id and marker key end with ``-o<k>of<N>``
        self.shard = shard
        self.query = query if shard is None else query + shard.suffix
        #: whether an origin is this shard's (None: every origin is)
        self.owns = None if shard is None else shard.owns
        #: per ingress topic this shard reads, its partition count (:meth:`assignment`)
        self.partition_counts: dict[str, int] = {}
        #: the streams this merge writes (all the site's by default)
        self.streams = tuple(streams) or site.streams
        #: the sites of the file (entry sites of the relay topics), when some site
        #: pulls from this one: then every new record also goes to
        #: ``sl.relay.<entry>.<stream>`` in the same transaction
        self._sites = sites
        self.entries = frozenset(relay_entries(site, sites))
        #: the most ranges one (origin, stream) may hold (the bound on holes; a test of
        #: what reaches it lowers it here)
        self.max_ranges = MAX_HOLDINGS_RANGES
        #: transactions this merge committed since it started (the re-drive tells the
        #: sources held back before its pass from those held back during it)
        self.commits = 0
        self._relays: dict[tuple[str, str, str | bool | None], str | None] = {}
        self._entries: dict[str, str | None] = {}
        self.transactional_id = merge_transactional_id(site, self.query)
        self.state = MergeState()
        self.totals = Totals()
        self.last: dict[str, object] = {}
        self.stopping = threading.Event()
        self.busy = threading.Lock()
        #: the feeds' batches waiting for ``busy`` (:meth:`write_pulled`)
        self._queue = WriteQueue(site.merge.max_batch_bytes)
        #: the session the merge's query runs in (:func:`start_merge`): a checkpoint at
        #: a URL is read through its Hadoop filesystem
        self.spark: Any = None
        self._producer: TransactionalProducer | None = None
        self._ensured: set[str] = set()
        self._purger = SourcePurger(site.kafka)
        self._admin: Admin | None = None
        #: local source topics found recreated (:meth:`adopt_sources`), each with the
        #: count of recreations when it was; and that count when the Spark query's last
        #: batch was written (None: its first batch not yet): review 9, finding 7
        self._recreations = 0
        self._recreated: dict[str, int] = {}
        self._spark_seen: int | None = None
        self._index_due = 0.0  # monotonic time of the next relay index segment
        #: who owns which container when: each new record of a customer's container
        #: also goes to ``sl.customer.<name>.<stream>``, in the same transaction
        self.ownership = customer_ownership(site, sites)
        #: set once another merge of this site fenced this one (it never writes again)
        self.fenced: str | None = None
        #: writes a Spark batch too big for the driver (``merge.max_batch_bytes``): reads
        #: its source partitions up to the given ends, in slices of bounded bytes, each
        #: written through ``write_pulled`` (the replicator sets it: spark_core/pull.py,
        #: ``write_through``); None: the batch comes to the driver whole
        self.write_through: Callable[[Mapping[tuple[str, int], int]], None] | None = None
        #: a puller reads this merge's ingress topics too, writing each record as it
        #: comes (the replicator sets it); the Spark query then runs every
        #: ``merge.backstop_interval`` instead of every ``trigger_interval``
        self.ingest_puller = False
        #: the ships' public keys (``ship_keys_file``; shorelink/proof.py): what it
        #: pulls from neighbours is taken only with its ship's proof. None: unchecked
        #: (``fleet_pub_file``: the site's registry follower, set by the application)
        self.ship_keys: WatchedShipKeys | RegistryFollower | None = (
            None
            if sites is None or sites.ship_keys_file is None
            else WatchedShipKeys(sites.ship_keys_file)
        )
        #: set when the site's merges were split otherwise in the last run
        #: (:func:`reset_changed_checkpoints`): the marker's relay index tails were kept
        #: under that layout, while another merge may have written the same relay topics
        #: after them, so each tail starts again at its topic's end (once committed)
        self.reindex = False
        #: whether the first load found nothing of this merge in Kafka (no marker): a
        #: new site, or one whose Kafka was wiped; its pullers then also take back,
        #: once, what entered here (spark_core/pull.py). None until the first load
        self.fresh: bool | None = None

    @property
    def source_pattern(self) -> str:
        """The topics this merge reads: ``merge.source_pattern``, or the ingress
        topics of its streams."""
        return self.site.merge.source_pattern or source_pattern(self.streams)

    def assignment(self) -> dict[str, list[int]]:
        """A shard's source partitions: per ingress topic of its streams, those of its
        origins (``Shard.reads``); a topic whose partition count the shard count does
        not divide is read whole, and only the fleet registry's may be such (one
        partition, a few records): any other is refused, named, since every shard would
        read (and its ingest puller decode) all of it."""
        assert self.shard is not None
        topics = [ingress_topic(s) for s in self.streams]
        try:
            described = self.admin().describe(topics, f" at {self.site.name}")
        except KafkaClientError as exc:
            raise MergeError(f"cannot describe the ingress topics: {exc}") from exc
        out: dict[str, list[int]] = {}
        for topic in topics:
            if topic not in described:
                raise MergeError(f"{topic} does not exist at {self.site.name}")
            n = len(described[topic].partitions)
            if n % self.shard.count and topic != ingress_topic(REGISTRY_STREAM):
                raise MergeError(
                    f"{topic} has {n} partitions, not a multiple of merge.shards = "
                    f"{self.shard.count}: each shard reads the partitions of its origins "
                    "(crc32(origin) mod partitions); add partitions (kafka-topics.sh "
                    "--alter) and set the gateway's kafka.ingress_partitions to match",
                    fatal=True,
                )
            self.partition_counts[topic] = n
            out[topic] = [p for p in range(n) if self.shard.reads(p, n)]
        return out

    def _misrouted(self, plan: BatchPlan) -> None:
        """Refuse a batch with records of another shard's origins in a partition this
        shard reads alone: that shard never reads them there, so passed they would be
        merged by none (and the ships told they are held). Written by a gateway without
        ``kafka.ingress_by_origin``, or before it; nothing of the batch is written and
        the shard stalls, loudly, until the site runs one merge over that ingress."""
        if self.shard is None or not plan.foreign_from:
            return
        count = self.shard.count
        topics = sorted(
            t for t in plan.foreign_from if self.partition_counts.get(t, count) % count == 0
        )
        if not topics:
            return  # a topic every shard reads whole: each takes its own origins
        n = sum(plan.foreign_from[t] for t in topics)
        raise MergeError(
            f"{n} records of other shards' origins in partitions of {', '.join(topics)} that "
            f"shard {self.shard} reads alone: the gateway does not write ingress by origin "
            "(set kafka.ingress_by_origin), or did not when they were written. None of this "
            "batch is written. Run the site with one merge (merge.shards = 1) until its "
            "ingress is merged to the end, then start the shards again",
            fatal=True,
        )

    def purgeable(self, below_: Mapping[tuple[str, int], int]) -> dict[tuple[str, int], int]:
        """Of the offsets a purge would delete below, those of partitions this merge
        reads alone: a topic every shard reads whole (:meth:`assignment`) is purged by
        none, or one shard would delete what another has not read."""
        if self.shard is None:
            return dict(below_)
        count = self.shard.count
        return {
            tp: o
            for tp, o in below_.items()
            if self.partition_counts.get(tp[0], count) % count == 0
        }

    @property
    def status_path(self) -> Path:
        return self.site.state_path / f"{self.query}.status.json"

    # -- set-up -------------------------------------------------------------------------
    def prepare(self) -> None:
        """Create topics, fence any older merge of this site, load the state. A merge
        that was fenced never does this again (it would fence the newer merge back: two
        merges of one site would take turns for ever)."""
        if self.fenced is not None:
            raise MergeError(self.fenced, fatal=True)
        m = self.site.merge
        specs = [
            TopicSpec(LEDGER_TOPIC, partitions=1, compacted=True),
            marker_spec(),
            TopicSpec(RELAYED_TOPIC, partitions=1, compacted=True),
            TopicSpec(DEAD_UNKNOWN_TOPIC, retention_ms=m.dead_retention_ms),
        ]
        if self.entries:
            specs.append(relay_index_spec(self.site))
        specs.append(canonical_index_spec(self.site))
        if self.shard is not None:  # read by partition: they must be there to be assigned
            specs += [ingress_spec(s, self.site.policy(s).partitions) for s in self.streams]
        self._ensure([*specs, *self._stream_specs(self.site.streams)])  # one admin round
        if self.shard is not None:
            self.assignment()
        self._close_producer()
        p = TransactionalProducer(
            producer_config(
                self.site.kafka,
                {
                    "transactional.id": self.transactional_id,
                    "linger.ms": 5,
                    "compression.type": "lz4",
                    # the Java clients' partitioner: same key, same partition, whoever writes
                    "partitioner": "murmur2_random",
                    "queue.buffering.max.messages": 1_000_000,
                },
            ),
            timeout=self.site.kafka.timeout_s,
            closing=self.stopping,
        )
        try:
            # aborts whatever transaction a crashed predecessor left open, and fences it
            p.init()
        except KafkaClientError as exc:
            raise MergeError(f"cannot init transactions: {exc}") from exc
        self._producer = p
        try:
            self.state = MergeState.load(
                self.site.kafka,
                self.site.name,
                timeout=self.site.kafka.timeout_s * 2,
                query=self.query,
                owns=self.owns,
            )
        except MergeError:
            # no batch is planned against a state not loaded: the next one prepares again
            self._close_producer()
            raise
        if self.fresh is None:
            self.fresh = self.state.last_batch is None and not self.state.offsets
        self._start_index()
        log.info(
            "merge_ready",
            site=self.site.name,
            sources=len(self.state.held),
            ranges=self.state.ranges(),
            last_batch=self.state.last_batch,
        )
        self.write_status("running")

    def _ensure(self, specs: Sequence[TopicSpec]) -> None:
        todo = [s for s in specs if s.name not in self._ensured]
        if todo:
            ensure_topics(self.site.kafka, todo, self.site.durability)
            self._ensured.update(s.name for s in todo)

    def _ensure_streams(self, streams: Iterable[str]) -> None:
        self._ensure(self._stream_specs(streams))

    def _stream_specs(self, streams: Iterable[str]) -> list[TopicSpec]:
        specs = stream_specs(self.site, self._sites, streams)
        if self.ownership is not None:
            specs += customer_specs(self.site, self.ownership.customers, streams)
        return specs

    def _customer(self, stream_topic: str, key: bytes | None, headers: Any) -> str | None:
        """The customer topic of a canonical record (None: no customer's container):
        its container (the key) owned at its own time (``sl.ts``)."""
        assert self.ownership is not None
        customers = self.ownership.customers
        stream = stream_topic[len("sl.") :]
        if key is None or stream not in customers.stream_names:
            return None  # nav, position...: no container's records, no lookup
        ts = _header(headers, H_TS)
        if ts is None:
            return None
        try:
            ts_ms = int(ts)
            owner = customers.owner(key.decode(), ts_ms)
        except (TypeError, ValueError, UnicodeDecodeError):
            return None
        if owner is None or stream not in customers.customers[owner].streams:
            return None
        return customer_topic(owner, stream)

    def _entry(
        self, read_from: str, headers: Sequence[tuple[str, Any]] | None = None
    ) -> str | None:
        """The entry site of what was read from ``read_from``: where the record was
        read from, never what it claims. A pulled record entered where its relay topic
        says, the rest here; an entry that is not a site of the file counts as entered
        here (so it still reaches every site).

        A neighbour's canonical topic (history) is no entry's relay: the source has no
        entry (None), each of its records has its own (``headers`` given): the site its
        ``sl.site`` names (what the neighbour's canonical copy carries from the gateway
        it entered at). History is what a relay lost before this site read it, so the
        sites behind this one, whose cursors here passed no deletion, lack it too, and
        get it only if this site relays it (review N1: a line a-b-c, b's history from
        a never reached c). Filed under its entry, it goes where that entry's records
        go: to the sites routing the entry through here. A claim is as good as the
        neighbour that serves it, like the relay topic a pulled record comes from (the
        neighbour chose that as well); one that names no site of the file (a gateway
        whose ``site`` key is not its site's name) counts as entered here."""
        if headers is None and read_from in self._entries:
            return self._entries[read_from]
        entry: str | None = None
        if history_stream(read_from) is not None:
            if headers is not None:
                return self._claimed_entry(_header(headers, H_SITE))
        else:
            entry = source_entry(read_from)
            if entry not in self.entries:
                entry = self.site.name
        self._entries[read_from] = entry
        return entry

    def _claimed_entry(self, site: bytes | str | None) -> str:
        """The entry a history record's ``sl.site`` names, if it is a site of the file;
        else this site."""
        claimed = site.decode(errors="replace") if isinstance(site, bytes) else site
        return claimed if claimed in self.entries else self.site.name

    def _relay(
        self, stream_topic: str, read_from: str, headers: Sequence[tuple[str, Any]]
    ) -> str | None:
        """The relay topic of a canonical record: its entry site (:meth:`_entry`) and
        stream. A record of this site's ingress whose ``sl.site``
        names another site (a gateway's ``site`` key that is not this site's name) is
        logged once per ingress topic."""
        site = _header(headers, H_SITE)
        # the cache is keyed by what decides the answer, never by the header's text (a
        # neighbour that stamps each record with a new sl.site grew it without bound:
        # replication review N15): a history record's entry (a site of the file, or
        # this one), whether this site's own ingress names this site, or nothing
        claimed = site.decode(errors="replace") if isinstance(site, bytes) else site
        if history_stream(read_from) is not None:
            claim: str | bool | None = self._claimed_entry(site)
        elif "/" not in read_from:
            claim = claimed == self.site.name
        else:
            claim = None
        key = (stream_topic, read_from, claim)
        topic = self._relays.get(key)
        if key not in self._relays:
            if "/" not in read_from and claimed != self.site.name:
                log.warning(
                    "entry_site_mismatch",
                    site=self.site.name,
                    topic=read_from,
                    sl_site=claimed,
                    message="filed as entered here; is the gateway's site key this site's name?",
                )
            entry = self._entry(read_from, headers)
            topic = None if entry is None else relay_topic(entry, stream_topic[len("sl.") :])
            self._relays[key] = topic
        return topic

    # -- per batch ----------------------------------------------------------------------
    def process_batch(self, df: Any, batch_id: int) -> None:
        """``foreachBatch``: raise on any failure (Spark then replays the batch)."""
        if self.stopping.is_set():
            raise MergeError("merge is stopping; batch left for the next run")
        t0 = time.monotonic()
        if self._spark_seen is None:  # a query's first batch: planned after its start
            self._spark_seen = self._recreations
        # Arrow, not collect(): no Row objects; duplicates never leave Arrow buffers.
        # Outside the lock: the pullers write meanwhile (spark_core/pull.py); what the
        # ingest puller wrote already stays on the executors
        done = dict(self.state.offsets)
        if self.write_through is not None and (ends := self._oversized(df, batch_id, done)):
            # too big for the driver: written in slices of bounded bytes, each its own
            # transaction; what is left of the batch (nothing, or what came after) below
            self.totals.sliced += 1
            log.info(
                "merge_batch_sliced",
                site=self.site.name,
                query=self.query,
                batch=batch_id,
                partitions=len(ends),
            )
            self.write_through(ends)
            done = dict(self.state.offsets)
        table = batch_frame(unwritten(df, done)).toArrow()
        self.totals.largest_fetch_bytes = max(self.totals.largest_fetch_bytes, table.nbytes)
        batch = ArrowBatch(table)
        with self.busy:
            if self.stopping.is_set():
                raise MergeError("merge is stopping; batch left for the next run")
            stale = sorted(t for t, n in self._recreated.items() if n > self._spark_seen)
            if stale:
                batch = ArrowBatch(self._drop_recreated(table, stale, batch_id))
            self.write_batch(batch_id, batch, t0=t0)
            self._spark_seen = self._recreations
        if not self.ingest_puller:
            # no ingest puller's loop writes the relay index (merge.source_pattern): the
            # query's own batches do, when due, or its pending seqs grow in every marker
            # until the marker passes the record size limit (replication review N16).
            # The batch is committed: a Kafka that does not answer now (a broker being
            # replaced) leaves the seqs pending for the next batch, never fails the query
            try:
                self.write_index()
            except (KafkaClientError, MergeError) as exc:
                if isinstance(exc, MergeError) and exc.fatal:
                    raise
                log.warning("relay_index_failed", site=self.site.name, error=str(exc))

    def _drop_recreated(self, table: pa.Table, topics: Sequence[str], batch_id: int) -> pa.Table:
        """The batch without the rows of ``topics``, found recreated (their cursors
        dropped: :meth:`adopt_sources`) since the query planned it: rows of the former
        topic, or of the new one at the former one's offsets. Written, their offsets were
        the new topic's cursors, and the ingest puller skipped its first records, which
        only this site holds (review 9, finding 7). The puller reads the new topic from
        its start; the query's next batch fails on the changed offsets
        (``fail_on_data_loss``) and the site starts it afresh
        (:func:`reset_recreated_checkpoint`)."""
        kept = table.filter(pc.invert(pc.is_in(table.column("topic"), pa.array(list(topics)))))
        log.warning(
            "merge_batch_rows_dropped",
            site=self.site.name,
            query=self.query,
            batch=batch_id,
            topics=",".join(topics),
            rows=table.num_rows - kept.num_rows,
            message="source topics recreated while the batch was under way",
        )
        return kept

    def _oversized(
        self, df: Any, batch_id: int, done: Mapping[tuple[str, int], int]
    ) -> dict[tuple[str, int], int] | None:
        """Per source partition, the end (next offset) of what the batch has unwritten,
        when that is more than ``merge.max_batch_bytes``; None when it fits. The query's
        offset log says how many records the batch spans: a batch that cannot exceed the
        bound even at the largest record is not measured (no extra Spark job)."""
        budget = self.site.merge.max_batch_bytes
        checkpoint = self.site.query_checkpoint(self.query)
        start = spark_position(checkpoint, batch_id, df.sparkSession)
        end = spark_position(checkpoint, batch_id + 1, df.sparkSession)
        if end:
            most = sum(max(0, o - max(start.get(tp, 0), done.get(tp, 0))) for tp, o in end.items())
            if most * KAFKA_MAX_MESSAGE_BYTES <= budget:
                return None
        sizes = batch_sizes(unwritten(df, dict(done)))
        if sum(b for _, _, b, _ in sizes) <= budget:
            return None
        return {(t, p): last + 1 for t, p, _, last in sizes}

    def write_pulled(self, rows: Sequence[SourceRow], *, cursors: bool = True) -> BatchPlan:
        """Write what a feed read (a neighbour's relay topics, sources named by
        ``pulled_source``; the site's ingress): one transaction with the records, the
        ledger and the cursors, between the Spark batches (the Spark batch id stays as
        it was), together with the other feeds' batches waiting for the merge then
        (spark_core/merge_queue.py: group commit). ``cursors=False``: the rows' sources
        keep their cursors (a repair reads single ranges of a neighbour's canonical
        topic: spark_core/repair.py), in a transaction of their own."""
        if not cursors:
            with self.busy:
                if self.stopping.is_set():
                    raise MergeError("merge is stopping; pulled rows left for the next run")
                last = self.state.last_batch
                return self.write_batch(
                    -1 if last is None else last, RowBatch(rows), pulled=True, cursors=False
                )
        return self.written(self.enqueue(rows))

    def enqueue(self, rows: Sequence[SourceRow]) -> Waiting:
        """The first half of :meth:`write_pulled`: ``rows`` queued for the merge's next
        transaction (a loop of several feeds queues each one's batch, then waits for
        them: spark_core/feed_loop.py)."""
        return self._queue.add(rows)

    def written(self, mine: Waiting) -> BatchPlan:
        """The second half of :meth:`write_pulled`: the plan of the transaction that
        wrote ``mine`` (written now, with every batch waiting, if no earlier holder of
        the lock did), or its failure raised."""
        if mine.done:  # written with another's: no wait for the lock
            return mine.outcome()
        with self.busy:
            while not mine.done:  # written by an earlier holder of the lock, or now
                group = self._queue.take()
                if not group:  # never: whoever takes a batch settles it
                    raise MergeError("a pulled batch left the merge's queue unwritten")
                if self.stopping.is_set():
                    stopping = MergeError("merge is stopping; pulled rows left for the next run")
                    settle(group, mine, error=stopping)
                    continue
                last = self.state.last_batch
                batch = RowBatch([r for w in group for r in w.rows])
                try:
                    plan = self.write_batch(-1 if last is None else last, batch, pulled=True)
                except BaseException as exc:  # every batch of the transaction failed
                    # several batches: one of them may be the cause (not when fatal:
                    # fenced, another merge took over; every batch would meet it alone)
                    fatal = bool(getattr(exc, "fatal", False))
                    if len(group) > 1 and isinstance(exc, Exception) and not fatal:
                        self._write_apart(group, exc)
                        continue
                    settle(group, mine, error=exc)
                    if not isinstance(exc, Exception):
                        raise
                    continue
                settle(group, mine, plan)
        return mine.outcome()

    def _write_apart(self, group: Sequence[Waiting], exc: Exception) -> None:
        """A transaction of several feeds' batches failed: each batch again in a
        transaction of its own, so that one batch the merge cannot write (a neighbour's
        record the site's Kafka refuses) fails its own feed and not every feed whose
        batch shared its transaction (review finding 11: a site then routed around
        every neighbour, not the one). Under the merge's lock."""
        log.warning(
            "merge_group_split", site=self.site.name, batches=len(group), error=str(exc)[:500]
        )
        for w in group:
            if self.stopping.is_set():
                settle([w], w, error=MergeError("merge is stopping; pulled rows left"))
                continue
            last = self.state.last_batch
            try:
                plan = self.write_batch(-1 if last is None else last, RowBatch(w.rows), pulled=True)
            except Exception as alone:
                settle([w], w, error=alone)
            else:
                settle([w], w, plan)

    def ready(self) -> MergeState:
        """The state, loaded (prepared) if it is not: what a puller starts from."""
        with self.busy:
            if self._producer is None:
                self.prepare()
            return self.state

    def write_rows(self, batch_id: int, rows: Sequence[SourceRow]) -> BatchPlan:
        """``write_batch`` for rows already in Python (tests, tools)."""
        return self.write_batch(batch_id, RowBatch(rows))

    def write_batch(
        self,
        batch_id: int,
        batch: SourceBatch,
        *,
        t0: float | None = None,
        pulled: bool = False,
        cursors: bool = True,
    ) -> BatchPlan:
        t1 = time.monotonic()
        t0 = t1 if t0 is None else t0
        if self._producer is None:
            self.prepare()  # after a failed transaction: new producer, state from Kafka
        if self.ownership is not None and self.ownership.refresh():
            self._ensure_streams(self.streams)  # a new customer's topics
        replay = (
            not pulled and self.state.last_batch is not None and batch_id <= self.state.last_batch
        )
        with cyclic_gc_paused():
            keys = None if self.ship_keys is None else self.ship_keys.current()
            plan = plan_batch(
                batch,
                self.state,
                self._entry if self.entries else None,
                keys,
                self.max_ranges,
                self.owns,
            )
            self._ensure_streams(plan.streams)
            self._misrouted(plan)
            if not cursors:
                plan.offsets.clear()
            t2 = time.monotonic()
            before = dict(self.state.offsets)  # what the batch before this one committed
            customer = 0
            if plan.canonical or plan.again or plan.dead or plan.offsets:
                customer = self._commit(batch_id, plan)
            if not (replay or pulled) and self.site.merge.purge_sources:
                # spark_core/purge.py: why one batch behind, and never past the Spark
                # query's own position (the ingest puller commits ahead of it)
                at = spark_position(self.site.query_checkpoint(self.query), batch_id, self.spark)
                self._purger.purge(self.purgeable(below(before, at)))
        t3 = time.monotonic()
        self.totals.fetch_s += t1 - t0
        self.totals.plan_s += t2 - t1
        self.totals.txn_s += t3 - t2
        self._account(
            batch_id, plan, t3 - t0, replay, (t1 - t0, t2 - t1, t3 - t2), customer, pulled
        )
        return plan

    def forget(self, lost: Mapping[Source, RangeSet]) -> dict[Source, RangeSet]:
        """Stop holding ``lost`` (per origin and stream, seqs whose records this site's
        canonical topic lost before its retention: spark_core/repair.py ``SelfCheck``):
        one transaction with the ledger entries less those seqs, so that the site lacks
        them again (its neighbours' repair offers them, and the merge writes them once
        more). An entry stays within the bound on holes: what would split it past the
        bound is still held (:func:`~spark_core.merge_state.forgettable`; logged as
        ``forget_bounded``). Returns what was held and is forgotten."""
        with self.busy:
            if self.stopping.is_set():
                raise MergeError("merge is stopping; nothing forgotten")
            if self._producer is None:
                self.prepare()
            forgotten: dict[Source, RangeSet] = {}
            ledger: dict[Source, RangeSet] = {}
            kept = 0
            for source, seqs in lost.items():
                held = self.state.held_for(source)
                gone = forgettable(held, seqs, self.max_ranges)
                kept += seqs.difference(seqs.difference(held)).count() - gone.count()
                if gone:
                    forgotten[source] = gone
                    ledger[source] = held.difference(gone)
            if kept:
                log.warning(
                    "forget_bounded",
                    site=self.site.name,
                    query=self.query,
                    kept=kept,
                    message="seqs lost from the canonical topic still held: forgetting "
                    "them would pass the bound on holes",
                )
            if not ledger:
                return {}
            p = self._producer
            assert p is not None
            try:
                with p.transaction():
                    for (origin, stream), held in ledger.items():
                        p.produce(LEDGER_TOPIC, *encode_entry(origin, stream, held), None)
            except KafkaTransactionError as exc:
                self._fail(exc)
            self.state.held.update(ledger)
            return forgotten

    def adopt_sources(self, ids: Mapping[str, str]) -> list[str]:
        """The site's own source topics as described now (topic -> its id; "" or absent:
        not there). One whose id differs from the id the marker's cursors were taken in
        was deleted and created again under the site (review N11): its cursors are
        dropped, so its records are read from its start (the ledger drops what was
        written already), and what was purged of it is forgotten. A topic first seen is
        adopted as it is. One marker transaction when anything changed; returns the
        topics found recreated."""
        with self.busy:
            if self._producer is None:
                self.prepare()
            known = self.state.source_ids
            changed = {t: i for t, i in ids.items() if i and known.get(t) != i}
            if not changed:
                return []
            recreated = sorted(t for t in changed if t in known)
            if recreated:  # what a Spark batch under way read of them is not written
                self._recreations += 1
                self._recreated.update(dict.fromkeys(recreated, self._recreations))
            offsets = {tp: o for tp, o in self.state.offsets.items() if tp[0] not in recreated}
            state = self.state.carried(
                offsets=offsets, index=self.state.index, source_ids={**known, **changed}
            )
            docs = self._marker_between(state)
            p = self._producer
            assert p is not None
            try:
                with p.transaction():
                    self._produce_marker(docs)
            except KafkaTransactionError as exc:
                self._fail(exc)
            self.state.offsets, self.state.source_ids = offsets, state.source_ids
            self.state.marker_docs = docs
        for topic in recreated:
            log.warning(
                "source_topic_recreated",
                site=self.site.name,
                query=self.query,
                topic=topic,
                was=known[topic],
                now=changed[topic],
            )
        self._purger.forget(recreated)
        return recreated

    def _marker_between(self, state: MergeState) -> dict[bytes, Any]:
        """The marker of a transaction between the batches (no records written: the
        relay index, a recreated source): ``state`` under the last batch's id."""
        last = self.state.last_batch
        return state.marker_records(
            self.site.name,
            self.query,
            -1 if last is None else last,
            {"written": 0, "dead": 0, "ts_ms": int(time.time() * 1000)},
        )

    def _produce_marker(self, docs: Mapping[bytes, Any]) -> None:
        """Into the open transaction: the marker ``docs`` as far as it differs from what
        Kafka holds (``MergeState.marker_changes``: the head, what moved, a tombstone per
        record gone). The caller sets ``state.marker_docs`` to ``docs`` once committed."""
        p = self._producer
        assert p is not None
        for key, value in self.state.marker_changes(docs):
            p.produce(MARKER_TOPIC, key, value, None)

    def write_redriven(
        self,
        rows: Sequence[SourceRow],
        ends: Mapping[tuple[str, int], int],
        finished: tuple[str | None, int] | None,
    ) -> BatchPlan:
        """Write dead letters tried again (spark_core/redrive.py): ``rows`` planned with
        the ship keys in force now, as pulled records (proved, the first copy wins, the
        still refused dead-lettered again); the re-drive's offsets move to ``ends``
        (past every dead letter read, retryable or not). With ``finished``, the pass
        reached its ends: ``(keys mark, commit)``, the marker says every dead letter
        before them was tried under those keys, and the records held back at the bound
        on holes up to that commit were tried (those refused again are held back anew:
        :func:`~spark_core.merge_state.held_back_after`). One transaction, between the
        batches."""
        with self.busy:
            if self.stopping.is_set():
                raise MergeError("merge is stopping; dead letters left for the next re-drive")
            if self._producer is None:
                self.prepare()
            keys = None if self.ship_keys is None else self.ship_keys.current()
            with cyclic_gc_paused():
                entry = self._entry if self.entries else None
                plan = plan_batch(
                    RowBatch(rows), self.state, entry, keys, self.max_ranges, self.owns
                )
            plan.offsets.update(ends)
            self._ensure_streams(plan.streams)
            last = self.state.last_batch
            self._commit(-1 if last is None else last, plan, finished, tried_seqs(rows))
            self.totals.written += len(plan.canonical)
            return plan

    def _commit(
        self,
        batch_id: int,
        plan: BatchPlan,
        finished: tuple[str | None, int] | None = None,
        tried: Mapping[Source, RangeSet] | None = None,
    ) -> int:
        """One transaction: the plan's records, their copies in the relay and customer
        topics, the ledger, the marker (with ``tried``, a re-drive's step: the seqs it
        planned again; with ``finished``, one that reached its ends:
        :meth:`write_redriven`). Returns how many went to customer topics."""
        p = self._producer
        assert p is not None
        offsets = dict(self.state.offsets)
        offsets.update(plan.offsets)
        if any(k not in self.state.offsets for k in plan.offsets):  # a source read first
            gone = superseded_sources({src for src, _ in offsets}, {src for src, _ in plan.offsets})
            offsets = {k: v for k, v in offsets.items() if k[0] not in gone}
        keys_mark = self.state.redrive_keys if finished is None else finished[0]
        commit = self.commits + 1
        held_back = held_back_after(
            self.state,
            plan,
            commit,
            self.max_ranges,
            tried=tried,
            since=None if finished is None else finished[1],
            now=time.monotonic(),
        )
        held_back_all = self.state.held_back_all and finished is None
        marker_state = self.state.carried(
            offsets=offsets,
            redrive_keys=keys_mark,
            held_back=held_back,
            held_back_all=held_back_all,
        )
        extra: dict[str, object] = {
            "written": len(plan.canonical),
            "dead": len(plan.dead),
            "ts_ms": int(time.time() * 1000),
        }
        restart = False
        marker_state.index, restart = self._bounded(self._index_with(plan.relayed_now, plan))
        docs = marker_state.marker_records(self.site.name, self.query, batch_id, extra)
        relay = self._relay if self.entries else None
        customer = self._customer if self.ownership is not None else None
        to_customers = 0
        try:
            with p.transaction():
                for (topic, key, value, headers), read_from in zip(
                    plan.canonical, plan.read_from, strict=True
                ):
                    p.produce(topic, key, value, headers)
                    if relay is not None and (into := relay(topic, read_from, headers)):
                        p.produce(into, key, value, headers)
                    if customer is not None and (owned := customer(topic, key, headers)):
                        p.produce(owned, key, value, headers)
                        to_customers += 1
                if relay is not None:
                    for (topic, key, value, headers), read_from in zip(
                        plan.again, plan.again_from, strict=True
                    ):
                        if into := relay(topic, read_from, headers):
                            p.produce(into, key, value, headers)
                for topic, key, value, headers in plan.dead:
                    p.produce(topic, key, value, headers)
                for (origin, stream), held in plan.ledger.items():
                    k, v = encode_entry(origin, stream, held)
                    p.produce(LEDGER_TOPIC, k, v, None)
                for relayed, seqs in plan.relayed.items():
                    p.produce(RELAYED_TOPIC, *encode_relayed(relayed, seqs), None)
                self._produce_marker(docs)
        except KafkaTransactionError as exc:
            self._fail(exc)
        # committed: the in-memory state follows what Kafka now holds
        self.state.marker_docs = docs
        self.totals.customer += to_customers
        self.state.held.update(plan.ledger)
        self.state.relayed.update(plan.relayed)
        self.state.offsets = offsets
        self.state.last_batch = batch_id
        self.state.index = marker_state.index
        self.state.redrive_keys = keys_mark
        self.state.held_back, self.state.held_back_all = held_back, held_back_all
        self.commits = commit
        self.reindex = False  # the new tails are in the marker now
        if restart:  # the dropped tails start again at their topics' ends
            try:
                self._start_index()
            except MergeError:
                self._close_producer()  # the next batch prepares again: tails from Kafka
                raise
        return to_customers

    # -- the relay index (spark_core/relay_index.py) -------------------------------------
    @property
    def relay_topics(self) -> list[str]:
        """The relay topics this merge writes."""
        return sorted(relay_topic(e, s) for e in self.entries for s in self.streams)

    @property
    def indexed_topics(self) -> list[str]:
        """The topics whose seqs this merge indexes: its relay topics (a neighbour's
        first read of one) and its canonical topics (a neighbour's repair by identity:
        spark_core/repair.py)."""
        return [*self.relay_topics, *sorted(canonical_topic(s) for s in self.streams)]

    def _start_index(self) -> None:
        """A relay topic the marker has no tail for gets one at its end now: what it
        holds already (written before the index existed) is named by no segment. A tail
        of a topic this merge no longer writes is dropped, and after the site's merges
        were split otherwise (:attr:`reindex`) every tail starts again at its topic's
        end: a segment from a tail another merge wrote past would span that merge's
        records and name only this one's seqs, and a reader's walk would skip them
        (replication review N7). What lies between is named by no segment: a reader
        reads it."""
        mine = set(self.indexed_topics)
        for topic in [t for t in self.state.index if t not in mine]:
            del self.state.index[topic]
        if self.reindex:
            missing = list(self.indexed_topics)
        else:
            missing = [t for t in self.indexed_topics if t not in self.state.index]
        try:
            marks = self._relay_marks(missing, committed=False)
        except KafkaClientError as exc:
            raise MergeError(f"cannot read where the relay topics end: {exc}") from exc
        for topic, (topic_id, ends) in marks.items():
            self.state.index[topic] = Tail(topic_id, ends)

    def admin(self) -> Admin:
        """The merge's Kafka admin client (made once: under the merge's lock, or by the
        thread that holds its other uses off)."""
        if self._admin is None:
            self._admin = Admin(self.site.kafka)
        return self._admin

    def _relay_marks(
        self, topics: Sequence[str], *, committed: bool = True
    ) -> dict[str, tuple[str, dict[int, int]]]:
        """Per topic of ``topics``, its id and where each partition ends now ("" and no
        partitions for a topic that does not exist yet): its last stable offset, or
        with ``committed=False`` its high watermark. The index takes the high
        watermark: a transaction's commit returns before the broker has written its
        markers, and the last stable offset asked right after it can still end before
        that transaction's records; a segment that ended there named seqs whose records
        lay in the next one (a repair read the wrong offsets: CI found it). No
        transaction of the merge is open while it asks (its lock), and the merge alone
        writes these topics, so everything below the high watermark is committed or
        aborted."""
        if not topics:
            return {}
        admin = self.admin()
        described = admin.describe(topics)
        parts = [(t, p.id) for t, desc in described.items() for p in desc.partitions]
        ends = admin.offsets(parts, OffsetSpec.latest(), committed=committed)
        marks: dict[str, tuple[str, dict[int, int]]] = {t: ("", {}) for t in topics}
        for t, desc in described.items():
            marks[t] = (str(desc.topic_id), {p.id: ends[(t, p.id)].offset for p in desc.partitions})
        return marks

    def _index_with(self, relayed: Mapping[Relayed, list[int]], plan: BatchPlan) -> dict[str, Tail]:
        """The tails once ``relayed`` and the plan's canonical records are written (the
        state's are left as they are)."""
        index = dict(self.state.index)
        for (entry, origin, stream), seqs in relayed.items():
            topic = relay_topic(entry, stream)
            tail = index[topic] = (index.get(topic) or Tail()).copy()
            tail.pending.setdefault(origin, RangeSet()).update(RangeSet.from_seqs(seqs))
        for (origin, stream), held in plan.ledger.items():
            new = held.difference(self.state.held_for((origin, stream)))
            if new:
                topic = canonical_topic(stream)
                tail = index[topic] = (index.get(topic) or Tail()).copy()
                tail.pending.setdefault(origin, RangeSet()).update(new)
        return index

    def _bounded(self, index: dict[str, Tail]) -> tuple[dict[str, Tail], bool]:
        """The tails the marker keeps, their pending seqs bounded, and whether some
        were dropped. A tail is rewritten in every transaction that relays to its topic
        (its own record of the marker), and pending seqs of many origins (10,000 ships
        in 5 s) passed the record size limit, after which every transaction failed
        (replication review N9). Past
        :data:`PENDING_EARLY_RANGES` the index is written at the next turn instead of
        when due; past :data:`PENDING_MAX_RANGES` the tails with pending seqs are
        dropped, and once the transaction committed they start again at their topics'
        ends (:meth:`_start_index`): what lies between is named by no segment, and a
        reader reads it."""
        pending = sum(len(r) for t in index.values() for r in t.pending.values())
        if pending > PENDING_EARLY_RANGES:
            self._index_due = 0.0
        if pending <= PENDING_MAX_RANGES:
            return index, False
        log.warning(
            "relay_index_restarted", site=self.site.name, query=self.query, pending_ranges=pending
        )
        self.totals.index_restarts += 1
        return {t: tail for t, tail in index.items() if not tail.pending}, True

    def write_index(self) -> int:
        """Every :data:`INDEX_EVERY_S`, one segment per relay topic with pending seqs,
        all of a round in one record of each index (``encode_round``: as many as its
        size limit needs), in a transaction of its own with the marker. Returns the
        segments written."""
        if time.monotonic() < self._index_due:
            return 0
        with self.busy:
            if self._producer is None or self.stopping.is_set():
                return 0
            due = [t for t, tail in self.state.index.items() if tail.pending]
            if not due:
                return 0  # not due later for it: the next pending seqs are written at once
            self._index_due = time.monotonic() + INDEX_EVERY_S
            index = dict(self.state.index)
            segments: dict[str, list[SegmentOf]] = {}  # per index topic
            try:
                marks = self._relay_marks(due, committed=False)
            except KafkaClientError:
                # a Kafka that does not answer (a broker lost): the seqs stay pending,
                # and the merge's lock is not held for the timeout again for a minute
                self._index_due = time.monotonic() + INDEX_BACKOFF_S
                raise
            for topic, (topic_id, ends) in marks.items():
                if not topic_id:
                    continue  # deleted under the merge: its seqs stay pending
                tail = index[topic]
                start = tail.to if tail.topic_id == topic_id else {}
                parts = {p: (start.get(p, 0), end) for p, end in ends.items()}
                segment = (topic, topic_id, parts, tail.pending)
                segments.setdefault(index_topic(topic), []).append(segment)
                index[topic] = Tail(topic_id, ends)
            docs = self._marker_between(self.state.carried(offsets=self.state.offsets, index=index))
            p = self._producer
            try:
                with p.transaction():
                    writer = marker_key(self.site.name, self.query)
                    for into, segs in segments.items():
                        for key, value in encode_round(writer, segs):
                            p.produce(into, key, value, None)
                    self._produce_marker(docs)
            except KafkaTransactionError as exc:
                self._fail(exc)
            self.state.index = index
            self.state.marker_docs = docs
            self.reindex = False
            written = sum(len(segs) for segs in segments.values())
            self.totals.index_segments += written
            return written

    def _fail(self, exc: KafkaTransactionError) -> NoReturn:
        """The transaction did not commit (TransactionalProducer ended it as librdkafka
        defines); the merge's reaction, then raise (Spark replays the batch):
        - fenced (another merge of this site took over): keep the fenced producer, so
          no later batch re-initialises it (which would fence the other merge back);
          every batch fails with the same error until this merge is stopped;
        - aborted, broken, or a commit whose outcome is unknown: drop the producer; the
          next batch re-creates it (``init_transactions`` settles what was left) and
          reloads the state from what Kafka committed."""
        self.totals.failures += 1
        if self.fenced is not None:
            raise MergeError(self.fenced, fatal=True) from exc
        if isinstance(exc, Fenced):
            message = (
                f"fenced: another merge of site {self.site.name} took over "
                f"(transactional.id {self.transactional_id}); this one no longer "
                f"writes: stop it ({exc})"
            )
            self.fenced = message
            log.error("merge_fenced", site=self.site.name, error=str(exc))
            self.write_status("fenced", message)
            raise MergeError(message, fatal=True) from exc
        # whatever happened, start the next batch from what Kafka committed
        self._close_producer()
        log.error(
            "merge_batch_failed", site=self.site.name, outcome=type(exc).__name__, error=str(exc)
        )
        raise MergeError(f"merge transaction failed: {exc}") from exc

    def _account(
        self,
        batch_id: int,
        plan: BatchPlan,
        dt: float,
        replay: bool,
        split: tuple[float, float, float],
        customer: int = 0,
        pulled: bool = False,
    ) -> None:
        t = self.totals
        t.batches += 1
        t.pulled += pulled
        t.input += plan.input
        t.written += len(plan.canonical)
        t.duplicates += plan.duplicates
        t.dead += len(plan.dead)
        t.unproved += plan.unproved
        for topic, _, _, headers in plan.dead:
            where = f"{topic.removeprefix('sl.dead.')}:{dead_cause(headers) or CONTRACT}"
            t.quarantined[where] = t.quarantined.get(where, 0) + 1
        t.skipped += plan.skipped
        t.foreign += plan.foreign
        t.relayed_again += len(plan.again)
        self.last = {
            "batch_id": batch_id,
            "input": plan.input,
            "written": len(plan.canonical),
            "duplicates": plan.duplicates,
            "dead": len(plan.dead),
            "unproved": plan.unproved,
            "skipped": plan.skipped,
            "foreign": plan.foreign,
            "relayed_again": len(plan.again),
            "customer": customer,
            "replay": replay,
            "pulled": pulled,
            "duration_ms": round(dt * 1000, 1),
        }
        fetch_s, plan_s, txn_s = split
        log.info(
            "merge_batch",
            site=self.site.name,
            batch=batch_id,
            pulled=str(pulled).lower(),
            input=plan.input,
            written=len(plan.canonical),
            duplicates=plan.duplicates,
            dead=len(plan.dead),
            unproved=plan.unproved,
            skipped=plan.skipped,
            relayed_again=len(plan.again),
            customer=customer,
            replay=str(replay).lower(),
            sources=len(self.state.held),
            ranges=self.state.ranges(),
            duration_ms=round(dt * 1000, 1),
            fetch_ms=round(fetch_s * 1000, 1),
            plan_ms=round(plan_s * 1000, 1),
            txn_ms=round(txn_s * 1000, 1),
        )
        self.write_status("running")

    # -- status and shutdown -------------------------------------------------------------
    def write_status(self, state: str, error: str | None = None) -> None:
        """``<state_dir>/<query>.status.json``, written atomically."""
        data = {
            "site": self.site.name,
            "query": self.query,
            "state": state,
            "error": error,
            "pid": os.getpid(),
            "updated_at": time.time(),
            "last_batch": self.last,
            "totals": asdict(self.totals),
            "state_sources": len(self.state.held),
            "state_ranges": self.state.ranges(),
        }
        if self.ownership is not None:
            data["customers"] = {
                "file": str(self.ownership.path),
                "customers": len(self.ownership.customers.customers),
                "reloads": self.ownership.reloads,
                "reload_errors": self.ownership.reload_errors,
            }
        write_json_atomic(self.status_path, data, indent=1)

    def _close_producer(self) -> None:
        p, self._producer = self._producer, None
        if p is not None:
            p.close(1)

    def close(self) -> None:
        self._close_producer()


def _header(headers: Sequence[tuple[str, Any]], name: str) -> Any:
    """A contract header's value: at its place in :data:`HEADER_LAYOUT` (where the merge
    writes it; no scan on the hot path), else wherever it is; None if absent."""
    i = HEADER_LAYOUT.index(name)
    if len(headers) > i and headers[i][0] == name:
        return headers[i][1]
    return next((v for k, v in headers if k == name), None)


def source_pattern(streams: Iterable[str]) -> str:
    """Java regex of the ingress topics of ``streams``."""
    alt = "|".join(sorted(streams))
    return rf"sl\.ingress\.({alt})"


def _read_stamp(stamp: Path) -> Any:
    """What the application wrote last in one of its own stamps in ``state_dir``
    (:func:`reset_changed_checkpoints` and the two after it): None when there is none
    yet, ``{}`` when it cannot be read (a write cut short: the checkpoint is then
    started afresh, which the marker's cursors make harmless)."""
    try:
        return json.loads(stamp.read_text())
    except FileNotFoundError:
        return None
    except ValueError:
        return {}


def reset_changed_checkpoints(
    site: SiteConfig, merges: Sequence[Merger], spark: Any = None
) -> None:
    """Start the merges' queries afresh when the way the site's streams are split among
    its merges changed since the last run (a stream added, removed, or moved between
    the urgent merge and the other): Spark fails a query whose checkpoint holds
    partitions its pattern no longer matches ("... are gone. Some data may have been
    missed"), on every start, and an old checkpoint of a merge that comes back points
    below what the other merge purged meanwhile. A fresh start is harmless: the
    marker's offsets, committed with the records, skip what was merged. The split is
    kept in ``<state_dir>/merges.json``; a checkpoint at a URL is dropped through
    ``spark``'s Hadoop filesystem."""
    layout = {m.query: m.source_pattern for m in merges}
    stamp = site.state_path / "merges.json"
    old = _read_stamp(stamp)
    if old == layout:
        return
    if old is not None:
        for m in merges:
            m.reindex = True
        for query in sorted(set(old) | set(layout)):
            path = site.query_checkpoint(query)
            if location.exists(spark, path):
                log.warning(
                    "merge_checkpoint_reset",
                    site=site.name,
                    query=query,
                    sources=layout.get(query),
                    was=old.get(query) if isinstance(old, dict) else None,
                )
                location.delete(spark, path)
    write_json_atomic(stamp, layout)


def reset_recreated_checkpoint(merger: Merger, spark: Any = None) -> None:
    """Before the merge's query starts: its own source topics as they are now (its
    ingress topics, and any local topic its cursors name), adopted by the merge
    (:meth:`Merger.adopt_sources`: a recreated one is read from its start), and the
    query started afresh when one of them is not the topic its checkpoint was taken in
    (review N11). Spark keys its offsets by topic name: a topic deleted and created
    again under a running query fails it on every start with ``fail_on_data_loss``
    ("offset was changed"), or skips the new topic's first records without. The ids
    each start saw are kept in ``<state_dir>/<query>.sources.json``."""
    site = merger.site
    topics = {ingress_topic(s) for s in merger.streams}
    topics |= {t for t, _ in merger.state.offsets if "/" not in t}
    described = Admin(site.kafka).describe(topics, f" at {site.name}")
    ids = {t: str(d.topic_id) for t, d in described.items()}
    merger.adopt_sources(ids)
    merger._spark_seen = None  # the query (re)starts: its first batch is planned after this
    stamp = site.state_path / f"{merger.query}.sources.json"
    old = _read_stamp(stamp)
    old = old if isinstance(old, dict) else {}
    recreated = sorted(t for t, i in ids.items() if old.get(t) not in (None, i))
    path = site.query_checkpoint(merger.query)
    if recreated and location.exists(spark, path):
        log.warning(
            "merge_checkpoint_reset",
            site=site.name,
            query=merger.query,
            recreated=",".join(recreated),
        )
        location.delete(spark, path)
    write_json_atomic(stamp, {**old, **ids})


def reset_reassigned_checkpoint(
    merger: Merger, assigned: Mapping[str, Sequence[int]], spark: Any = None
) -> None:
    """A shard's query started afresh when the partitions it reads changed since its
    last start (partitions added to an ingress topic): Spark's ``assign`` source fails
    on a checkpoint of other partitions. Harmless, as for a change of the merges' split
    (:func:`reset_changed_checkpoints`): the marker's cursors skip what was merged. The
    partitions of each start are kept in ``<state_dir>/<query>.assign.json``."""
    site = merger.site
    now = {t: list(p) for t, p in sorted(assigned.items())}
    stamp = site.state_path / f"{merger.query}.assign.json"
    old = _read_stamp(stamp)
    path = site.query_checkpoint(merger.query)
    if old is not None and old != now and location.exists(spark, path):
        log.warning(
            "merge_checkpoint_reset",
            site=site.name,
            query=merger.query,
            partitions=json.dumps(now, separators=(",", ":")),
            was=json.dumps(old, separators=(",", ":")),
        )
        location.delete(spark, path)
    write_json_atomic(stamp, now)


def start_merge(spark: Any, merger: Merger, *, available_now: bool = False) -> Any:
    """Start the merge query; returns the StreamingQuery."""
    site = merger.site
    m = site.merge
    with merger.busy:  # a puller may be writing through this merger
        merger.prepare()
    merger.spark = spark
    reset_recreated_checkpoint(merger, spark)
    if merger.shard is None:
        source = ("subscribePattern", merger.source_pattern)
    else:  # a shard: the partitions of its origins
        assigned = merger.assignment()
        reset_reassigned_checkpoint(merger, assigned, spark)
        source = ("assign", json.dumps(assigned, sort_keys=True))
    df = (
        spark.readStream.format("kafka")
        .options(**site.kafka.spark_options(), **m.source_options())
        # its consumers' group and client ids name the application and site
        .option("groupIdPrefix", f"shorelink-spark-{site.name}")
        .option(*source)
        .option("includeHeaders", "true")
        .option("startingOffsets", "earliest")
        .option("kafka.isolation.level", "read_committed")
        .option("maxOffsetsPerTrigger", str(m.max_offsets_per_trigger))
        .option("failOnDataLoss", str(m.fail_on_data_loss).lower())
        .load()
    )
    writer = (
        df.writeStream.queryName(f"{merger.query}-{site.name}")
        .foreachBatch(merger.process_batch)
        .option("checkpointLocation", str(site.query_checkpoint(merger.query)))
    )
    # with an ingest puller (set by the replicator) the query is the backstop
    every = m.backstop_interval_s if merger.ingest_puller else site.trigger_interval_s
    return trigger(writer, every, available_now).start()
