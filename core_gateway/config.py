"""The gateway's configuration (TOML; commented sample: ``deploy/gateway/gateway.toml``).

Each key is declared once, on its field (``shorelink.config.key``: its place in the file,
``listen.port``, bounds); ``shorelink.config.read`` reads the file from those
declarations, and only the checks across keys are written here.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path

from shorelink.boundary import boundary
from shorelink.config import LOG_LEVELS, Errors, Section, key, read, read_key, resolve_secrets
from shorelink.config import load_config as load_file
from shorelink.errors import ConfigError
from shorelink.fleet.log import read_anchor
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.topics import Durability
from shorelink.proof import ShipKeys
from shorelink.tls import TlsFile, server_context
from shorelink.wire import Limits
from shorelink.wire_dict import Dictionaries

__all__ = ["GatewayConfig", "load_config", "parse_config"]


@dataclass(frozen=True)
class GatewayConfig:
    site: str = field(metadata=key(names="site"))
    #: the site's Kafka and who the gateway is there (``[kafka]``: ``bootstrap``,
    #: ``timeout``, ``username``, ``password``, ``ca_file``, ``mechanism``;
    #: docs/access-control.md)
    kafka: KafkaEndpoint = field(metadata=key("kafka"))
    streams: tuple[str, ...] = field(metadata=key(names="stream"))
    #: the ships' tokens (JSON, ``shorelink-gateway ships add``, or ``shorelink fleet
    #: export``): a site run alone; relative to the config file. With ``fleet_pub_file``,
    #: unused: the tokens come from the fleet registry
    credentials_file: Path | None = field(default=None, metadata=key(kind="path"))
    #: the fleet registry's root public key (``fleet.pub`` of ``shorelink fleet init``):
    #: the gateway follows its site's ``sl.registry`` and takes the ships' tokens and
    #: keys from the entries this key's chain signs, applied as they arrive, no restart
    #: (docs/fleet-registry.md, "How it travels"); then ``credentials_file`` and
    #: ``ship_keys_file`` are not read. Relative to the config file; unset: those files
    fleet_pub_file: Path | None = field(default=None, metadata=key(kind="path"))
    #: streams whose batches are written to Kafka before any other batch waiting (an
    #: alert does not wait behind a fleet's backlog); those not in ``streams`` are ignored
    urgent_streams: tuple[str, ...] = field(
        default=("alerts",), metadata=key("urgent", names="stream")
    )
    #: the ships' public keys (shorelink/proof.py; the same file at every site): a ship
    #: with a key must sign its batches; relative to the config file; unset: batches
    #: are taken unsigned and carry no proof
    ship_keys_file: Path | None = field(default=None, metadata=key(kind="path"))
    #: the batch bodies' zstd dictionaries (``<stream>-<id>.zdict``, trained at
    #: headquarters by ``shorelink dict train``): the gateway holds every one in the
    #: directory (a batch compressed with an older one still decodes) and refuses a
    #: batch naming one it lacks (422 ``unknown_dictionary``; the ship sends without).
    #: Read at start, and again when a batch names one it lacks (at most every 10 s:
    #: a file copied there is taken without a restart); relative to the config file;
    #: unset: none
    dictionaries_dir: Path | None = field(default=None, metadata=key(kind="path"))
    host: str = field(default="0.0.0.0", metadata=key("listen.host"))
    port: int = field(default=8443, metadata=key("listen.port", min=0, max=65535))
    #: HTTPS: the gateway's certificate (PEM, chain after it) and its key; relative to
    #: the config file. Neither: plain HTTP (loopback, or behind a TLS proxy)
    tls_cert_file: Path | None = field(default=None, metadata=key("listen.tls_cert_file"))
    tls_key_file: Path | None = field(default=None, metadata=key("listen.tls_key_file"))
    #: mutual TLS: ships are asked for a client certificate signed by this CA; a ship
    #: whose credential says ``require_client_cert`` must present one naming it
    client_ca_file: Path | None = field(default=None, metadata=key("listen.client_ca_file"))
    #: a whole request body must arrive within this (slow or endless uploads are cut)
    body_timeout_s: float = field(default=60.0, metadata=key("listen.body_timeout"))
    #: a connection is closed when it has not completed a request this long after it
    #: opened or after its last answer (aiohttp's keep-alive timeout, an hour by
    #: default: a peer that dribbles header bytes held a socket that long)
    idle_timeout_s: float = field(
        default=30.0, metadata=key("listen.idle_timeout", gt=0, why="must be > 0")
    )
    #: connections open at once, at most (each holds a file descriptor: keep the
    #: process's limit above it); one more is closed as soon as it is accepted
    max_connections: int = field(
        default=1000, metadata=key("listen.max_connections", min=1, max=1_000_000)
    )
    #: WebSocket uploads: ping this often; a peer that does not answer is dropped
    upload_heartbeat_s: float = field(
        default=20.0, metadata=key("listen.upload_heartbeat", gt=0, why="must be > 0")
    )
    #: Prometheus ``/metrics`` and the probes' ``/healthz`` and ``/readyz``, plain HTTP
    #: on a listener of their own, never the ships' port (whose clients are outside):
    #: loopback by default, like the edge agent's; 0.0.0.0 where a scraper or a
    #: kubelet's probe comes from another address (Kubernetes); port 0 turns it off
    metrics_host: str = field(default="127.0.0.1", metadata=key("metrics.host"))
    metrics_port: int = field(default=9465, metadata=key("metrics.port", min=0, max=65535))
    #: also answer ``/metrics`` on the ships' port, unauthenticated, as gateways before
    #: the metrics listener did (a bridge while scrapers move; off by default)
    metrics_on_ships_port: bool = field(default=False, metadata=key("metrics.on_ships_port"))
    limits: Limits = field(
        default_factory=Limits,
        metadata=key(
            keys={
                "max_records": key(min=1),
                "max_compressed_bytes": key("max_batch_bytes", kind="size"),
                "max_decompressed_bytes": key(kind="size"),
            }
        ),
    )
    #: memory bound: bytes of batches taken in and not yet committed (compressed size
    #: plus declared decoded size); a batch beyond it is answered 503 busy
    max_inflight_bytes: int = field(
        default=128 * 1024 * 1024, metadata=key("limits.max_inflight_bytes", kind="size")
    )
    #: open WebSocket uploads at most; more are refused (503 busy) before the upgrade
    max_uploads: int = field(default=32, metadata=key("limits.max_uploads", min=1, max=100_000))
    #: open WebSocket uploads of one ship at most (a reconnect may overlap the old
    #: connection until its heartbeat finds it dead); more are refused (503 busy)
    max_uploads_per_ship: int = field(
        default=4, metadata=key("limits.max_uploads_per_ship", min=1, max=100_000)
    )
    ingress_partitions: int = field(
        default=6, metadata=key("kafka.ingress_partitions", min=1, max=1000)
    )
    #: write each record to the ingress partition of its origin
    #: (``crc32(origin) mod partitions``, shorelink/shards.py) instead of its key's: what
    #: a site whose merge is split by origin (``[merge] shards`` in sites.toml) needs,
    #: each shard reading only its partitions (docs/data-centre.md, "Scaling out")
    ingress_by_origin: bool = field(default=False, metadata=key("kafka.ingress_by_origin"))
    #: replication of the topics the gateway creates (ingress, cursor)
    durability: Durability = field(
        default_factory=Durability, metadata=key("kafka", parse=Durability.from_section)
    )
    #: Kafka transactional.id; one gateway per site holds it (a second one fences the
    #: first); default ``shorelink-gateway-<site>``
    transactional_id: str = field(default="", metadata=key("kafka.transactional_id"))
    log_level: str = field(default="info", metadata=key(choices=LOG_LEVELS))
    #: processes decoding large batches (core_gateway/decoding.py); 0: a thread
    decode_workers: int = field(default=1, metadata=key(min=0, max=64))

    def dictionaries(self) -> Dictionaries:
        """The dictionaries in ``dictionaries_dir`` (none when unset); a ConfigError
        naming the key and the file that is not one."""
        return Dictionaries.load(self.dictionaries_dir, "dictionaries_dir")

    def ssl_context(self) -> ssl.SSLContext | None:
        """The listening socket's TLS (None: plain HTTP); a ConfigError naming the key
        whose file is missing, unreadable or not the certificate's key."""
        if self.tls_cert_file is None or self.tls_key_file is None:
            return None
        return server_context(
            TlsFile(self.tls_cert_file, "listen.tls_cert_file"),
            TlsFile(self.tls_key_file, "listen.tls_key_file"),
            None
            if self.client_ca_file is None
            else TlsFile(self.client_ca_file, "listen.client_ca_file"),
        )


def parse_config(data: dict[str, object], base: Path | None = None) -> GatewayConfig:
    top = Section(data)
    errors = Errors()  # every bad key at once
    site = errors.attempt(lambda: read_key(GatewayConfig, "site", top), "site")
    kafka = data.get("kafka")
    if isinstance(kafka, dict) and "ingress_retention" in kafka:
        kafka = {k: v for k, v in kafka.items() if k != "ingress_retention"}
        top = Section({**data, "kafka": kafka})
        errors.add(
            "kafka.ingress_retention",
            "removed: ingress is kept until the site's merge has committed past it "
            "(the merge deletes what it merged), so nothing a ship was told is held expires",
        )
    read_all = errors.attempt(
        lambda: read(
            GatewayConfig,
            top,
            base=base,
            defaults={"transactional_id": f"shorelink-gateway-{site}"},
            site=site,
        ),
        None,
    )
    cfg = errors.result(read_all)
    if bool(cfg.tls_cert_file) != bool(cfg.tls_key_file):
        raise ConfigError(
            "listen.tls_cert_file", "set both tls_cert_file and tls_key_file, or neither"
        )
    if cfg.client_ca_file is not None and cfg.tls_cert_file is None:
        raise ConfigError(
            "listen.client_ca_file", "mutual TLS needs TLS: set tls_cert_file and tls_key_file"
        )
    cfg.ssl_context()  # the files load, and the key is the certificate's: else fail now
    if cfg.fleet_pub_file is not None:
        # a missing or broken key fails now, named
        read_anchor(cfg.fleet_pub_file, "fleet_pub_file")
        if cfg.ship_keys_file is not None or cfg.credentials_file is not None:
            raise ConfigError(
                "fleet_pub_file",
                "the registry gives the tokens and keys: unset credentials_file and "
                "ship_keys_file (they are for a site run alone)",
            )
    elif cfg.credentials_file is None:
        raise ConfigError(
            "credentials_file", "set credentials_file (a site alone) or fleet_pub_file"
        )
    if cfg.ship_keys_file is not None:
        ShipKeys.load(cfg.ship_keys_file)  # a missing or broken file fails now, named
    cfg.dictionaries()  # a missing directory or a file that is no dictionary fails now
    ca = cfg.kafka.auth.ca_file
    if ca is not None and not ca.is_file():
        # librdkafka would only say "ssl.ca.location failed" at the first connection
        raise ConfigError("kafka.ca_file", f"{ca} is not a file")
    if cfg.max_inflight_bytes < cfg.limits.max_compressed_bytes:
        raise ConfigError("limits.max_inflight_bytes", "must be at least limits.max_batch_bytes")
    if cfg.metrics_port != 0 and cfg.metrics_port == cfg.port:
        raise ConfigError(
            "metrics.port",
            f"is listen.port ({cfg.port}): metrics need a port of their own, away from ships",
        )
    if not cfg.streams:
        raise ConfigError("streams", "list at least one stream")
    resolve_secrets(cfg)  # the gateway uses every secret of its file: an unset one fails now
    return cfg


@boundary
def load_config(path: str | Path) -> GatewayConfig:
    return load_file(path, parse_config)
