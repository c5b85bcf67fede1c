"""A site's Kafka as one value: where it is, who the client is there, how long it may take.

Every shorelink client of Kafka (the gateway's writer and ledger, the site application's
merge, replication, tables and operations page, ``shorelink consume`` and ``shorelink
audit``, a customer's position store) is handed one :class:`KafkaEndpoint` and builds
its client from it: :meth:`KafkaEndpoint.client_config` for confluent-kafka
(librdkafka), :meth:`KafkaEndpoint.spark_options` for Spark's Kafka source and sink,
:meth:`KafkaEndpoint.java_config` for Kafka's own tools. The address and the credentials
travel together, so no client can be built with one and without the other: there is no
default that quietly means PLAINTEXT. A development broker on loopback says so,
``KafkaEndpoint(bootstrap, KafkaAuth())`` or :meth:`KafkaEndpoint.plaintext`.

Its keys are declared once, here, and every config that reaches a Kafka embeds it as
its ``[kafka]`` table (the gateway's, each ``[sites.NAME.kafka]`` of the sites file)::

    [kafka]
    bootstrap = "kafka-1:9093,kafka-2:9093"   # host:port, comma-separated
    timeout = 30                              # seconds the Kafka may take to answer
    username = "gateway-tokyo"                # SASL; with ca_file: TLS
    password = "${KAFKA_PASSWORD}"
    ca_file = "ca.pem"
    mechanism = "SCRAM-SHA-512"

A client that needs another principal or another address at the same cluster derives
one (:meth:`KafkaEndpoint.as_user`, :meth:`KafkaEndpoint.with_bootstrap`,
:meth:`KafkaEndpoint.with_auth`), as ``access apply`` connects as the site's admin and a
site reaches a neighbour through a tunnel as its own principal there. The anchor is
quix-streams' ``ConnectionConfig``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any

from shorelink.config import Secret, key
from shorelink.kafka.auth import KafkaAuth
from shorelink.tls import is_loopback

__all__ = ["LIBRDKAFKA_LOG", "ClientConfig", "KafkaEndpoint", "name_clients"]

#: a confluent-kafka client's settings
ClientConfig = dict[str, Any]

#: where every client's librdkafka log goes: the process's own logging (logfmt or JSON,
#: journald priorities: shorelink/logs.py), warnings and worse unless its level is
#: lowered, instead of librdkafka's raw ``%3|...|FAIL|`` lines on stderr
LIBRDKAFKA_LOG = logging.getLogger("librdkafka")
LIBRDKAFKA_LOG.setLevel(logging.WARNING)
#: the ``client.id`` of every client this process builds (:func:`name_clients`)
_client_id = ["shorelink"]


def name_clients(name: str) -> None:
    """Name every Kafka client this process builds from now on (``client.id``: brokers'
    request logs, quotas and ``kafka-consumer-groups --describe`` show it), as the
    process and its site: ``shorelink-gateway-tokyo``, ``shorelink-spark-hq``."""
    _client_id[0] = name


@dataclass(frozen=True)
class KafkaEndpoint:
    """One Kafka cluster as one client reaches it."""

    #: the brokers' addresses (``host:port``, comma-separated)
    bootstrap: str
    #: who the client is there (``username``, ``password``, ``ca_file``, ``mechanism``:
    #: keys of the same table)
    auth: KafkaAuth = field(metadata=key(kind="inline"))
    #: how long the cluster may take to answer (a metadata request, a transaction's
    #: commit); a transaction may stay open twice this
    timeout_s: float = field(default=30.0, metadata=key("timeout"))

    @classmethod
    def plaintext(cls, bootstrap: str, timeout_s: float = 30.0) -> KafkaEndpoint:
        """A cluster without authentication or TLS (a development broker on loopback)."""
        return cls(bootstrap, KafkaAuth(), timeout_s)

    def client_config(self, extra: ClientConfig | None = None) -> ClientConfig:
        """``bootstrap.servers``, the security settings, the process's ``client.id``
        (:func:`name_clients`) and its logger (:data:`LIBRDKAFKA_LOG`): the start of
        every confluent-kafka client's config; ``extra`` adds the rest."""
        return {
            "bootstrap.servers": self.bootstrap,
            "client.id": _client_id[0],
            "logger": LIBRDKAFKA_LOG,
            **self.auth.client_config(),
            **(extra or {}),
        }

    def java_config(self) -> dict[str, str]:
        """The Java client's settings (Kafka's tools, Spark's Kafka source and sink)."""
        return {"bootstrap.servers": self.bootstrap, **self.auth.java_config()}

    def spark_options(self) -> dict[str, str]:
        """:meth:`java_config` as options of Spark's Kafka source or sink (``kafka.``)."""
        return {f"kafka.{k}": v for k, v in self.java_config().items()}

    def as_user(self, username: str, password: Secret | str) -> KafkaEndpoint:
        """The same cluster (address, CA, mechanism) as another principal."""
        return replace(self, auth=self.auth.as_user(username, password))

    def with_auth(self, auth: KafkaAuth) -> KafkaEndpoint:
        """The same address with other credentials."""
        return replace(self, auth=auth)

    def with_bootstrap(self, bootstrap: str) -> KafkaEndpoint:
        """The same cluster and principal at another address (a tunnel, a relay)."""
        return replace(self, bootstrap=bootstrap)

    def with_timeout(self, timeout_s: float) -> KafkaEndpoint:
        return replace(self, timeout_s=timeout_s)

    def in_clear(self) -> str | None:
        """Why this client's traffic crosses a network in clear text (a broker beyond
        loopback without ``ca_file``), or None: every process that reaches a Kafka
        logs it at start (``event=kafka_without_tls``) and ``check-config`` prints it.
        A SASL password without TLS is the worse case (SCRAM hides the password, not
        the records, and PLAIN hides neither)."""
        if self.auth.ca_file is not None:
            return None
        hosts = [a.strip().rsplit(":", 1)[0] for a in self.bootstrap.split(",") if a.strip()]
        remote = [h for h in hosts if not is_loopback(h)]
        if not remote:
            return None
        what = "records and SASL login" if self.auth.username else "records"
        return (
            f"Kafka at {','.join(remote)} without TLS: {what} cross the network in clear "
            "text (set ca_file)"
        )
