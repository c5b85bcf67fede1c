"""How the merge names a neighbour's relay topic as a source (spark_core/pull.py): the
name carries the topic's id, so a recreated topic is a new source, and it must always
lead back to the stream, whatever characters the id (base64) holds."""

from __future__ import annotations

import base64

from hypothesis import given
from hypothesis import strategies as st

from shorelink.contract import relay_topic
from spark_core.merge_state import pulled_source, source_entry, source_stream, topic_stream
from tests.strategies import DIGITS, LOWER, words

_NAME = words(LOWER, LOWER + DIGITS + "-", 20)


@given(
    neighbour=_NAME,
    entry=_NAME,
    stream=_NAME,
    raw_id=st.binary(min_size=16, max_size=16),
)
def test_a_pulled_source_names_its_stream_whatever_its_topic_id_holds(
    neighbour: str, entry: str, stream: str, raw_id: bytes
) -> None:
    # Kafka's topic ids print as base64, "/" and "+" included (the bug this guards:
    # an id with a "/" made every record of that topic a dead letter)
    topic_id = base64.b64encode(raw_id).decode().rstrip("=")
    source = pulled_source(neighbour, topic_id, relay_topic(entry, stream))
    assert source_stream(source) == stream
    # the entry a record pulled from it files under: the topic's, never its sl.site
    assert source_entry(source) == entry
    # never taken for a local topic: the purge deletes only from those
    assert topic_stream(source) is None


def test_local_sources_keep_their_streams_and_other_names_have_none() -> None:
    assert source_stream("sl.ingress.alerts") == "alerts"
    assert source_stream("sl.ledger") is None
    assert source_stream("hq/AAAA/sl.ledger") is None
    assert source_stream("hq/AAAA/sl.relay.tokyo") is None
    # what a local topic holds entered here
    assert source_entry("sl.ingress.alerts") is None
    assert source_entry("hq/AAAA/sl.ledger") is None
