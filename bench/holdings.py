"""Benchmark: what holes in one ``(origin, stream)`` cost per batch, bounded and not.

A hole is a seq a site will never hold (a ship abandoned it: dropped on board) between
seqs it does hold. Every hole is a range in the site's holdings, and the holdings of an
``(origin, stream)`` are rewritten whole with every batch: by the gateway (its cursor in
``sl.gateway.cursor``: written and abandoned ranges) and by the merge (its ``sl.ledger``
entry). An authenticated ship could make a hole per batch on purpose. shorelink bounds
them at ``MAX_HOLDINGS_RANGES`` (shorelink/ledger.py): the gateway refuses a batch that
would abandon past it (422 ``too_many_holes``), the merge dead-letters a record that
would split a full entry.

For each number of holes (``--holes``, default 0, 1k, the bound 10k, 100k and 1M, the
last two what an unbounded site would reach), one batch of ``--batch`` new records on top
of the holdings, timed over ``--rounds`` (median):
- gateway: admission's range work (settled = written | abandoned, its contiguous end,
  the overlap check), the holdings update, and the cursor value it commits (bytes);
- merge: ``plan_batch`` of the batch against the ledger state, and the ledger entry it
  writes (bytes), against :data:`~shorelink.contract.MAX_RECORD_BYTES` (does it fit one
  Kafka record at all?).
The peer is the same batch with no holes. Pure Python, no Kafka: what is measured is the
range work only.

    .venv/bin/python bench/holdings.py [--holes 0,1000,10000,100000,1000000]

Prints one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from _common import progress

from core_gateway.holdings import SourceHoldings
from shorelink.contract import MAX_RECORD_BYTES, Record, ingress_topic
from shorelink.identity import Identity
from shorelink.ledger import MAX_HOLDINGS_RANGES, encode_entry
from shorelink.ranges import RangeSet
from spark_core.merge_state import MergeState, SourceRow, plan_batch

say = progress("holdings")


def holey(holes: int) -> tuple[RangeSet, RangeSet]:
    """Written seqs 1, 3, 5, ... with ``holes`` abandoned seqs 2, 4, ... between them."""
    written = RangeSet((2 * i + 1, 2 * i + 1) for i in range(holes + 1))
    abandoned = RangeSet((2 * i + 2, 2 * i + 2) for i in range(holes))
    return written, abandoned


def gateway_batch(h: SourceHoldings, lo: int, hi: int) -> int:
    """The range work of one admitted and committed batch; the cursor's bytes."""
    settled = h.settled()
    settled.contiguous_end()
    settled.overlaps(lo, hi)
    h.written.add_range(lo, hi)
    return len(h.cursor_value())


def rows(origin: str, lo: int, hi: int) -> list[SourceRow]:
    t = ingress_topic("containers")
    out = []
    for seq in range(lo, hi + 1):
        r = Record(Identity(origin, "containers", seq), b"C1", b"{}", 1, "tokyo", "x")
        out.append(SourceRow(t, 0, seq, r.key, r.value, list(r.headers())))
    return out


def measure(holes: int, batch: int, rounds: int) -> dict[str, Any]:
    written, abandoned = holey(holes)
    top = 2 * holes + 1
    gw_times, merge_times = [], []
    cursor_bytes = ledger_bytes = 0
    for _ in range(rounds):
        lo = top + 1  # fresh holdings each round: the batch extends the last range
        h = SourceHoldings(written.copy(), abandoned.copy())
        t0 = time.perf_counter()
        cursor_bytes = gateway_batch(h, lo, lo + batch - 1)
        gw_times.append(time.perf_counter() - t0)
        state = MergeState(held={("ship", "containers"): written})
        batch_rows = rows("ship", lo, lo + batch - 1)
        t0 = time.perf_counter()
        plan = plan_batch(batch_rows, state)
        _, value = encode_entry("ship", "containers", plan.ledger[("ship", "containers")])
        merge_times.append(time.perf_counter() - t0)
        ledger_bytes = len(value)
    return {
        "holes": holes,
        "gateway_ms_per_batch": round(statistics.median(gw_times) * 1000, 3),
        "cursor_bytes": cursor_bytes,
        "merge_ms_per_batch": round(statistics.median(merge_times) * 1000, 3),
        "ledger_bytes": ledger_bytes,
        "ledger_fits_a_record": ledger_bytes <= MAX_RECORD_BYTES,
        "within_bound": holes <= MAX_HOLDINGS_RANGES,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--holes", default="0,1000,10000,100000,1000000")
    p.add_argument("--batch", type=int, default=1000, help="records per batch (default 1000)")
    p.add_argument("--rounds", type=int, default=5, help="batches timed per point (default 5)")
    args = p.parse_args()
    points = []
    for n in (int(x) for x in args.holes.split(",")):
        say(f"{n} holes")
        points.append(measure(n, args.batch, args.rounds))
    peer = points[0] if points and points[0]["holes"] == 0 else measure(0, args.batch, args.rounds)
    bound = next((x for x in points if x["holes"] == MAX_HOLDINGS_RANGES), None)
    print(
        json.dumps(
            {
                "benchmark": "holdings",
                "max_holdings_ranges": MAX_HOLDINGS_RANGES,
                "batch_records": args.batch,
                "no_holes": peer,
                "at_bound": bound,
                "points": points,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
