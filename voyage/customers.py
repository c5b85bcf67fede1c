"""Big Blue's customers in a voyage: who owns which containers, and one customer's
consumer reading its own containers live at headquarters.

The lines whose containers the simulator carries (fleet_sim/plan.py) are customers,
by their ISO 6346 owner codes (the customers file, spark_core/customers.py). HQ keeps
their streams ``sl.customer.<name>.<stream>``; the ports do not (``customer_topics =
false``, as a port may leave them to HQ). :class:`CustomerReader` runs ``shorelink
consume --customer`` with ``--follow`` as the customer would, from its own small file
(its principal ``customer-<name>``, its password from the environment), for the whole
voyage; at the end the report checks what it printed against what HQ holds of that
customer's containers, and that the same consumer is refused another customer's stream.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from local_stack.process import Proc
from voyage.configs import secret_ref, toml_file
from voyage.observe import Arrival, Ident
from voyage.topology import HQ

__all__ = [
    "CUSTOMERS",
    "OTHER",
    "READER",
    "CustomerReader",
    "client_config",
    "customers_config",
    "problems",
]

#: customer -> the owner codes of its containers (lines whose containers sail)
CUSTOMERS: dict[str, tuple[str, ...]] = {
    "mscline": ("MSCU",),
    "maeline": ("MAEU",),
    "cmaline": ("CMAU",),
}
#: the customer whose consumer the report follows, and the one it must not read
READER, OTHER = "mscline", "maeline"
#: the streams a customer reads (records keyed by container id)
STREAMS = ("containers", "alerts")


def customers_config() -> str:
    customers = {
        name: {
            "owner_codes": list(codes),
            "streams": list(STREAMS),
            "password": secret_ref("customer", name),
        }
        for name, codes in CUSTOMERS.items()
    }
    return toml_file(
        "the voyage's customers (written by `shorelink demo`; see deploy/spark/customers.toml)",
        {"customers": customers},
    )


def client_config(name: str, hq_bootstrap: str, ca_file: Path) -> str:
    """The customer's own file: HQ's Kafka, its principal, its password as ``${ENV}``."""
    kafka = {
        "bootstrap": hq_bootstrap,
        "ca_file": str(ca_file),
        "username": f"customer-{name}",
        "password": secret_ref("customer", name),
    }
    return toml_file(
        f"{name}'s consumer of headquarters (docs/access-control.md, \"A customer's consumer\")",
        {"sites": {HQ: {"streams": list(STREAMS), "kafka": kafka}}},
    )


def _consume(config: Path, customer: str, *extra: str) -> list[str]:
    argv = [sys.executable, "-m", "shorelink.cli", "consume", "--site", HQ]
    argv += ["--config", str(config), "--customer", customer]
    for s in STREAMS:
        argv += ["--stream", s]
    return [*argv, *extra]


class CustomerReader:
    """``shorelink consume --customer READER --follow`` for the whole voyage."""

    def __init__(self, config: Path, out: Path, name: str = READER) -> None:
        self.config, self.out, self.name = config, out, name
        self.proc: Proc | None = None
        self.series: list[list[float]] = []
        self.refusal: dict[str, Any] = {}

    def start(self) -> Proc:
        self.proc = Proc.start(
            f"customer:{self.name}", _consume(self.config, self.name, "--follow"), self.out
        )
        return self.proc

    def lines(self) -> list[dict[str, Any]]:
        out = []
        try:
            text = self.out.read_text(errors="replace")
        except FileNotFoundError:
            return []
        for line in text.splitlines():
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue  # a line being written
        return out

    def sample(self, t: float) -> None:
        self.series.append([round(t, 1), len(self.lines())])

    def wait_for(self, expected: int, timeout: float = 60.0) -> None:
        """Until the consumer printed ``expected`` records (it follows: give it time)."""
        deadline = time.monotonic() + timeout
        while len(self.lines()) < expected and time.monotonic() < deadline:
            time.sleep(1)

    def stop(self) -> None:
        if self.proc is not None and self.proc.alive():
            self.proc.stop(grace=10)

    def try_other(self, other: str = OTHER) -> None:
        """The same consumer, its own credentials, asking for another customer's stream."""
        try:
            done = subprocess.run(
                _consume(self.config, other, "--max", "1"),
                capture_output=True,
                text=True,
                timeout=120,
            )
            err = done.stderr.strip().splitlines()
            self.refusal = {
                "customer": other,
                "exit": done.returncode,
                "printed": sum(1 for ln in done.stdout.splitlines() if ln.startswith("{")),
                "error": err[-1] if err else "",
            }
        except subprocess.TimeoutExpired:
            self.refusal = {"customer": other, "exit": None, "printed": 0, "error": "timed out"}

    def summary(self, hq: Mapping[Ident, Arrival]) -> dict[str, Any]:
        """What the consumer printed against what HQ holds of the customer's containers."""
        codes = set(CUSTOMERS[self.name])
        expected = {ident for ident, a in hq.items() if ident[1] in STREAMS and a.key[:4] in codes}
        lines = self.lines()
        seen = Counter((r["origin"], r["stream"], int(r["seq"])) for r in lines)
        foreign = [r.get("key", "") for r in lines if str(r.get("key", ""))[:4] not in codes]
        alerts = sorted({str(r.get("key", "")) for r in lines if r["stream"] == "alerts"})
        refused = (
            self.refusal.get("exit") == 2
            and "not authorized" in self.refusal.get("error", "")
            and self.refusal.get("printed") == 0
        )
        return {
            "customer": self.name,
            "owner_codes": sorted(codes),
            "records": len(lines),
            "identities": len(seen),
            "duplicates": sum(n - 1 for n in seen.values() if n > 1),
            "expected": len(expected),
            "missing": len(expected - set(seen)),
            "foreign": len(foreign),
            "by_stream": dict(Counter(i[1] for i in seen)),
            "alerts_about": alerts,
            "containers": len({str(r.get("key", "")) for r in lines}),
            "refused_other": self.refusal,
            "refused_ok": refused,
            "series": self.series,
        }


def problems(summary: Mapping[str, Any]) -> Iterable[str]:
    name = summary["customer"]
    if summary["duplicates"]:
        yield f"customer {name}: {summary['duplicates']} records read twice"
    if summary["missing"]:
        yield f"customer {name}: {summary['missing']} of its records at {HQ} never reached it"
    if summary["foreign"]:
        yield f"customer {name}: read {summary['foreign']} records of other owners' containers"
    if not summary["refused_ok"]:
        yield f"customer {name}: was not refused {summary['refused_other']}"
