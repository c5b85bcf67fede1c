"""TLS between ships and gateways: ``ssl.SSLContext`` objects built from the paths a
config names, every failure a :class:`~shorelink.errors.ConfigError` naming the key.

The gateway serves HTTPS with :func:`server_context` (and asks ships for a client
certificate when it is given a client CA: mutual TLS); the edge agent verifies each
gateway with :func:`client_context` (against its own CA, or the system's trust store)
and presents its certificate when it has one. Both are built when the config is read,
so a missing file, a key that is not the certificate's, or an encrypted key stops the
process at start-up with the key at fault, instead of failing the first handshake.

:func:`common_name` reads who a verified peer certificate names: the gateway matches a
ship's client certificate against the ship (``docs/gateway-api.md``, "TLS").
:func:`is_loopback` tells an address where clear text never leaves the machine.
"""

from __future__ import annotations

import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shorelink.errors import ConfigError

__all__ = ["TlsFile", "client_context", "common_name", "is_loopback", "server_context"]

_CERT_MARK = b"-----BEGIN CERTIFICATE-----"
_KEY_MARK = b"PRIVATE KEY-----"


@dataclass(frozen=True)
class TlsFile:
    """A PEM file a config names, and the key that names it (for errors)."""

    path: Path
    field: str


def server_context(cert: TlsFile, key: TlsFile, client_ca: TlsFile | None = None) -> ssl.SSLContext:
    """A server's context: TLS 1.2 or newer, ``cert``'s chain with ``key``. With
    ``client_ca``, clients are asked for a certificate and one they present must be
    signed by that CA (a bad one fails the handshake); a client may still present none:
    which clients must is the server's decision per client, after the handshake."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(ctx, cert, key)
    if client_ca is not None:
        _load_ca(ctx, client_ca)
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


def client_context(
    ca: TlsFile | None = None, cert: TlsFile | None = None, key: TlsFile | None = None
) -> ssl.SSLContext:
    """A client's context: the server's certificate verified (and its name against the
    address dialled) against ``ca``, or the system's trust store without it; with
    ``cert`` and ``key``, the client's own certificate for mutual TLS."""
    if (cert is None) != (key is None):
        raise ValueError("a client certificate needs both cert and key")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies the chain and the name
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if ca is not None:
        _load_ca(ctx, ca)  # only this CA: a certificate the system trusts is not the site's
    else:
        ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    if cert is not None and key is not None:
        _load_chain(ctx, cert, key)
    return ctx


def common_name(peercert: dict[str, Any] | None) -> str | None:
    """The common name of a verified peer certificate (``SSLSocket.getpeercert()``), or
    None when there is none (no certificate presented, or none asked for)."""
    if not peercert:
        return None
    for rdn in peercert.get("subject", ()):
        for name, value in rdn:
            if name == "commonName":
                return str(value)
    return None


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or localhost: an address only this machine reaches, where a
    link needs no TLS (anywhere else, clear text is a warning at every start)."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _read(f: TlsFile, mark: bytes, what: str) -> None:
    try:
        data = f.path.read_bytes()
    except OSError as exc:
        raise ConfigError(f.field, f"cannot read {f.path}: {exc.strerror or exc}") from None
    if mark not in data:
        raise ConfigError(f.field, f"{f.path} holds no PEM {what}")


def _no_password() -> str:
    raise ConfigError("", "encrypted")


def _load_chain(ctx: ssl.SSLContext, cert: TlsFile, key: TlsFile) -> None:
    _read(cert, _CERT_MARK, "certificate (-----BEGIN CERTIFICATE-----)")
    _read(key, _KEY_MARK, "private key (-----BEGIN ... PRIVATE KEY-----)")
    try:
        # a password callback that refuses: OpenSSL would otherwise prompt on the
        # terminal of a service for an encrypted key
        ctx.load_cert_chain(cert.path, key.path, password=_no_password)
    except ConfigError:
        raise ConfigError(
            key.field, f"{key.path} is encrypted: give the key unencrypted (mode 0600)"
        ) from None
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc) or exc.reason == "KEY_VALUES_MISMATCH":
            raise ConfigError(
                key.field, f"{key.path} is not the key of {cert.path} ({cert.field})"
            ) from None
        raise ConfigError(
            cert.field, f"cannot load {cert.path} with {key.path} ({key.field}): {exc}"
        ) from None


def _load_ca(ctx: ssl.SSLContext, ca: TlsFile) -> None:
    _read(ca, _CERT_MARK, "CA certificate (-----BEGIN CERTIFICATE-----)")
    try:
        ctx.load_verify_locations(cafile=ca.path)
    except ssl.SSLError as exc:
        raise ConfigError(ca.field, f"{ca.path} is not a usable CA certificate: {exc}") from None
