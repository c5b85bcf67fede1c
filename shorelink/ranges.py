"""Sets of sequence numbers kept as sorted, disjoint, inclusive ranges.

Holdings ("which seqs of this ship's stream does a site hold"), the Spark ledger and a
consumer's portable position are all a `RangeSet` per `(origin, stream)`. Seqs arrive
mostly in order, so a set of a million seqs is usually one range: a few numbers.

Text form (used in logs, the ledger and the HTTP API): ``"1-500,502,504-510"``; the
empty set is ``""``.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterable, Iterator

__all__ = ["RangeSet"]


class RangeSet:
    """A mutable set of positive integers stored as inclusive ``(lo, hi)`` ranges."""

    __slots__ = ("_his", "_los")

    def __init__(self, ranges: Iterable[tuple[int, int]] = ()) -> None:
        self._los: list[int] = []
        self._his: list[int] = []
        for lo, hi in ranges:
            self.add_range(lo, hi)

    # -- construction -------------------------------------------------------------------
    @classmethod
    def parse(cls, text: str) -> RangeSet:
        """Parse the text form ``"1-5,7"`` (ASCII digits, any order); raise
        ``ValueError`` naming the bad part. Costs O(n log n) in the ranges whatever
        their order (a neighbour's ledger entry may list them backwards)."""
        pairs = []
        for part in text.split(","):
            part = part.strip()
            if not part:
                continue
            lo_s, sep, hi_s = part.partition("-")
            if not _decimal(lo_s) or (sep and not _decimal(hi_s)):
                raise ValueError(f"bad seq range {part[:40]!r} in {text[:80]!r}")
            pairs.append((int(lo_s), int(hi_s) if sep else int(lo_s)))
        return cls._of_pairs(pairs)

    @classmethod
    def _of_pairs(cls, pairs: list[tuple[int, int]]) -> RangeSet:
        """The ranges ``pairs``, sorted first: each one then lands at the end (adding
        them out of order one by one moves the lists each time, quadratic)."""
        pairs.sort()
        out = cls()
        for lo, hi in pairs:
            out.add_range(lo, hi)
        return out

    @classmethod
    def from_seqs(cls, seqs: Iterable[int]) -> RangeSet:
        out = cls()
        ordered = sorted(seqs)
        if not ordered:
            return out
        lo, hi = ordered[0], ordered[-1]
        if hi - lo + 1 == len(ordered) and ordered == list(range(lo, hi + 1)):
            out.add_range(lo, hi)  # the usual case (a batch's seqs): one run, no loop
            return out
        for s in ordered:
            out.add_range(s, s)
        return out

    def copy(self) -> RangeSet:
        out = RangeSet()
        out._los = list(self._los)
        out._his = list(self._his)
        return out

    # -- mutation -----------------------------------------------------------------------
    def add(self, seq: int) -> None:
        self.add_range(seq, seq)

    def add_range(self, lo: int, hi: int) -> None:
        """Add every seq in ``lo..hi`` (inclusive), merging touching ranges."""
        if lo < 1 or hi < lo:
            raise ValueError(f"bad seq range {lo}-{hi}: need 1 <= lo <= hi")
        los, his = self._los, self._his
        # fast path: appending at the end, the common case for in-order seqs
        if not los or lo > his[-1] + 1:
            los.append(lo)
            his.append(hi)
            return
        if lo >= los[-1] and lo <= his[-1] + 1:
            if hi > his[-1]:
                his[-1] = hi
            return
        # general case: find every range that overlaps or touches [lo-1, hi+1]
        i = bisect.bisect_left(his, lo - 1)
        j = bisect.bisect_right(los, hi + 1)
        if i < j:
            lo = min(lo, los[i])
            hi = max(hi, his[j - 1])
        los[i:j] = [lo]
        his[i:j] = [hi]

    def update(self, other: RangeSet) -> None:
        """Add every seq of ``other``: in place for a few ranges, otherwise one linear
        merge of the two sorted lists (adding many ranges one by one into the middle
        of a long list is quadratic: a holdings with 30,000 holes took 160 ms)."""
        if len(other) <= 16 or not self._los:
            if not self._los:
                self._los, self._his = list(other._los), list(other._his)
                return
            for lo, hi in other:
                self.add_range(lo, hi)
            return
        los: list[int] = []
        his: list[int] = []
        for lo, hi in heapq.merge(
            zip(self._los, self._his, strict=True), zip(other._los, other._his, strict=True)
        ):
            if los and lo <= his[-1] + 1:
                if hi > his[-1]:
                    his[-1] = hi
            else:
                los.append(lo)
                his.append(hi)
        self._los, self._his = los, his

    # -- queries ------------------------------------------------------------------------
    def __contains__(self, seq: object) -> bool:
        if not isinstance(seq, int):
            return False
        i = bisect.bisect_right(self._los, seq) - 1
        return i >= 0 and seq <= self._his[i]

    def contains_range(self, lo: int, hi: int) -> bool:
        i = bisect.bisect_right(self._los, lo) - 1
        return i >= 0 and hi <= self._his[i]

    def contains_all(self, other: RangeSet) -> bool:
        """Is every seq of ``other`` in this set?"""
        return all(self.contains_range(lo, hi) for lo, hi in other)

    def overlaps(self, lo: int, hi: int) -> bool:
        i = bisect.bisect_left(self._his, lo)
        return i < len(self._los) and self._los[i] <= hi

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(zip(self._los, self._his, strict=True))

    def __len__(self) -> int:
        """Number of ranges (not of seqs: see :meth:`count`)."""
        return len(self._los)

    def __bool__(self) -> bool:
        return bool(self._los)

    def count(self) -> int:
        return sum(h - l + 1 for l, h in zip(self._los, self._his, strict=True))  # noqa: E741

    @property
    def first(self) -> int | None:
        return self._los[0] if self._los else None

    @property
    def last(self) -> int | None:
        return self._his[-1] if self._his else None

    def contiguous_end(self) -> int:
        """Highest seq ``n`` such that ``1..n`` are all held (0 if seq 1 is missing)."""
        if self._los and self._los[0] == 1:
            return self._his[0]
        return 0

    def missing(self, lo: int, hi: int) -> RangeSet:
        """The seqs in ``lo..hi`` that this set does not hold."""
        out = RangeSet()
        cur = lo
        for a, b in self:
            if b < cur:
                continue
            if a > hi:
                break
            if a > cur:
                out.add_range(cur, min(a - 1, hi))
            cur = max(cur, b + 1)
            if cur > hi:
                break
        if cur <= hi:
            out.add_range(cur, hi)
        return out

    def difference(self, other: RangeSet) -> RangeSet:
        """The seqs of this set that ``other`` does not hold (one pass over both)."""
        out = RangeSet()
        los, his = other._los, other._his
        j, n = 0, len(los)
        for lo, hi in self:
            cur = lo
            while j < n and his[j] < cur:
                j += 1
            k = j
            while k < n and los[k] <= hi:
                if los[k] > cur:
                    out._los.append(cur)
                    out._his.append(los[k] - 1)
                cur = max(cur, his[k] + 1)
                if his[k] > hi:
                    break
                k += 1
            j = k
            if cur <= hi:
                out._los.append(cur)
                out._his.append(hi)
        return out

    # -- dunder -------------------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        return isinstance(other, RangeSet) and self._los == other._los and self._his == other._his

    __hash__ = None  # type: ignore[assignment]  # mutable: not a dict key

    def __str__(self) -> str:
        return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in self)

    def __repr__(self) -> str:
        return f"RangeSet({str(self)!r})"

    def to_json(self) -> list[list[int]]:
        return [[a, b] for a, b in self]

    @classmethod
    def from_json(cls, data: Iterable[Iterable[int]]) -> RangeSet:
        pairs = []
        for pair in data:
            lo, hi = pair
            if not isinstance(lo, int) or not isinstance(hi, int):
                raise ValueError(f"bad seq range {pair!r:.60}: not two integers")
            pairs.append((lo, hi))
        return cls._of_pairs(pairs)


#: a seq's digits: ASCII only (``int()`` also takes "1_000", "+5" and other scripts'
#: digits), at most 20 (past 2**64 no seq exists; ``int()`` of thousands is slow)
def _decimal(text: str) -> bool:
    return 0 < len(text) <= 20 and text.isascii() and text.isdigit()
