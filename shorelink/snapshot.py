"""A latest-value snapshot record's value: which record it copies, and that record's
payload (docs/edge-agent.md, "Newest first?").

A ship copies each key's newest reading of a long backlog into a stream of its own
(edge_agent/latest.py), sent ahead of the backlog. The copy is a record with its own
identity; its key, event time (``sl.ts``) and MQTT topic (``sl.mqtt_topic``) are the
original's, and its value is :func:`encode_copy`'s ASCII JSON::

    {"copy_of": {"stream": "containers", "seq": 1799873}, "payload": "<the original's payload>"}

with ``"payload_b64"`` (base64) in place of ``"payload"`` when the original's payload
is not UTF-8. The record contract's headers stay as they are: the copy says what it
copies in its value, and :func:`decode_copy` is how a reader ashore reads it back.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass

from shorelink import strict_json
from shorelink.boundary import boundary
from shorelink.errors import ContractError
from shorelink.identity import check_name

__all__ = ["Copy", "decode_copy", "encode_copy"]


@dataclass(frozen=True, slots=True)
class Copy:
    """What a snapshot record says: it copies ``(stream, seq)`` of its origin, whose
    value was ``payload``."""

    stream: str
    seq: int
    payload: bytes


def encode_copy(stream: str, seq: int, payload: bytes) -> bytes:
    """The value of a copy of ``(stream, seq)`` whose value is ``payload``."""
    body: dict[str, object] = {"copy_of": {"stream": stream, "seq": seq}}
    try:
        body["payload"] = payload.decode()
    except UnicodeDecodeError:
        body["payload_b64"] = base64.b64encode(payload).decode()
    return json.dumps(body, separators=(",", ":")).encode()


@boundary
def decode_copy(value: bytes) -> Copy:
    """The :class:`Copy` a snapshot record's value holds; ``ValueError`` for anything
    :func:`encode_copy` does not write."""
    try:
        body = strict_json.loads(value)
        of = body["copy_of"]
        stream, seq = check_name("stream", of["stream"]), of["seq"]
        if type(seq) is not int or not 1 <= seq < 2**63:
            raise ValueError(f"bad seq {seq!r:.40}")
        if "payload" in body:
            payload = body["payload"].encode()
        else:
            payload = base64.b64decode(body["payload_b64"], validate=True)
    except (KeyError, TypeError, AttributeError, IndexError, binascii.Error) as exc:
        raise ValueError(f"not a snapshot record: {exc!r:.80}") from None
    except (ValueError, ContractError) as exc:  # JSON, UTF-8, name, seq
        raise ValueError(f"not a snapshot record: {exc!s:.200}") from None
    return Copy(stream, seq, payload)
