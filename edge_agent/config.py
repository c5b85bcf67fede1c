"""The edge agent's configuration: a TOML file validated into frozen dataclasses.

Each key is declared once, on its field (``shorelink.config.key``: the name in the file
where it differs from the field's, bounds, choices); ``shorelink.config.read`` reads
every table from those declarations. The fully commented sample is
``deploy/edge/edge.toml``; ``tests/test_config_samples.py`` checks it names every key.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from urllib.parse import urlsplit

from edge_agent.alarms import Alarm
from edge_agent.rules import Rule
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
    resolve_secrets,
)
from shorelink.config import load_config as load_file
from shorelink.contract import MAX_RECORD_BYTES
from shorelink.errors import ConfigError
from shorelink.files import read_private
from shorelink.logs import get_logger
from shorelink.proof import ShipKey
from shorelink.tls import TlsFile, client_context, is_loopback
from shorelink.wire import DEFAULT_LIMITS
from shorelink.wire_dict import Dictionaries

log = get_logger(__name__)

__all__ = [
    "DEFAULT_LINKS",
    "EdgeConfig",
    "GatewayEndpoint",
    "LinkConfig",
    "LogConfig",
    "MetricsConfig",
    "MqttConfig",
    "ReportConfig",
    "StreamConfig",
    "UplinkConfig",
    "load_config",
    "load_dictionaries",
    "load_signing_key",
]

ON_FULL = ("drop_oldest", "reject")
NEVER_DROPPED = "alerts"


@dataclass(frozen=True)
class MqttConfig:
    host: str = "127.0.0.1"
    port: int = field(default=1883, metadata=key(min=1, max=65535))
    #: default: ``shorelink-edge-<ship>``
    client_id: str = ""
    username: str = ""
    password: Secret = field(default_factory=lambda: Secret(""))
    tls: bool = False
    ca_file: str | None = None
    keepalive_s: int = field(default=30, metadata=key(min=5, max=3600))
    session_expiry_s: int = field(default=7 * 86400, metadata=key(min=60))
    #: MQTT topic filters to subscribe; default "#" so that nothing published on the
    #: ship's broker goes unnoticed (what no rule maps is quarantined and counted).
    subscriptions: tuple[str, ...] = ("#",)
    max_payload_bytes: int = field(
        default=256 * 1024,
        metadata=key(
            kind="size",
            max=MAX_RECORD_BYTES,
            why=f"{{v}} > {MAX_RECORD_BYTES}, the record size limit of every hop "
            "(MAX_RECORD_BYTES)",
        ),
    )
    #: how many un-acknowledged messages the broker may send us at once (MQTT 5
    #: Receive Maximum); bounds the memory between receive and commit.
    receive_maximum: int = field(default=1000, metadata=key(min=1, max=65535))
    reconnect_min_s: float = field(default=0.2, metadata=key("reconnect_min"))
    reconnect_max_s: float = field(default=30.0, metadata=key("reconnect_max"))


@dataclass(frozen=True)
class StreamConfig:
    name: str = field(metadata=key(kind="name"))
    #: lower sends first (alerts 0, nav 10, bulk telemetry 50, ...)
    priority: int = field(default=50, metadata=key(min=0, max=1000))
    max_age_s: float = field(default=30 * 86400, metadata=key("max_age"))
    #: 0: bounded only by the log's total budget
    max_bytes: int = field(default=0, metadata=key(kind="size"))
    #: default for alerts: "reject" (alerts are never dropped)
    on_full: str = field(default="drop_oldest", metadata=key(choices=ON_FULL))
    #: the stream (one of ``[streams.*]``, of a lower priority number) that takes this
    #: stream's latest-value snapshot: when a link that carries it comes up and this
    #: stream's oldest unsent record is older than ``latest_after``, each key's newest
    #: unsent reading is copied there, so shore learns it before the backlog drains
    #: (edge_agent/latest.py; docs/edge-agent.md, "Newest first?"). "": no snapshots
    latest_stream: str = ""
    #: how old the backlog must be for a snapshot, and the least time between two
    latest_after_s: float = field(
        default=3600.0, metadata=key("latest_after", min=1, why="at least 1s")
    )


@dataclass(frozen=True)
class LogConfig:
    #: relative to the config file
    path: Path = Path("/var/lib/shorelink/edge.db")
    #: group commit: collect messages for up to this long (or max) per transaction
    group_commit_s: float = field(
        default=0.005,
        metadata=key("group_commit", max=1, why="at most 1s: the broker waits for our PUBACK"),
    )
    group_commit_max: int = field(default=500, metadata=key(min=1, max=100_000))
    #: total bytes of records the log may hold
    max_bytes: int = field(default=2 * 1000**3, metadata=key(kind="size"))
    #: part of max_bytes that only alerts may use
    alerts_reserve_bytes: int = field(default=50 * 1000**2, metadata=key(kind="size"))
    quarantine_max: int = field(default=1000, metadata=key(min=1))
    #: "full" (fsync every commit; survives power cuts) or "normal" (WAL-safe against
    #: process crashes only; measured faster, see docs)
    synchronous: str = field(default="full", metadata=key(choices=("full", "normal")))


@dataclass(frozen=True)
class MetricsConfig:
    host: str = "127.0.0.1"
    #: 0 disables the endpoint
    port: int = field(default=9464, metadata=key(min=0, max=65535))


@dataclass(frozen=True)
class UplinkConfig:
    #: file holding the gateway bearer token (must not be world-readable); or ``token``
    token_file: Path | None = None
    token: Secret = field(default_factory=lambda: Secret(""))
    #: the ship's private Ed25519 key (``shorelink ship-key new``; must not be
    #: world-readable): every batch sent is signed with it (docs/replication.md, "Ship
    #: signatures"). Relative to the config file; unset: batches go unsigned
    signing_key_file: Path | None = None
    #: the fleet's root public key (``fleet.pub`` of the ship's provisioning bundle):
    #: set, the agent takes the configuration the fleet registry holds for it from the
    #: gateways, checked against this key (docs/fleet-registry.md, "Configuration to
    #: the ships"). Relative to the config file; unset: edge.toml alone
    fleet_pub_file: Path | None = None
    #: after applying a fleet configuration, how long the agent waits for its health
    #: (ingest connected to MQTT, a gateway reached) before it rolls the change back
    fleet_health_s: float = field(
        default=120.0, metadata=key("fleet_health", gt=0, why="must be > 0")
    )
    #: the batch bodies' zstd dictionaries (``<stream>-<id>.zdict``, trained at
    #: headquarters by ``shorelink dict train``): batches built when sent are compressed
    #: with their stream's newest (highest id); a gateway that lacks it gets that stream
    #: without one (docs/edge-agent.md, "Dictionaries"). Read at start; relative to the
    #: config file; unset: no dictionaries
    dictionaries_dir: Path | None = None
    #: code AIS sentences as fields (shorelink/wire_ais.py, ``FLAG_AIS``) in batches
    #: that are mostly AIVDM/AIVDO; a gateway from before that refuses such a batch
    #: (``bad_version``) and gets the stream as text; false saves those refusals until
    #: every gateway the ship reaches reads it (docs/edge-agent.md, "AIS as fields")
    ais_fields: bool = True
    #: timer wake: look for a cheaper link that came up (and send what the wake missed)
    interval_s: float = field(default=10.0, metadata=key("interval", min=0.05, why="at least 50ms"))
    #: ask the current site again what it holds (replication may have brought it our
    #: records) at least this often; also after every link error
    refresh_s: float = field(default=300.0, metadata=key("refresh"))
    #: after new data is committed, wait this long for more before sending
    linger_s: float = field(default=0.1, metadata=key("linger"))
    #: ``holdings()`` probe timeout: a link that cannot answer this fast is "down"
    probe_timeout_s: float = field(
        default=5.0, metadata=key("probe_timeout", gt=0, why="must be > 0")
    )
    #: backoff between attempts while no link works (exponential with jitter, capped)
    retry_min_s: float = field(default=0.1, metadata=key("retry_min"))
    retry_max_s: float = field(default=60.0, metadata=key("retry_max"))
    #: build batches (read + encode) in a child process (1) or an agent thread (0)
    encode_workers: int = field(default=1, metadata=key(min=0, max=1))
    #: seal every this many records of a stream into an encoded segment, ahead of any
    #: link (edge_agent/sealing.py); 0: encode only when sending
    seal_records: int = field(default=50_000, metadata=key(min=0, max=DEFAULT_LIMITS.max_records))
    #: look for records to seal at least this often
    seal_interval_s: float = field(
        default=10.0, metadata=key("seal_interval", gt=0, why="must be > 0")
    )


@dataclass(frozen=True)
class ReportConfig:
    """The ship report (shorelink/ship_report.py): the agent's own state, written as a
    record of ``stream`` every ``interval``, so every site's operations page sees the
    ship's backlog at sea, its link and its spend, whichever site carried the report."""

    #: the stream the reports go to, one of ``[streams.*]`` ("": no reports)
    stream: str = ""
    #: how often the agent looks: a report is written when the ship's state changed
    #: since the last one (a stream's last seq or backlog), at most this often
    interval_s: float = field(default=600.0, metadata=key("interval", min=1, why="at least 1s"))
    #: and at least this often, changed or not (the sites know the ship is alive)
    heartbeat_s: float = field(
        default=6 * 3600.0, metadata=key("heartbeat", min=1, why="at least 1s")
    )


@dataclass(frozen=True)
class LinkConfig:
    """Policy of one link class (``satellite``, ``cellular``, ``port_wifi``, ...)."""

    name: str = field(metadata=key(kind="name"))
    #: streams this link may carry; ``("*",)``: all
    streams: tuple[str, ...] = ("*",)
    #: request body bytes per UTC day; 0: unlimited
    daily_budget_bytes: int = field(default=0, metadata=key(kind="size"))
    #: bytes per second; 0: unlimited
    max_rate: int = field(default=0, metadata=key(kind="size"))
    batch_max_records: int = field(default=5000, metadata=key(min=1, max=1_000_000))
    #: payload bytes read into a batch, and the most its encoded form may take (keep it
    #: at most the gateways' limits.max_batch_bytes, 8 MiB by default)
    batch_max_bytes: int = field(
        default=1024 * 1024, metadata=key(kind="size", min=1024, why="at least 1KiB")
    )
    #: lower is preferred when several gateways are reachable
    cost: int = field(default=10, metadata=key(min=0))
    #: per request (connect + send + Kafka commit + reply)
    timeout_s: float = field(default=30.0, metadata=key("timeout", gt=0, why="must be > 0"))
    #: batches in flight at once on the upload connection (pipelining: the next batch
    #: crosses the link while the site writes the previous one); a broken connection
    #: costs at most this many batches resent, and a batch the site received whole is
    #: not resent (it was written)
    in_flight: int = field(default=1, metadata=key(min=1, max=64))

    def carries(self, stream: str) -> bool:
        return "*" in self.streams or stream in self.streams


def _port_link(name: str, *, cost: int) -> LinkConfig:
    """A link in or near port: every stream, no budget, large pipelined batches."""
    return LinkConfig(
        name,
        batch_max_records=50_000,
        batch_max_bytes=8 * 1024 * 1024,
        cost=cost,
        timeout_s=30.0,
        in_flight=3,
    )


#: Defaults in code; ``[links.<class>]`` overrides fields of the class of that name.
DEFAULT_LINKS: dict[str, LinkConfig] = {
    "satellite": LinkConfig(
        "satellite",
        streams=("alerts", "nav"),
        daily_budget_bytes=20 * 1000**2,
        batch_max_records=200,
        batch_max_bytes=32 * 1024,
        cost=100,
        timeout_s=60.0,
        in_flight=1,
    ),
    # Port links: batches as large as a gateway takes (50,000 records, about 100 KB of
    # container telemetry), three in flight: one crosses the link while the site
    # writes another and the answer to a third comes back. With two, a 2 Mbit/s link
    # with 300 ms latency idles while the site writes (window-bound at ~80%). A batch
    # the site received whole is written even if the link breaks, so an outage costs
    # about the one batch on the wire (bench/link_drain.py).
    "cellular": _port_link("cellular", cost=20),
    "port_wifi": _port_link("port_wifi", cost=1),
}


@dataclass(frozen=True)
class GatewayEndpoint:
    """One shore gateway the ship may reach (``[[gateways]]``), and the link class it is
    reached over. (The gateway service's own settings are ``core_gateway.config``'s
    ``GatewayConfig``.)"""

    site: str = field(metadata=key(names="site"))
    url: str
    #: a link class of ``[links]``
    link: str
    #: accept a plain http:// URL to a host other than this machine (tokens and data
    #: then cross the link in clear text; warned about at every start)
    allow_plaintext: bool = False
    #: https: the CA (PEM) the gateway's certificate must be signed by (and name the
    #: URL's host); unset: the system's trust store. Relative to the config file
    ca_file: Path | None = None
    #: mutual TLS: this ship's client certificate (PEM; its common name is the ship's
    #: name) and its key, presented to the gateway besides the token
    client_cert_file: Path | None = None
    client_key_file: Path | None = None

    def ssl_context(self, where: str = "") -> ssl.SSLContext | None:
        """TLS for an https URL (None for http); a ConfigError naming the key (in the
        table ``where``) whose file is missing, unreadable or not the certificate's."""
        if not self.url.startswith("https://"):
            return None

        def tls_file(path: Path | None, name: str) -> TlsFile | None:
            return None if path is None else TlsFile(path, f"{where}.{name}" if where else name)

        return client_context(
            tls_file(self.ca_file, "ca_file"),
            tls_file(self.client_cert_file, "client_cert_file"),
            tls_file(self.client_key_file, "client_key_file"),
        )


@dataclass(frozen=True)
class EdgeConfig:
    ship: str = field(metadata=key(names="ship"))
    mqtt: MqttConfig
    log: LogConfig
    metrics: MetricsConfig
    streams: dict[str, StreamConfig]
    rules: tuple[Rule, ...]
    log_level: str = field(default="info", metadata=key(choices=LOG_LEVELS))
    uplink: UplinkConfig = field(default_factory=UplinkConfig)
    links: dict[str, LinkConfig] = field(default_factory=lambda: dict(DEFAULT_LINKS))
    #: no gateways: the agent only ingests
    gateways: tuple[GatewayEndpoint, ...] = ()
    #: alarm rules raising ``alerts`` records (edge_agent/alarms.py)
    alarms: tuple[Alarm, ...] = ()
    #: the ship report (``[report]``; edge_agent/report.py)
    report: ReportConfig = field(default_factory=ReportConfig)

    def stream(self, name: str) -> StreamConfig:
        return self.streams[name]

    def by_priority(self) -> list[StreamConfig]:
        return sorted(self.streams.values(), key=lambda s: (s.priority, s.name))


# What follows is what the keys' declarations cannot say: defaults made of other keys
# and checks across keys.


def _mqtt(s: Section, ship: str) -> MqttConfig:
    out = read(MqttConfig, s, defaults={"client_id": f"shorelink-edge-{ship}"})
    if not out.subscriptions:
        raise ConfigError(s.field("subscriptions"), "needs at least one topic filter")
    if not 0 < out.reconnect_min_s <= out.reconnect_max_s:
        raise ConfigError(s.field("reconnect_min"), "need 0 < reconnect_min <= reconnect_max")
    return out


def _stream(name: str, s: Section) -> StreamConfig:
    check_name_field(s.path, "stream", name)
    policy = "reject" if name == NEVER_DROPPED else StreamConfig(name).on_full
    out = read(StreamConfig, s, defaults={"on_full": policy}, name=name)
    if name == NEVER_DROPPED and out.on_full != "reject":
        raise ConfigError(s.field("on_full"), "alerts are never dropped: use 'reject'")
    return out


def _log(s: Section, base: Path | None) -> LogConfig:
    out = read(LogConfig, s, base=base)
    if out.alerts_reserve_bytes >= out.max_bytes:
        raise ConfigError(s.field("alerts_reserve_bytes"), "must be smaller than log.max_bytes")
    return out


def _uplink(s: Section, base: Path | None) -> UplinkConfig:
    out = read(UplinkConfig, s, base=base)
    if out.token_file is not None:
        if out.token:
            raise ConfigError(s.field("token"), "set token or token_file, not both")
        out = replace(out, token=_read_token(out.token_file, s.field("token_file")))
    if not 0 < out.retry_min_s <= out.retry_max_s:
        raise ConfigError(s.field("retry_min"), "need 0 < retry_min <= retry_max")
    load_signing_key(out.signing_key_file)  # a missing, public or broken file fails now
    load_dictionaries(out.dictionaries_dir)  # a missing directory or a bad file fails now
    return out


def load_dictionaries(path: Path | None) -> Dictionaries:
    """The dictionaries in ``path`` (``uplink.dictionaries_dir``; none without one); a
    :class:`ConfigError` naming that key and the file that is not a dictionary."""
    return Dictionaries.load(path, "uplink.dictionaries_dir")


@boundary
def load_signing_key(path: Path | None) -> ShipKey | None:
    """The ship's signing key in ``path`` (``uplink.signing_key_file``), None without
    one; a :class:`ConfigError` naming that key if the file is missing, readable by
    others, or holds no key."""
    return None if path is None else ShipKey.load(path, "uplink.signing_key_file")


def _read_token(path: Path, field_name: str) -> Secret:
    token = read_private(path, field_name).decode(errors="replace").strip()
    if not token:
        raise ConfigError(field_name, f"{path} is empty")
    return Secret(token)


def _link(name: str, s: Section, streams: Mapping[str, object]) -> LinkConfig:
    """``[links.<name>]`` overrides the defaults of the class of that name field by field."""
    check_name_field(s.path, "link", name)
    d = DEFAULT_LINKS.get(name, LinkConfig(name))
    out = read(LinkConfig, s, defaults=vars(d), name=name)
    if not out.streams:
        raise ConfigError(s.field("streams"), 'list the streams this link carries ("*": all)')
    for st in out.streams:
        if st != "*" and st not in streams:
            raise ConfigError(s.field("streams"), f"unknown stream {st!r}")
    return out


def _gateway(s: Section, links: dict[str, LinkConfig], base: Path | None) -> GatewayEndpoint:
    out = read(GatewayEndpoint, s, base=base)
    url = out.url.rstrip("/")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises on a bad port)
    except ValueError as exc:
        raise ConfigError(s.field("url"), f"not a URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(s.field("url"), f"expected http(s)://host:port, got {url!r}")
    if parts.query or parts.fragment:
        raise ConfigError(s.field("url"), "no query or fragment")
    if parts.scheme == "http" and not is_loopback(parts.hostname):
        if not out.allow_plaintext:
            raise ConfigError(
                s.field("url"),
                f"{url} is plain http: the ship's token and data would cross the link in "
                "clear text. Use https://, or set allow_plaintext = true on this gateway "
                "(only for a link that is encrypted otherwise, e.g. a VPN)",
            )
        log.warning(
            "gateway_plaintext",
            site=out.site,
            url=url,
            message="PLAIN HTTP to a remote gateway (allow_plaintext = true): the ship's token and "
            "data cross the link in clear text",
        )
    if out.link not in links:
        raise ConfigError(
            s.field("link"),
            f"unknown link class {out.link!r} (known: {', '.join(sorted(links))})",
        )
    if (out.client_cert_file is None) != (out.client_key_file is None):
        raise ConfigError(
            s.field("client_cert_file"), "set both client_cert_file and client_key_file, or neither"
        )
    if parts.scheme != "https":
        for name in ("ca_file", "client_cert_file"):
            if getattr(out, name) is not None:
                raise ConfigError(s.field(name), f"TLS settings need an https:// URL, not {url}")
    out = replace(out, url=url)
    out.ssl_context(s.path)  # the files load, the key is the certificate's: else fail now
    return out


def parse_config(data: dict[str, object], base: Path | None = None) -> EdgeConfig:
    """The agent's config, every bad key named at once (a part whose own keys are bad
    is read as a placeholder, so the parts that refer to it are still checked)."""
    top = Section(data)
    errors = Errors()
    ship = errors.attempt(lambda: read_key(EdgeConfig, "ship", top), "ship")
    read_streams = errors.attempt(lambda: top.sections("streams"), {})
    maybe = {n: errors.attempt(partial(_stream, n, s), None) for n, s in read_streams.items()}
    if not maybe:
        errors.add("streams", "configure at least one stream")
    read_rules = errors.attempt(lambda: top.array("rules"), [])
    rules = [errors.attempt(partial(Rule.from_section, r, maybe), None) for r in read_rules]
    if not read_rules:
        errors.add("rules", "configure at least one rule mapping MQTT topics to a stream")
    read_alarms = errors.attempt(lambda: top.array("alarms"), [])
    alarms = [errors.attempt(partial(Alarm.from_section, a, maybe), None) for a in read_alarms]
    names: set[str] = set()
    for i, a in enumerate(alarms):
        if a is not None and a.name in names:
            errors.add(f"alarms[{i}].name", f"alarm {a.name!r} is defined twice")
        names.add(a.name if a is not None else "")
    links: dict[str, LinkConfig] = dict(DEFAULT_LINKS)
    for name, sec in errors.attempt(lambda: top.sections("links"), {}).items():
        links[name] = errors.attempt(partial(_link, name, sec, maybe), LinkConfig(name))
    read_gateways = errors.attempt(lambda: top.array("gateways"), [])
    gateways = [errors.attempt(partial(_gateway, g, links, base), None) for g in read_gateways]
    report = errors.attempt(lambda: _report(top, maybe), None)
    for where, problem in _latest_problems(maybe):
        errors.add(where, problem)
    seen: set[tuple[str, str]] = set()
    for i, g in enumerate(gateways):
        if g is not None and (g.site, g.url) in seen:
            errors.add(f"gateways[{i}].url", f"gateway {g.url} of {g.site} listed twice")
        seen.add((g.site, g.url) if g is not None else ("", ""))
    log = errors.attempt(lambda: _log(top.section("log"), base), None)
    mqtt = errors.attempt(lambda: _mqtt(top.section("mqtt"), ship), None)
    uplink = errors.attempt(lambda: _uplink(top.section("uplink"), base), None)
    read_all = errors.attempt(
        lambda: read(
            EdgeConfig,
            top,
            base=base,
            ship=ship,
            streams={n: st for n, st in maybe.items() if st is not None},
            rules=tuple(r for r in rules if r is not None),
            alarms=tuple(a for a in alarms if a is not None),
            links=links,
            gateways=tuple(g for g in gateways if g is not None),
            report=report,
            log=log,
            mqtt=mqtt,
            uplink=uplink,
        ),
        None,
    )
    cfg = errors.result(read_all)
    resolve_secrets(cfg)  # the agent uses every secret of its file: an unset one fails now
    return cfg


def _latest_problems(streams: Mapping[str, StreamConfig | None]) -> list[tuple[str, str]]:
    """What is wrong with the streams' ``latest_stream``: it must be another configured
    stream, not the alerts', sent ahead of its source (a lower priority number), taking
    one stream's snapshots and taking none of its own."""
    out = []
    targets: dict[str, str] = {}
    for name, st in streams.items():
        if st is None or not st.latest_stream:
            continue
        where = f"streams.{name}.latest_stream"
        target = streams.get(st.latest_stream)
        if st.latest_stream not in streams:
            out.append((where, f"{st.latest_stream!r} is not a configured stream"))
        elif st.latest_stream in (name, NEVER_DROPPED):
            out.append((where, f"{st.latest_stream!r} cannot take {name!r}'s snapshots"))
        elif target is not None and target.priority >= st.priority:
            out.append((where, f"{st.latest_stream!r} must go ahead of {name!r}: a lower priority"))
        elif target is not None and target.latest_stream:
            out.append((where, f"{st.latest_stream!r} takes snapshots of its own"))
        elif st.latest_stream in targets:
            out.append(
                (where, f"{st.latest_stream!r} takes {targets[st.latest_stream]!r}'s snapshots")
            )
        targets[st.latest_stream] = name
    return out


def _report(top: Section, streams: Mapping[str, object]) -> ReportConfig:
    report = read(ReportConfig, top.section("report"))
    if report.heartbeat_s < report.interval_s:
        raise ConfigError("report.heartbeat", "must be at least report.interval")
    if report.stream and report.stream not in streams:
        raise ConfigError(
            "report.stream",
            f"{report.stream!r} is not a configured stream: add [streams.{report.stream}]",
        )
    return report


@boundary
def load_config(path: str | Path) -> EdgeConfig:
    """Load and validate; relative paths in the file are relative to the file. A file
    that holds the token itself (``uplink.token`` without ``${ENV}``) must be as private
    as a token file (review L10)."""
    cfg = load_file(path, parse_config)
    if cfg.uplink.token.in_file:
        read_private(Path(path), "uplink.token")
    return cfg
