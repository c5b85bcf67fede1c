"""Each ship's newest report at a site's Kafka, for ``shorelink fleet status`` and
rollouts (shorelink/fleet/rollout.py): the report stream's canonical topic (``sl.agent``
in the samples) read read_committed from its beginning to its end, as the operations
page's follower reads it (spark_core/ops/follow.py). A record that breaks the contract or
is no report is counted and skipped: it came from the sea.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shorelink.contract import Record, canonical_topic
from shorelink.errors import ContractError
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.errors import UnknownTopic
from shorelink.kafka.reading import read_to_end
from shorelink.ship_report import ShipReport, decode_report

__all__ = ["Reports", "newest_reports"]


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
    when the topic does not exist yet)."""
    out = Reports()
    try:
        for msg in read_to_end(
            kafka, [canonical_topic(stream)], timeout=timeout, group="shorelink-fleet-status"
        ):
            try:
                rec = Record.from_kafka(msg.key(), msg.value(), msg.headers())
                report = decode_report(rec.value)
            except ContractError:
                out.bad += 1
                continue
            ship = rec.identity.origin
            last = out.reports.get(ship)
            if last is None or report.at_ms >= last.at_ms:
                out.reports[ship] = report
            _, ts = msg.timestamp()
            out.heard_ms[ship] = max(out.heard_ms.get(ship, 0), ts)
    except UnknownTopic:
        pass
    return out
