"""The sites file (TOML; commented sample: ``deploy/spark/sites.toml``).

One file describes every site of the deployment, so a site's neighbours are named, not
repeated; ``--site NAME`` picks the one this Spark application runs for. Each key is
declared once, on its field (``shorelink.config.key``), and read from there by
``shorelink.config.read``; only the checks across keys are written here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

from shorelink.boundary import boundary
from shorelink.config import (
    LOG_LEVELS,
    Errors,
    Secret,
    Section,
    check_name_field,
    key,
    read,
    read_key,
)
from shorelink.config import load_config as load_file
from shorelink.contract import KAFKA_MAX_MESSAGE_BYTES
from shorelink.errors import ConfigError
from shorelink.fleet.entry import REGISTRY_STREAM
from shorelink.fleet.log import read_anchor
from shorelink.kafka.auth import KafkaAuth
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.sites import SiteKafka
from shorelink.shards import MAX_SHARDS, Shard
from spark_core.location import Location

__all__ = [
    "AccessConfig",
    "MergeConfig",
    "MetricsConfig",
    "OpsConfig",
    "Principal",
    "ReplicationConfig",
    "SiteConfig",
    "SitesConfig",
    "SparkConfig",
    "StreamPolicy",
    "carry_registry",
    "load_config",
    "parse_config",
    "shard_site",
]


@dataclass(frozen=True)
class MergeConfig:
    #: Kafka transactional.id of the merge; one merge per site holds it (default
    #: ``shorelink-merge-<site>``); a second merge with the same id fences the first
    transactional_id: str = ""
    #: Java regex of the topics the merge reads (Spark ``subscribePattern``); empty (the
    #: default): the ingress topics of the site's streams, read by two merges
    #: when some streams are urgent (``replication.urgent``), one for those, one for the rest
    source_pattern: str = ""
    #: partitions of each canonical topic ``sl.<stream>`` when the merge creates it
    canonical_partitions: int = field(default=6, metadata=key(min=1, max=1000))
    #: retention of canonical topics (``None``, "forever" in the file: keep forever)
    canonical_retention_ms: int | None = field(
        default=None, metadata=key("canonical_retention", kind="duration_ms", none="forever")
    )
    dead_retention_ms: int = field(
        default=30 * 86400 * 1000, metadata=key("dead_retention", kind="duration_ms")
    )
    #: upper bound of one micro-batch, in records
    max_offsets_per_trigger: int = field(default=100_000, metadata=key(min=1))
    #: upper bound of what the driver holds of one batch, in bytes (keys, values,
    #: headers): a micro-batch beyond it is written in slices of at most this much
    #: (spark_core/merge.py), and so is each pulled batch (spark_core/pull.py)
    max_batch_bytes: int = field(
        default=64 * 1024 * 1024,
        metadata=key(
            kind="size",
            min=KAFKA_MAX_MESSAGE_BYTES,
            why=f"{{v}} < {KAFKA_MAX_MESSAGE_BYTES}, one record with its headers "
            "(KAFKA_MAX_MESSAGE_BYTES)",
        ),
    )
    #: how often the merge's Spark query runs when the merge's ingest puller reads
    #: the same ingress topics (spark_core/pull.py; every merge without a
    #: ``source_pattern``): the puller writes each record as it comes, the query is the
    #: backstop (and the ingress purge's pace). A merge without an ingest puller runs
    #: its query every ``trigger_interval``
    backstop_interval_s: float = field(default=30.0, metadata=key("backstop_interval", gt=0))
    #: fail the query when ingress records vanished before the merge read them
    fail_on_data_loss: bool = True
    #: how long Spark's Kafka source (the merge's and the tables') waits for an answer
    #: about offsets before it tries again with a new client (the Java client's
    #: ``default.api.timeout.ms``; its ``request.timeout.ms`` is at most this). A dead
    #: broker holds a query this long: the client waits on the partition's old leader.
    #: Kafka's own default, 60 s
    offsets_timeout_s: float = field(default=60.0, metadata=key("offsets_timeout", min=1))
    #: split the merge by origin into this many shards, each a Spark application of its
    #: own (``shorelink-spark site --shard k/N``) merging the origins
    #: ``crc32(origin) mod N == k`` from its ingress partitions (the gateway's
    #: ``kafka.ingress_by_origin``); 1: one merge, as ever (docs/data-centre.md,
    #: "Scaling out: merges split by origin, each fenced")
    shards: int = field(default=1, metadata=key(min=1, max=MAX_SHARDS))
    #: delete from ``sl.ingress.*`` what the merge committed past
    #: (spark_core/purge.py); off only if something else must read those topics later
    purge_sources: bool = True

    def source_options(self) -> dict[str, str]:
        """The ``kafka.`` options of Spark's Kafka source that :attr:`offsets_timeout_s`
        sets (Kafka's defaults, 60 and 30 s, unless the file says otherwise)."""
        ms = round(self.offsets_timeout_s * 1000)
        return {
            "kafka.default.api.timeout.ms": str(ms),
            "kafka.request.timeout.ms": str(min(ms, 30_000)),
        }


@dataclass(frozen=True)
class ReplicationConfig:
    """How the site pulls from its neighbours (spark_core/replication.py, routing.py)."""

    #: streams replicated and merged ahead of the rest: their own pullers, their
    #: own merge, Spark's FAIR scheduler's ``urgent`` pool
    urgent: tuple[str, ...] = field(default=("alerts",), metadata=key(names="stream"))
    #: upper bound of one pulled batch, in records (spark_core/pull.py)
    max_offsets_per_trigger: int = field(default=50_000, metadata=key(min=1))
    #: how often the site checks each neighbour and trades link state with it
    probe_interval_s: float = field(default=2.0, metadata=key("probe_interval", gt=0))
    #: a neighbour whose Kafka does not answer within this is down
    probe_timeout_s: float = field(default=5.0, metadata=key("probe_timeout", gt=0))
    #: a site's link report older than this no longer counts (its application is down)
    report_ttl_s: float = field(default=30.0, metadata=key("report_ttl", gt=0))
    #: how often the site compares each neighbour's holdings with its own and takes
    #: what it lacks (spark_core/repair.py); a record is repaired once it has been
    #: held there and missing here for a whole interval
    repair_interval_s: float = field(default=60.0, metadata=key("repair_interval", gt=0))
    #: how long a move of a canonical partition's oldest offset must hold before the
    #: self-check forgets what it took (spark_core/repair.py ``SelfCheck``): Kafka keeps
    #: a partition's new start offset in memory and writes it down every
    #: ``log.flush.start.offset.checkpoint.interval.ms`` (60 s by default), so a broker
    #: that crashes before brings the deleted records back
    self_check_settle_s: float = field(default=90.0, metadata=key("self_check_settle", min=0))
    #: retention of ``sl.relay.<entry>.<stream>``: the longest outage a neighbour can
    #: catch up from through this site
    relay_retention_ms: int = field(
        default=7 * 86400 * 1000, metadata=key("relay_retention", kind="duration_ms", min=60_000)
    )
    #: how this site reaches a neighbour's Kafka when not at that site's
    #: ``kafka.bootstrap`` (``[sites.S.replication.via]``: neighbour = "host:port")
    via: tuple[tuple[str, str], ...] = ()
    #: the principal this site's application is at its neighbours' Kafkas (SASL user
    #: ``site-<name>`` by default when a password is set; "" with no password: none)
    username: str = ""
    #: its password (``${ENV}``); ``access apply`` at each neighbour sets it
    password: Secret = field(default=Secret(""), metadata=key(kind="secret"))


@dataclass(frozen=True)
class Principal:
    """A SASL user: its name and password (``${ENV}``)."""

    username: str
    password: Secret = field(default=Secret(""), metadata=key(kind="secret"))


@dataclass(frozen=True)
class AccessConfig:
    """Who administers the site's Kafka, and the gateway's principal there
    (``[sites.S.access]``; ``shorelink-spark access apply``, spark_core/access.py)."""

    #: a super user of the site's Kafka: creates the other principals and the ACLs
    admin_username: str = "admin"
    admin_password: Secret = field(default=Secret(""), metadata=key(kind="secret"))
    #: the site's gateway: writes the ingress topics and its cursor, nothing else
    gateway_username: str = ""
    gateway_password: Secret = field(default=Secret(""), metadata=key(kind="secret"))
    #: the gateway's ``kafka.transactional_id`` (default ``shorelink-gateway-<site>``)
    gateway_transactional_id: str = ""
    #: headquarters' registry loop (``shorelink fleet run``): writes the site's
    #: ``sl.ingress.registry``, reads ``sl.registry`` and the ships' reports, nothing else
    #: (default name ``fleet-<site>`` when a password is set)
    fleet_username: str = ""
    fleet_password: Secret = field(default=Secret(""), metadata=key(kind="secret"))


@dataclass(frozen=True)
class StreamPolicy:
    """How one stream's topics are kept at one site (``[sites.S.topics.<stream>]``):
    short at a port, long at headquarters. A key left out (or the whole table) takes
    the site's ``merge.canonical_partitions``, ``merge.canonical_retention`` and
    ``replication.relay_retention``. ``shorelink-spark topics apply`` brings the
    site's Kafka to it (spark_core/topics.py)."""

    #: partitions of ``sl.<stream>`` and of the stream's ingress and relay
    #: topics; they only grow (fewer would move keys between partitions)
    partitions: int = field(default=6, metadata=key(min=1, max=1000))
    #: retention of ``sl.<stream>`` (``None``, "forever" in the file: keep forever)
    retention_ms: int | None = field(
        default=None, metadata=key("retention", kind="duration_ms", none="forever", min=60_000)
    )
    #: retention of ``sl.relay.<entry>.<stream>``: the longest outage a neighbour can
    #: catch up from through this site
    relay_retention_ms: int = field(
        default=7 * 86400 * 1000, metadata=key("relay_retention", kind="duration_ms", min=60_000)
    )


@dataclass(frozen=True)
class OpsConfig:
    """The site's operations page (``[sites.S.ops]``; ``shorelink ops``,
    docs/operations.md). Who may see it: the logins of ``users_file`` (its own, made by
    ``shorelink ops-users``; HTTP Basic, over TLS when ``tls_cert_file`` is set)."""

    host: str = field(default="127.0.0.1", metadata=key("listen.host"))
    port: int = field(default=8090, metadata=key("listen.port", min=0, max=65535))
    #: serve HTTPS with this certificate chain and key (both, or neither)
    tls_cert_file: Path | None = field(default=None, metadata=key("listen.tls_cert_file"))
    tls_key_file: Path | None = field(default=None, metadata=key("listen.tls_key_file"))
    #: connections open at once at most, TLS handshakes included (one more is closed
    #: at once), and how long a connection may take to send a request's headers, from
    #: when it opened or its last answer (shorelink/listen.py; review N7)
    max_connections: int = field(
        default=256, metadata=key("listen.max_connections", min=1, max=1_000_000)
    )
    idle_timeout_s: float = field(
        default=30.0, metadata=key("listen.idle_timeout", gt=0, why="must be > 0")
    )
    #: the site's gateway's metrics listener (its ``[metrics]``, ``http://host:port``;
    #: "": the page shows no gateway), whose ``/metrics`` the page reads; an
    #: ``https://`` one (a TLS proxy in front) verified against ``gateway_ca_file``
    gateway: str = ""
    gateway_ca_file: Path | None = None
    #: the page's own logins, hashed (``shorelink ops-users add NAME``; never Kafka
    #: passwords); unset: the page is open, which it allows on a loopback address only
    users_file: Path | None = None
    #: the ships' report stream (edge ``[report] stream``)
    report_stream: str = "agent"
    #: how often the page is brought up to date
    refresh_s: float = field(default=1.0, metadata=key("refresh", min=0.1, max=60))
    #: the newest records of ``sl.alerts`` and ``sl.nav`` read at start, per partition
    tail: int = field(default=2000, metadata=key(min=1, max=1_000_000))
    #: the page's own Kafka principal, read-only (``access apply`` makes it: READ on
    #: ``sl.*``); "": the page reads as the site application, which may also write
    #: (said at start)
    kafka_username: str = field(default="", metadata=key("kafka.username"))
    kafka_password: Secret = field(
        default=Secret(""), metadata=key("kafka.password", kind="secret")
    )


@dataclass(frozen=True)
class MetricsConfig:
    """The application's Prometheus metrics (``[sites.S.metrics]``, spark_core/
    metrics.py): replication lag per neighbour and stream, pullers, merges."""

    host: str = field(default="127.0.0.1", metadata=key("listen.host"))
    #: 0 (the default): not served
    port: int = field(default=0, metadata=key("listen.port", min=0, max=65535))


@dataclass(frozen=True)
class TableMaintenanceConfig:
    """Delta's own OPTIMIZE and VACUUM over the site's tables, on a schedule
    (``[sites.S.table_maintenance]``, spark_core/tables.py ``TableKeeper``): the tables
    are written every trigger, a few small files each time, without end otherwise."""

    #: how often the tables are compacted and vacuumed; 0: never
    interval_s: float = field(default=3600.0, metadata=key("interval", min=0))
    #: files a compaction replaced are deleted once older than this (Delta's own
    #: default, 7 days: a reader of an older version finds its files until then). Less
    #: than 7 days turns Delta's retention check off for the site's session (said at start)
    retention_s: float = field(default=7 * 86400.0, metadata=key("retention", min=0))


@dataclass(frozen=True)
class SparkConfig:
    master: str = "local[*]"
    driver_memory: str = "2g"
    #: extra ``--conf key=value`` pairs for spark-submit (``[spark.conf]``)
    conf: tuple[tuple[str, str], ...] = ()
    #: more Maven packages for spark-submit, after the Kafka connector, Delta and the
    #: filesystem modules the sites' URLs need (spark_core/packages.py)
    packages: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class SiteConfig(SiteKafka):
    """A site of the sites file: what the kernel reads of it (:class:`SiteKafka`: its
    name, ``kafka`` table and streams, declared once there) and the rest of its keys."""

    #: the streaming queries' checkpoints and the Delta tables: a path (relative to the
    #: sites file) or a Hadoop filesystem URL (``s3a://``, ``abfss://``, ``hdfs://``)
    checkpoint_dir: Location
    table_dir: Location
    #: the application's own files (status files, the merges' stamps,
    #: spark-submit.properties): a local path; by default checkpoint_dir, which must
    #: then be a path
    state_dir: Path | None = None
    #: sites of this file this one replicates from
    neighbours: tuple[str, ...] = field(default=(), metadata=key(names="site"))
    trigger_interval_s: float = field(default=2.0, metadata=key("trigger_interval"))
    tables: bool = False
    #: keep ``sl.customer.<name>.<stream>`` at this site (when the file names a
    #: ``customers_file``); false at a port that only HQ's customers read from
    customer_topics: bool = True
    merge: MergeConfig = field(default_factory=MergeConfig)
    replication: ReplicationConfig = field(default_factory=ReplicationConfig)
    access: AccessConfig = field(default_factory=AccessConfig)
    #: per stream: partitions and retention at this site (``[sites.S.topics.<stream>]``)
    topics: dict[str, StreamPolicy] = field(default_factory=dict, metadata=key(names="stream"))
    #: the operations page (``[sites.S.ops]``)
    ops: OpsConfig = field(default_factory=OpsConfig)
    #: Prometheus metrics (``[sites.S.metrics]``)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    #: compaction and vacuum of the Delta tables (``[sites.S.table_maintenance]``)
    table_maintenance: TableMaintenanceConfig = field(default_factory=TableMaintenanceConfig)

    def policy(self, stream: str) -> StreamPolicy:
        """``stream``'s policy at this site: its ``[topics.<stream>]`` table, or what
        the merge and replication keys say."""
        return self.topics.get(stream) or self.default_policy()

    def default_policy(self) -> StreamPolicy:
        return StreamPolicy(
            partitions=self.merge.canonical_partitions,
            retention_ms=self.merge.canonical_retention_ms,
            relay_retention_ms=self.replication.relay_retention_ms,
        )

    def query_checkpoint(self, query: str) -> Location:
        return self.checkpoint_dir / query

    @property
    def state_path(self) -> Path:
        """Where the application keeps its own files: ``state_dir``, else
        ``checkpoint_dir`` (a path then: the loader refuses a URL without state_dir)."""
        return self.state_dir if self.state_dir is not None else self.checkpoint_dir.path

    def reach(self, neighbour: SiteConfig) -> KafkaEndpoint:
        """``neighbour``'s Kafka as this site's application reaches it: at the address
        ``replication.via`` names (else the neighbour's ``kafka.bootstrap``), as this
        site's neighbour principal, verifying the neighbour's CA."""
        n = neighbour.kafka
        at = n.with_bootstrap(dict(self.replication.via).get(neighbour.name, n.bootstrap))
        if not self.replication.username:
            return at.with_auth(KafkaAuth(ca_file=n.auth.ca_file, mechanism=n.auth.mechanism))
        return at.as_user(self.replication.username, self.replication.password)

    def admin_kafka(self) -> KafkaEndpoint:
        """How ``access apply`` (and ``topics apply``) connects: as the site's admin."""
        a = self.access
        if not a.admin_password:
            return self.kafka
        return self.kafka.as_user(a.admin_username, a.admin_password)

    @property
    def urgent_streams(self) -> tuple[str, ...]:
        return tuple(s for s in self.streams if s in self.replication.urgent)

    @property
    def bulk_streams(self) -> tuple[str, ...]:
        return tuple(s for s in self.streams if s not in self.replication.urgent)


@dataclass(frozen=True)
class SitesConfig:
    sites: dict[str, SiteConfig]
    spark: SparkConfig = field(default_factory=SparkConfig)
    log_level: str = field(default="info", metadata=key(choices=LOG_LEVELS))
    #: Big Blue's staff: read everything at every site (``[[staff]]``)
    staff: tuple[Principal, ...] = ()
    #: who owns which container when (spark_core/customers.py); re-read when it
    #: changes; relative to this file; unset: no customer streams
    customers_file: Path | None = field(default=None, metadata=key(kind="path"))
    #: every ship's public signing key (shorelink/proof.py; the same file as the
    #: gateways'): what a site pulls from a neighbour is taken only with its ship's
    #: proof; re-read when it changes; relative to this file; unset: not checked
    ship_keys_file: Path | None = field(default=None, metadata=key(kind="path"))
    #: the fleet registry's root public key (``fleet.pub`` of ``shorelink fleet init``;
    #: docs/fleet-registry.md, "How it travels"): every site carries the stream
    #: ``registry`` (urgent, one partition, kept forever) and each application follows
    #: its site's ``sl.registry``, its merges checking what they pull against the keys
    #: the registry says (no ship keys file: unset ``ship_keys_file``); relative to
    #: this file; unset: the registry does not travel
    fleet_pub_file: Path | None = field(default=None, metadata=key(kind="path"))

    def neighbours_of(self) -> dict[str, tuple[str, ...]]:
        """The replication graph: each site -> the sites it pulls from."""
        return {name: s.neighbours for name, s in self.sites.items()}

    def unreached(self) -> dict[str, list[str]]:
        """Once any site pulls from a neighbour: each site -> the sites whose records it
        never gets, no chain of neighbours leading there (empty when every site reaches
        every other). A site nobody reaches keeps what entered through it to itself
        (review finding 18); the site application warns of it at start."""
        graph = self.neighbours_of()
        if not any(graph.values()):
            return {}  # no replication: each site on its own
        out = {}
        for reader in sorted(graph):
            seen, todo = {reader}, [reader]
            while todo:
                for n in graph[todo.pop()]:
                    if n not in seen:
                        seen.add(n)
                        todo.append(n)
            if missing := sorted(set(graph) - seen):
                out[reader] = missing
        return out

    def site(self, name: str) -> SiteConfig:
        try:
            return self.sites[name]
        except KeyError:
            raise ConfigError(
                "sites", f"no site {name!r} (known: {', '.join(sorted(self.sites))})"
            ) from None


# What follows is what the keys' declarations cannot say: defaults made of other keys
# and checks across keys.


def _site(name: str, sec: Section, base: Path | None) -> SiteConfig:
    errors = Errors()  # every bad key of the site at once
    errors.attempt(lambda: check_name_field(sec.path, "site", name), name)
    merge = errors.attempt(
        lambda: read(
            MergeConfig,
            sec.section("merge"),
            defaults={"transactional_id": f"shorelink-merge-{name}"},
        ),
        MergeConfig(),
    )
    replication = errors.attempt(
        lambda: read(
            ReplicationConfig,
            sec.section("replication"),
            defaults={"username": f"site-{name}" if _has(sec, "replication", "password") else ""},
        ),
        ReplicationConfig(),
    )
    inherited = StreamPolicy(
        merge.canonical_partitions, merge.canonical_retention_ms, replication.relay_retention_ms
    )
    streams = errors.attempt(lambda: read_key(SiteConfig, "streams", sec), ())
    read_site = errors.attempt(
        lambda: read(
            SiteConfig,
            sec,
            base=base,
            name=name,
            merge=merge,
            replication=replication,
            defaults={
                "topics": dict.fromkeys(streams, inherited),
                "access": AccessConfig(
                    gateway_username=f"gateway-{name}"
                    if _has(sec, "access", "gateway_password")
                    else "",
                    gateway_transactional_id=f"shorelink-gateway-{name}",
                    fleet_username=f"fleet-{name}" if _has(sec, "access", "fleet_password") else "",
                ),
            },
        ),
        None,
    )
    cfg = errors.result(read_site)
    if not cfg.streams:
        raise ConfigError(sec.field("streams"), "list at least one stream")
    cfg = _inherit_retention(cfg, sec)
    ops = cfg.ops
    if (ops.tls_cert_file is None) != (ops.tls_key_file is None):
        raise ConfigError(
            f"{sec.path}.ops.listen.tls_cert_file", "set both tls_cert_file and tls_key_file"
        )
    check_name_field(f"{sec.path}.ops.report_stream", "stream", ops.report_stream)
    if ops.gateway and not ops.gateway.startswith(("http://", "https://")):
        raise ConfigError(
            f"{sec.path}.ops.gateway", f"expected http(s)://host:port, got {ops.gateway!r}"
        )
    if name in cfg.neighbours:
        raise ConfigError(sec.field("neighbours"), f"a site is not its own neighbour ({name})")
    if cfg.checkpoint_dir.is_url and cfg.state_dir is None:
        raise ConfigError(
            sec.field("state_dir"),
            f"is required when checkpoint_dir is a URL ({cfg.checkpoint_dir}): a local "
            "directory for the status files `shorelink-spark status` reads",
        )
    if cfg.merge.shards > 1:
        shards = f"merge.shards = {cfg.merge.shards}"
        if cfg.neighbours:
            raise ConfigError(
                sec.field("neighbours"),
                f"a site that splits its merge ({shards}) pulls from no neighbour: "
                "replication between sharded sites is not built (docs/data-centre.md, "
                '"Scaling out")',
            )
        if cfg.merge.source_pattern:
            raise ConfigError(
                f"{sec.path}.merge.source_pattern",
                f"a merge split by origin ({shards}) reads the ingress partitions of its "
                "origins: unset source_pattern",
            )
        for stream in cfg.streams:
            parts = cfg.policy(stream).partitions
            if parts % cfg.merge.shards:
                raise ConfigError(
                    f"{sec.path}.topics.{stream}.partitions",
                    f"{parts} partitions is not a multiple of {shards}: each shard reads "
                    "the ingress partitions of its origins (crc32(origin) mod partitions)",
                )
    for n, bootstrap in cfg.replication.via:
        if n not in cfg.neighbours:
            raise ConfigError(f"{sec.path}.replication.via.{n}", f"{n!r} is not a neighbour")
        if not bootstrap:
            raise ConfigError(f"{sec.path}.replication.via.{n}", "empty bootstrap")
    return cfg


def _has(sec: Section, table: str, key: str) -> bool:
    return sec.has(table) and sec.section(table).has(key)


def _inherit_retention(cfg: SiteConfig, sec: Section) -> SiteConfig:
    """A ``[topics.<stream>]`` table without ``retention`` keeps the canonical
    retention ("forever" and "left out" both read as None); a table of a stream the
    site does not carry is an error."""
    topics = dict(cfg.topics)
    for stream, table in sec.sections("topics").items():
        if stream not in cfg.streams:
            raise ConfigError(table.path, f"{stream!r} is not one of this site's streams")
        if not table.has("retention"):
            topics[stream] = replace(topics[stream], retention_ms=cfg.merge.canonical_retention_ms)
    return replace(cfg, topics=topics)


def parse_config(data: dict[str, object], base: Path | None = None) -> SitesConfig:
    """The sites file, every bad key of every site and of its other tables named at once."""
    top = Section(data)
    errors = Errors()
    read_sites = {
        name: errors.attempt(partial(_site, name, sec, base), None)
        for name, sec in errors.attempt(lambda: top.sections("sites"), {}).items()
    }
    sites = {name: s for name, s in read_sites.items() if s is not None}
    cfg = errors.result(
        errors.attempt(lambda: read(SitesConfig, top, base=base, sites=sites), None)
    )
    if not sites:
        raise ConfigError("sites", "define at least one [sites.NAME]")
    for s in sites.values():
        for n in s.neighbours:
            if n not in sites:
                raise ConfigError(f"sites.{s.name}.neighbours", f"{n!r} is not a site of this file")
            if sites[n].merge.shards > 1:
                raise ConfigError(
                    f"sites.{s.name}.neighbours",
                    f"{n!r} splits its merge (merge.shards = {sites[n].merge.shards}): "
                    "replication from or to a sharded site is not built "
                    '(docs/data-centre.md, "Scaling out")',
                )
    if cfg.fleet_pub_file is not None:
        # a missing or broken key fails now, named
        read_anchor(cfg.fleet_pub_file, "fleet_pub_file")
        if cfg.ship_keys_file is not None:
            raise ConfigError(
                "fleet_pub_file",
                "the registry gives the ship keys: unset ship_keys_file (a site run alone)",
            )
        cfg = replace(cfg, sites={n: carry_registry(s) for n, s in cfg.sites.items()})
    return cfg


def carry_registry(site: SiteConfig) -> SiteConfig:
    """``site`` carrying the fleet registry's stream: urgent (it travels as an alert
    does), one partition (the entries in one order), kept forever (a site rebuilt or
    added later takes the whole chain from a neighbour's canonical topic)."""
    if REGISTRY_STREAM in site.streams:
        raise ConfigError(
            f"sites.{site.name}.streams",
            f"{REGISTRY_STREAM!r} is the fleet registry's, carried by fleet_pub_file",
        )
    policy = StreamPolicy(1, None, site.replication.relay_retention_ms)
    return replace(
        site,
        streams=(*site.streams, REGISTRY_STREAM),
        replication=replace(site.replication, urgent=(*site.replication.urgent, REGISTRY_STREAM)),
        topics={**site.topics, REGISTRY_STREAM: policy},
    )


def shard_site(site: SiteConfig, shard: Shard | None) -> SiteConfig:
    """``site`` as shard ``shard`` of its merge runs it: checked against its
    ``merge.shards``, its own files under ``<state_dir>/shard-<k>of<N>`` (status, stamps;
    the shards may share a host). A ConfigError when the shard does not fit the site."""
    n = site.merge.shards
    where = f"sites.{site.name}.merge.shards"
    if shard is None:
        if n > 1:
            raise ConfigError(
                where, f"the site's merge is split in {n}: run each shard with --shard k/{n}"
            )
        return site
    if shard.count != n:
        raise ConfigError(where, f"is {n}; --shard {shard} is a shard of {shard.count}")
    if n == 1:
        return site
    return replace(site, state_dir=site.state_path / f"shard-{shard.index}of{shard.count}")


@boundary
def load_config(path: str | Path) -> SitesConfig:
    return load_file(path, parse_config)
