"""The kernel's boundaries over the whole input space (docs/boundaries.md): each returns
or raises its documented error, within its row's memory and CPU bound, and never hangs.
A record, a ledger entry or a report from a neighbour that escapes as another
exception stops the reader that met it, at every site that reads it."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from shorelink import strict_json
from shorelink.config import expand_env, load_toml, parse_toml
from shorelink.contract import (
    H_ENTERED,
    H_MQTT_TOPIC,
    H_ORIGIN,
    H_SEQ,
    H_SITE,
    H_STREAM,
    H_TS,
    Record,
    entered_ms,
)
from shorelink.errors import ConfigError, ContractError
from shorelink.identity import Identity
from shorelink.kafka.position import Position, PositionError
from shorelink.ledger import MAX_HOLDINGS_RANGES, decode_entry, encode_entry
from shorelink.proof import (
    CHUNK_RECORDS,
    ShipKey,
    ShipKeys,
    SignatureError,
    leaves_of,
    proofs,
    record_hash,
    sign_records,
)
from shorelink.ranges import RangeSet
from shorelink.ship_report import ShipReport, decode_report, encode_report
from shorelink.wire import (
    Batch,
    Limits,
    WireError,
    WireRecord,
    decode_batch,
    encode_batch,
    peek_header,
)
from tests.bounds import FAST, FILES, KIB, Bound, within
from tests.strategies import HUGE_INTS, any_bytes, any_text, deep_json, json_values, mutated

_HEADER_NAMES = st.sampled_from(
    [H_ORIGIN, H_STREAM, H_SEQ, H_TS, H_SITE, H_MQTT_TOPIC, H_ENTERED, "x"]
)
_HEADER_VALUES = st.one_of(
    st.none(),
    any_bytes(60),
    any_text(30),
    HUGE_INTS.map(lambda n: str(n).encode()),
    st.integers(-(2**70), 2**70).map(lambda n: str(n).encode()),
    st.sampled_from([b"ship-1", b"containers", b"1", b"0" * 30 + b"7", b"\xff", "٣".encode()]),
)


def _good_headers() -> list[tuple[str, bytes | str | None]]:
    rec = Record(Identity("ship-1", "containers", 7), b"k", b"v", 1, "hq", "t/1")
    return list(rec.headers())


@FAST
@given(
    key=st.one_of(st.none(), any_bytes(100)),
    value=st.one_of(st.none(), any_bytes(300)),
    headers=st.one_of(
        st.lists(st.tuples(_HEADER_NAMES, _HEADER_VALUES), max_size=10),
        st.lists(st.tuples(_HEADER_NAMES, _HEADER_VALUES), max_size=4).map(
            lambda extra: _good_headers() + extra
        ),
        st.dictionaries(_HEADER_NAMES, _HEADER_VALUES, max_size=6),
    ),
)
def test_a_kafka_record_is_read_or_refused_with_a_contract_error(
    key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes | str | None]]
) -> None:
    size = (
        len(key or b"") + len(value or b"") + sum(len(v or b"") for _, v in dict(headers).items())
    )
    out = within(
        Bound(64 * KIB, 4, cpu_s=0.5),
        (ContractError,),
        Record.from_kafka,
        key,
        value,
        headers,
        size=size,
    )
    if isinstance(out, Record):
        assert 1 <= out.identity.seq <= 2**63 - 1 and 0 <= out.ts_ms <= 2**63 - 1
    entered = within(Bound(64 * KIB, 4, cpu_s=0.2), (), entered_ms, headers, size=size)
    assert entered is None or 0 <= entered < 10**18


def _ranges_text(pairs: list[tuple[int, int]], reverse: bool) -> bytes:
    parts = [f"{lo}-{lo + span}" if span else f"{lo}" for lo, span in pairs]
    return ",".join(reversed(parts) if reverse else parts).encode()


_LEDGER_BOUND = Bound(256 * KIB, 48, cpu_s=0.5, cpu_per_mib=2)


@FAST
@given(
    key=st.one_of(st.none(), any_bytes(80), st.sampled_from([b"ship-1/containers", b"a/b/c"])),
    value=st.one_of(
        st.none(),
        any_bytes(200),
        mutated(b"1-500,502,504-510"),
        st.lists(st.tuples(st.integers(1, 2**64), st.integers(0, 3)), max_size=50).flatmap(
            lambda pairs: st.builds(_ranges_text, st.just(pairs), st.booleans())
        ),
    ),
)
def test_a_ledger_entry_is_read_or_refused_within_the_bound_on_holes(
    key: bytes | None, value: bytes | None
) -> None:
    out = within(_LEDGER_BOUND, (ContractError,), decode_entry, key, value, size=len(value or b""))
    if not isinstance(out, ContractError):
        assert len(out[2]) <= MAX_HOLDINGS_RANGES


def test_a_ledger_entry_of_holes_listed_backwards_is_read_in_linear_time() -> None:
    """The worst a neighbour can write in one record (no site writes it): the bound on
    holes' worth of single seqs, last first (each added at the front of the lists was
    quadratic), and one more range than the bound (refused before parsing)."""
    seqs = range(2 * MAX_HOLDINGS_RANGES, 0, -2)
    value = ",".join(map(str, seqs)).encode()
    key, _ = encode_entry("ship-1", "containers", RangeSet())
    _, _, held = within(_LEDGER_BOUND, (), decode_entry, key, value, size=len(value))
    assert len(held) == MAX_HOLDINGS_RANGES
    # refused by its count before parsing: the unparsable last range is never read, and
    # nothing of the size of its ranges is built
    over = value + b",not-a-range"
    refused = within(Bound(16 * KIB), (ContractError,), decode_entry, key, over, size=len(over))
    assert isinstance(refused, ContractError)
    assert f"more than {MAX_HOLDINGS_RANGES} ranges" in str(refused)


_REPORT = encode_report(ShipReport(1, "sat", {"containers": (5, 2)}, {"sat": (1, 2)}, 3, 4))


@FAST
@given(
    st.one_of(
        any_bytes(300),
        mutated(_REPORT),
        deep_json(),
        json_values().map(lambda d: strict_json.dumps({"v": 1, "at": 1, "streams": d}).encode()),
    )
)
def test_a_ship_report_is_read_or_refused_with_a_contract_error(payload: bytes) -> None:
    within(Bound(256 * KIB, 16, cpu_s=0.5), (ContractError,), decode_report, payload)


_BATCH = encode_batch(
    Batch(
        "ship-1",
        "containers",
        tuple(
            WireRecord(s, "k", 1_700_000_000_000 + s, "t/1", b'{"t": %d}' % s) for s in range(1, 6)
        ),
    )
)
_SMALL = Limits(max_decompressed_bytes=1024 * 1024)


@FAST
@given(st.one_of(any_bytes(400), mutated(_BATCH, 6), st.binary(min_size=20, max_size=20)))
def test_any_bytes_are_a_batch_or_a_wire_error(data: bytes) -> None:
    """The header is read without the frame; a whole batch costs what
    ``decode_cost_bound`` charges (tests/shorelink/test_wire_cost.py holds the bound for
    bodies built to reach it)."""
    within(Bound(64 * KIB, 1, cpu_s=0.2), (WireError,), peek_header, data, _SMALL)
    within(Bound(4 * 1024 * KIB, 2, cpu_s=1.0), (WireError,), decode_batch, data, _SMALL)


@FAST
@given(st.one_of(any_bytes(300), deep_json(), json_values().map(lambda d: repr(d).encode())))
def test_strict_json_reads_any_bytes_or_raises_value_error(data: bytes) -> None:
    within(Bound(256 * KIB, 16, cpu_s=0.5, cpu_per_mib=2), (ValueError,), strict_json.loads, data)


_TOML = b'site = "hq"\n[kafka]\nbootstrap = "localhost:9092"\nports = [1, 2]\n'
_TOML_BOUND = Bound(1024 * KIB, 64, cpu_s=1.0, cpu_per_mib=8)


@FILES
@given(
    st.one_of(
        any_bytes(300),
        mutated(_TOML),
        st.integers(1, 100_000).map(lambda n: b"a = " + b"[" * n + b"]" * n),
        st.integers(1, 100_000).map(lambda n: b"a = " + b"{b = " * n + b"1" + b"}" * n),
        st.integers(1, 2000).map(lambda n: b"a" + b".a" * n + b" = 1"),
        st.integers(1, 64 * KIB).map(lambda n: b"a" * n + b" = 1"),
    )
)
def test_any_toml_file_is_loaded_or_refused_with_a_config_error(
    tmp_path: Path, data: bytes
) -> None:
    path = tmp_path / "x.toml"
    path.write_bytes(data)
    within(_TOML_BOUND, (ConfigError,), load_toml, path, size=len(data))
    text = data.decode(errors="surrogateescape")
    within(_TOML_BOUND, (ValueError,), parse_toml, text, size=len(data))


def test_a_toml_key_of_one_long_bare_word_is_read_in_linear_time() -> None:
    """A config or ship keys file is read again on change: the key-depth check tried
    at every character of a long bare word took the square of its length (64 KiB,
    one key: 30 s of CPU, the row allows 1.5 s)."""
    for text in ("a" * 64 * KIB + " = 1", "a" * 64 * KIB):
        within(_TOML_BOUND, (ValueError,), parse_toml, text)
    deep = "a" * 32 * KIB + ".a" * 40 + " = 1"
    refused = within(_TOML_BOUND, (ValueError,), parse_toml, deep)
    assert isinstance(refused, ValueError) and "levels" in str(refused)


@FAST
@given(any_text(200), st.dictionaries(st.sampled_from(["SL_A", "SL_B"]), any_text(50)))
def test_env_expansion_of_any_text_is_text_or_a_config_error(
    text: str, env: dict[str, str]
) -> None:
    text = text.replace("$", "${SL_A}", 1).replace("%", "${SL_B:-x}", 1)
    saved = {k: os.environ.get(k) for k in ("SL_A", "SL_B")}
    try:
        for k in saved:
            os.environ.pop(k, None)
        os.environ.update({k: v.replace("\x00", "") for k, v in env.items()})
        out = within(Bound(64 * KIB, 8, cpu_s=0.2), (ConfigError,), expand_env, text, "f")
        if "${SL_A}" in text:  # a variable without a default: its value, or the field named
            if "SL_A" not in env:
                assert isinstance(out, ConfigError) and out.field == "f"
            elif isinstance(out, str):
                assert env["SL_A"].replace("\x00", "") in out
    except UnicodeEncodeError:
        pass  # a lone surrogate cannot be put in the environment at all
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


_PUBLIC = ShipKey.generate().public()
_KEYS = f'require_signatures = true\n[ships]\nship-1 = "{_PUBLIC}"\n'.encode()


@FILES
@given(
    st.one_of(
        any_bytes(300),
        mutated(_KEYS, 6),
        json_values().map(lambda d: _KEYS + b"ship-2 = " + repr(d).encode() + b"\n"),
    )
)
def test_a_ship_keys_file_is_loaded_or_refused_with_a_config_error(
    tmp_path: Path, data: bytes
) -> None:
    path = tmp_path / "keys.toml"
    path.write_bytes(data)
    path.chmod(0o644)
    within(_TOML_BOUND, (ConfigError,), ShipKeys.load, path, size=len(data))


_POSITION = Position.of([Identity("ship-1", "containers", s) for s in (1, 2, 3, 7)]).dumps()


@FAST
@given(st.one_of(any_bytes(300), mutated(_POSITION, 6), deep_json()))
def test_a_position_is_read_or_refused_with_a_position_error(raw: bytes) -> None:
    within(Bound(256 * KIB, 32, cpu_s=0.5, cpu_per_mib=4), (PositionError,), Position.loads, raw)


_SIGNER = ShipKey.generate()
_SIGNED_KEYS = ShipKeys.parse(
    {"require_signatures": True, "ships": {"ship-1": _SIGNER.public()}}, "test"
)
_LEAVES = [record_hash(s, 1000 + s, "k", "t/1", b"%d" % s) for s in range(1, 201)]
_PROOFS = [
    p.encode()
    for p in proofs(1, _LEAVES, sign_records(_SIGNER, "ship-1", "containers", 1, _LEAVES))
]


@FAST
@given(
    origin=st.one_of(st.just("ship-1"), any_text(20)),
    seq=st.one_of(st.integers(1, 201), st.integers(), HUGE_INTS),
    ts=st.one_of(st.integers(1000, 1300), st.integers(), HUGE_INTS),
    key=st.one_of(st.just("k"), any_text(20), any_bytes(20)),
    payload=any_bytes(100),
    proof=st.one_of(
        st.none(),
        any_bytes(300),
        st.sampled_from(_PROOFS[: CHUNK_RECORDS + 2]),
        st.sampled_from(_PROOFS).flatmap(lambda p: mutated(p, 3)),
    ),
)
def test_a_records_proof_is_checked_to_a_verdict_whatever_it_holds(
    origin: str, seq: int, ts: int, key: str | bytes, payload: bytes, proof: bytes | None
) -> None:
    """A neighbour's record whose proof, seq or time are anything: a verdict (None or
    the reason), never an exception that would stop the puller at that record."""
    verdict = within(
        Bound(64 * KIB, 4, cpu_s=0.5),
        (),
        _SIGNED_KEYS.check,
        origin,
        "containers",
        seq,
        ts,
        key,
        "t/1",
        payload,
        proof,
        size=len(payload) + len(proof or b""),
    )
    assert verdict is None or isinstance(verdict, str)
    if verdict is None:
        assert origin == "ship-1" and proof in _PROOFS


_COLUMNS = (
    ["k"] * 200,
    [1000 + s for s in range(1, 201)],
    ["t/1"] * 200,
    [b"%d" % s for s in range(1, 201)],
)
_SIGS = sign_records(_SIGNER, "ship-1", "containers", 1, leaves_of(1, *_COLUMNS))


@FAST
@given(
    origin=st.one_of(st.just("ship-1"), st.just("ship-2")),
    first_seq=st.one_of(st.just(1), st.integers(1, 2**63 - 201)),
    sigs=st.one_of(st.just(_SIGS), any_bytes(300), mutated(_SIGS, 3)),
)
def test_a_batchs_signatures_prove_it_or_are_refused_with_a_signature_error(
    origin: str, first_seq: int, sigs: bytes
) -> None:
    out = within(
        Bound(256 * KIB, 8, cpu_s=0.5),
        (SignatureError,),
        _SIGNED_KEYS.prove_batch,
        origin,
        "containers",
        first_seq,
        _COLUMNS,
        sigs,
        size=len(sigs),
    )
    if isinstance(out, list):
        assert origin == "ship-1" and first_seq == 1 and sigs == _SIGS and len(out) == 200
