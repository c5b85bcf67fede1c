"""A latest-value snapshot record's value (shorelink/snapshot.py): what a ship writes
reads back as the record it copies, whatever the payload; anything else a reader
ashore meets is a ValueError, within its bound (docs/boundaries.md)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shorelink.snapshot import Copy, decode_copy, encode_copy
from tests.bounds import FAST, KIB, Bound, within
from tests.strategies import any_bytes, deep_json, json_values, mutated

_SAMPLE = encode_copy("containers", 42, b'{"t": 4.5}')


@FAST
@given(any_bytes(400), st.integers(1, 2**63 - 1))
def test_any_payload_reads_back_from_its_copy(payload: bytes, seq: int) -> None:
    """A reading copied into a snapshot must reach shore byte for byte."""
    value = encode_copy("containers", seq, payload)
    assert value.isascii()
    assert decode_copy(value) == Copy("containers", seq, payload)


@FAST
@given(
    st.one_of(
        any_bytes(300),
        mutated(_SAMPLE),
        deep_json(),
        json_values().map(lambda d: repr(d).encode()),
        st.builds(
            lambda s, n, p: (
                b'{"copy_of":{"stream":' + s + b',"seq":' + n + b'},"payload":' + p + b"}"
            ),
            st.sampled_from([b'"a"', b'"A"', b'"ledger"', b"1", b"null", b'"\\ud800"']),
            st.sampled_from([b"0", b"-1", b"1.5", b"1e400", b"9" * 30, b'"1"', b"true"]),
            st.sampled_from([b'"x"', b'"\\udfff"', b"1", b"[]"]),
        ),
    )
)
def test_any_value_is_a_copy_or_a_value_error(data: bytes) -> None:
    within(Bound(256 * KIB, 16, cpu_s=0.5, cpu_per_mib=2), (ValueError,), decode_copy, data)
