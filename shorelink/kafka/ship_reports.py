"""Each ship's newest report at a site's Kafka, for ``shorelink fleet status`` and
rollouts (shorelink/fleet/rollout.py): the report stream's canonical topic (``sl.agent``
in the samples) read read_committed from its beginning to its end, as the operations
page's follower reads it (spark_core/ops/follow.py). Only each ship's record of the
highest seq is decoded (a ship writes its reports in seq order, so that is its newest):
700 ships' months of reports cost a header scan each, not a JSON parse. A record that
breaks the contract or is no report is counted and skipped: it came from the sea.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from confluent_kafka import Message

from shorelink.contract import H_ORIGIN, H_SEQ, Record, canonical_topic
from shorelink.errors import ContractError
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.errors import UnknownTopic
from shorelink.kafka.reading import read_to_end
from shorelink.ship_report import ShipReport, decode_report

__all__ = ["FLEET_REPORTS_GROUP", "Reports", "newest_reports"]

#: the consumer group the reports' reader names (never joined nor committed to)
FLEET_REPORTS_GROUP = "shorelink-fleet-status"


@dataclass
class Reports:
    """Per ship its newest report (by the ship's clock) and when the site last heard
    of it (the newest report record's Kafka timestamp, epoch ms)."""

    reports: dict[str, ShipReport] = field(default_factory=dict)
    heard_ms: dict[str, int] = field(default_factory=dict)
    #: records that were no report
    bad: int = 0


def newest_reports(kafka: KafkaEndpoint, stream: str = "agent", timeout: float = 30.0) -> Reports:
    """Every ship's newest report in ``stream``'s canonical topic at ``kafka`` (none
    when the topic does not exist yet); the site heard of a ship at its newest record's
    Kafka timestamp."""
    out = Reports()
    newest: dict[bytes, tuple[int, Message]] = {}
    try:
        for msg in read_to_end(
            kafka,
            [canonical_topic(stream)],
            timeout=timeout,
            group=FLEET_REPORTS_GROUP,
            # an operator waits on the answer: a fetch at a partition's end answers at
            # once, not after librdkafka's 500 ms wait for more
            extra={"fetch.wait.max.ms": 5},
        ):
            headers = msg.headers() or []
            origin, seq = _identity(headers.items() if isinstance(headers, dict) else headers)
            if origin is None or seq is None:
                out.bad += 1
                continue
            _, ts = msg.timestamp()
            name = origin.decode("utf-8", "replace")
            out.heard_ms[name] = max(out.heard_ms.get(name, 0), ts)
            if seq >= newest.get(origin, (-1, msg))[0]:
                newest[origin] = (seq, msg)
    except UnknownTopic:
        pass
    for _, msg in newest.values():
        try:
            rec = Record.from_kafka(msg.key(), msg.value(), msg.headers())
            out.reports[rec.identity.origin] = decode_report(rec.value)
        except ContractError:
            out.bad += 1
    return out


def _identity(headers: Iterable[tuple[str, bytes | str | None]]) -> tuple[bytes | None, int | None]:
    """A record's origin and seq from its headers, unchecked (the winner is checked)."""
    origin = seq = None
    for k, v in headers:
        if k == H_ORIGIN and isinstance(v, bytes):
            origin = v
        elif k == H_SEQ and isinstance(v, bytes) and v.isdigit() and len(v) < 20:
            seq = int(v)
    return origin, seq
