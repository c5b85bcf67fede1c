"""What a site holds under a ship's key, and what it refused (``shorelink fleet
audit-key --kafka``): the ship's records in each stream's canonical topic whose
``sl.proof`` names the key (shorelink/proof.py: a site takes a record only if the key
its proof names verifies it), and its dead letters (``sl.dead.<stream>``) whose proof
names it, by cause: what a revoked key signed above its bound, refused. A header scan
per record; a record whose proof names no key (written before key ids) is counted
apart.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from shorelink.contract import (
    H_ORIGIN,
    H_PROOF,
    H_SEQ,
    LEDGER_TOPIC,
    LINKS_TOPIC,
    canonical_topic,
    dead_topic,
)
from shorelink.fleet.entry import REGISTRY_STREAM
from shorelink.kafka.admin import Admin
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.errors import UnknownTopic
from shorelink.kafka.reading import read_to_end
from shorelink.proof import Proof
from shorelink.ranges import RangeSet

__all__ = ["KeyHoldings", "canonical_streams", "key_holdings"]

#: the dead letter's cause (spark_core/quarantine.py ``H_DEAD_CAUSE``: the kernel does not
#: import the site application)
_DEAD_CAUSE = "sl.dead.cause"


@dataclass
class KeyHoldings:
    """One stream at one site, for one ship and key."""

    #: seqs held whose proof names the key
    signed: RangeSet = field(default_factory=RangeSet)
    #: seqs dead-lettered whose proof names the key, by cause
    refused: dict[str, RangeSet] = field(default_factory=dict)
    #: the ship's records held whose proof names no key (written before key ids)
    without_key_id: int = 0
    #: the ship's records held whose proof names another key
    other_keys: Counter[str] = field(default_factory=Counter)


#: topics named like a canonical topic that hold no ship's records
_NOT_STREAMS = frozenset({LEDGER_TOPIC, LINKS_TOPIC, canonical_topic(REGISTRY_STREAM)})


def canonical_streams(kafka: KafkaEndpoint) -> list[str]:
    """The streams whose canonical topic (``sl.<stream>``) ``kafka`` holds."""
    topics = Admin(kafka).metadata(what=f"topics at {kafka.bootstrap}").topics
    return sorted(
        t.removeprefix("sl.")
        for t in topics
        if t.startswith("sl.") and t.count(".") == 1 and t not in _NOT_STREAMS
    )


def _scan(
    kafka: KafkaEndpoint, topic: str, ship: bytes, key_id: bytes, out: KeyHoldings, dead: bool
) -> None:
    try:
        messages = read_to_end(
            kafka, [topic], group="shorelink-fleet-audit-key", extra={"fetch.wait.max.ms": 5}
        )
        for msg in messages:
            headers = dict(msg.headers() or [])
            seq_text = headers.get(H_SEQ)
            if headers.get(H_ORIGIN) != ship or not seq_text or not seq_text.isdigit():
                continue
            seq, proof = int(seq_text), headers.get(H_PROOF)
            try:
                named = Proof.decode(proof, seq).key_id if isinstance(proof, bytes) else None
            except ValueError:
                named = None
            if dead:
                if named == key_id:
                    raw = headers.get(_DEAD_CAUSE) or b"?"
                    cause = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
                    out.refused.setdefault(cause, RangeSet()).add(seq)
            elif named == key_id:
                out.signed.add(seq)
            elif named is None:
                out.without_key_id += 1
            else:
                out.other_keys[named.hex()] += 1
    except UnknownTopic:
        return


def key_holdings(
    kafka: KafkaEndpoint, ship: str, key_id: str, streams: Iterable[str]
) -> dict[str, KeyHoldings]:
    """Per stream of ``streams``, what ``kafka`` holds and refused of ``ship``'s records
    under key ``key_id`` (16 hex digits)."""
    kid = bytes.fromhex(key_id)
    out = {}
    for stream in streams:
        found = KeyHoldings()
        _scan(kafka, canonical_topic(stream), ship.encode(), kid, found, dead=False)
        _scan(kafka, dead_topic(stream), ship.encode(), kid, found, dead=True)
        out[stream] = found
    return out
