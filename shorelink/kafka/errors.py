"""What can go wrong talking to a site's Kafka, as one small tree under the kernel's root.

librdkafka reports every failure as a ``KafkaException`` holding a ``KafkaError``: a
code and three flags (``retriable``, ``fatal``, ``txn_requires_abort``). What they mean
for a caller is decided here, once, instead of in every caller:

- :class:`KafkaUnavailable`: the cluster did not answer in time (a transport failure,
  a timeout, no broker up): retrying later helps;
- :class:`KafkaAuthError`: the broker refused who the client says it is;
  :class:`KafkaNotAuthorized`: it knows the client and refused the operation (an ACL);
- :class:`UnknownTopic`, :class:`TopicExists`: the answers callers act on;
- :class:`DataLoss`: records a reader had not read yet are gone (retention,
  ``delete_records``, a truncated partition); the reader went on where the partition
  now starts (:class:`~shorelink.kafka.reading.PartitionReader`);
- :class:`KafkaTransactionError` and its four outcomes, raised by
  :class:`~shorelink.kafka.transactions.TransactionalProducer` (the one place a
  transaction ends): :class:`TransactionAborted` (nothing of it is visible; run it
  again), :class:`Fenced` (another producer took over the ``transactional.id``: stop
  writing for good), :class:`ProducerBroken` (the producer is unusable: a new one,
  ``init_transactions``, settles what the old one left), :class:`CommitUnknown` (the
  commit neither succeeded nor failed in time: read what Kafka holds before going on).

Every :class:`KafkaClientError` carries librdkafka's ``code`` (None when the error did
not come from librdkafka) and says whether retrying helps (``retryable``) and whether
the client is unusable (``fatal``). :func:`kafka_errors` is the boundary: a
``KafkaException`` raised inside it leaves as one of these, ``from`` the original.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from confluent_kafka import KafkaError, KafkaException

from shorelink.errors import ShorelinkError

__all__ = [
    "FENCED_CODES",
    "LEADER_MOVING",
    "CommitUnknown",
    "DataLoss",
    "Fenced",
    "KafkaAuthError",
    "KafkaClientError",
    "KafkaNotAuthorized",
    "KafkaTransactionError",
    "KafkaUnavailable",
    "ProducerBroken",
    "TopicExists",
    "TransactionAborted",
    "UnknownTopic",
    "classify",
    "kafka_error",
    "kafka_errors",
]


class KafkaClientError(ShorelinkError):
    """A Kafka client (admin, consumer, producer) failed. ``code``: librdkafka's error
    code (``KafkaError.<NAME>``), or None; ``fatal``: the client is unusable."""

    fatal: bool = False

    def __init__(
        self,
        message: str,
        *,
        code: int | None = None,
        retryable: bool | None = None,
        fatal: bool | None = None,
    ) -> None:
        super().__init__(message, retryable=retryable)
        self.code = code
        if fatal is not None:
            self.fatal = fatal


class KafkaUnavailable(KafkaClientError):
    """The cluster did not answer in time (transport failure, timeout, no broker)."""

    retryable = True


class KafkaAuthError(KafkaClientError):
    """The broker refused who the client says it is (a wrong user or password, a
    certificate that does not verify): trying again will not help."""

    retryable = False


class KafkaNotAuthorized(KafkaClientError):
    """The broker knows the client and refused the operation (no ACL grants it)."""

    retryable = False


class UnknownTopic(KafkaClientError):
    """The topic or partition does not exist (yet)."""


class TopicExists(KafkaClientError):
    """A topic asked to be created exists already."""


class DataLoss(KafkaClientError):
    """A partition no longer holds the offset a reader was to read next
    (``consumed_to``): retention or ``delete_records`` removed records it had not read
    (``consumed_to < reset_to``), or the partition was truncated or recreated below it
    (``consumed_to > reset_to``). The reader goes on at ``reset_to``; ``lost`` counts
    the offsets it skipped (some may have been transaction markers). Like franz-go's
    ``ErrDataLoss``: reported beside the records, never silent
    (:class:`~shorelink.kafka.reading.PartitionReader`)."""

    retryable = False

    def __init__(
        self, topic: str, partition: int, consumed_to: int, reset_to: int, what: str = ""
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.consumed_to = consumed_to
        self.reset_to = reset_to
        moved = (
            f"records {consumed_to}..{reset_to - 1} were deleted before they were read"
            if reset_to > consumed_to
            else f"the partition now ends at {reset_to}, below {consumed_to}"
        )
        text = f"{topic}[{partition}]: {moved}; reading on from {reset_to}"
        super().__init__(f"{what}: {text}" if what else text, code=KafkaError._AUTO_OFFSET_RESET)

    @property
    def lost(self) -> int:
        """Offsets skipped (0 when the partition was truncated below the reader)."""
        return max(0, self.reset_to - self.consumed_to)


class KafkaTransactionError(KafkaClientError):
    """A Kafka transaction did not commit. Nothing of it is visible, except after
    :class:`CommitUnknown`."""


class TransactionAborted(KafkaTransactionError):
    """The transaction was aborted (librdkafka's *abortable* errors, or any failure the
    producer could abort): nothing of it is visible, the producer is usable, running
    the whole transaction again can succeed."""

    retryable = True


class Fenced(KafkaTransactionError):
    """Another producer with this ``transactional.id`` took over: this one must never
    write again, nor re-initialise (it would fence the other one back)."""

    retryable = False
    fatal = True


class ProducerBroken(KafkaTransactionError):
    """The producer is unusable (librdkafka's *fatal* errors other than fencing, or an
    abort that failed): a new producer (``init_transactions``) settles the transaction
    the old one left; retrying with it can succeed."""

    retryable = True
    fatal = True


class CommitUnknown(KafkaTransactionError):
    """The commit kept failing with retriable errors (the broker slow or gone) until
    the deadline, or the producer was asked to close meanwhile: the transaction may or
    may not be visible. Re-create the producer and read what Kafka holds."""

    retryable = True
    fatal = True


#: fatal errors that mean another producer with the same transactional.id took over
FENCED_CODES = frozenset(
    {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
)

#: a partition's leadership moving (just created, its broker fenced a moment, a
#: leader elected): Kafka's protocol marks each retriable, and the next ask, once the
#: client has refreshed its metadata, finds the leader. A partition's error in an admin
#: answer (``list_offsets``) comes without librdkafka's retriable flag: CI met
#: UNKNOWN_LEADER_EPOCH and NOT_LEADER_FOR_PARTITION there (``Admin.offsets`` asks
#: such a partition again)
LEADER_MOVING = frozenset(
    {
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.REPLICA_NOT_AVAILABLE,
        KafkaError.KAFKA_STORAGE_ERROR,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.OFFSET_NOT_AVAILABLE,
    }
)
#: Kafka's retriable errors of an unreachable broker, and of a leadership moving
_UNAVAILABLE = LEADER_MOVING | frozenset(
    {
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._TIMED_OUT,
        KafkaError._TIMED_OUT_QUEUE,
        KafkaError._MSG_TIMED_OUT,
        KafkaError._RESOLVE,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        KafkaError.BROKER_NOT_AVAILABLE,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    }
)
_AUTHENTICATION = frozenset(
    {KafkaError._AUTHENTICATION, KafkaError._SSL, KafkaError.SASL_AUTHENTICATION_FAILED}
)
_NOT_AUTHORIZED = frozenset(
    {
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    }
)
_UNKNOWN_TOPIC = frozenset(
    {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION}
)


def kafka_error(exc: BaseException) -> KafkaError | None:
    """The ``KafkaError`` a ``KafkaException`` carries (None if it carries none)."""
    arg = exc.args[0] if exc.args else None
    return arg if isinstance(arg, KafkaError) else None


def classify(exc: KafkaException | KafkaError, what: str = "") -> KafkaClientError:
    """The tree's error for a librdkafka error; ``what`` (e.g. ``"Kafka at host:9092"``)
    prefixes the message. A fatal error is a producer's (:class:`Fenced` or
    :class:`ProducerBroken`); :class:`~shorelink.kafka.transactions.TransactionalProducer`
    decides the other transaction outcomes itself."""
    err = exc if isinstance(exc, KafkaError) else kafka_error(exc)
    text = err.str() if err is not None else str(exc)
    message = f"{what}: {text}" if what else text
    if err is None:
        return KafkaClientError(message)
    code = err.code()
    kind: type[KafkaClientError]
    if err.fatal():
        kind = Fenced if code in FENCED_CODES else ProducerBroken
    elif code in _AUTHENTICATION:
        kind = KafkaAuthError
    elif code in _NOT_AUTHORIZED:
        kind = KafkaNotAuthorized
    elif code in _UNKNOWN_TOPIC:
        kind = UnknownTopic
    elif code == KafkaError.TOPIC_ALREADY_EXISTS:
        kind = TopicExists
    elif code in _UNAVAILABLE:
        kind = KafkaUnavailable
    else:
        return KafkaClientError(message, code=code, retryable=bool(err.retriable()))
    return kind(message, code=code)


@contextmanager
def kafka_errors(what: str = "") -> Iterator[None]:
    """The boundary: a ``KafkaException`` raised inside leaves as :func:`classify`'s
    error, ``from`` the original (like httpx's ``map_httpcore_exceptions``)."""
    try:
        yield
    except KafkaException as exc:
        raise classify(exc, what) from exc
