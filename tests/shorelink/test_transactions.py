"""Every outcome librdkafka documents for a transaction, caused for real against a broker,
as :class:`~shorelink.kafka.transactions.TransactionalProducer` ends it: committed,
committed after a retried timeout, aborted (abortable), fenced, broken (fatal), outcome
unknown (the deadline, or closing). The gateway and the merge write every record through
it: an outcome taken for another writes records twice, loses them, or has two writers
of a site fence each other for ever."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AdminClient,
    NewTopic,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from local_stack.kafka import KafkaBroker
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.errors import (
    CommitUnknown,
    Fenced,
    KafkaAuthError,
    KafkaClientError,
    KafkaNotAuthorized,
    KafkaUnavailable,
    ProducerBroken,
    TopicExists,
    TransactionAborted,
    UnknownTopic,
    classify,
    kafka_errors,
)
from shorelink.kafka.reading import read_to_end
from shorelink.kafka.transactions import TransactionalProducer
from tests.helpers import eventually, unique

#: a broker of its own: it is paused (SIGSTOP), which must not stall other tests
PAUSED_SITE = "txn-pause"


def _topic(bootstrap: str, **config: str) -> str:
    name = unique("txn")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, 1, 1, config=config)], operation_timeout=10)
    futures[name].result(10)
    return name


def _committed(bootstrap: str, topic: str) -> list[bytes]:
    """The values read_committed consumers see in ``topic``."""
    return [
        m.value() or b""
        for m in read_to_end(KafkaEndpoint.plaintext(bootstrap), [topic], settled=True)
    ]


def _producer(bootstrap: str, timeout: float = 5.0, **extra: object) -> TransactionalProducer:
    conf = {"bootstrap.servers": bootstrap, "transactional.id": unique("tid"), "linger.ms": 5}
    return TransactionalProducer({**conf, **extra}, timeout=timeout)


@pytest.fixture
def paused() -> Iterator[Callable[[KafkaBroker], None]]:
    """Pause a broker (SIGSTOP, every thread stopped on return: `Proc.pause`); every
    broker paused is resumed at the end."""
    stopped: list[KafkaBroker] = []

    def pause(broker: KafkaBroker) -> None:
        stopped.append(broker)
        broker.proc.pause()

    yield pause
    for b in stopped:
        b.proc.resume()


def _resume(broker: KafkaBroker) -> None:
    broker.proc.resume()


def test_a_committed_transaction_is_visible_whole(kafka: KafkaBroker) -> None:
    """The baseline: what a transaction produced becomes visible together, once."""
    topic = _topic(kafka.bootstrap)
    txn = _producer(kafka.bootstrap)
    txn.init()
    try:
        with txn.transaction():
            for i in range(3):
                txn.produce(topic, b"k", b"v%d" % i)
    finally:
        txn.close()
    assert _committed(kafka.bootstrap, topic) == [b"v0", b"v1", b"v2"]


def test_an_abortable_error_aborts_the_transaction_and_the_producer_goes_on(
    kafka: KafkaBroker,
) -> None:
    """librdkafka: a record the broker refuses (here larger than the topic's
    max.message.bytes) makes the transaction abortable; the producer aborts it, nothing
    of it is visible (the good records of the same transaction neither), and the
    producer goes on: the writer only has to run its batch again."""
    small = _topic(kafka.bootstrap, **{"max.message.bytes": "1024"})
    other = _topic(kafka.bootstrap)
    txn = _producer(kafka.bootstrap)
    txn.init()
    try:
        with pytest.raises(TransactionAborted) as info, txn.transaction():
            txn.produce(other, b"k", b"same transaction")
            txn.produce(small, b"k", b"x" * 4096)
        assert info.value.retryable and not info.value.fatal
        assert isinstance(info.value.__cause__, KafkaException)
        assert info.value.__cause__.args[0].txn_requires_abort()
        with txn.transaction():
            txn.produce(other, b"k", b"next transaction")
    finally:
        txn.close()
    # (librdkafka 2.16 bumps the epoch only when the refused partition is written
    # again: that transaction is aborted once more, OUT_OF_ORDER_SEQUENCE_NUMBER)
    assert _committed(kafka.bootstrap, other) == [b"next transaction"]
    assert _committed(kafka.bootstrap, small) == []


def test_a_failure_inside_the_transaction_aborts_it(kafka: KafkaBroker) -> None:
    """The writer's own failure half-way (a bug, a stop) must not leave the transaction
    open: the next begin would fail, or a later commit publish half a batch."""
    topic = _topic(kafka.bootstrap)
    txn = _producer(kafka.bootstrap)
    txn.init()
    try:
        with pytest.raises(RuntimeError), txn.transaction():
            txn.produce(topic, b"k", b"half a batch")
            raise RuntimeError("the writer failed")
        with txn.transaction():
            txn.produce(topic, b"k", b"whole")
    finally:
        txn.close()
    assert _committed(kafka.bootstrap, topic) == [b"whole"]


def test_a_fenced_producer_never_writes_nor_reinitialises(kafka: KafkaBroker) -> None:
    """A second producer with the same transactional.id fences the first: the first's
    transaction fails Fenced (not retryable), nothing of it is visible, and it refuses
    to init again (which would fence the new one back: two writers taking turns)."""
    topic = _topic(kafka.bootstrap)
    conf = {"bootstrap.servers": kafka.bootstrap, "transactional.id": unique("tid")}
    old = TransactionalProducer(conf, timeout=5)
    new = TransactionalProducer(conf, timeout=5)
    old.init()
    new.init()
    try:
        with pytest.raises(Fenced) as info, old.transaction():
            old.produce(topic, b"k", b"zombie")
        assert info.value.fatal and not info.value.retryable
        assert old.fenced is not None
        with pytest.raises(Fenced):
            old.init()
        with pytest.raises(Fenced):
            old.begin()
        with new.transaction():
            new.produce(topic, b"k", b"the one writer")
    finally:
        old.close(0)
        new.close()
    assert _committed(kafka.bootstrap, topic) == [b"the one writer"]


def test_closing_a_fenced_producer_with_a_record_queued_does_not_raise(
    kafka: KafkaBroker, caplog: pytest.LogCaptureFixture
) -> None:
    """librdkafka raises a fenced producer's fatal error from ``flush``; ``close`` runs
    in clean-ups (the merge's, the gateway's), where it must not replace the error that
    led there (found by the suite on three workers: the fenced merge's ``close``)."""
    topic = _topic(kafka.bootstrap)
    conf = {"bootstrap.servers": kafka.bootstrap, "transactional.id": unique("tid")}
    old = TransactionalProducer(conf, timeout=5)
    new = TransactionalProducer(conf, timeout=5)
    old.init()
    new.init()  # fences old
    try:
        old.begin()
        old.produce(topic, b"k", b"zombie")  # adding the partition fails: fenced, fatal
        with caplog.at_level(logging.INFO, logger="shorelink.kafka.transactions"):
            old.close(10)
        assert "event=producer_closed_unflushed" in caplog.text
        assert "fenced" in caplog.text
    finally:
        new.close()
    assert _committed(kafka.bootstrap, topic) == []


def test_a_fatal_error_breaks_the_producer(secure_kafka: KafkaBroker) -> None:
    """librdkafka: a transactional.id the principal may not use is fatal (the producer
    is unusable); it is ProducerBroken, not Fenced: nobody took over, a new producer
    with another principal or id can write."""
    user, password = unique("txn-user"), uuid.uuid4().hex
    admin = AdminClient(
        {"bootstrap.servers": secure_kafka.bootstrap, **secure_kafka.admin.client_config()}
    )
    upsert = UserScramCredentialUpsertion(
        user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), password.encode()
    )
    for fut in admin.alter_user_scram_credentials([upsert]).values():
        fut.result(10)
    auth = secure_kafka.admin.as_user(user, password)
    conf = {
        "bootstrap.servers": secure_kafka.bootstrap,
        **auth.client_config(),
        "transactional.id": unique("not-granted"),
    }
    txn = TransactionalProducer(conf, timeout=5)
    with pytest.raises(ProducerBroken) as info:
        txn.init()
    assert info.value.fatal and info.value.code == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    with pytest.raises(ProducerBroken):
        txn.begin()


def test_a_commit_timing_out_is_retried_and_commits_once(
    kafka_sites: Callable[..., dict[str, KafkaBroker]],
    paused: Callable[[KafkaBroker], None],
) -> None:
    """librdkafka: a commit that timed out goes on in the background and may only be
    retried (an abort would conflict). The broker is paused across the commit: the
    retry commits once it is back, and the records are visible once."""
    broker = kafka_sites(PAUSED_SITE)[PAUSED_SITE]
    topic = _topic(broker.bootstrap)
    txn = _producer(broker.bootstrap, timeout=2.0)
    txn.init()
    try:
        txn.begin()
        txn.produce(topic, b"k", b"once")
        assert txn.flush(10) == 0  # on the broker: only the commit is paused
        with ThreadPoolExecutor(1) as pool:
            paused(broker)
            done: Future[None] = pool.submit(txn.commit)
            eventually(lambda: txn.retries >= 1, 20, "a commit retried")
            _resume(broker)
            done.result(30)
    finally:
        txn.close()
    assert _committed(broker.bootstrap, topic) == [b"once"]


def _unknown_commit(
    broker: KafkaBroker, paused: Callable[[KafkaBroker], None], *, close: bool
) -> tuple[TransactionalProducer, str, CommitUnknown, float]:
    topic = _topic(broker.bootstrap)
    closing = threading.Event()
    conf = {"bootstrap.servers": broker.bootstrap, "transactional.id": unique("tid")}
    txn = TransactionalProducer(conf, timeout=1.0, closing=closing)
    txn.init()
    txn.begin()
    txn.produce(topic, b"k", b"maybe")
    # on the broker before it pauses: only the commit is left hanging (a record still
    # in flight would time out with the transaction: an abortable error, not this)
    assert txn.flush(10) == 0
    paused(broker)
    try:
        t0 = time.monotonic()
        if close:
            closing.set()
        with pytest.raises(CommitUnknown) as info:
            txn.commit()
        took = time.monotonic() - t0
    finally:
        _resume(broker)
    return txn, topic, info.value, took


def test_a_commit_still_failing_at_the_deadline_is_unknown(
    kafka_sites: Callable[..., dict[str, KafkaBroker]],
    paused: Callable[[KafkaBroker], None],
) -> None:
    """Past the deadline (three timeouts; the transaction timeout is two) the commit's
    outcome is unknown: the producer is unusable until a new one settles the
    transaction (init_transactions), after which it is visible whole or not at all."""
    broker = kafka_sites(PAUSED_SITE)[PAUSED_SITE]
    txn, topic, exc, took = _unknown_commit(broker, paused, close=False)
    try:
        assert exc.fatal and exc.retryable
        assert took >= 3.0, "gave up before the deadline"
        with pytest.raises(CommitUnknown):
            txn.begin()
        eventually(broker.ready, 30, "the broker answers again")
        txn.init()  # settles the transaction the old producer left
        with txn.transaction():
            txn.produce(topic, b"k", b"after")
    finally:
        txn.close()
    assert _committed(broker.bootstrap, topic) in ([b"after"], [b"maybe", b"after"])


def test_a_commit_stops_retrying_when_asked_to_close(
    kafka_sites: Callable[..., dict[str, KafkaBroker]],
    paused: Callable[[KafkaBroker], None],
) -> None:
    """A writer shutting down must not wait out the whole deadline on a broker that is
    gone: the commit gives up after its first timeout (outcome unknown)."""
    broker = kafka_sites(PAUSED_SITE)[PAUSED_SITE]
    txn, _, exc, took = _unknown_commit(broker, paused, close=True)
    txn.close(0)
    assert exc.fatal
    assert took < 3.0, "kept retrying while closing"


@pytest.mark.parametrize(
    ("error", "kind", "retryable"),
    [
        (KafkaError(KafkaError.PRODUCER_FENCED, "x", fatal=True), Fenced, False),
        (KafkaError(KafkaError._FENCED, "x", fatal=True), Fenced, False),
        (KafkaError(KafkaError.INVALID_PRODUCER_EPOCH, "x", fatal=True), Fenced, False),
        (
            KafkaError(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "x", fatal=True),
            ProducerBroken,
            True,
        ),
        (KafkaError(KafkaError._AUTHENTICATION, "x"), KafkaAuthError, False),
        (KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "x"), KafkaNotAuthorized, False),
        (KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART, "x"), UnknownTopic, False),
        (KafkaError(KafkaError.TOPIC_ALREADY_EXISTS, "x"), TopicExists, False),
        (KafkaError(KafkaError._TRANSPORT, "x"), KafkaUnavailable, True),
        (KafkaError(KafkaError._TIMED_OUT, "x"), KafkaUnavailable, True),
        # a partition's error in an admin answer, without librdkafka's retriable flag
        (KafkaError(KafkaError.UNKNOWN_LEADER_EPOCH, "x"), KafkaUnavailable, True),
        (KafkaError(KafkaError.FENCED_LEADER_EPOCH, "x"), KafkaUnavailable, True),
        (KafkaError(KafkaError.OFFSET_NOT_AVAILABLE, "x"), KafkaUnavailable, True),
        (KafkaError(KafkaError.INVALID_CONFIG, "x"), KafkaClientError, False),
        (KafkaError(KafkaError.INVALID_CONFIG, "x", retriable=True), KafkaClientError, True),
    ],
)
def test_librdkafka_errors_map_to_one_tree(
    error: KafkaError, kind: type[KafkaClientError], retryable: bool
) -> None:
    """Callers act on the tree (is it fenced? does retrying help?), never on codes: a
    code classified wrong in one place would be wrong everywhere, and visible here."""
    out = classify(KafkaException(error), "Kafka at h:9092")
    assert type(out) is kind
    assert out.retryable is retryable
    assert out.code == error.code()
    assert str(out).startswith("Kafka at h:9092: ")


def test_the_boundary_raises_from_the_librdkafka_error() -> None:
    """``raise ... from``: the original error stays reachable for a log or a debugger."""
    original = KafkaException(KafkaError(KafkaError._ALL_BROKERS_DOWN, "down"))
    with pytest.raises(KafkaUnavailable) as info, kafka_errors("listing topics"):
        raise original
    assert info.value.__cause__ is original
