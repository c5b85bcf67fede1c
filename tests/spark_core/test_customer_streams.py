"""Customer streams, written by the real merge on a real broker: each customer's topic
holds exactly the canonical records of its containers, each once; a leased container
only within its lease; and a change of the customers file applies to readings from its
time on, without a restart and without touching what was written before."""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from local_stack.kafka import KafkaBroker
from shorelink.contract import Record, customer_topic
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.reading import read_to_end
from spark_core.config import load_config
from spark_core.merge import Merger, start_merge
from tests.helpers import unique
from tests.spark_core.helpers import create_ingress, make_site, produce, record

pytestmark = pytest.mark.spark

S = "containers"
#: alerts are keyed by container too: a customer's container's alerts are its own
A = "alerts"
#: by seq % 4: the container a reading is about
KEYS = ("ACMU0000019", "GLBU0000025", "BBLU0000036", "ACMU0000045")


#: the readings' times: a day ahead, so that a lease changed during the test starts
#: after the wall clock (a change reaching into the past is refused: review finding 15)
T = (int(time.time()) + 86400) * 1000


def _at(seq: int) -> str:
    """Reading ``seq``'s ``sl.ts`` as RFC 3339."""
    return dt.datetime.fromtimestamp((T + seq) / 1000, dt.UTC).isoformat()


def _reading(origin: str, seq: int, stream: str = S) -> Record:
    return replace(record(origin, stream, seq, key=KEYS[seq % 4]), ts_ms=T + seq)


def _held(bootstrap: str, customer: str, origin: str, stream: str = S) -> Counter[int]:
    out: Counter[int] = Counter()
    for m in read_to_end(
        KafkaEndpoint.plaintext(bootstrap), [customer_topic(customer, stream)], settled=True
    ):
        r = Record.from_kafka(m.key(), m.value(), m.headers())
        if r.identity.origin == origin:
            out[r.identity.seq] += 1
    return out


def _write(path: Path, text: str) -> None:
    path.write_text(text)
    later = time.time_ns() + 1_000_000_000 * (1 + path.stat().st_mtime_ns % 7)
    os.utime(path, ns=(later, later))  # a change the merge sees even within one tick


def test_customer_streams_hold_their_containers_once_and_follow_ownership_in_time(
    spark: Any, kafka: KafkaBroker, tmp_path: Path
) -> None:
    b = kafka.bootstrap
    ship = unique("ship")
    customers = tmp_path / "customers.toml"
    # ACMU0000045 is leased to globex for readings 20..39 (by their own time)
    lease = f'container = "ACMU0000045"\nfrom = "{_at(20)}"\nto = "{_at(40)}"\n'
    base = (
        '[customers.acme]\nowner_codes = ["ACMU"]\n\n[customers.globex]\nowner_codes = ["GLBU"]\n'
    )
    _write(customers, base + "[[customers.globex.leases]]\n" + lease)
    create_ingress(b, [S, A])
    site, path = make_site(b, tmp_path, [S, A], customers=customers)
    merger = Merger(site, sites=load_config(path))
    try:
        produce(b, [_reading(ship, q) for q in range(1, 61)])
        produce(b, [_reading(ship, q) for q in range(30, 41)])  # a resent upload
        produce(b, [_reading(ship, q, A) for q in range(1, 31)])
        start_merge(spark, merger, available_now=True).awaitTermination(180)
        acme, globex = _held(b, "acme", ship), _held(b, "globex", ship)
        assert set(acme.values()) == {1} and set(globex.values()) == {1}, "each once"
        assert sorted(acme) == [
            q for q in range(1, 61) if q % 4 == 0 or (q % 4 == 3 and not 20 <= q < 40)
        ]
        assert sorted(globex) == [
            q for q in range(1, 61) if q % 4 == 1 or (q % 4 == 3 and 20 <= q < 40)
        ]
        # the alerts about their containers, by the same rule (the lease included)
        acme_a, globex_a = _held(b, "acme", ship, A), _held(b, "globex", ship, A)
        assert set(acme_a.values()) == {1} and set(globex_a.values()) == {1}
        assert sorted(acme_a) == [q for q in range(1, 31) if q % 4 == 0 or q in (3, 7, 11, 15, 19)]
        assert sorted(globex_a) == [q for q in range(1, 31) if q % 4 == 1 or q in (23, 27)]
        assert merger.totals.customer == len(acme) + len(globex) + len(acme_a) + len(globex_a)

        # GLBU0000025 goes to acme from reading 70 on: the file changes while the
        # merge (this Merger) runs on, and nothing written before moves
        change = f'container = "GLBU0000025"\nfrom = "{_at(70)}"\n'
        _write(
            customers,
            base
            + "[[customers.globex.leases]]\n"
            + lease
            + "\n[[customers.acme.leases]]\n"
            + change,
        )
        produce(b, [_reading(ship, q) for q in range(61, 81)])
        start_merge(spark, merger, available_now=True).awaitTermination(180)
        assert merger.ownership is not None and merger.ownership.reloads == 1
        status = json.loads(merger.status_path.read_text())
        assert status["customers"]["reloads"] == 1 and status["customers"]["reload_errors"] == 0
        assert status["totals"]["customer"] == merger.totals.customer
        acme2, globex2 = _held(b, "acme", ship), _held(b, "globex", ship)
        assert set(acme2.values()) == {1} and set(globex2.values()) == {1}
        assert {q for q in acme2 if q % 4 == 1} == set(range(73, 81, 4))  # 73, 77
        assert {q for q in globex2 if q % 4 == 1} == set(range(1, 70, 4))  # ... 65, 69
        # Big Blue's own container is in nobody's stream
        assert all(q % 4 != 2 for q in [*acme2, *globex2])
    finally:
        merger.close()
