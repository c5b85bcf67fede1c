"""Which topics a site needs and how each is kept: the one place that says so, and
``shorelink-spark topics apply``, which brings a site's Kafka to it.

Each stream has a policy per site (``[sites.S.topics.<stream>]``,
:class:`~spark_core.config.StreamPolicy`): partitions and retention, short at a port,
long at headquarters. From it and the sites file, :func:`stream_specs` gives the
per-stream topics the merge writes (the merge creates them from there at start) and
:func:`site_specs` every topic of the site, the gateway's and the replication's too.

Applying is idempotent and only ever adds: missing topics are created, the configs
shorelink sets (:data:`MANAGED_CONFIGS`) are altered where they differ
(``incremental_alter_configs``, nothing else on the topic is touched), partitions are
added where the policy asks for more. Partitions are never taken away: Kafka cannot,
and a topic recreated with fewer would move keys between partitions, so one
container's history would no longer be in one partition in order. Such a topic is
reported as an error, and left as it is. :func:`plan_changes` decides, without I/O;
:func:`apply_topics` reads the cluster, asks it, and carries the plan out.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field

from confluent_kafka.admin import (
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    ResourceType,
)

from shorelink.contract import (
    CANONICAL_INDEX_TOPIC,
    DEAD_UNKNOWN_TOPIC,
    LEDGER_TOPIC,
    LINKS_TOPIC,
    MARKER_TOPIC,
    RELAY_INDEX_TOPIC,
    RELAYED_TOPIC,
    canonical_topic,
    customer_topic,
    dead_topic,
    relay_topic,
)
from shorelink.kafka.admin import Admin
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.errors import KafkaClientError
from shorelink.kafka.topics import (
    Durability,
    TopicError,
    TopicSpec,
    ensure_topics,
    gateway_cursor_spec,
    ingress_spec,
)
from shorelink.logs import get_logger
from spark_core.config import SiteConfig, SitesConfig
from spark_core.customers import Customers, Ownership

__all__ = [
    "MANAGED_CONFIGS",
    "Change",
    "TopicState",
    "apply_topics",
    "keyed_topics",
    "plan_changes",
    "read_topics",
    "relay_index_spec",
    "site_specs",
    "stream_specs",
]

log = get_logger(__name__)

#: the topic configs apply compares and sets; every other config of a topic is left
#: as the operator set it
MANAGED_CONFIGS = (
    "retention.ms",
    "segment.ms",
    "cleanup.policy",
    "max.message.bytes",
    "min.insync.replicas",
)


# -- what a site needs -----------------------------------------------------------------


def relay_entries(site: SiteConfig, cfg: SitesConfig | None) -> list[str]:
    """The entry sites of the relay topics ``site`` writes: every site of the file when
    some site pulls from ``site``, none otherwise (nobody would read them)."""
    if cfg is None or not any(site.name in s.neighbours for s in cfg.sites.values()):
        return []
    return sorted(cfg.sites)


def customer_ownership(site: SiteConfig, cfg: SitesConfig | None) -> Ownership | None:
    """The customers file as ``site``'s merge follows it (None: no customer topics
    here)."""
    if cfg is None or cfg.customers_file is None or not site.customer_topics:
        return None
    return Ownership(cfg.customers_file)


def customer_specs(
    site: SiteConfig, customers: Customers, streams: Iterable[str]
) -> list[TopicSpec]:
    """``sl.customer.<name>.<stream>`` of each customer and each of ``streams`` it
    gets: partitions and retention as the canonical topic's (every topic the merge
    may write a record of ``streams`` to, like :func:`stream_specs`)."""
    wanted = set(streams)
    specs = []
    for name, stream in sorted(customers.streams()):
        if stream in wanted:
            p = site.policy(stream)
            specs.append(
                TopicSpec(
                    customer_topic(name, stream),
                    partitions=p.partitions,
                    retention_ms=-1 if p.retention_ms is None else p.retention_ms,
                )
            )
    return specs


def stream_specs(
    site: SiteConfig, cfg: SitesConfig | None, streams: Iterable[str]
) -> list[TopicSpec]:
    """The per-stream topics the merge writes, for ``streams``: the canonical
    ``sl.<stream>`` (the policy's partitions and retention), ``sl.dead.<stream>``, and
    ``sl.relay.<entry>.<stream>`` for every site of the file as entry when some site
    pulls from this one (partitions as the canonical's, so a key keeps its partition
    number; the policy's relay retention)."""
    entries = relay_entries(site, cfg)
    specs: list[TopicSpec] = []
    for s in streams:
        p = site.policy(s)
        specs.append(
            TopicSpec(
                canonical_topic(s),
                partitions=p.partitions,
                retention_ms=-1 if p.retention_ms is None else p.retention_ms,
            )
        )
        specs.append(TopicSpec(dead_topic(s), retention_ms=site.merge.dead_retention_ms))
        specs += [
            TopicSpec(relay_topic(e, s), partitions=p.partitions, retention_ms=p.relay_retention_ms)
            for e in entries
        ]
    return specs


def relay_index_spec(site: SiteConfig) -> TopicSpec:
    """``sl.relay.index`` (spark_core/relay_index.py): one partition, kept as long as
    the longest-kept relay topic of the site's streams."""
    keep = max((site.policy(s).relay_retention_ms for s in site.streams), default=None)
    return TopicSpec(
        RELAY_INDEX_TOPIC,
        partitions=1,
        retention_ms=site.replication.relay_retention_ms if keep is None else keep,
    )


def canonical_index_spec(site: SiteConfig) -> TopicSpec:
    """``sl.canonical.index`` (spark_core/relay_index.py, read by spark_core/repair.py):
    one partition, kept as long as the longest-kept canonical topic of the site's
    streams (for ever if one is)."""
    keeps = [site.policy(s).retention_ms for s in site.streams]
    keep = -1 if not keeps or None in keeps else max(k for k in keeps if k is not None)
    return TopicSpec(CANONICAL_INDEX_TOPIC, partitions=1, retention_ms=keep)


def keyed_topics(site: SiteConfig, cfg: SitesConfig | None) -> set[str]:
    """The topics whose partition count places keys for consumers (the canonical and
    relay topics): one with more partitions than the policy asks is an error, not a
    warning (:func:`plan_changes`)."""
    entries = relay_entries(site, cfg)
    return {canonical_topic(s) for s in site.streams} | {
        relay_topic(e, s) for e in entries for s in site.streams
    }


def site_specs(cfg: SitesConfig, site: SiteConfig | str) -> list[TopicSpec]:
    """Every topic ``site`` needs: its gateway's (``sl.ingress.<stream>``,
    ``sl.gateway.cursor``), the merge's (canonical, dead, relay,
    ``sl.ledger``, ``sl.merge.marker``, ``sl.merge.relayed``, ``sl.relay.index``,
    ``sl.canonical.index``, ``sl.dead.unknown``) and the link reports
    (``sl.links``)."""
    s = cfg.site(site) if isinstance(site, str) else site
    return [
        *(ingress_spec(stream, s.policy(stream).partitions) for stream in s.streams),
        gateway_cursor_spec(),
        *stream_specs(s, cfg, s.streams),
        *([relay_index_spec(s)] if relay_entries(s, cfg) else []),
        canonical_index_spec(s),
        *_customer_specs(cfg, s),
        TopicSpec(LEDGER_TOPIC, partitions=1, compacted=True),
        TopicSpec(MARKER_TOPIC, partitions=1, compacted=True),
        TopicSpec(RELAYED_TOPIC, partitions=1, compacted=True),
        TopicSpec(DEAD_UNKNOWN_TOPIC, retention_ms=s.merge.dead_retention_ms),
        TopicSpec(LINKS_TOPIC, partitions=1, compacted=True),
    ]


def _customer_specs(cfg: SitesConfig, site: SiteConfig) -> list[TopicSpec]:
    own = customer_ownership(site, cfg)
    return customer_specs(site, own.customers, site.streams) if own is not None else []


# -- what differs ----------------------------------------------------------------------


@dataclass(frozen=True)
class TopicState:
    """An existing topic as the cluster reports it."""

    partitions: int
    replication_factor: int
    #: the :data:`MANAGED_CONFIGS` values
    configs: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Change:
    """One thing apply does (or would do, or refuses) to one topic."""

    topic: str
    #: create, config, partitions; refused (an error: nothing done); warning
    action: str
    detail: str
    #: for ``config``: the settings to SET; for ``partitions``: the new total
    configs: dict[str, str] = field(default_factory=dict)
    partitions: int = 0
    #: set when the change failed, or is refused
    error: str | None = None

    def as_json(self) -> dict[str, object]:
        d = asdict(self)
        d.pop("configs")
        d.pop("partitions")
        return d


def wanted_configs(spec: TopicSpec, min_insync: int) -> dict[str, str]:
    """The :data:`MANAGED_CONFIGS` values ``spec`` asks for (``cleanup.policy`` is
    ``delete`` unless compacted; ``retention.ms`` only when the spec has one)."""
    want = spec.topic_config(min_insync)
    want.setdefault("cleanup.policy", "delete")
    return {k: v for k, v in want.items() if k in MANAGED_CONFIGS}


def plan_changes(
    specs: Sequence[TopicSpec],
    existing: dict[str, TopicState],
    replication_factor: int,
    min_insync: int,
    strict: Collection[str] | None = None,
) -> list[Change]:
    """What to do so that the cluster's topics (``existing``) match ``specs``. A topic
    with more partitions than its spec is refused (an error) when it is in ``strict``
    (None: every topic), a warning otherwise: it works, with more partitions."""
    out: list[Change] = []
    for spec in specs:
        have = existing.get(spec.name)
        if have is None:
            what = [
                f"{spec.partitions} partition{'s' if spec.partitions > 1 else ''}",
                f"retention {_retention(spec.retention_ms)}",
            ]
            if spec.compacted:
                what.append("compacted")
            out.append(Change(spec.name, "create", ", ".join(what), partitions=spec.partitions))
            continue
        if spec.partitions > have.partitions:
            out.append(
                Change(
                    spec.name,
                    "partitions",
                    f"{have.partitions} -> {spec.partitions}",
                    partitions=spec.partitions,
                )
            )
        elif spec.partitions < have.partitions:
            why = (
                f"has {have.partitions} partitions, the policy asks for {spec.partitions}: "
                "partitions are never removed (keys would move between partitions)"
            )
            if strict is None or spec.name in strict:
                why += "; raise the policy back, or recreate the topic by hand"
                out.append(
                    Change(
                        spec.name, "refused", f"{have.partitions} -> {spec.partitions}", error=why
                    )
                )
            else:
                out.append(Change(spec.name, "warning", f"{why}; kept {have.partitions}"))
        # never more in-sync replicas than the topic has replicas: writes would fail
        want = wanted_configs(spec, min(min_insync, have.replication_factor))
        diff = {k: v for k, v in want.items() if have.configs.get(k) != v}
        if diff:
            detail = ", ".join(
                f"{k} {_show(k, have.configs.get(k))} -> {_show(k, v)}" for k, v in diff.items()
            )
            out.append(Change(spec.name, "config", detail, configs=diff))
        if have.replication_factor < replication_factor:
            out.append(
                Change(
                    spec.name,
                    "warning",
                    f"replication factor {have.replication_factor} < {replication_factor}: "
                    "apply does not move replicas (kafka-reassign-partitions does)",
                )
            )
    return out


def _retention(ms: int | None) -> str:
    if ms is None:
        return "broker default"
    if ms < 0:
        return "forever"
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def _show(name: str, value: str | None) -> str:
    if value is None:
        return "(unset)"
    if name == "retention.ms":
        try:
            return _retention(int(value))
        except ValueError:
            return value
    return value


# -- against a cluster -----------------------------------------------------------------


def _admin(kafka: KafkaEndpoint) -> Admin:
    # librdkafka's own connection errors go to this module's log, not to stderr
    return Admin(kafka, {"logger": log})


def read_topics(kafka: KafkaEndpoint, names: Iterable[str]) -> tuple[int, dict[str, TopicState]]:
    """(brokers in the cluster, the state of those of ``names`` that exist)."""
    bootstrap, timeout = kafka.bootstrap, kafka.timeout_s
    admin = _admin(kafka)
    try:
        md = admin.metadata()
    except KafkaClientError as exc:
        raise TopicError(
            f"cannot reach Kafka at {bootstrap} within {timeout:g} s: {exc}",
            code=exc.code,
            retryable=exc.retryable,
        ) from exc
    present = [n for n in names if n in md.topics]
    resources = [ConfigResource(ResourceType.TOPIC, n) for n in present]
    states: dict[str, TopicState] = {}
    if not resources:
        return len(md.brokers), states
    futures = admin.client.describe_configs(resources, request_timeout=timeout)
    for res, fut in futures.items():
        try:
            entries = admin.wait(fut, f"cannot describe topic {res.name} at {bootstrap}")
        except KafkaClientError as exc:
            raise TopicError(str(exc), code=exc.code, retryable=exc.retryable) from exc
        parts = md.topics[res.name].partitions
        rf = min((len(p.replicas) for p in parts.values()), default=0)
        configs = {k: e.value for k, e in entries.items() if k in MANAGED_CONFIGS}
        states[res.name] = TopicState(len(parts), rf, configs)
    return len(md.brokers), states


def apply_topics(
    kafka: KafkaEndpoint,
    specs: Sequence[TopicSpec],
    *,
    durability: Durability | None = None,
    dry_run: bool = False,
    strict: Collection[str] | None = None,
) -> list[Change]:
    """Bring the cluster ``kafka`` reaches (as a principal allowed to create and alter
    topics: the site's admin) to ``specs``, each step within ``kafka``'s timeout; return
    what was (with ``dry_run``: would be) changed, refused or failed, each failure in
    its change's ``error`` (``strict``: see :func:`plan_changes`). Raises
    :class:`~shorelink.kafka.topics.TopicError` when the cluster cannot be read at all."""
    timeout = kafka.timeout_s
    brokers, existing = read_topics(kafka, [s.name for s in specs])
    rf, isr = (durability or Durability()).resolve(brokers)
    changes = plan_changes(specs, existing, rf, isr, strict)
    if dry_run or not changes:
        return changes
    by_name = {s.name: s for s in specs}
    done: list[Change] = []
    creates = [c for c in changes if c.action == "create"]
    if creates:
        try:
            ensure_topics(kafka, [by_name[c.topic] for c in creates], durability)
            done += creates
        except TopicError as exc:
            done += [_failed(c, exc) for c in creates]
    admin = _admin(kafka)
    grow = [c for c in changes if c.action == "partitions"]
    if grow:
        futures = admin.client.create_partitions(
            [NewPartitions(c.topic, c.partitions) for c in grow], request_timeout=timeout
        )
        for c in grow:
            done.append(_outcome(admin, c, futures[c.topic]))
    alter = [c for c in changes if c.action == "config"]
    if alter:
        resources = [
            ConfigResource(
                ResourceType.TOPIC,
                c.topic,
                incremental_configs=[
                    ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
                    for k, v in c.configs.items()
                ],
            )
            for c in alter
        ]
        futs = {
            res.name: f
            for res, f in admin.client.incremental_alter_configs(
                resources, request_timeout=timeout
            ).items()
        }
        for c in alter:
            done.append(_outcome(admin, c, futs[c.topic]))
    done += [c for c in changes if c.action in ("refused", "warning")]
    for c in done:
        log.info("topic_changed", action=c.action, topic=c.topic, detail=c.detail, error=c.error)
    applied = {c.topic for c in done if c.error is None and c.action in _CHANGES}
    # a change that failed: its topic is not waited for. A refused change (an error
    # too, but nothing was tried) does not keep the topic's other changes from it
    failed = {c.topic for c in done if c.error is not None and c.action in _CHANGES}
    if applied:
        _settle(kafka, [by_name[t] for t in applied - failed], isr, strict)
    order = {c.topic: i for i, c in enumerate(changes)}
    return sorted(done, key=lambda c: order[c.topic])


_CHANGES = ("create", "partitions", "config")


def _settle(
    kafka: KafkaEndpoint,
    specs: Sequence[TopicSpec],
    min_insync: int,
    strict: Collection[str] | None,
) -> None:
    """Wait until the cluster shows what was applied: a broker serves metadata and
    configs a moment after the controller accepted a change, and a run that read the
    old state right after would do (or refuse) the same change again."""
    deadline = time.monotonic() + kafka.timeout_s
    while True:
        _, existing = read_topics(kafka, [s.name for s in specs])
        pending = [
            c for c in plan_changes(specs, existing, 1, min_insync, strict) if c.action in _CHANGES
        ]
        if not pending or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for c in pending:
        log.warning("topic_change_not_visible", topic=c.topic, change=c.detail)


def _outcome(admin: Admin, change: Change, fut: Future[object]) -> Change:
    try:
        admin.wait(fut)
    except KafkaClientError as exc:
        return _failed(change, exc)
    return change


def _failed(change: Change, exc: Exception) -> Change:
    return Change(
        change.topic,
        change.action,
        change.detail,
        change.configs,
        change.partitions,
        error=f"failed: {exc}",
    )
