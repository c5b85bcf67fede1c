"""Where each site's Kafka is, read from the sites file (``sites.toml``) by the kernel.

The sites file belongs to spark_core (``spark_core/config.py`` reads all of it), but the
kernel's own commands (``shorelink consume``, ``shorelink audit --all-sites``) need only
a few keys of each ``[sites.NAME]``: ``streams`` and its ``kafka`` table (the
:class:`~shorelink.kafka.endpoint.KafkaEndpoint`: ``bootstrap``, ``timeout`` and the
credentials, and the site's :class:`~shorelink.kafka.topics.Durability`). Those keys are
declared once, on :class:`SiteKafka`; spark_core's ``SiteConfig`` is a :class:`SiteKafka`
with the rest of the site's keys, so both read the same declarations with
:func:`shorelink.config.read` (the kernel may not import spark_core:
tests/test_layout.py). :func:`load_sites` ignores a site's other keys (spark_core's own
reading reports those). A customer's own file may hold only these: its sites' Kafka, its
principal and its password.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from shorelink.boundary import boundary
from shorelink.config import Secret, Section, check_name_field, key, load_toml, read
from shorelink.errors import ConfigError
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.topics import Durability

__all__ = ["SiteKafka", "fleet_login", "load_sites"]


@dataclass(frozen=True)
class SiteKafka:
    """A site as the kernel's commands see it: its name, Kafka and streams."""

    #: the site's name (its ``[sites.NAME]``)
    name: str = field(metadata=key(kind="name"))
    #: the site's Kafka and who the reader is there (``[sites.NAME.kafka]``)
    kafka: KafkaEndpoint
    #: the streams the site carries (``sl.<stream>``)
    streams: tuple[str, ...] = field(metadata=key(names="stream"))
    #: replication of the topics the site's application creates (keys of ``kafka``)
    durability: Durability = field(
        default_factory=Durability, metadata=key("kafka", parse=Durability.from_section)
    )


@boundary
def load_sites(path: str | Path) -> dict[str, SiteKafka]:
    """Every ``[sites.NAME]`` of the sites file at ``path``, in file order; raise
    :class:`~shorelink.errors.ConfigError` naming the field when one is missing or bad."""
    sites = Section(load_toml(path)).sections("sites")
    if not sites:
        raise ConfigError("sites", f"{path}: define at least one [sites.NAME]")
    base = Path(path).resolve().parent
    out: dict[str, SiteKafka] = {}
    for name, sec in sites.items():
        check_name_field(sec.path, "site", name)
        out[name] = read(SiteKafka, sec, base=base, done=False, name=name)
    return out


@boundary
def fleet_login(path: str | Path, site: str) -> tuple[str, Secret] | None:
    """Headquarters' registry loop's own principal at ``site``, if the sites file names
    one: ``[sites.SITE.access] fleet_password`` and ``fleet_username`` (default
    ``fleet-SITE``), the principal ``shorelink-spark access apply`` makes for it
    (spark_core/access.py); None: the loop logs in as ``[sites.SITE.kafka]`` says."""
    sec = Section(load_toml(path)).sections("sites").get(site)
    if sec is None or not sec.has("access"):
        return None
    access = sec.section("access")
    if not access.has("fleet_password"):
        return None
    password = access.secret("fleet_password")
    return access.text("fleet_username", f"fleet-{site}"), password
