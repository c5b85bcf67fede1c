"""Benchmark: the gateway's ingest rate on loopback, beside a bare Kafka producer.

All real, on loopback: a single-node Kafka (``local_stack.kafka``) and the gateway
(``core_gateway.cli.serve``) as a process of its own (``bench/_stack.py``). The gateway
takes ``--ingest-records`` records as pre-encoded batches of ``--ingest-batch``
(``shorelink.wire.encode_batch``) sent flat out with the edge agent's own client
(``HttpGateway``: the WebSocket upload, ``--ingest-window`` batches in flight per ship),
``--ingest-ships`` ships in parallel: records/s committed. Beside it, a bare
confluent-kafka producer (idempotent, linger 5 ms, lz4, acks=all) produces the same
records with the same key, value and headers (``shorelink.contract.Record(...).headers()``)
to another topic: records/s to ``flush()``. An uncounted warm-up round of both, then
rounds alternate (``--ingest-rounds``, medians reported). Then ``sl.ingress.containers``
is read to its end (read_committed): every seq of every ship exactly once.

``--security both`` (the default) runs all of it twice, side by side: on a plain stack,
then on one as a site runs in production (docs/access-control.md: Kafka with
SASL/SCRAM over TLS and ACLs, the gateway as its own principal serving HTTPS, the bare
producer over SASL_SSL too); ``tls_sasl`` is the cost: each rate secure / plain.

    .venv/bin/python bench/gateway_ingest.py --quick     # ~20 seconds (50k records a round)
    .venv/bin/python bench/gateway_ingest.py             # 200k records a round, 3 rounds

Progress goes to stderr; one JSON object goes to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from _common import (
    add_run_options,
    bench_parser,
    fill_defaults,
    hist_mean_ms,
    pct,
    progress,
    r3,
    require_at_least_one,
    run_bench,
    scrape,
)
from _stack import (
    INGRESS_PARTITIONS,
    SITE,
    STREAM,
    Stack,
    wire_records,
)

from local_stack.process import Proc
from shorelink.errors import ShorelinkError
from shorelink.wire import WireRecord

BARE_TOPIC = "bench.bare.containers"
GOALS = {"ingest_ratio": 0.5}

say = progress("gateway_ingest")


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.ships = [f"loop{i}" for i in range(1, args.ingest_ships + 1)]
        self.next_seq = dict.fromkeys(self.ships, 1)
        modes = ["plain", "secure"] if args.security == "both" else [args.security]
        for m in modes:
            (work / m).mkdir(parents=True, exist_ok=True)
        self.stacks = {m: Stack(work / m, self.ships, say, secure=m == "secure") for m in modes}
        self.stack = self.stacks[modes[0]]
        self.result: dict[str, Any] = {"benchmark": "gateway_ingest"}

    @property
    def procs(self) -> list[Proc]:
        return [p for s in self.stacks.values() for p in s.procs]

    def cleanup(self) -> None:
        for s in self.stacks.values():
            s.cleanup()

    def run(self) -> dict[str, Any]:
        t0 = time.monotonic()
        a = self.args
        self.result["config"] = {
            "ingest_records_per_round": a.ingest_records,
            "ingest_batch": a.ingest_batch,
            "ingest_ships": a.ingest_ships,
            "ingest_window": a.ingest_window,
            "ingest_rounds": a.ingest_rounds,
        }
        # this machine's other load skews every number here: keep it beside them
        self.result["loadavg_1m_at_start"] = round(os.getloadavg()[0], 2)
        for mode, stack in self.stacks.items():
            say(f"=== {mode} stack")
            self.stack = stack
            self.next_seq = dict.fromkeys(self.ships, 1)
            key = "ingest" if mode == "plain" else "ingest_secure"
            stack.start()
            self.ingest(key)
            self.verify(key)
            stack.cleanup()  # the next stack gets the machine to itself
        if len(self.stacks) == 2:
            plain, secure = self.result["ingest"], self.result["ingest_secure"]
            self.result["tls_sasl"] = {
                "gateway_records_s": {
                    "plain": plain["gateway_records_s"],
                    "secure": secure["gateway_records_s"],
                },
                "gateway_secure_over_plain": round(
                    secure["gateway_records_s"] / plain["gateway_records_s"], 3
                ),
                "bare_producer_secure_over_plain": round(
                    secure["bare_producer_records_s"] / plain["bare_producer_records_s"], 3
                ),
            }
        self.result["loadavg_1m_at_end"] = round(os.getloadavg()[0], 2)
        self.result["seconds_total"] = round(time.monotonic() - t0, 1)
        return self.result

    def records(self, ship: str, n: int, seed: int) -> list[WireRecord]:
        first = self.next_seq[ship]
        self.next_seq[ship] = first + n
        return wire_records(ship, first, n, seed)

    def ingest(self, key: str) -> None:
        from shorelink.kafka.topics import TopicSpec, ensure_topics
        from shorelink.wire import Batch, encode_batch

        a = self.args
        ensure_topics(self.stack.endpoint, [TopicSpec(BARE_TOPIC, partitions=INGRESS_PARTITIONS)])
        per_ship = a.ingest_records // len(self.ships)
        gw_rates: list[float] = []
        bare_rates: list[float] = []
        writes: list[float | None] = []
        req_ms: list[float] = []
        # round 0 is not counted: it warms the broker, the gateway and the producer up
        # alike (JIT, connections, partition leaders), so neither side's first round
        # pays for starting the stack
        for r in range(0, a.ingest_rounds + 1):
            recs = {s: self.records(s, per_ship, 100 * r + i) for i, s in enumerate(self.ships)}
            bodies = {
                s: [
                    encode_batch(Batch(s, STREAM, tuple(rs[i : i + a.ingest_batch])))
                    for i in range(0, len(rs), a.ingest_batch)
                ]
                for s, rs in recs.items()
            }
            n = sum(len(rs) for rs in recs.values())
            g0 = scrape(self.stack.gw_metrics_url + "/metrics", None)
            say(f"ingest round {r}/{a.ingest_rounds}: gateway, {n} records")  # 0: warm-up
            last = {s: rs[-1].seq for s, rs in recs.items()}
            elapsed, lat = asyncio.run(self.stack.upload(bodies, last, a.ingest_window))
            g1 = scrape(self.stack.gw_metrics_url + "/metrics", None)
            if not r:
                self.bare_produce(recs)
                say("ingest: warm-up round done (not counted)")
                continue
            gw_rates.append(n / elapsed)
            writes.append(hist_mean_ms(g0, g1, "shorelink_gateway_kafka_write_seconds"))
            req_ms += lat
            say(f"ingest round {r}: gateway {n / elapsed:.0f} records/s")
            say(f"ingest round {r}/{a.ingest_rounds}: bare producer, {n} records")
            bare_s = self.bare_produce(recs)
            bare_rates.append(n / bare_s)
            say(f"ingest round {r}: bare producer {n / bare_s:.0f} records/s")
        gw = statistics.median(gw_rates)
        bare = statistics.median(bare_rates)
        self.result[key] = {
            "records_per_round": per_ship * len(self.ships),
            "gateway_records_s": round(gw),
            "bare_producer_records_s": round(bare),
            "ratio": round(gw / bare, 3),
            "goal_ratio": GOALS["ingest_ratio"],
            "rounds": {
                "gateway_records_s": [round(x) for x in gw_rates],
                "bare_producer_records_s": [round(x) for x in bare_rates],
                "gateway_kafka_write_ms_mean": writes,
            },
            "request_ms": {"p50": r3(pct(req_ms, 0.5)), "p90": r3(pct(req_ms, 0.9))},
            "wire_bytes_per_record": round(
                sum(len(b) for bs in bodies.values() for b in bs) / n, 2
            ),
        }

    def bare_produce(self, recs: dict[str, list[WireRecord]]) -> float:
        from shorelink.contract import Record
        from shorelink.identity import Identity
        from shorelink.kafka.topics import producer

        p = producer(
            self.stack.endpoint,
            {
                "enable.idempotence": True,
                "linger.ms": 5,
                "compression.type": "lz4",
                "queue.buffering.max.messages": 500_000,
            },
        )
        p.list_topics(timeout=10)  # connected before the clock starts
        failed = 0

        def on_delivery(err: Any, _msg: Any) -> None:
            nonlocal failed
            if err is not None:
                failed += 1

        t0 = time.perf_counter()
        for ship, rs in recs.items():
            for r in rs:
                rec = Record(
                    Identity(ship, STREAM, r.seq), r.key.encode(), r.payload, r.ts_ms, SITE, r.topic
                )
                while True:
                    try:
                        p.produce(
                            BARE_TOPIC,
                            value=rec.value,
                            key=rec.key,
                            headers=rec.headers(),
                            on_delivery=on_delivery,
                        )
                        break
                    except BufferError:
                        p.poll(0.05)
                p.poll(0)
        left = p.flush(60)
        elapsed = time.perf_counter() - t0
        if left or failed:
            raise RuntimeError(f"bare producer: {left} not flushed, {failed} failed")
        return elapsed

    def verify(self, key: str) -> None:
        ok, detail, seconds = self.stack.verify({s: self.next_seq[s] - 1 for s in self.ships})
        self.result[key]["exactly_once"] = ok
        self.result[key]["exactly_once_detail"] = detail
        self.result[key]["verify_s"] = seconds


# -- command line --------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = bench_parser("bench/gateway_ingest.py", __doc__)
    add_run_options(p, "small sizes, one round: a run of about 20 seconds", "logs, configs")
    p.add_argument(
        "--ingest-records",
        type=int,
        default=None,
        help="records per gateway ingest round (default 200000; quick 50000)",
    )
    p.add_argument("--ingest-batch", type=int, default=5000, help="records a batch (default 5000)")
    p.add_argument(
        "--ingest-ships", type=int, default=2, help="ships uploading in parallel (default 2)"
    )
    p.add_argument(
        "--ingest-window",
        type=int,
        default=4,
        help="batches in flight per ship on its upload connection (default 4)",
    )
    p.add_argument(
        "--ingest-rounds",
        type=int,
        default=None,
        help="alternating gateway/bare rounds, medians reported (default 3; quick 1)",
    )
    p.add_argument(
        "--security",
        choices=("both", "plain", "secure"),
        default="both",
        help="plain stack, secure stack (SASL/SCRAM over TLS, ACLs, HTTPS), or both side "
        "by side (default both)",
    )
    a = p.parse_args(argv)
    fill_defaults(a, {"ingest_records": (50_000, 200_000), "ingest_rounds": (1, 3)})
    require_at_least_one(
        p, a, "ingest_records", "ingest_batch", "ingest_ships", "ingest_window", "ingest_rounds"
    )
    if a.ingest_records < a.ingest_ships:
        p.error("--ingest-records must be at least --ingest-ships")
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_bench(
        say,
        args.keep,
        "gateway-ingest-",
        lambda work: Bench(args, work),
        errors=(ShorelinkError,),
    )


if __name__ == "__main__":
    sys.exit(main())
