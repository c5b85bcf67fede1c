"""The local stack's certificate authority: made at ``stack up``, no hand steps.

Every TLS endpoint of the stack (each site's Kafka, each gateway) gets a certificate
issued by one CA made under ``DIR/tls/``; clients verify against ``ca.pem``. Keys are
EC P-256, written as unencrypted PKCS#8 PEM with mode 0600 (Kafka's PEM key store reads
PKCS#8 only). Certificates name ``127.0.0.1``, ``::1`` and ``localhost``, where the stack
listens. Made once: a second call finds the files and returns them, so restarting a
stack keeps the certificates its clients already trust.

A production deployment brings its own PKI; nothing outside ``local_stack`` makes
certificates.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from local_stack.errors import StackError
from shorelink.files import write_atomic

__all__ = ["BROKER_UNIT", "Authority", "Issued", "make_authority"]

#: the organisational unit of a Kafka broker's certificate: only such a certificate maps
#: to a broker's principal (local_stack/kafka.py ``ssl.principal.mapping.rules``)
BROKER_UNIT = "shorelink-kafka-brokers"
#: how long the stack's certificates stay valid
VALID_DAYS = 825
HOSTS = ("localhost",)
ADDRESSES = ("127.0.0.1", "::1")


@dataclass(frozen=True)
class Issued:
    """A certificate and its key; ``bundle`` holds both (key first), as Kafka's PEM key
    store wants them in one file."""

    cert: Path
    key: Path
    bundle: Path


@dataclass(frozen=True)
class Authority:
    dir: Path

    @property
    def ca_cert(self) -> Path:
        return self.dir / "ca.pem"

    @property
    def ca_key(self) -> Path:
        return self.dir / "ca.key"

    def issue(self, name: str, *, client: bool = False, broker: bool = False) -> Issued:
        """A certificate for ``name`` (its common name; also the file names): for a
        server on the stack's addresses; with ``client``, for a client only (mutual
        TLS); with ``broker``, for a Kafka broker, which is also a client of its
        controllers and is told from every other holder of this CA's certificates by
        its organisational unit, :data:`BROKER_UNIT` (a ship named ``kafka-hq`` is no
        broker: review L11). Issued once: an existing one is returned while it is
        still of that kind."""
        if not name or not all(c.isalnum() or c in "-_." for c in name):
            raise StackError(f"certificate name {name!r}: letters, digits, - _ . only")
        out = Issued(
            self.dir / f"{name}.pem", self.dir / f"{name}.key", self.dir / f"{name}.bundle.pem"
        )
        subject = _subject(name, BROKER_UNIT if broker else None)
        usage = [ExtendedKeyUsageOID.CLIENT_AUTH] if client or broker else []
        if not client:
            usage.append(ExtendedKeyUsageOID.SERVER_AUTH)
        if out.cert.exists() and out.key.exists() and out.bundle.exists():
            old = x509.load_pem_x509_certificate(out.cert.read_bytes())
            kind = old.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
            if old.subject == subject and list(kind) == usage:
                return out
        ca_key = serialization.load_pem_private_key(self.ca_key.read_bytes(), None)
        ca_cert = x509.load_pem_x509_certificate(self.ca_cert.read_bytes())
        assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            _builder(subject, ca_cert.subject, key)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                critical=False,
            )
        )
        if not client:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName(h) for h in HOSTS]
                    + [x509.IPAddress(ipaddress.ip_address(a)) for a in ADDRESSES]
                ),
                critical=False,
            )
        cert = builder.sign(ca_key, hashes.SHA256())
        key_pem = _key_pem(key)
        cert_pem = cert.public_bytes(serialization.Encoding.PEM)
        _write(out.key, key_pem, private=True)
        _write(out.cert, cert_pem)
        _write(out.bundle, key_pem + cert_pem, private=True)
        return out


def make_authority(dir: Path, name: str = "shorelink local stack CA") -> Authority:
    """The CA under ``dir`` (made the first time)."""
    auth = Authority(Path(dir))
    if auth.ca_cert.exists() and auth.ca_key.exists():
        return auth
    auth.dir.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _builder(_subject(name), None, key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    _write(auth.ca_key, _key_pem(key), private=True)
    _write(auth.ca_cert, cert.public_bytes(serialization.Encoding.PEM))
    return auth


def _subject(name: str, unit: str | None = None) -> x509.Name:
    """``CN=name`` (``CN=name,OU=unit`` as Kafka's principal mapping reads it)."""
    cn = x509.NameAttribute(NameOID.COMMON_NAME, name)
    if unit is None:
        return x509.Name([cn])
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, unit), cn])


def _builder(
    subject: x509.Name, issuer: x509.Name | None, key: ec.EllipticCurvePrivateKey
) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer or subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=VALID_DAYS))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes, *, private: bool = False) -> None:
    write_atomic(path, data, mode=0o600 if private else 0o644)
