"""A ship's keys as the fleet registry carries them, on three real sites in a line (hq,
b, c: one Kafka broker each, links through toxiproxy, each site's Spark application,
gateways at b and c following their site's registry): a key rotated while the ship
uploads, a key revoked while records replicate, a key that reaches one site long after
the others, and a fleet key rotation the sites follow (issue 41, docs/fleet-registry.md).
One mesh and one fleet for the module; each test names its own sites, ship and stream."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from click.testing import CliRunner
from confluent_kafka import Producer

from local_stack.toxiproxy import ToxiproxyServer
from shorelink.cli import main
from shorelink.contract import H_PROOF, H_SEQ, canonical_topic, dead_topic, relay_topic
from shorelink.fleet.bundle import provision
from shorelink.fleet.follow import RegistryFollower
from shorelink.fleet.log import Registry
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.errors import UnknownTopic
from shorelink.kafka.reading import read_to_end
from shorelink.kafka.registry import publish
from shorelink.proof import KEY_ID_BYTES, ShipKey, ShipKeys
from shorelink.wire import Batch, encode_batch
from spark_core.quarantine import H_DEAD_CAUSE, H_DEAD_REASON
from tests.core_gateway.helpers import gateway_config, metrics_url, start_gateway
from tests.core_gateway.helpers import records as wire_records
from tests.helpers import eventually, unique
from tests.spark_core.replication_helpers import (
    Mesh,
    Running,
    Topology,
    converged,
    identities,
    records,
    scrape,
    signed,
    start_mesh,
    topology,
)

pytestmark = pytest.mark.spark

HQ, B, C = "ra", "rb", "rc"
LINE = {HQ: [B], B: [HQ, C], C: [B]}  # hq - b - c: what hq writes reaches c through b


@pytest.fixture(scope="module")
def mesh(stack_root: Path, toxiproxy_server: ToxiproxyServer) -> Iterator[Mesh]:
    m = start_mesh(
        stack_root / "fleet_keys", stack_root / "logs", toxiproxy_server.client(), (HQ, B, C)
    )
    m.heal_all()
    yield m
    for b in m.brokers.values():
        b.proc.stop(grace=10)


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Registry:
    """Headquarters' registry, one for the module as for a fleet: the sites of every
    test on these brokers follow the same ``sl.registry`` (a broker holds one fleet's)."""
    return Registry.init(tmp_path_factory.mktemp("fleet") / "registry")


@dataclass
class Fleet:
    """Three sites following headquarters' registry, a ship provisioned there, and the
    gateways of b and c it uploads to."""

    topo: Topology
    run: Running
    reg: Registry
    stream: str
    ship: str
    token: str
    key: ShipKey
    gateways: dict[str, tuple[str, str]]  # site -> ships' url, metrics url
    session: aiohttp.ClientSession

    @property
    def sites(self) -> list[str]:
        return list(self.topo.slots)

    def site(self, slot: str) -> str:
        return next(s for s, sl in self.topo.slots.items() if sl == slot)

    async def publish(self) -> None:
        """Headquarters publishes its registry; every gateway and every site's Spark
        application enforces its version (the merges' keys are the registry's then)."""
        hq = self.site(HQ)
        await asyncio.to_thread(
            publish, self.reg, KafkaEndpoint.plaintext(self.topo.bootstrap(hq)), hq
        )
        await self.enforced(self.sites)

    async def enforced(self, sites: list[str], version: int | None = None) -> None:
        want = version or self.reg.state.version
        for site in sites:
            if site in self.gateways:
                await self._gateway_at(site, want)
            port = self.topo.metrics[site]

            def at_version(port: int = port) -> bool:
                got = scrape(port).get(("shorelink_spark_registry_version", ()))
                return got == want

            what = f"{site}'s merges enforce registry version {want}"
            await asyncio.to_thread(eventually, at_version, 120, what)

    async def _gateway_at(self, site: str, version: int) -> None:
        for _ in range(2400):
            async with self.session.get(f"{self.gateways[site][1]}/healthz") as r:
                if (await r.json()).get("registry", {}).get("version") == version:
                    return
            await asyncio.sleep(0.05)
        raise AssertionError(f"{site}'s gateway does not enforce registry version {version}")

    async def upload(self, site: str, key: ShipKey, lo: int, hi: int) -> int:
        """The ship's batch of seqs ``lo``-``hi`` signed by ``key``, at ``site``'s gateway."""
        body = encode_batch(Batch(self.ship, self.stream, wire_records(lo, hi)), key=key)
        url = f"{self.gateways[site][0]}/v1/ships/{self.ship}/streams/{self.stream}/batches"
        headers = {
            "Authorization": f"Bearer {self.token}",
            "Content-Type": "application/x-shorelink-batch",
        }
        async with self.session.post(url, data=body, headers=headers) as r:
            return r.status

    async def upload_until_taken(self, site: str, key: ShipKey, lo: int, hi: int) -> None:
        """As the ship does: a batch refused (its gateway does not know the key yet:
        403; the seqs before it have not reached this site yet: 409) is sent again until
        it is taken."""
        for _ in range(1200):
            status = await self.upload(site, key, lo, hi)
            if status == 200:
                return
            assert status in (403, 409), status
            await asyncio.sleep(0.1)
        raise AssertionError(f"{site}'s gateway never took seqs {lo}-{hi}")

    def key_ids(self, site: str) -> dict[int, bytes]:
        """Each of the ship's seqs at ``site`` and the key id its proof names."""
        out = {}
        ep = KafkaEndpoint.plaintext(self.topo.bootstrap(site))
        for m in read_to_end(ep, [canonical_topic(self.stream)], settled=True):
            h = dict(m.headers() or [])
            proof = h[H_PROOF]
            assert isinstance(proof, bytes)
            out[int(h[H_SEQ] or b"0")] = proof[-KEY_ID_BYTES:]
        return out

    def dead(self, site: str) -> list[tuple[int, str, str]]:
        """The ship's stream's dead letters at ``site``: (seq, cause, reason)."""
        ep = KafkaEndpoint.plaintext(self.topo.bootstrap(site))
        try:
            msgs = list(read_to_end(ep, [dead_topic(self.stream)], settled=True))
        except UnknownTopic:
            return []
        out = []
        for m in msgs:
            h = dict(m.headers() or [])
            out.append((int(h[H_SEQ] or b"0"), _text(h[H_DEAD_CAUSE]), _text(h[H_DEAD_REASON])))
        return out

    def follower(self, site: str) -> RegistryFollower:
        """``site``'s Spark application's registry follower."""
        rep = self.run.sups[site].replicator
        assert rep is not None
        return next(m.ship_keys for m in rep.mergers if isinstance(m.ship_keys, RegistryFollower))


def _text(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


@contextlib.asynccontextmanager
async def fleet_sites(
    spark: object, mesh: Mesh, reg: Registry, tmp_path: Path
) -> AsyncIterator[Fleet]:
    """New sites on the mesh, following ``reg``, with a ship of their own."""
    pub = reg.directory / "fleet.pub"
    stream = unique("cont")
    topo = topology(mesh, tmp_path, LINE, [stream], fleet_pub=pub)
    ship = unique("ship")
    bundle = provision(reg, ship, ["north"], out=tmp_path / "bundle")
    token, key = (bundle / "gateway.token").read_text().strip(), ShipKey.load(bundle / "ship.key")
    stop = asyncio.Event()
    tasks = []
    gateways = {}
    with Running(spark, topo) as run:
        run.start()
        try:
            for site, slot in topo.slots.items():
                if slot == HQ:
                    continue
                (tmp_path / site).mkdir(exist_ok=True)
                cfg = replace(
                    gateway_config(tmp_path / site, mesh.brokers[slot], site=site),
                    credentials_file=None,
                    fleet_pub_file=pub,
                    streams=(stream,),
                )
                tasks.append(await start_gateway(cfg, stop))
                gateways[site] = (f"http://127.0.0.1:{cfg.port}", metrics_url(cfg))
            async with aiohttp.ClientSession() as s:
                yield Fleet(topo, run, reg, stream, ship, token, key, gateways, s)
        finally:
            stop.set()
            for t in tasks:
                await t


def _rotate(reg: Registry, ship: str, from_seq: dict[str, int], revoke: bool) -> ShipKey:
    """``shorelink fleet rotate-key SHIP --from-seq S=N [--revoke]``: a new key from
    ``from_seq``, the old one bounded there (and revoked there with ``revoke``)."""
    new = ShipKey.generate()
    changes: list[tuple[str, dict[str, Any]]] = [
        ("ship_key_added", {"ship": ship, "public": new.public(), "from_seq": from_seq})
    ]
    if revoke:
        old = reg.state.ships[ship].keys[-1].id
        changes.append(("key_revoked", {"ship": ship, "key_id": old, "at_seq": from_seq}))
    reg.append(changes)
    return new


def _want(fleet: Fleet, seqs: range) -> dict[str, set[Any]]:
    return {fleet.stream: {r.identity for r in records("x", fleet.ship, fleet.stream, seqs)}}


async def test_a_ship_key_rotated_while_the_ship_uploads_loses_nothing_at_any_site(
    spark: object, mesh: Mesh, registry: Registry, tmp_path: Path
) -> None:
    """Issue 41: a ship's key rotated while it uploads at two ports and the three sites
    replicate, after a fleet key rotation that was not published yet, published with
    an entry the new fleet key signed. The sites follow the fleet key's rotation (its
    entries proved by the retired key's chunks), then the
    ship key's: records below the rotation's seq stay the old key's, at the gateway too
    (a backlog signed before the rotation, sent after it), the old key signs nothing at
    or above it; every site ends with every record exactly once, each proof naming the
    key valid at its seq, and nothing dead-lettered anywhere."""
    async with fleet_sites(spark, mesh, registry, tmp_path) as fleet:
        old_fleet_key = fleet.reg.fleet_key()
        fleet.reg.rotate_fleet_key()  # before anything was published
        # an entry the new fleet key signs, in the same publish as its rotation: a site
        # may pull both in one batch, before its follower has taken the rotation
        fleet.reg.append([("ship_added", {"ship": unique("ship"), "groups": ["south"]})])
        t0 = time.monotonic()
        await fleet.publish()
        print(
            f"a fleet key rotation and an entry after it enforced everywhere in "
            f"{time.monotonic() - t0:.2f} s"
        )
        b, c = fleet.site(B), fleet.site(C)
        for lo in range(1, 81, 10):  # the ship uploads at both ports
            await fleet.upload_until_taken(b if lo % 20 else c, fleet.key, lo, lo + 9)
        new = _rotate(fleet.reg, fleet.ship, {fleet.stream: 101}, revoke=False)
        publishing = asyncio.create_task(fleet.publish())
        await fleet.upload_until_taken(c, fleet.key, 81, 90)  # still on the old key
        await fleet.upload_until_taken(b, fleet.key, 91, 100)  # a backlog signed before
        for lo in range(101, 201, 20):  # on board: the new key, from seq 101
            await fleet.upload_until_taken(c, new, lo, lo + 19)
        await publishing
        assert fleet.reg.state.fleet_key_id != old_fleet_key.id
        want = _want(fleet, range(1, 201))
        await asyncio.to_thread(
            eventually, lambda: not list(converged(fleet.topo, want)), 180, "every site has all"
        )
        assert await fleet.upload(b, fleet.key, 201, 210) == 403  # old key, past its bound
        for site in fleet.sites:
            ids = fleet.key_ids(site)
            assert {ids[q] for q in range(1, 101)} == {fleet.key.id}, site
            assert {ids[q] for q in range(101, 201)} == {new.id}, site
            assert fleet.dead(site) == [], site
    assert not list(converged(fleet.topo, want))


async def test_a_key_revoked_during_replication_is_refused_above_its_seq_at_every_site(
    spark: object, mesh: Mesh, registry: Registry, tmp_path: Path
) -> None:
    """Issue 41, security review N6: the ship's key is found stolen and revoked at seq
    101 while the ship's records 1-100, signed by it, replicate from c (the revocation
    travels the other way). Those are kept at every site. The thief's records 101-110,
    signed by the stolen key: refused by the gateway, and where a hostile neighbour
    offers them (in b's and c's relay topics), dead-lettered at every site as
    ``revoked`` with a reason naming the key; the ship's own 101-120 on its new key
    are taken everywhere, each record once."""
    async with fleet_sites(spark, mesh, registry, tmp_path) as fleet:
        await fleet.publish()
        b, c = fleet.site(B), fleet.site(C)
        for lo in range(1, 101, 10):
            await fleet.upload_until_taken(c, fleet.key, lo, lo + 9)
        stolen = fleet.key
        new = _rotate(fleet.reg, fleet.ship, {fleet.stream: 101}, revoke=True)
        await fleet.publish()  # while 1-100 travel from c to hq
        assert await fleet.upload(c, stolen, 101, 110) == 403
        theirs = records(c, fleet.ship, fleet.stream, range(101, 111))
        proofs = signed(theirs, stolen, ShipKeys.parse({"ships": {fleet.ship: stolen.public()}}))
        for relay_site in (b, c):  # hq and c pull b's relay, b pulls c's
            p = Producer({"bootstrap.servers": fleet.topo.bootstrap(relay_site)})
            for r, proof in zip(theirs, proofs, strict=True):
                p.produce(
                    relay_topic(relay_site, fleet.stream),
                    key=r.key,
                    value=r.value,
                    headers=[*r.headers(), (H_PROOF, proof)],
                )
            assert p.flush(20) == 0
        await asyncio.to_thread(
            eventually,
            lambda: all(len(fleet.dead(s)) >= 10 for s in fleet.sites),
            180,
            "every site refuses the stolen key's records",
        )
        for lo in range(101, 121, 10):
            await fleet.upload_until_taken(c, new, lo, lo + 9)
        want = _want(fleet, range(1, 121))
        await asyncio.to_thread(
            eventually, lambda: not list(converged(fleet.topo, want)), 180, "every site has all"
        )
        for site in fleet.sites:
            dead = fleet.dead(site)
            # (a pass of the re-drive after the revocation may refuse them once more)
            assert {q for q, _, _ in dead} == set(range(101, 111)), site
            assert {cause for _, cause, _ in dead} == {"revoked"}
            assert all(stolen.id.hex() in why for _, _, why in dead), dead[0]
            ids = fleet.key_ids(site)
            assert {ids[q] for q in range(1, 101)} == {stolen.id}
            assert {ids[q] for q in range(101, 121)} == {new.id}
        # the audit of what the stolen key signed, at b
        args = ["fleet", "audit-key", fleet.ship, stolen.id.hex(), "--json"]
        args += ["--registry", str(fleet.reg.directory), "--kafka", fleet.topo.bootstrap(b)]
        got = CliRunner().invoke(main, args)  # every stream at b
        assert got.exit_code == 0, got.output
        audit = json.loads(got.output)
        assert audit["proves"] == {fleet.stream: [1, 101], "*": [1, 1]}
        assert audit["held"][fleet.stream] == {
            "signed": "1-100",
            "refused": {"revoked": "101-110"},
            "without_key_id": 0,
            "other_keys": {new.id.hex(): 20},
        }
    assert not list(converged(fleet.topo, want))


async def test_a_key_that_reaches_one_site_long_after_the_others_loses_nothing_there(
    spark: object, mesh: Mesh, registry: Registry, tmp_path: Path
) -> None:
    """Issue 41, replication review N4: the order in which sites learn of a key must not
    matter. c's Spark application is held at the registry's old version (its follower
    paused) while the ship, on its rotated key, uploads at b: c pulls those records
    and cannot prove them yet, so it dead-letters them, naming the key it lacks. Once
    the rotation reaches c, it tries them again (spark_core/redrive.py) and takes
    every one: c ends with every record exactly once, as hq and b do."""
    async with fleet_sites(spark, mesh, registry, tmp_path) as fleet:
        await fleet.publish()
        b, c = fleet.site(B), fleet.site(C)
        follower = fleet.follower(c)
        held = threading.Event()
        take: Callable[..., bool] = follower.take

        def paused(*a: Any) -> bool:
            held.wait()
            return take(*a)

        follower.take = paused  # type: ignore[method-assign,assignment]
        try:
            for lo in range(1, 51, 10):
                await fleet.upload_until_taken(b, fleet.key, lo, lo + 9)
            new = _rotate(fleet.reg, fleet.ship, {fleet.stream: 51}, revoke=False)
            hq = fleet.site(HQ)
            await asyncio.to_thread(
                publish, fleet.reg, KafkaEndpoint.plaintext(fleet.topo.bootstrap(hq)), hq
            )
            await fleet.enforced([hq, b])
            for lo in range(51, 101, 10):
                await fleet.upload_until_taken(b, new, lo, lo + 9)
            await asyncio.to_thread(
                eventually, lambda: len(fleet.dead(c)) >= 50, 180, "c holds the new key's back"
            )
            seqs = {i.seq for i in identities(fleet.topo, c, fleet.stream)}
            assert seqs == set(range(1, 51))
            assert {why for _, _, why in fleet.dead(c)} == {
                f"bad_signature: proof names key {new.id.hex()}, not a key of {fleet.ship} here"
            }
        finally:
            held.set()
        await fleet.enforced([c])
        want = _want(fleet, range(1, 101))
        await asyncio.to_thread(
            eventually, lambda: not list(converged(fleet.topo, want)), 180, "c takes them"
        )
        m = scrape(fleet.topo.metrics[c])
        redriven = {
            dict(labels)["outcome"]: v
            for (name, labels), v in m.items()
            if name == "shorelink_spark_redriven_records_total"
            and dict(labels)["cause"] == "bad_signature"
        }
        assert redriven.get("written") == 50, redriven
        assert {q for q, ids in fleet.key_ids(c).items() if ids == new.id} == set(range(51, 101))
    assert not list(converged(fleet.topo, want))
