"""The principals of the access-control tests: one site (tokyo) on the session's
secured broker, its gateway and application, a neighbour (hq), staff and two customers,
with their passwords (docs/access-control.md)."""

from __future__ import annotations

from confluent_kafka.admin import (
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
    ScramMechanism,
    UserScramCredentialDeletion,
)

from local_stack.kafka import KafkaBroker
from shorelink.config import Secret
from shorelink.kafka.auth import KafkaAuth
from spark_core.access import apply_access, plan_access
from spark_core.config import SitesConfig, parse_config

PASSWORDS = {
    "spark-tokyo": "spark-pw",
    "gateway-tokyo": "gateway-pw",
    "site-hq": "hq-pw",
    "ops": "ops-pw",
    "customer-acme": "acme-pw",
    "customer-globex": "globex-pw",
}
CUSTOMERS = {"acme": Secret("acme-pw"), "globex": Secret("globex-pw")}
#: a consumer group each principal may use (a consumer names one even when it only
#: assigns partitions, and the broker checks it)
GROUPS = {
    "spark-tokyo": "shorelink-test",
    "gateway-tokyo": "shorelink-gateway-test",
    "site-hq": "shorelink-pull-hq",
    "ops": "ops-anything",
    "customer-acme": "acme.reader",
    "customer-globex": "globex.reader",
}


def secure_sites(broker: KafkaBroker) -> SitesConfig:
    """Site tokyo on ``broker`` (the application, the gateway, staff) and hq, which
    replicates from it."""
    assert broker.security is not None
    ca = str(broker.security.authority.ca_cert)
    return parse_config(
        {
            "staff": [{"username": "ops", "password": "ops-pw"}],
            "sites": {
                "tokyo": {
                    "streams": ["containers", "alerts"],
                    "checkpoint_dir": "c",
                    "table_dir": "t",
                    "kafka": {
                        "bootstrap": broker.bootstrap,
                        "username": "spark-tokyo",
                        "password": "spark-pw",
                        "ca_file": ca,
                    },
                    "access": {
                        "admin_username": broker.security.admin_user,
                        "admin_password": broker.security.admin_password,
                        "gateway_password": "gateway-pw",
                    },
                },
                "hq": {
                    "streams": ["containers", "alerts"],
                    "neighbours": ["tokyo"],
                    "checkpoint_dir": "c",
                    "table_dir": "t",
                    "kafka": {"bootstrap": "127.0.0.1:1", "ca_file": ca},
                    "replication": {"password": "hq-pw"},
                },
            },
        }
    )


def principal(broker: KafkaBroker, user: str) -> KafkaAuth:
    """How ``user`` (one of :data:`PASSWORDS`) connects to ``broker``."""
    return broker.admin.as_user(user, PASSWORDS[user])


def reset_access(broker: KafkaBroker) -> None:
    """Take every principal of :data:`PASSWORDS` and its ACLs off ``broker``."""
    admin = AdminClient(broker.endpoint.client_config())
    filters = [
        AclBindingFilter(
            ResourceType.ANY,
            None,  # type: ignore[arg-type]
            ResourcePatternType.ANY,
            f"User:{user}",
            None,  # type: ignore[arg-type]
            AclOperation.ANY,
            AclPermissionType.ANY,
        )
        for user in PASSWORDS
    ]
    for fut in admin.delete_acls(filters).values():
        fut.result(30)
    existing = set(admin.describe_user_scram_credentials(None).result(30))  # type: ignore[union-attr]
    gone = [
        UserScramCredentialDeletion(u, ScramMechanism.SCRAM_SHA_512)
        for u in PASSWORDS
        if u in existing
    ]
    if gone:
        for fut in admin.alter_user_scram_credentials(gone).values():  # type: ignore[arg-type]
            fut.result(30)


def apply_secure_access(broker: KafkaBroker) -> SitesConfig:
    """Give ``broker`` the principals and ACLs of :func:`secure_sites` (idempotent)."""
    sites = secure_sites(broker)
    apply_access(plan_access(sites, "tokyo", CUSTOMERS), broker.endpoint)
    return sites
