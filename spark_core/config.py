"""The sites file (TOML; commented sample: ``deploy/spark/sites.toml``).

One file describes every site of the deployment, so a site's neighbours are named, not
repeated; ``--site NAME`` picks the one this Spark application runs for.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from shorelink.config import Section, load_toml
from shorelink.errors import ConfigError
from shorelink.identity import check_name
from shorelink.topics import Durability

__all__ = ["MergeConfig", "SiteConfig", "SitesConfig", "SparkConfig", "load_config", "parse_config"]

#: every ingress topic now, every inbox topic once replication lands
DEFAULT_SOURCE_PATTERN = r"sl\.ingress\..*|sl\.inbox\..*"


@dataclass(frozen=True)
class MergeConfig:
    #: Kafka transactional.id of the merge; one merge per site holds it (default
    #: ``shorelink-merge-<site>``); a second merge with the same id fences the first
    transactional_id: str = ""
    #: Java regex of the topics the merge reads (Spark ``subscribePattern``)
    source_pattern: str = DEFAULT_SOURCE_PATTERN
    #: partitions of each canonical topic ``sl.<stream>`` when the merge creates it
    canonical_partitions: int = 6
    #: retention of canonical topics (``None``: keep forever)
    canonical_retention_ms: int | None = None
    dead_retention_ms: int = 30 * 86400 * 1000
    #: upper bound of one micro-batch (the batch is collected on the driver)
    max_offsets_per_trigger: int = 100_000
    #: fail the query when ingress records vanished before the merge read them
    fail_on_data_loss: bool = True
    #: delete from ``sl.ingress.*``/``sl.inbox.*`` what the merge committed past
    #: (spark_core/purge.py); off only if something else must read those topics later
    purge_sources: bool = True


@dataclass(frozen=True)
class SparkConfig:
    master: str = "local[*]"
    driver_memory: str = "2g"
    #: extra ``--conf key=value`` pairs for spark-submit
    conf: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class SiteConfig:
    name: str
    kafka_bootstrap: str
    streams: tuple[str, ...]
    checkpoint_dir: Path
    table_dir: Path
    neighbours: tuple[str, ...] = ()
    trigger_interval_s: float = 2.0
    kafka_timeout_s: float = 30.0
    #: replication of the topics the site's application creates
    durability: Durability = field(default_factory=Durability)
    tables: bool = False
    merge: MergeConfig = field(default_factory=MergeConfig)

    def query_checkpoint(self, query: str) -> Path:
        return self.checkpoint_dir / query


@dataclass(frozen=True)
class SitesConfig:
    sites: dict[str, SiteConfig]
    spark: SparkConfig = field(default_factory=SparkConfig)
    log_level: str = "info"

    def site(self, name: str) -> SiteConfig:
        try:
            return self.sites[name]
        except KeyError:
            raise ConfigError(
                "sites", f"no site {name!r} (known: {', '.join(sorted(self.sites))})"
            ) from None


def _name(field: str, kind: str, value: str) -> str:
    try:
        return check_name(kind, value)
    except Exception as exc:
        raise ConfigError(field, str(exc)) from None


def _rel(p: str, base: Path | None) -> Path:
    path = Path(p)
    return path if path.is_absolute() or base is None else base / path


def _merge(sec: Section, site: str) -> MergeConfig:
    d = MergeConfig()
    retention = sec.opt_str("canonical_retention")
    cfg = MergeConfig(
        transactional_id=sec.text("transactional_id", f"shorelink-merge-{site}"),
        source_pattern=sec.text("source_pattern", d.source_pattern),
        canonical_partitions=sec.integer(
            "canonical_partitions", d.canonical_partitions, min=1, max=1000
        ),
        canonical_retention_ms=(
            None
            if retention in (None, "forever")
            else int(sec.duration("canonical_retention") * 1000)
        ),
        dead_retention_ms=int(sec.duration("dead_retention", d.dead_retention_ms / 1000) * 1000),
        max_offsets_per_trigger=sec.integer(
            "max_offsets_per_trigger", d.max_offsets_per_trigger, min=1
        ),
        fail_on_data_loss=sec.flag("fail_on_data_loss", d.fail_on_data_loss),
        purge_sources=sec.flag("purge_sources", d.purge_sources),
    )
    sec.done()
    return cfg


def _site(name: str, sec: Section, base: Path | None) -> SiteConfig:
    _name(sec.path, "site", name)
    kafka = sec.section("kafka")
    bootstrap = kafka.text("bootstrap")
    ktimeout = kafka.duration("timeout", 30)
    durability = Durability.from_section(kafka)
    kafka.done()
    streams = tuple(_name(sec.field("streams"), "stream", s) for s in sec.strings("streams"))
    if not streams:
        raise ConfigError(sec.field("streams"), "list at least one stream")
    neighbours = tuple(
        _name(sec.field("neighbours"), "site", s) for s in sec.strings("neighbours", [])
    )
    if name in neighbours:
        raise ConfigError(sec.field("neighbours"), f"a site is not its own neighbour ({name})")
    cfg = SiteConfig(
        name=name,
        kafka_bootstrap=bootstrap,
        streams=streams,
        checkpoint_dir=_rel(sec.text("checkpoint_dir"), base),
        table_dir=_rel(sec.text("table_dir"), base),
        neighbours=neighbours,
        trigger_interval_s=sec.duration("trigger_interval", 2.0),
        kafka_timeout_s=ktimeout,
        durability=durability,
        tables=sec.flag("tables", False),
        merge=_merge(sec.section("merge"), name),
    )
    sec.done()
    return cfg


def _spark(sec: Section, raw: object) -> SparkConfig:
    d = SparkConfig()
    conf_sec = sec.section("conf")
    keys = sorted(raw.get("conf", {})) if isinstance(raw, dict) else []
    conf = tuple((k, conf_sec.text(k)) for k in keys)
    cfg = SparkConfig(
        master=sec.text("master", d.master),
        driver_memory=sec.text("driver_memory", d.driver_memory),
        conf=conf,
    )
    conf_sec.done()
    sec.done()
    return cfg


def parse_config(data: dict[str, object], base: Path | None = None) -> SitesConfig:
    top = Section(data)
    sites = {name: _site(name, sec, base) for name, sec in top.sections("sites").items()}
    if not sites:
        raise ConfigError("sites", "define at least one [sites.NAME]")
    for s in sites.values():
        for n in s.neighbours:
            if n not in sites:
                raise ConfigError(f"sites.{s.name}.neighbours", f"{n!r} is not a site of this file")
    cfg = SitesConfig(
        sites=sites,
        spark=_spark(top.section("spark"), data.get("spark")),
        log_level=top.choice("log_level", ("debug", "info", "warning", "error"), "info"),
    )
    top.done()
    return cfg


def load_config(path: str | Path) -> SitesConfig:
    p = Path(path)
    return parse_config(load_toml(p), base=p.resolve().parent)
