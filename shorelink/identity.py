"""Record identity ``(origin, stream, seq)``: the one rule everything rests on.

``origin`` is the ship (or site) whose edge log first committed the record, ``stream`` a
configured class of data, ``seq`` gapless from 1 per ``(origin, stream)``. Every check,
test and audit counts identities, not messages.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from shorelink.errors import ContractError

__all__ = ["NAME_RE", "Identity", "check_name"]

#: Origins, streams and site names: lowercase, digits, ``_`` and ``-``; they appear in
#: Kafka topic names, URLs and ledger keys, so nothing that needs escaping. Match it
#: whole (``NAME_RE.fullmatch``): with ``match`` and ``$``, ``"nav\n"`` would pass. The
#: Spark SQL form (``^…\z``) is generated from this pattern (spark_core/contract_sql.py).
NAME_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
#: names no stream may take: ``sl.<name>`` is a topic of every site that is not a
#: stream's canonical topic (the ledger, the link reports: shorelink/contract.py)
NOT_STREAMS = frozenset({"ledger", "links"})


def check_name(kind: str, value: str) -> str:
    """Return ``value`` if it is a valid origin/stream/site name, else raise."""
    if not isinstance(value, str) or not NAME_RE.fullmatch(value):
        raise ContractError(
            f"bad {kind} name {value!r:.80}: use 1-63 of a-z 0-9 _ - (starting with a letter or digit)"
        )
    if kind == "stream" and value in NOT_STREAMS:
        raise ContractError(f"bad stream name {value!r}: sl.{value} is not a stream's topic")
    return value


@dataclass(frozen=True, slots=True, order=True)
class Identity:
    origin: str
    stream: str
    seq: int

    def __post_init__(self) -> None:
        check_name("origin", self.origin)
        check_name("stream", self.stream)
        if not isinstance(self.seq, int) or self.seq < 1:
            raise ContractError(f"bad seq {self.seq!r}: seqs start at 1")

    @property
    def source(self) -> tuple[str, str]:
        """The ``(origin, stream)`` pair whose seqs are gapless."""
        return (self.origin, self.stream)

    def __str__(self) -> str:
        return f"{self.origin}/{self.stream}/{self.seq}"
