"""The edge agent's configuration: a TOML file validated into frozen dataclasses.

The fully commented sample is ``deploy/edge/edge.toml``; every key there is read here.
"""

from __future__ import annotations

import ipaddress
import logging
import stat
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import urlsplit

from edge_agent.rules import Rule
from shorelink.config import Secret, Section, load_toml
from shorelink.contract import MAX_RECORD_BYTES
from shorelink.errors import ConfigError
from shorelink.identity import check_name
from shorelink.wire import DEFAULT_LIMITS

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_LINKS",
    "EdgeConfig",
    "GatewayConfig",
    "LinkConfig",
    "LogConfig",
    "MetricsConfig",
    "MqttConfig",
    "StreamConfig",
    "UplinkConfig",
    "load_config",
]

ON_FULL = ("drop_oldest", "reject")
NEVER_DROPPED = "alerts"


@dataclass(frozen=True)
class MqttConfig:
    host: str = "127.0.0.1"
    port: int = 1883
    client_id: str = ""
    username: str = ""
    password: Secret = field(default_factory=lambda: Secret(""))
    tls: bool = False
    ca_file: str | None = None
    keepalive_s: int = 30
    session_expiry_s: int = 7 * 86400
    #: MQTT topic filters to subscribe; default "#" so that nothing published on the
    #: ship's broker goes unnoticed (what no rule maps is quarantined and counted).
    subscriptions: tuple[str, ...] = ("#",)
    max_payload_bytes: int = 256 * 1024
    #: how many un-acknowledged messages the broker may send us at once (MQTT 5
    #: Receive Maximum); bounds the memory between receive and commit.
    receive_maximum: int = 1000
    reconnect_min_s: float = 0.2
    reconnect_max_s: float = 30.0


@dataclass(frozen=True)
class StreamConfig:
    name: str
    #: lower sends first (alerts 0, nav 10, bulk telemetry 50, ...)
    priority: int = 50
    max_age_s: float = 30 * 86400
    max_bytes: int = 0  # 0: bounded only by the log's total budget
    on_full: str = "drop_oldest"


@dataclass(frozen=True)
class LogConfig:
    path: Path = Path("/var/lib/shorelink/edge.db")
    #: group commit: collect messages for up to this long (or max) per transaction
    group_commit_s: float = 0.005
    group_commit_max: int = 500
    #: total bytes of records the log may hold
    max_bytes: int = 2 * 1000**3
    #: part of max_bytes that only alerts may use
    alerts_reserve_bytes: int = 50 * 1000**2
    quarantine_max: int = 1000
    #: "full" (fsync every commit; survives power cuts) or "normal" (WAL-safe against
    #: process crashes only; measured faster, see docs)
    synchronous: str = "full"


@dataclass(frozen=True)
class MetricsConfig:
    host: str = "127.0.0.1"
    port: int = 9464  # 0 disables the endpoint


@dataclass(frozen=True)
class UplinkConfig:
    #: file holding the gateway bearer token (must not be world-readable); or ``token``
    token_file: Path | None = None
    token: Secret = field(default_factory=lambda: Secret(""))
    #: timer wake: look for a cheaper link that came up (and send what the wake missed)
    interval_s: float = 10.0
    #: ask the current site again what it holds (replication may have brought it our
    #: records) at least this often; also after every link error
    refresh_s: float = 300.0
    #: after new data is committed, wait this long for more before sending
    linger_s: float = 0.1
    #: ``holdings()`` probe timeout: a link that cannot answer this fast is "down"
    probe_timeout_s: float = 5.0
    #: backoff between attempts while no link works (exponential with jitter, capped)
    retry_min_s: float = 0.1
    retry_max_s: float = 60.0
    #: build batches (read + encode) in a child process (1) or an agent thread (0)
    encode_workers: int = 1
    #: seal every this many records of a stream into an encoded segment, ahead of any
    #: link (edge_agent/sealing.py); 0: encode only when sending
    seal_records: int = 50_000
    #: look for records to seal at least this often
    seal_interval_s: float = 10.0


@dataclass(frozen=True)
class LinkConfig:
    """Policy of one link class (``satellite``, ``cellular``, ``port_wifi``, ...)."""

    name: str
    #: streams this link may carry; ``("*",)``: all
    streams: tuple[str, ...] = ("*",)
    #: request body bytes per UTC day; 0: unlimited
    daily_budget_bytes: int = 0
    #: bytes per second; 0: unlimited
    max_rate: int = 0
    batch_max_records: int = 5000
    #: payload bytes read into a batch, and the most its encoded form may take (keep it
    #: at most the gateways' limits.max_batch_bytes, 8 MiB by default)
    batch_max_bytes: int = 1024 * 1024
    #: lower is preferred when several gateways are reachable
    cost: int = 10
    #: per request (connect + send + Kafka commit + reply)
    timeout_s: float = 30.0
    #: batches in flight at once on the upload connection (pipelining: the next batch
    #: crosses the link while the site writes the previous one); a broken connection
    #: costs at most this many batches resent, and a batch the site received whole is
    #: not resent (it was written)
    in_flight: int = 1

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
class GatewayConfig:
    """One shore gateway the ship may reach, and the link class it is reached over."""

    site: str
    url: str
    link: str
    #: accept a plain http:// URL to a host other than this machine (tokens and data
    #: then cross the link in clear text; warned about at every start)
    allow_plaintext: bool = False


@dataclass(frozen=True)
class EdgeConfig:
    ship: str
    mqtt: MqttConfig
    log: LogConfig
    metrics: MetricsConfig
    streams: dict[str, StreamConfig]
    rules: tuple[Rule, ...]
    log_level: str = "info"
    uplink: UplinkConfig = field(default_factory=UplinkConfig)
    links: dict[str, LinkConfig] = field(default_factory=lambda: dict(DEFAULT_LINKS))
    #: no gateways: the agent only ingests
    gateways: tuple[GatewayConfig, ...] = ()

    def stream(self, name: str) -> StreamConfig:
        return self.streams[name]

    def by_priority(self) -> list[StreamConfig]:
        return sorted(self.streams.values(), key=lambda s: (s.priority, s.name))


def _max_payload(s: Section, default: int) -> int:
    n = s.size("max_payload_bytes", default)
    if n > MAX_RECORD_BYTES:
        raise ConfigError(
            s.field("max_payload_bytes"),
            f"{n} > {MAX_RECORD_BYTES}, the record size limit of every hop (MAX_RECORD_BYTES)",
        )
    return n


def _mqtt(s: Section, ship: str) -> MqttConfig:
    d = MqttConfig()
    out = MqttConfig(
        host=s.text("host", d.host),
        port=s.integer("port", d.port, min=1, max=65535),
        client_id=s.text("client_id", f"shorelink-edge-{ship}"),
        username=s.text("username", ""),
        password=s.secret("password"),
        tls=s.flag("tls", d.tls),
        ca_file=s.opt_str("ca_file"),
        keepalive_s=s.integer("keepalive_s", d.keepalive_s, min=5, max=3600),
        session_expiry_s=s.integer("session_expiry_s", d.session_expiry_s, min=60),
        subscriptions=tuple(s.strings("subscriptions", list(d.subscriptions))),
        max_payload_bytes=_max_payload(s, d.max_payload_bytes),
        receive_maximum=s.integer("receive_maximum", d.receive_maximum, min=1, max=65535),
        reconnect_min_s=s.duration("reconnect_min", d.reconnect_min_s),
        reconnect_max_s=s.duration("reconnect_max", d.reconnect_max_s),
    )
    s.done()
    if not out.subscriptions:
        raise ConfigError(s.field("subscriptions"), "needs at least one topic filter")
    return out


def _stream(name: str, s: Section) -> StreamConfig:
    check_name_field(s.path, "stream", name)
    d = StreamConfig(name)
    default_policy = "reject" if name == NEVER_DROPPED else d.on_full
    out = StreamConfig(
        name=name,
        priority=s.integer("priority", d.priority, min=0, max=1000),
        max_age_s=s.duration("max_age", d.max_age_s),
        max_bytes=s.size("max_bytes", d.max_bytes),
        on_full=s.choice("on_full", ON_FULL, default_policy),
    )
    s.done()
    if name == NEVER_DROPPED and out.on_full != "reject":
        raise ConfigError(s.field("on_full"), "alerts are never dropped: use 'reject'")
    return out


def check_name_field(field_name: str, kind: str, value: str) -> None:
    try:
        check_name(kind, value)
    except Exception as exc:
        raise ConfigError(field_name, str(exc)) from None


def _log(s: Section) -> LogConfig:
    d = LogConfig()
    out = LogConfig(
        path=Path(s.text("path", str(d.path))),
        group_commit_s=s.duration("group_commit", d.group_commit_s),
        group_commit_max=s.integer("group_commit_max", d.group_commit_max, min=1, max=100_000),
        max_bytes=s.size("max_bytes", d.max_bytes),
        alerts_reserve_bytes=s.size("alerts_reserve_bytes", d.alerts_reserve_bytes),
        quarantine_max=s.integer("quarantine_max", d.quarantine_max, min=1),
        synchronous=s.choice("synchronous", ("full", "normal"), d.synchronous),
    )
    s.done()
    if out.alerts_reserve_bytes >= out.max_bytes:
        raise ConfigError(s.field("alerts_reserve_bytes"), "must be smaller than log.max_bytes")
    if out.group_commit_s > 1:
        raise ConfigError(s.field("group_commit"), "at most 1s: the broker waits for our PUBACK")
    return out


def _uplink(s: Section, base: Path | None) -> UplinkConfig:
    d = UplinkConfig()
    token_file = s.opt_str("token_file")
    token = s.secret("token")
    out = UplinkConfig(
        token_file=None if token_file is None else _relative(Path(token_file), base),
        token=token,
        interval_s=s.duration("interval", d.interval_s),
        refresh_s=s.duration("refresh", d.refresh_s),
        linger_s=s.duration("linger", d.linger_s),
        probe_timeout_s=s.duration("probe_timeout", d.probe_timeout_s),
        retry_min_s=s.duration("retry_min", d.retry_min_s),
        retry_max_s=s.duration("retry_max", d.retry_max_s),
        encode_workers=s.integer("encode_workers", d.encode_workers, min=0, max=1),
        seal_records=s.integer(
            "seal_records", d.seal_records, min=0, max=DEFAULT_LIMITS.max_records
        ),
        seal_interval_s=s.duration("seal_interval", d.seal_interval_s),
    )
    s.done()
    if out.token_file is not None:
        if out.token:
            raise ConfigError(s.field("token"), "set token or token_file, not both")
        out = replace(out, token=_read_token(out.token_file, s.field("token_file")))
    if out.interval_s < 0.05:
        raise ConfigError(s.field("interval"), "at least 50ms")
    if out.seal_interval_s <= 0:
        raise ConfigError(s.field("seal_interval"), "must be > 0")
    if out.probe_timeout_s <= 0:
        raise ConfigError(s.field("probe_timeout"), "must be > 0")
    if not 0 < out.retry_min_s <= out.retry_max_s:
        raise ConfigError(s.field("retry_min"), "need 0 < retry_min <= retry_max")
    return out


def _read_token(path: Path, field_name: str) -> Secret:
    try:
        mode = path.stat().st_mode
        if mode & stat.S_IROTH:
            raise ConfigError(
                field_name,
                f"{path} is world-readable (mode {stat.S_IMODE(mode):o}): chmod o-r it first",
            )
        token = path.read_text().strip()
    except OSError as exc:
        raise ConfigError(field_name, f"cannot read {path}: {exc.strerror or exc}") from None
    if not token:
        raise ConfigError(field_name, f"{path} is empty")
    return Secret(token)


def _link(name: str, s: Section, streams: dict[str, StreamConfig]) -> LinkConfig:
    check_name_field(s.path, "link", name)
    d = DEFAULT_LINKS.get(name, LinkConfig(name))
    out = LinkConfig(
        name=name,
        streams=tuple(s.strings("streams", list(d.streams))),
        daily_budget_bytes=s.size("daily_budget_bytes", d.daily_budget_bytes),
        max_rate=s.size("max_rate", d.max_rate),
        batch_max_records=s.integer("batch_max_records", d.batch_max_records, min=1, max=1_000_000),
        batch_max_bytes=s.size("batch_max_bytes", d.batch_max_bytes),
        cost=s.integer("cost", d.cost, min=0),
        timeout_s=s.duration("timeout", d.timeout_s),
        in_flight=s.integer("in_flight", d.in_flight, min=1, max=64),
    )
    s.done()
    if not out.streams:
        raise ConfigError(s.field("streams"), 'list the streams this link carries ("*": all)')
    for st in out.streams:
        if st != "*" and st not in streams:
            raise ConfigError(s.field("streams"), f"unknown stream {st!r}")
    if out.batch_max_bytes < 1024:
        raise ConfigError(s.field("batch_max_bytes"), "at least 1KiB")
    if out.timeout_s <= 0:
        raise ConfigError(s.field("timeout"), "must be > 0")
    return out


def _gateway(s: Section, links: dict[str, LinkConfig]) -> GatewayConfig:
    site = s.text("site")
    check_name_field(s.field("site"), "site", site)
    url = s.text("url").rstrip("/")
    link = s.text("link")
    allow_plaintext = s.flag("allow_plaintext", False)
    s.done()
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises on a bad port)
    except ValueError as exc:
        raise ConfigError(s.field("url"), f"not a URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(s.field("url"), f"expected http(s)://host:port, got {url!r}")
    if parts.query or parts.fragment:
        raise ConfigError(s.field("url"), "no query or fragment")
    if parts.scheme == "http" and not _loopback(parts.hostname):
        if not allow_plaintext:
            raise ConfigError(
                s.field("url"),
                f"{url} is plain http: the ship's token and data would cross the link in "
                "clear text. Use https://, or set allow_plaintext = true on this gateway "
                "(only for a link that is encrypted otherwise, e.g. a VPN)",
            )
        log.warning(
            "event=gateway_plaintext site=%s url=%s message=%r",
            site,
            url,
            "PLAIN HTTP to a remote gateway (allow_plaintext = true): the ship's token and "
            "data cross the link in clear text",
        )
    if link not in links:
        raise ConfigError(
            s.field("link"), f"unknown link class {link!r} (known: {', '.join(sorted(links))})"
        )
    return GatewayConfig(site=site, url=url, link=link, allow_plaintext=allow_plaintext)


def _loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or localhost: the link never leaves this machine."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _relative(p: Path, base: Path | None) -> Path:
    return base / p if base is not None and not p.is_absolute() else p


def parse_config(data: dict[str, object], base: Path | None = None) -> EdgeConfig:
    top = Section(data)
    ship = top.text("ship")
    check_name_field("ship", "ship", ship)
    streams = {name: _stream(name, sec) for name, sec in top.sections("streams").items()}
    if not streams:
        raise ConfigError("streams", "configure at least one stream")
    rules = tuple(Rule.from_section(r, streams) for r in top.array("rules"))
    if not rules:
        raise ConfigError("rules", "configure at least one rule mapping MQTT topics to a stream")
    log = _log(top.section("log"))
    log = replace(log, path=_relative(log.path, base))
    links = dict(DEFAULT_LINKS)
    for name, sec in top.sections("links").items():
        links[name] = _link(name, sec, streams)
    gateways = tuple(_gateway(g, links) for g in top.array("gateways"))
    seen: set[tuple[str, str]] = set()
    for i, g in enumerate(gateways):
        if (g.site, g.url) in seen:
            raise ConfigError(f"gateways[{i}].url", f"gateway {g.url} of {g.site} listed twice")
        seen.add((g.site, g.url))
    metrics_s = top.section("metrics")
    metrics = MetricsConfig(
        metrics_s.text("host", MetricsConfig.host),
        metrics_s.integer("port", MetricsConfig.port, min=0, max=65535),
    )
    metrics_s.done()
    cfg = EdgeConfig(
        ship=ship,
        mqtt=_mqtt(top.section("mqtt"), ship),
        log=log,
        metrics=metrics,
        streams=streams,
        rules=rules,
        log_level=top.choice("log_level", ("debug", "info", "warning", "error"), "info"),
        uplink=_uplink(top.section("uplink"), base),
        links=links,
        gateways=gateways,
    )
    top.done()
    return cfg


def load_config(path: str | Path) -> EdgeConfig:
    """Load and validate; relative paths in the file are relative to the file."""
    p = Path(path)
    return parse_config(load_toml(p), base=p.resolve().parent)
