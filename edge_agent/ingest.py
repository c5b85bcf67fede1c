"""MQTT in, durable log, PUBACK last.

Why paho-mqtt and not aiomqtt: the invariant here is *commit, then acknowledge*, which
needs manual acknowledgement. aiomqtt wraps paho but offers no public manual-ack API;
paho-mqtt 2.x has ``manual_ack=True`` plus ``Client.ack(mid, qos)``. So ingest uses paho
directly, driven by the agent's asyncio loop through paho's documented external-loop
hooks (``on_socket_open`` / ``on_socket_register_write`` -> ``loop_read`` /
``loop_write`` / ``loop_misc``). Every paho call happens on the event loop thread, so no
locking is needed; only the SQLite commit runs in a worker thread.

- connection: an explicit ``while`` loop connects with a persistent session
  (``clean_start=False``, session expiry > 0), waits until the connection drops, then
  backs off (exponential with jitter, capped) and connects again;
- commit: received messages are taken off a queue in groups (``group_commit`` seconds
  or ``group_commit_max`` messages), each group is committed in one SQLite transaction,
  and only then are the PUBACKs sent, in order.

A message the broker resends after a crash (DUP flag, same packet id) whose packet id
and digest were committed already is acknowledged without being stored again. PUBACKs
for messages received on a connection that has since dropped are not sent: the broker
redelivers those messages on the new connection and the digest check recognises them.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sqlite3
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions
from tenacity import RetryCallState

from edge_agent.alarms import (
    ALERTS_STREAM,
    AlarmState,
    Evaluation,
    evaluate,
    load_state,
    save_changes,
)
from edge_agent.config import EdgeConfig
from edge_agent.errors import LogError, LogFullError, UnusableMessage
from edge_agent.log import CommitResult, EdgeLog, Incoming, Quarantined, message_digest
from edge_agent.metrics import EdgeMetrics
from edge_agent.rules import admit_message
from shorelink.logs import RateLimitedLog, get_logger
from shorelink.retry import Backoff, retrying

__all__ = ["Ingest"]

log = get_logger(__name__)

#: after an unexpected commit error, how often a message is tried alone before it is
#: quarantined as ``commit_error``
ISOLATE_ATTEMPTS = 3
#: waits between tries of a commit the log refused
COMMIT_BACKOFF = Backoff(first_s=0.1, cap_s=5.0)
#: a message that can be neither committed nor quarantined for this long makes
#: :meth:`Ingest.healthy` false (the systemd watchdog then restarts the agent)
STUCK_AFTER_S = 60.0


@dataclass(frozen=True, slots=True)
class _Received:
    generation: int
    client: mqtt.Client
    msg: mqtt.MQTTMessage
    recv_ms: int
    recv_mono: float
    #: the connection it came on (random id) and whether that connection resumed a
    #: session the broker kept (then it may redeliver: edge_agent/redelivery.py)
    conn: int = 0
    resumed: bool = False


class _PahoOnAsyncio:
    """Drives one paho client from the asyncio loop (paho's external-loop API)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, client: mqtt.Client) -> None:
        self.loop = loop
        self.client = client
        self.misc: asyncio.Task[None] | None = None
        self.closed = asyncio.Event()
        client.on_socket_open = self._open
        client.on_socket_close = self._close
        client.on_socket_register_write = self._register_write
        client.on_socket_unregister_write = self._unregister_write

    def _open(self, client: mqtt.Client, _u: object, sock: Any) -> None:
        self.loop.add_reader(sock, client.loop_read)
        self.misc = self.loop.create_task(self._misc_loop())

    def _close(self, _c: mqtt.Client, _u: object, sock: Any) -> None:
        self.loop.remove_reader(sock)
        self.loop.remove_writer(sock)
        if self.misc is not None:
            self.misc.cancel()
        self.closed.set()

    def _register_write(self, client: mqtt.Client, _u: object, sock: Any) -> None:
        self.loop.add_writer(sock, client.loop_write)

    def _unregister_write(self, _c: mqtt.Client, _u: object, sock: Any) -> None:
        self.loop.remove_writer(sock)

    def stop_reading(self) -> None:
        """Take no more messages off the connection (the acknowledgements still go
        out): what arrives from now on stays the broker's, redelivered to the next
        session, so a stop's drain ends with what was received, not when the sensors
        pause."""
        sock = self.client.socket()
        if sock is not None:
            self.loop.remove_reader(sock)

    def drop(self) -> None:
        """The connection did not close when asked: stop reading it and close its
        socket (nothing received on it is acknowledged any more: the broker redelivers)."""
        sock = self.client.socket()
        if sock is not None:
            self._close(self.client, None, sock)
            with contextlib.suppress(OSError):
                sock.close()
        elif self.misc is not None:
            self.misc.cancel()
        self.closed.set()

    async def _misc_loop(self) -> None:
        while self.client.loop_misc() == MQTTErrorCode.MQTT_ERR_SUCCESS:  # noqa: ASYNC110 (a ticker)
            await asyncio.sleep(1)


class Ingest:
    def __init__(self, cfg: EdgeConfig, edge_log: EdgeLog, metrics: EdgeMetrics) -> None:
        self.cfg = cfg
        self.log = edge_log
        self.metrics = metrics
        self._queue: asyncio.Queue[_Received] = asyncio.Queue()
        self._generation = 0
        self._conn_id = 0
        self._resumed = False
        self._stopping = threading.Event()  # set once we are leaving
        self._idle = asyncio.Event()
        self._idle.set()
        self.connected = asyncio.Event()
        #: set after every commit that stored records (the uplink waits on it)
        self.committed = asyncio.Event()
        #: monotonic time the commit loop last went round (for the systemd watchdog)
        self.heartbeat = time.monotonic()
        #: monotonic time since which a group has failed with an unexpected error and
        #: none of its messages could be committed or quarantined (None: not stuck)
        self.stuck_since: float | None = None
        self._committer: asyncio.Task[None] | None = None
        #: the connection of now (dropped if ingest is cancelled before it closed it)
        self._driver: _PahoOnAsyncio | None = None
        self._limited = RateLimitedLog(log)
        #: alarms (edge_agent/alarms.py): the committed state (loaded by the first
        #: commit), and the evaluation of the group being committed
        self._alarm_state: AlarmState | None = None
        self._evaluation: Evaluation | None = None
        #: messages of the group being committed whose event time was unusable
        self._unclocked: set[Incoming] = set()

    def healthy(self, max_age: float = 10.0, max_stuck: float = STUCK_AFTER_S) -> bool:
        """False when ingest cannot make progress and a restart may help: the commit
        task is gone, its loop has not gone round for ``max_age`` seconds, or a message
        has waited ``max_stuck`` seconds while commits keep failing unexpectedly. (A
        full disk is not "stuck": restarting cannot free it; ``log_full`` says so.)"""
        now = time.monotonic()
        if self._committer is not None and self._committer.done():
            return False
        if self.stuck_since is not None and now - self.stuck_since > max_stuck:
            return False
        return now - self.heartbeat < max_age

    async def run(self, stop: asyncio.Event) -> None:
        """Receive and commit until ``stop`` is set; then commit and acknowledge what
        was received, and disconnect."""
        committer = self._committer = asyncio.create_task(self._commit_loop(), name="commit")
        try:
            await self._connection_loop(stop)
        finally:
            self._stopping.set()
            if self._driver is not None and not self._driver.closed.is_set():
                self._driver.drop()  # cancelled (a stop past its bound) while connected
            committer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await committer

    # -- connection ----------------------------------------------------------------------
    def _new_client(self) -> mqtt.Client:
        m = self.cfg.mqtt
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=m.client_id,
            protocol=MQTTProtocolVersion.MQTTv5,
            manual_ack=True,
            reconnect_on_failure=False,
        )
        if m.username:
            client.username_pw_set(m.username, m.password.value or None)
        if m.tls:
            client.tls_set(ca_certs=m.ca_file)
        client.on_connect = self._on_connect
        client.on_message = self._on_message
        client.on_disconnect = self._on_disconnect
        return client

    async def _connection_loop(self, stop: asyncio.Event) -> None:
        m = self.cfg.mqtt
        loop = asyncio.get_running_loop()
        backoff = Backoff(m.reconnect_min_s, m.reconnect_max_s, jitter_s=m.reconnect_min_s)
        failures = 0  # connections that ended since the last one that was up
        while not stop.is_set():
            client = self._new_client()
            driver = self._driver = _PahoOnAsyncio(loop, client)
            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = m.session_expiry_s
            props.ReceiveMaximum = m.receive_maximum
            generation = self._generation
            try:
                client.connect(m.host, m.port, m.keepalive_s, clean_start=False, properties=props)
            except (OSError, ValueError) as exc:
                self._limited.warning(
                    "mqtt_connect", "mqtt_connect_failed", host=m.host, port=m.port, error=str(exc)
                )
            else:
                await _first(driver.closed.wait(), stop.wait())
                if self._generation > generation:
                    failures = 0  # we were connected: start backing off afresh
                if stop.is_set() and not driver.closed.is_set():
                    driver.stop_reading()
                    await self._drain()
                    self._stopping.set()  # the disconnect that follows is ours
                    client.disconnect()
                    try:
                        await asyncio.wait_for(driver.closed.wait(), 2)
                    except TimeoutError:
                        log.warning("mqtt_disconnect_timeout", waited_s=2)
                        driver.drop()
            self.connected.clear()
            self.metrics.mqtt_connected.set(0)
            if stop.is_set():
                return
            failures += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), backoff.delay(failures))

    async def _drain(self) -> None:
        """Let the commit loop commit and acknowledge everything received so far."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(10):
                while not self._queue.empty() or not self._idle.is_set():  # noqa: ASYNC110 (two conditions)
                    await asyncio.sleep(0.01)

    def _on_connect(
        self,
        client: mqtt.Client,
        _u: object,
        flags: mqtt.ConnectFlags,
        reason: mqtt.ReasonCode,
        _p: Properties | None,
    ) -> None:
        if reason.is_failure:
            self._limited.warning("mqtt_refused", "mqtt_connect_refused", reason=str(reason))
            client.disconnect()
            return
        self._generation += 1
        self._conn_id = random.getrandbits(62) + 1  # distinct across restarts too
        self._resumed = bool(flags.session_present)
        if not flags.session_present:
            log.info("mqtt_new_session", client_id=self.cfg.mqtt.client_id)
        # retainHandling=2: retained messages are not replayed on (re)subscribe: they were
        # stored when they were published; replaying them would store them again.
        opts = SubscribeOptions(qos=1, retainHandling=2)
        client.subscribe([(f, opts) for f in self.cfg.mqtt.subscriptions])
        self.connected.set()
        self.metrics.mqtt_connected.set(1)
        log.info(
            "mqtt_connected",
            host=self.cfg.mqtt.host,
            port=self.cfg.mqtt.port,
            session_present=flags.session_present,
            generation=self._generation,
        )

    def _on_disconnect(
        self,
        _c: mqtt.Client,
        _u: object,
        _f: object,
        reason: mqtt.ReasonCode,
        _p: Properties | None,
    ) -> None:
        self.connected.clear()
        if not self._stopping.is_set():
            self._limited.warning("mqtt_disconnect", "mqtt_disconnected", reason=str(reason))

    def _on_message(self, client: mqtt.Client, _u: object, msg: mqtt.MQTTMessage) -> None:
        log.debug("message", mid=msg.mid, dup=msg.dup, qos=msg.qos)
        self._queue.put_nowait(
            _Received(
                self._generation,
                client,
                msg,
                int(time.time() * 1000),
                time.monotonic(),
                self._conn_id,
                self._resumed,
            )
        )

    # -- commit --------------------------------------------------------------------------
    async def _commit_loop(self) -> None:
        window = self.cfg.log.group_commit_s
        max_n = self.cfg.log.group_commit_max
        q = self._queue
        while True:
            self.heartbeat = time.monotonic()
            try:
                first = await asyncio.wait_for(q.get(), 1.0)
            except TimeoutError:
                continue
            self._idle.clear()
            try:
                if q.qsize() < max_n - 1 and window > 0:
                    await asyncio.sleep(window)  # group commit: let a few more arrive
                batch = [first]
                while len(batch) < max_n and not q.empty():
                    batch.append(q.get_nowait())
                await self._process(batch)
            except Exception:  # the commit loop must never die quietly
                # _process contains its own errors; this is the last line of defence.
                self.metrics.ingest_errors.inc()
                log.exception("commit_loop_error")
            finally:
                self._idle.set()

    async def _process(self, batch: list[_Received]) -> None:
        try:
            done = await self._commit_group(batch)
        except Exception as exc:  # nothing of the group was stored
            self.metrics.ingest_errors.inc()
            self._limited.warning(
                "commit_unexpected",
                "commit_unexpected_error",
                messages=len(batch),
                error=repr(exc),
                retry="one_by_one",
            )
            log.debug("commit_unexpected_error", exc_info=True)
            await self._isolate(batch)
            return
        if done:
            self.stuck_since = None

    async def _commit_group(self, batch: list[_Received]) -> bool:
        """Commit ``batch`` and acknowledge it; False if stopping before the log took
        it. Raises only if nothing was stored (then retrying cannot double anything)."""
        incoming, quarantined = self._prepare(batch)
        t0 = time.monotonic()
        result = await self._commit_with_retry(incoming, quarantined)
        if result is None:
            return False  # stopping while the log could not be written: nothing is acknowledged
        try:
            self.metrics.commit_seconds.observe(time.monotonic() - t0)
            self.metrics.batch_size.observe(len(batch))
            self._acknowledge(batch)
            self.metrics.observe_commit(incoming, result)
            if any(seq for seq in result.seqs):
                self.committed.set()
        except Exception:  # committed: must not be retried
            self.metrics.ingest_errors.inc()
            log.exception("after_commit_error")
        return True

    async def _isolate(self, batch: list[_Received]) -> None:
        """After a group failed unexpectedly: commit its messages one by one, so one
        poisonous message cannot hold back the others. A message that fails
        ``ISOLATE_ATTEMPTS`` times alone is quarantined (``commit_error``) and
        acknowledged. If even that fails, keep trying (nothing is acknowledged, the
        broker keeps the messages) and let :meth:`healthy` report it."""
        if self.stuck_since is None:
            self.stuck_since = time.monotonic()
        for r in batch:

            def failed(exc: BaseException, r: _Received = r) -> bool:
                self.metrics.ingest_errors.inc()
                self._limited.warning(
                    "commit_isolated", "commit_unexpected_error", mid=r.msg.mid, error=repr(exc)
                )
                return True

            try:
                async for attempt in retrying(
                    COMMIT_BACKOFF, retry_on=failed, stop=self._stopping, on_retry=self._beat
                ):
                    with attempt:
                        if attempt.retry_state.attempt_number > ISOLATE_ATTEMPTS:
                            await self._quarantine_alone(r)
                        elif not await self._commit_group([r]):
                            return
            except Exception:  # stopping: nothing of it is acknowledged
                return
        self.stuck_since = None

    async def _quarantine_alone(self, r: _Received) -> None:
        raw_topic: bytes = r.msg._topic
        payload = bytes(r.msg.payload)
        q = Quarantined(
            r.recv_ms, raw_topic, "commit_error", "the log refused it repeatedly", payload
        )
        self.log.commit([], [q])
        self.metrics.quarantined.labels("commit_error").inc()
        log.error(
            "message_quarantined",
            reason="commit_error",
            topic=raw_topic[:200],
            payload_len=len(payload),
        )
        self._acknowledge([r])

    def _prepare(self, batch: list[_Received]) -> tuple[list[Incoming], list[Quarantined]]:
        incoming: list[Incoming] = []
        quarantined: list[Quarantined] = []
        max_payload = self.cfg.mqtt.max_payload_bytes
        self._unclocked = set()
        for r in batch:
            raw_topic: bytes = r.msg._topic  # as received; .topic raises on bad UTF-8
            payload = bytes(r.msg.payload)
            try:
                try:
                    topic, mapped = admit_message(
                        self.cfg.rules, raw_topic, payload, r.recv_ms, max_payload
                    )
                except UnusableMessage:
                    raise
                except Exception as exc:  # no payload may stop ingest
                    log.exception("mapping_error", topic=raw_topic[:200])
                    raise UnusableMessage("mapping_error", repr(exc)[:300]) from exc
            except UnusableMessage as exc:
                quarantined.append(Quarantined(r.recv_ms, raw_topic, exc.reason, str(exc), payload))
                self.metrics.quarantined.labels(exc.reason).inc()
                self._limited.warning(
                    f"quarantine:{exc.reason}",
                    "message_quarantined",
                    reason=exc.reason,
                    detail=str(exc),
                )
                continue
            if mapped.ts_problem is not None:
                self.metrics.event_time_unusable.labels(mapped.ts_problem).inc()
                self._limited.warning(
                    f"event_time:{mapped.ts_problem}",
                    "event_time_unusable",
                    reason=mapped.ts_problem,
                    topic=topic,
                    message="stored with receive time",
                )
            m = Incoming(
                mapped.stream,
                mapped.key,
                mapped.ts_ms,
                r.recv_ms,
                topic,
                payload,
                mid=r.msg.mid if r.msg.qos else 0,
                dup=bool(r.msg.dup),
                digest=message_digest(raw_topic, payload),
                conn=r.conn,
                resumed=r.resumed,
            )
            incoming.append(m)
            if mapped.ts_problem is not None:
                self._unclocked.add(m)
        return incoming, quarantined

    async def _commit_with_retry(
        self, incoming: list[Incoming], quarantined: list[Quarantined]
    ) -> CommitResult | None:
        """Commit on the event loop's thread: an fsynced SQLite commit of a group takes
        about a millisecond, while handing it to a worker thread made it wait for the
        GIL behind paho's packet parsing (measured: p99 200+ ms under load). Retries
        until the log takes the group or we stop."""
        derive = self._raise_alerts if self.cfg.alarms else None

        def failed(exc: BaseException) -> bool:
            if not isinstance(exc, LogError):
                return False
            # Nothing was stored and nothing is acknowledged: the broker keeps the
            # messages (and, once our receive window is full, stops sending).
            self.metrics.log_errors.inc()
            self.metrics.log_full.set(1 if isinstance(exc, LogFullError) else 0)
            self._limited.warning("log_commit", "commit_failed", error=str(exc))
            return True

        try:
            async for attempt in retrying(
                COMMIT_BACKOFF, retry_on=failed, stop=self._stopping, on_retry=self._beat
            ):
                with attempt:
                    self._evaluation = None
                    if derive is None:
                        result = self.log.commit(incoming, quarantined)
                    else:
                        result = self.log.commit(incoming, quarantined, derive=derive)
        except LogError:
            return None  # stopping while the log could not be written
        self._alerts_committed(result)
        self.metrics.log_full.set(0)
        return result

    def _beat(self, _state: RetryCallState) -> None:
        """While a commit is retried the loop is alive (the watchdog asks)."""
        self.heartbeat = time.monotonic()

    # -- alarms --------------------------------------------------------------------------
    def _raise_alerts(self, conn: sqlite3.Connection, stored: list[Incoming]) -> list[Incoming]:
        """Inside the commit transaction: the alerts the stored readings raise, and the
        alarm state saved with them (exactly once across crashes: docs/edge-agent.md)."""
        if self._alarm_state is None:
            self._alarm_state = load_state(conn)
        try:
            ev = evaluate(self.cfg.alarms, self._alarm_state, stored, unclocked=self._unclocked)
        except Exception as exc:  # an alarm must never stop ingest: commit the readings
            self.metrics.ingest_errors.inc()
            self._limited.warning("alarm_error", "alarm_error", error=repr(exc))
            return []
        save_changes(conn, ev.changes)
        self._evaluation = ev
        now_ms = int(time.time() * 1000)
        return [
            Incoming(ALERTS_STREAM, a.key, a.ts_ms, now_ms, a.topic, a.payload) for a in ev.alerts
        ]

    def _alerts_committed(self, result: CommitResult) -> None:
        ev, self._evaluation = self._evaluation, None
        if ev is None or self._alarm_state is None:
            return
        self._alarm_state.apply(ev.changes)
        if result.derived:
            self.metrics.ingested.labels(ALERTS_STREAM).inc(len(result.derived))
        for alert, rec in zip(ev.alerts, result.derived, strict=False):
            self.metrics.alarms.labels(alert.alarm).inc()
            log.warning(
                "alarm_raised",
                alarm=alert.alarm,
                kind=alert.kind,
                key=alert.key,
                value=alert.value,
                ts_ms=alert.ts_ms,
                topic=alert.source_topic,
                stream=rec.stream,
                seq=rec.seq,
            )

    def _acknowledge(self, batch: list[_Received]) -> None:
        now = time.monotonic()
        gen = self._generation
        for r in batch:
            if r.msg.qos == 0 or r.generation != gen:
                continue  # QoS 0, or connection gone: the broker redelivers, the digest dedups
            rc = r.client.ack(r.msg.mid, r.msg.qos)
            log.debug("ack", mid=r.msg.mid, rc=rc)
            self.metrics.receive_to_ack_seconds.observe(now - r.recv_mono)


async def _first(*aws: Coroutine[Any, Any, Any]) -> None:
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
