"""``shorelink-spark check-config``: what a sites file (and the customers file it names)
asks of the machine, checked before anything starts (docs/data-centre.md).

The file is parsed as every command parses it; then, per site, every file it names is
looked for (CA, TLS pair, the page's logins, which must also be private), every secret is
resolved to say which variables this environment lacks (each command resolves only its
own: spark_core/config.py), and every place where traffic would cross a network in
clear text is named. Problems (a file that is not there) make the exit status 1;
warnings (plain text, a variable this shell lacks) do not.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from shorelink.config import Secret
from shorelink.errors import ConfigError
from shorelink.files import read_private
from shorelink.proof import ShipKeys, signature_mode
from shorelink.tls import is_loopback
from spark_core.config import SiteConfig, SitesConfig
from spark_core.customers import load_customers

__all__ = ["Report", "check_sites"]


@dataclass
class Report:
    """What :func:`check_sites` found: one summary line per site, problems, warnings."""

    summary: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def check_sites(sites: SitesConfig, only: str | None = None) -> Report:
    """Check ``sites`` (every site, or ``only``); the customers and ship keys files if
    it names them."""
    out = Report()
    if sites.customers_file is not None:
        try:
            customers = load_customers(sites.customers_file)
            out.summary.append(f"customers: {len(customers.customers)} in {sites.customers_file}")
            for c in customers.customers.values():
                _secret(out, c.password)
        except ConfigError as exc:
            out.problems.append(f"customers_file: {exc}")
    keys: ShipKeys | None = None
    if sites.ship_keys_file is not None:
        try:
            keys = ShipKeys.load(sites.ship_keys_file)
            required = ", required" if keys.require_signatures else ""
            out.summary.append(f"ship keys: {len(keys.ships)}{required} in {sites.ship_keys_file}")
        except ConfigError as exc:
            out.problems.append(f"ship_keys_file: {exc}")
    if sites.fleet_pub_file is not None:  # the keys come with the registry, once followed
        out.summary.append(
            f"signatures: the fleet registry's keys (fleet_pub_file {sites.fleet_pub_file})"
        )
    elif keys is not None or sites.ship_keys_file is None:
        mode, unenforced = signature_mode(keys, sites.ship_keys_file, checks="pulled records")
        out.summary.append(f"signatures: {mode}")
        # a site without neighbours pulls nothing: its merge takes what its gateway proved
        if any(sites.site(n).neighbours for n in ([only] if only else sites.sites)):
            out.warnings += unenforced
    for p in sites.staff:
        _secret(out, p.password)
    for name in [only] if only else sorted(sites.sites):
        _check_site(out, sites, sites.site(name))
    for site, missing in sorted(sites.unreached().items()):
        if only in (None, site):
            out.warnings.append(
                f"sites.{site}: the records of {', '.join(missing)} never reach it (no "
                "chain of neighbours leads there)"
            )
    return out


def _check_site(out: Report, sites: SitesConfig, s: SiteConfig) -> None:
    at = f"sites.{s.name}"
    o = s.ops
    files: list[tuple[str, Path | None]] = [
        (f"{at}.kafka.ca_file", s.kafka.auth.ca_file),
        (f"{at}.ops.listen.tls_cert_file", o.tls_cert_file),
        (f"{at}.ops.listen.tls_key_file", o.tls_key_file),
        (f"{at}.ops.gateway_ca_file", o.gateway_ca_file),
    ]
    for where, path in files:
        if path is not None and not path.is_file():
            out.problems.append(f"{where}: {path} is not a file here")
    if o.users_file is not None:
        if not o.users_file.exists():
            out.problems.append(
                f"{at}.ops.users_file: {o.users_file} does not exist (shorelink ops-users add)"
            )
        else:
            try:
                read_private(o.users_file, f"{at}.ops.users_file")
            except ConfigError as exc:
                out.problems.append(str(exc))
    for f in dataclasses.fields(s.access):
        value = getattr(s.access, f.name)
        if isinstance(value, Secret):
            _secret(out, value)
    _secret(out, s.kafka.auth.password)
    _secret(out, s.replication.password)
    _secret(out, o.kafka_password)
    if (why := s.kafka.in_clear()) is not None:
        out.warnings.append(f"{at}.kafka: {why}")
    for n in s.neighbours:
        if n in sites.sites and (why := s.reach(sites.sites[n]).in_clear()) is not None:
            out.warnings.append(f"{at} -> {n}: {why}")
    page = "https" if o.tls_cert_file is not None else "http"
    if page == "http" and not is_loopback(o.host):
        out.warnings.append(
            f"{at}.ops.listen: plain HTTP on {o.host}: `shorelink ops` refuses it unless "
            "--plain-http (behind a TLS proxy)"
        )
    if o.users_file is None and not is_loopback(o.host):
        out.problems.append(
            f"{at}.ops.users_file: not set, and the page listens on {o.host}: `shorelink "
            "ops` refuses an open page beyond loopback"
        )
    if s.metrics.port and not is_loopback(s.metrics.host):
        out.warnings.append(
            f"{at}.metrics.listen: {s.metrics.host}:{s.metrics.port} serves metrics in plain "
            "HTTP without authentication"
        )
    out.summary.append(
        f"ok: site={s.name} streams={','.join(s.streams)} "
        f"neighbours={','.join(s.neighbours) or '-'} kafka={s.kafka.bootstrap} "
        f"kafka_tls={'on' if s.kafka.auth.ca_file else 'off'} "
        f"ops={page}://{o.host}:{o.port} tables={'on' if s.tables else 'off'}"
    )


def _secret(out: Report, secret: Secret) -> None:
    """A secret this environment cannot resolve: a warning (the command that uses it
    may run elsewhere, with its own variables)."""
    try:
        bool(secret)  # resolves it
    except ConfigError as exc:
        out.warnings.append(f"{exc} (only the commands that use it need it)")
