"""A gateway serving HTTPS on loopback (certificates from ``local_stack/tls.py``, the
stack's CA), for the TLS tests of the gateway and of the edge client."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

from core_gateway.config import GatewayConfig, parse_config
from local_stack.kafka import KafkaBroker
from local_stack.process import free_port
from local_stack.tls import Authority
from shorelink.tls import TlsFile, client_context
from tests.core_gateway.helpers import STREAMS, start_gateway
from tests.helpers import unique


def tls_gateway_config(
    root: Path, kafka: KafkaBroker, authority: Authority, *, mutual: bool
) -> GatewayConfig:
    """A gateway on 127.0.0.1 with the CA's server certificate; with ``mutual``, ships'
    client certificates are asked for and verified against the same CA. Paths are
    relative to ``root`` (as an operator writes them, relative to the config file)."""
    server = authority.issue("gateway")
    listen: dict[str, object] = {
        "host": "127.0.0.1",
        "port": free_port(),
        "body_timeout": "2s",
        "tls_cert_file": str(server.cert.relative_to(root)),
        "tls_key_file": str(server.key.relative_to(root)),
    }
    if mutual:
        listen["client_ca_file"] = str(authority.ca_cert.relative_to(root))
    data: dict[str, object] = {
        "site": "tokyo",
        "credentials_file": "ships.json",
        "streams": list(STREAMS),
        "listen": listen,
        "metrics": {"port": free_port()},
        "kafka": {
            "bootstrap": kafka.bootstrap,
            "transactional_id": unique("gw-tls"),
            "ingress_partitions": 2,
            "timeout": "20s",
        },
        "decode_workers": 0,
    }
    return parse_config(data, base=root)


def trusting(ca: Path) -> ssl.SSLContext:
    """A client context that trusts only ``ca``."""
    return client_context(TlsFile(ca, "ca"))


async def start_tls_gateway(
    cfg: GatewayConfig, ca: Path, stop: asyncio.Event
) -> asyncio.Task[None]:
    """Serve ``cfg`` until ``stop``; returns once ``/readyz`` answers 200 over HTTPS."""
    return await start_gateway(cfg, stop, ca)
    raise AssertionError("the TLS gateway did not become ready")
