"""The site driver (merge and, with ``tables = true``, the ``container_readings`` Delta
query) killed with SIGKILL at random moments, three times, while ingress keeps arriving
(with duplicates): the canonical topic still holds every identity exactly once with no
gap, the customer stream of a customer's container holds its readings exactly once, and
the Delta table holds exactly the canonical identities, once each. This is the promise
the whole site rests on."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import OffsetSpec

from local_stack.kafka import KafkaBroker
from local_stack.process import Proc
from shorelink.contract import Record, canonical_topic, customer_topic
from shorelink.kafka.admin import Admin
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.reading import read_to_end
from spark_core.config import SiteConfig
from spark_core.tables import table_path
from tests.helpers import eventually, kill9, run_process, unique
from tests.logfmt import read_logfmt
from tests.spark_core.helpers import (
    assert_exactly_once,
    canonical,
    create_ingress,
    ledger,
    make_site,
    produce,
    record,
)

pytestmark = pytest.mark.spark

SPARK = [sys.executable, "-m", "spark_core.cli", "site"]
STREAM = "containers"  # a stream with a Delta table: container_readings
TABLE = "container_readings"


def reading(origin: str, seq: int, key: str = "c1") -> Record:
    """A container record as the gateway writes it (JSON payload)."""
    body = {"temperature": 4.0 + seq % 7, "humidity": 60.5, "door": "closed", "battery": 90}
    return record(origin, STREAM, seq, key=key, value=json.dumps(body).encode())


def _start(site: SiteConfig, config: Path, log: Path) -> Proc:
    """The site job in its own process group: spark-submit JVM + python driver."""
    return run_process("spark-site", [*SPARK, "--site", site.name, "--config", str(config)], log)


def _status(site: SiteConfig) -> dict[str, object]:
    try:
        return dict(json.loads((site.state_path / "merge.status.json").read_text()))
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _batch_done_since(site: SiteConfig, old_pid: object) -> bool:
    """A driver other than ``old_pid`` has committed a batch."""
    st = _status(site)
    return st.get("pid") not in (None, old_pid) and bool(st.get("last_batch"))


def _table_batches(site: SiteConfig) -> int:
    """Micro-batches the table query has committed (files in its checkpoint's commits/)."""
    commits = site.query_checkpoint(f"table-{TABLE}").path / "commits"
    try:
        return sum(1 for f in commits.iterdir() if not f.name.startswith("."))
    except FileNotFoundError:
        return 0


def _canonical_ends(bootstrap: str) -> dict[int, int]:
    """Per partition of the canonical topic, its end (the high watermark: every record
    and transaction marker written so far)."""
    admin = Admin(KafkaEndpoint.plaintext(bootstrap))
    topic = canonical_topic(STREAM)
    parts = [(topic, p.id) for p in admin.describe([topic])[topic].partitions]
    return {p: info.offset for (_, p), info in admin.offsets(parts, OffsetSpec.latest()).items()}


def _table_read_to(site: SiteConfig, ends: dict[int, int]) -> bool:
    """The table query's last committed micro-batch read the canonical topic up to
    ``ends`` (its checkpoint: ``commits/<id>`` once the Delta commit of batch ``id`` is
    done; ``offsets/<id>``: where that batch ended in each partition)."""
    checkpoint = site.query_checkpoint(f"table-{TABLE}").path
    try:
        done = [int(f.name) for f in (checkpoint / "commits").iterdir() if f.name.isdigit()]
        if not done:
            return False
        lines = (checkpoint / "offsets" / str(max(done))).read_text().splitlines()
    except FileNotFoundError:
        return False
    read = {int(p): o for p, o in json.loads(lines[-1])[canonical_topic(STREAM)].items()}
    return all(read.get(p, -1) >= end for p, end in ends.items())


def _table_rows(spark: Any, site: SiteConfig, origins: list[str]) -> list[tuple[str, str, int]]:
    from pyspark.sql import functions as F

    path = table_path(site, TABLE).path
    if not (path / "_delta_log").exists():
        return []
    df = spark.read.format("delta").load(str(path)).where(F.col("origin").isin(origins))
    return [(r.origin, r.stream, r.seq) for r in df.select("origin", "stream", "seq").collect()]


def _holds(bootstrap: str, expected: dict[tuple[str, str], int]) -> bool:
    held = ledger(bootstrap)
    return all(str(held.get(k, "")) == f"1-{n}" for k, n in expected.items())


class Feeder(threading.Thread):
    """Gateway-like uploads: ship3 in small transactions, each resending part of the last."""

    def __init__(self, bootstrap: str, origin: str) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.origin = bootstrap, origin
        self.last = 0
        self.stop = threading.Event()

    def run(self) -> None:
        failed = 0  # a failed upload is sent again, as a gateway's ship would
        for _ in range(3000):  # bounded: ~25 minutes of rounds
            if self.stop.is_set() and not failed:
                break
            lo = max(1, self.last - 5)
            hi = self.last + 20
            try:
                produce(
                    self.bootstrap,
                    [reading(self.origin, q, key=f"c{q % 4}") for q in range(lo, hi + 1)],
                )
            except (KafkaException, AssertionError):
                # a timeout on a loaded machine; its outcome may be unknown: the same
                # range again until one commits, so ``last`` is what Kafka holds
                failed += 1
                if failed > 20:
                    raise
                continue
            failed = 0
            self.last = hi
            self.stop.wait(2.0)  # ~10 new records a second: the table keeps up


# four spark-submit start-ups (three killed, one to finish: each kill lands after a merge
# and a table batch of its run, at a random moment, so a third, fourth and fifth kill
# add time, not cases): the suite-wide 300 s bound is too tight on a loaded machine
@pytest.mark.timeout(900)
def test_driver_killed_three_times_canonical_and_table_exactly_once(
    kafka: KafkaBroker, spark: Any, tmp_path: Path
) -> None:
    b = kafka.bootstrap
    s = STREAM
    # sl.containers is shared by the session: this test's records are its own origins
    ship1, ship2, ship3 = (unique(o) for o in ("ship1", "ship2", "ship3"))
    create_ingress(b, [s])
    # ship2's container is a customer's: its readings also go to sl.customer.crash...
    customers = tmp_path / "customers.toml"
    customer = unique("crash").replace("-", "")
    customers.write_text(f'[customers.{customer}]\nowner_codes = ["CRSU"]\n')
    site, config = make_site(
        b, tmp_path, [s], max_offsets=300, tables=True, customers=customers
    )  # several batches per backlog, few enough that the table query keeps up
    produce(b, [reading(ship1, q) for q in range(1, 401)])
    produce(b, [reading(ship1, q) for q in range(200, 301)])  # a second upload
    produce(b, [reading(ship2, q, key="CRSU0000009") for q in reversed(range(1, 201))])
    feeder = Feeder(b, ship3)
    feeder.start()
    log = tmp_path / "site.log"
    rng = random.Random()
    pid = None
    for run in range(3):
        proc = _start(site, config, log)
        try:
            # running, with at least one merge batch and one table batch of this run
            # behind it, so the kill can land in either query's batch
            tables_before = _table_batches(site)
            eventually(
                lambda old=pid: _batch_done_since(site, old),
                within=120,
                what=f"a batch in run {run}",
                proc=proc,
                interval=0.1,
            )
            pid = _status(site)["pid"]
            eventually(
                lambda n=tables_before: _table_batches(site) > n,
                within=120,
                what=f"a table batch in run {run}",
                proc=proc,
                interval=0.1,
            )
            time.sleep(rng.uniform(0.0, 2.0))
        finally:
            kill9(proc, group=True)
    feeder.stop.set()
    feeder.join(30)
    expected = {(ship1, s): 400, (ship2, s): 200, (ship3, s): feeder.last}
    origins = [ship1, ship2, ship3]

    proc = _start(site, config, log)
    try:
        eventually(
            lambda: _holds(b, expected),
            within=180,
            what="the merge to catch up",
            proc=proc,
            interval=0.1,
        )
        # the canonical topic is complete now (the ledger holds every identity, in the
        # same transactions): the table has caught up once a batch it committed read to
        # its end; its rows are read (a Spark job, slow in a cold session) once, below
        ends = _canonical_ends(b)
        eventually(
            lambda: _table_read_to(site, ends),
            within=180,
            what=f"{TABLE} to catch up",
            proc=proc,
            interval=0.1,
        )
        # a clean stop: SIGTERM to the driver, which stops its queries between batches
        driver = int(_status(site)["pid"])  # type: ignore[call-overload]
        os.kill(driver, signal.SIGTERM)
        assert proc.popen is not None
        proc.popen.wait(60)
    finally:
        if proc.alive():
            kill9(proc, group=True)
    assert _status(site)["state"] == "stopped"
    records = [r for r in canonical(b, s) if r.identity.origin in origins]
    assert_exactly_once(records, expected)
    owned = [
        Record.from_kafka(m.key(), m.value(), m.headers())
        for m in read_to_end(
            KafkaEndpoint.plaintext(b), [customer_topic(customer, s)], settled=True
        )
    ]
    assert_exactly_once(owned, {(ship2, s): 200})
    assert {r.identity.origin for r in owned} == {ship2}, "only the customer's container"
    # the table: each canonical identity exactly once, and nothing else
    rows = _table_rows(spark, site, origins)
    counts = Counter(rows)
    dups = {i: n for i, n in counts.items() if n > 1}
    assert not dups, f"{TABLE}: duplicated identities: {sorted(dups)[:10]}"
    in_canonical = {(r.identity.origin, r.identity.stream, r.identity.seq) for r in records}
    assert set(counts) == in_canonical, (
        f"{TABLE}: missing {sorted(in_canonical - set(counts))[:10]},"
        f" extra {sorted(set(counts) - in_canonical)[:10]}"
    )
    text = log.read_text()
    # the JVM logs as the Python side does (spark_core/conf/log4j2.properties): logfmt,
    # warnings and worse, never Spark's own format
    assert not re.search(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d (INFO|WARN|ERROR) ", text, re.M)
    jvm = [
        read_logfmt(ln) for ln in text.splitlines() if ln.startswith("ts=") and 'logger="org.' in ln
    ]
    assert all(f["level"] in ("warning", "error", "critical") for f in jvm), jvm[:5]
    assert "event=merge_batch" in text
    assert f"event=query_started query=table-{TABLE}" in text
    # every query's progress, with its Kafka lag, for operators (spark_core/progress.py)
    assert "event=query_progress query=merge" in text and "lag_records=" in text
    queries = {
        q["query"]: q
        for q in json.loads((site.state_path / "queries.status.json").read_text())["queries"]
    }
    assert set(queries) == {"merge", f"table-{TABLE}"}
    for q in queries.values():
        assert q["state"] == "stopped" and isinstance(q["batch_id"], int)
        assert isinstance(q["lag_records"], int) and q["lag_records"] >= 0
