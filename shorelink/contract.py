"""The Kafka record contract (docs/design.md, "The record contract"): a public contract
that consumers at HQ depend on.

- key: the record's logical key (a container id, ``position``, ...);
- value: the payload bytes exactly as the sensor published them;
- headers: ``sl.origin``, ``sl.stream``, ``sl.seq`` (decimal ASCII), ``sl.ts`` (event
  time, epoch ms), ``sl.site`` (site whose gateway took it in), ``sl.mqtt_topic``; then
  ``sl.proof`` on the record of a ship that signs (shorelink/proof.py); in a canonical
  or relay topic also ``sl.entered`` (when the entry site's gateway wrote it into
  Kafka, epoch ms on that site's clock), after them.

Readers of a canonical topic ``sl.<stream>`` must read with
``isolation.level=read_committed``: the merge writes in Kafka transactions, and a
``read_uncommitted`` reader also sees the records of aborted transactions, which the
replay writes again, as duplicates (docs/exactly-once.md, "Reading the canonical
topics").

Topic names per site live here too, so nobody spells them twice, and so does the one
size limit every hop checks (:data:`MAX_RECORD_BYTES`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shorelink.boundary import boundary
from shorelink.errors import ContractError
from shorelink.identity import NOT_STREAMS, Identity, check_name

__all__ = [
    "CANONICAL_INDEX_TOPIC",
    "DEAD_UNKNOWN_TOPIC",
    "GATEWAY_CURSOR_TOPIC",
    "HEADER_LAYOUT",
    "H_ENTERED",
    "H_MQTT_TOPIC",
    "H_ORIGIN",
    "H_PROOF",
    "H_SEQ",
    "H_SITE",
    "H_STREAM",
    "H_TS",
    "KAFKA_MAX_MESSAGE_BYTES",
    "LEDGER_TOPIC",
    "LINKS_TOPIC",
    "MARKER_TOPIC",
    "MAX_INT64",
    "MAX_RECORD_BYTES",
    "MAX_TS_MS",
    "RELAYED_TOPIC",
    "RELAY_INDEX_TOPIC",
    "Record",
    "canonical_topic",
    "contract_headers",
    "customer_topic",
    "dead_topic",
    "entered_ms",
    "ingress_topic",
    "marker_key",
    "oversized_record",
    "record_bytes",
    "relay_topic",
]

H_ORIGIN = "sl.origin"
H_STREAM = "sl.stream"
H_SEQ = "sl.seq"
H_TS = "sl.ts"
H_SITE = "sl.site"
H_MQTT_TOPIC = "sl.mqtt_topic"
#: the headers, in the order every shorelink writer puts them
HEADER_LAYOUT = (H_ORIGIN, H_STREAM, H_SEQ, H_TS, H_SITE, H_MQTT_TOPIC)
#: After :data:`HEADER_LAYOUT`, on the record of a ship that signs (shorelink/proof.py):
#: what proves it is the ship's (its chunk, the chunk's signature, its Merkle path). The
#: gateway writes it after checking the batch's signatures; every site carries it
#: unchanged and every merge checks it on what it pulls (docs/replication.md).
H_PROOF = "sl.proof"
#: After :data:`HEADER_LAYOUT` (and :data:`H_PROOF`) in a canonical or relay topic: when the entry site's
#: gateway wrote the record into ``sl.ingress.<stream>`` (that record's Kafka timestamp,
#: epoch ms on the entry site's clock). The entry site's merge adds it; every other site
#: carries it unchanged, so a record's own timestamp at each site (when that site's merge
#: wrote it) and this header give its timeline hop by hop (docs/replication.md).
H_ENTERED = "sl.entered"

#: The largest record shorelink carries anywhere, counted by :func:`record_bytes`
#: (payload + key + MQTT topic, UTF-8). Defined once and checked at every hop: the ship
#: quarantines a bigger message (edge_agent/ingest.py), the wire format neither encodes
#: nor decodes a batch holding one (the gateway refuses that batch alone: 413
#: ``record_too_large``), the merge dead-letters one that reached a source topic anyway,
#: and every producer and topic shorelink creates takes :data:`KAFKA_MAX_MESSAGE_BYTES`.
MAX_RECORD_BYTES = 1024 * 1024
#: Kafka's own limit at every hop: each producer's ``message.max.bytes`` and each
#: topic's ``max.message.bytes`` (brokers default to 1 MiB). Room for one record of
#: :data:`MAX_RECORD_BYTES` with its ``sl.*`` headers (names of at most 63 bytes, seq and
#: time in decimal) and Kafka's record-batch framing, with a wide margin.
KAFKA_MAX_MESSAGE_BYTES = MAX_RECORD_BYTES + 64 * 1024
#: The latest event time (``sl.ts``) shown as a time: the last millisecond of the year
#: 9999, the most Python's ``datetime``, Delta's readers and most date libraries hold.
#: ``sl.ts`` is the ship's word (up to 18 digits); beyond this a table's ``ts`` column
#: is NULL (the header kept as it came), where it would break every reader of the row.
MAX_TS_MS = 253_402_300_799_999
#: The largest ``sl.seq`` and ``sl.ts`` the contract takes: a signed 64-bit integer, what
#: the wire format carries (``shorelink.wire.MAX_SEQ``), Spark's BIGINT and the proof's
#: record hash hold. A record beyond it breaks the contract (a neighbour's hostile or
#: buggy record is dead-lettered, not retried for ever).
MAX_INT64 = 2**63 - 1

LEDGER_TOPIC = "sl.ledger"
#: compacted; key ``origin/stream``, value JSON ``{"written": ranges, "abandoned": ranges}``:
#: what this site's gateway wrote to ``sl.ingress.*``, committed in the same Kafka
#: transaction as the records (core_gateway/ingress.py)
GATEWAY_CURSOR_TOPIC = "sl.gateway.cursor"
#: compacted; key :func:`marker_key`, value JSON: a merge's head (its last committed
#: batch) and, keyed under it, one record per source (its cursors) and per topic it
#: indexes (its relay index tail), each written by the transaction that moved it
#: (spark_core/merge_state.py)
MARKER_TOPIC = "sl.merge.marker"
#: compacted; key ``<entry>/<origin>/<stream>``, value the seqs (ranges) this site wrote
#: to ``sl.relay.<entry>.<stream>``: so a record that reaches the site again through
#: another entry is relayed under that entry too, once (spark_core/merge_state.py)
RELAYED_TOPIC = "sl.merge.relayed"
#: key a relay topic, value JSON: a segment of that relay topic (offsets per partition)
#: and the seqs written there, so a neighbour's first read of a relay topic starts at
#: what it lacks (spark_core/relay_index.py); retention as the relay topics'
RELAY_INDEX_TOPIC = "sl.relay.index"
#: the same for this site's canonical topics (key a canonical topic), so a neighbour
#: that lacks records this site holds finds them by identity, not by a scan
#: (spark_core/repair.py); retention as the canonical topics'
CANONICAL_INDEX_TOPIC = "sl.canonical.index"
#: malformed records whose source topic names no valid stream (the merge's dead letters)
DEAD_UNKNOWN_TOPIC = "sl.dead.unknown"
#: compacted; key: a site's name, value JSON: which of its neighbours that site could
#: read last, and when (spark_core/routing.py). Each site keeps the latest report of
#: every site it heard of, so the link state spreads along the replication links.
LINKS_TOPIC = "sl.links"
if {LEDGER_TOPIC, LINKS_TOPIC} != {f"sl.{n}" for n in NOT_STREAMS}:
    raise ImportError("identity.NOT_STREAMS must name the sl.<x> topics that are no stream's")


def marker_key(site: str, query: str = "merge", part: str | None = None) -> bytes:
    """The key of a site query's head in :data:`MARKER_TOPIC`: ``<site>/<query>``; with
    ``part``, of one of its records keyed per source or topic: ``<site>/<query>/<part>``
    (a site's and a query's names hold no ``/``)."""
    return (f"{site}/{query}" if part is None else f"{site}/{query}/{part}").encode()


def ingress_topic(stream: str) -> str:
    """What ships uploaded to this site's gateway(s)."""
    return f"sl.ingress.{check_name('stream', stream)}"


def relay_topic(entry: str, stream: str) -> str:
    """The records of ``stream`` that entered the system at site ``entry`` (where
    the merge read them: spark_core/merge.py), as this site holds them: what neighbours pull, one topic per
    entry site so that each pulls each record from one place (docs/replication.md)."""
    return f"sl.relay.{check_name('site', entry)}.{check_name('stream', stream)}"


def canonical_topic(stream: str) -> str:
    """Every identity once; written only by the site's Spark merge."""
    return f"sl.{check_name('stream', stream)}"


def customer_topic(customer: str, stream: str) -> str:
    """The records of ``stream`` about ``customer``'s containers, each once: what that
    customer may read (docs/access-control.md)."""
    return f"sl.customer.{check_name('customer', customer)}.{check_name('stream', stream)}"


def dead_topic(stream: str) -> str:
    """Records that broke the contract, kept for inspection instead of being dropped."""
    return f"sl.dead.{check_name('stream', stream)}"


def record_bytes(key: str | bytes, value: bytes, mqtt_topic: str | bytes) -> int:
    """A record's size as :data:`MAX_RECORD_BYTES` counts it."""
    k = len(key.encode()) if isinstance(key, str) else len(key)
    t = len(mqtt_topic.encode()) if isinstance(mqtt_topic, str) else len(mqtt_topic)
    return k + len(value) + t


def oversized_record(
    keys: Sequence[str | bytes], values: Sequence[bytes], topics: Sequence[str | bytes]
) -> int | None:
    """The index of the first record over :data:`MAX_RECORD_BYTES` among the columns,
    or None. Cheap when nothing is near the limit (three ``max`` over lengths; a str
    counts 4 bytes a character there), exact otherwise."""
    if not values:
        return None
    if (
        max(map(len, values)) + 4 * max(map(len, keys)) + 4 * max(map(len, topics))
        <= MAX_RECORD_BYTES
    ):
        return None
    for i, (k, v, t) in enumerate(zip(keys, values, topics, strict=True)):
        if record_bytes(k, v, t) > MAX_RECORD_BYTES:
            return i
    return None


HeaderList = Sequence[tuple[str, bytes | str | None]] | dict[str, bytes | str | None]


def contract_headers(
    origin: bytes, stream: bytes, seq: int, ts_ms: int, site: bytes, mqtt_topic: bytes
) -> list[tuple[str, bytes]]:
    """A record's headers in :data:`HEADER_LAYOUT`, from values already encoded (a
    writer's hot path encodes origin, stream and site once per batch)."""
    return [
        (H_ORIGIN, origin),
        (H_STREAM, stream),
        (H_SEQ, b"%d" % seq),
        (H_TS, b"%d" % ts_ms),
        (H_SITE, site),
        (H_MQTT_TOPIC, mqtt_topic),
    ]


@dataclass(frozen=True, slots=True)
class Record:
    """One record as it travels in Kafka."""

    identity: Identity
    key: bytes
    value: bytes
    ts_ms: int
    site: str
    mqtt_topic: str

    def headers(self) -> list[tuple[str, bytes]]:
        i = self.identity
        return contract_headers(
            i.origin.encode(),
            i.stream.encode(),
            i.seq,
            self.ts_ms,
            self.site.encode(),
            self.mqtt_topic.encode(),
        )

    @classmethod
    @boundary
    def from_kafka(
        cls, key: bytes | None, value: bytes | None, headers: HeaderList | None
    ) -> Record:
        """Rebuild a record from a consumed Kafka message; raise ContractError if it
        does not follow the contract (missing header, bad seq, ...)."""
        h = _header_map(headers or ())
        try:
            identity = Identity(h[H_ORIGIN], h[H_STREAM], _parse_int(h[H_SEQ], H_SEQ))
            ts = _parse_int(h[H_TS], H_TS)
            site = h[H_SITE]
            topic = h.get(H_MQTT_TOPIC, "")
        except KeyError as exc:
            raise ContractError(f"record lacks header {exc.args[0]}") from None
        return cls(identity, key or b"", value or b"", ts, site, topic)


@boundary
def entered_ms(headers: HeaderList | None) -> int | None:
    """The :data:`H_ENTERED` header's value (epoch ms), None where a record has none
    (an ingress record) or one that is no decimal number: it only informs."""
    items = (headers.items() if isinstance(headers, dict) else headers) or ()
    raw = next((v for k, v in reversed(list(items)) if k == H_ENTERED and v is not None), None)
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    return int(text) if text and text.isascii() and text.isdigit() and len(text) < 19 else None


_CONTRACT_NAMES = frozenset(HEADER_LAYOUT)


def _header_map(headers: HeaderList) -> dict[str, str]:
    """The contract's headers as text (the last non-null value of each name); any other
    header (``sl.proof`` is binary) is not the contract's to read."""
    out: dict[str, str] = {}
    items = headers.items() if isinstance(headers, dict) else headers
    for name, raw in items:
        if raw is None or name not in _CONTRACT_NAMES:
            continue
        try:
            out[name] = raw.decode() if isinstance(raw, bytes) else raw
        except UnicodeDecodeError:
            raise ContractError(f"header {name} is not UTF-8") from None
    return out


def _parse_int(text: str, name: str) -> int:
    if not text.isascii() or not text.isdigit():
        raise ContractError(f"header {name}={text!r} is not a decimal number")
    digits = text.lstrip("0") or "0"
    # 19 digits hold MAX_INT64: a longer number is refused before int() reads it (past
    # 4300 digits int() itself would raise ValueError)
    if len(digits) > 19 or int(digits) > MAX_INT64:
        raise ContractError(f"header {name}={text[:24]!r}... is beyond 2**63-1")
    return int(digits)
