"""The ledger contract: what a site holds, per ``(origin, stream)``.

``sl.ledger`` is a compacted topic at every site, written only by the site's Spark
merge. Key ``origin/stream`` (UTF-8), value the :class:`~shorelink.ranges.RangeSet` text
of the seqs the site's canonical topic holds (``"1-500,502"``). Gateways read it to
answer "what do you already hold for this ship" so a ship does not resend what arrived
by replication.
"""

from __future__ import annotations

from shorelink.errors import ContractError
from shorelink.identity import check_name
from shorelink.ranges import RangeSet

__all__ = ["decode_entry", "encode_entry", "ledger_key"]


def ledger_key(origin: str, stream: str) -> bytes:
    return f"{check_name('origin', origin)}/{check_name('stream', stream)}".encode()


def encode_entry(origin: str, stream: str, held: RangeSet) -> tuple[bytes, bytes]:
    return ledger_key(origin, stream), str(held).encode()


def decode_entry(key: bytes | None, value: bytes | None) -> tuple[str, str, RangeSet]:
    """Parse one ledger record; raises ContractError if it is not one."""
    try:
        origin, _, stream = (key or b"").decode().partition("/")
        check_name("origin", origin)
        check_name("stream", stream)
        return origin, stream, RangeSet.parse((value or b"").decode())
    except (UnicodeDecodeError, ValueError) as exc:
        raise ContractError(f"bad ledger entry {key!r}: {exc}") from exc
