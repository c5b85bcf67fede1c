"""A Kafka transactional producer that ends every transaction the way librdkafka defines.

The gateway's ingress writer (core_gateway/ingress.py) and the site application's merge
(spark_core/merge.py) both write in Kafka transactions; how a transaction ends is
librdkafka's protocol, not theirs, so it lives here once (like franz-go's
``GroupTransactSession.End``) and each caller keeps only its reaction to the outcome.

librdkafka's rules (its ``rd_kafka_commit_transaction`` documentation), as applied:

- *retriable* (``KafkaError.retriable()``, neither fatal nor abortable; e.g. the commit
  timed out while the broker is slow or paused): the same call is retried. The commit
  goes on in the background meanwhile, so aborting then would be wrong (``_CONFLICT``).
  Retrying stops at the deadline (three times ``timeout``; the transaction timeout is
  twice ``timeout``, so the broker has aborted an unfinished transaction by then) or
  when the caller asks to close: :class:`CommitUnknown`;
- *abortable* (``txn_requires_abort()``), and any other failure that is not fatal: the
  transaction is aborted (``abort_transaction``, retried the same way) and
  :class:`TransactionAborted` raised: nothing of it is visible, the producer is usable;
- *fatal* (``fatal()``): the producer is unusable. :class:`Fenced` when another producer
  with the same ``transactional.id`` took over (``PRODUCER_FENCED``, ``_FENCED``, a
  fatal ``INVALID_PRODUCER_EPOCH``), else :class:`ProducerBroken`; an abort that fails
  is :class:`ProducerBroken` too.

After :class:`Fenced` the producer refuses everything, :meth:`~TransactionalProducer.init`
included: a fenced writer that re-initialised would fence the new one back, and two
writers of one ``transactional.id`` would take turns for ever. After
:class:`ProducerBroken` or :class:`CommitUnknown` it refuses everything until
:meth:`~TransactionalProducer.init` (a new producer; ``init_transactions`` aborts or
completes the transaction the old one left).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, NoReturn

from confluent_kafka import KafkaError, KafkaException, Producer

from shorelink.kafka.errors import (
    CommitUnknown,
    Fenced,
    KafkaTransactionError,
    ProducerBroken,
    TransactionAborted,
    classify,
    kafka_error,
    kafka_errors,
)
from shorelink.logs import get_logger

__all__ = ["TransactionalProducer"]

log = get_logger(__name__)

#: the transactions' deadline (retrying a commit or an abort), in ``timeout``s
DEADLINE_TIMEOUTS = 3


class TransactionalProducer:
    """One ``transactional.id``'s producer: :meth:`init`, then :meth:`transaction`
    (or :meth:`begin`, :meth:`produce`, :meth:`commit`) per transaction.

    ``config``: the producer's confluent-kafka settings, ``transactional.id`` included
    (``transaction.timeout.ms`` defaults to twice ``timeout``); ``timeout``: seconds per
    Kafka call; ``closing``: set when the caller shuts down, so a commit or an abort
    stops retrying at once. Calls from one thread at a time.
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        *,
        timeout: float,
        closing: threading.Event | None = None,
    ) -> None:
        if not config.get("transactional.id"):
            raise ValueError("a transactional producer needs a transactional.id")
        self.config: dict[str, Any] = {"transaction.timeout.ms": int(timeout * 2000), **config}
        self.transactional_id = str(config["transactional.id"])
        self.timeout = timeout
        self.closing = closing or threading.Event()
        #: retriable errors retried (commit and abort timeouts), for metrics
        self.retries = 0
        self._producer: Producer | None = None
        #: why the producer may not be used (Fenced: for good; else until init())
        self._lost: KafkaTransactionError | None = None

    # -- life -----------------------------------------------------------------------------
    def init(self) -> None:
        """A new producer; ``init_transactions`` fences any older producer of this
        ``transactional.id`` and aborts or completes the transaction it left. Raises
        the tree's error (:class:`Fenced` again once fenced)."""
        if isinstance(self._lost, Fenced):
            raise self._lost
        self._producer, self._lost = None, None
        with kafka_errors(f"cannot init transactions ({self.transactional_id})"):
            p = Producer(self.config)
            p.init_transactions(self.timeout)
        self._producer = p

    @property
    def fenced(self) -> Fenced | None:
        """Set once another producer took over: this one never writes again."""
        return self._lost if isinstance(self._lost, Fenced) else None

    def reachable(self, timeout: float = 2.0) -> bool:
        """Does the cluster answer (and is the producer usable)?"""
        p = self._producer
        if p is None or self._lost is not None:
            return False
        try:
            p.list_topics(timeout=timeout)
        except KafkaException:
            return False
        return True

    def close(self, flush_timeout: float = 5.0) -> None:
        """Deliver what is queued (up to ``flush_timeout`` s) and drop the producer. Never
        raises: a fenced or broken producer has nothing it could still deliver (librdkafka
        raises its fatal error from ``flush`` then), and close runs in clean-ups."""
        p, self._producer = self._producer, None
        if p is None:
            return
        try:
            p.flush(flush_timeout)
        except KafkaException as exc:
            log.info("producer_closed_unflushed", error=str(exc))

    # -- a transaction ----------------------------------------------------------------------
    @contextmanager
    def transaction(self) -> Iterator[TransactionalProducer]:
        """``begin``; the body produces; ``commit``. The body raising anything but the
        tree's transaction errors aborts the transaction, then re-raises."""
        self.begin()
        try:
            yield self
        except KafkaTransactionError:
            raise
        except BaseException:
            if self._lost is None:
                self.abort()
            raise
        self.commit()

    def begin(self) -> None:
        p = self._live()
        try:
            p.begin_transaction()
        except KafkaException as exc:
            self._failed(exc)

    def produce(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Any = None,
        partition: int | None = None,
    ) -> None:
        """Add a record to the transaction (to ``partition``, else its key's); waits for
        room when the local queue is full (a large transaction can outgrow it)."""
        p = self._producer
        if p is None or self._lost is not None:
            p = self._live()
        while True:
            try:
                if partition is None:
                    p.produce(topic, value=value, key=key, headers=headers)
                else:
                    p.produce(topic, value=value, key=key, headers=headers, partition=partition)
                return
            except BufferError:
                p.poll(0.05)  # local queue full: let it drain
            except KafkaException as exc:
                self._failed(exc)

    def flush(self, timeout: float) -> int:
        """Wait up to ``timeout`` s until the records produced so far are acknowledged
        by the brokers (still uncommitted); returns how many are not. :meth:`commit`
        does this itself."""
        return int(self._live().flush(timeout))

    def commit(self) -> None:
        """``commit_transaction`` as librdkafka defines it (module docstring): returns
        once committed, else raises :class:`TransactionAborted`, :class:`Fenced`,
        :class:`ProducerBroken` or :class:`CommitUnknown`."""
        p = self._live()
        deadline = time.monotonic() + self.timeout * DEADLINE_TIMEOUTS
        while True:
            try:
                p.commit_transaction(self.timeout)
                return
            except KafkaException as exc:
                err = kafka_error(exc)
                if err is None or not _only_retriable(err):
                    self._failed(exc)
                if time.monotonic() > deadline or self.closing.is_set():
                    self._lose(
                        CommitUnknown(
                            f"commit outcome unknown after retries: {err.str()}", code=err.code()
                        ),
                        exc,
                    )
                self.retries += 1
                log.warning(
                    "kafka_commit_retry", transactional_id=self.transactional_id, error=err.str()
                )

    def abort(self) -> None:
        """``abort_transaction``, retried while retriable up to the deadline (or until
        closing); raises :class:`Fenced` or :class:`ProducerBroken` if it cannot."""
        p = self._live()
        deadline = time.monotonic() + self.timeout * DEADLINE_TIMEOUTS
        while True:
            try:
                p.abort_transaction(self.timeout)
                return
            except KafkaException as exc:
                err = kafka_error(exc)
                if err is not None and err.fatal():
                    self._lose(_fatal(exc), exc)
                if (
                    err is None
                    or not err.retriable()
                    or time.monotonic() > deadline
                    or self.closing.is_set()
                ):
                    self._lose(
                        ProducerBroken(
                            f"cannot abort transaction: {exc}",
                            code=err.code() if err is not None else None,
                        ),
                        exc,
                    )
                self.retries += 1
                log.warning(
                    "kafka_abort_retry", transactional_id=self.transactional_id, error=err.str()
                )

    # -- the outcomes -------------------------------------------------------------------------
    def _live(self) -> Producer:
        if self._lost is not None:
            raise self._lost
        if self._producer is None:
            raise ProducerBroken(f"producer {self.transactional_id} not initialised")
        return self._producer

    def _failed(self, exc: KafkaException) -> NoReturn:
        """A transaction call failed (not a commit to retry): fatal, the producer is
        lost; else the transaction is aborted. Always raises."""
        err = kafka_error(exc)
        if err is not None and err.fatal():
            self._lose(_fatal(exc), exc)
        self.abort()
        raise TransactionAborted(
            f"transaction aborted: {err.str() if err is not None else exc}",
            code=err.code() if err is not None else None,
        ) from exc

    def _lose(self, error: KafkaTransactionError, cause: BaseException) -> NoReturn:
        """The producer may no longer be used; raise ``error`` (once fenced, it stays
        fenced whatever later calls answer)."""
        if self._lost is None:
            self._lost = error
        elif isinstance(self._lost, Fenced):
            error = self._lost
        raise error from cause


def _fatal(exc: KafkaException) -> KafkaTransactionError:
    """A fatal error's outcome: :class:`Fenced` or :class:`ProducerBroken`."""
    error = classify(exc, "Kafka producer fatal error")
    if isinstance(error, KafkaTransactionError):
        return error
    return ProducerBroken(str(error), code=error.code)


def _only_retriable(err: KafkaError) -> bool:
    """Retry the same call (neither abortable nor fatal)."""
    return bool(err.retriable()) and not err.fatal() and not err.txn_requires_abort()
