"""A site's merge split by origin (docs/data-centre.md, "Scaling out: merges split by
origin, each fenced"): which shard of N takes an origin, which ingress partition the
gateway writes an origin's records to, which partitions a shard reads.

One rule, here, for the gateway (core_gateway/ingress.py: the partition of a record) and
the merge (spark_core: the partitions a shard reads, the origins it takes). An origin's
partition is ``crc32(origin) mod P``; its shard ``crc32(origin) mod N``. With N dividing
P, partition ``p`` holds only origins of shard ``p mod N``, whatever N is: a site that
goes from 2 shards to 4 keeps its ingress as it is. A topic whose partition count N does
not divide (the fleet registry's ingress: one partition) is read whole by every shard,
each taking its own origins. CRC-32, not Python's ``hash``: the same in every process
and every language (Kafka's own murmur2 is the Java client's; CRC-32 is in zlib, and
Java has ``java.util.zip.CRC32``).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

__all__ = ["MAX_SHARDS", "Shard", "origin_hash", "origin_partition"]

#: the most shards a site's merge is split into (a marker key and two transactional ids
#: each; the ingress needs at least as many partitions)
MAX_SHARDS = 64


def origin_hash(origin: str) -> int:
    """The origin's hash: CRC-32 of its UTF-8 name (unsigned)."""
    return zlib.crc32(origin.encode())


def origin_partition(origin: str, partitions: int) -> int:
    """The ingress partition of ``origin``'s records in a topic of ``partitions``."""
    return origin_hash(origin) % partitions


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of ``count`` (0 <= index < count) of a site's merge."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if not 1 <= self.count <= MAX_SHARDS:
            raise ValueError(f"shards: {self.count}, expected 1-{MAX_SHARDS}")
        if not 0 <= self.index < self.count:
            raise ValueError(f"shard {self.index} of {self.count}: expected 0-{self.count - 1}")

    @classmethod
    def parse(cls, text: str) -> Shard:
        """``k/N`` (shard k of N, from 0). ValueError when it is not one."""
        index, sep, count = text.partition("/")
        if not sep or not index.strip().isdigit() or not count.strip().isdigit():
            raise ValueError(f"{text!r}: expected k/N, shard k of N counted from 0 (0/2, 1/2)")
        return cls(int(index), int(count))

    @property
    def suffix(self) -> str:
        """What a shard's query names and transactional ids end with: ``-o<k>of<N>``."""
        return f"-o{self.index}of{self.count}"

    def owns(self, origin: str) -> bool:
        """Whether this shard merges ``origin``'s records."""
        return origin_hash(origin) % self.count == self.index

    def reads(self, partition: int, partitions: int) -> bool:
        """Whether this shard reads ``partition`` of a topic of ``partitions``: its own
        when the shard count divides the partition count, every one when not."""
        if partitions % self.count:
            return True
        return partition % self.count == self.index

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"
