"""Helpers for the merge tests: a site config on the session broker, producing ingress
records the way the gateway does, reading canonical topics back."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import tomli_w
from confluent_kafka import Producer
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from local_stack.spark import spark_driver_conf
from shorelink.contract import H_PROOF, LEDGER_TOPIC, Record, canonical_topic, ingress_topic
from shorelink.identity import Identity
from shorelink.kafka.admin import Admin
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.reading import read_to_end
from shorelink.kafka.topics import TopicSpec, ensure_topics
from shorelink.ledger import decode_entry
from shorelink.proof import ShipKey, leaves_of
from shorelink.ranges import RangeSet
from spark_core.config import SiteConfig, parse_config
from tests.helpers import unique, write_toml


def site_doc(
    bootstrap: str,
    root: Path,
    streams: list[str],
    *,
    name: str,
    max_offsets: int = 100_000,
    max_batch_bytes: int | None = None,
    tables: bool = False,
    customers: Path | None = None,
    offsets_timeout: str | None = None,
) -> dict[str, Any]:
    """A sites file of one site, ``name``, on a local Spark: its checkpoints and tables
    under ``root``, its merge reading the ingress topics of ``streams`` (``offsets_timeout``:
    its Kafka source's, for a test that kills a broker)."""
    doc: dict[str, Any] = {"customers_file": str(customers)} if customers else {}
    return doc | {
        "spark": {
            "master": "local[2]",
            "driver_memory": "1g",
            "conf": {
                "spark.sql.shuffle.partitions": "2",
                "spark.ui.enabled": "false",
                **spark_driver_conf(),
            },
        },
        "sites": {
            name: {
                "streams": streams,
                "checkpoint_dir": str(root / "checkpoints"),
                "table_dir": str(root / "tables"),
                "trigger_interval": "200ms",
                "tables": tables,
                "kafka": {"bootstrap": bootstrap, "timeout": "20s"},
                "merge": {
                    "source_pattern": "|".join(rf"sl\.ingress\.{s}" for s in streams),
                    "canonical_partitions": 3,
                    "max_offsets_per_trigger": max_offsets,
                    **({"max_batch_bytes": max_batch_bytes} if max_batch_bytes else {}),
                    **({"offsets_timeout": offsets_timeout} if offsets_timeout else {}),
                },
            }
        },
    }


def graph_doc(
    edges: dict[str, list[str]], root: Path, replication: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A sites file of several sites, each pulling from ``edges[site]`` (a replication
    graph for the config and routing checks; no Kafka behind it), each with
    ``replication`` settings."""
    return {
        "sites": {
            s: {
                "streams": ["containers"],
                "neighbours": ns,
                "checkpoint_dir": str(root / s),
                "table_dir": str(root / f"{s}-tables"),
                "kafka": {"bootstrap": "127.0.0.1:9092"},
                "replication": dict(replication or {}),
            }
            for s, ns in edges.items()
        }
    }


def site_toml(bootstrap: str, root: Path, streams: list[str], **kw: Any) -> str:
    """:func:`site_doc` as text, for a test that edits it (test_standalone)."""
    return tomli_w.dumps(site_doc(bootstrap, root, streams, **kw))


def make_site(
    bootstrap: str,
    root: Path,
    streams: list[str],
    *,
    max_offsets: int = 100_000,
    max_batch_bytes: int | None = None,
    tables: bool = False,
    customers: Path | None = None,
    offsets_timeout: str | None = None,
) -> tuple[SiteConfig, Path]:
    """A fresh site (own transactional.id, marker key, checkpoint) reading ``streams``
    (``customers``: its customers file, for customer streams)."""
    name = unique("site")
    doc = site_doc(
        bootstrap,
        root,
        streams,
        name=name,
        max_offsets=max_offsets,
        max_batch_bytes=max_batch_bytes,
        tables=tables,
        customers=customers,
        offsets_timeout=offsets_timeout,
    )
    root.mkdir(parents=True, exist_ok=True)
    path = write_toml(root / "sites.toml", doc)
    return parse_config(doc, base=root).site(name), path


def create_ingress(bootstrap: str, streams: Iterable[str], partitions: int = 2) -> None:
    ensure_topics(
        KafkaEndpoint.plaintext(bootstrap),
        [TopicSpec(ingress_topic(s), partitions=partitions) for s in streams],
    )


def record(
    origin: str, stream: str, seq: int, key: str = "c1", value: bytes | None = None
) -> Record:
    return Record(
        Identity(origin, stream, seq),
        key.encode(),
        f"v{seq}".encode() if value is None else value,
        1000 + seq,
        "tokyo",
        f"ship/{origin}/{key}",
    )


def produce(bootstrap: str, records: Iterable[Record], *, transactional: bool = True) -> None:
    """Write records to sl.ingress.<stream> as the gateway does (one transaction)."""
    conf: dict[str, object] = {"bootstrap.servers": bootstrap, "linger.ms": 2}
    if transactional:
        conf["transactional.id"] = unique("gw")
    p = Producer(conf)
    if transactional:
        p.init_transactions(20)
        p.begin_transaction()
    for r in records:
        p.produce(ingress_topic(r.identity.stream), key=r.key, value=r.value, headers=r.headers())
    if transactional:
        p.commit_transaction(20)
    assert p.flush(20) == 0


def produce_raw(
    bootstrap: str,
    topic: str,
    items: Iterable[tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]],
    *,
    partition: int | None = None,
) -> None:
    """``items`` to ``topic`` as they are (to ``partition``, else each key's)."""
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    where = {} if partition is None else {"partition": partition}
    for key, value, headers in items:
        p.produce(topic, key=key, value=value, headers=headers, **where)
    assert p.flush(20) == 0


def canonical(bootstrap: str, stream: str) -> list[Record]:
    """Every record of sl.<stream> (read_committed), in partition order."""
    return [
        Record.from_kafka(m.key(), m.value(), m.headers())
        for m in read_to_end(
            KafkaEndpoint.plaintext(bootstrap), [canonical_topic(stream)], settled=True
        )
    ]


def assert_exactly_once(records: list[Record], expected: dict[tuple[str, str], int]) -> None:
    """Each identity once, no gaps: ``expected`` maps (origin, stream) -> last seq."""
    counts = Counter(r.identity for r in records)
    dups = {i: n for i, n in counts.items() if n > 1}
    assert not dups, f"duplicated identities: {sorted(dups)[:10]}"
    for (origin, stream), last in expected.items():
        got = RangeSet.from_seqs(i.seq for i in counts if i.source == (origin, stream))
        assert str(got) == f"1-{last}", f"{origin}/{stream}: holds {got}, expected 1-{last}"


def ledger(bootstrap: str, streams: Iterable[str] | None = None) -> dict[tuple[str, str], RangeSet]:
    """The site's ``sl.ledger``: (origin, stream) -> what it holds; with ``streams``,
    only their entries (the broker is shared: another test's ledger entry may be one a
    merge refuses, on purpose)."""
    wanted = None if streams is None else {f"/{s}".encode() for s in streams}
    out: dict[tuple[str, str], RangeSet] = {}
    for m in read_to_end(KafkaEndpoint.plaintext(bootstrap), [LEDGER_TOPIC], settled=True):
        key = m.key() or b""
        if wanted is not None and not any(key.endswith(w) for w in wanted):
            continue
        origin, stream, held = decode_entry(m.key(), m.value())
        out[(origin, stream)] = held
    return out


def signed_relayed(
    key: ShipKey, stream: str, seqs: range, *, forged: bool = False
) -> list[tuple[bytes, bytes, list[tuple[str, bytes]]]]:
    """Ship ``bigblue``'s records as entry e1's relay topic holds them, each with the
    proof ``key`` makes; ``forged``: each a forger's, its chunk as the ship's and a
    signature of its own making, its payload changed."""
    recs = [
        Record(
            Identity("bigblue", stream, q), b"C1", b'{"q":%d}' % q, 1_767_225_600_000 + q, "e1", "t"
        )
        for q in seqs
    ]
    leaves = leaves_of(
        seqs.start,
        [r.key for r in recs],
        [r.ts_ms for r in recs],
        [r.mqtt_topic for r in recs],
        [r.value for r in recs],
    )
    out = []
    for i, (r, p) in enumerate(
        zip(recs, key.proofs("bigblue", stream, seqs.start, leaves), strict=True)
    ):
        if forged:
            p = p[:10] + bytes([i % 251 + 1]) * 32 + p[42:]
            r = Record(r.identity, r.key, b'{"forged":1}', r.ts_ms, r.site, r.mqtt_topic)
        out.append((r.key, r.value, [*r.headers(), (H_PROOF, p)]))
    return out


def set_max_message_bytes(bootstrap: str, topic: str, value: int) -> None:
    """Set ``topic``'s ``max.message.bytes`` (a topic that refuses large records)."""
    admin = Admin(KafkaEndpoint.plaintext(bootstrap))
    res = ConfigResource(
        ResourceType.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry(
                "max.message.bytes", str(value), incremental_operation=AlterConfigOpType.SET
            )
        ],
    )
    for f in admin.client.incremental_alter_configs([res], request_timeout=20).values():
        admin.wait(f, f"max.message.bytes of {topic}", timeout=30)
