"""The stack's certificate authority: a real TLS handshake verifies against it."""

from __future__ import annotations

import socket
import ssl
import stat
import threading
from pathlib import Path

import pytest

from local_stack.errors import StackError
from local_stack.tls import make_authority


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext, host: str) -> str:
    """One real handshake over loopback; the server's peer subject (mutual TLS) or ""."""
    with socket.create_server(("127.0.0.1", 0)) as lsock:
        port = lsock.getsockname()[1]
        seen: list[str] = []

        def serve() -> None:
            conn, _ = lsock.accept()
            try:
                with server.wrap_socket(conn, server_side=True) as s:
                    peer = s.getpeercert()
                    seen.append(str(peer.get("subject", "")) if peer else "")
                    s.recv(1)
            except (ssl.SSLError, OSError):
                seen.append("refused")

        t = threading.Thread(target=serve, daemon=True)
        t.start()
        try:
            with (
                socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
                client.wrap_socket(raw, server_hostname=host) as s,
            ):
                s.sendall(b"x")
        finally:
            t.join(10)
        return seen[0]


def test_a_server_certificate_verifies_against_the_ca_by_address_and_name(
    tmp_path: Path,
) -> None:
    ca = make_authority(tmp_path / "tls")
    issued = ca.issue("kafka-tokyo")
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(issued.cert, issued.key)
    for host in ("127.0.0.1", "localhost"):
        client = ssl.create_default_context(cafile=str(ca.ca_cert))
        assert _handshake(server, client, host) == ""
    # keys are private to their owner
    assert stat.S_IMODE(issued.key.stat().st_mode) == 0o600
    assert stat.S_IMODE(ca.ca_key.stat().st_mode) == 0o600


def test_a_client_of_another_ca_is_refused_and_a_client_certificate_is_seen(
    tmp_path: Path,
) -> None:
    ca = make_authority(tmp_path / "tls")
    other = make_authority(tmp_path / "other", "another CA")
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(ca.ca_cert))
    issued = ca.issue("gateway-tokyo")
    server.load_cert_chain(issued.cert, issued.key)
    server.verify_mode = ssl.CERT_REQUIRED
    ship = ca.issue("ship1", client=True)
    client = ssl.create_default_context(cafile=str(ca.ca_cert))
    client.load_cert_chain(ship.cert, ship.key)
    assert "ship1" in _handshake(server, client, "127.0.0.1")
    # a client that trusts another CA refuses the server
    wrong = ssl.create_default_context(cafile=str(other.ca_cert))
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(server, wrong, "127.0.0.1")


def test_the_authority_is_made_once_and_names_are_checked(tmp_path: Path) -> None:
    ca = make_authority(tmp_path / "tls")
    first = ca.issue("kafka-hq").cert.read_bytes()
    again = make_authority(tmp_path / "tls")
    assert again.ca_cert.read_bytes() == ca.ca_cert.read_bytes()
    assert again.issue("kafka-hq").cert.read_bytes() == first
    with pytest.raises(StackError, match="letters"):
        ca.issue("../escape")
