"""The simulated sensors against a real Mosquitto: what the voyage's report counts as
produced and as "what MQTT bridging would send" must be exactly what reached the broker."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from pathlib import Path

import aiomqtt
from hypothesis import given
from hypothesis import strategies as st

from fleet_sim.plan import plan_voyage
from fleet_sim.publisher import DEFAULT_AIS, mqtt_publish_bytes, read_ais, run_fleet, ship_messages
from local_stack.mosquitto import MosquittoBroker


def test_mqtt_publish_bytes_counts_a_qos1_publish_and_its_puback() -> None:
    # fixed header 1 + remaining length 1 (17) + topic length 2 + "a/b" + packet id 2 + 10
    assert mqtt_publish_bytes("a/b", 10) == 1 + 1 + 17 + 4
    # the remaining length takes a second byte from 128 on
    assert mqtt_publish_bytes("a/b", 120) == 1 + 1 + 127 + 4
    assert mqtt_publish_bytes("a/b", 121) == 1 + 2 + 128 + 4


@given(st.text(min_size=1, max_size=50), st.integers(0, 300_000))
def test_mqtt_publish_bytes_grows_with_the_message(topic: str, size: int) -> None:
    n = mqtt_publish_bytes(topic, size)
    assert n >= size + len(topic.encode()) + 2 + 2 + 2 + 4
    assert mqtt_publish_bytes(topic, size + 1) > n


def test_a_ships_schedule_is_in_time_order_and_silent_after_the_spike() -> None:
    plan = plan_voyage(["s1", "s2"], minutes=2, containers=6, start_wall=0)
    ais = read_ais(DEFAULT_AIS)
    msgs = ship_messages(plan, "s2", ais_lines=ais)
    assert [m.t_s for m in msgs] == sorted(m.t_s for m in msgs)
    spike = [m for m in msgs if m.overboard]
    assert len(spike) == 3
    lost = set(plan.overboard.containers)
    after = [
        m
        for m in msgs
        if m.t_s > spike[0].t_s and m.topic.split("/")[3:4] and m.topic.split("/")[3] in lost
    ]
    assert not after
    assert all(json.loads(m.payload)["shock"] >= 25 for m in spike)
    # the AIS ship carries the real sentences, unchanged and in order
    first = [
        m.payload for m in ship_messages(plan, "s1", ais_lines=ais) if m.topic.endswith("/nav/ais")
    ]
    assert first == ais and len(ais) > 800


async def test_every_counted_message_reaches_the_broker_once_with_qos1(
    mosquitto: MosquittoBroker, tmp_path: Path
) -> None:
    plan = plan_voyage(["s1", "s2"], speed=300_000, containers=4, start_wall=time.time() + 1.5)
    events = tmp_path / "events.jsonl"
    got: list[aiomqtt.Message] = []
    end = asyncio.Event()
    async with aiomqtt.Client("127.0.0.1", mosquitto.port, identifier="test-sub") as sub:
        await sub.subscribe("bigblue/#", qos=1)

        async def collect() -> None:
            async for m in sub.messages:
                if str(m.topic) == "bigblue/test/end":
                    end.set()
                else:
                    got.append(m)

        reader = asyncio.create_task(collect())
        brokers = {"s1": ("127.0.0.1", mosquitto.port), "s2": ("127.0.0.1", mosquitto.port)}
        stats = await asyncio.wait_for(run_fleet(plan, brokers, events=events), timeout=60)
        # the broker delivers to one subscriber in order: once a marker published after
        # the fleet is done arrives, everything the fleet sent (and any duplicate) is here,
        # however far behind a loaded machine keeps the subscriber
        async with aiomqtt.Client("127.0.0.1", mosquitto.port, identifier="test-end") as pub:
            await pub.publish("bigblue/test/end", b"", qos=1)
        await asyncio.wait_for(end.wait(), timeout=60)
        reader.cancel()
    sent = sum(s.messages for s in stats.ships.values())
    assert sent > 100 and len(got) == sent
    assert all(m.qos == 1 for m in got)
    per_ship = Counter(str(m.topic).split("/")[1] for m in got)
    assert per_ship == {name: s.messages for name, s in stats.ships.items()}
    for m in got:
        payload = bytes(m.payload)  # type: ignore[arg-type]
        if str(m.topic).endswith("/nav/ais"):
            assert payload.startswith(b"!AIVDM")
        else:
            json.loads(payload)
    # each lost container says nothing after its spike
    lost = set(plan.overboard.containers)
    spiked: set[str] = set()
    for m in got:
        parts = str(m.topic).split("/")
        if len(parts) > 3 and parts[3] in lost:
            assert parts[3] not in spiked, f"{parts[3]} published after going overboard"
            if json.loads(bytes(m.payload))["shock"] >= 25:  # type: ignore[arg-type]
                spiked.add(parts[3])
    assert spiked == lost
    # the events file's last stats agree with what arrived
    last: dict[str, dict[str, int]] = {}
    kinds = Counter()
    for line in events.read_text().splitlines():
        ev = json.loads(line)
        kinds[ev["kind"]] += 1
        if ev["kind"] == "stats":
            last[ev["ship"]] = ev
    for name, s in stats.ships.items():
        assert last[name]["messages"] == s.messages
        assert last[name]["payload_bytes"] == sum(
            len(bytes(m.payload))
            for m in got
            if str(m.topic).split("/")[1] == name  # type: ignore[arg-type]
        )
    assert kinds["overboard"] == 1 and kinds["arrive"] >= 2 and kinds["position"] > 0
