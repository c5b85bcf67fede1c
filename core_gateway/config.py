"""The gateway's configuration (TOML; commented sample: ``deploy/gateway/gateway.toml``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from shorelink.config import Section, load_toml
from shorelink.errors import ConfigError
from shorelink.identity import check_name
from shorelink.topics import Durability
from shorelink.wire import Limits

__all__ = ["GatewayConfig", "load_config", "parse_config"]


@dataclass(frozen=True)
class GatewayConfig:
    site: str
    kafka_bootstrap: str
    credentials_file: Path
    streams: tuple[str, ...]
    host: str = "0.0.0.0"
    port: int = 8443
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    #: a whole request body must arrive within this (slow or endless uploads are cut)
    body_timeout_s: float = 60.0
    #: WebSocket uploads: ping this often; a peer that does not answer is dropped
    upload_heartbeat_s: float = 20.0
    limits: Limits = field(default_factory=Limits)
    #: memory bound: bytes of batches taken in and not yet committed (compressed size
    #: plus declared decoded size); a batch beyond it is answered 503 busy
    max_inflight_bytes: int = 128 * 1024 * 1024
    #: open WebSocket uploads at most; more are refused (503 busy) before the upgrade
    max_uploads: int = 32
    ingress_partitions: int = 6
    #: replication of the topics the gateway creates (ingress, cursor)
    durability: Durability = field(default_factory=Durability)
    #: Kafka transactional.id; one gateway per site holds it (a second one fences the first)
    transactional_id: str = ""
    kafka_timeout_s: float = 30.0
    log_level: str = "info"
    #: processes decoding large batches (core_gateway/decoding.py); 0: a thread
    decode_workers: int = 1


def _name(field: str, kind: str, value: str) -> str:
    try:
        return check_name(kind, value)
    except Exception as exc:
        raise ConfigError(field, str(exc)) from None


def parse_config(data: dict[str, object], base: Path | None = None) -> GatewayConfig:
    top = Section(data)
    site = _name("site", "site", top.text("site"))
    d = GatewayConfig(site, "", Path(), ())
    listen = top.section("listen")
    host = listen.text("host", d.host)
    port = listen.integer("port", d.port, min=0, max=65535)
    cert = listen.opt_str("tls_cert_file")
    key = listen.opt_str("tls_key_file")
    body_timeout = listen.duration("body_timeout", d.body_timeout_s)
    heartbeat = listen.duration("upload_heartbeat", d.upload_heartbeat_s)
    if heartbeat <= 0:
        raise ConfigError("listen.upload_heartbeat", "must be > 0")
    listen.done()
    if bool(cert) != bool(key):
        raise ConfigError(
            "listen.tls_cert_file", "set both tls_cert_file and tls_key_file, or neither"
        )
    kafka = top.section("kafka")
    bootstrap = kafka.text("bootstrap")
    partitions = kafka.integer("ingress_partitions", d.ingress_partitions, min=1, max=1000)
    if kafka.has("ingress_retention"):
        raise ConfigError(
            kafka.field("ingress_retention"),
            "removed: ingress is kept until the site's merge has committed past it "
            "(the merge deletes what it merged), so nothing a ship was told is held expires",
        )
    durability = Durability.from_section(kafka)
    txid = kafka.text("transactional_id", f"shorelink-gateway-{site}")
    ktimeout = kafka.duration("timeout", d.kafka_timeout_s)
    kafka.done()
    lim = top.section("limits")
    dl = Limits()
    limits = Limits(
        max_records=lim.integer("max_records", dl.max_records, min=1),
        max_compressed_bytes=lim.size("max_batch_bytes", dl.max_compressed_bytes),
        max_decompressed_bytes=lim.size("max_decompressed_bytes", dl.max_decompressed_bytes),
    )
    inflight = lim.size("max_inflight_bytes", d.max_inflight_bytes)
    if inflight < limits.max_compressed_bytes:
        raise ConfigError("limits.max_inflight_bytes", "must be at least limits.max_batch_bytes")
    max_uploads = lim.integer("max_uploads", d.max_uploads, min=1, max=100_000)
    lim.done()
    streams = tuple(_name("streams", "stream", s) for s in top.strings("streams"))
    if not streams:
        raise ConfigError("streams", "list at least one stream")
    creds = Path(top.text("credentials_file"))

    def rel(p: Path) -> Path:
        return p if p.is_absolute() or base is None else base / p

    cfg = GatewayConfig(
        site=site,
        kafka_bootstrap=bootstrap,
        credentials_file=rel(creds),
        streams=streams,
        host=host,
        port=port,
        tls_cert_file=rel(Path(cert)) if cert else None,
        tls_key_file=rel(Path(key)) if key else None,
        body_timeout_s=body_timeout,
        upload_heartbeat_s=heartbeat,
        limits=limits,
        max_inflight_bytes=inflight,
        max_uploads=max_uploads,
        ingress_partitions=partitions,
        durability=durability,
        transactional_id=txid,
        kafka_timeout_s=ktimeout,
        log_level=top.choice("log_level", ("debug", "info", "warning", "error"), "info"),
        decode_workers=top.integer("decode_workers", d.decode_workers, min=0, max=64),
    )
    top.done()
    return cfg


def load_config(path: str | Path) -> GatewayConfig:
    p = Path(path)
    return parse_config(load_toml(p), base=p.resolve().parent)
