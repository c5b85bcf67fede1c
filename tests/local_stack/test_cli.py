"""What the local stack adds to the kernel's ``shorelink`` command (entry points in
pyproject.toml): ``shorelink audit --stack DIR`` finds a site's Kafka in stack.json, as
docs/commands.md promises, though the kernel knows nothing of stacks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from confluent_kafka import Producer

from local_stack.kafka import KafkaBroker
from local_stack.stack import STACK_FILE, StackInfo
from shorelink.contract import Record, canonical_topic
from shorelink.identity import Identity
from shorelink.kafka.topics import TopicSpec, ensure_topics
from tests.helpers import unique

CLI = [sys.executable, "-m", "shorelink.cli"]


def _stack_dir(tmp_path: Path, kafka: KafkaBroker) -> Path:
    """A stack.json naming ``kafka`` as site tokyo's broker (as ``stack up`` writes it)."""
    info = StackInfo(tmp_path, {"tokyo": {"kafka": kafka.bootstrap, "pid": 0, "log": ""}})
    (tmp_path / STACK_FILE).write_text(json.dumps(info.to_json()))
    return tmp_path


def test_audit_takes_the_sites_kafka_from_the_stack(kafka: KafkaBroker, tmp_path: Path) -> None:
    stream = unique("audit")
    topic = canonical_topic(stream)
    ensure_topics(kafka.endpoint, [TopicSpec(topic)])
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    for s in range(1, 4):
        r = Record(Identity("bigblue", stream, s), b"k", b"v", s, "tokyo", "t")
        p.produce(topic, key=r.key, value=r.value, headers=r.headers())
    assert p.flush(10) == 0
    args = ["audit", "--site", "tokyo", "--stack", str(_stack_dir(tmp_path, kafka))]
    res = subprocess.run(
        [*CLI, *args, "--stream", stream, "--json"], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert report["ok"] is True and report["sources"][0]["identities"] == 3


def test_audit_names_a_site_the_stack_lacks(kafka: KafkaBroker, tmp_path: Path) -> None:
    args = ["audit", "--site", "hq", "--stack", str(_stack_dir(tmp_path, kafka))]
    res = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    assert "no site 'hq' in the stack at" in res.stderr


def test_audit_without_a_kafka_says_which_options_name_one() -> None:
    res = subprocess.run([*CLI, "audit", "--site", "hq"], capture_output=True, text=True)
    assert res.returncode == 2
    assert "give --bootstrap or --stack" in res.stderr
