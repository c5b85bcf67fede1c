"""The shared kernel: record identity, seq ranges, the Kafka record contract, topic
creation and the batch wire format. edge_agent, core_gateway and spark_core import this
package; they never import each other, and it imports nothing of the project above it
(tests/test_layout.py)."""

from shorelink.contract import Record, canonical_topic, dead_topic, ingress_topic
from shorelink.errors import ConfigError, ContractError, ShorelinkError
from shorelink.identity import Identity
from shorelink.ranges import RangeSet
from shorelink.wire import Batch, WireError, WireRecord, decode_batch, encode_batch

__all__ = [
    "Batch",
    "ConfigError",
    "ContractError",
    "Identity",
    "RangeSet",
    "Record",
    "ShorelinkError",
    "WireError",
    "WireRecord",
    "canonical_topic",
    "dead_topic",
    "decode_batch",
    "encode_batch",
    "ingress_topic",
]
