"""Benchmark: the merge on a backlog of large records in a small driver (review finding
9), with its batches bounded in bytes (``merge.max_batch_bytes``, the way it runs)
side by side with the same merge taking each Spark batch whole (the way it ran before:
the peer).

Everything runs on loopback against a private single-node Kafka (``local_stack.kafka``):

0. fill ``sl.ingress.containers`` (6 partitions) with ``--records`` records of
   ``--size`` random (incompressible) bytes, in the record contract, several origins;
1. per variant, its own process: a local-mode Spark driver of ``--driver-memory`` (in
   local mode the JVM's heap is the driver's and the executors'), a fresh site over the
   same ingress (purge off, so both read all of it), the merge once over everything
   (Trigger.AvailableNow, ``max_offsets_per_trigger`` 100,000: one Spark batch), bounded
   by ``--timeout``. Figures: finished or not and why (the query's error, the exit
   code), wall seconds, the peak resident memory of the process and its JVM together
   (sampled from /proc), what the driver took of one Spark batch, batches written in
   slices, records written and duplicates.

    .venv/bin/python bench/merge_memory.py --quick   # 8,000 x 200 KB (1.5 GiB), 1g driver
    .venv/bin/python bench/merge_memory.py           # 20,000 x 200 KB (3.7 GiB), the review's case
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import tomli_w
from _common import (
    add_run_options,
    bench_parser,
    fill_defaults,
    progress,
    run_bench,
    tree_rss_mb,
)

from local_stack.kafka import start_kafka
from local_stack.process import Proc, stop_procs
from shorelink.contract import Record, ingress_topic
from shorelink.identity import Identity
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.topics import TopicSpec, ensure_topics, producer

say = progress("merge-memory")
STREAM = "containers"
PARTITIONS = 6
VARIANTS = ("sliced", "whole")


class MergeMemoryBench:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.procs: list[Proc] = []

    def fill(self, bootstrap: str) -> int:
        ensure_topics(
            KafkaEndpoint.plaintext(bootstrap),
            [TopicSpec(ingress_topic(STREAM), partitions=PARTITIONS)],
        )
        rng = random.Random(9)
        p = producer(KafkaEndpoint.plaintext(bootstrap), {"linger.ms": 20})
        nbytes = 0
        for i in range(self.args.records):
            origin = f"ship{i % 8}"
            r = Record(
                Identity(origin, STREAM, i // 8 + 1),
                f"c{i % 97}".encode(),
                rng.randbytes(self.args.size),
                1_700_000_000_000 + i,
                "bench",
                f"ship/{origin}/c{i % 97}",
            )
            while True:
                try:
                    p.produce(ingress_topic(STREAM), key=r.key, value=r.value, headers=r.headers())
                    break
                except BufferError:
                    p.poll(0.5)
            nbytes += len(r.value)
            if i % 1000 == 999:
                say(f"filled {i + 1}/{self.args.records}")
        if p.flush(120) != 0:
            raise RuntimeError("ingress not filled within 120 s")
        return nbytes

    def sites_file(self, bootstrap: str, variant: str) -> Path:
        root = self.work / variant
        root.mkdir(parents=True, exist_ok=True)
        doc = {
            "sites": {
                "bench": {
                    "streams": [STREAM],
                    "checkpoint_dir": str(root / "checkpoints"),
                    "table_dir": str(root / "tables"),
                    "kafka": {"bootstrap": bootstrap, "timeout": "60s"},
                    "merge": {
                        "transactional_id": f"bench-merge-{variant}",
                        "source_pattern": rf"sl\.ingress\.{STREAM}",
                        "canonical_partitions": PARTITIONS,
                        "max_offsets_per_trigger": 100_000,
                        "max_batch_bytes": self.args.max_batch_bytes,
                        "purge_sources": False,
                    },
                }
            },
        }
        path = root / "sites.toml"
        path.write_bytes(tomli_w.dumps(doc).encode())
        return path

    def variant(self, bootstrap: str, variant: str) -> dict[str, Any]:
        sites = self.sites_file(bootstrap, variant)
        log = self.work / "logs" / f"{variant}.log"
        out = self.work / f"{variant}.json"
        cmd = [sys.executable, __file__, "--child", str(sites), "--variant", variant]
        cmd += ["--driver-memory", self.args.driver_memory, "--result", str(out)]
        cmd += ["--timeout", str(self.args.timeout)]
        say(f"{variant}: merging in a {self.args.driver_memory} driver")
        t0 = time.monotonic()
        with log.open("wb") as f:
            child = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
            peak = 0.0
            while child.poll() is None:
                peak = max(peak, tree_rss_mb(child.pid)[0])
                if time.monotonic() - t0 > self.args.timeout + 120:
                    child.kill()
                time.sleep(0.5)
        wall = time.monotonic() - t0
        got: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
        lines = log.read_text(errors="replace").splitlines()
        # the JVM's own word on why it stopped (the Python side only sees the socket close)
        causes = [ln for ln in lines if "OutOfMemory" in ln or "maxResultSize" in ln]
        return {
            "finished": bool(got.get("finished")),
            "exit_code": child.returncode,
            "error": got.get("error"),
            "jvm_error": causes[0][:300] if causes else None,
            "wall_s": round(wall, 1),
            "peak_rss_mib": round(peak),
            **{k: got[k] for k in ("written", "duplicates", "sliced", "pulled") if k in got},
            "largest_fetch_mib": round(got.get("largest_fetch_bytes", 0) / 2**20, 1),
        }

    def run(self) -> dict[str, Any]:
        a = self.args
        (self.work / "logs").mkdir(parents=True, exist_ok=True)
        result: dict[str, Any] = {
            "records": a.records,
            "record_bytes": a.size,
            "driver_memory": a.driver_memory,
            "max_batch_mib": round(a.max_batch_bytes / 2**20, 1),
        }
        for v in (
            [a.only] if a.only else VARIANTS
        ):  # each its own Kafka: a site's ledger is its Kafka's
            broker = start_kafka(v, self.work / v / "kafka", self.work / "logs", heap="1g")
            self.procs.append(broker.proc)
            try:
                say(f"{v}: kafka on {broker.bootstrap}; ingress {a.records} x {a.size} bytes")
                result["ingress_mib"] = round(self.fill(broker.bootstrap) / 2**20)
                result[v] = self.variant(broker.bootstrap, v)
            finally:
                stop_procs([broker.proc])
                self.procs.remove(broker.proc)
        return result

    def cleanup(self) -> None:
        stop_procs(self.procs)


def child(a: argparse.Namespace) -> int:
    """One variant, in this process: the merge over all of ingress, once."""
    from spark_core.config import load_config
    from spark_core.ingest_pull import write_through
    from spark_core.merge import Merger, start_merge
    from spark_core.session import local_session

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    site = load_config(Path(a.child)).site("bench")
    merger = Merger(site)
    if a.variant == "sliced":
        merger.write_through = partial(write_through, merger)
    spark = local_session(
        "shorelink-bench-merge-memory",
        conf={
            "spark.driver.memory": a.driver_memory,
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.shuffle.partitions": "2",
        },
    )
    out: dict[str, Any] = {"finished": False}
    try:
        q = start_merge(spark, merger, available_now=True)
        q.awaitTermination(a.timeout)
        exc = q.exception()
        out["finished"] = exc is None and not q.isActive
        out["error"] = None if exc is None else str(exc)[:500]
        if q.isActive:
            out["error"] = f"not finished within {a.timeout} s"
            q.stop()
    except Exception as exc:  # the JVM gone (OOM) or py4j broken: the figure is the failure
        out["error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
    t = merger.totals
    out |= {
        "written": t.written,
        "duplicates": t.duplicates,
        "sliced": t.sliced,
        "pulled": t.pulled,
        "largest_fetch_bytes": t.largest_fetch_bytes,
    }
    Path(a.result).write_text(json.dumps(out))
    with contextlib.suppress(Exception):  # a dead JVM: nothing more to stop
        merger.close()
        spark.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = bench_parser("merge_memory.py", __doc__)
    add_run_options(p, "8,000 records (1.5 GiB) instead of 20,000 (3.7 GiB)", "Kafka's data, logs")
    p.add_argument("--records", type=int, default=None, help="records in ingress")
    p.add_argument("--size", type=int, default=200_000, help="bytes per record (default 200000)")
    p.add_argument("--driver-memory", default="1g", help="the Spark driver's memory (1g)")
    p.add_argument(
        "--max-batch-bytes", type=int, default=64 * 2**20, help="merge.max_batch_bytes (64 MiB)"
    )
    p.add_argument("--timeout", type=int, default=900, help="seconds per variant (900)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--variant", choices=VARIANTS, default="sliced", help=argparse.SUPPRESS)
    p.add_argument("--result", default=None, help=argparse.SUPPRESS)
    p.add_argument("--only", choices=VARIANTS, default=None, help="run one variant (default: both)")
    a = p.parse_args(argv)
    if a.child:
        return child(a)
    fill_defaults(a, {"records": (8_000, 20_000)})
    return run_bench(say, a.keep, "bench-merge-memory-", lambda w: MergeMemoryBench(a, w))


if __name__ == "__main__":
    sys.exit(main())
