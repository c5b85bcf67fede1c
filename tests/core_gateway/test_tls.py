"""TLS at the gateway. Ships' bearer tokens and data cross ports' networks: the gateway
serves HTTPS with its certificate, and a ship whose credential requires it must also
prove who it is with a client certificate naming it (mutual TLS). A gateway serving
plain HTTP beyond this machine must say so loudly at every start.

The HTTPS gateway here is real (core_gateway served on loopback, the gateway tests'
Kafka), with certificates from the stack's CA (local_stack/tls.py); one gateway serves
the module, each ship of its own (cursors outlive a test)."""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio
from click.testing import CliRunner

from core_gateway.auth import Credentials
from core_gateway.cli import main as gateway_cli
from core_gateway.cli import serve
from core_gateway.config import GatewayConfig, parse_config
from core_gateway.errors import GatewayError
from local_stack.kafka import KafkaBroker
from local_stack.process import free_port
from local_stack.tls import Authority, Issued, make_authority
from shorelink.config import load_toml
from shorelink.errors import ConfigError
from shorelink.tls import TlsFile, client_context
from tests.core_gateway.helpers import (
    SAMPLE,
    SHIP_KEYS_SAMPLE,
    batch,
    gateway_config,
    ingress_seqs,
    metrics_url,
    sample_config,
)
from tests.helpers import unique, write_toml
from tests.tls_helpers import start_tls_gateway, tls_gateway_config, trusting

#: one HTTPS gateway for the module: its fixture and the tests that use it share a loop
ON_PORT = pytest.mark.asyncio(loop_scope="module")

#: the tests' batches go to this stream (a small topic to read back)
STREAM = "alerts"


async def _serve_briefly(cfg: GatewayConfig) -> None:
    started, stop = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(serve(cfg, install_signals=False, started=started, stop=stop))
    await asyncio.wait_for(started.wait(), 30)
    stop.set()
    await task


def _plaintext_warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if "event=plaintext_listen" in r.getMessage() and r.levelno == logging.WARNING
    ]


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
async def test_plain_http_beyond_loopback_is_warned_about_at_start(
    host: str, tmp_path: Path, kafka: KafkaBroker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="core_gateway.cli")
    await _serve_briefly(replace(gateway_config(tmp_path, kafka), host=host, decode_workers=0))
    warned = _plaintext_warnings(caplog)
    assert len(warned) == 1 and "WITHOUT TLS" in warned[0].getMessage()


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost"])
async def test_plain_http_on_loopback_is_not_warned_about(
    host: str, tmp_path: Path, kafka: KafkaBroker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="core_gateway.cli")
    await _serve_briefly(replace(gateway_config(tmp_path, kafka), host=host, decode_workers=0))
    assert _plaintext_warnings(caplog) == []


# -- the HTTPS gateway ----------------------------------------------------------------------
@dataclass
class Port:
    """The module's HTTPS gateway (mutual TLS available) and its ships."""

    cfg: GatewayConfig
    authority: Authority
    #: another CA: what the gateway must not trust, and what its clients must not
    other: Authority
    tokens: dict[str, str]
    #: token only: uploads over TLS without a client certificate
    plain: str
    #: token only, never written: the refused attempts
    refused: str
    #: client certificate required: written with its own certificate
    mtls: str
    #: client certificate required, never written: the refused attempts
    mtls_refused: str

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.cfg.port}"

    def client(self, cert: Issued | None = None, *, ca: Path | None = None) -> ssl.SSLContext:
        """A ship's context: trusts ``ca`` (default: the gateway's CA), presents ``cert``."""
        return client_context(
            TlsFile(ca or self.authority.ca_cert, "ca"),
            None if cert is None else TlsFile(cert.cert, "cert"),
            None if cert is None else TlsFile(cert.key, "key"),
        )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def port(tmp_path_factory: pytest.TempPathFactory, kafka: KafkaBroker) -> AsyncIterator[Port]:
    root = tmp_path_factory.mktemp("tls-gateway")
    authority = make_authority(root / "tls")
    other = make_authority(root / "other-tls", name="not the port's CA")
    cfg = tls_gateway_config(root, kafka, authority, mutual=True)
    creds = Credentials(cfg.credentials_file)
    ships = {name: unique(name) for name in ("plain", "refused", "mtls", "mtls-refused")}
    tokens = {
        ship: creds.add(ship, require_client_cert=name.startswith("mtls"))
        for name, ship in ships.items()
    }
    stop = asyncio.Event()
    task = await start_tls_gateway(cfg, authority.ca_cert, stop)
    yield Port(
        cfg,
        authority,
        other,
        tokens,
        ships["plain"],
        ships["refused"],
        ships["mtls"],
        ships["mtls-refused"],
    )
    stop.set()
    await task


async def _post(
    port: Port, ship: str, lo: int, hi: int, ctx: ssl.SSLContext | bool, token: str = ""
) -> tuple[int, dict[str, object]]:
    """POST a batch of ``ship``'s seqs lo..hi: (status, JSON body)."""
    url = f"{port.url}/v1/ships/{ship}/streams/{STREAM}/batches"
    headers = {
        "Authorization": f"Bearer {token or port.tokens[ship]}",
        "Content-Type": "application/x-shorelink-batch",
    }
    body = batch(ship, lo, hi, STREAM)
    async with (
        aiohttp.ClientSession() as s,
        s.post(url, data=body, headers=headers, ssl=ctx) as r,
    ):
        return r.status, await r.json()


def _written(kafka: KafkaBroker, ship: str) -> list[int]:
    """Seqs of ``ship`` in sl.ingress.alerts, with repeats."""
    return sorted(ingress_seqs(kafka, ship, STREAM).elements())


@ON_PORT
async def test_a_ship_uploads_over_tls_and_its_records_are_written_once(
    port: Port, kafka: KafkaBroker
) -> None:
    """The port's certificate verifies against its CA, and the batch is taken as over
    plain HTTP: written once, a resent batch writes nothing."""
    status, body = await _post(port, port.plain, 1, 30, port.client())
    assert (status, body["held"], body["written"]) == (200, "1-30", "1-30")
    status, body = await _post(port, port.plain, 1, 30, port.client())
    assert (status, body["written"]) == (200, "")
    assert _written(kafka, port.plain) == list(range(1, 31))


@ON_PORT
async def test_a_ship_that_does_not_trust_the_ports_certificate_is_refused_at_the_handshake(
    port: Port, kafka: KafkaBroker
) -> None:
    """A ship verifying against another CA (a spoofed port, a wrong ca_file) must not
    send its token: the handshake fails before any request, and nothing is written."""
    with pytest.raises(aiohttp.ClientConnectorCertificateError):
        await _post(port, port.refused, 1, 5, port.client(ca=port.other.ca_cert))
    assert _written(kafka, port.refused) == []


@ON_PORT
async def test_the_containers_health_check_speaks_tls_to_a_tls_gateway(
    port: Port, tmp_path: Path
) -> None:
    """Review M4: the image's health check asked the TLS port in plain HTTP, so a
    gateway with TLS was unhealthy forever. ``shorelink-gateway health`` (the image's
    HEALTHCHECK) reads the config and asks over HTTPS; nothing listening is unhealthy."""
    cfg = port.cfg
    assert cfg.tls_cert_file is not None and cfg.tls_key_file is not None
    listen = {
        "host": "0.0.0.0",
        "port": cfg.port,
        "tls_cert_file": str(cfg.tls_cert_file),
        "tls_key_file": str(cfg.tls_key_file),
    }
    doc = {
        "site": "tokyo",
        "credentials_file": str(cfg.credentials_file),
        "streams": list(cfg.streams),
        "listen": listen,
        "kafka": {"bootstrap": cfg.kafka.bootstrap},
    }

    async def health(listening: dict[str, object]) -> tuple[int | None, str]:
        path = write_toml(tmp_path / "gateway.toml", {**doc, "listen": listening})
        argv = [sys.executable, "-m", "core_gateway.cli", "health", "--config", str(path)]
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
        return proc.returncode, out.decode()

    rc, out = await health(listen)
    assert rc == 0 and f"ok: https://127.0.0.1:{cfg.port}/healthz answered 200" in out, out
    rc, out = await health({**listen, "port": free_port()})
    assert rc == 1 and "unhealthy" in out, out
    containerfile = (SAMPLE.parent / "Containerfile").read_text()
    assert (
        'HEALTHCHECK --interval=15s --timeout=3s CMD ["shorelink-gateway", "health"]'
        in containerfile
    )


@ON_PORT
async def test_a_plain_http_client_to_the_tls_port_fails(port: Port, kafka: KafkaBroker) -> None:
    """The HTTPS port never speaks HTTP: a client without TLS gets no answer at all."""
    url = f"http://127.0.0.1:{port.cfg.port}/v1/ships/{port.refused}/streams/{STREAM}/batches"
    async with aiohttp.ClientSession() as s:
        with pytest.raises(aiohttp.ClientConnectionError):
            async with s.post(
                url,
                data=batch(port.refused, 1, 5, STREAM),
                headers={"Authorization": f"Bearer {port.tokens[port.refused]}"},
            ) as r:
                await r.read()
    assert _written(kafka, port.refused) == []


@ON_PORT
@pytest.mark.parametrize(
    ("presented", "token_of", "status", "error"),
    [
        ("none", "self", 401, "client_cert_required"),
        ("other ship's", "self", 403, "client_cert_mismatch"),
        ("own", "wrong", 401, "unauthorized"),
        ("own", "other ship", 403, "forbidden"),
    ],
)
async def test_a_ship_that_requires_mutual_tls_is_refused_without_its_own_certificate(
    port: Port, kafka: KafkaBroker, presented: str, token_of: str, status: int, error: str
) -> None:
    """The certificate proves the ship as much as the token: without one, or with
    another ship's (issued by the same CA), the request is refused, and the token is
    still checked when the certificate is right."""
    ship = port.mtls_refused
    cert = {
        "none": None,
        "other ship's": port.authority.issue(port.mtls, client=True),
        "own": port.authority.issue(ship, client=True),
    }[presented]
    token = {"self": "", "wrong": "slk_not-a-token", "other ship": port.tokens[port.plain]}[
        token_of
    ]
    got, body = await _post(port, ship, 1, 5, port.client(cert), token=token)
    assert (got, body["error"]) == (status, error)
    assert _written(kafka, ship) == []


@ON_PORT
async def test_a_client_certificate_of_another_ca_fails_the_handshake(
    port: Port, kafka: KafkaBroker
) -> None:
    """A certificate naming the ship but not issued by the port's client CA proves
    nothing: the gateway ends the handshake, no request is read."""
    foreign = port.other.issue(port.mtls_refused, client=True)
    with pytest.raises(aiohttp.ClientConnectionError):
        await _post(port, port.mtls_refused, 1, 5, port.client(foreign))
    assert _written(kafka, port.mtls_refused) == []


@ON_PORT
async def test_the_right_certificate_and_token_are_written_once(
    port: Port, kafka: KafkaBroker
) -> None:
    own = port.authority.issue(port.mtls, client=True)
    status, body = await _post(port, port.mtls, 1, 20, port.client(own))
    assert (status, body["written"]) == (200, "1-20")
    assert _written(kafka, port.mtls) == list(range(1, 21))


@ON_PORT
async def test_a_certificate_never_vouches_for_another_ship(port: Port, kafka: KafkaBroker) -> None:
    """A ship that needs no certificate but presents one must present its own: another
    ship's certificate with this ship's token is a stolen identity, not a bonus."""
    stolen = port.authority.issue(port.mtls, client=True)
    status, body = await _post(port, port.refused, 1, 5, port.client(stolen))
    assert (status, body["error"]) == (403, "client_cert_mismatch")
    assert _written(kafka, port.refused) == []


async def test_the_documented_certificate_script_makes_files_a_ship_verifies(
    tmp_path: Path, kafka: KafkaBroker
) -> None:
    """``deploy/gateway/make-tls.sh`` (docs/gateway-api.md, "TLS"): its files load as
    the gateway's, a ship trusting only its ``ca.crt`` verifies the gateway by the host
    it was made for, and the keys are their owner's alone. The CA's key stays in the CA's
    directory: the gateway's holds its pair and the CA's certificate only, and the script
    refuses a gateway directory that is (inside) the CA's (review, ecosystem §4: the
    runbook mounted the CA's key into the gateway)."""
    script = SAMPLE.with_name("make-tls.sh")
    ca, tls = tmp_path / "ca", tmp_path / "tls"
    made = await asyncio.create_subprocess_exec(
        str(script), "127.0.0.1", str(ca), str(tls), stderr=asyncio.subprocess.PIPE
    )
    _, err = await asyncio.wait_for(made.communicate(), 60)
    assert made.returncode == 0, err.decode()
    assert sorted(p.name for p in tls.iterdir()) == ["ca.crt", "gateway.crt", "gateway.key"]
    assert (ca / "ca.key").is_file()
    assert all(p.stat().st_mode & 0o077 == 0 for p in (ca / "ca.key", tls / "gateway.key"))
    for out in (ca, ca / "gateway"):
        refused = await asyncio.create_subprocess_exec(
            str(script), "127.0.0.1", str(ca), str(out), stderr=asyncio.subprocess.PIPE
        )
        _, err = await asyncio.wait_for(refused.communicate(), 60)
        assert refused.returncode == 2 and b"CA's key" in err, err.decode()
        assert not (out / "gateway.key").exists()
    cfg = replace(
        gateway_config(tmp_path, kafka),
        tls_cert_file=tls / "gateway.crt",
        tls_key_file=tls / "gateway.key",
        decode_workers=0,
    )
    stop = asyncio.Event()
    task = await start_tls_gateway(cfg, tls / "ca.crt", stop)  # /readyz over verified TLS
    try:
        url = f"https://127.0.0.1:{cfg.port}/healthz"
        async with aiohttp.ClientSession() as s, s.get(url, ssl=trusting(tls / "ca.crt")) as r:
            assert r.status == 200
    finally:
        stop.set()
        await task


# -- configuration ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def authority(tmp_path_factory: pytest.TempPathFactory) -> Authority:
    return make_authority(tmp_path_factory.mktemp("tls-config") / "tls")


def _listen(authority: Authority, **listen: str) -> dict[str, object]:
    """The shipped sample (its ship keys file the shipped one) with ``listen`` keys."""
    data = load_toml(SAMPLE)
    data["ship_keys_file"] = str(SHIP_KEYS_SAMPLE)
    server = authority.issue("gateway")
    data["listen"] = {
        "tls_cert_file": str(server.cert),
        "tls_key_file": str(server.key),
        **listen,
    }
    return data


def test_tls_keys_are_read_relative_to_the_config_file(authority: Authority) -> None:
    data = _listen(authority, tls_cert_file="gateway.pem", client_ca_file="ca.pem")
    cfg = parse_config(data, base=authority.dir)
    assert cfg.tls_cert_file == authority.dir / "gateway.pem"
    assert cfg.client_ca_file == authority.ca_cert
    ctx = cfg.ssl_context()
    assert ctx is not None and ctx.verify_mode == ssl.CERT_OPTIONAL


@pytest.mark.parametrize(
    ("listen", "field", "says"),
    [
        ({"tls_cert_file": "/nonexistent/gateway.pem"}, "listen.tls_cert_file", "cannot read"),
        ({"tls_key_file": "other.key"}, "listen.tls_key_file", "is not the key of"),
        ({"tls_key_file": "gateway.pem"}, "listen.tls_key_file", "no PEM private key"),
        ({"client_ca_file": "gateway.key"}, "listen.client_ca_file", "no PEM CA certificate"),
        ({"tls_cert_file": "ca.key"}, "listen.tls_cert_file", "no PEM certificate"),
    ],
)
def test_a_bad_certificate_or_key_is_a_config_error_naming_the_key(
    authority: Authority, listen: dict[str, str], field: str, says: str
) -> None:
    """An operator learns at start-up which file is wrong, not at a ship's handshake."""
    authority.issue("other")
    with pytest.raises(ConfigError) as exc:
        parse_config(_listen(authority, **listen), base=authority.dir)
    assert exc.value.field == field and says in str(exc.value)


def test_mutual_tls_without_tls_is_a_config_error(authority: Authority) -> None:
    data = load_toml(SAMPLE)
    data["listen"] = {"client_ca_file": str(authority.ca_cert)}
    with pytest.raises(ConfigError) as exc:
        parse_config(data)
    assert exc.value.field == "listen.client_ca_file"


def test_check_config_names_the_bad_key_and_fails(authority: Authority, tmp_path: Path) -> None:
    server = authority.issue("gateway")
    text = (
        SAMPLE.read_text()
        .replace(
            '"/etc/shorelink/tls/gateway.crt"',
            f'"{server.cert}"',
        )
        .replace(
            '"/etc/shorelink/tls/gateway.key"',
            f'"{authority.issue("other").key}"',
        )
    )
    config = tmp_path / "gateway.toml"
    config.write_text(text)
    res = subprocess.run(
        [sys.executable, "-m", "core_gateway.cli", "check-config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2, res.stdout
    assert "listen.tls_key_file" in res.stderr and "is not the key of" in res.stderr


# -- credentials: which ships need a certificate -------------------------------------------
def test_a_new_token_keeps_the_ships_client_certificate_requirement(tmp_path: Path) -> None:
    """Rotating a ship's token must not quietly drop its mutual TLS."""
    creds = Credentials(tmp_path / "ships.json")
    creds.add("bigblue", require_client_cert=True)
    creds.add("bigblue")
    assert Credentials(tmp_path / "ships.json").requires_client_cert("bigblue")
    creds.add("bigblue", require_client_cert=False)
    assert not Credentials(tmp_path / "ships.json").requires_client_cert("bigblue")


def test_a_hand_edited_requirement_that_is_not_a_boolean_is_refused(tmp_path: Path) -> None:
    """``"false"`` (a string) would read as true: the file is refused instead."""
    path = tmp_path / "ships.json"
    Credentials(path).add("bigblue")
    data = json.loads(path.read_text())
    data["ships"]["bigblue"]["require_client_cert"] = "false"
    path.write_text(json.dumps(data))
    with pytest.raises(GatewayError, match="require_client_cert must be true or false"):
        Credentials(path)


def test_ships_client_cert_sets_the_requirement_and_keeps_the_token(tmp_path: Path) -> None:
    config = sample_config(tmp_path)
    creds = Credentials(tmp_path / "ships.json")
    token = creds.add("bigblue")
    runner = CliRunner()
    res = runner.invoke(
        gateway_cli, ["ships", "client-cert", "bigblue", "required", "--config", str(config)]
    )
    assert res.exit_code == 0, res.output
    assert "listen.client_ca_file is not set" in res.output  # the sample asks for none
    again = Credentials(tmp_path / "ships.json")
    assert again.requires_client_cert("bigblue") and again.ship_for_token(token) == "bigblue"
    listed = runner.invoke(gateway_cli, ["ships", "list", "--config", str(config)])
    assert "client-cert required" in listed.output
    res = runner.invoke(
        gateway_cli, ["ships", "client-cert", "nobody", "optional", "--config", str(config)]
    )
    assert res.exit_code == 2 and "no credential" in res.output


async def test_tls_handshakes_count_toward_the_connection_limit_and_a_ship_gets_in_after(
    tmp_path: Path, kafka: KafkaBroker
) -> None:
    """Review N7: a connection in its TLS handshake was not counted (aiohttp knows it
    only once the handshake is done), so silent TLS sockets, each a file descriptor for
    up to the handshake timeout, went past ``listen.max_connections`` until
    ``accept()`` failed for ships (EMFILE). Now each is counted from accept: with the
    limit 8, eight silent sockets hold it, every one more is closed at once, so the
    descriptors stay bounded; once they go, a ship uploads over TLS."""
    authority = make_authority(tmp_path / "tls")
    cfg = replace(tls_gateway_config(tmp_path, kafka, authority, mutual=False), max_connections=8)
    ship = unique("ship")
    token = Credentials(cfg.credentials_file).add(ship)
    stop = asyncio.Event()
    task = await start_tls_gateway(cfg, authority.ca_cert, stop)
    silent: list[asyncio.StreamWriter] = []
    try:
        for _ in range(8):  # connect, never say hello
            silent.append((await asyncio.open_connection("127.0.0.1", cfg.port))[1])
        for _ in range(20):
            reader, writer = await asyncio.open_connection("127.0.0.1", cfg.port)
            assert await asyncio.wait_for(reader.read(1024), 5) == b"", "not closed at once"
            writer.close()
        for w in silent:
            w.close()
        ctx = trusting(authority.ca_cert)
        url = f"https://127.0.0.1:{cfg.port}/v1/ships/{ship}/streams/alerts/batches"
        headers = {"Authorization": f"Bearer {token}"}
        async with aiohttp.ClientSession() as s:
            status = 0
            for _ in range(100):  # until the server has seen the silent ones go
                try:
                    async with s.post(
                        url, data=batch(ship, 1, 5, "alerts"), headers=headers, ssl=ctx
                    ) as r:
                        status = r.status
                    break
                except aiohttp.ClientConnectionError:
                    await asyncio.sleep(0.1)
            assert status == 200
            async with s.get(f"{metrics_url(cfg)}/metrics") as r:
                text = await r.text()
        (line,) = [
            ln
            for ln in text.splitlines()
            if ln.startswith("shorelink_gateway_connections_refused_total")
        ]
        assert float(line.split()[1]) >= 20
    finally:
        for w in silent:
            w.close()
        stop.set()
        await task
