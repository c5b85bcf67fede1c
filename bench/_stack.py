"""What the uplink benchmarks (``gateway_ingest.py``, ``link_drain.py``) share: the
stack on loopback (a single-node Kafka from ``local_stack.kafka``, the gateway as a
process of its own, toxiproxy when a link is wanted), the container telemetry they
send, the HttpGateway uploads that push records flat out, reading Prometheus metrics,
and the exactly-once check of ``sl.ingress.<stream>``.

With ``secure``, the stack is what a site runs in production (docs/access-control.md):
Kafka with SASL/SCRAM over TLS and ACLs, the gateway writing as its own principal and
serving HTTPS, ships verifying it against the stack's CA.

Run as a script, it is the gateway process (``--role gateway --config FILE``): ship and
shore do not share a CPU or a GIL in production either.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import secrets
import shutil
import signal
import ssl
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import tomli_w
from _common import get_json
from telemetry import Container, fleet

from edge_agent.gateway import SendResult
from local_stack.kafka import BrokerSecurity, KafkaBroker, start_kafka
from local_stack.process import Proc, free_port, stop_procs
from local_stack.tls import make_authority
from local_stack.toxiproxy import Toxiproxy, start_toxiproxy
from shorelink.config import Secret
from shorelink.errors import ShorelinkError
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.wire import WireRecord

SITE = "tokyo"
STREAM = "containers"
CONTAINERS = 1000
INGRESS_PARTITIONS = 6  # the gateway's default
REPO = Path(__file__).resolve().parent.parent

GATEWAY_USER = "gateway-bench"


# -- the workload: container telemetry -----------------------------------------------------
def fleet_in_arrival_order(rng: random.Random, n: int = CONTAINERS) -> list[Container]:
    return sorted(fleet(rng, n), key=lambda c: c.phase_ms)  # arrival order within a minute


def readings(ship: str, n: int, seed: int, end_ms: int) -> Iterator[tuple[str, int, str, bytes]]:
    """``n`` readings ``(key, ts_ms, topic, payload)`` in arrival order: every container
    once a minute, the last minute ending at ``end_ms``."""
    rng = random.Random(seed)
    boxes = fleet_in_arrival_order(rng)
    minutes = math.ceil(n / len(boxes))
    start = end_ms - minutes * 60_000
    done = 0
    for minute in range(minutes):
        for c in boxes:
            if done == n:
                return
            ts = start + minute * 60_000 + c.phase_ms
            yield c.id, ts, c.topic(ship), c.reading(rng, ts)
            done += 1


def wire_records(ship: str, first: int, n: int, seed: int) -> list[WireRecord]:
    """``n`` readings of ``ship`` as wire records, seqs from ``first``."""
    return [
        WireRecord(first + i, key, ts, topic, payload)
        for i, (key, ts, topic, payload) in enumerate(
            readings(ship, n, seed, int(time.time() * 1000))
        )
    ]


# -- processes ---------------------------------------------------------------------------
def start_role(script: str, role: str, name: str, config: Path, logs: Path, *extra: str) -> Proc:
    """``script`` (a benchmark here) run again as one of its roles, in a process of its own."""
    argv = [sys.executable, script, "--role", role, "--config", str(config), *extra]
    return Proc.start(name, argv, logs / f"{name}.log", cwd=REPO)


async def gateway_role(config: Path) -> None:
    from core_gateway.cli import serve
    from core_gateway.config import load_config as load_gateway_config
    from shorelink.logs import configure_logging

    cfg = load_gateway_config(config)
    configure_logging(cfg.log_level)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await serve(cfg, install_signals=False, started=asyncio.Event(), stop=stop)


class Stack:
    """Kafka, toxiproxy (``link=True``) and the gateway, with a token for each of
    ``ships``; :meth:`cleanup` stops every process started here or added to ``procs``."""

    def __init__(
        self,
        work: Path,
        ships: list[str],
        say: Callable[[str], None],
        *,
        link: bool = False,
        secure: bool = False,
        limits: dict[str, Any] | None = None,
        streams: tuple[str, ...] = ("alerts", "nav", "containers"),
        ingress_by_origin: bool = False,
    ) -> None:
        self.work = work
        #: the gateway's ``kafka.ingress_by_origin`` (a site whose merge is split by origin)
        self.ingress_by_origin = ingress_by_origin
        #: the gateway's streams (its ``streams``)
        self.streams = streams
        #: the gateway's ``[limits]`` besides its defaults
        self.limits = dict(limits or {})
        self.secure = secure
        self.security: BrokerSecurity | None = None
        self.logs = work / "logs"
        self.ships = ships
        self.say = say
        self.link = link
        self.procs: list[Proc] = []
        self.kafka: KafkaBroker | None = None
        self.toxiproxy: Toxiproxy | None = None
        self.gateway: Proc | None = None
        self.gw_port = free_port()
        self.gw_metrics_port = free_port()
        self.tokens: dict[str, str] = {}

    @property
    def gw_url(self) -> str:
        return f"{'https' if self.secure else 'http'}://127.0.0.1:{self.gw_port}"

    @property
    def gw_metrics_url(self) -> str:
        """The gateway's metrics listener (``[metrics]``: /metrics, /readyz), plain HTTP."""
        return f"http://127.0.0.1:{self.gw_metrics_port}"

    @property
    def endpoint(self) -> KafkaEndpoint:
        """How the benchmark's own clients (a bare producer, the exactly-once read)
        reach Kafka: as the super user, over TLS when the stack is secure."""
        assert self.kafka is not None
        return self.kafka.endpoint

    @property
    def ca_file(self) -> Path | None:
        return self.security.authority.ca_cert if self.security else None

    def client_tls(self) -> ssl.SSLContext | None:
        """For HTTPS requests to the gateway's ships' port (its /readyz)."""
        return ssl.create_default_context(cafile=str(self.ca_file)) if self.secure else None

    @property
    def bootstrap(self) -> str:
        assert self.kafka is not None
        return self.kafka.bootstrap

    def cleanup(self) -> None:
        stop_procs([p for p in self.procs if p.alive()], grace=20)

    def start(self) -> None:
        from core_gateway.auth import Credentials

        say = self.say
        say("starting kafka" + (" (SASL/SCRAM over TLS, ACLs)" if self.secure else ""))
        if self.secure:
            self.security = BrokerSecurity(
                make_authority(self.work / "tls"), secrets.token_urlsafe(16)
            )
        try:
            self.kafka = start_kafka(SITE, self.work / "kafka", self.logs, security=self.security)
        except ShorelinkError as exc:
            if "storage format failed" not in str(exc):
                raise
            # a random cluster id that starts with "-" reads as an option to
            # kafka-storage (local_stack/kafka.py): a new id is one retry away
            say("kafka: storage format failed (cluster id?); once more")
            shutil.rmtree(self.work / "kafka", ignore_errors=True)
            self.kafka = start_kafka(SITE, self.work / "kafka", self.logs, security=self.security)
        self.procs.append(self.kafka.proc)
        say(f"kafka at {self.kafka.bootstrap}")
        if self.link:
            say("starting toxiproxy")
            server = start_toxiproxy(self.logs)
            self.procs.append(server.proc)
            self.toxiproxy = server.client()
        creds = Credentials(self.work / "gateway" / "ships.json")
        for ship in self.ships:
            self.tokens[ship] = creds.add(ship)
        config = self.work / "gateway" / "gateway.toml"
        txn = f"bench-gateway-{SITE}"
        doc: dict[str, Any] = {
            "site": SITE,
            "credentials_file": str(creds.path),
            "streams": list(self.streams),
            "log_level": "info",
            "listen": {"host": "127.0.0.1", "port": self.gw_port},
            "metrics": {"host": "127.0.0.1", "port": self.gw_metrics_port},
            "kafka": {
                "bootstrap": self.kafka.bootstrap,
                "transactional_id": txn,
                "ingress_partitions": INGRESS_PARTITIONS,
                **({"ingress_by_origin": True} if self.ingress_by_origin else {}),
            },
            "limits": self.limits,
        }
        if self.security is not None:
            self._secure_gateway(doc, txn)
        config.write_text(tomli_w.dumps(doc))
        config.chmod(0o600)
        self.gateway = start_role(__file__, "gateway", "gateway", config, self.logs)
        self.procs.append(self.gateway)

        def ready() -> bool:
            try:
                return bool(
                    get_json(self.gw_url + "/readyz", context=self.client_tls()).get("ready")
                )
            except (OSError, ValueError):
                return False

        self.gateway.wait_ready(ready, timeout=90)
        say(f"gateway ready at {self.gw_url}")

    def _secure_gateway(self, doc: dict[str, Any], transactional_id: str) -> None:
        """The gateway's principal and ACLs (spark_core/access.py), its certificate,
        and the config keys for both, added to ``doc``."""
        from spark_core.access import AccessPlan, apply_access, grant_gateway

        assert self.kafka is not None and self.security is not None
        password = secrets.token_urlsafe(16)
        plan = AccessPlan(SITE)
        grant_gateway(plan, GATEWAY_USER, Secret(password), transactional_id)
        apply_access(plan, self.kafka.endpoint)
        cert = self.security.authority.issue("gateway-bench")
        doc["listen"] |= {"tls_cert_file": str(cert.cert), "tls_key_file": str(cert.key)}
        doc["kafka"] |= {
            "username": GATEWAY_USER,
            "password": password,
            "ca_file": str(self.security.authority.ca_cert),
        }

    async def upload(
        self, bodies: dict[str, list[bytes]], last: dict[str, int], window: int
    ) -> tuple[float, list[float]]:
        """Every ship's batches through the edge agent's own client (``HttpGateway``:
        the WebSocket upload), ``window`` batches in flight per ship; each ship's
        holdings must end at ``last[ship]``. Returns seconds taken and each send's ms."""
        from edge_agent.config import DEFAULT_LINKS, GatewayEndpoint
        from edge_agent.gateway import HttpGateway
        from shorelink.config import Secret

        lat: list[float] = []
        link = replace(DEFAULT_LINKS["port_wifi"], timeout_s=120.0)

        async def one_ship(ship: str) -> None:
            gw = HttpGateway(
                GatewayEndpoint(SITE, self.gw_url, "port_wifi", ca_file=self.ca_file),
                link,
                ship,
                Secret(self.tokens[ship]),
            )
            slots = asyncio.Semaphore(window)

            async def send(body: bytes) -> SendResult:
                async with slots:
                    t = time.perf_counter()
                    res = await gw.send(STREAM, body)
                    lat.append((time.perf_counter() - t) * 1000)
                    return res

            try:
                results = await asyncio.gather(*(send(b) for b in bodies[ship]))
            finally:
                await gw.close()
            if results[-1].held.contiguous_end() != last[ship]:
                raise RuntimeError(f"upload: {ship}: the gateway holds {results[-1].held}")

        t0 = time.perf_counter()
        await asyncio.gather(*(one_ship(s) for s in bodies))
        return time.perf_counter() - t0, lat

    def verify(
        self, expected: dict[str, int], stream: str = STREAM, topic: str | None = None
    ) -> tuple[bool, dict[str, dict[str, int]], float]:
        """Read ``topic`` (default ``sl.ingress.<stream>``) to its end (read_committed):
        whether every origin of ``expected`` (origin -> last seq) has each seq 1..last
        exactly once, per origin seqs distinct, missing, doubled, unexpected, and the
        seconds the read took."""
        from shorelink.contract import ingress_topic

        t0 = time.monotonic()
        topic = topic or ingress_topic(stream)
        self.say(f"verify: reading {topic} to its end")
        counts, _ = read_identities(self.endpoint, topic)
        ok, detail = check_once(counts, expected)
        totals = {
            k: sum(d[k] for d in detail.values()) for k in ("missing", "doubled", "unexpected")
        }
        self.say(f"verify: exactly once = {ok} ({len(detail)} origins; {totals})")
        return ok, detail, round(time.monotonic() - t0, 1)


def read_identities(
    endpoint: KafkaEndpoint, topic: str
) -> tuple[dict[str, Counter[int]], list[float]]:
    """``topic`` read to its end (read_committed): per origin, how often each seq came;
    and for each record that carries ``sl.entered`` (a canonical topic's), the ms from
    the gateway's write to this one's (its Kafka timestamp): the merge's lag."""
    from shorelink.contract import H_ENTERED, H_ORIGIN, H_SEQ
    from shorelink.kafka.reading import read_to_end, written_ms

    counts: dict[str, Counter[int]] = {}
    lags: list[float] = []
    entered = H_ENTERED
    for msg in read_to_end(endpoint, [topic], timeout=300):
        h = dict(msg.headers() or [])
        counts.setdefault(h[H_ORIGIN].decode(), Counter())[int(h[H_SEQ])] += 1
        if entered in h:
            at = written_ms(msg)
            if at is not None:
                lags.append(at - int(h[entered]))
    return counts, lags


def check_once(
    counts: dict[str, Counter[int]], expected: dict[str, int]
) -> tuple[bool, dict[str, dict[str, int]]]:
    """Whether every origin of ``expected`` (origin -> last seq) came with each seq
    1..last exactly once in ``counts``; per origin seqs distinct, missing, doubled,
    unexpected."""

    def check(origin: str, last: int) -> dict[str, int]:
        c = counts.get(origin, Counter())
        return {
            "expected": last,
            "distinct": len(c),
            "missing": sum(1 for s in range(1, last + 1) if s not in c),
            "doubled": sum(1 for v in c.values() if v > 1),
            "unexpected": sum(1 for s in c if not 1 <= s <= last),
        }

    detail = {origin: check(origin, last) for origin, last in expected.items()}
    ok = all(
        d["distinct"] == d["expected"] and not d["doubled"] and not d["unexpected"]
        for d in detail.values()
    )
    return ok, detail


# -- the site's application ---------------------------------------------------------------
class SiteApp:
    """The site's Spark application on a :class:`Stack`'s Kafka, as ``shorelink-spark
    site`` runs it in production (its own spark-submit, local mode): the merges of the
    site's streams (the ingest puller and the backstop query; ``merge-urgent`` for the
    alerts) into the canonical topics, the tables. Started after the gateway (which made
    its own topics); the rest of the site's topics made first, as ``topics apply`` does.
    ``merge``: the sites file's ``[sites.S.merge]`` keys besides the defaults. With
    ``shards`` above 1, the merge split by origin: one application per shard
    (``--shard k/N``), the tables in shard 0's. Stopped with the stack (each is in
    ``stack.procs``)."""

    def __init__(
        self,
        stack: Stack,
        streams: tuple[str, ...],
        *,
        driver_memory: str = "1g",
        merge: dict[str, Any] | None = None,
        shards: int = 1,
    ) -> None:
        self.stack = stack
        self.streams = streams
        self.driver_memory = driver_memory
        self.shards = shards
        self.merge = dict(merge or {}) | ({"shards": shards} if shards > 1 else {})
        self.root = stack.work / "site"
        self.config = self.root / "sites.toml"
        self.procs: list[Proc] = []

    @property
    def pid(self) -> int:
        """Shard 0's application (the only one of a merge not split)."""
        return self.procs[0].pid

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def state_dirs(self) -> list[Path]:
        """Where each application keeps its status files."""
        base = self.root / "checkpoints"
        if self.shards == 1:
            return [base]
        return [base / f"shard-{k}of{self.shards}" for k in range(self.shards)]

    def sites_file(self) -> dict[str, Any]:
        return {
            "log_level": "warning",
            "spark": {
                "master": "local[2]",
                "driver_memory": self.driver_memory,
                "conf": {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"},
            },
            "sites": {
                SITE: {
                    "streams": list(self.streams),
                    "checkpoint_dir": str(self.root / "checkpoints"),
                    "table_dir": str(self.root / "tables"),
                    "trigger_interval": "1s",
                    "kafka": {"bootstrap": self.stack.bootstrap},
                    "merge": self.merge,
                }
            },
        }

    def start(self, timeout: float = 300.0) -> float:
        """Start it and wait until its merge reports; the seconds that took."""
        from spark_core.config import load_config
        from spark_core.topics import apply_topics, site_specs

        self.root.mkdir(parents=True, exist_ok=True)
        self.config.write_text(tomli_w.dumps(self.sites_file()))
        apply_topics(self.stack.endpoint, site_specs(load_config(self.config), SITE))
        self.stack.say(f"starting the site's application (spark-submit; {self.shards} shard(s))")
        t0 = time.monotonic()
        argv = [sys.executable, "-m", "spark_core.cli", "site", "--site", SITE]
        argv += ["--config", str(self.config)]
        for k in range(self.shards):
            shard = [] if self.shards == 1 else ["--shard", f"{k}/{self.shards}"]
            proc = Proc.start(
                f"site{k or ''}", [*argv, *shard], self.stack.logs / f"site{k}.log", cwd=REPO
            )
            self.procs.append(proc)
            self.stack.procs.append(proc)
        suffix = "" if self.shards == 1 else "-o{k}of{n}"
        for k, (proc, state) in enumerate(zip(self.procs, self.state_dirs(), strict=True)):
            status = state / f"merge{suffix.format(k=k, n=self.shards)}.status.json"
            proc.wait_ready(status.exists, timeout=timeout)
        took = round(time.monotonic() - t0, 1)
        self.stack.say(f"the site's application merges ({took} s to start)")
        return took


def wait_merged(
    endpoint: KafkaEndpoint,
    expected: dict[tuple[str, str], int],
    timeout: float,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """Follow the site's ledger (``sl.ledger``: what its merge holds per ``(origin,
    stream)``, written in the merge's transactions) until every ``(origin, stream)`` of
    ``expected`` holds seqs 1..last, or ``timeout``: the epoch ms of the first entry
    and of the entry that completed the last one (Kafka timestamps: when the merge
    wrote them), and how many were complete."""
    from shorelink.contract import LEDGER_TOPIC
    from shorelink.kafka.reading import read_to_end, written_ms
    from shorelink.ledger import decode_entry
    from shorelink.ranges import RangeSet

    want = {k: RangeSet([(1, last)]) for k, last in expected.items()}
    done: dict[tuple[str, str], int] = {}
    starts: dict[tuple[str, int], int] = {}
    first_ms: int | None = None
    deadline = time.monotonic() + timeout
    said = time.monotonic()
    while len(done) < len(want) and time.monotonic() < deadline:
        for msg in read_to_end(endpoint, [LEDGER_TOPIC], starts=starts, timeout=60):
            starts[(msg.topic() or "", msg.partition() or 0)] = (msg.offset() or 0) + 1
            origin, stream, held = decode_entry(msg.key(), msg.value())
            at = written_ms(msg) or 0
            first_ms = at if first_ms is None else min(first_ms, at)
            key = (origin, stream)
            if key in want and key not in done and held.contains_all(want[key]):
                done[key] = at
        if time.monotonic() - said > 10:
            said = time.monotonic()
            say(f"merge: {len(done)}/{len(want)} (origin, stream) complete")
        if len(done) < len(want):
            time.sleep(0.5)
    return {
        "complete": len(done),
        "expected": len(want),
        "first_ms": first_ms,
        "last_ms": max(done.values(), default=None),
    }


if __name__ == "__main__":
    p = argparse.ArgumentParser(description="the benchmarks' gateway process")
    p.add_argument("--role", choices=("gateway",), required=True)
    p.add_argument("--config", type=Path, required=True)
    args = p.parse_args()
    asyncio.run(gateway_role(args.config))
