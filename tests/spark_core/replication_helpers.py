"""Several sites on loopback for the replication tests: one Kafka broker per site slot,
each reachable from every other slot through its own toxiproxy proxy (so one link can
be cut), a sites file for any topology over those slots, and the sites' applications
run in one Spark session, each in a thread."""

from __future__ import annotations

import shutil
import threading
import tomllib
import urllib.request
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from prometheus_client.parser import text_string_to_metric_families

from local_stack.kafka import (
    CLIENT_COMPILER,
    KafkaBroker,
    LinkListener,
    start_kafka,
    start_site_broker,
)
from local_stack.process import free_ports
from local_stack.spark import spark_driver_conf
from local_stack.toxiproxy import Toxiproxy
from shorelink.contract import H_PROOF, KAFKA_MAX_MESSAGE_BYTES, Record, ingress_topic
from shorelink.identity import Identity
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.errors import UnknownTopic
from shorelink.kafka.topics import TopicSpec, ensure_topics
from shorelink.proof import ShipKey, ShipKeys
from shorelink.wire import Batch, WireRecord, decode_columns, encode_batch
from spark_core.config import SitesConfig, parse_config
from spark_core.jobs.site import Supervisor, build_supervisor
from tests.helpers import unique
from tests.spark_core.helpers import canonical

SLOTS = ("ra", "rb", "rc", "rd")


def proxy_name(slot: str, reader: str) -> str:
    """The proxy ``reader`` goes through to reach ``slot``'s broker."""
    return f"repl-{slot}-for-{reader}"


@dataclass
class Mesh:
    brokers: dict[str, KafkaBroker]
    toxiproxy: Toxiproxy
    root: Path
    logs: Path

    def wipe(self, slot: str) -> None:
        """``slot``'s Kafka loses everything: stopped, its storage deleted, started
        again empty (a new cluster) on the same ports, behind the same proxies."""
        b = self.brokers[slot]
        b.proc.stop(grace=10)
        shutil.rmtree(self.root / slot / "data")
        self.brokers[slot] = start_kafka(
            slot,
            self.root / slot,
            self.logs,
            port=b.port,
            controller_port=b.controller_port,
            heap="384m",
            links=b.links,
            jvm_opts=CLIENT_COMPILER,
        )

    def via(self, slot: str, reader: str) -> str:
        return self.brokers[slot].link_bootstrap(reader)

    def cut(self, slot: str, reader: str, cut: bool = True) -> None:
        """Cut (or heal) the link over which ``reader`` pulls from ``slot``."""
        self.toxiproxy.set_enabled(proxy_name(slot, reader), not cut)

    def heal_all(self) -> None:
        for slot in self.brokers:
            for reader in self.brokers:
                if reader != slot:
                    self.cut(slot, reader, False)


def start_mesh(root: Path, logs: Path, toxiproxy: Toxiproxy, slots: Sequence[str] = SLOTS) -> Mesh:
    """One broker per slot (of ``slots``, :data:`SLOTS` by default); for each other
    slot a listener behind a toxiproxy proxy."""
    brokers: dict[str, KafkaBroker] = {}
    # every port at once (each broker's own two as well): none is handed out twice
    free = iter(free_ports(2 * len(slots) * len(slots)))
    ports: dict[str, dict[str, LinkListener]] = {
        s: {r: LinkListener(next(free), next(free)) for r in slots if r != s} for s in slots
    }
    try:
        for s in slots:
            for r, ln in ports[s].items():
                toxiproxy.create_proxy(
                    proxy_name(s, r), f"127.0.0.1:{ln.advertised}", f"127.0.0.1:{ln.port}"
                )
            brokers[s] = start_site_broker(s, root / s, logs, free, ports[s])
        for b in brokers.values():
            b.proc.wait_ready(b.ready, timeout=90)
    except BaseException:
        for b in brokers.values():  # no broker outlives a mesh that did not start
            b.proc.stop(grace=5)
        raise
    return Mesh(brokers, toxiproxy, root, logs)


@dataclass
class Topology:
    """Sites (unique names, one per slot) with their neighbours and streams."""

    mesh: Mesh
    root: Path
    slots: dict[str, str]  # site name -> slot
    neighbours: dict[str, list[str]]
    streams: list[str]
    urgent: list[str]
    max_offsets: int = 50_000
    #: the Spark queries' trigger interval
    trigger: str = "300ms"
    #: the merges' Spark queries' interval beside their ingest pullers
    backstop: str = "30s"
    #: how often each site compares its neighbours' holdings with its own and takes
    #: what it lacks (spark_core/repair.py): rarely, unless a test is about it, so that
    #: no other test's replication is mended behind its back
    repair: str = "1h"
    #: site name -> its own streams, where not ``streams``
    only: dict[str, list[str]] = field(default_factory=dict)
    #: the ship keys file every site reads (``ship_keys_file``), if any
    ship_keys: Path | None = None
    #: the fleet registry's root key every site pins (``fleet_pub_file``), if any: each
    #: site carries the stream ``registry`` and its merges enforce the registry's keys
    fleet_pub: Path | None = None
    #: sites whose merge reads ``merge.source_pattern`` (no ingest puller)
    patterned: Sequence[str] = ()
    cfg: SitesConfig = field(init=False)
    #: site name -> where its application serves Prometheus metrics
    metrics: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        self.metrics = dict(zip(self.slots, free_ports(len(self.slots), "127.0.0.1"), strict=True))
        self.cfg = parse_config(tomllib.loads(self.toml()), base=self.root)

    def toml(self) -> str:
        keys = "" if self.ship_keys is None else f'ship_keys_file = "{self.ship_keys}"\n'
        if self.fleet_pub is not None:
            keys += f'fleet_pub_file = "{self.fleet_pub}"\n'
        parts = [
            keys
            + '[spark]\nmaster = "local[2]"\n[spark.conf]\n'
            + "".join(f'"{k}" = "{v}"\n' for k, v in spark_driver_conf().items()),
        ]
        for name, slot in self.slots.items():
            parts.append(
                f"""
[sites.{name}]
streams = {self.only.get(name, self.streams)!r}
neighbours = {self.neighbours[name]!r}
checkpoint_dir = "{self.root}/{name}/checkpoints"
table_dir = "{self.root}/{name}/tables"
trigger_interval = "{self.trigger}"
[sites.{name}.kafka]
bootstrap = "{self.mesh.brokers[slot].bootstrap}"
timeout = "20s"
[sites.{name}.merge]
canonical_partitions = 3
backstop_interval = "{self.backstop}"
{self._pattern(name)}[sites.{name}.metrics]
listen.port = {self.metrics[name]}
[sites.{name}.replication]
urgent = {self.urgent!r}
max_offsets_per_trigger = {self.max_offsets}
probe_interval = "500ms"
probe_timeout = "2s"
report_ttl = "10s"
repair_interval = "{self.repair}"
self_check_settle = "1s"
[sites.{name}.replication.via]
"""
            )
            for n in self.neighbours[name]:
                parts.append(f'{n} = "{self.mesh.via(self.slots[n], slot)}"\n')
        return "".join(parts)

    def _pattern(self, name: str) -> str:
        """``merge.source_pattern`` of a site in :attr:`patterned` (a TOML literal)."""
        if name not in self.patterned:
            return ""
        pattern = "|".join(r"sl\.ingress\." + s for s in self.only.get(name, self.streams))
        return f"source_pattern = '{pattern}'\n"

    def bootstrap(self, site: str) -> str:
        return self.mesh.brokers[self.slots[site]].bootstrap

    def cut(self, reader: str, source: str, cut: bool = True) -> None:
        """Cut (or heal) the link over which site ``reader`` pulls from ``source``."""
        self.mesh.cut(self.slots[source], self.slots[reader], cut)

    @property
    def ingress_streams(self) -> list[str]:
        """Every stream's, and the registry's where it travels (``fleet_pub``)."""
        return [*self.streams, *(["registry"] if self.fleet_pub is not None else [])]

    def create_ingress(self) -> None:
        for name in self.slots:
            ensure_topics(
                KafkaEndpoint.plaintext(self.bootstrap(name)),
                [TopicSpec(ingress_topic(s), partitions=2) for s in self.ingress_streams],
            )


def topology(
    mesh: Mesh,
    root: Path,
    edges: Mapping[str, Sequence[str]],
    streams: Sequence[str],
    urgent: Sequence[str] = (),
    only: Mapping[str, Sequence[str]] | None = None,
    **kw: Any,
) -> Topology:
    """``edges``: slot -> the slots it pulls from; ``only``: slot -> its streams, where
    not ``streams``. Site names are new for each call (``<slot>-<hex>``), so tests on
    the same brokers never see each other's data."""
    names = {slot: unique(slot) for slot in edges}
    topo = Topology(
        mesh,
        root,
        {names[s]: s for s in edges},
        {names[s]: [names[n] for n in ns] for s, ns in edges.items()},
        list(streams),
        list(urgent),
        only={names[s]: list(ss) for s, ss in (only or {}).items()},
        **kw,
    )
    topo.create_ingress()
    return topo


def full_mesh(slots: Sequence[str]) -> dict[str, list[str]]:
    return {s: [n for n in slots if n != s] for s in slots}


def enter(
    topo: Topology, site: str, records: Iterable[Record], proofs: Sequence[bytes] = ()
) -> None:
    """Records entering at ``site``: written to its ingress as its gateway does (with
    ``proofs``, each record's ``sl.proof``, as for a ship that signs)."""
    p = Producer(
        {
            "bootstrap.servers": topo.bootstrap(site),
            "transactional.id": unique("gw"),
            "linger.ms": 5,
            "message.max.bytes": KAFKA_MAX_MESSAGE_BYTES,  # as the gateway's
        }
    )
    p.init_transactions(20)
    p.begin_transaction()
    for i, r in enumerate(records):
        extra = [(H_PROOF, proofs[i])] if proofs else []
        headers = [*r.headers(), *extra]
        p.produce(ingress_topic(r.identity.stream), key=r.key, value=r.value, headers=headers)
    p.commit_transaction(30)


def signed(records: Sequence[Record], key: ShipKey, keys: ShipKeys) -> list[bytes]:
    """The ``sl.proof`` of each of ``records`` (one ship and stream, consecutive seqs)
    as a gateway makes it from the batch the ship signed with ``key``."""
    first = records[0].identity
    wire = [
        WireRecord(r.identity.seq, r.key.decode(), r.ts_ms, r.mqtt_topic, r.value) for r in records
    ]
    h, cols = decode_columns(encode_batch(Batch(first.origin, first.stream, tuple(wire)), key=key))
    proofs = keys.prove_batch(first.origin, first.stream, h.first_seq, cols, h.signatures)
    assert proofs is not None
    return proofs


def enter_each(topo: Topology, entered: Mapping[str, Sequence[Record]]) -> set[Identity]:
    """``entered[site]`` entering at each site (:func:`enter`); their identities."""
    for site, recs in entered.items():
        enter(topo, site, recs)
    return {r.identity for recs in entered.values() for r in recs}


def records(
    site: str, origin: str, stream: str, seqs: Iterable[int], size: int = 60
) -> list[Record]:
    return [
        Record(
            Identity(origin, stream, q),
            f"c{q % 17}".encode(),
            (b"%08d" % q) * (size // 8),
            1_700_000_000_000 + q,
            site,
            f"ship/{origin}/c",
        )
        for q in seqs
    ]


class Running:
    """Sites' applications in one Spark session, each supervisor in a thread."""

    def __init__(self, spark: object, topo: Topology) -> None:
        self.spark = spark
        self.topo = topo
        self.sups: dict[str, Supervisor] = {}
        self.threads: dict[str, threading.Thread] = {}

    def start(self, *sites: str) -> None:
        for name in sites or tuple(self.topo.slots):
            sup = build_supervisor(self.spark, self.topo.cfg, name)
            t = threading.Thread(target=sup.run, name=f"site-{name}", daemon=True)
            self.sups[name], self.threads[name] = sup, t
            t.start()

    def stop(self, *sites: str) -> None:
        for name in sites or tuple(self.sups):
            sup = self.sups.pop(name)
            sup.request_stop()
            self.threads.pop(name).join(timeout=120)

    def __enter__(self) -> Running:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def identities(topo: Topology, site: str, stream: str) -> Counter[Identity]:
    """The identities in the site's canonical topic (none while it does not exist yet)."""
    try:
        return Counter(r.identity for r in canonical(topo.bootstrap(site), stream))
    except UnknownTopic:
        return Counter()


def converged(
    topo: Topology, expected: Mapping[str, set[Identity]]
) -> Iterator[tuple[str, str, str]]:
    """What is still wrong: (site, stream, why) for every site whose canonical topic
    does not hold exactly ``expected[stream]``, each once."""
    for site in topo.slots:
        for stream, want in expected.items():
            got = identities(topo, site, stream)
            dups = [i for i, n in got.items() if n > 1]
            if dups:
                yield site, stream, f"duplicates {sorted(dups)[:5]}"
            missing = want - set(got)
            extra = set(got) - want
            if missing or extra:
                yield site, stream, f"missing {len(missing)} extra {len(extra)}"


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """A site application's metrics: (name, sorted labels) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }
