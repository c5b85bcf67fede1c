"""How a client proves who it is to a site's Kafka: SASL/SCRAM over TLS, or nothing.

A :class:`KafkaAuth` is the credentials half of a
:class:`~shorelink.kafka.endpoint.KafkaEndpoint` (its keys sit in the same ``[kafka]``
table as ``bootstrap``); clients are built from the endpoint, never from an address
alone. :meth:`KafkaAuth.client_config` gives confluent-kafka's (librdkafka) security
settings, :meth:`KafkaAuth.java_config` the Java client's (Spark's Kafka source and
sink, Kafka's tools).

- ``ca_file`` set: TLS, the broker's certificate verified against that CA (and its
  name against the address dialled);
- ``username`` set: SASL with ``mechanism`` (SCRAM-SHA-512 by default), the password
  a secret (``${ENV}`` in the file, never printed);
- neither: PLAINTEXT, as a development broker on loopback.

docs/access-control.md says which principal each client is and what it may do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError

from shorelink.config import Secret, key
from shorelink.kafka.errors import KafkaAuthError

__all__ = [
    "MECHANISMS",
    "AuthWatch",
    "KafkaAuth",
    "KafkaAuthError",
]

MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256")


@dataclass(frozen=True)
class KafkaAuth:
    #: the SASL user (the Kafka principal ``User:<username>``); "" for no SASL
    username: str = ""
    #: its password (write ``${ENV}``: a secret, never printed)
    password: Secret = field(default=Secret(""), metadata=key(kind="secret"))
    #: CA certificate (PEM) the brokers' certificates are verified against; set: TLS
    ca_file: Path | None = field(default=None, metadata=key(kind="path"))
    #: the SASL mechanism
    mechanism: str = field(default="SCRAM-SHA-512", metadata=key(choices=MECHANISMS))

    @property
    def protocol(self) -> str:
        """Kafka's ``security.protocol`` for this client."""
        sasl, tls = bool(self.username), self.ca_file is not None
        return {
            (False, False): "PLAINTEXT",
            (False, True): "SSL",
            (True, False): "SASL_PLAINTEXT",
            (True, True): "SASL_SSL",
        }[(sasl, tls)]

    def as_user(self, username: str, password: Secret | str) -> KafkaAuth:
        """The same cluster (CA, mechanism) as another principal."""
        pw = password if isinstance(password, Secret) else Secret(password)
        return KafkaAuth(username, pw, self.ca_file, self.mechanism)

    def client_config(self) -> dict[str, str]:
        """confluent-kafka (librdkafka) settings: add to any client's config."""
        out = {"security.protocol": self.protocol}
        if self.username:
            out |= {
                "sasl.mechanism": self.mechanism,
                "sasl.username": self.username,
                "sasl.password": self.password.value,
            }
        if self.ca_file is not None:
            out["ssl.ca.location"] = str(self.ca_file)
        return out

    def java_config(self) -> dict[str, str]:
        """The Java client's settings (Spark's Kafka source and sink, Kafka's tools)."""
        out = {"security.protocol": self.protocol}
        if self.username:
            out |= {
                "sasl.mechanism": self.mechanism,
                "sasl.jaas.config": (
                    "org.apache.kafka.common.security.scram.ScramLoginModule required "
                    f'username="{_jaas_quote(self.username)}" '
                    f'password="{_jaas_quote(self.password.value)}";'
                ),
            }
        if self.ca_file is not None:
            out |= {"ssl.truststore.type": "PEM", "ssl.truststore.location": str(self.ca_file)}
        return out

    def __repr__(self) -> str:
        return (
            f"KafkaAuth(protocol={self.protocol}, username={self.username!r}, "
            f"ca_file={self.ca_file})"
        )


class AuthWatch:
    """A client's ``error_cb`` that keeps the authentication failures librdkafka
    reports (a refused login surfaces elsewhere only as a transport failure)."""

    def __init__(self) -> None:
        self.errors: list[KafkaError] = []

    def __call__(self, err: KafkaError) -> None:
        if err.code() in (KafkaError._AUTHENTICATION, KafkaError._SSL):
            self.errors.append(err)

    def check(self, client: Any, what: str) -> None:
        """Raise :class:`KafkaAuthError` if ``client`` (served its callbacks here) was
        refused."""
        client.poll(0.5)
        if self.errors:
            err = self.errors[-1]
            raise KafkaAuthError(f"{what}: {err.str()}", code=err.code())


def _jaas_quote(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')
