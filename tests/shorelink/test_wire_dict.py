"""Batches compressed with a stream's trained dictionary (shorelink/wire_dict.py): a
dictionary must buy bytes on the satellite without opening the decoder to anything a
batch without one could not do: the same bounds (declared size, window, cost), a typed
refusal for a dictionary the decoder lacks, and old batches decoding as before."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import struct
import zlib
from pathlib import Path

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shorelink.errors import ConfigError
from shorelink.wire import (
    FLAG_DICTIONARY,
    FLAG_TEMPLATED,
    Batch,
    Body,
    Limits,
    WireError,
    WireRecord,
    decode_batch,
    decode_columns,
    decode_cost_bound,
    encode_batch,
    frame_batch,
    peek_header,
)
from shorelink.wire_dict import (
    Dictionaries,
    Dictionary,
    consumed_record,
    next_id,
    train,
    training_samples,
)
from tests import wire_bombs
from tests.bounds import KIB, MIB, Bound, measured, within
from tests.shorelink.test_wire import GOOD, batch_of, batches, telemetry
from tests.strategies import any_bytes, deep_json, json_values, mutated

FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

#: a ship's containers: one stretch trains the dictionary, the next is sent with it
_VOYAGE = telemetry(60, 12, seed=5)
TRAIN = _VOYAGE[:480]
SENT = [WireRecord(i + 1, r.key, r.ts_ms, r.topic, r.payload) for i, r in enumerate(_VOYAGE[480:])]


@pytest.fixture(scope="module")
def dictionary() -> Dictionary:
    return train("containers", training_samples(TRAIN, 200), dict_id=40_001, size=16 * 1024)


@pytest.fixture(scope="module")
def other() -> Dictionary:
    return train("containers", training_samples(SENT, 100), dict_id=40_002, size=4 * 1024)


def framed(
    frame: bytes, *, raw_len: int, dict_id: int, count: int = 1, flags: int = FLAG_DICTIONARY
) -> bytes:
    """Any zstd frame behind a header naming ``dict_id`` and a valid checksum (a hostile
    ship's way to the decompressor)."""
    body = Body(flags, 1, count, raw_len, frame, 0, b"", dict_id)
    return frame_batch("bigblue", "containers", body, 1)


def with_dict(raw: bytes, d: Dictionary, *, count: int, raw_len: int | None = None, **kw) -> bytes:  # type: ignore[no-untyped-def]
    """``raw`` compressed with ``d`` and framed as a templated batch naming it."""
    frame = zstandard.ZstdCompressor(level=3, dict_data=d.zstd, **kw).compress(raw)
    length = len(raw) if raw_len is None else raw_len
    return framed(
        frame,
        raw_len=length,
        dict_id=d.dict_id,
        count=count,
        flags=FLAG_DICTIONARY | FLAG_TEMPLATED,
    )


def test_a_batch_sent_with_its_streams_dictionary_comes_back_exactly_and_smaller(
    dictionary: Dictionary,
) -> None:
    """The point of the dictionary: a satellite-sized batch is smaller with it, and the
    records are the same."""
    batch = batch_of(SENT[:200])
    plain = encode_batch(batch)
    data = encode_batch(batch, dictionary=dictionary)
    header = peek_header(data)
    assert header.flags & FLAG_DICTIONARY and header.dict_id == dictionary.dict_id
    assert decode_batch(data, dictionaries=Dictionaries([dictionary])) == batch
    assert len(data) < 0.8 * len(plain)


def test_a_decoder_without_the_named_dictionary_refuses_it_by_a_reason_of_its_own(
    dictionary: Dictionary, other: Dictionary
) -> None:
    """A gateway that lacks the dictionary must say so (the ship then sends without
    one), never call the batch malformed or crash."""
    data = encode_batch(batch_of(SENT[:50]), dictionary=dictionary)
    for held in (None, Dictionaries(), Dictionaries([other])):
        with pytest.raises(WireError) as info:
            decode_batch(data, dictionaries=held)
        assert info.value.reason == "unknown_dictionary"
        assert str(dictionary.dict_id) in str(info.value)


def test_batches_without_a_dictionary_decode_as_before_whatever_the_decoder_holds(
    dictionary: Dictionary,
) -> None:
    assert peek_header(GOOD).dict_id == 0
    assert decode_batch(GOOD, dictionaries=Dictionaries([dictionary])) == decode_batch(GOOD)


def test_a_frame_and_a_header_that_disagree_about_the_dictionary_are_malformed(
    dictionary: Dictionary, other: Dictionary
) -> None:
    """The header names the dictionary; a frame naming another (or one without the
    header's flag) is refused before anything is decompressed."""
    held = Dictionaries([dictionary, other])
    raw = b"\x00" * 64
    # the frame names `other`, the header `dictionary`
    frame = zstandard.ZstdCompressor(dict_data=other.zstd).compress(raw)
    with pytest.raises(WireError, match="malformed"):
        decode_batch(framed(frame, raw_len=len(raw), dict_id=dictionary.dict_id), dictionaries=held)
    # a frame that needs a dictionary, behind a header without the flag
    with pytest.raises(WireError, match="malformed"):
        decode_batch(framed(frame, raw_len=len(raw), dict_id=0, flags=0), dictionaries=held)
    # the flag with dictionary id 0
    with pytest.raises(WireError, match="malformed"):
        peek_header(framed(frame, raw_len=len(raw), dict_id=0))


def test_the_dictionary_id_is_under_the_checksum() -> None:
    """A damaged id is a damaged batch (bad_checksum), not a dictionary the gateway
    lacks."""
    frame = zstandard.ZstdCompressor().compress(b"x")
    data = bytearray(framed(frame, raw_len=1, dict_id=40_001))
    at = 40 + len("bigblue") + len("containers")
    assert struct.unpack_from("<I", data, at)[0] == 40_001
    data[at] ^= 1
    with pytest.raises(WireError, match="bad_checksum"):
        decode_batch(bytes(data))


@settings(FUZZ, max_examples=20)
@given(batches())
def test_any_batch_round_trips_with_a_dictionary(dictionary: Dictionary, batch: Batch) -> None:
    data = encode_batch(batch, dictionary=dictionary)
    assert decode_batch(data, dictionaries=Dictionaries([dictionary])) == batch


@FUZZ
@given(st.binary(max_size=400), st.integers(1, 6), st.sampled_from([0, FLAG_TEMPLATED]))
def test_any_body_compressed_with_a_held_dictionary_only_ever_raises_wire_error(
    dictionary: Dictionary, raw: bytes, count: int, templated: int
) -> None:
    """Arbitrary bytes behind a valid checksum and a dictionary the decoder holds."""
    data = with_dict(raw, dictionary, count=count)
    if not templated:
        h = peek_header(data)
        data = framed(data[h.header_len :], raw_len=h.raw_len, dict_id=h.dict_id, count=count)
    with contextlib.suppress(WireError):
        decode_batch(data, dictionaries=Dictionaries([dictionary]))


@FUZZ
@given(st.data())
def test_edited_real_dictionary_bodies_only_ever_raise_wire_error(
    dictionary: Dictionary, data: st.DataObject
) -> None:
    """Structured frames: a real body (what the encoder builds), bytes of it edited, then
    compressed with the dictionary and framed with a valid checksum."""
    from shorelink.wire_body import build_body

    n = data.draw(st.integers(1, 60))
    _flags, raw, _ = build_body(tuple(SENT[:n]))
    raw = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(raw) - 1))
        raw[at] = data.draw(st.integers(0, 255))
    batch = with_dict(bytes(raw), dictionary, count=n)
    with contextlib.suppress(WireError):
        decode_batch(batch, dictionaries=Dictionaries([dictionary]))


@FUZZ
@given(st.binary(min_size=1, max_size=300))
def test_random_frames_naming_a_held_dictionary_only_ever_raise_wire_error(
    dictionary: Dictionary, frame: bytes
) -> None:
    data = framed(frame, raw_len=100, dict_id=dictionary.dict_id)
    with contextlib.suppress(WireError):
        decode_batch(data, dictionaries=Dictionaries([dictionary]))


@pytest.mark.parametrize("content_size", [True, False], ids=["frame-says-100MB", "frame-silent"])
def test_a_dictionary_frame_declaring_a_huge_size_is_refused_within_the_bound(
    dictionary: Dictionary, content_size: bool
) -> None:
    """100 MB of zeros compressed with a held dictionary, behind a header claiming 1 KB:
    refused before anything of that size is allocated, as without a dictionary."""
    data = with_dict(
        b"\0" * 100_000_000, dictionary, count=1, raw_len=1000, write_content_size=content_size
    )
    held = Dictionaries([dictionary])
    with measured() as m, pytest.raises(WireError) as info:
        decode_batch(data, dictionaries=held)
    assert info.value.reason == ("decompressed_too_large" if content_size else "malformed")
    assert m.peak < 5_000_000
    assert m.peak <= decode_cost_bound(len(data), 1000, 1, 0)


def test_a_dictionary_bomb_of_number_columns_costs_at_most_its_bound(
    dictionary: Dictionary,
) -> None:
    """The security review's body (number columns of width-1 zeros), compressed with a
    dictionary: decoding stays within ``decode_cost_bound``."""
    raw = wire_bombs.number_columns(30, 5_000)
    data = with_dict(raw, dictionary, count=5_000)
    limits = Limits(max_decompressed_bytes=8 * 1024 * 1024)
    h = peek_header(data, limits)
    with measured() as m:
        _, (keys, _, topics, payloads) = decode_columns(data, limits, Dictionaries([dictionary]))
    decoded = sum(map(len, payloads)) + sum(map(len, keys)) + sum(map(len, topics))
    assert m.peak <= decode_cost_bound(len(data), h.raw_len, h.count, decoded)


# ------------------------------------------------------------------ dictionary files


def test_a_directory_of_dictionaries_loads_and_names_each_streams_newest(
    tmp_path: Path, dictionary: Dictionary, other: Dictionary
) -> None:
    """Ships use a stream's newest dictionary; gateways keep every one (old ids keep
    decoding). Written owner-only: a dictionary holds pieces of the fleet's data."""
    for d in (dictionary, other):
        path = d.write(tmp_path)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    held = Dictionaries.load(tmp_path)
    assert held.ids() == [40_001, 40_002]
    newest = held.newest("containers")
    assert newest is not None and newest.dict_id == 40_002
    assert held.newest("nav") is None
    assert Dictionaries.load(None).ids() == []


@pytest.mark.parametrize(
    ("name", "content", "says"),
    [
        ("containers.zdict", None, "not named"),
        ("containers-40009.zdict", None, "own id is 40001"),
        ("containers-40001.zdict", b"not a dictionary", "not a trained zstd dictionary"),
        ("Bad Stream-40001.zdict", None, "not a stream name"),
        ("containers-12.zdict", None, "not in 32768"),
    ],
)
def test_a_file_that_is_not_a_dictionary_fails_the_config_naming_key_and_file(
    tmp_path: Path, dictionary: Dictionary, name: str, content: bytes | None, says: str
) -> None:
    (tmp_path / name).write_bytes(dictionary.data if content is None else content)
    with pytest.raises(ConfigError) as info:
        Dictionaries.load(tmp_path, "uplink.dictionaries_dir")
    assert info.value.field == "uplink.dictionaries_dir"
    assert name in str(info.value) and says in str(info.value)


def test_a_missing_directory_fails_the_config(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a directory"):
        Dictionaries.load(tmp_path / "nope")


def test_new_dictionary_ids_only_grow() -> None:
    """A stream's newest dictionary is the one with the highest id."""
    now = 1_800_000_000.0
    first = next_id([], now)
    assert first == int(now) - 1_577_836_800
    assert next_id([first], now) == first + 1
    assert next_id([first + 5], now + 1) == first + 6
    assert next_id([], now + 10) == first + 10


def test_training_samples_are_the_bodies_the_encoder_compresses() -> None:
    from shorelink.wire_body import build_body

    samples = training_samples(TRAIN, 200)
    first = tuple(
        WireRecord(i + 1, r.key, r.ts_ms, r.topic, r.payload) for i, r in enumerate(TRAIN[:200])
    )
    assert samples[0] == build_body(first)[1]
    assert len(samples) >= 64
    assert zlib.crc32(samples[-1]) != zlib.crc32(samples[0])


# ------------------------------------------------------------------ boundaries

_LINE = json.dumps(
    {"origin": "bigblue", "stream": "containers", "seq": 7, "key": "MSCU1234565",
     "value": '{"t":4.5}', "ts": 1_767_225_600_000, "site": "hq",
     "mqtt_topic": "bigblue/deck1/containers/MSCU1234565/env", "topic": "sl.containers",
     "partition": 0, "offset": 7}
).encode()  # fmt: skip
_DICT_FILE_BOUND = Bound(2 * MIB, 4, cpu_s=1.0, cpu_per_mib=8)


@settings(max_examples=60, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(
        any_bytes(300),
        mutated(_LINE, 6),
        deep_json(),
        json_values().map(lambda v: json.dumps(v).encode()),
    )
)
def test_a_line_of_consume_output_is_read_or_refused_with_a_value_error(raw: bytes) -> None:
    """What headquarters trains on comes from a file an operator made: any bytes end in a
    record or a ValueError the command reports with its file and line."""
    got = within(Bound(256 * KIB, 16, cpu_s=0.5, cpu_per_mib=8), (ValueError,),
                 consumed_record, raw)  # fmt: skip
    if not isinstance(got, ValueError):
        origin, _, record = got
        assert isinstance(origin, str) and isinstance(record.payload, bytes)


def test_a_good_line_of_consume_output_is_the_record_it_names() -> None:
    origin, stream, record = consumed_record(_LINE)
    assert (origin, stream) == ("bigblue", "containers")
    assert record == WireRecord(
        7, "MSCU1234565", 1_767_225_600_000, "bigblue/deck1/containers/MSCU1234565/env",
        b'{"t":4.5}',
    )  # fmt: skip


@settings(
    max_examples=30,
    deadline=3000,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_a_dictionary_file_is_loaded_or_refused_with_a_value_error(
    tmp_path: Path, dictionary: Dictionary, data: st.DataObject
) -> None:
    """A dictionary file comes from headquarters by hand or by the registry: any bytes
    (a corrupt copy, another file) load as a dictionary that works or are refused."""
    raw = data.draw(st.one_of(any_bytes(300), mutated(dictionary.data, 8)))
    path = tmp_path / "containers-40001.zdict"
    path.write_bytes(raw)
    got = within(_DICT_FILE_BOUND, (ValueError,), Dictionary.load, path, size=len(raw))
    if isinstance(got, Dictionary):
        batch = batch_of(SENT[:20])
        assert (
            decode_batch(encode_batch(batch, dictionary=got), dictionaries=Dictionaries([got]))
            == batch
        )
