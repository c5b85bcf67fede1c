"""The Kafka record contract (DESIGN.md, "Kafka records"): a public contract that
consumers at HQ depend on.

- key: the record's logical key (a container id, ``position``, ...);
- value: the payload bytes exactly as the sensor published them;
- headers: ``sl.origin``, ``sl.stream``, ``sl.seq`` (decimal ASCII), ``sl.ts`` (event
  time, epoch ms), ``sl.site`` (site whose gateway took it in), ``sl.mqtt_topic``.

Topic names per site live here too, so nobody spells them twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shorelink.errors import ContractError
from shorelink.identity import Identity, check_name

__all__ = [
    "GATEWAY_CURSOR_TOPIC",
    "HEADER_LAYOUT",
    "H_MQTT_TOPIC",
    "H_ORIGIN",
    "H_SEQ",
    "H_SITE",
    "H_STREAM",
    "H_TS",
    "LEDGER_TOPIC",
    "Record",
    "canonical_topic",
    "contract_headers",
    "dead_topic",
    "inbox_topic",
    "ingress_topic",
]

H_ORIGIN = "sl.origin"
H_STREAM = "sl.stream"
H_SEQ = "sl.seq"
H_TS = "sl.ts"
H_SITE = "sl.site"
H_MQTT_TOPIC = "sl.mqtt_topic"
#: the headers, in the order every shorelink writer puts them
HEADER_LAYOUT = (H_ORIGIN, H_STREAM, H_SEQ, H_TS, H_SITE, H_MQTT_TOPIC)

LEDGER_TOPIC = "sl.ledger"
#: compacted; key ``origin/stream``, value JSON ``{"written": ranges, "abandoned": ranges}``:
#: what this site's gateway wrote to ``sl.ingress.*``, committed in the same Kafka
#: transaction as the records (core_gateway/writer.py)
GATEWAY_CURSOR_TOPIC = "sl.gateway.cursor"


def ingress_topic(stream: str) -> str:
    """What ships uploaded to this site's gateway(s)."""
    return f"sl.ingress.{check_name('stream', stream)}"


def inbox_topic(site: str, stream: str) -> str:
    """Raw copies pulled from neighbour ``site``'s canonical topic."""
    return f"sl.inbox.{check_name('site', site)}.{check_name('stream', stream)}"


def canonical_topic(stream: str) -> str:
    """Every identity once; written only by the site's Spark merge."""
    return f"sl.{check_name('stream', stream)}"


def dead_topic(stream: str) -> str:
    """Records that broke the contract, kept for inspection instead of being dropped."""
    return f"sl.dead.{check_name('stream', stream)}"


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


def _header_map(headers: HeaderList) -> dict[str, str]:
    out: dict[str, str] = {}
    items = headers.items() if isinstance(headers, dict) else headers
    for name, raw in items:
        if raw is None:
            continue
        try:
            out[name] = raw.decode() if isinstance(raw, bytes) else raw
        except UnicodeDecodeError:
            raise ContractError(f"header {name} is not UTF-8") from None
    return out


def _parse_int(text: str, name: str) -> int:
    if not text.isascii() or not text.isdigit():
        raise ContractError(f"header {name}={text!r} is not a decimal number")
    return int(text)
