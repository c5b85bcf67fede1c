"""The Kafka record contract is public: HQ consumers parse these headers."""

from __future__ import annotations

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from shorelink.contract import (
    KAFKA_MAX_MESSAGE_BYTES,
    MAX_RECORD_BYTES,
    Record,
    canonical_topic,
    ingress_topic,
    oversized_record,
    record_bytes,
)
from shorelink.errors import ContractError
from shorelink.identity import Identity
from shorelink.wire import (
    Batch,
    Body,
    WireError,
    WireRecord,
    decode_batch,
    encode_batch,
    frame_batch,
)
from shorelink.wire_body import build_body


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
                ("sl.origin", b"s"),
                ("sl.stream", b"nav\n"),  # a name is matched whole: no final newline
                ("sl.seq", b"1"),
                ("sl.ts", b"1"),
                ("sl.site", b"x"),
            ],
            "bad stream",
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
    assert canonical_topic("containers") == "sl.containers"
    with pytest.raises(ContractError):
        ingress_topic("Bad.Name")
    # sl.ledger and sl.links are no stream's: no stream takes those names anywhere (a
    # config, a record, a neighbour's topic read for history)
    for name in ("ledger", "links"):
        with pytest.raises(ContractError, match="is not a stream's topic"):
            canonical_topic(name)
        with pytest.raises(ContractError, match="is not a stream's topic"):
            Identity("ship1", name, 1)


# -- one record size limit, checked at every hop (MAX_RECORD_BYTES) -------------------------
def _at(size: int, key: str = "c-17", topic: str = "bigblue/d1/containers/c-17/env") -> WireRecord:
    """A record whose payload + key + topic bytes are exactly ``size``."""
    return WireRecord(1, key, 1_700_000_000_000, topic, b"x" * (size - len(key) - len(topic)))


def crafted_batch(origin: str, stream: str, records: tuple[WireRecord, ...]) -> bytes:
    """A batch framed without :func:`encode_batch`'s checks, as a hostile ship could."""
    flags, raw, decoded = build_body(records)
    frame = zstandard.ZstdCompressor(level=3, write_content_size=True).compress(raw)
    body = Body(flags, records[0].seq, len(records), len(raw), frame, decoded)
    return frame_batch(origin, stream, body, 1)


def test_a_record_at_the_limit_crosses_the_wire_and_one_byte_more_does_not() -> None:
    """The wire format is where a ship's record meets the gateway: a record one byte over
    the limit must be refused on both sides, so no hop downstream ever sees one."""
    ok = Batch("ship1", "containers", (_at(MAX_RECORD_BYTES),))
    assert decode_batch(encode_batch(ok)).records == ok.records
    over = (_at(MAX_RECORD_BYTES + 1),)
    with pytest.raises(WireError) as exc:
        encode_batch(Batch("ship1", "containers", over))
    assert exc.value.reason == "record_too_large"
    with pytest.raises(WireError) as exc:
        decode_batch(crafted_batch("ship1", "containers", over))
    assert exc.value.reason == "record_too_large"


@settings(max_examples=12, deadline=None)
@given(
    extra=st.integers(-3, 3),
    key=st.text(min_size=1, max_size=40),
    topic=st.text(min_size=1, max_size=80),
    at=st.integers(0, 4),
)
def test_the_limit_counts_utf8_bytes_of_key_topic_and_payload(
    extra: int, key: str, topic: str, at: int
) -> None:
    """Keys and topics are counted in UTF-8 bytes (what Kafka stores), wherever in a
    batch the large record stands."""
    k, t = len(key.encode()), len(topic.encode())
    size = MAX_RECORD_BYTES + extra
    big = WireRecord(1, key, 1, topic, b"y" * (size - k - t))
    small = [WireRecord(1, "k", 1, "t", b"z")] * 5
    recs = tuple(r._replace(seq=i + 1) for i, r in enumerate([*small[:at], big, *small[at + 1 :]]))
    assert record_bytes(key, big.payload, topic) == size
    assert (oversized_record(*_columns(recs)) is not None) == (size > MAX_RECORD_BYTES)
    data = crafted_batch("ship1", "containers", recs)
    if size > MAX_RECORD_BYTES:
        with pytest.raises(WireError, match="record_too_large"):
            decode_batch(data)
    else:
        assert decode_batch(data).records == recs


def _columns(recs: tuple[WireRecord, ...]) -> tuple[list[str], list[bytes], list[str]]:
    return [r.key for r in recs], [r.payload for r in recs], [r.topic for r in recs]


def test_every_topic_and_producer_takes_a_record_at_the_limit() -> None:
    """Kafka's own limits sit above the record limit at every hop (topics and producers
    are made through these two helpers only)."""
    from shorelink.kafka.endpoint import KafkaEndpoint
    from shorelink.kafka.topics import TopicSpec, producer_config

    cfg = TopicSpec("t").new_topic().config
    assert int(cfg["max.message.bytes"]) == KAFKA_MAX_MESSAGE_BYTES > MAX_RECORD_BYTES
    conf = producer_config(KafkaEndpoint.plaintext("x:1"), {"transactional.id": "t"})
    assert conf["message.max.bytes"] == KAFKA_MAX_MESSAGE_BYTES and conf["acks"] == "all"
