"""The configuration files of a voyage, written the way an operator would write them:
one gateway config per site, one ``sites.toml`` for the four Spark applications, one
edge config per ship. Every address is a loopback port the stack chose; every ship link
and every link between sites goes through a toxiproxy proxy.

The files are kept in the voyage directory, so ``--keep`` leaves a stack that the usual
commands (``shorelink-edge status --config``, ``shorelink-spark status --config``,
``shorelink audit --all-sites --config``) explore as they are (with the secrets of
``DIR/secrets.env`` in the environment: the files name them as ``${SL_...}``).

Security is on as in production (voyage/security.py): each Kafka with SASL/SCRAM over
TLS and ACLs, each client its own principal; each gateway serves HTTPS, ships verify it
against the voyage's CA.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w

from local_stack.spark import spark_driver_conf
from voyage.security import STAFF, env_var
from voyage.topology import HQ, PORTS, SATELLITE, SITES, STREAMS, WIFI, neighbours

__all__ = [
    "REPORT_INTERVAL_S",
    "ShipEndpoints",
    "SiteEndpoints",
    "Tls",
    "edge_config",
    "gateway_config",
    "secret_ref",
    "sites_config",
    "toml_file",
]

#: how often a ship's agent looks at its own state for a report (edge_agent/report.py)
REPORT_INTERVAL_S = 10


@dataclass(frozen=True)
class SiteEndpoints:
    name: str
    kafka: str  # host:port, the site's own clients
    gateway_port: int
    via: Mapping[str, str]  # neighbour -> the neighbour's Kafka as this site reaches it
    #: the site's operations page (``shorelink ops``; 0: none)
    ops_port: int = 0
    #: the gateway's metrics listener (``[metrics]``: what the page and a scraper
    #: read; 0: none)
    gateway_metrics_port: int = 0


@dataclass(frozen=True)
class ShipEndpoints:
    name: str
    mqtt_port: int
    metrics_port: int
    links: Mapping[str, str]  # site -> host:port of the proxy to that site's gateway


@dataclass(frozen=True)
class Tls:
    """The voyage's CA, and a gateway's certificate and key."""

    ca_file: Path
    cert_file: Path | None = None
    key_file: Path | None = None


def toml_file(header: str, doc: dict[str, Any]) -> str:
    """``doc`` as TOML (every value quoted and escaped by tomli-w), after a comment."""
    return f"# {header}\n\n" + tomli_w.dumps(doc)


def secret_ref(*who: str) -> str:
    """A password as the file names it: ``${SL_...}``, expanded at load."""
    return "${" + env_var(*who) + "}"


def gateway_config(site: SiteEndpoints, fleet_pub: Path, tls: Tls) -> str:
    return toml_file(
        f"gateway of site {site.name} (written by `shorelink demo`; see "
        "deploy/gateway/gateway.toml)",
        {
            "site": site.name,
            "log_level": "info",
            # one decoding process fewer: the voyage's batches are small
            "decode_workers": 0,
            # the fleet registry's root key: the gateway follows its site's sl.registry
            # for the ships' tokens, keys and client certificates (no file copied)
            "fleet_pub_file": str(fleet_pub),
            "streams": list(STREAMS),
            "listen": {
                "host": "127.0.0.1",
                "port": site.gateway_port,
                "tls_cert_file": str(tls.cert_file),
                "tls_key_file": str(tls.key_file),
                # mutual TLS: each ship presents a certificate of the voyage's CA naming
                # it, besides its token (`fleet provision --require-client-cert`)
                "client_ca_file": str(tls.ca_file),
            },
            # Prometheus and the probes: plain HTTP on loopback, not the ships' port
            "metrics": {"host": "127.0.0.1", "port": site.gateway_metrics_port},
            "kafka": {
                "bootstrap": site.kafka,
                "ingress_partitions": 1,
                "transactional_id": f"shorelink-gateway-{site.name}",
                "username": f"gateway-{site.name}",
                "password": secret_ref("gateway", site.name),
                "ca_file": str(tls.ca_file),
            },
        },
    )


def sites_config(
    root: Path,
    sites: Mapping[str, SiteEndpoints],
    ca_file: Path,
    customers: Path,
    fleet_pub: Path,
    *,
    driver_memory: str = "2g",
) -> str:
    """All four sites in one file. Small partitions counts and one table site (HQ): four
    Spark applications share this machine's two cores."""
    return toml_file(
        "the voyage's four sites (written by `shorelink demo`; see deploy/spark/sites.toml)",
        {
            "log_level": "info",
            # who owns which container when: HQ keeps the customers' streams
            # (voyage/customers.py)
            "customers_file": str(customers),
            # the fleet registry's root key: every site carries sl.registry and takes
            # what it pulls only with the proof of the key the registry says
            "fleet_pub_file": str(fleet_pub),
            "spark": {
                "master": "local[2]",
                "driver_memory": driver_memory,
                "conf": {
                    "spark.ui.enabled": "false",
                    "spark.sql.shuffle.partitions": "1",
                    **spark_driver_conf(),
                },
            },
            "staff": [{"username": STAFF, "password": secret_ref("staff", STAFF)}],
            "sites": {name: _site(root, sites[name], ca_file) for name in SITES},
        },
    )


def _site(root: Path, s: SiteEndpoints, ca_file: Path) -> dict[str, Any]:
    name = s.name
    site: dict[str, Any] = {
        "streams": list(STREAMS),
        "neighbours": list(neighbours(name)),
        "checkpoint_dir": str(root / name / "spark" / "checkpoints"),
        "table_dir": str(root / name / "spark" / "tables"),
        "trigger_interval": "2s",
        "tables": name == HQ,
        "customer_topics": name == HQ,
        "kafka": {
            "bootstrap": s.kafka,
            "username": f"spark-{name}",
            "password": secret_ref("spark", name),
            "ca_file": str(ca_file),
        },
        "access": {
            "admin_password": secret_ref("kafka_admin"),
            "gateway_password": secret_ref("gateway", name),
            # headquarters' registry loop (`shorelink fleet run`): its own principal
            **({"fleet_password": secret_ref("fleet", name)} if name == HQ else {}),
        },
        "merge": {"canonical_partitions": 1, "max_offsets_per_trigger": 20000},
    }
    if s.ops_port:
        site["ops"] = {
            # its logins: `shorelink ops-users add` at launch (voyage/launch.py)
            "users_file": str(root / name / "ops-users"),
            # the gateway's metrics listener (its ships' port serves no /metrics)
            "gateway": f"http://127.0.0.1:{s.gateway_metrics_port}",
            "refresh": "1s",
            # the whole voyage's tracks on the map (positions are a small part of sl.nav:
            # AIS of other vessels is most of it)
            "tail": 50000,
            "listen": {"host": "127.0.0.1", "port": s.ops_port},
        }
    site["replication"] = {
        "max_offsets_per_trigger": 20000,
        "probe_interval": "1s",
        "probe_timeout": "2s",
        "report_ttl": "6s",
        "password": secret_ref("site", name),
        "via": {n: s.via[n] for n in neighbours(name)},
    }
    site["topics"] = {stream: {"partitions": 1} for stream in STREAMS}
    return site


def edge_config(
    ship: ShipEndpoints,
    root: Path,
    bundle: Path,
    tls: Tls,
    *,
    satellite_budget: int,
) -> str:
    """The ship's agent: its Mosquitto, its log, port Wi-Fi to each port's gateway and
    the satellite to HQ, the streams, the mapping rules and the overboard alarm."""
    gateways = [
        {
            "site": site,
            "url": f"https://{ship.links[site]}",
            "link": SATELLITE if site == HQ else WIFI,
            "ca_file": str(tls.ca_file),
            "client_cert_file": str(tls.cert_file),
            "client_key_file": str(tls.key_file),
        }
        for site in (*PORTS, HQ)
    ]
    return toml_file(
        f"edge agent of {ship.name} (written by `shorelink demo`; see deploy/edge/edge.toml)",
        {
            "ship": ship.name,
            "log_level": "info",
            "mqtt": {
                "host": "127.0.0.1",
                "port": ship.mqtt_port,
                "client_id": f"shorelink-edge-{ship.name}",
            },
            "log": {
                "path": str(root / "edge.db"),
                "group_commit": "5ms",
                "max_bytes": "1GB",
                "alerts_reserve_bytes": "50MB",
            },
            "metrics": {"host": "127.0.0.1", "port": ship.metrics_port},
            "uplink": {
                # what `shorelink fleet provision` made at headquarters and the ship
                # carried on board: its token, its signing key, the fleet's root key
                # (configurations from the registry are verified against it)
                "token_file": str(bundle / "gateway.token"),
                "signing_key_file": str(bundle / "ship.key"),
                "fleet_pub_file": str(bundle / "fleet.pub"),
                # a new configuration's trial: ingest connected and a gateway answered
                "fleet_health": "30s",
                "interval": "2s",
                # a new upload connection (and the gateway's configuration offer) at
                # least this often
                "refresh": "10s",
                "probe_timeout": "3s",
                "retry_min": "100ms",
                "retry_max": "3s",
                # one process per ship: the voyage's ships share two cores with four
                # data centres
                "encode_workers": 0,
                "seal_records": 0,
            },
            "links": {
                SATELLITE: {
                    "streams": ["alerts", "agent", "nav"],
                    "daily_budget_bytes": satellite_budget,
                    "batch_max_records": 200,
                    "batch_max_bytes": "32KiB",
                    "cost": 100,
                    "timeout": "30s",
                    "in_flight": 1,
                },
                WIFI: {"streams": ["*"], "cost": 1, "timeout": "30s", "in_flight": 3},
            },
            "gateways": gateways,
            "streams": {
                "alerts": {"priority": 0, "on_full": "reject"},
                "agent": {"priority": 5},
                "nav": {"priority": 10},
                "cargo": {"priority": 20},
                "containers": {"priority": 50},
            },
            # the ship's own state, for the operations page (edge_agent/report.py)
            "report": {"stream": "agent", "interval": f"{REPORT_INTERVAL_S}s", "heartbeat": "1h"},
            "rules": [
                {
                    "filter": "bigblue/+/containers/+/env",
                    "stream": "containers",
                    "key": "{4}",
                    "ts_field": "ts",
                },
                {
                    "filter": "bigblue/+/nav/position",
                    "stream": "nav",
                    "key": "position",
                    "ts_field": "ts",
                },
                {"filter": "bigblue/+/nav/ais", "stream": "nav", "key": "ais"},
                {
                    "filter": "bigblue/+/cargo/manifest",
                    "stream": "cargo",
                    "key": "manifest",
                    "ts_field": "ts",
                },
            ],
            # a container lost overboard: a shock over 10 g, then no reading of that
            # container for three hours of the readings' own time (other containers'
            # readings go on)
            "alarms": [
                {
                    "name": "overboard",
                    "filter": "bigblue/+/containers/+/env",
                    "key": "{4}",
                    "field": "shock",
                    "above": 10.0,
                    "silence": "3h",
                }
            ],
        },
    )
