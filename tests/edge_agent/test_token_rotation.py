"""A token's rotation ended by the ship's own word (docs/fleet-registry.md, "Tokens";
shorelink/fleet/tokens.py): the older token stays valid until the ship's signed report
says it uploads with the newer one, then headquarters' loop retires it by itself. A real
gateway following a registry on Kafka, the agent against it; the ship's reports go from
the site's ingress to the report stream's canonical topic as the site's merge writes
them. Why it matters: a ship at sea cannot be reached to check it has its new token, and
a thief holding only the old one must neither end the rotation nor hold it open."""

from __future__ import annotations

import asyncio
import io
import time
from pathlib import Path

import aiohttp
import pytest

from local_stack.kafka import KafkaBroker
from local_stack.mosquitto import MosquittoBroker
from shorelink.contract import Record, canonical_topic, ingress_topic
from shorelink.fleet.entry import hash_token, new_token, token_id
from shorelink.fleet.state import FleetState
from shorelink.fleet.tokens import retirements
from shorelink.kafka.fleet_run import HeadquartersLoop
from shorelink.kafka.reading import read_to_end
from shorelink.kafka.topics import TopicSpec, ensure_topics, producer
from shorelink.ship_report import REPORT_MQTT_TOPIC, ShipReport, decode_report, encode_report
from shorelink.wire import Batch, WireRecord, encode_batch
from tests.edge_agent.fleet_helpers import Ship, Shore, fleet_ship
from tests.helpers import eventually_async, unique


def _reports(kafka: KafkaBroker, ship: str) -> list[Record]:
    """``ship``'s reports in the site's ``sl.ingress.nav`` (the gateway wrote them)."""
    out = []
    for m in read_to_end(kafka.endpoint, [ingress_topic("nav")], settled=True):
        rec = Record.from_kafka(m.key(), m.value(), m.headers())
        if rec.identity.origin == ship and rec.mqtt_topic == REPORT_MQTT_TOPIC:
            out.append(rec)
    return out


class _Merge:
    """The ship's reports from the ingress into the canonical topic of a report stream
    of this test's own, each identity once, as the site's merge writes them."""

    def __init__(self, kafka: KafkaBroker) -> None:
        self.kafka = kafka
        self.stream = unique("agent")
        ensure_topics(kafka.endpoint, [TopicSpec(canonical_topic(self.stream), 1)])
        self.merged: set[int] = set()

    def run(self, ship: str) -> list[str | None]:
        """Merge what is new; the token ids the ship's reports name, by seq."""
        p = producer(self.kafka.endpoint)
        recs = sorted(_reports(self.kafka, ship), key=lambda r: r.identity.seq)
        for rec in recs:
            if rec.identity.seq not in self.merged:
                self.merged.add(rec.identity.seq)
                headers: list[tuple[str, str | bytes | None]] = list(rec.headers())
                p.produce(canonical_topic(self.stream), rec.value, rec.key, headers=headers)
        assert p.flush(20) == 0
        return [decode_report(r.value).token for r in recs]


async def _status(url: str, ship: str, token: str, body: bytes) -> int:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/x-shorelink-batch"}
    post = f"{url}/v1/ships/{ship}/streams/nav/batches"
    async with (
        aiohttp.ClientSession() as s,
        s.post(post, data=io.BytesIO(body), headers=headers) as r,
    ):
        return r.status


def _forged_report(ship: str, names: str) -> bytes:
    """A report naming the token ``names``, as a thief without the ship's key sends it."""
    report = ShipReport(int(time.time() * 1000), "port", {}, {}, token=names)
    rec = WireRecord(
        10_000, ship, int(time.time() * 1000), REPORT_MQTT_TOPIC, encode_report(report)
    )
    return encode_batch(Batch(ship, "nav", (rec,)))


async def test_the_old_token_is_retired_once_the_ships_report_names_the_new_one(
    tmp_path: Path, shore: Shore, mosquitto: MosquittoBroker
) -> None:
    ship = await fleet_ship(tmp_path, shore, mosquitto)
    url = f"http://127.0.0.1:{shore.port}"
    token_file = tmp_path / ship.name / "gateway.token"
    old = token_file.read_text().strip()
    merge = _Merge(shore.kafka)
    loop = HeadquartersLoop(
        shore.registry.directory,
        shore.kafka.endpoint,
        "tokyo",
        report_stream=merge.stream,
        tick_every=0.001,  # every step ticks
        published=shore.registry.state.version,
    )
    await eventually_async(
        lambda: token_id(hash_token(old)) in merge.run(ship.name), 30, "a report on the old token"
    )

    new = new_token()
    body = {"ship": ship.name, "token_hash": hash_token(new), "retire_previous": False}
    shore.registry.append([("token_issued", body)])
    shore.publish()
    # the ship still on its old token, and a thief holding it who says otherwise
    thief = await _status(url, ship.name, old, _forged_report(ship.name, token_id(hash_token(new))))
    assert thief in (400, 403), "a report the ship's key did not sign is refused"
    assert token_id(hash_token(new)) not in merge.run(ship.name), "nor does it reach the site"
    await asyncio.to_thread(loop.step)
    assert loop.tokens_retired == 0
    assert len(shore.registry.state.ships[ship.name].tokens) == 2, "both valid: pending"

    # the ship takes its new token (a new bundle carried on board) and restarts
    await ship.stop()
    token_file.write_text(new + "\n")
    ship = await _ship_again(ship)
    await eventually_async(
        lambda: merge.run(ship.name)[-1] == token_id(hash_token(new)), 30, "a report on the new one"
    )
    await asyncio.to_thread(loop.step)
    assert loop.tokens_retired == 1
    shore.registry.refresh()  # the loop wrote it, as `fleet run` beside the operator's commands
    state = shore.registry.state
    assert [t.hash for t in state.ships[ship.name].tokens] == [hash_token(new)]
    version = state.version
    await asyncio.to_thread(loop.step)
    shore.registry.refresh()
    assert (loop.tokens_retired, shore.registry.state.version) == (1, version), "idempotent"

    shore.publish()

    deadline = time.monotonic() + 20
    while await _status(url, ship.name, old, b"") != 401:
        assert time.monotonic() < deadline, "the gateway refuses the old token"
        await asyncio.sleep(0.05)
    assert await _status(url, ship.name, new, b"") != 401, "the new one is taken"
    await ship.stop()


async def _ship_again(ship: Ship) -> Ship:
    from edge_agent.agent import Supervisor

    sup = Supervisor(ship.config)
    task = asyncio.create_task(sup.run(install_signals=False))
    await eventually_async(lambda: sup.agent is not None, 10, "the agent started again")
    return Ship(ship.name, ship.config, sup, task)


@pytest.mark.parametrize(
    ("named", "retired"),
    [("new", True), ("old", False), (None, False), ("other", False)],
)
def test_only_a_report_naming_the_newer_token_retires_the_older(
    named: str | None, retired: bool, tmp_path: Path
) -> None:
    """Pure: the older token is retired on the newer one's id alone; a ship revoked, or
    with no rotation pending, retires nothing."""
    from shorelink.fleet.log import Registry

    reg = Registry.init(tmp_path / "registry")
    reg.append([("ship_added", {"ship": "bigblue", "groups": ["north"]})])
    tokens = [new_token() for _ in range(3)]
    for t in tokens[:2]:
        reg.append(
            [
                (
                    "token_issued",
                    {"ship": "bigblue", "token_hash": hash_token(t), "retire_previous": False},
                )
            ]
        )
    ids = {"old": tokens[0], "new": tokens[1], "other": tokens[2]}
    used = {"bigblue": None if named is None else token_id(hash_token(ids[named]))}
    found = retirements(reg.state, used)
    assert bool(found) is retired
    if retired:
        assert found[0].old == hash_token(tokens[0])
    state: FleetState = reg.state
    state.ships["bigblue"].revoked = True
    assert retirements(state, used) == []
