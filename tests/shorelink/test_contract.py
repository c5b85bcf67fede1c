"""The Kafka record contract is public: HQ consumers parse these headers."""

from __future__ import annotations

import pytest

from shorelink.contract import Record, canonical_topic, inbox_topic, ingress_topic
from shorelink.errors import ContractError
from shorelink.identity import Identity


def test_record_headers_round_trip() -> None:
    rec = Record(
        Identity("bigblue", "containers", 42),
        b"c-17",
        b'{"t": 4.5}',
        1_700_000_000_123,
        "tokyo",
        "bigblue/deck1/containers/c-17/env",
    )
    hdrs = rec.headers()
    assert dict(hdrs)["sl.seq"] == b"42"
    assert Record.from_kafka(rec.key, rec.value, hdrs) == rec


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        (
            [("sl.stream", b"nav"), ("sl.seq", b"1"), ("sl.ts", b"1"), ("sl.site", b"x")],
            "sl.origin",
        ),
        (
            [
                ("sl.origin", b"s"),
                ("sl.stream", b"nav"),
                ("sl.seq", b"x1"),
                ("sl.ts", b"1"),
                ("sl.site", b"x"),
            ],
            "not a decimal",
        ),
        (
            [
                ("sl.origin", b"s"),
                ("sl.stream", b"nav"),
                ("sl.seq", b"0"),
                ("sl.ts", b"1"),
                ("sl.site", b"x"),
            ],
            "seqs start at 1",
        ),
        (
            [
                ("sl.origin", b"S P"),
                ("sl.stream", b"nav"),
                ("sl.seq", b"1"),
                ("sl.ts", b"1"),
                ("sl.site", b"x"),
            ],
            "bad origin",
        ),
        (
            [
                ("sl.origin", b"\xff"),
                ("sl.stream", b"nav"),
                ("sl.seq", b"1"),
                ("sl.ts", b"1"),
                ("sl.site", b"x"),
            ],
            "UTF-8",
        ),
    ],
)
def test_records_breaking_the_contract_are_rejected_with_the_reason(
    headers: list[tuple[str, bytes]], message: str
) -> None:
    with pytest.raises(ContractError, match=message):
        Record.from_kafka(b"k", b"v", headers)


def test_topic_names() -> None:
    assert ingress_topic("alerts") == "sl.ingress.alerts"
    assert inbox_topic("tokyo", "nav") == "sl.inbox.tokyo.nav"
    assert canonical_topic("containers") == "sl.containers"
    with pytest.raises(ContractError):
        ingress_topic("Bad.Name")
