"""What the merge has already written, rebuilt from Kafka (the source of truth), and
the pure decision of what a batch adds to it (:func:`plan_batch`).

Three compacted topics, all written only inside the merge's Kafka transactions:
- ``sl.ledger``: ``origin/stream`` -> the seqs in the canonical topic (the dedup state);
- ``sl.merge.marker``: ``<site>/<query>`` -> the head: the last committed batch's
  Spark batch id, the re-drive's mark, the sources held back; ``<site>/<query>/source/
  <source>`` -> per partition of that source the next offset not yet handled, and its
  topic id; ``<site>/<query>/tail/<topic>`` -> where the relay index of a topic the
  merge writes stands, ``<site>/<query>/pending/<topic>/<origin>`` -> the seqs of
  ``origin`` written there since (spark_core/relay_index.py). Each keyed record is written by the
  transaction that moved it, beside the records it accounts for, so a transaction's
  marker bytes do not grow with the number of sources (fleet issue, item 2);
- ``sl.merge.relayed``: ``entry/origin/stream`` -> the seqs written to
  ``sl.relay.<entry>.<stream>`` (at a site some other site pulls from).

Both are read with ``read_committed`` at start-up (and after any failed transaction), so
the state is exactly what committed transactions wrote, whatever Spark's checkpoint says.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

from shorelink.boundary import boundary
from shorelink.contract import (
    DEAD_UNKNOWN_TOPIC,
    H_ENTERED,
    H_MQTT_TOPIC,
    H_ORIGIN,
    H_PROOF,
    H_SEQ,
    H_STREAM,
    LEDGER_TOPIC,
    MARKER_TOPIC,
    MAX_RECORD_BYTES,
    RELAYED_TOPIC,
    Record,
    canonical_topic,
    dead_topic,
    marker_key,
    record_bytes,
)
from shorelink.errors import ContractError
from shorelink.fleet.entry import FLEET_ORIGIN
from shorelink.identity import check_name
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.errors import KafkaClientError
from shorelink.kafka.reading import read_to_end
from shorelink.ledger import MAX_HOLDINGS_RANGES, decode_entry
from shorelink.proof import ShipKeys
from shorelink.ranges import RangeSet
from spark_core.errors import SparkCoreError
from spark_core.quarantine import (
    CONTRACT,
    H_DEAD_CAUSE,
    H_DEAD_REASON,
    H_DEAD_SOURCE,
    HOLES,
    TOO_LARGE,
    cause_of,
)
from spark_core.relay_index import Tail, dump_tail, load_tail, load_tails

__all__ = [
    "HOLES_BACKOFF_MAX_S",
    "HOLES_BACKOFF_S",
    "HOLES_ROOM",
    "MARKER_FORM",
    "BatchPlan",
    "EntryOf",
    "HeldBack",
    "MergeError",
    "MergeState",
    "RowBatch",
    "SourceBatch",
    "SourceRow",
    "admissible",
    "decode_relayed",
    "encode_relayed",
    "forgettable",
    "held_back_after",
    "history_stream",
    "plan_batch",
    "pulled_source",
    "source_entry",
    "source_stream",
    "superseded_sources",
    "takeable",
    "topic_stream",
    "tried_seqs",
]

Source = tuple[str, str]  # (origin, stream)
#: sources held back at the bound on holes that a marker names one by one (about 30
#: bytes each); past it the marker says ``*``: a merge that starts from it tries every
#: dead letter at the bound once (spark_core/redrive.py) and knows them one by one again
HELD_BACK_MAX = 1024
#: a source held back at the bound on holes whose ledger entry holds at most this share
#: of the bound has room for every record held back (a quarter of the bound), not for
#: one at a time: one pass then, not one per hole filled
HOLES_ROOM = 0.75
#: a pass that ended with records of a source still looking takeable (they were not:
#: another one took the room, or their dead letters are gone) tries them again only
#: after this, doubling while it happens again, up to the cap
HOLES_BACKOFF_S = 60.0
HOLES_BACKOFF_MAX_S = 3600.0
#: the head of a marker keyed per source says so (``"form"``); a head without it holds
#: the whole marker (every cursor and tail), as merges before it wrote
MARKER_FORM = "keyed"
#: the parts of a marker's keys under its head: a source's cursors, a topic's index
#: tail, an origin's seqs pending in a topic's index
MARKER_SOURCE = "source"
MARKER_TAIL = "tail"
MARKER_PENDING = "pending"
TopicPart = tuple[str, int]  # (topic, partition)
Relayed = tuple[str, str, str]  # (entry, origin, stream)


class MergeError(SparkCoreError):
    """The merge could not write a batch (nothing of it is visible), or is fenced."""

    retryable = True

    def __init__(self, message: str, *, fatal: bool = False) -> None:
        super().__init__(message, retryable=not fatal)
        self.fatal = fatal


@dataclass(frozen=True)
class HeldBack:
    """A source whose records were quarantined at the bound on holes and are not taken
    yet: which, and what the re-drive made of them last (spark_core/redrive.py)."""

    #: the merge's commit that last quarantined one of them (0: read from the marker)
    commit: int
    #: their seqs, less those tried again since and those the entry holds now
    seqs: RangeSet
    #: read from the marker, which names the source only: which seqs is not known, and
    #: the next pass tries every dead letter at the bound once
    unknown: bool = False
    #: of ``seqs``, those that looked takeable when the last pass ended (a prediction
    #: that failed): no reason for another pass before ``due`` (monotonic seconds)
    looked: RangeSet = field(default_factory=RangeSet)
    due: float = 0.0
    #: the back-off that set ``due``: doubles while passes end with seqs looking takeable
    backoff: float = 0.0


@dataclass
class MergeState:
    """Per ``(origin, stream)`` the seqs written; per source partition the next offset
    not yet handled by a committed batch; the last committed batch id."""

    held: dict[Source, RangeSet] = field(default_factory=dict)
    offsets: dict[TopicPart, int] = field(default_factory=dict)
    last_batch: int | None = None
    #: per (entry, origin, stream) the seqs written to ``sl.relay.<entry>.<stream>``
    relayed: dict[Relayed, RangeSet] = field(default_factory=dict)
    #: per relay topic this merge writes, where its index stands (kept in the marker:
    #: spark_core/relay_index.py)
    index: dict[str, Tail] = field(default_factory=dict)
    #: the fingerprint of the ship keys under which the dead letters from the re-drive's
    #: offsets on were refused (spark_core/redrive.py; None: never re-driven)
    redrive_keys: str | None = None
    #: per (origin, stream), its records quarantined at the bound on holes and not taken
    #: since (:class:`HeldBack`): the re-drive tries them once some can be taken
    #: (spark_core/redrive.py). The marker names the sources only; past
    #: :data:`HELD_BACK_MAX` of them it says ``*`` (read: ``held_back_all``)
    held_back: dict[Source, HeldBack] = field(default_factory=dict)
    held_back_all: bool = False
    #: per local source topic (the site's ``sl.ingress.*``), the topic id its cursors in
    #: ``offsets`` were taken in: a topic deleted and created again under the site is
    #: read from its start, not from the old topic's offsets (review N11)
    source_ids: dict[str, str] = field(default_factory=dict)
    #: what :data:`MARKER_TOPIC` holds of this query's marker, per key the JSON
    #: document of its last committed value (:meth:`marker_records`): a transaction
    #: writes only what differs from it (:meth:`marker_changes`)
    marker_docs: dict[bytes, Any] = field(default_factory=dict)

    def held_for(self, source: Source) -> RangeSet:
        return self.held.get(source) or RangeSet()

    def relayed_for(self, key: Relayed) -> RangeSet:
        return self.relayed.get(key) or RangeSet()

    def skips(self, entry: str, stream: str, *, relays: bool) -> Callable[[str, RangeSet], bool]:
        """Whether a first read of a neighbour's ``sl.relay.<entry>.<stream>`` may skip a
        segment naming ``seqs`` of ``origin`` (spark_core/relay_index.py
        ``start_offsets``): only what the merge would drop anyway, that is seqs it holds
        and, when the site keeps relay topics (``relays``), has relayed under ``entry``
        too. A held seq that came through another entry is relayed again under this one
        (:func:`_relay_again`); skipping it left this site's ``sl.relay.<entry>`` without
        it, and a site reading that entry through here never got it (replication
        review N6)."""

        def skip(origin: str, seqs: RangeSet) -> bool:
            if not self.held_for((origin, stream)).contains_all(seqs):
                return False
            return not relays or self.relayed_for((entry, origin, stream)).contains_all(seqs)

        return skip

    def ranges(self) -> int:
        """Size of the state, in ranges (a few per ship and stream)."""
        return sum(len(r) for r in self.held.values())

    def marker_records(
        self, site: str, query: str, batch_id: int, extra: Mapping[str, object]
    ) -> dict[bytes, Any]:
        """Every record of this state's marker, as JSON documents by key
        (:func:`~shorelink.contract.marker_key`): the head (``<site>/<query>``: the batch
        id, the re-drive's mark, the sources held back, ``extra``), one record per
        source (``<site>/<query>/source/<source>``: its partitions' next offsets, its
        topic id), one per topic indexed (``<site>/<query>/tail/<topic>``: where its
        relay index's last segment ended) and one per origin with seqs pending there
        (``<site>/<query>/pending/<topic>/<origin>``: tombstoned when the next segment
        names them). A transaction writes only those that differ from what Kafka holds
        (:meth:`marker_changes`): its bytes follow what it moved, not the number of
        sources (fleet issue, item 2)."""
        head: dict[str, object] = {
            "form": MARKER_FORM,
            "site": site,
            "batch_id": batch_id,
            **({"redrive_keys": self.redrive_keys} if self.redrive_keys else {}),
            **({"held_back": self._held_back_names()} if self.held_back_or_all else {}),
            **extra,
        }
        docs: dict[bytes, Any] = {marker_key(site, query): head}
        offsets: dict[str, dict[str, int]] = {}
        for (topic, part), off in self.offsets.items():
            offsets.setdefault(topic, {})[str(part)] = off
        for topic in offsets.keys() | self.source_ids.keys():
            doc: dict[str, object] = {"offsets": offsets.get(topic, {})}
            if topic in self.source_ids:
                doc["id"] = self.source_ids[topic]
            docs[marker_key(site, query, f"{MARKER_SOURCE}/{topic}")] = doc
        for topic, tail in self.index.items():
            docs[marker_key(site, query, f"{MARKER_TAIL}/{topic}")] = dump_tail(tail)
            for origin, seqs in tail.pending.items():
                name = f"{MARKER_PENDING}/{topic}/{origin}"
                docs[marker_key(site, query, name)] = seqs.to_json()
        return docs

    def marker_changes(self, docs: Mapping[bytes, Any]) -> list[tuple[bytes, bytes | None]]:
        """The records a transaction writes to :data:`MARKER_TOPIC` to make the marker
        ``docs`` (:meth:`marker_records`) out of what Kafka holds (``marker_docs``):
        the head, each record that changed, and a tombstone for each that is gone (a
        source superseded or forgotten, a tail of a topic no longer indexed)."""
        held = self.marker_docs
        out: list[tuple[bytes, bytes | None]] = [
            (key, json.dumps(doc, sort_keys=True, separators=(",", ":")).encode())
            for key, doc in docs.items()
            if held.get(key) != doc
        ]
        out += [(key, None) for key in held if key not in docs]
        return out

    def restore_marker(self, head: bytes, records: Mapping[bytes, bytes]) -> None:
        """The marker from this query's records (``head``'s key and those keyed under it,
        the last value of each). A head of the whole form (written before the marker was
        keyed per source: it holds every cursor and tail) is the marker as it stands: a
        site upgraded starts from it, and its first transaction writes every record of
        the keyed form (none is in ``marker_docs``) with a head of that form, whose
        records then rule; records keyed under a head of the whole form are left from an
        older run (a rollback since) and are only overwritten or tombstoned. Raises
        ValueError, KeyError or TypeError on a malformed record (the merge writes none
        such)."""
        docs = {key: json.loads(value) for key, value in records.items()}
        self.marker_docs = docs
        data = docs.get(head)
        if data is not None and not isinstance(data, dict):
            raise ValueError(f"marker head {head!r}: {data!r}")
        keyed = data is None or data.get("form") == MARKER_FORM
        if data is not None:
            self._restore_head(data)
        if not keyed:
            return
        self.offsets, self.source_ids, self.index = {}, {}, {}
        sources = head + f"/{MARKER_SOURCE}/".encode()
        tails = head + f"/{MARKER_TAIL}/".encode()
        pending = head + f"/{MARKER_PENDING}/".encode()
        tails_first = sorted(docs.items(), key=lambda kv: not kv[0].startswith(tails))
        for key, doc in tails_first:  # a topic's tail before its pending seqs
            if key.startswith(sources):
                topic = key[len(sources) :].decode()
                if not isinstance(doc, dict):
                    raise ValueError(f"marker record {key!r}: {doc!r}")
                for p, off in doc["offsets"].items():
                    self.offsets[(topic, int(p))] = int(off)
                if "id" in doc:
                    self.source_ids[topic] = str(doc["id"])
            elif key.startswith(tails):
                self.index[key[len(tails) :].decode()] = load_tail(doc)
            elif key.startswith(pending):
                topic, _, origin = key[len(pending) :].decode().partition("/")
                if topic in self.index:  # (else a tail dropped: never left so)
                    self.index[topic].pending[origin] = RangeSet.from_json(doc)

    def _restore_head(self, data: dict[str, Any]) -> None:
        """The head's fields; of the whole form, its cursors and tails too."""
        self.last_batch = int(data["batch_id"])
        if data.get("form") != MARKER_FORM:
            self.offsets = {
                (topic, int(p)): int(off)
                for topic, parts in data.get("offsets", {}).items()
                for p, off in parts.items()
            }
            self.index = load_tails(data.get("index", {}))
            ids = data.get("source_ids")
            self.source_ids = (
                {str(t): str(i) for t, i in ids.items()} if isinstance(ids, dict) else {}
            )
        keys = data.get("redrive_keys")
        self.redrive_keys = keys if isinstance(keys, str) else None
        names = data.get("held_back")
        names = names if isinstance(names, list) else []
        self.held_back_all = "*" in names
        self.held_back = {}
        for name in names:
            origin, _, stream = str(name).partition("/")
            if stream:
                self.held_back[(origin, stream)] = HeldBack(0, RangeSet(), unknown=True)

    @property
    def held_back_or_all(self) -> bool:
        return self.held_back_all or bool(self.held_back)

    def _held_back_names(self) -> list[str]:
        if self.held_back_all or len(self.held_back) > HELD_BACK_MAX:
            return ["*"]
        return sorted(f"{o}/{s}" for o, s in self.held_back)

    def carried(self, **changes: Any) -> MergeState:
        """A state for a new marker: what it carries from this one (the re-drive's mark
        and the sources held back), with ``changes``."""
        kept: dict[str, Any] = {
            "redrive_keys": self.redrive_keys,
            "held_back": self.held_back,
            "held_back_all": self.held_back_all,
            "source_ids": self.source_ids,
        }
        return MergeState(**{**kept, **changes})

    @classmethod
    def load(
        cls,
        kafka: KafkaEndpoint,
        site: str,
        timeout: float = 60.0,
        *,
        query: str = "merge",
        owns: Callable[[str], bool] | None = None,
    ) -> MergeState:
        """Read ``sl.ledger``, ``sl.merge.relayed`` and this site query's marker at
        ``kafka`` to their committed end (within ``timeout``); with ``owns`` (a shard of
        a merge split by origin: ``Shard.owns``), only the entries of the origins it
        takes: its memory is its share, and another shard's entries, which move under
        it, are never planned against."""
        state = cls()
        key = marker_key(site, query)
        under = key + b"/"
        marker: dict[bytes, bytes] = {}  # this query's marker records, the last of each
        oversized: dict[bytes, int] = {}  # ledger key -> ranges, of its last entry
        try:
            # one consumer for both, and no fetch parked at the end of a small topic
            # waiting for data (fetch.wait.max.ms, 500 ms by default): start-up is quick
            topics = [LEDGER_TOPIC, MARKER_TOPIC, RELAYED_TOPIC]
            quick: dict[str, object] = {"fetch.wait.max.ms": 10}
            for msg in read_to_end(kafka, topics, timeout=timeout, extra=quick):
                value = msg.value()
                if msg.topic() == MARKER_TOPIC:
                    k = msg.key() or b""
                    if k == key or k.startswith(under):
                        if value:  # offset order: the last one wins
                            marker[k] = value
                        else:  # a tombstone: a source gone
                            marker.pop(k, None)
                    continue
                if value is None:
                    continue
                if msg.topic() == RELAYED_TOPIC:
                    with contextlib.suppress(ContractError):  # the merge writes none such
                        relay, seqs = decode_relayed(msg.key(), value)
                        if owns is None or owns(relay[1]):
                            state.relayed[relay] = seqs
                    continue
                if owns is not None and not owns(_key_origin(msg.key())):
                    continue  # another shard's
                if value.count(b",") >= MAX_HOLDINGS_RANGES:
                    oversized[msg.key() or b""] = value.count(b",") + 1
                    continue  # unless a later entry of the key replaces it
                oversized.pop(msg.key() or b"", None)
                try:
                    origin, stream, held = decode_entry(msg.key(), value)
                except ContractError:
                    continue  # not ours to judge; the merge never writes such entries
                state.held[(origin, stream)] = held
            if marker:
                state.restore_marker(key, marker)
        except (KafkaClientError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise MergeError(f"cannot load merge state from {kafka.bootstrap}: {exc}") from exc
        if oversized:
            # skipped, the merge would hold nothing of the ship and write every seq of it
            # again (review 9, finding 3): no merge starts from such a ledger
            key, n = next(iter(oversized.items()))
            raise MergeError(
                f"{LEDGER_TOPIC} at {kafka.bootstrap}: the entry {key[:80]!r} holds {n} "
                f"ranges, more than {MAX_HOLDINGS_RANGES} (and {len(oversized) - 1} more "
                "such): not loaded, its seqs would be written again",
                fatal=True,
            )
        return state


def _key_origin(key: bytes | None) -> str:
    """The origin a ledger key ``origin/stream`` names (as read: a key that is not one
    names some origin too, and whichever shard takes it judges it)."""
    return (key or b"").partition(b"/")[0].decode(errors="replace")


def encode_relayed(key: Relayed, seqs: RangeSet) -> tuple[bytes, bytes]:
    """A record of :data:`RELAYED_TOPIC`: ``entry/origin/stream`` -> ranges."""
    return "/".join(key).encode(), str(seqs).encode()


def decode_relayed(key: bytes | None, value: bytes | None) -> tuple[Relayed, RangeSet]:
    """Parse one record of :data:`RELAYED_TOPIC`; raises ContractError if it is not one."""
    try:
        entry, origin, stream = (key or b"").decode().split("/")
        names = (
            check_name("site", entry),
            check_name("origin", origin),
            check_name("stream", stream),
        )
        return names, RangeSet.parse((value or b"").decode())
    except (UnicodeDecodeError, ValueError) as exc:
        raise ContractError(f"bad relayed entry {key!r}: {exc}") from exc


#: a dead-lettered record over the size limit keeps this much of its value
DEAD_VALUE_MAX = 64 * 1024

Headers = list[tuple[str, str | bytes | None]]


class EntryOf(Protocol):
    """The entry site a record read from ``source`` is relayed under (None: not
    relayed). Without ``headers``, the source's own entry; a neighbour's canonical
    topic (history) has none, and each of its records is asked with its headers
    (``Merger._entry``)."""

    def __call__(self, source: str, headers: Headers | None = None, /) -> str | None: ...


Out = tuple[str, bytes | None, bytes | None, Headers]  # topic, key, value, headers


@dataclass(frozen=True, slots=True)
class SourceRow:
    """One record read by the merge, with where it came from."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers
    #: the record's Kafka timestamp (epoch ms): for a record of ``sl.ingress.*``, when the
    #: gateway wrote it (None when the reader did not ask)
    written_ms: int | None = None

    @classmethod
    def from_spark(cls, row: Any) -> SourceRow:
        """From the dict ``pyarrow`` gives for one row of :func:`batch_frame`."""
        hs = row["headers"] or []
        return cls(
            row["topic"],
            int(row["partition"]),
            int(row["offset"]),
            None if row["key"] is None else bytes(row["key"]),
            None if row["value"] is None else bytes(row["value"]),
            [(h["key"], None if h["value"] is None else bytes(h["value"])) for h in hs],
            row.get("written_ms"),
        )


@runtime_checkable
class SourceBatch(Protocol):
    """One micro-batch as the planner reads it: per row where it came from and, when
    Spark already checked its headers against the contract, its identity (``origin``
    is ``""`` where it did not: :meth:`row` gives the whole record for the full check).
    Keys, values and headers stay where they are until :meth:`records` asks for the
    rows that are written, so duplicates never become Python objects."""

    topics: list[str]
    partitions: list[int]
    offsets: list[int]
    origins: list[str]
    seqs: list[int]

    def row(self, i: int) -> SourceRow: ...

    def records(self, topics: Sequence[str], rows: Sequence[int]) -> list[Out]:
        """``(topics[i], key, value, headers)`` of row ``rows[i]``, in that order."""
        ...

    def written_ms(self, rows: Sequence[int]) -> Sequence[int | None]:
        """The Kafka timestamp (epoch ms) of each row of ``rows``, in that order."""
        ...


class RowBatch:
    """A batch of :class:`SourceRow` (tests, tools): every row gets the full check."""

    def __init__(self, rows: Iterable[SourceRow]) -> None:
        self._rows = list(rows)
        self.topics = [r.topic for r in self._rows]
        self.partitions = [r.partition for r in self._rows]
        self.offsets = [r.offset for r in self._rows]
        self.origins = [""] * len(self._rows)
        self.seqs = [0] * len(self._rows)

    def row(self, i: int) -> SourceRow:
        return self._rows[i]

    def records(self, topics: Sequence[str], rows: Sequence[int]) -> list[Out]:
        return [
            (t, r.key, r.value, r.headers) for t, r in zip(topics, map(self.row, rows), strict=True)
        ]

    def written_ms(self, rows: Sequence[int]) -> Sequence[int | None]:
        return [self._rows[i].written_ms for i in rows]


@dataclass
class BatchPlan:
    """What one batch writes, decided before anything is written."""

    canonical: list[Out] = field(default_factory=list)
    #: per canonical record, the source it was read from (its entry site: a pulled
    #: record entered where its relay topic says, the rest here)
    read_from: list[str] = field(default_factory=list)
    dead: list[Out] = field(default_factory=list)
    #: full new range sets of the (origin, stream) pairs this batch extends
    ledger: dict[tuple[str, str], RangeSet] = field(default_factory=dict)
    #: records the site holds already that came again through another entry, and that
    #: entry's relay topic lacks: written to that relay topic only (``again_from``: the
    #: source each was read from, as ``read_from``)
    again: list[Out] = field(default_factory=list)
    again_from: list[str] = field(default_factory=list)
    #: full new range sets of the (entry, origin, stream) this batch relays
    relayed: dict[Relayed, RangeSet] = field(default_factory=dict)
    #: the seqs this batch relays, per (entry, origin, stream): the relay index's pending
    relayed_now: dict[Relayed, list[int]] = field(default_factory=dict)
    #: next offset per source partition once this batch commits
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    #: streams whose canonical or dead-letter topic this batch writes
    streams: set[str] = field(default_factory=set)
    input: int = 0
    duplicates: int = 0
    #: rows a committed batch already handled (replay, or a lost checkpoint)
    skipped: int = 0
    #: pulled records of a ship with a key whose proof failed (dead-lettered, among
    #: ``dead``): what a hostile or broken neighbour offered as the ship's
    unproved: int = 0
    #: of ``unproved``, per source (a batch of several feeds: spark_core/merge_queue.py)
    unproved_from: dict[str, int] = field(default_factory=dict)
    #: per (origin, stream), the seqs dead-lettered at the bound on holes: tried again
    #: once some of them can be taken (spark_core/redrive.py)
    held_back: dict[Source, RangeSet] = field(default_factory=dict)
    #: records of origins another shard of the site merges (a merge split by origin,
    #: shorelink/shards.py): left to it, their offsets passed; and of those, per source
    #: topic (the merge refuses them in a partition only it reads: ``Merger._misrouted``)
    foreign: int = 0
    foreign_from: dict[str, int] = field(default_factory=dict)


def pulled_source(neighbour: str, topic_id: str, topic: str) -> str:
    """The name under which the merge keeps a neighbour's relay topic (or its canonical
    topic, read for history: :func:`history_stream`) as a source:
    ``<neighbour>/<topic id>/sl.relay.<entry>.<stream>``. Its offsets in the marker are
    the site's cursor there, tied to the topic's id: a topic deleted and recreated is a
    new source, read from its start (spark_core/pull.py)."""
    return f"{neighbour}/{topic_id}/{topic}"


def superseded_sources(known: Iterable[str], new: Iterable[str]) -> set[str]:
    """The pulled sources of ``known`` that a source of ``new`` replaces: the same
    neighbour's topic under another topic id (deleted and created again, or the
    neighbour's Kafka rebuilt: a topic id is never used twice). Their cursors can never
    be used again, and every marker carried them for good (review N9)."""
    latest: dict[tuple[str, str], str] = {}
    for src in new:
        if "/" in src:
            latest[(src.partition("/")[0], src.rsplit("/", 1)[1])] = src
    out = set()
    for src in known:
        if "/" in src:
            keep = latest.get((src.partition("/")[0], src.rsplit("/", 1)[1]))
            if keep is not None and keep != src:
                out.add(src)
    return out


def source_stream(source: str) -> str | None:
    """The stream a source carries: a local topic (:func:`topic_stream`), a
    neighbour's relay topic or its canonical topic (:func:`pulled_source`)."""
    if "/" not in source:
        return topic_stream(source)
    return history_stream(source) or _relay_name(source, "stream")


def history_stream(source: str) -> str | None:
    """The stream of a pulled source that is a neighbour's canonical topic ``sl.<s>``
    (what a site that lost its data, or a relay's retention, no longer has: read for
    history, spark_core/pull.py); None for any other source."""
    if "/" not in source:
        return None
    topic = source.rsplit("/", 1)[1].split(".")
    if len(topic) != 2 or topic[0] != "sl":
        return None
    try:
        return check_name("stream", topic[1])
    except ContractError:
        return None


def source_entry(source: str) -> str | None:
    """The entry site of a pulled source (the ``<entry>`` of its relay topic); None for
    a local topic, whose records entered at this site."""
    return _relay_name(source, "site")


def _relay_name(source: str, kind: str) -> str | None:
    """The entry (``kind`` "site") or the stream of a pulled source's relay topic
    ``sl.relay.<entry>.<stream>``; None when the source is no such topic."""
    if "/" not in source:
        return None
    # the topic is what follows the last "/" (a topic id, base64, may hold some)
    topic = source.rsplit("/", 1)[1].split(".")
    if len(topic) != 4 or topic[:2] != ["sl", "relay"]:
        return None
    try:
        return check_name(kind, topic[2 if kind == "site" else 3])
    except ContractError:
        return None


def topic_stream(topic: str) -> str | None:
    """The stream a local source topic carries: ``sl.ingress.<s>`` (None for anything
    else: never purged)."""
    parts = topic.split(".")
    if len(parts) != 3 or parts[:2] != ["sl", "ingress"]:
        return None
    try:
        return check_name("stream", parts[2])
    except ContractError:
        return None


def plan_batch(
    batch: SourceBatch | Iterable[SourceRow],
    state: MergeState,
    entry_of: EntryOf | None = None,
    keys: ShipKeys | None = None,
    max_ranges: int = MAX_HOLDINGS_RANGES,
    owns: Callable[[str], bool] | None = None,
) -> BatchPlan:
    """Pure: dedup ``batch`` against ``state`` and within itself (the first copy of an
    identity wins), order the new identities by seq per ``(origin, stream)``.

    With ``owns`` (a shard of a merge split by origin: ``Shard.owns``), a record of an
    origin the shard does not take is passed (``plan.foreign``): its shard merges it
    from its own partitions. A shard reads only the partitions of its origins, so this
    happens only in a topic read whole by every shard (the registry's one partition) or
    to records written before the gateway partitioned by origin.

    With ``entry_of`` (a source topic's entry site: the merge relays), each record
    written is also relayed under its entry (a history record under the entry its
    headers name: :class:`EntryOf`), and a record the site holds already that came through another entry whose
    relay topic lacks it is relayed there too (``plan.again``): so a site's ``sl.relay.<E>.*`` holds every record of E that
    reached it through E, whichever entry's copy came first. Without that, one
    identity entered at two sites could miss a site for good in a graph that is not a
    full mesh (docs/replication.md, "One identity entered at two sites").

    With ``keys`` (the ship keys file, shorelink/proof.py), a record pulled from a
    neighbour (any source but the site's own ``sl.ingress.*``, whose gateway proved it)
    takes part in "the first copy wins" only if its proof holds: a copy of a ship with
    a key without a valid proof, or of a ship without one where keys are required, is
    dead-lettered (``plan.unproved``) and never reaches the ledger, so a forged copy can
    neither replace the genuine record nor add a seq (the bound on holes, the ledger's
    size). Checked once per identity the site lacks, not per duplicate. A record of the
    fleet registry's origin is checked from the site's own ingress too: no gateway
    writes it, so no gateway vouched for it (docs/fleet-registry.md, "How it travels").

    The loop runs once per record on the driver, so it keeps per-partition and
    per-source lookups out of the common path: rows come grouped by source partition,
    and a seq above everything the ledger holds needs no range search."""
    b = batch if isinstance(batch, SourceBatch) else RowBatch(batch)
    plan = BatchPlan(input=len(b.offsets))
    new: dict[Source, tuple[dict[int, int], RangeSet, int]] = {}  # seen seq -> row, held
    streams: dict[str, str | None] = {}
    again: list[tuple[int, Relayed, int]] = []  # rows relayed again: (entry, source), seq
    again_seen: dict[Relayed, set[int]] = {}
    entry_site: str | None = None  # of partition tp, when the merge relays
    pulled = False  # partition tp is not the site's ingress: its records are proved
    topics, partitions, offsets, origins, seqs = (
        b.topics,
        b.partitions,
        b.offsets,
        b.origins,
        b.seqs,
    )
    tp: TopicPart | None = None
    floor = high = 0  # of partition tp: first offset not handled yet; next offset
    stream: str | None = None
    owned: dict[str, bool] = {}  # origin -> whether this shard takes it
    for i in range(plan.input):
        if tp is None or partitions[i] != tp[1] or topics[i] != tp[0]:
            if tp is not None and high:
                plan.offsets[tp] = high
            tp = (topics[i], partitions[i])
            floor, high = state.offsets.get(tp, 0), plan.offsets.get(tp, 0)
            if tp[0] not in streams:
                streams[tp[0]] = source_stream(tp[0])
            stream = streams[tp[0]]
            entry_site = None if entry_of is None else entry_of(tp[0])
            pulled = keys is not None and topic_stream(tp[0]) is None
        offset = offsets[i]
        if offset < floor:
            plan.skipped += 1
            continue
        if offset >= high:
            high = offset + 1
        origin, seq, row_stream = origins[i], seqs[i], stream
        rec: Record | None = None  # the row as Record.from_kafka reads it, once read
        if not origin or row_stream is None:  # Spark did not vouch: the full check
            row = b.row(i)
            try:
                rec = _checked_record(row, stream)
                origin, row_stream, seq = rec.identity.origin, rec.identity.stream, rec.identity.seq
            except ContractError as exc:
                plan.streams.update([stream] if stream else [])
                plan.dead.append(_dead_record(row, stream, str(exc), CONTRACT))
                continue
        if owns is not None:
            mine = owned.get(origin)
            if mine is None:
                mine = owned[origin] = owns(origin)
            if not mine:
                plan.foreign += 1
                plan.foreign_from[tp[0]] = plan.foreign_from.get(tp[0], 0) + 1
                continue
        source = (origin, row_stream)
        entry = new.get(source)
        if entry is None:
            held = state.held_for(source)
            entry = new[source] = ({}, held, held.last or 0)
        seen, held, top = entry
        if seq in seen or (seq <= top and seq in held):
            plan.duplicates += 1
            if entry_site is not None and entry_of is not None:
                first = seen.get(seq)
                key = (entry_site, *source)
                if (
                    (first is None or _row_entry(b, first, entry_of) != entry_site)
                    and (not pulled or _proved(b, i, origin, keys, rec) is None)
                    and _relay_again(key, seq, state, again_seen)
                ):
                    again.append((i, key, seq))
            continue
        if (pulled or origin == FLEET_ORIGIN) and (why := _proved(b, i, origin, keys, rec)):
            plan.unproved += 1
            plan.unproved_from[tp[0]] = plan.unproved_from.get(tp[0], 0) + 1
            plan.streams.add(row_stream)
            plan.dead.append(_dead_record(b.row(i), row_stream, why, cause_of(why)))
            continue
        seen[seq] = i
    if tp is not None and high:
        plan.offsets[tp] = high
    _order_new(
        b, {source: seen for source, (seen, _, _) in new.items()}, state, plan, entry_of, max_ranges
    )
    if again:
        _plan_again(b, again, state, plan)
    for key, relayed in plan.relayed.items():
        if len(relayed) > MAX_HOLDINGS_RANGES:  # kept small: forgetting only relays again
            plan.relayed[key] = RangeSet(list(relayed)[-MAX_HOLDINGS_RANGES:])
    return plan


def _row_entry(b: SourceBatch, i: int, entry_of: EntryOf) -> str | None:
    """The entry row ``i`` is relayed under: its source's, or for history (a source
    with no entry) the one its headers name."""
    topic = b.topics[i]
    entry = entry_of(topic)
    if entry is None and history_stream(topic) is not None:
        entry = entry_of(topic, b.row(i).headers)
    return entry


def _proved(
    b: SourceBatch, i: int, origin: str, keys: ShipKeys | None, rec: Record | None
) -> str | None:
    """None if row ``i`` (of ship ``origin``; ``rec``: the row as read already, if it
    was) may be taken as its ship's record (shorelink/proof.py), else why not. Rows of
    ships that sign nothing, where keys are not required, cost one lookup."""
    if keys is None or (not keys.signed(origin) and not keys.refuses(origin)):
        return None
    row = b.row(i)
    try:  # a row Spark vouched for is read here first
        r = rec or Record.from_kafka(row.key, row.value, row.headers)
    except ContractError as exc:
        return str(exc)
    proof = next((v for k, v in reversed(row.headers) if k == H_PROOF and v is not None), None)
    i_ = r.identity
    return keys.check(
        i_.origin,
        i_.stream,
        i_.seq,
        r.ts_ms,
        r.key,
        r.mqtt_topic,
        r.value,
        proof if isinstance(proof, bytes) else None,
    )


def _relay_again(key: Relayed, seq: int, state: MergeState, seen: dict[Relayed, set[int]]) -> bool:
    """Does a copy of ``seq`` (held, or written by this batch) that came through the
    entry of ``key`` still have to go to that entry's relay topic? Once per batch."""
    marks = seen.setdefault(key, set())
    if seq in marks or seq in state.relayed_for(key):
        return False
    marks.add(seq)
    return True


def _plan_again(
    b: SourceBatch, again: list[tuple[int, Relayed, int]], state: MergeState, plan: BatchPlan
) -> None:
    """The relay-only copies and their relayed ranges. One over the size limit is not
    relayed (the copy the site holds was within it)."""
    rows = [i for i, _, _ in again]
    records = b.records([canonical_topic(key[2]) for _, key, _ in again], rows)
    read_from = [b.topics[i] for i in rows]
    _stamp_entered(records, read_from, b.written_ms(rows))
    big = _oversized(records)
    for j, (_, key, seq) in enumerate(again):
        if j not in big:
            plan.again.append(records[j])
            plan.again_from.append(read_from[j])
            _relayed(plan, state, key, seq)


def _relayed(plan: BatchPlan, state: MergeState, key: Relayed, seq: int) -> None:
    """``seq`` goes to the relay topic of ``key``'s entry in this batch."""
    seqs = plan.relayed.get(key)
    if seqs is None:
        seqs = plan.relayed[key] = state.relayed_for(key).copy()
    seqs.add(seq)
    plan.relayed_now.setdefault(key, []).append(seq)


@boundary
def _checked_record(row: SourceRow, stream: str | None) -> Record:
    """``Record.from_kafka`` plus: the ``sl.stream`` header names the topic's stream."""
    if stream is None:
        raise ContractError(f"topic {row.topic} names no stream")
    rec = Record.from_kafka(row.key, row.value, row.headers)
    if rec.identity.stream != stream:
        raise ContractError(f"header sl.stream={rec.identity.stream} but topic is {row.topic}")
    return rec


def _order_new(
    b: SourceBatch,
    new: dict[Source, dict[int, int]],
    state: MergeState,
    plan: BatchPlan,
    entry_of: EntryOf | None = None,
    max_ranges: int = MAX_HOLDINGS_RANGES,
) -> None:
    """Seq order per source; the new ledger entries; fetch the written rows at once.

    A record over :data:`MAX_RECORD_BYTES` (only a writer that skipped the gateway's
    check can have put one in a source topic) is dead-lettered, cut to
    :data:`DEAD_VALUE_MAX` bytes, instead of failing the transaction on every replay."""
    order: list[int] = []
    topics: list[str] = []
    sources: list[tuple[Source, list[int]]] = []
    for source, seen in new.items():
        if not seen:
            continue
        seqs = sorted(seen)
        order += [seen[seq] for seq in seqs]
        topics += [canonical_topic(source[1])] * len(seqs)
        sources.append((source, seqs))
    records = b.records(topics, order)
    big = _oversized(records)
    i = 0
    for source, seqs in sources:
        held = state.held_for(source).copy()
        # each new seq adds at most one range: only a source near the bound is checked
        bounded = len(held) + len(seqs) > max_ranges
        fits = None
        if bounded:  # (one dead-lettered for its size neither takes a range nor joins two)
            sized = RangeSet.from_seqs(seq for k, seq in enumerate(seqs) if i + k not in big)
            fits = admissible(held, sized, max_ranges)
        for seq in seqs:
            if i in big:
                plan.dead.append(_too_large(records[i], b.row(order[i]), source[1]))
            elif fits is not None and seq not in fits:
                big.add(i)  # (not written either)
                reason = f"{source[0]}/{source[1]} holds {len(held)} ranges already"
                plan.dead.append(_dead_record(b.row(order[i]), source[1], reason, HOLES))
                plan.held_back.setdefault(source, RangeSet()).add(seq)
            else:
                held.add(seq)
                # history: relayed under the entry the record names (review N1)
                if entry_of is not None and (into := _row_entry(b, order[i], entry_of)):
                    _relayed(plan, state, (into, *source), seq)
            i += 1
        plan.streams.add(source[1])
        if held != state.held_for(source):
            plan.ledger[source] = held
    read_from = [b.topics[j] for j in order]
    _stamp_entered(records, read_from, b.written_ms(order))
    if big:
        plan.canonical = [r for j, r in enumerate(records) if j not in big]
        plan.read_from = [r for j, r in enumerate(read_from) if j not in big]
    else:
        plan.canonical, plan.read_from = records, read_from


def _stamp_entered(
    records: list[Out], read_from: Sequence[str], written: Sequence[int | None]
) -> None:
    """A record that entered here (read from ``sl.ingress.*``) gets :data:`H_ENTERED`:
    when the gateway wrote it, its ingress record's timestamp. One that a writer other
    than the merge stamped already has it replaced; a pulled record keeps its own."""
    for i, (source, ms) in enumerate(zip(read_from, written, strict=True)):
        if ms is None or topic_stream(source) is None:
            continue
        topic, key, value, headers = records[i]
        kept = [h for h in headers if h[0] != H_ENTERED]
        records[i] = (topic, key, value, [*kept, (H_ENTERED, b"%d" % ms)])


def forgettable(held: RangeSet, lost: RangeSet, max_ranges: int) -> RangeSet:
    """Of ``lost``, what the ledger entry ``held`` may stop holding and keep within
    ``max_ranges`` ranges (``Merger.forget``): every held run of it that takes a range
    away or leaves the count as it is, and, lowest seqs first, as many of those that
    split a range as the bound leaves room for. A ship's seqs are spread over a topic's
    partitions by container, so a partition's lost prefix is interleaved with seqs still
    held, and forgetting all of it could pass the bound; an entry past it is refused by every
    reader of the ledger (:func:`shorelink.ledger.decode_entry`), and a merge that
    skipped its own wrote every seq again (review 9, finding 3). What is kept is not
    repaired (the site lacks it and says it holds it), never written twice."""
    gone = lost.difference(lost.difference(held))
    ranges = list(held)
    # each run of it lies within one held range (the ranges are maximal) and touches no
    # other run: forgetting it takes that range away (the whole of it), leaves the count
    # (at an end of it) or splits it, whatever else of the range is forgotten
    splits: list[tuple[int, int]] = []
    out = RangeSet()
    n = len(ranges)
    j = 0
    for lo, hi in gone:
        while ranges[j][1] < lo:
            j += 1
        a, b = ranges[j]
        if lo == a or hi == b:
            n -= lo == a and hi == b
            out.add_range(lo, hi)
        else:
            splits.append((lo, hi))
    for lo, hi in splits[: max(0, max_ranges - n)]:
        out.add_range(lo, hi)
    return out


def admissible(held: RangeSet, seqs: RangeSet, max_ranges: int) -> RangeSet:
    """Of a batch's new ``seqs`` of one ledger entry ``held``, those it can take and
    stay within ``max_ranges`` ranges: every run of them next to a held seq (it extends
    a range or fills a hole: no range more), then, lowest first, as many of the runs
    that touch none as the bound leaves room for (each one range more). Decided on the
    batch's runs, not seq by seq: a seq taken alone would split, and its neighbour in
    the same batch makes it extend (the bound refused seq 1 of a batch that held 2 and
    3 was next to the entry; the re-drive of both, in one batch, took 2 and refused 1
    again: CI found it)."""
    out = RangeSet()
    alone: list[tuple[int, int]] = []
    for lo, hi in seqs:
        if held.overlaps(lo - 1, hi + 1):
            out.add_range(lo, hi)
        else:
            alone.append((lo, hi))
    both = held.copy()
    both.update(out)
    for lo, hi in alone[: max(0, max_ranges - len(both))]:
        out.add_range(lo, hi)
    return out


def takeable(seqs: RangeSet, held: RangeSet, max_ranges: int) -> RangeSet:
    """Of the seqs held back at the bound on holes, those a pass could take now: every
    one while the entry has :data:`HOLES_ROOM` of the bound free, otherwise the runs
    next to a seq it holds (one that fills a hole or extends a range adds none). A seq
    that arrived meanwhile is no longer held back (:func:`held_back_after`)."""
    if len(held) <= int(max_ranges * HOLES_ROOM):
        return seqs.copy()
    out = RangeSet()
    for lo, hi in seqs:
        if held.overlaps(lo - 1, hi + 1):
            out.add_range(lo, hi)
    return out


def tried_seqs(rows: Iterable[SourceRow]) -> dict[Source, RangeSet]:
    """Per (origin, stream), the seqs of ``rows`` (dead letters planned again): their
    identity headers as written (one that breaks the contract was never held back)."""
    out: dict[Source, RangeSet] = {}
    for row in rows:
        h = {
            k: v.decode() if isinstance(v, bytes) else v
            for k, v in row.headers
            if k in (H_ORIGIN, H_STREAM, H_SEQ)
        }
        try:
            origin, stream, seq = str(h[H_ORIGIN]), str(h[H_STREAM]), int(str(h[H_SEQ]))
        except (KeyError, UnicodeDecodeError, ValueError):
            continue
        if seq > 0:
            out.setdefault((origin, stream), RangeSet()).add(seq)
    return out


def held_back_after(
    state: MergeState,
    plan: BatchPlan,
    commit: int,
    max_ranges: int,
    *,
    tried: Mapping[Source, RangeSet] | None = None,
    since: int | None = None,
    now: float = 0.0,
) -> dict[Source, HeldBack]:
    """Pure: the sources held back once ``plan`` commits as ``commit``.

    ``tried``: the seqs a re-drive step planned again (what it refuses again is in
    ``plan.held_back`` anew). ``since``: the step ends a pass that started after commit
    ``since`` and read every dead letter written before: a source none of whose records
    was quarantined since is done with (what is left of it was not found: retention;
    one of commit ``since`` itself keeps what was not tried: the ends are asked right
    after it, and a commit returns before its markers are written, so its last dead
    letters can lie past them),
    none is unknown any more, and what still looks takeable is a prediction that failed:
    not tried again before :data:`HOLES_BACKOFF_S` (doubling, to
    :data:`HOLES_BACKOFF_MAX_S`). So no pass follows another unless records became
    takeable in between (finding 1 of review 9: a ship writing at the bound re-drove
    its held-back records every second; finding 2: a pass of several transactions left
    a stale count and was repeated forever)."""
    out = dict(state.held_back)
    for src, seqs in (tried or {}).items():
        if (hb := out.get(src)) is not None:
            out[src] = replace(hb, seqs=hb.seqs.difference(seqs))
    if since is not None:
        out = {s: replace(hb, unknown=False) for s, hb in out.items() if hb.commit >= since}
    for src, seqs in plan.held_back.items():
        hb = out.get(src) or HeldBack(commit, RangeSet())
        both = hb.seqs.copy()
        both.update(seqs)
        out[src] = replace(hb, commit=commit, seqs=both)
    for src, hb in list(out.items()):
        held = plan.ledger.get(src) or state.held_for(src)
        seqs = hb.seqs.difference(held) if src in plan.ledger else hb.seqs
        if not seqs and not hb.unknown:
            del out[src]  # every one is held now (another copy came, or a pass took it)
            continue
        if since is not None:
            looked = takeable(seqs, held, max_ranges)
            backoff = 0.0
            if looked:
                was = hb.backoff if hb.looked else 0.0
                backoff = min(HOLES_BACKOFF_MAX_S, 2 * was) if was else HOLES_BACKOFF_S
            hb = replace(hb, looked=looked, due=now + backoff, backoff=backoff)
        out[src] = replace(hb, seqs=seqs)
    return out


def _oversized(records: list[Out]) -> set[int]:
    values = [r[2] or b"" for r in records]
    if not values or max(map(len, values)) + 1024 <= MAX_RECORD_BYTES:
        return set()  # the usual case: nothing near the limit, no per-record work
    out = set()
    for i, (_, key, value, headers) in enumerate(records):
        topic = next((v for k, v in headers if k == H_MQTT_TOPIC), None) or b""
        if record_bytes(key or b"", value or b"", topic) > MAX_RECORD_BYTES:
            out.add(i)
    return out


def _too_large(out: Out, row: SourceRow, stream: str) -> Out:
    _, key, value, _ = out
    value = value or b""
    reason = f"record of {len(value)} value bytes > MAX_RECORD_BYTES {MAX_RECORD_BYTES}"
    topic, key, _, headers = _dead_record(row, stream, reason, TOO_LARGE)
    return (topic, key, value[:DEAD_VALUE_MAX], headers)


def _dead_record(row: SourceRow, stream: str | None, reason: str, cause: str) -> Out:
    """``row`` quarantined (spark_core/quarantine.py): its own headers, then its cause,
    the reason in words and where it was read."""
    headers = [
        *row.headers,
        (H_DEAD_CAUSE, cause.encode()),
        (H_DEAD_REASON, reason.encode()),
        (H_DEAD_SOURCE, f"{row.topic}/{row.partition}/{row.offset}".encode()),
    ]
    return (dead_topic(stream) if stream else DEAD_UNKNOWN_TOPIC, row.key, row.value, headers)
