"""Who is who in a voyage: the certificate authority and every principal's password.

A voyage runs as production does (docs/access-control.md): each site's Kafka takes
SASL/SCRAM over TLS with ACLs, each gateway serves HTTPS, ships verify it. The CA is
made under ``DIR/tls/`` (local_stack/tls.py); every password is fresh and random, put
in this process's environment (the voyage's processes inherit it; the config files
only name the variables, ``${SL_...}``) and kept in ``DIR/secrets.env`` (mode 0600) so
a stack left up with ``--keep`` can be explored: ``set -a; . DIR/secrets.env``.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from local_stack.kafka import BrokerSecurity
from local_stack.stack import write_secrets
from local_stack.tls import Authority, Issued, make_authority

__all__ = ["STAFF", "VoyageSecurity", "env_var"]

#: the staff principal the voyage's observers read as, and their login to the
#: operations page (its own password: ``env_var("ops_login", STAFF)``)
STAFF = "ops"


def env_var(role: str, name: str = "") -> str:
    """The environment variable holding a password: ``SL_GATEWAY_TOKYO_PASSWORD``."""
    parts = ["SL", role, *([name] if name else []), "PASSWORD"]
    return "_".join(p.upper().replace("-", "_") for p in parts)


@dataclass
class VoyageSecurity:
    authority: Authority
    #: environment variable -> password
    passwords: dict[str, str] = field(default_factory=dict)

    @classmethod
    def create(cls, dir: Path, variables: list[str]) -> VoyageSecurity:
        sec = cls(make_authority(dir / "tls", "shorelink voyage CA"))
        own = [env_var("kafka_admin"), env_var("staff", STAFF), env_var("ops_login", STAFF)]
        for var in [*own, *variables]:
            sec.passwords[var] = secrets.token_urlsafe(18)
        os.environ.update(sec.passwords)
        write_secrets(dir, sec.passwords)  # the stack's secrets file, as `stack up` keeps it
        return sec

    @property
    def ca_file(self) -> Path:
        return self.authority.ca_cert

    def broker(self) -> BrokerSecurity:
        return BrokerSecurity(self.authority, self.passwords[env_var("kafka_admin")])

    def server(self, name: str) -> Issued:
        return self.authority.issue(name)

    def password(self, role: str, name: str = "") -> str:
        return self.passwords[env_var(role, name)]
