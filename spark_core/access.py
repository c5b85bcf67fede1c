"""Who may do what at a site's Kafka: principals (SCRAM users) and their ACLs.

The sites file names every principal of a site (docs/access-control.md has the table):

- the site's application (``[sites.S.kafka] username``): reads ingress,
  writes canonical, ledger, markers, dead letters, relays and customer streams;
- the site's gateway (``[sites.S.access] gateway_username``): writes its ingress topics
  and cursor, reads the ledger;
- headquarters' registry loop (``[sites.S.access] fleet_username``, ``shorelink fleet
  run``): writes ``sl.ingress.registry``, reads ``sl.registry`` and the ships' reports;
- each site that replicates from this one (its ``[sites.N.replication] username``):
  reads ``sl.relay.*`` and ``sl.links``, nothing else;
- each customer (``customer-<name>``): reads its own ``sl.customer.<name>.*`` and
  commits offsets under its own group prefix ``<name>.``;
- Big Blue's staff (``[[staff]]``): read everything.

:func:`plan_access` turns the file into users and ACL bindings; :func:`apply_access`
brings the site's Kafka to them as the site's admin, idempotently: a user whose
password already works is left alone, an ACL that exists is not created again, and an
ACL of a principal this file manages that the file no longer grants is deleted. It
returns what it changed; ``shorelink-spark access apply`` prints it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, cast

from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialAlteration,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)

from shorelink.config import Secret
from shorelink.contract import (
    CANONICAL_INDEX_TOPIC,
    GATEWAY_CURSOR_TOPIC,
    LEDGER_TOPIC,
    LINKS_TOPIC,
    MARKER_TOPIC,
    RELAYED_TOPIC,
    canonical_topic,
    ingress_topic,
)
from shorelink.fleet.entry import REGISTRY_STREAM
from shorelink.kafka.admin import Admin
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.errors import KafkaClientError
from shorelink.kafka.reading import READ_TO_END_GROUP
from shorelink.kafka.ship_reports import FLEET_REPORTS_GROUP
from shorelink.logs import get_logger
from spark_core.config import SiteConfig, SitesConfig
from spark_core.errors import SparkCoreError

__all__ = [
    "CUSTOMER_PREFIX",
    "AccessChanges",
    "AccessError",
    "AccessPlan",
    "Grant",
    "apply_access",
    "customer_group_prefix",
    "customer_principal",
    "grant_gateway",
    "plan_access",
    "pull_group",
]

log = get_logger(__name__)

#: a customer's principal is ``customer-<name>``
CUSTOMER_PREFIX = "customer-"
#: SCRAM iterations of the users this module creates (Kafka's minimum is 4096)
SCRAM_ITERATIONS = 8192

LITERAL, PREFIXED = "literal", "prefixed"
TOPIC, GROUP, TXN = "topic", "group", "transactional_id"

_READ = ("READ", "DESCRIBE")
_OWN = ("READ", "WRITE", "CREATE", "DESCRIBE", "ALTER", "ALTER_CONFIGS", "DESCRIBE_CONFIGS")


class AccessError(SparkCoreError):
    """The site's Kafka refused or failed an access change (or could not be reached)."""


def customer_principal(customer: str) -> str:
    return f"{CUSTOMER_PREFIX}{customer}"


def pull_group(site: str) -> str:
    """The consumer group ``site``'s pullers name at each of its neighbours."""
    return f"shorelink-pull-{site}"


def customer_group_prefix(customer: str) -> str:
    """The consumer groups a customer may use: ``<name>.`` and below."""
    return f"{customer}."


def customer_topic_prefix(customer: str) -> str:
    return f"sl.customer.{customer}."


#: every user ``access apply`` makes holds DESCRIBE on this topic name (no such topic
#: exists: the grant gives nothing). It is how a later apply knows a user it made when
#: the file no longer names it (a staff member who left, a neighbour taken out): that
#: user's password and every ACL of it are removed. Users made elsewhere have no marker
#: and are left alone.
MANAGED_MARKER = "sl.access.managed"


@dataclass(frozen=True, order=True)
class Grant:
    """One ALLOW ACL: ``principal`` may ``operation`` on a resource."""

    principal: str  # the SASL user (User:<principal>)
    resource: str  # topic | group | transactional_id
    name: str
    pattern: str  # literal | prefixed
    operation: str  # READ, WRITE, ...

    def _args(self) -> tuple[Any, ...]:
        return (
            _RESOURCES[self.resource],
            self.name,
            _PATTERNS[self.pattern],
            f"User:{self.principal}",
            "*",
            AclOperation[self.operation],
            AclPermissionType.ALLOW,
        )

    def binding(self) -> AclBinding:
        return AclBinding(*self._args())

    def filter(self) -> AclBindingFilter:
        """Matches exactly this ACL (for deleting it)."""
        return AclBindingFilter(*self._args())

    def __str__(self) -> str:
        star = "*" if self.pattern == PREFIXED else ""
        return f"User:{self.principal} {self.operation} {self.resource} {self.name}{star}"


_RESOURCES = {
    TOPIC: ResourceType.TOPIC,
    GROUP: ResourceType.GROUP,
    TXN: ResourceType.TRANSACTIONAL_ID,
}
_PATTERNS = {LITERAL: ResourcePatternType.LITERAL, PREFIXED: ResourcePatternType.PREFIXED}


@dataclass
class AccessPlan:
    site: str
    #: SASL user -> password
    users: dict[str, Secret] = field(default_factory=dict)
    grants: set[Grant] = field(default_factory=set)

    def allow(
        self, principal: str, resource: str, name: str, pattern: str, ops: Iterable[str]
    ) -> None:
        self.grants |= {Grant(principal, resource, name, pattern, op) for op in ops}

    def user(self, name: str, password: Secret, what: str) -> None:
        """A user of the plan, marked as one ``access apply`` manages
        (:data:`MANAGED_MARKER`)."""
        if not password:
            raise AccessError(f"{what}: no password for {name} (write it as ${{ENV}})")
        old = self.users.get(name)
        if old is not None and old != password:
            raise AccessError(f"{what}: user {name} is named twice with different passwords")
        self.users[name] = password
        self.allow(name, TOPIC, MANAGED_MARKER, LITERAL, ("DESCRIBE",))


@dataclass
class AccessChanges:
    site: str
    users_created: list[str] = field(default_factory=list)
    passwords_set: list[str] = field(default_factory=list)
    users_deleted: list[str] = field(default_factory=list)
    added: list[Grant] = field(default_factory=list)
    removed: list[Grant] = field(default_factory=list)
    unchanged: int = 0

    @property
    def changed(self) -> bool:
        return bool(
            self.users_created
            or self.passwords_set
            or self.users_deleted
            or self.added
            or self.removed
        )

    def lines(self) -> list[str]:
        return (
            [f"+ user {u}" for u in self.users_created]
            + [f"~ password {u}" for u in self.passwords_set]
            + [f"- user {u}" for u in self.users_deleted]
            + [f"+ allow {g}" for g in self.added]
            + [f"- allow {g}" for g in self.removed]
        )

    def to_json(self) -> dict[str, object]:
        return {
            "site": self.site,
            "users_created": self.users_created,
            "passwords_set": self.passwords_set,
            "users_deleted": self.users_deleted,
            "added": [str(g) for g in self.added],
            "removed": [str(g) for g in self.removed],
            "unchanged": self.unchanged,
        }


def plan_access(
    sites: SitesConfig, site: str, customers: Mapping[str, Secret] | None = None
) -> AccessPlan:
    """The users and ACLs ``site``'s Kafka should have. ``customers``: customer name ->
    password of its principal."""
    s = sites.site(site)
    plan = AccessPlan(site)
    _application(plan, s)
    _gateway(plan, s)
    _fleet_loop(plan, s)
    for other in sites.sites.values():
        if site in other.neighbours and other.replication.username:
            _neighbour(plan, s, other)
    for name, password in sorted((customers or {}).items()):
        who = customer_principal(name)
        plan.user(who, password, f"customers.{name}")
        plan.allow(who, TOPIC, customer_topic_prefix(name), PREFIXED, _READ)
        plan.allow(who, GROUP, customer_group_prefix(name), PREFIXED, ("READ", "DESCRIBE"))
    if s.ops.kafka_username:
        # the operations page: reads, never writes (its group: the follower's name)
        who = s.ops.kafka_username
        plan.user(who, s.ops.kafka_password, f"sites.{site}.ops.kafka")
        plan.allow(who, TOPIC, "sl.", PREFIXED, (*_READ, "DESCRIBE_CONFIGS"))
        plan.allow(who, GROUP, f"shorelink-ops-{site}", LITERAL, ("READ", "DESCRIBE"))
    for i, p in enumerate(sites.staff):
        plan.user(p.username, p.password, f"staff[{i}]")
        plan.allow(p.username, TOPIC, "*", LITERAL, (*_READ, "DESCRIBE_CONFIGS"))
        plan.allow(p.username, GROUP, "*", LITERAL, ("READ", "DESCRIBE"))
    return plan


def _application(plan: AccessPlan, s: SiteConfig) -> None:
    who = s.kafka.auth.username
    if not who:
        return
    plan.user(who, s.kafka.auth.password, f"sites.{s.name}.kafka")
    # what it reads and purges: the gateway's ingress
    plan.allow(who, TOPIC, "sl.ingress.", PREFIXED, (*_READ, "DELETE", "DESCRIBE_CONFIGS"))
    # what it alone writes
    own = [LEDGER_TOPIC, MARKER_TOPIC, RELAYED_TOPIC, CANONICAL_INDEX_TOPIC]
    for topic in [canonical_topic(st) for st in s.streams] + own:
        plan.allow(who, TOPIC, topic, LITERAL, _OWN)
    plan.allow(who, TOPIC, LINKS_TOPIC, LITERAL, _OWN)
    for prefix in ("sl.dead.", "sl.relay.", "sl.customer."):
        plan.allow(who, TOPIC, prefix, PREFIXED, _OWN)
    # the merges' transactions (the urgent merge's id is the site's plus a suffix)
    plan.allow(who, TXN, s.merge.transactional_id, PREFIXED, ("WRITE", "DESCRIBE"))
    # Spark's Kafka source and the application's own readers name their groups so
    for prefix in ("spark-kafka-source-", "shorelink-"):
        plan.allow(who, GROUP, prefix, PREFIXED, ("READ", "DESCRIBE"))


def _gateway(plan: AccessPlan, s: SiteConfig) -> None:
    a = s.access
    if a.gateway_username:
        grant_gateway(
            plan,
            a.gateway_username,
            a.gateway_password,
            a.gateway_transactional_id,
            f"sites.{s.name}.access",
        )


def grant_gateway(
    plan: AccessPlan, who: str, password: Secret, transactional_id: str, what: str = "gateway"
) -> None:
    """A site's gateway: its ingress topics and cursor, the ledger and the fleet
    registry to read, its transactional id."""
    plan.user(who, password, what)
    plan.allow(who, TOPIC, "sl.ingress.", PREFIXED, ("WRITE", "CREATE", *_READ))
    plan.allow(who, TOPIC, GATEWAY_CURSOR_TOPIC, LITERAL, ("WRITE", "CREATE", *_READ))
    plan.allow(who, TOPIC, LEDGER_TOPIC, LITERAL, _READ)
    plan.allow(who, TXN, transactional_id, LITERAL, ("WRITE", "DESCRIBE"))
    plan.allow(who, GROUP, "shorelink-gateway-", PREFIXED, ("READ", "DESCRIBE"))
    # the fleet registry it follows for its ships (fleet_pub_file; shorelink/kafka/
    # registry.py RegistryFeed): read only, the site's merge writes it
    plan.allow(who, TOPIC, canonical_topic(REGISTRY_STREAM), LITERAL, _READ)
    plan.allow(who, GROUP, "shorelink-registry-", PREFIXED, ("READ", "DESCRIBE"))


def _fleet_loop(plan: AccessPlan, s: SiteConfig) -> None:
    """Headquarters' registry loop (shorelink/kafka/fleet_run.py): the entries into the
    site's registry ingress (the merge alone writes ``sl.registry``: a loop that could
    would skip the merge's check of the fleet's proof), what ``sl.registry`` holds
    already (``held_version``), the ships' newest reports (the report stream's canonical
    topic, ``[sites.S.ops] report_stream``); no other topic, no transaction."""
    a = s.access
    if not a.fleet_username:
        return
    who = a.fleet_username
    plan.user(who, a.fleet_password, f"sites.{s.name}.access")
    plan.allow(who, TOPIC, ingress_topic(REGISTRY_STREAM), LITERAL, ("WRITE", "CREATE", *_READ))
    plan.allow(who, TOPIC, canonical_topic(REGISTRY_STREAM), LITERAL, _READ)
    plan.allow(who, TOPIC, canonical_topic(s.ops.report_stream), LITERAL, _READ)
    # the groups its readers name (shorelink/kafka/reading.py read_to_end: never joined)
    for group in (FLEET_REPORTS_GROUP, READ_TO_END_GROUP):
        plan.allow(who, GROUP, group, LITERAL, ("READ", "DESCRIBE"))


def _neighbour(plan: AccessPlan, site: SiteConfig, other: SiteConfig) -> None:
    who = other.replication.username
    plan.user(who, other.replication.password, f"sites.{other.name}.replication")
    plan.allow(who, TOPIC, "sl.relay.", PREFIXED, _READ)
    # history: what a relay topic no longer has, for a site that lost its data or
    # was away longer than the relay retention (spark_core/pull.py)
    for stream in site.streams:
        plan.allow(who, TOPIC, canonical_topic(stream), LITERAL, _READ)
    plan.allow(who, TOPIC, LINKS_TOPIC, LITERAL, _READ)
    # repair by identity (spark_core/repair.py): what this site holds, and where in
    # its canonical topics each seq lies
    plan.allow(who, TOPIC, LEDGER_TOPIC, LITERAL, _READ)
    plan.allow(who, TOPIC, CANONICAL_INDEX_TOPIC, LITERAL, _READ)
    plan.allow(who, GROUP, f"shorelink-links-{other.name}", LITERAL, ("READ", "DESCRIBE"))
    # the pullers' consumers name a group (librdkafka looks its coordinator up even
    # for assigned partitions); it never joins it nor commits there
    plan.allow(who, GROUP, pull_group(other.name), LITERAL, ("READ", "DESCRIBE"))


def apply_access(plan: AccessPlan, admin: KafkaEndpoint, *, dry_run: bool = False) -> AccessChanges:
    """Bring the Kafka ``admin`` reaches to ``plan``, as ``admin``'s principal (a super
    user), each step within its timeout."""
    changes = AccessChanges(plan.site)
    try:
        client = Admin(admin)
        existing = _existing_grants(client)
        marked = {g.principal for g in existing if g.name == MANAGED_MARKER}
        _users(client, plan, admin, marked - set(plan.users), changes, dry_run)
        _acls(client, plan, existing, marked, changes, dry_run)
    except KafkaClientError as exc:
        raise AccessError(
            f"access at {admin.bootstrap} (as {admin.auth.username}): {exc}",
            retryable=exc.retryable,
        ) from exc
    for line in changes.lines():
        log.info("access_planned" if dry_run else "access_changed", site=plan.site, change=line)
    return changes


def _users(
    client: Admin,
    plan: AccessPlan,
    admin: KafkaEndpoint,
    gone: set[str],
    changes: AccessChanges,
    dry_run: bool,
) -> None:
    """Create or reset the plan's users; delete ``gone`` (made by an earlier apply,
    no longer in the plan)."""
    described = cast(Future, client.client.describe_user_scram_credentials(None))
    existing = set(client.wait(described, "describing users"))
    changes.users_deleted = sorted(gone & existing)
    upserts: list[UserScramCredentialAlteration] = [
        UserScramCredentialDeletion(user, ScramMechanism.SCRAM_SHA_512)
        for user in changes.users_deleted
    ]
    for user, password in sorted(plan.users.items()):
        if user in existing:
            if _password_works(admin.as_user(user, password)):
                continue
            changes.passwords_set.append(user)
        else:
            changes.users_created.append(user)
        upserts.append(
            UserScramCredentialUpsertion(
                user,
                ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, SCRAM_ITERATIONS),
                password.value.encode(),
            )
        )
    if upserts and not dry_run:
        for user, fut in client.client.alter_user_scram_credentials(upserts).items():
            client.wait(fut, f"setting the password of {user}")


def _password_works(kafka: KafkaEndpoint) -> bool:
    timeout = kafka.timeout_s
    try:
        Admin(kafka, {"socket.timeout.ms": int(timeout * 1000)}).metadata(timeout=min(timeout, 5.0))
    except KafkaClientError:
        return False
    return True


def _existing_grants(client: Admin) -> set[Grant]:
    """The ALLOW grants on the Kafka this module could have made."""
    # None: any name, principal, host (the stubs say str; the client takes None)
    anything = AclBindingFilter(
        ResourceType.ANY,
        cast(str, None),
        ResourcePatternType.ANY,
        cast(str, None),
        cast(str, None),
        AclOperation.ANY,
        AclPermissionType.ANY,
    )
    existing: set[Grant] = set()
    for b in client.wait(client.client.describe_acls(anything), "describing ACLs"):
        grant = _grant_of(b)
        if grant is not None:
            existing.add(grant)
    return existing


def _acls(
    client: Admin,
    plan: AccessPlan,
    existing: set[Grant],
    marked: set[str],
    changes: AccessChanges,
    dry_run: bool,
) -> None:
    managed = (
        set(plan.users)
        | marked
        | {g.principal for g in existing if g.principal.startswith(CUSTOMER_PREFIX)}
    )
    changes.added = sorted(plan.grants - existing)
    changes.removed = sorted(g for g in existing - plan.grants if g.principal in managed)
    changes.unchanged = len(plan.grants & existing)
    if dry_run:
        return
    if changes.added:
        for binding, fut in client.client.create_acls([g.binding() for g in changes.added]).items():
            client.wait(fut, f"creating ACL {binding}")
    if changes.removed:
        for filt, fut in client.client.delete_acls([g.filter() for g in changes.removed]).items():
            client.wait(fut, f"deleting ACLs {filt}")


def _grant_of(b: AclBinding) -> Grant | None:
    """The :class:`Grant` an existing ALLOW binding of a user on a resource this module
    manages stands for; None for anything else (left alone)."""
    kinds = {v: k for k, v in _RESOURCES.items()}
    patterns = {v: k for k, v in _PATTERNS.items()}
    if (
        b.permission_type != AclPermissionType.ALLOW
        or b.restype not in kinds
        or b.resource_pattern_type not in patterns
        or not b.principal.startswith("User:")
        or b.host != "*"
    ):
        return None
    return Grant(
        b.principal.removeprefix("User:"),
        kinds[b.restype],
        b.name,
        patterns[b.resource_pattern_type],
        AclOperation(b.operation).name,
    )
