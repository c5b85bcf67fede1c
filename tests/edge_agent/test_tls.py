"""The ship's side of TLS: the edge client verifies a port's certificate against the CA
its gateway entry names, presents the ship's certificate where the port requires mutual
TLS, and treats a handshake that fails as a link failure (logged, retried, never a
refusal of the batch and never a crash), so that a spoofed or misconfigured port gets
neither the token nor the data and the records wait on board.

Against a real gateway serving HTTPS on loopback (the gateway tests' Kafka), one for the
module, with certificates from the stack's CA (local_stack/tls.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web
from prometheus_client import generate_latest

from core_gateway.auth import Credentials
from core_gateway.config import GatewayConfig
from edge_agent.config import EdgeConfig, parse_config
from edge_agent.errors import GatewayRejected, LinkError
from edge_agent.gateway import HttpGateway
from edge_agent.metrics import EdgeMetrics
from edge_agent.uplink import Uplink
from local_stack.kafka import KafkaBroker
from local_stack.process import free_port
from local_stack.tls import Authority, make_authority
from shorelink.errors import ConfigError
from shorelink.ranges import RangeSet
from tests.core_gateway.helpers import ingress_seqs
from tests.edge_agent.uplink_helpers import fill, open_edge_log
from tests.helpers import unique
from tests.tls_helpers import start_tls_gateway, tls_gateway_config

#: the module's HTTPS gateway: its fixture and the tests that use it share a loop
ON_PORT = pytest.mark.asyncio(loop_scope="module")
STREAM = "alerts"


@dataclass
class Port:
    root: Path
    cfg: GatewayConfig
    authority: Authority
    other: Authority
    kafka: KafkaBroker
    tokens: dict[str, str]

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.cfg.port}"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def port(
    tmp_path_factory: pytest.TempPathFactory,
    kafka_sites: Callable[..., dict[str, KafkaBroker]],
) -> AsyncIterator[Port]:
    # the gateway tests' broker (tests/core_gateway/conftest.py), started on first use
    kafka = kafka_sites("gateway-tests")["gateway-tests"]
    root = tmp_path_factory.mktemp("edge-tls")
    authority = make_authority(root / "tls")
    other = make_authority(root / "other-tls", name="not the port's CA")
    cfg = tls_gateway_config(root, kafka, authority, mutual=True)
    creds = Credentials(cfg.credentials_file)
    tokens = {}
    for name in ("plain", "wrong-ca", "system", "mtls", "mtls-nocert"):
        ship = unique(name)
        tokens[name] = ship
        tokens[ship] = creds.add(ship, require_client_cert=name.startswith("mtls"))
    stop = asyncio.Event()
    task = await start_tls_gateway(cfg, authority.ca_cert, stop)
    yield Port(root, cfg, authority, other, kafka, tokens)
    stop.set()
    await task


def edge_config(
    port: Port, name: str, tmp_path: Path, *, url: str = "", **gateway: Any
) -> EdgeConfig:
    """The ship ``name`` of the port's credentials, one https gateway (``gateway``: its
    TLS keys, paths relative to the port's directory as in a config file beside them)."""
    ship = port.tokens[name]
    data: dict[str, Any] = {
        "ship": ship,
        "log": {"path": str(tmp_path / "edge.db")},
        "metrics": {"port": 0},
        "streams": {"alerts": {"priority": 0}, "nav": {}, "containers": {}},
        "rules": [{"filter": f"{ship}/+/alerts", "stream": "alerts", "key": "{2}"}],
        "uplink": {
            "token": port.tokens[ship],
            "interval": "200ms",
            "linger": "5ms",
            "probe_timeout": "2s",
            "retry_min": "10ms",
            "retry_max": "200ms",
            "encode_workers": 0,
            "seal_records": 0,
        },
        "gateways": [{"site": "tokyo", "url": url or port.url, "link": "port_wifi", **gateway}],
    }
    return parse_config(data, base=port.root)


def client(cfg: EdgeConfig) -> HttpGateway:
    g = cfg.gateways[0]
    return HttpGateway(g, cfg.links[g.link], cfg.ship, cfg.uplink.token)


async def upload(
    cfg: EdgeConfig, n: int, *, until: Callable[[], bool], within: float
) -> tuple[str, set[int]]:
    """Run the real uplink over ``n`` committed alerts until ``until()`` or ``within``
    seconds (it must still be running then); returns its metrics and the distinct times
    its link state recorded an error (one per failed attempt seen)."""
    edge_log = open_edge_log(cfg)
    fill(edge_log, STREAM, n)
    stop = asyncio.Event()
    up = Uplink(cfg, edge_log, EdgeMetrics(), asyncio.Event())
    task = asyncio.create_task(up.run(stop))
    failures: set[int] = set()
    deadline = asyncio.get_running_loop().time() + within
    while not until() and asyncio.get_running_loop().time() < deadline:
        failures |= {s.last_error_ms for s in edge_log.links.states() if s.last_error_ms}
        await asyncio.sleep(0.05)
    assert not task.done(), "the uplink ended"
    metrics = generate_latest(up.metrics.registry).decode()
    stop.set()
    await asyncio.wait_for(task, 10)
    edge_log.close()
    return metrics, failures


def written(port: Port, ship: str) -> list[int]:
    return sorted(ingress_seqs(port.kafka, ship, STREAM).elements())


@ON_PORT
async def test_a_ship_uploads_over_tls_and_its_records_are_written_once(
    port: Port, tmp_path: Path
) -> None:
    cfg = edge_config(port, "plain", tmp_path, ca_file="tls/ca.pem")
    assert cfg.gateways[0].ca_file == port.authority.ca_cert  # relative to the config file
    ship = cfg.ship
    await upload(cfg, 40, until=lambda: len(written(port, ship)) >= 40, within=30)
    assert written(port, ship) == list(range(1, 41))
    gw = client(cfg)
    try:
        assert (await gw.holdings())[STREAM] == RangeSet([(1, 40)])
    finally:
        await gw.close()


@ON_PORT
async def test_a_port_whose_certificate_does_not_verify_is_a_link_failure_retried_never_a_crash(
    port: Port, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A ship given another CA (a spoofed port, a wrong ca_file) sends nothing: the
    handshake fails before the token leaves, the failure is logged as TLS, the link is
    down and the uplink keeps trying; the records stay on board."""
    caplog.set_level(logging.INFO)
    cfg = edge_config(port, "wrong-ca", tmp_path, ca_file=str(port.other.ca_cert))
    gw = client(cfg)
    with pytest.raises(LinkError) as exc:
        await gw.holdings()
    await gw.close()
    assert not isinstance(exc.value, GatewayRejected) and exc.value.retryable
    assert "TLS handshake failed: certificate not trusted" in str(exc.value)
    caplog.clear()
    metrics, failures = await upload(cfg, 10, until=lambda: False, within=2)
    messages = [r.getMessage() for r in caplog.records]
    assert 'shorelink_edge_link_up{link="port_wifi",site="tokyo"} 0.0' in metrics
    assert any(
        "event=gateway_tls_failed" in m and "certificate verify failed" in m for m in messages
    )
    assert len(failures) >= 3, "the uplink must keep trying"
    assert not any("uplink_pass_crashed" in m or "gateway_refused" in m for m in messages)
    assert written(port, cfg.ship) == []


@ON_PORT
async def test_an_https_gateway_without_ca_file_is_verified_against_the_system_store(
    port: Port, tmp_path: Path
) -> None:
    """Without ca_file the ship trusts what the system trusts, which the stack's own CA is
    not: the port is refused, as a port with a certificate of a private CA must be."""
    cfg = edge_config(port, "system", tmp_path)
    gw = client(cfg)
    try:
        with pytest.raises(LinkError, match="certificate not trusted"):
            await gw.holdings()
    finally:
        await gw.close()


@ON_PORT
async def test_a_ship_with_its_certificate_uploads_where_mutual_tls_is_required(
    port: Port, tmp_path: Path
) -> None:
    ship = port.tokens["mtls"]
    own = port.authority.issue(ship, client=True)
    cfg = edge_config(
        port,
        "mtls",
        tmp_path,
        ca_file="tls/ca.pem",
        client_cert_file=str(own.cert),
        client_key_file=str(own.key),
    )
    await upload(cfg, 25, until=lambda: len(written(port, ship)) >= 25, within=30)
    assert written(port, ship) == list(range(1, 26))


@ON_PORT
async def test_a_ship_without_its_certificate_is_refused_where_mutual_tls_is_required(
    port: Port, tmp_path: Path
) -> None:
    """The port says why (401 client_cert_required): a refusal of the ship, which no
    retry of the same request mends, unlike a TLS failure."""
    cfg = edge_config(port, "mtls-nocert", tmp_path, ca_file="tls/ca.pem")
    gw = client(cfg)
    try:
        with pytest.raises(GatewayRejected) as exc:
            await gw.holdings()
    finally:
        await gw.close()
    assert (exc.value.status, exc.value.link_wide) == (401, True)
    assert written(port, cfg.ship) == []


async def test_https_to_a_plain_http_gateway_is_a_tls_link_failure(tmp_path: Path) -> None:
    """A ship speaking TLS to a port that does not (a wrong port, a proxy stripped of
    TLS) gets a link failure that says so."""
    authority = make_authority(tmp_path / "tls")
    http_port = free_port()
    runner = web.AppRunner(web.Application())
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", http_port).start()
    data = {
        "ship": "bigblue",
        "log": {"path": str(tmp_path / "edge.db")},
        "streams": {"alerts": {}},
        "rules": [{"filter": "bigblue/#", "stream": "alerts", "key": "k"}],
        "uplink": {"token": "t"},
        "gateways": [
            {
                "site": "tokyo",
                "url": f"https://127.0.0.1:{http_port}",
                "link": "port_wifi",
                "ca_file": str(authority.ca_cert),
            }
        ],
    }
    gw = client(parse_config(data))
    try:
        with pytest.raises(LinkError, match="TLS handshake failed"):
            await gw.holdings()
    finally:
        await gw.close()
        await runner.cleanup()


# -- configuration ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def authority(tmp_path_factory: pytest.TempPathFactory) -> Authority:
    return make_authority(tmp_path_factory.mktemp("edge-tls-config") / "tls")


def _config(authority: Authority, url: str = "https://127.0.0.1:8443", **gateway: str) -> Any:
    return {
        "ship": "bigblue",
        "log": {"path": "/tmp/never-opened.db"},
        "streams": {"alerts": {}},
        "rules": [{"filter": "bigblue/#", "stream": "alerts", "key": "k"}],
        "uplink": {"token": "t"},
        "gateways": [{"site": "tokyo", "url": url, "link": "port_wifi", **gateway}],
    }


@pytest.mark.parametrize(
    ("gateway", "url", "field", "says"),
    [
        ({"ca_file": "missing.pem"}, "", "gateways[0].ca_file", "cannot read"),
        ({"ca_file": "ca.key"}, "", "gateways[0].ca_file", "no PEM CA certificate"),
        ({"ca_file": "ca.pem"}, "http://127.0.0.1:8443", "gateways[0].ca_file", "https://"),
        ({"client_cert_file": "bigblue.pem"}, "", "gateways[0].client_cert_file", "both"),
        (
            {"client_cert_file": "bigblue.pem", "client_key_file": "other.key"},
            "",
            "gateways[0].client_key_file",
            "is not the key of",
        ),
    ],
)
def test_a_bad_tls_file_is_a_config_error_naming_the_key(
    authority: Authority, gateway: dict[str, str], url: str, field: str, says: str
) -> None:
    """A ship learns at start which file is wrong, not at every handshake at sea."""
    authority.issue("bigblue", client=True)
    authority.issue("other", client=True)
    with pytest.raises(ConfigError) as exc:
        parse_config(_config(authority, url or "https://127.0.0.1:8443", **gateway), authority.dir)
    assert exc.value.field == field and says in str(exc.value)
