"""A consumer's portable position: ``(origin, stream) -> seqs seen``, as ranges.

Kafka offsets name a place in one cluster's log; the same record has another offset at
every site. A record's identity ``(origin, stream, seq)`` is the same everywhere, so a
position kept as "which identities this consumer has processed" is valid at every site:
MapR's "offsets preserved across replicas" without needing equal offsets
(docs/consumers.md). Seqs arrive mostly in order, so the position is a few ranges per
source, whatever the number of records.

Beside the identities, a position keeps *offset hints*: per topic (by its Kafka topic
id, a UUID that no other cluster, and no topic deleted and created again under the same
name, shares) and partition, the offset below which every record was processed or
skipped. They only save reading at the same site again; anywhere else they match no
topic and are ignored, and they are never needed for correctness (the identities are).

Stores (the :class:`PositionStore` seam): :class:`FileStore` (JSON, written to a
temporary name, fsynced, renamed) and :class:`KafkaStore` (one key per consumer in the
compacted :data:`POSITIONS_TOPIC` of one site's Kafka).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

from confluent_kafka import Producer

from shorelink import strict_json
from shorelink.boundary import boundary
from shorelink.errors import ContractError, ShorelinkError
from shorelink.files import write_atomic
from shorelink.identity import Identity, check_name
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.errors import KafkaClientError, UnknownTopic, kafka_errors
from shorelink.kafka.reading import read_to_end
from shorelink.kafka.topics import TopicSpec, ensure_topics, producer_config
from shorelink.ranges import RangeSet

__all__ = [
    "FORMAT",
    "MAX_POSITION_BYTES",
    "POSITIONS_TOPIC",
    "FileStore",
    "KafkaStore",
    "Position",
    "PositionError",
    "PositionStore",
]

#: the ``format`` field of a saved position; another value is refused, not guessed at
FORMAT = "shorelink.kafka.position/1"
#: a position file larger than this is refused (a position is a few ranges per source)
MAX_POSITION_BYTES = 64 * 1024 * 1024
#: compacted; key: a consumer's name, value: its position (:meth:`Position.to_json`).
#: Two dots, so it is never taken for a canonical topic ``sl.<stream>``.
POSITIONS_TOPIC = "sl.consumer.positions"

Source = tuple[str, str]
#: (Kafka topic id, topic name, partition)
HintKey = tuple[str, str, int]


class PositionError(ShorelinkError):
    """A saved position cannot be read (bad file, wrong format) or saved."""


class Position:
    """The identities a consumer has processed, per ``(origin, stream)``, plus offset
    hints per Kafka topic id. Mutable; not thread-safe."""

    __slots__ = ("_hints", "_seen")

    def __init__(self) -> None:
        self._seen: dict[Source, RangeSet] = {}
        self._hints: dict[HintKey, int] = {}

    # -- identities ----------------------------------------------------------------------
    def seen(self, identity: Identity) -> bool:
        held = self._seen.get((identity.origin, identity.stream))
        return held is not None and identity.seq in held

    def add(self, identity: Identity) -> None:
        src = (identity.origin, identity.stream)
        held = self._seen.get(src)
        if held is None:
            held = self._seen[src] = RangeSet()
        held.add(identity.seq)

    def update(self, other: Position) -> None:
        """Add every identity and hint of ``other`` (a hint moves only forward)."""
        for src, held in other._seen.items():
            mine = self._seen.get(src)
            if mine is None:
                self._seen[src] = held.copy()
            else:
                mine.update(held)
        for key, off in other._hints.items():
            self.hint(key, off)

    def sources(self) -> Iterator[tuple[Source, RangeSet]]:
        """``((origin, stream), seqs seen)``, sorted by source."""
        for src in sorted(self._seen):
            yield src, self._seen[src]

    def seqs(self, origin: str, stream: str) -> RangeSet:
        return self._seen.get((origin, stream), RangeSet()).copy()

    def count(self) -> int:
        """Identities held."""
        return sum(r.count() for r in self._seen.values())

    def __bool__(self) -> bool:
        return bool(self._seen) or bool(self._hints)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Position)
            and self._seen == other._seen
            and self._hints == other._hints
        )

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        srcs = ", ".join(f"{o}/{s}:{r}" for (o, s), r in self.sources())
        return f"Position({srcs})"

    # -- offset hints --------------------------------------------------------------------
    def hint(self, key: HintKey, next_offset: int) -> None:
        """Every record of partition ``key`` below ``next_offset`` was handled."""
        if next_offset > self._hints.get(key, -1):
            self._hints[key] = next_offset

    def hints(self, topic_id: str) -> dict[int, int]:
        """``partition -> next offset`` of the topic whose Kafka topic id is ``topic_id``."""
        return {p: off for (i, _t, p), off in self._hints.items() if i == topic_id}

    # -- JSON ----------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "sources": [
                {"origin": o, "stream": s, "seen": str(r)} for (o, s), r in self.sources() if r
            ],
            "offsets": [
                {"topic_id": i, "topic": t, "partition": p, "next": off}
                for (i, t, p), off in sorted(self._hints.items())
            ],
        }

    @classmethod
    def from_json(cls, data: object) -> Position:
        """The position :meth:`to_json` wrote; :class:`PositionError` naming the bad part
        for anything else (a hostile or damaged file must not become a wrong position)."""
        if not isinstance(data, dict):
            raise PositionError(f"expected a JSON object, got {type(data).__name__}")
        if data.get("format") != FORMAT:
            raise PositionError(f"format is {data.get('format')!r}, expected {FORMAT!r}")
        out = cls()
        for i, src in enumerate(_list(data, "sources")):
            where = f"sources[{i}]"
            origin, stream, seen = (
                _field(src, where, k, str) for k in ("origin", "stream", "seen")
            )
            try:
                check_name("origin", origin)
                check_name("stream", stream)
                held = RangeSet.parse(seen)
            except (ContractError, ValueError) as exc:
                raise PositionError(f"{where}: {exc}") from None
            out._seen.setdefault((origin, stream), RangeSet()).update(held)
        for i, h in enumerate(_list(data, "offsets")):
            where = f"offsets[{i}]"
            topic_id = _field(h, where, "topic_id", str)
            topic = _field(h, where, "topic", str)
            part = _field(h, where, "partition", int)
            nxt = _field(h, where, "next", int)
            if part < 0 or nxt < 0:
                raise PositionError(f"{where}: partition and next must be >= 0")
            out.hint((topic_id, topic, part), nxt)
        return out

    def dumps(self) -> bytes:
        return json.dumps(self.to_json(), separators=(",", ":")).encode()

    @classmethod
    @boundary
    def loads(cls, raw: bytes | str) -> Position:
        if len(raw) > MAX_POSITION_BYTES:
            raise PositionError(f"larger than {MAX_POSITION_BYTES} bytes")
        try:
            data = strict_json.loads(raw)
        except ValueError as exc:  # invalid UTF-8, NaN, nesting too deep too
            raise PositionError(f"not JSON: {exc}") from None
        return cls.from_json(data)

    @classmethod
    def of(cls, identities: Iterable[Identity]) -> Position:
        out = cls()
        for i in identities:
            out.add(i)
        return out


def _list(data: dict[str, Any], key: str) -> list[Any]:
    v = data.get(key, [])
    if not isinstance(v, list):
        raise PositionError(f"{key}: expected a list")
    return v


def _field(obj: object, where: str, key: str, tp: type) -> Any:
    if not isinstance(obj, dict):
        raise PositionError(f"{where}: expected an object")
    v = obj.get(key)
    if not isinstance(v, tp) or isinstance(v, bool):
        raise PositionError(f"{where}.{key}: expected {tp.__name__}, got {v!r}")
    return v


class PositionStore(Protocol):
    """Where a consumer keeps its position between runs."""

    def load(self) -> Position:
        """The saved position, or an empty one if nothing was saved yet."""
        ...

    def save(self, position: Position) -> None:
        """Durably replace the saved position (it survives a crash once this returns)."""
        ...


class FileStore:
    """A JSON file, replaced atomically: written to ``<name>.tmp``, fsynced, renamed,
    and the directory fsynced, so a crash leaves the old position or the new one."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def load(self) -> Position:
        try:
            with open(self.path, "rb") as f:
                raw = f.read(MAX_POSITION_BYTES + 1)
        except FileNotFoundError:
            return Position()
        except OSError as exc:
            raise PositionError(f"{self.path}: cannot read: {exc}") from exc
        try:
            return Position.loads(raw)
        except PositionError as exc:
            raise PositionError(f"{self.path}: not a shorelink position: {exc}") from None

    def save(self, position: Position) -> None:
        try:
            write_atomic(self.path, position.dumps())
        except OSError as exc:
            raise PositionError(f"{self.path}: cannot save: {exc}", retryable=True) from exc


class KafkaStore:
    """The position under key ``name`` in :data:`POSITIONS_TOPIC` (compacted, created
    on first save) of one site's Kafka, reached as ``kafka`` says (the consumer's own
    principal at a secured site: it must be allowed to read and write that topic,
    docs/access-control.md). A site's topic is not replicated to other sites: for
    failover, load it from the site that is still up or keep a :class:`FileStore` too
    (docs/consumers.md)."""

    def __init__(self, kafka: KafkaEndpoint, name: str) -> None:
        if not name:
            raise PositionError("a consumer name is needed to key its position")
        self.kafka = kafka
        self.bootstrap = kafka.bootstrap
        self.name = name
        self.timeout = kafka.timeout_s
        self._producer: Producer | None = None

    def load(self) -> Position:
        found: bytes | None = None
        try:
            for msg in read_to_end(self.kafka, [POSITIONS_TOPIC], timeout=self.timeout):
                if msg.key() == self.name.encode():
                    found = msg.value()  # offset order: the last one wins
        except UnknownTopic:
            return Position()  # nothing saved at this site yet
        except KafkaClientError as exc:
            raise PositionError(
                f"cannot read {POSITIONS_TOPIC} at {self.bootstrap}: {exc}", retryable=True
            ) from exc
        if not found:
            return Position()  # never saved, or deleted (a tombstone)
        try:
            return Position.loads(found)
        except PositionError as exc:
            raise PositionError(f"{POSITIONS_TOPIC}[{self.name}]: {exc}") from None

    def save(self, position: Position) -> None:
        try:
            if self._producer is None:
                ensure_topics(self.kafka, [TopicSpec(POSITIONS_TOPIC, compacted=True)])
            with kafka_errors():
                if self._producer is None:
                    self._producer = Producer(
                        producer_config(self.kafka, {"enable.idempotence": True})
                    )
                self._producer.produce(
                    POSITIONS_TOPIC, key=self.name.encode(), value=position.dumps()
                )
                left = self._producer.flush(self.timeout)
        except (KafkaClientError, BufferError) as exc:  # TopicError is a KafkaClientError
            raise PositionError(
                f"cannot save position at {self.bootstrap}: {exc}", retryable=True
            ) from exc
        if left:
            raise PositionError(
                f"position not acknowledged by {self.bootstrap} within {self.timeout}s",
                retryable=True,
            )
