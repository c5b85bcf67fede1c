"""The ledger contract: what a site holds, per ``(origin, stream)``.

``sl.ledger`` is a compacted topic at every site, written only by the site's Spark
merge. Key ``origin/stream`` (UTF-8), value the :class:`~shorelink.ranges.RangeSet` text
of the seqs the site's canonical topic holds (``"1-500,502"``). Gateways read it to
answer "what do you already hold for this ship" so a ship does not resend what arrived
by replication.
"""

from __future__ import annotations

from shorelink.boundary import boundary
from shorelink.errors import ContractError
from shorelink.identity import check_name
from shorelink.ranges import RangeSet

__all__ = ["MAX_HOLDINGS_RANGES", "decode_entry", "encode_entry", "ledger_key"]

#: The most ranges one ``(origin, stream)``'s holdings may have, anywhere (the ledger,
#: the gateway's cursor, its abandoned seqs): every value written per batch stays under
#: about 250 KB (a range is at most ~24 characters of text), far below
#: :data:`~shorelink.contract.MAX_RECORD_BYTES`, and every range operation per batch
#: stays in milliseconds. Holes come from seqs a ship abandoned (one range per episode of
#: dropping on board) and from arrival order; a gateway refuses a batch that would
#: abandon past the bound (422 ``too_many_holes``), and the merge dead-letters a record
#: that would split a full entry once more (only a writer that skipped the gateway can
#: send one).
MAX_HOLDINGS_RANGES = 10_000


def ledger_key(origin: str, stream: str) -> bytes:
    return f"{check_name('origin', origin)}/{check_name('stream', stream)}".encode()


def encode_entry(origin: str, stream: str, held: RangeSet) -> tuple[bytes, bytes]:
    return ledger_key(origin, stream), str(held).encode()


@boundary
def decode_entry(key: bytes | None, value: bytes | None) -> tuple[str, str, RangeSet]:
    """Parse one ledger record; raises ContractError if it is not one, or if it holds
    more than :data:`MAX_HOLDINGS_RANGES` ranges (refused before its ranges are built; no
    merge writes one: its batches and ``Merger.forget`` keep within the bound, and a
    merge refuses to start from its own ledger holding one)."""
    raw = value or b""
    if raw.count(b",") >= MAX_HOLDINGS_RANGES:
        raise ContractError(
            f"ledger entry {(key or b'')[:80]!r}: more than {MAX_HOLDINGS_RANGES} ranges"
        )
    try:
        origin, _, stream = (key or b"").decode().partition("/")
        check_name("origin", origin)
        check_name("stream", stream)
        return origin, stream, RangeSet.parse(raw.decode())
    except (UnicodeDecodeError, ValueError) as exc:
        raise ContractError(f"bad ledger entry {(key or b'')[:80]!r}: {exc}") from exc
