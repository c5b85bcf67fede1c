"""Helpers of the gateway tests (and of the end-to-end tests that run a gateway): a
config on loopback, a real gateway served in the test's event loop, batches, and what
``sl.ingress.*`` holds."""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import sys
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path

import aiohttp

from core_gateway.cli import serve
from core_gateway.config import GatewayConfig, parse_config
from local_stack.kafka import KafkaBroker
from local_stack.process import Proc, free_port
from local_stack.tls import make_authority
from shorelink.contract import H_ORIGIN, H_SEQ, canonical_topic, ingress_topic
from shorelink.fleet.entry import REGISTRY_STREAM
from shorelink.fleet.log import Registry
from shorelink.kafka.reading import read_to_end
from shorelink.kafka.topics import TopicSpec, ensure_topics
from shorelink.wire import Batch, WireRecord, encode_batch
from tests.helpers import eventually, run_process, unique

STREAMS = ("alerts", "nav", "containers")
#: the shipped sample config
SAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "gateway" / "gateway.toml"
#: the shipped ship keys file (every site's)
SHIP_KEYS_SAMPLE = SAMPLE.parents[1] / "spark" / "ship_keys.toml"


def sample_config(tmp_path: Path) -> Path:
    """The shipped sample, as an operator installs it: its TLS certificate and key made
    (by a CA of the test's own) where it names them, its ships file and the shipped
    ship keys file beside it."""
    authority = make_authority(tmp_path / "tls")
    server = authority.issue("gateway")
    text = (
        SAMPLE.read_text()
        .replace("/etc/shorelink/tls/gateway.crt", str(server.cert))
        .replace("/etc/shorelink/tls/gateway.key", str(server.key))
        .replace("/var/lib/shorelink/ships.json", "ships.json")
        .replace("/etc/shorelink/ship_keys.toml", str(tmp_path / "ship_keys.toml"))
    )
    (tmp_path / "ship_keys.toml").write_text(SHIP_KEYS_SAMPLE.read_text())
    config = tmp_path / "gateway.toml"
    config.write_text(text)
    return config


def gateway_config(
    tmp_path: Path,
    kafka: KafkaBroker,
    *,
    site: str = "tokyo",
    port: int | None = None,
    **limits: object,
) -> GatewayConfig:
    data: dict[str, object] = {
        "site": site,
        "credentials_file": str(tmp_path / "ships.json"),
        "streams": list(STREAMS),
        "listen": {"host": "127.0.0.1", "port": port or free_port(), "body_timeout": "2s"},
        "metrics": {"port": free_port()},
        "kafka": {
            "bootstrap": kafka.bootstrap,
            "transactional_id": unique("gw"),
            "ingress_partitions": 2,
            "timeout": "20s",
        },
        "limits": dict(limits),
    }
    return parse_config(data)


def metrics_url(cfg: GatewayConfig) -> str:
    """The gateway's metrics listener (``[metrics]``), with no path."""
    return f"http://{cfg.metrics_host}:{cfg.metrics_port}"


@dataclass
class RunningGateway:
    cfg: GatewayConfig
    url: str
    ship: str
    token: str

    @property
    def metrics_url(self) -> str:
        """Where Prometheus and the probes reach this gateway (``[metrics]``)."""
        return metrics_url(self.cfg)

    def headers(self, token: str | None = None) -> dict[str, str]:
        return {
            "Authorization": f"Bearer {token or self.token}",
            "Content-Type": "application/x-shorelink-batch",
        }


@contextlib.asynccontextmanager
async def registry_gateway(
    tmp_path: Path, kafka: KafkaBroker
) -> AsyncIterator[tuple[GatewayConfig, Registry]]:
    """A gateway following the fleet registry at its site (``fleet_pub_file``: no
    credentials file), and headquarters' registry (``tmp_path/registry``) it pins."""
    ensure_topics(kafka.endpoint, [TopicSpec(canonical_topic(REGISTRY_STREAM), partitions=1)])
    reg = Registry.init(tmp_path / "registry")
    cfg = replace(
        gateway_config(tmp_path, kafka),
        credentials_file=None,
        fleet_pub_file=reg.directory / "fleet.pub",
    )
    stop = asyncio.Event()
    task = await start_gateway(cfg, stop)
    try:
        yield cfg, reg
    finally:
        stop.set()
        await task


async def start_gateway(
    cfg: GatewayConfig, stop: asyncio.Event, ca: Path | None = None
) -> asyncio.Task[None]:
    """Serve ``cfg`` (a real aiohttp server) until ``stop`` is set; returns the serving
    task once the gateway listens and answers /readyz with 200 (over HTTPS, trusting
    only ``ca``, when given)."""
    started = asyncio.Event()
    task = asyncio.create_task(serve(cfg, install_signals=False, started=started, stop=stop))
    waiter = asyncio.create_task(started.wait())
    await asyncio.wait([waiter, task], timeout=30, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        task.result()  # raises what went wrong
    assert started.is_set(), "gateway did not start listening"
    scheme = "https" if ca is not None else "http"
    tls = ssl.create_default_context(cafile=str(ca)) if ca is not None else None
    async with aiohttp.ClientSession() as s:
        for _ in range(300):
            async with s.get(f"{scheme}://127.0.0.1:{cfg.port}/readyz", ssl=tls or True) as r:
                if r.status == 200:
                    break
            await asyncio.sleep(0.1)
    return task


def records(lo: int, hi: int, key_mod: int = 5) -> tuple[WireRecord, ...]:
    return tuple(
        WireRecord(
            seq,
            f"C{seq % key_mod}",
            1_700_000_000_000 + seq * 1000,
            f"bigblue/d1/containers/C{seq % key_mod}/env",
            json.dumps({"seq": seq, "t": 4.5}).encode(),
        )
        for seq in range(lo, hi + 1)
    )


def batch(
    ship: str, lo: int, hi: int, stream: str = "containers", first_available: int = 1
) -> bytes:
    return encode_batch(Batch(ship, stream, records(lo, hi), first_available=first_available))


def ingress_seqs(kafka: KafkaBroker, ship: str, stream: str = "containers") -> Counter[int]:
    """How often each seq of ``ship`` is in sl.ingress.<stream> (read_committed)."""
    out: Counter[int] = Counter()
    for m in read_to_end(kafka.endpoint, [ingress_topic(stream)], settled=True):
        h = dict(m.headers() or [])
        if h.get(H_ORIGIN) == ship.encode():
            out[int(h[H_SEQ])] += 1
    return out


def settled_ingress_seqs(
    kafka: KafkaBroker, ship: str, expected: range, stream: str = "containers"
) -> Counter[int]:
    """:func:`ingress_seqs` once every seq in ``expected`` is visible. A gateway's
    commit returns when Kafka has recorded it, and the markers that make its records
    readable (read_committed) reach their partitions just after: a read at once may
    miss the tail of the last transaction, never what comes later."""
    seqs: Counter[int] = Counter()

    def settled() -> bool:
        seqs.clear()
        seqs.update(ingress_seqs(kafka, ship, stream))
        return all(s in seqs for s in expected)

    with contextlib.suppress(AssertionError):  # the asserts after say what is missing
        eventually(settled, 30, f"{ship}'s seqs {expected} visible in sl.ingress.{stream}")
    return seqs


def assert_exactly_once(
    kafka: KafkaBroker, ship: str, last: int, stream: str = "containers"
) -> None:
    """sl.ingress.<stream> holds every seq 1..``last`` of ``ship`` exactly once."""
    seqs = settled_ingress_seqs(kafka, ship, range(1, last + 1), stream)
    assert sorted(seqs) == list(range(1, last + 1)), "gap (or extra seqs) in sl.ingress"
    assert max(seqs.values(), default=1) == 1, "an identity was written twice"


def run_gateway(config: Path, log: Path) -> Proc:
    """``shorelink-gateway run`` in its own process group (tests.helpers harness)."""
    gw = str(Path(sys.executable).parent / "shorelink-gateway")
    return run_process("gateway", [gw, "run", "--config", str(config)], log)


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def wait_ready(proc: Proc, port: int, within: float = 60) -> None:
    """Until ``/readyz`` answers 200; fails at once with the log's tail if it exits."""
    eventually(lambda: _ready(port), within, "the gateway ready", proc=proc, interval=0.1)
