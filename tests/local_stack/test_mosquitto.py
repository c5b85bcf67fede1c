"""The stack's Mosquitto keeps QoS 1 messages for a persistent session that is away:
the edge agent relies on it to lose nothing while it restarts."""

from __future__ import annotations

import threading

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from local_stack.mosquitto import MosquittoBroker
from tests.helpers import unique


def _client(client_id: str) -> mqtt.Client:
    return mqtt.Client(
        CallbackAPIVersion.VERSION2, client_id=client_id, protocol=MQTTProtocolVersion.MQTTv5
    )


def _connect_persistent(c: mqtt.Client, broker: MosquittoBroker) -> None:
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 3600
    c.connect(broker.host, broker.port, clean_start=False, properties=props)


def test_persistent_subscriber_gets_messages_published_while_away(
    mosquitto: MosquittoBroker,
) -> None:
    sub_id = unique("sub")
    topic = "ship/containers/c1/env"
    received: list[bytes] = []
    got_all = threading.Event()

    def on_message(_c: mqtt.Client, _u: object, msg: mqtt.MQTTMessage) -> None:
        received.append(msg.payload)
        if len(received) >= 20:
            got_all.set()

    # 1. subscribe with a persistent session, then go away
    subscribed = threading.Event()
    sub = _client(sub_id)
    sub.on_subscribe = lambda *a: subscribed.set()
    _connect_persistent(sub, mosquitto)
    sub.loop_start()
    sub.subscribe(topic, qos=1)
    assert subscribed.wait(5)
    sub.disconnect()
    sub.loop_stop()

    # 2. publish while the subscriber is offline; every message is PUBACKed by the broker
    pub = _client(unique("pub"))
    pub.connect(mosquitto.host, mosquitto.port)
    pub.loop_start()
    infos = [pub.publish(topic, f"m{i}".encode(), qos=1) for i in range(20)]
    for info in infos:
        info.wait_for_publish(5)
        assert info.is_published()
    pub.disconnect()
    pub.loop_stop()

    # 3. the subscriber returns with the same client id: the broker delivers the backlog
    sub2 = _client(sub_id)
    sub2.on_message = on_message
    _connect_persistent(sub2, mosquitto)
    sub2.loop_start()
    assert got_all.wait(10), f"only {len(received)} of 20 delivered"
    sub2.disconnect()
    sub2.loop_stop()
    assert received == [f"m{i}".encode() for i in range(20)]
