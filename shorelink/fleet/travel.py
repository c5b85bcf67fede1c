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
from collections.abc import Sequence

from shorelink.contract import H_PROOF, contract_headers
from shorelink.fleet.entry import FLEET_ORIGIN, REGISTRY_STREAM, Entry, FleetKey, RegistryError
from shorelink.proof import SIGNATURE_BYTES, chunks, proofs, record_hash, sign_records

__all__ = ["RECORD_KEY", "RetiredChunk", "entry_record", "retired_proofs", "sign_retired"]

#: every registry record's Kafka key: one key, one partition of ``sl.registry``, the
#: entries in the merge's order
RECORD_KEY = b"registry"


def _ts_ms(entry: Entry) -> int:
    return calendar.timegm(time.strptime(entry.time, "%Y-%m-%dT%H:%M:%SZ")) * 1000


def _leaf(entry: Entry) -> bytes:
    return record_hash(entry.version, _ts_ms(entry), RECORD_KEY, b"", entry.raw)


def entry_record(
    entry: Entry, key: FleetKey, site: str, proof: bytes | None = None
) -> tuple[bytes, bytes, list[tuple[str, str | bytes | None]]]:
    """The record of ``entry`` as ``site``'s ingress holds it (key, value, headers),
    proved by ``key`` (the fleet key that signed the entry) as a ship proves its own,
    or by ``proof`` (:func:`retired_proofs`: an entry a retired fleet key signed)."""
    seq, ts = entry.version, _ts_ms(entry)
    if proof is None:
        if key.id != entry.signer:
            raise RegistryError(
                f"signed by fleet key {entry.signer}, which this registry no longer holds, "
                "and no proof of its record was kept when it was rotated",
                version=entry.version,
            )
        leaf = _leaf(entry)
        sigs = sign_records(key, FLEET_ORIGIN, REGISTRY_STREAM, seq, [leaf])  # type: ignore[arg-type]
        proof = proofs(seq, [leaf], sigs, [bytes.fromhex(key.id)])[0].encode()
    headers = contract_headers(
        FLEET_ORIGIN.encode(), REGISTRY_STREAM.encode(), seq, ts, site.encode(), b""
    )
    return RECORD_KEY, entry.raw, [*headers, (H_PROOF, proof)]


#: a chunk of the records of entries a fleet key signed, signed by that key when it was
#: rotated: (first version, count, key id in hex, signature)
RetiredChunk = tuple[int, int, str, bytes]


def sign_retired(entries: Sequence[Entry], key: FleetKey) -> list[RetiredChunk]:
    """The records of ``entries`` (consecutive versions, each signed by ``key``) signed
    by ``key`` in chunks, as a ship signs a batch: what proves them once headquarters no
    longer holds ``key`` (``shorelink fleet rotate-fleet-key``; :func:`retired_proofs`).
    One signature per 128 entries."""
    if not entries:
        return []
    first = entries[0].version
    if [e.version for e in entries] != list(range(first, first + len(entries))):
        raise RegistryError("the entries a fleet key signed are consecutive", version=first)
    leaves = [_leaf(e) for e in entries]
    sigs = sign_records(key, FLEET_ORIGIN, REGISTRY_STREAM, first, leaves)  # type: ignore[arg-type]
    return [
        (f, n, key.id, sigs[j * SIGNATURE_BYTES : (j + 1) * SIGNATURE_BYTES])
        for j, (f, n) in enumerate(chunks(first, len(entries)))
    ]


def retired_proofs(
    entries: Sequence[Entry], signed: Sequence[RetiredChunk], wanted: set[int]
) -> dict[int, bytes]:
    """The ``sl.proof`` of each record of version in ``wanted`` that a chunk of
    ``signed`` covers; ``entries``: the log from version 1 (the chunks' other records'
    hashes make the paths)."""
    out: dict[int, bytes] = {}
    for first, count, kid, sig in signed:
        if not any(first <= v < first + count for v in wanted):
            continue
        chunk = list(entries[first - 1 : first - 1 + count])
        if len(chunk) != count or chunk[0].version != first:
            continue  # not in this log (it was cut): the proof cannot be made
        leaves = [_leaf(e) for e in chunk]
        made = proofs(first, leaves, sig, [bytes.fromhex(kid)])
        out.update({first + i: p.encode() for i, p in enumerate(made) if first + i in wanted})
    return out
