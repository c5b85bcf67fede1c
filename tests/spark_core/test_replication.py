"""Replication among sites, for real: one Kafka broker per site, links through
toxiproxy, every site's application (merges, inbox queries, link probes) in the
session's Spark. Each test names its own sites and streams, so tests share brokers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from local_stack.toxiproxy import ToxiproxyServer
from shorelink.identity import Identity
from tests.conftest import unique
from tests.helpers import eventually
from tests.spark_core.replication_helpers import (
    SLOTS,
    Mesh,
    Running,
    converged,
    enter,
    full_mesh,
    records,
    start_mesh,
    topology,
)

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def mesh(stack_root: Path, toxiproxy_server: ToxiproxyServer) -> Iterator[Mesh]:
    m = start_mesh(stack_root / "replication", stack_root / "logs", toxiproxy_server.client())
    yield m
    for b in m.brokers.values():
        b.proc.stop(grace=10)


@pytest.fixture
def healed(mesh: Mesh) -> Iterator[Mesh]:
    mesh.heal_all()
    yield mesh
    mesh.heal_all()


def ids(recs: list) -> set[Identity]:
    return {r.identity for r in recs}


def test_ring_of_three_converges_each_identity_once(spark: object, healed: Mesh, tmp_path: Path) -> None:
    stream = unique("cont")
    topo = topology(healed, tmp_path, full_mesh(SLOTS[:3]), [stream])
    a, b, c = topo.slots
    ship1 = records(a, "ship1", stream, range(1, 301))
    ship2 = records(b, "ship2", stream, range(1, 301))
    # one ship uploads parts of one stream at two sites, with an overlap
    ship3_a = records(a, "ship3", stream, range(1, 201))
    ship3_c = records(c, "ship3", stream, range(150, 301))
    enter(topo, a, ship1 + ship3_a)
    enter(topo, b, ship2)
    enter(topo, c, ship3_c)
    want = {stream: ids(ship1) | ids(ship2) | ids(ship3_a) | ids(ship3_c)}
    with Running(spark, topo) as run:
        run.start()
        eventually(lambda: not list(converged(topo, want)), 180, "the ring converged")
    assert not list(converged(topo, want))
