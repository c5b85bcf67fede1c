"""The stream policy per site and ``shorelink-spark topics apply`` (spark_core/topics.py),
against a real broker: a port keeps a stream for days and HQ for ever, and applying
the policy must be safe to run again and again, from a cron job or by hand, without
ever taking partitions away (that would move a container's keys and break its order)."""

from __future__ import annotations

import json
import tomllib
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from local_stack.kafka import KafkaBroker
from shorelink.contract import (
    KAFKA_MAX_MESSAGE_BYTES,
    canonical_topic,
    dead_topic,
    ingress_topic,
    relay_topic,
)
from shorelink.errors import ConfigError
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.topics import TopicSpec
from spark_core.cli import main
from spark_core.config import SitesConfig, StreamPolicy, parse_config
from spark_core.topics import (
    TopicState,
    plan_changes,
    read_topics,
    site_specs,
    stream_specs,
)
from tests.helpers import write_toml

DAY_MS = 86_400_000


def _name(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


def _sites_doc(
    bootstrap: str,
    root: Path,
    port: str,
    hq: str,
    streams: list[str],
    topics: dict[str, dict[str, object]],
) -> dict[str, Any]:
    """Two sites pulling from each other (so the port writes relay topics); only the
    port's topics are applied. ``topics``: the port's ``[topics.*]`` tables."""
    port_site: dict[str, Any] = {
        "streams": streams,
        "neighbours": [hq],
        "checkpoint_dir": str(root / port / "checkpoints"),
        "table_dir": str(root / port / "tables"),
        "kafka": {"bootstrap": bootstrap, "timeout": "20s"},
        "merge": {"canonical_partitions": 2, "canonical_retention": "30d"},
    }
    if topics:
        port_site["topics"] = topics
    hq_site = {
        "streams": streams,
        "neighbours": [port],
        "checkpoint_dir": str(root / hq / "checkpoints"),
        "table_dir": str(root / hq / "tables"),
        "kafka": {"bootstrap": bootstrap},
    }
    return {"sites": {port: port_site, hq: hq_site}}


class Deployment:
    """A sites file on disk whose port's policy a test rewrites between applies."""

    def __init__(self, bootstrap: str, root: Path) -> None:
        self.bootstrap = bootstrap
        self.root = root
        self.port, self.hq = _name("port"), _name("hq")
        self.bulk, self.urgent = _name("bulk"), _name("urgent")
        self.path = root / "sites.toml"
        self.write()

    def write(self, **bulk: object) -> None:
        """The sites file; ``bulk``: the port's policy for the bulk stream, none if empty."""
        write_toml(
            self.path,
            _sites_doc(
                self.bootstrap,
                self.root,
                self.port,
                self.hq,
                [self.urgent, self.bulk],
                {self.bulk: bulk} if bulk else {},
            ),
        )

    def apply(self, *extra: str) -> Result:
        return CliRunner().invoke(
            main,
            ["topics", "apply", "--site", self.port, "--config", str(self.path), *extra],
        )

    def apply_json(self, *extra: str, code: int = 0) -> dict[str, object]:
        r = self.apply("--json", *extra)
        assert r.exit_code == code, r.output
        doc = json.loads(r.stdout)
        assert isinstance(doc, dict)
        return doc

    def state(self, *names: str) -> dict[str, TopicState]:
        return read_topics(KafkaEndpoint.plaintext(self.bootstrap, timeout_s=20), names)[1]


@pytest.fixture
def deployment(kafka_sites: Callable[..., dict[str, KafkaBroker]], tmp_path: Path) -> Deployment:
    broker = kafka_sites("topicpolicy")["topicpolicy"]
    return Deployment(broker.bootstrap, tmp_path)


def _changes(doc: dict[str, object]) -> list[dict[str, object]]:
    changes = doc["changes"]
    assert isinstance(changes, list)
    return changes


def test_apply_creates_every_topic_the_site_needs_and_a_second_run_changes_nothing(
    deployment: Deployment,
) -> None:
    """Idempotence is what lets an operator run apply at every deploy."""
    d = deployment
    doc = d.apply_json()
    created = {c["topic"] for c in _changes(doc) if c["action"] == "create"}
    for stream in (d.bulk, d.urgent):
        for topic in (
            ingress_topic(stream),
            canonical_topic(stream),
            dead_topic(stream),
            relay_topic(d.port, stream),
            relay_topic(d.hq, stream),
        ):
            assert topic in created
    state = d.state(canonical_topic(d.bulk), relay_topic(d.hq, d.bulk), ingress_topic(d.bulk))
    canonical = state[canonical_topic(d.bulk)]
    assert canonical.partitions == 2  # merge.canonical_partitions
    assert canonical.configs["retention.ms"] == str(30 * DAY_MS)  # merge.canonical_retention
    assert canonical.configs["max.message.bytes"] == str(KAFKA_MAX_MESSAGE_BYTES)
    assert state[relay_topic(d.hq, d.bulk)].configs["retention.ms"] == str(7 * DAY_MS)
    assert state[ingress_topic(d.bulk)].configs["retention.ms"] == "-1"

    again = d.apply_json()
    assert again["errors"] == 0
    assert _changes(again) == []
    table = d.apply()
    assert table.exit_code == 0 and "nothing to change" in table.output


def test_a_policy_change_alters_retention_and_adds_partitions(deployment: Deployment) -> None:
    """Ports keep a stream briefly, HQ for ever: changing one's mind must reach Kafka."""
    d = deployment
    d.apply_json()
    d.write(partitions=4, retention="3d", relay_retention="1d")
    doc = d.apply_json()
    by = {(c["topic"], c["action"]) for c in _changes(doc)}
    assert (canonical_topic(d.bulk), "partitions") in by
    assert (canonical_topic(d.bulk), "config") in by
    assert (relay_topic(d.port, d.bulk), "config") in by
    assert (ingress_topic(d.bulk), "partitions") in by
    assert not any(d.urgent in str(c["topic"]) for c in _changes(doc))  # untouched stream
    state = d.state(canonical_topic(d.bulk), relay_topic(d.port, d.bulk))
    assert state[canonical_topic(d.bulk)].partitions == 4
    assert state[canonical_topic(d.bulk)].configs["retention.ms"] == str(3 * DAY_MS)
    assert state[relay_topic(d.port, d.bulk)].partitions == 4
    assert state[relay_topic(d.port, d.bulk)].configs["retention.ms"] == str(DAY_MS)
    # review N14: segments roll at an eighth of the retention, so a relay kept a day
    # holds at most a day and 3 h, not the broker's 7-day segments beyond it
    assert state[canonical_topic(d.bulk)].configs["segment.ms"] == str(3 * DAY_MS // 8)
    assert state[relay_topic(d.port, d.bulk)].configs["segment.ms"] == str(DAY_MS // 8)
    assert _changes(d.apply_json()) == []

    d.write(partitions=4, retention="forever")
    doc = d.apply_json()
    assert [c["detail"] for c in _changes(doc) if c["topic"] == canonical_topic(d.bulk)] == [
        "retention.ms 3d -> forever"
    ]
    assert d.state(canonical_topic(d.bulk))[canonical_topic(d.bulk)].configs["retention.ms"] == "-1"


def test_fewer_partitions_are_refused_and_nothing_is_taken_away(deployment: Deployment) -> None:
    """Fewer partitions would move keys: one container's history out of order."""
    d = deployment
    d.write(partitions=3)
    d.apply_json()
    d.write(partitions=1, retention="2d")
    doc = d.apply_json(code=1)
    refused = {c["topic"] for c in _changes(doc) if c["action"] == "refused"}
    assert canonical_topic(d.bulk) in refused and relay_topic(d.hq, d.bulk) in refused
    warned = {c["topic"] for c in _changes(doc) if c["action"] == "warning"}
    assert ingress_topic(d.bulk) in warned  # works with more partitions: only a warning
    assert doc["errors"] == len(refused)
    state = d.state(canonical_topic(d.bulk))[canonical_topic(d.bulk)]
    assert state.partitions == 3
    assert state.configs["retention.ms"] == str(2 * DAY_MS)  # the rest still applied
    r = d.apply()
    assert r.exit_code == 1
    assert "partitions are never removed" in r.output


def test_dry_run_reports_and_changes_nothing(deployment: Deployment) -> None:
    d = deployment
    doc = d.apply_json("--dry-run")
    assert doc["dry_run"] is True
    assert canonical_topic(d.bulk) in {c["topic"] for c in _changes(doc)}
    assert d.state(canonical_topic(d.bulk)) == {}
    d.apply_json()
    d.write(partitions=5, retention="1d")
    r = d.apply("--dry-run")
    assert r.exit_code == 0 and "would change" in r.output
    state = d.state(canonical_topic(d.bulk))[canonical_topic(d.bulk)]
    assert state.partitions == 2 and state.configs["retention.ms"] == str(30 * DAY_MS)


def test_unreachable_kafka_is_a_clear_error(tmp_path: Path) -> None:
    """An operator must see "cannot reach Kafka", not a stack trace or a hang."""
    d = Deployment("127.0.0.1:1", tmp_path)
    r = CliRunner().invoke(
        main,
        ["topics", "apply", "--site", d.port, "--config", str(d.path), "--timeout", "2"],
    )
    assert r.exit_code == 2, r.output
    assert "cannot reach Kafka at 127.0.0.1:1 within 2 s" in r.output


# -- without a broker ------------------------------------------------------------------


def _cfg(policy: str = "", pulled: bool = True) -> SitesConfig:
    text = f"""
[sites.tokyo]
streams = ["alerts", "containers"]
checkpoint_dir = "c"
table_dir = "t"
kafka.bootstrap = "x:1"
merge.canonical_partitions = 3
merge.canonical_retention = "30d"
replication.relay_retention = "2d"
{policy}
[sites.hq]
streams = ["alerts", "containers"]
neighbours = {'["tokyo"]' if pulled else "[]"}
checkpoint_dir = "c"
table_dir = "t"
kafka.bootstrap = "y:1"
"""
    return parse_config(tomllib.loads(text))


def test_a_stream_without_a_policy_takes_the_merge_and_replication_keys() -> None:
    """Existing sites files keep meaning what they meant."""
    cfg = _cfg('[sites.tokyo.topics.containers]\npartitions = 8\nrelay_retention = "1d"\n')
    tokyo = cfg.site("tokyo")
    assert tokyo.policy("alerts") == StreamPolicy(3, 30 * DAY_MS, 2 * DAY_MS)
    assert tokyo.policy("containers") == StreamPolicy(8, 30 * DAY_MS, DAY_MS)
    forever = _cfg('[sites.tokyo.topics.alerts]\nretention = "forever"\n').site("tokyo")
    assert forever.policy("alerts").retention_ms is None


def test_a_policy_for_a_stream_the_site_does_not_carry_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"sites\.tokyo\.topics\.nav"):
        _cfg("[sites.tokyo.topics.nav]\npartitions = 2\n")


def test_relay_topics_exist_for_every_entry_site_only_when_some_site_pulls() -> None:
    """The merge writes each new record to the relay topic of its entry site; nobody
    reads relays of a site no one pulls from."""
    cfg = _cfg()
    tokyo = cfg.site("tokyo")
    names = {s.name for s in stream_specs(tokyo, cfg, ["alerts"])}
    assert names == {"sl.alerts", "sl.dead.alerts", "sl.relay.tokyo.alerts", "sl.relay.hq.alerts"}
    alone = _cfg(pulled=False)
    names = {s.name for s in stream_specs(alone.site("tokyo"), alone, ["alerts"])}
    assert names == {"sl.alerts", "sl.dead.alerts"}
    every = {s.name for s in site_specs(cfg, "tokyo")}
    assert {"sl.ledger", "sl.merge.marker", "sl.links", "sl.gateway.cursor"} <= every
    assert {"sl.dead.unknown", "sl.ingress.alerts"} <= every


def test_the_plan_never_asks_more_in_sync_replicas_than_a_topic_has() -> None:
    """A topic created with one replica would refuse every write with min.insync 2."""
    spec = TopicSpec("sl.x", partitions=2, retention_ms=-1)
    have = TopicState(
        2,
        1,
        {
            "retention.ms": "-1",
            "cleanup.policy": "delete",
            "max.message.bytes": str(KAFKA_MAX_MESSAGE_BYTES),
            "min.insync.replicas": "1",
        },
    )
    changes = plan_changes([spec], {"sl.x": have}, replication_factor=3, min_insync=2)
    assert [c.action for c in changes] == ["warning"]  # under-replicated: said, not moved
    compact = plan_changes([TopicSpec("sl.x", 2, compacted=True)], {"sl.x": have}, 1, 1)
    assert [(c.action, c.configs) for c in compact] == [
        ("config", {"cleanup.policy": "compact", "segment.ms": "3600000"})
    ]


def test_every_topic_rolls_segments_its_retention_or_compaction_can_act_on() -> None:
    """Review N14 and N9: Kafka deletes or compacts whole segments only, never the
    active one; at the broker's default (7 days or 1 GiB) a relay kept 3 days held
    about 10, and the marker and ledger, rewritten in every transaction, kept days of
    stale copies that each load of the merge state read. Every topic the site writes
    rolls its segments at an eighth of its retention (a minute to a day), a compacted
    one hourly; a topic kept for ever keeps the broker's."""
    assert TopicSpec("r", retention_ms=3 * DAY_MS).topic_config()["segment.ms"] == str(
        3 * DAY_MS // 8
    )
    assert TopicSpec("r", retention_ms=30 * DAY_MS).topic_config()["segment.ms"] == str(DAY_MS)
    assert TopicSpec("r", retention_ms=1000).topic_config()["segment.ms"] == "60000"
    assert TopicSpec("m", compacted=True).topic_config()["segment.ms"] == "3600000"
    assert "segment.ms" not in TopicSpec("f", retention_ms=-1).topic_config()
