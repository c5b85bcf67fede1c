"""What the merge has already written, rebuilt from Kafka (the source of truth), and
the pure decision of what a batch adds to it (:func:`plan_batch`).

Two compacted topics, both written only inside the merge's Kafka transactions:
- ``sl.ledger``: ``origin/stream`` -> the seqs in the canonical topic (the dedup state);
- ``sl.merge.marker``: ``<site>/merge`` -> the last committed batch: Spark batch id and,
  per source topic-partition, the next offset not yet handled.

Both are read with ``read_committed`` at start-up (and after any failed transaction), so
the state is exactly what committed transactions wrote, whatever Spark's checkpoint says.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaException

from shorelink.contract import LEDGER_TOPIC, Record, canonical_topic, dead_topic
from shorelink.errors import ContractError, ShorelinkError
from shorelink.identity import check_name
from shorelink.kafka_io import read_to_end
from shorelink.ledger import decode_entry
from shorelink.ranges import RangeSet

__all__ = [
    "DEAD_UNKNOWN_TOPIC",
    "MARKER_TOPIC",
    "BatchPlan",
    "MergeError",
    "MergeState",
    "SourceRow",
    "marker_key",
    "plan_batch",
    "topic_stream",
]

#: compacted; key ``<site>/<query>``, value JSON of the last committed batch
MARKER_TOPIC = "sl.merge.marker"

Source = tuple[str, str]  # (origin, stream)
TopicPart = tuple[str, int]  # (topic, partition)


class MergeError(ShorelinkError):
    """The merge could not write a batch (nothing of it is visible), or is fenced."""

    retryable = True

    def __init__(self, message: str, *, fatal: bool = False) -> None:
        super().__init__(message, retryable=not fatal)
        self.fatal = fatal


def marker_key(site: str, query: str = "merge") -> bytes:
    return f"{site}/{query}".encode()


@dataclass
class MergeState:
    """Per ``(origin, stream)`` the seqs written; per source partition the next offset
    not yet handled by a committed batch; the last committed batch id."""

    held: dict[Source, RangeSet] = field(default_factory=dict)
    offsets: dict[TopicPart, int] = field(default_factory=dict)
    last_batch: int | None = None

    def held_for(self, source: Source) -> RangeSet:
        return self.held.get(source) or RangeSet()

    def ranges(self) -> int:
        """Size of the state, in ranges (a few per ship and stream)."""
        return sum(len(r) for r in self.held.values())

    def marker_value(self, site: str, batch_id: int, extra: dict[str, object]) -> bytes:
        offsets: dict[str, dict[str, int]] = {}
        for (topic, part), off in sorted(self.offsets.items()):
            offsets.setdefault(topic, {})[str(part)] = off
        return json.dumps(
            {"site": site, "batch_id": batch_id, "offsets": offsets, **extra},
            sort_keys=True,
            separators=(",", ":"),
        ).encode()

    def restore_marker(self, value: bytes) -> None:
        data = json.loads(value)
        self.last_batch = int(data["batch_id"])
        self.offsets = {
            (topic, int(p)): int(off)
            for topic, parts in data.get("offsets", {}).items()
            for p, off in parts.items()
        }

    @classmethod
    def load(cls, bootstrap: str, site: str, timeout: float = 60.0) -> MergeState:
        """Read ``sl.ledger`` and this site's marker to their committed end."""
        state = cls()
        key = marker_key(site)
        try:
            for msg in read_to_end(bootstrap, [LEDGER_TOPIC], timeout=timeout):
                if msg.value() is None:
                    continue
                try:
                    origin, stream, held = decode_entry(msg.key(), msg.value())
                except ContractError:
                    continue  # not ours to judge; the merge never writes such entries
                state.held[(origin, stream)] = held
            for msg in read_to_end(bootstrap, [MARKER_TOPIC], timeout=timeout):
                value = msg.value()
                if msg.key() == key and value:
                    state.restore_marker(value)
        except (KafkaException, ValueError, KeyError) as exc:
            raise MergeError(f"cannot load merge state from {bootstrap}: {exc}") from exc
        return state


#: malformed records whose source topic names no valid stream
DEAD_UNKNOWN_TOPIC = "sl.dead.unknown"
#: headers added to a dead-lettered record (the original ones are kept as they were)
H_DEAD_REASON = "sl.dead.reason"
H_DEAD_SOURCE = "sl.dead.source"

Headers = list[tuple[str, str | bytes | None]]


@dataclass(frozen=True, slots=True)
class SourceRow:
    """One record read by the merge, with where it came from."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers

    @classmethod
    def from_spark(cls, row: Any) -> SourceRow:
        hs = row["headers"] or []
        return cls(
            row["topic"],
            int(row["partition"]),
            int(row["offset"]),
            None if row["key"] is None else bytes(row["key"]),
            None if row["value"] is None else bytes(row["value"]),
            [(h["key"], None if h["value"] is None else bytes(h["value"])) for h in hs],
        )


Out = tuple[str, bytes | None, bytes | None, Headers]  # topic, key, value, headers


@dataclass
class BatchPlan:
    """What one batch writes, decided before anything is written."""

    canonical: list[Out] = field(default_factory=list)
    dead: list[Out] = field(default_factory=list)
    #: full new range sets of the (origin, stream) pairs this batch extends
    ledger: dict[tuple[str, str], RangeSet] = field(default_factory=dict)
    #: next offset per source partition once this batch commits
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    #: streams whose canonical or dead-letter topic this batch writes
    streams: set[str] = field(default_factory=set)
    input: int = 0
    duplicates: int = 0
    #: rows a committed batch already handled (replay, or a lost checkpoint)
    skipped: int = 0


def topic_stream(topic: str) -> str | None:
    """The stream a source topic carries: ``sl.ingress.<s>`` or ``sl.inbox.<site>.<s>``."""
    parts = topic.split(".")
    if len(parts) == 3 and parts[:2] == ["sl", "ingress"]:
        name = parts[2]
    elif len(parts) == 4 and parts[:2] == ["sl", "inbox"]:
        name = parts[3]
    else:
        return None
    try:
        return check_name("stream", name)
    except ContractError:
        return None


def plan_batch(rows: Iterable[SourceRow], state: MergeState) -> BatchPlan:
    """Pure: dedup ``rows`` against ``state`` and order the new identities by seq."""
    plan = BatchPlan()
    new: dict[tuple[str, str], dict[int, SourceRow]] = {}
    for row in rows:
        plan.input += 1
        tp = (row.topic, row.partition)
        if row.offset < state.offsets.get(tp, 0):
            plan.skipped += 1
            continue
        plan.offsets[tp] = max(plan.offsets.get(tp, 0), row.offset + 1)
        stream = topic_stream(row.topic)
        try:
            if stream is None:
                raise ContractError(f"topic {row.topic} names no stream")
            rec = Record.from_kafka(row.key, row.value, row.headers)
            if rec.identity.stream != stream:
                raise ContractError(
                    f"header sl.stream={rec.identity.stream} but topic is {row.topic}"
                )
        except ContractError as exc:
            dead = dead_topic(stream) if stream else DEAD_UNKNOWN_TOPIC
            if stream:
                plan.streams.add(stream)
            plan.dead.append(_dead_record(dead, row, str(exc)))
            continue
        ident = rec.identity
        seqs = new.setdefault(ident.source, {})
        if ident.seq in seqs or ident.seq in state.held_for(ident.source):
            plan.duplicates += 1
            continue
        seqs[ident.seq] = row
    for source, seqs in new.items():
        if not seqs:
            continue
        held = state.held_for(source).copy()
        topic = canonical_topic(source[1])
        plan.streams.add(source[1])
        for seq in sorted(seqs):
            r = seqs[seq]
            plan.canonical.append((topic, r.key, r.value, r.headers))
            held.add(seq)
        plan.ledger[source] = held
    return plan


def _dead_record(topic: str, row: SourceRow, reason: str) -> Out:
    headers = [
        *row.headers,
        (H_DEAD_REASON, reason.encode()),
        (H_DEAD_SOURCE, f"{row.topic}/{row.partition}/{row.offset}".encode()),
    ]
    return (topic, row.key, row.value, headers)
