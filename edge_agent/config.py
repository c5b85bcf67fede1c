"""The edge agent's configuration: a TOML file validated into frozen dataclasses.

The fully commented sample is ``deploy/edge/edge.toml``; every key there is read here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from edge_agent.rules import Rule
from shorelink.config import Secret, Section, load_toml
from shorelink.errors import ConfigError
from shorelink.identity import check_name

__all__ = ["EdgeConfig", "LogConfig", "MetricsConfig", "MqttConfig", "StreamConfig", "load_config"]

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
class EdgeConfig:
    ship: str
    mqtt: MqttConfig
    log: LogConfig
    metrics: MetricsConfig
    streams: dict[str, StreamConfig]
    rules: tuple[Rule, ...]
    log_level: str = "info"

    def stream(self, name: str) -> StreamConfig:
        return self.streams[name]

    def by_priority(self) -> list[StreamConfig]:
        return sorted(self.streams.values(), key=lambda s: (s.priority, s.name))


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
        max_payload_bytes=s.size("max_payload_bytes", d.max_payload_bytes),
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
    if base is not None and not log.path.is_absolute():
        log = LogConfig(**{**log.__dict__, "path": base / log.path})
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
    )
    top.done()
    return cfg


def load_config(path: str | Path) -> EdgeConfig:
    """Load and validate; relative paths in the file are relative to the file."""
    p = Path(path)
    return parse_config(load_toml(p), base=p.resolve().parent)
