"""A token's rotation ended by the ship's own word: the older token of a pending
rotation is retired once the ship's report says it uploads with the newer one
(docs/fleet-registry.md, "Tokens").

Why the ship's signed report and not a gateway's record: what must be proved is that
the *ship* uses the new token, and only the ship can sign its records (every site checks
a record against the ship's key valid at its seq, and a registry site takes no unsigned
record). The report (shorelink/ship_report.py) already travels to headquarters, canonical
at every site, exactly once by its identity, and headquarters' loop already reads each
ship's newest one: naming the token's id there costs 27 bytes a report and no new
stream. A gateway has no key of its own: a record it wrote would be the word of whoever
can write to a site's ingress or pose as a neighbour.

What that leaves a thief who holds only the old token: while the rotation is pending it
may still open connections to gateways as the ship (it cannot write a record there: it
has no key), and read what a gateway offers the ship. It cannot cause the retirement (a
report naming the new token's id must be signed by the ship's key) nor delay it (the
ship's newest report, by seq, decides: a report replayed is the same identity, written
once; one it could not sign is refused at the gateway and dead-lettered at the sites).
Its window ends when the ship's first report on the new token reaches headquarters and
the entry travels back (a tick, then seconds); a leaked token is cut at once with
``fleet rotate-token --at-once``.

:func:`retirements` decides (pure); :func:`retire_used` writes the entries.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from shorelink.fleet.entry import RegistryError, token_id
from shorelink.fleet.log import Registry
from shorelink.fleet.state import FleetState

__all__ = ["Retirement", "retire_used", "retirements"]


@dataclass(frozen=True)
class Retirement:
    """``ship``'s older token (``old``, its hash) retired: its report names ``used``
    (the newer token's id)."""

    ship: str
    old: str
    used: str


def retirements(state: FleetState, used: Mapping[str, str | None]) -> list[Retirement]:
    """The tokens to retire: for each ship (not revoked) with a rotation pending whose
    newest report (``used``: ship -> token id it names, None: none) names the newer
    token, the older one. A report naming the older token, or none, retires nothing."""
    out = []
    for ship, named in sorted(used.items()):
        rec = state.ships.get(ship)
        if named is None or rec is None or rec.revoked or len(rec.tokens) < 2:
            continue
        if token_id(rec.tokens[-1].hash) == named:
            out.append(Retirement(ship, rec.tokens[0].hash, named))
    return out


def retire_used(reg: Registry, used: Mapping[str, str | None]) -> list[Retirement]:
    """Write a ``token_retired`` entry for each of :func:`retirements`, one at a time,
    each against the registry as it is then: one retired meanwhile (``fleet
    retire-token`` by hand, another loop) is skipped, so a second call writes nothing."""
    done = []
    reg.refresh()
    for r in retirements(reg.state, used):
        body = {"ship": r.ship, "token_hash": r.old}
        try:
            reg.append([("token_retired", body)])
        except RegistryError:
            if r in retirements(reg.state, used):  # append re-read the log under its lock
                raise
            continue
        done.append(r)
    return done
