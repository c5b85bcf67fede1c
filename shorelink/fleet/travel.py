"""The registry as records of the system itself (docs/fleet-registry.md, "How it
travels"): headquarters publishes each entry (shorelink/kafka/registry.py) into its own ``sl.ingress.registry`` as the
record ``(fleet, registry, version)``; the merge and replication carry it to every
site's ``sl.registry`` exactly once by that identity, like any stream.

Why a ``sl.proof`` on a record whose entry is signed already: the merge keeps the first
copy of an identity, so a record a hostile neighbour made up at seq N would take the
entry N's place at every site behind it, and the chain would stop there for good. The
merge checks a pulled record's proof against its origin's keys (shorelink/proof.py), and
a site's keys of the origin ``fleet`` are the fleet keys its registry names
(:func:`shorelink.fleet.views.site_ship_keys`): such a record is dead-lettered, never
taken. What a site *trusts* is still the entry's own signature and chain
(shorelink/fleet/follow.py).
"""

from __future__ import annotations

import calendar
import time

from shorelink.contract import H_PROOF, contract_headers
from shorelink.fleet.entry import FLEET_ORIGIN, REGISTRY_STREAM, Entry, FleetKey, RegistryError
from shorelink.proof import proofs, record_hash, sign_records

__all__ = ["RECORD_KEY", "entry_record"]

#: every registry record's Kafka key: one key, one partition of ``sl.registry``, the
#: entries in the merge's order
RECORD_KEY = b"registry"


def _ts_ms(entry: Entry) -> int:
    return calendar.timegm(time.strptime(entry.time, "%Y-%m-%dT%H:%M:%SZ")) * 1000


def entry_record(
    entry: Entry, key: FleetKey, site: str
) -> tuple[bytes, bytes, list[tuple[str, str | bytes | None]]]:
    """The record of ``entry`` as ``site``'s ingress holds it (key, value, headers),
    proved by ``key`` (the fleet key that signed the entry) as a ship proves its own."""
    if key.id != entry.signer:
        raise RegistryError(
            f"signed by fleet key {entry.signer}, which this registry no longer holds: "
            "publish every entry before rotating the fleet key",
            version=entry.version,
        )
    seq, ts = entry.version, _ts_ms(entry)
    leaf = record_hash(seq, ts, RECORD_KEY, b"", entry.raw)
    sigs = sign_records(key, FLEET_ORIGIN, REGISTRY_STREAM, seq, [leaf])  # type: ignore[arg-type]
    proof = proofs(seq, [leaf], sigs, [bytes.fromhex(key.id)])[0].encode()
    headers = contract_headers(
        FLEET_ORIGIN.encode(), REGISTRY_STREAM.encode(), seq, ts, site.encode(), b""
    )
    return RECORD_KEY, entry.raw, [*headers, (H_PROOF, proof)]
