"""A gateway killed mid-write must leave neither a doubled identity nor a gap; and the
operator commands work."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from core_gateway.auth import Credentials
from edge_agent.config import GatewayEndpoint, LinkConfig
from edge_agent.errors import LinkError
from edge_agent.gateway import HttpGateway
from local_stack.kafka import KafkaBroker
from local_stack.process import Proc, free_port
from shorelink.config import Secret
from tests.core_gateway.helpers import assert_exactly_once, batch, run_gateway, wait_ready
from tests.helpers import kill9, run_process, unique, write_toml

GW = [sys.executable, "-m", "core_gateway.cli"]


def _write_config(tmp_path: Path, kafka: KafkaBroker, port: int) -> Path:
    return write_toml(
        tmp_path / "gateway.toml",
        {
            "site": "tokyo",
            "credentials_file": "ships.json",
            "streams": ["containers"],
            "listen": {"host": "127.0.0.1", "port": port},
            "metrics": {"port": free_port()},
            "kafka": {
                "bootstrap": kafka.bootstrap,
                "transactional_id": unique("gw"),
                "timeout": "10s",
            },
        },
    )


def _request(
    method: str, url: str, token: str, body: bytes | None = None
) -> tuple[int, dict[str, object]]:
    req = urllib.request.Request(
        url,
        data=body,
        method=method,
        headers={
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/x-shorelink-batch",
        },
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def _popen(proc: Proc) -> subprocess.Popen[bytes]:
    assert proc.popen is not None
    return proc.popen


def test_gateway_kill9_during_uploads_leaves_every_identity_once(
    tmp_path: Path, kafka: KafkaBroker
) -> None:
    port = free_port()
    cfg = _write_config(tmp_path, kafka, port)
    ship = unique("ship")
    token = Credentials(tmp_path / "ships.json").add(ship)
    url = f"http://127.0.0.1:{port}/v1/ships/{ship}"
    rng = random.Random(3)
    total = 6000
    proc = run_gateway(cfg, tmp_path / "gw.log")
    kills = 0
    try:
        wait_ready(proc, port)
        next_seq = 1
        while next_seq <= total:
            size = rng.randint(50, 400)
            hi = min(total, next_seq + size - 1)
            if rng.random() < 0.15 and kills < 8:
                # kill the gateway while this batch is on its way
                body = batch(ship, next_seq, hi)
                killer = run_process(
                    "killer",
                    ["sh", "-c", f"sleep {rng.uniform(0, 0.05):.3f}; kill -9 {proc.pid}"],
                    tmp_path / "killer.log",
                )
                with contextlib.suppress(OSError):
                    _request("POST", f"{url}/streams/containers/batches", token, body)
                _popen(killer).wait()
                _popen(proc).wait(10)
                kills += 1
                proc = run_gateway(cfg, tmp_path / "gw.log")
                wait_ready(proc, port)
            else:
                with contextlib.suppress(OSError):
                    _request(
                        "POST",
                        f"{url}/streams/containers/batches",
                        token,
                        batch(ship, next_seq, hi),
                    )
            # like the uplink: continue from what the site says it holds
            status, body = _request("GET", f"{url}/holdings", token)
            assert status == 200
            held = str(body["streams"]["containers"])  # type: ignore[index]
            next_seq = int(held.split("-")[-1]) + 1 if held else 1
            assert "," not in held, f"holdings have a gap: {held}"
    finally:
        if proc.alive():
            kill9(proc)
    assert kills >= 3
    assert_exactly_once(kafka, ship, total)


async def test_gateway_kill9_during_pipelined_uploads_leaves_every_identity_once(
    tmp_path: Path, kafka: KafkaBroker
) -> None:
    """The edge agent's client (one WebSocket, four batches in flight, several per Kafka
    transaction) against a gateway killed at random moments: what the holdings say
    after each restart is exactly what Kafka has, once, without a gap."""
    port = free_port()
    cfg = _write_config(tmp_path, kafka, port)
    ship = unique("ship")
    token = Credentials(tmp_path / "ships.json").add(ship)
    link = LinkConfig("port_wifi", timeout_s=10.0, in_flight=4)
    gw = HttpGateway(
        GatewayEndpoint("tokyo", f"http://127.0.0.1:{port}", "port_wifi"),
        link,
        ship,
        Secret(token),
    )
    rng = random.Random(5)
    total, kills = 20_000, 0
    proc = run_gateway(cfg, tmp_path / "gw.log")
    loop = asyncio.get_running_loop()
    try:
        await asyncio.to_thread(wait_ready, proc, port)
        while True:
            held = (await gw.holdings())["containers"]
            assert len(held) <= 1, f"holdings have a gap: {held}"
            next_seq = held.contiguous_end() + 1
            if next_seq > total:
                break
            bodies = []
            for _ in range(rng.randint(2, 8)):
                hi = min(total, next_seq + rng.randint(100, 600) - 1)
                bodies.append(batch(ship, next_seq, hi))
                next_seq = hi + 1
                if next_seq > total:
                    break
            killed = kills < 6 and rng.random() < 0.7
            if killed:
                loop.call_later(rng.uniform(0, 0.15), _popen(proc).send_signal, signal.SIGKILL)
            window = asyncio.Semaphore(link.in_flight)

            async def send(body: bytes, window: asyncio.Semaphore = window) -> None:
                async with window:
                    with contextlib.suppress(LinkError):
                        await gw.send("containers", body)

            await asyncio.gather(*(send(b) for b in bodies))
            if killed:
                await asyncio.to_thread(_popen(proc).wait, 10)
                kills += 1
                await gw.reset()
                proc = run_gateway(cfg, tmp_path / "gw.log")
                await asyncio.to_thread(wait_ready, proc, port)
    finally:
        await gw.close()
        if proc.alive():
            kill9(proc)
    assert kills >= 3
    assert_exactly_once(kafka, ship, total)


def test_ships_add_list_revoke_cli(tmp_path: Path, kafka: KafkaBroker) -> None:
    cfg = _write_config(tmp_path, kafka, free_port())
    add = subprocess.run(
        [*GW, "ships", "add", "bigblue", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    token = add.stdout.strip()
    assert token.startswith("slk_") and len(token) > 40
    stored = (tmp_path / "ships.json").read_text()
    assert token not in stored and "sha256:" in stored
    assert (tmp_path / "ships.json").stat().st_mode & 0o077 == 0
    lst = subprocess.run(
        [*GW, "ships", "list", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert ["bigblue", "active"] in [ln.split()[:2] for ln in lst.stdout.splitlines()]
    assert token not in lst.stdout
    subprocess.run(
        [*GW, "ships", "revoke", "bigblue", "--config", str(cfg)],
        check=True,
        timeout=60,
        capture_output=True,
    )
    assert Credentials(tmp_path / "ships.json").ship_for_token(token) is None
    bad = subprocess.run(
        [*GW, "ships", "revoke", "nobody", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "no credential" in bad.stderr
    for cmd in ([], ["run"], ["ships"], ["ships", "add"], ["check-config"]):
        res = subprocess.run([*GW, *cmd, "--help"], capture_output=True, text=True, timeout=60)
        assert res.returncode == 0 and "Usage:" in res.stdout
