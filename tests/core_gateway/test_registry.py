"""A gateway following the fleet registry at its site (``fleet_pub_file``; docs/
fleet-registry.md, "How it travels"): no credentials file, no ship keys file. A ship
provisioned at headquarters uploads once the registry's entries reach the site's
``sl.registry``, without a file copied or a restart; a revoked ship's token is refused
from its entry on; a forged or replayed entry in the topic is refused, counted and never
stops the genuine entries after it. The records are written here as the site's merge
writes them (spark_core's part is tested in tests/spark_core/test_registry_travel.py)."""

from __future__ import annotations

import asyncio
import io
import re
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path

import aiohttp
import pytest

from local_stack.kafka import KafkaBroker
from local_stack.tls import make_authority
from shorelink.contract import canonical_topic, contract_headers
from shorelink.fleet.bundle import provision
from shorelink.fleet.entry import FLEET_ORIGIN, REGISTRY_STREAM, FleetKey, sign_entry
from shorelink.fleet.log import Registry
from shorelink.fleet.travel import entry_record
from shorelink.kafka.topics import TopicSpec, ensure_topics, producer
from shorelink.proof import ShipKey
from shorelink.tls import TlsFile, client_context
from shorelink.wire import Batch, encode_batch
from tests.core_gateway.helpers import metrics_url, records, registry_gateway, start_gateway
from tests.helpers import unique
from tests.tls_helpers import tls_gateway_config

TOPIC = canonical_topic(REGISTRY_STREAM)


@dataclass
class Site:
    """A gateway following a registry, and headquarters' registry beside it."""

    url: str
    metrics: str
    registry: Registry
    kafka: KafkaBroker

    def deliver(self, *raw: tuple[bytes, bytes, list[tuple[str, str | bytes | None]]]) -> None:
        """Write records into the site's ``sl.registry`` as its merge would."""
        p = producer(self.kafka.endpoint)
        for key, value, headers in raw:
            p.produce(TOPIC, value, key, headers=headers)
        assert p.flush(20) == 0

    def deliver_new(self, since: int) -> int:
        """Every entry past ``since``, as the merge writes what replication brought."""
        key = self.registry.fleet_key()
        self.registry.refresh()
        entries = [e for e in self.registry.entries() if e.version > since]
        self.deliver(*(entry_record(e, key, "hq") for e in entries))
        return self.registry.state.version

    async def health(self, s: aiohttp.ClientSession) -> dict[str, object]:
        async with s.get(f"{self.metrics}/healthz") as r:
            return await r.json()

    async def enforces(self, s: aiohttp.ClientSession, version: int, within: float = 20) -> None:
        deadline = time.monotonic() + within
        while True:
            reg = (await self.health(s)).get("registry")
            if isinstance(reg, dict) and reg["version"] == version:
                return
            assert time.monotonic() < deadline, f"registry {version} not enforced: {reg}"
            await asyncio.sleep(0.05)


@pytest.fixture
async def site(tmp_path: Path, kafka: KafkaBroker) -> AsyncIterator[Site]:
    async with registry_gateway(tmp_path, kafka) as (cfg, reg):
        yield Site(f"http://127.0.0.1:{cfg.port}", metrics_url(cfg), reg, kafka)


def _ship(reg: Registry, tmp: Path) -> tuple[str, str, ShipKey]:
    name = unique("ship")
    bundle = provision(reg, name, ["north"], out=tmp / name)
    return name, (bundle / "gateway.token").read_text().strip(), ShipKey.load(bundle / "ship.key")


async def _upload(
    s: aiohttp.ClientSession,
    url: str,
    ship: str,
    token: str,
    key: ShipKey,
    lo: int,
    tls: ssl.SSLContext | None = None,
) -> int:
    body = encode_batch(Batch(ship, "containers", records(lo, lo + 4)), key=key)
    headers = {
        "Authorization": f"Bearer {token}",
        "Content-Type": "application/x-shorelink-batch",
    }
    post = f"{url}/v1/ships/{ship}/streams/containers/batches"
    async with s.post(post, data=io.BytesIO(body), headers=headers, ssl=tls or True) as r:
        return r.status


async def test_ships_provisioned_at_hq_upload_and_bad_entries_are_refused_not_blocking(
    site: Site, tmp_path: Path
) -> None:
    """What the registry says at headquarters is what a site's gateway enforces, with no
    file copied: a new ship uploads, a revoked one cannot, and an entry someone slipped
    into the topic neither applies nor stops the genuine entries behind it."""
    reg = site.registry
    a, a_token, a_key = _ship(reg, tmp_path)
    async with aiohttp.ClientSession() as s:
        assert await _upload(s, site.url, a, a_token, a_key, 1) == 401  # not known yet
        at = site.deliver_new(0)
        await site.enforces(s, at)
        assert await _upload(s, site.url, a, a_token, a_key, 1) == 200

        # a ship provisioned later: taken as soon as its entries arrive, no restart
        b, b_token, b_key = _ship(reg, tmp_path)
        at = site.deliver_new(at)
        await site.enforces(s, at)
        assert await _upload(s, site.url, b, b_token, b_key, 1) == 200
        assert await _upload(s, site.url, b, b_token, ShipKey.generate(), 6) == 403

        # forged (another key, at the next version) and replayed (entry 2 again)
        reg.refresh()
        thief = FleetKey.generate()
        forged = sign_entry(thief, at + 1, reg.state.head, "ship_revoked", {"ship": b})
        site.deliver(
            _raw(forged.raw, at + 1), entry_record(reg.entries()[1], reg.fleet_key(), "hq")
        )
        reg.append([("ship_revoked", {"ship": a})])
        at = site.deliver_new(at)
        await site.enforces(s, at)
        health = await site.health(s)
        assert health["registry"] == {"version": at, "refused": 2}
        assert await _upload(s, site.url, a, a_token, a_key, 6) == 401  # revoked
        assert await _upload(s, site.url, b, b_token, b_key, 6) == 200  # the forgery did not
        async with s.get(f"{site.metrics}/metrics") as r:
            text = await r.text()
        # what was refused, why and when, readable outside the process
        async with s.get(f"{site.metrics}/registry") as r:
            assert r.status == 200
            shown = await r.json()
        async with s.get(f"{site.url}/registry") as r:
            assert r.status == 404, "not on the ships' port"
    assert shown["version"] == at and shown["refused"] == {"forged": 1, "replayed": 1}
    got = [(q["version"], q["reason"]) for q in shown["quarantine"]]
    assert got == [(2, "replayed"), (at, "forged")]
    assert re.search(rf"^shorelink_gateway_registry_version {at}\.0$", text, re.M)
    assert re.search(r'registry_entries_refused_total\{reason="forged"\} 1\.0', text)
    assert re.search(r'registry_entries_refused_total\{reason="replayed"\} 1\.0', text)


def _raw(raw: bytes, seq: int) -> tuple[bytes, bytes, list[tuple[str, str | bytes | None]]]:
    """A record carrying the entry line ``raw`` at ``seq`` without a proof: what
    someone who can write the site's topic (not the merge) puts there."""
    headers = contract_headers(FLEET_ORIGIN.encode(), REGISTRY_STREAM.encode(), seq, 0, b"hq", b"")
    return b"registry", raw, list(headers)


async def test_a_ship_the_registry_says_needs_a_client_certificate_is_refused_without_one(
    tmp_path: Path, kafka: KafkaBroker
) -> None:
    """``fleet provision --require-client-cert`` is what ``ships add --require-client-cert``
    was for a site alone: a gateway following the registry refuses that ship's token
    without a client certificate naming it, takes it with one, and takes the token
    alone once ``fleet client-cert SHIP optional`` reaches it (no file, no restart)."""
    authority = make_authority(tmp_path / "tls")
    ensure_topics(kafka.endpoint, [TopicSpec(TOPIC, partitions=1)])
    reg = Registry.init(tmp_path / "registry")
    cfg = replace(
        tls_gateway_config(tmp_path, kafka, authority, mutual=True),
        credentials_file=None,
        fleet_pub_file=reg.directory / "fleet.pub",
    )
    ship = unique("mtls")
    bundle = provision(reg, ship, ["north"], out=tmp_path / ship, require_client_cert=True)
    token, key = (bundle / "gateway.token").read_text().strip(), ShipKey.load(bundle / "ship.key")
    own = authority.issue(ship, client=True)
    with_cert = client_context(
        TlsFile(authority.ca_cert, "ca"), TlsFile(own.cert, "cert"), TlsFile(own.key, "key")
    )
    without = client_context(TlsFile(authority.ca_cert, "ca"))
    stop = asyncio.Event()
    task = await start_gateway(cfg, stop, authority.ca_cert)
    site = Site(f"https://127.0.0.1:{cfg.port}", metrics_url(cfg), reg, kafka)
    try:
        async with aiohttp.ClientSession() as s:
            await site.enforces(s, site.deliver_new(0))
            assert await _upload(s, site.url, ship, token, key, 1, without) == 401
            assert await _upload(s, site.url, ship, token, key, 1, with_cert) == 200
            reg.append([("client_cert_set", {"ship": ship, "required": False})])
            await site.enforces(s, site.deliver_new(reg.state.version - 1))
            assert await _upload(s, site.url, ship, token, key, 6, without) == 200
    finally:
        stop.set()
        await task
