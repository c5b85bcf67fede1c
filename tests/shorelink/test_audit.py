"""`shorelink audit` is the user's proof of exactly once: it must find a duplicate or a
gap when there is one, and say OK only when there is none."""

from __future__ import annotations

import json
import subprocess
import sys

from confluent_kafka import Producer

from local_stack.kafka import KafkaBroker
from shorelink.contract import Record, canonical_topic
from shorelink.identity import Identity
from shorelink.kafka.topics import TopicSpec, ensure_topics
from tests.helpers import unique


def _produce(kafka: KafkaBroker, stream: str, seqs: list[int], origin: str = "bigblue") -> None:
    topic = canonical_topic(stream)
    ensure_topics(kafka.endpoint, [TopicSpec(topic, partitions=2)])
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    for s in seqs:
        r = Record(Identity(origin, stream, s), f"c{s % 3}".encode(), b"{}", 1000 + s, "tokyo", "t")
        p.produce(topic, key=r.key, value=r.value, headers=r.headers())
    p.produce(topic, key=b"x", value=b"no headers")  # breaks the contract: counted
    assert p.flush(10) == 0


def _audit(kafka: KafkaBroker, stream: str) -> tuple[int, dict[str, object]]:
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "shorelink.cli",
            "audit",
            "--site",
            "tokyo",
            "--bootstrap",
            kafka.bootstrap,
            "--stream",
            stream,
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return res.returncode, json.loads(res.stdout)


def test_audit_finds_duplicates_and_gaps(kafka: KafkaBroker) -> None:
    stream = unique("audit")
    _produce(kafka, stream, [1, 2, 3, 3, 5, 6])
    _produce(kafka, stream, [1, 2], origin="redstar")
    code, report = _audit(kafka, stream)
    assert code == 1 and report["ok"] is False and report["malformed"] == 2
    by_origin = {s["origin"]: s for s in report["sources"]}  # type: ignore[attr-defined]
    assert by_origin["bigblue"] == {
        "origin": "bigblue",
        "stream": stream,
        "identities": 5,
        "duplicates": 1,
        "gaps": 1,
        "gap_ranges": "4",
        "held": "1-3,5-6",
    }
    assert (by_origin["redstar"]["duplicates"], by_origin["redstar"]["gaps"]) == (0, 0)


def test_audit_says_ok_when_every_identity_is_there_once(kafka: KafkaBroker) -> None:
    stream = unique("audit")
    topic = canonical_topic(stream)
    ensure_topics(kafka.endpoint, [TopicSpec(topic)])
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    for s in range(1, 101):
        r = Record(Identity("bigblue", stream, s), b"k", b"v", s, "hq", "t")
        p.produce(topic, key=r.key, value=r.value, headers=r.headers())
    p.flush(10)
    code, report = _audit(kafka, stream)
    assert code == 0 and report["ok"] is True
    assert report["sources"] == [
        {
            "origin": "bigblue",
            "stream": stream,
            "identities": 100,
            "duplicates": 0,
            "gaps": 0,
            "gap_ranges": "",
            "held": "1-100",
        }
    ]
