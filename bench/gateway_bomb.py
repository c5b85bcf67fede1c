"""Benchmark: the real gateway's memory and its answers to honest ships while one ship
sends the security review's decompression bomb (finding H1), beside the same gateway with no bomb.

All real, on loopback: a single-node Kafka and ``shorelink-gateway``'s server as a
process of its own (``bench/_stack.py``). ``--ships`` honest ships upload container
telemetry through the edge agent's own client (``HttpGateway``: the WebSocket upload,
``--window`` batches in flight each), ``--batches`` batches of ``--batch`` records per
ship a round, ``--rounds`` rounds alone (the peer), then rounds for as long as one
more ship POSTs the bomb ``--bombs`` times, one after the other (each a few KiB on the
wire, 1,300 number columns over 50,000 records that decompress to 65 MB: at the default
64 MiB cap; ``tests/wire_bombs.py`` builds it). Reported side by side: the honest sends' p50/p99
ms, the gateway process's peak RSS (VmHWM) and its decode workers' after each phase,
the bomb's answers and the seconds each took; then ``sl.ingress.containers`` is read to
its end (every honest seq exactly once, none of the bomber's). The goal: the gateway
under the documented 1 GiB (docs/gateway-api.md, "Memory") and the bomb refused.

    .venv/bin/python bench/gateway_bomb.py --quick     # ~1 minute
    .venv/bin/python bench/gateway_bomb.py --quick --bomb templates
    .venv/bin/python bench/gateway_bomb.py

Progress goes to stderr; one JSON object goes to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
from _common import add_run_options, bench_parser, fill_defaults, pct, progress, r3, run_bench
from _stack import REPO, STREAM, Stack, wire_records

from local_stack.process import Proc
from shorelink.errors import ShorelinkError
from shorelink.wire import DEFAULT_LIMITS, Batch, encode_batch

sys.path.insert(0, str(REPO))  # the hostile bodies are the tests' own (tests/wire_bombs.py)
from tests import wire_bombs

say = progress("gateway_bomb")
BOMBER = "bomber"
SLOTS = 1300  # number columns: 65 MB decompressed, within the default 64 MiB cap
#: --bomb templates: the second review's N1, one record per template of 180 number slots
#: (the decoder used to open every column of every template first: +801 MiB, 11 s)
TEMPLATES = 15_000
REFUSED = {"columns": "413 decompressed_too_large", "templates": "400 malformed"}
RSS_GOAL_MIB = 1024


def _rss_mib(pid: int, field: str = "VmHWM") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d.name))
            except (OSError, ValueError, IndexError):
                continue
    return out


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.honest = [f"ship{i}" for i in range(1, args.ships + 1)]
        self.stack = Stack(work, [*self.honest, BOMBER], say)
        self.next_seq = dict.fromkeys(self.honest, 1)

    @property
    def procs(self) -> list[Proc]:
        return self.stack.procs

    def cleanup(self) -> None:
        self.stack.cleanup()

    def run(self) -> dict[str, Any]:
        a = self.args
        t0 = time.monotonic()
        if a.bomb == "templates":
            raw, count = wire_bombs.many_templates(TEMPLATES, 180), TEMPLATES
        else:
            raw, count = wire_bombs.number_columns(SLOTS), 50_000
        bomb = wire_bombs.batch(raw, count, origin=BOMBER)
        result: dict[str, Any] = {
            "benchmark": "gateway_bomb",
            "config": {
                "ships": a.ships,
                "batches": a.batches,
                "batch": a.batch,
                "rounds": a.rounds,
                "bombs": a.bombs,
                "bomb": a.bomb,
            },
            "bomb": {
                "bytes": len(bomb),
                "raw_len": len(raw),
                "cap": DEFAULT_LIMITS.max_decompressed_bytes,
            },
            "loadavg_1m_at_start": round(os.getloadavg()[0], 2),
        }
        self.stack.start()
        assert self.stack.gateway is not None
        pid = self.stack.gateway.pid
        say("phase 1: honest ships alone")
        quiet = asyncio.run(self.phase(None))
        quiet["gateway_vmhwm_mib"] = _rss_mib(pid)
        say(f"phase 2: the same while {BOMBER} sends the bomb {a.bombs} times")
        attacked = asyncio.run(self.phase(bomb))
        attacked["gateway_vmhwm_mib"] = _rss_mib(pid)
        attacked["decode_workers_vmhwm_mib"] = [_rss_mib(c) for c in _children(pid)]
        result["alone"], result["under_bomb"] = quiet, attacked
        ok, per_origin, _ = self.stack.verify({**self.next_last(), BOMBER: 0})
        result["exactly_once"] = ok
        result["bomber_records_written"] = per_origin[BOMBER]["distinct"]
        result["goal"] = {
            "gateway_vmhwm_mib_below": RSS_GOAL_MIB,
            "met": attacked["gateway_vmhwm_mib"] < RSS_GOAL_MIB
            and attacked["bomb_answers"] == {REFUSED[a.bomb]: a.bombs},
        }
        result["seconds_total"] = round(time.monotonic() - t0, 1)
        return result

    def next_last(self) -> dict[str, int]:
        return {ship: seq - 1 for ship, seq in self.next_seq.items()}

    def round_of_batches(self) -> dict[str, list[bytes]]:
        """``--batches`` new batches of ``--batch`` records for each honest ship."""
        a = self.args
        bodies: dict[str, list[bytes]] = {}
        for n, ship in enumerate(self.honest):
            bodies[ship] = []
            for _ in range(a.batches):
                first = self.next_seq[ship]
                recs = tuple(wire_records(ship, first, a.batch, seed=n * 100_003 + first))
                self.next_seq[ship] = first + a.batch
                bodies[ship].append(encode_batch(Batch(ship, STREAM, recs)))
        return bodies

    async def phase(self, bomb: bytes | None) -> dict[str, Any]:
        """Rounds of honest uploads: ``--rounds`` alone; with ``bomb``, as many more as
        it takes the bomber to send it ``--bombs`` times (at most 100)."""
        a = self.args
        answers: dict[str, int] = {}
        took: list[float] = []

        async def bombs() -> None:
            assert bomb is not None
            url = f"{self.stack.gw_url}/v1/ships/{BOMBER}/streams/{STREAM}/batches"
            headers = {"Authorization": f"Bearer {self.stack.tokens[BOMBER]}"}
            timeout = aiohttp.ClientTimeout(total=300)
            async with aiohttp.ClientSession(timeout=timeout) as s:
                for _ in range(a.bombs):
                    t = time.perf_counter()
                    async with s.post(url, data=bomb, headers=headers) as r:
                        key = f"{r.status} {(await r.json()).get('error', '')}".strip()
                    answers[key] = answers.get(key, 0) + 1
                    took.append(time.perf_counter() - t)

        sender = asyncio.create_task(bombs()) if bomb is not None else None
        lat: list[float] = []
        seconds = 0.0
        rounds = 0
        while rounds < a.rounds or (sender is not None and not sender.done() and rounds < 100):
            bodies = self.round_of_batches()
            took_s, round_lat = await self.stack.upload(bodies, self.next_last(), a.window)
            seconds += took_s
            lat += round_lat
            rounds += 1
        if sender is not None:
            await sender
        out: dict[str, Any] = {
            "honest_rounds": rounds,
            "honest_records_s": round(rounds * a.batches * a.batch * len(self.honest) / seconds),
            "honest_send_ms_p50": r3(pct(lat, 0.5)),
            "honest_send_ms_p99": r3(pct(lat, 0.99)),
        }
        if bomb is not None:
            out["bomb_answers"] = answers
            out["bomb_seconds_each"] = [round(t, 2) for t in took]
        return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = bench_parser("gateway_bomb.py", __doc__)
    add_run_options(p, "3 honest ships, 2 bombs (~1 minute)", "Kafka's and the gateway's logs")
    p.add_argument("--ships", type=int, default=None, help="honest ships (quick 3, full 8)")
    p.add_argument("--batches", type=int, default=10, help="batches per ship a round (10)")
    p.add_argument("--rounds", type=int, default=None, help="rounds alone (quick 2, full 5)")
    p.add_argument("--batch", type=int, default=500, help="records per batch (default 500)")
    p.add_argument("--window", type=int, default=2, help="batches in flight per ship")
    p.add_argument("--bombs", type=int, default=None, help="bombs sent (quick 2, full 5)")
    p.add_argument(
        "--bomb",
        choices=("columns", "templates"),
        default="columns",
        help="columns: 1,300 number columns over 50,000 records (review H1); templates: "
        "15,000 templates of one record and 180 slots each (second review N1)",
    )
    a = p.parse_args(argv)
    fill_defaults(a, {"ships": (3, 8), "rounds": (2, 5), "bombs": (2, 5)})
    for name in ("ships", "batches", "batch", "window", "bombs", "rounds"):
        if getattr(a, name) < 1:
            p.error(f"--{name} must be at least 1")
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_bench(
        say, args.keep, "gateway-bomb-", lambda work: Bench(args, work), errors=(ShorelinkError,)
    )


if __name__ == "__main__":
    sys.exit(main())
