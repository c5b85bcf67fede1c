"""Where each site's Kafka is, read from the sites file (``sites.toml``) by the kernel.

The sites file belongs to spark_core (``spark_core/config.py`` validates all of it), but
the kernel's own commands (``shorelink consume``, ``shorelink audit --all-sites``) need
only a few keys of each ``[sites.NAME]``: ``streams`` and, of its ``kafka`` table,
``bootstrap`` and the credentials (``username``, ``password``, ``ca_file``,
``mechanism``: :class:`~shorelink.kafka.auth.KafkaAuth`). The kernel may not import
spark_core (tests/test_layout.py), so this module reads just those, with the same
``${ENV}`` expansion and errors that name the field, and ignores every other key
(spark_core's own check reports those). A customer's own file may hold only these: its
sites' Kafka, its principal and its password.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from shorelink.config import Section, check_name_field, expand_env, load_toml, read
from shorelink.errors import ConfigError
from shorelink.kafka.auth import KafkaAuth

__all__ = ["SiteKafka", "load_sites"]

_AUTH_KEYS = ("username", "password", "ca_file", "mechanism")


@dataclass(frozen=True)
class SiteKafka:
    """A site as the kernel's commands see it: its name, Kafka and streams."""

    name: str
    bootstrap: str
    streams: tuple[str, ...]
    #: who the kernel's commands are at the site's Kafka
    auth: KafkaAuth = field(default_factory=KafkaAuth)


def load_sites(path: str | Path) -> dict[str, SiteKafka]:
    """Every ``[sites.NAME]`` of the sites file at ``path``, in file order; raise
    :class:`~shorelink.errors.ConfigError` naming the field when one is missing or bad."""
    data = load_toml(path)
    base = Path(path).resolve().parent
    sites = data.get("sites")
    if not isinstance(sites, dict) or not sites:
        raise ConfigError("sites", f"{path}: define at least one [sites.NAME]")
    out: dict[str, SiteKafka] = {}
    for name, table in sites.items():
        where = f"sites.{name}"
        check_name_field(where, "site", name)
        if not isinstance(table, dict):
            raise ConfigError(where, "expected a table")
        kafka = table.get("kafka")
        bootstrap = kafka.get("bootstrap") if isinstance(kafka, dict) else None
        if not isinstance(bootstrap, str) or not bootstrap.strip():
            raise ConfigError(f"{where}.kafka.bootstrap", "is required (host:port)")
        streams = table.get("streams")
        if not isinstance(streams, list) or not all(isinstance(s, str) for s in streams):
            raise ConfigError(f"{where}.streams", "expected a list of stream names")
        for s in streams:
            check_name_field(f"{where}.streams", "stream", s)
        creds = {k: v for k, v in kafka.items() if k in _AUTH_KEYS} if kafka else {}
        auth = read(KafkaAuth, Section(creds, f"{where}.kafka"), base=base)
        out[name] = SiteKafka(
            name, expand_env(bootstrap, f"{where}.kafka.bootstrap").strip(), tuple(streams), auth
        )
    return out
