"""Ship signatures (shorelink/proof.py): a record's proof holds for exactly the record
its ship signed, whatever the batch's size and wherever the record stands in it, and
for no change of any byte of the record, the proof or the chunk; the wire format
carries the signatures, and a batch whose signatures were cut or changed is refused."""

from __future__ import annotations

import contextlib
import tomllib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shorelink.errors import ConfigError
from shorelink.proof import (
    CHUNK_RECORDS,
    KEY_ID_BYTES,
    SIGNATURE_BYTES,
    Proof,
    ShipKey,
    ShipKeys,
    SignatureError,
    WatchedShipKeys,
    chunks,
    key_cause,
    key_id_of,
    leaves_of,
    merkle_levels,
    merkle_path,
    path_length,
    proofs,
    record_hash,
    root_from_path,
)
from shorelink.wire import (
    FLAG_SIGNED,
    Batch,
    WireError,
    WireRecord,
    decode_batch,
    decode_columns,
    encode_batch,
    peek_header,
)
from tests.helpers import eventually

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
KEY = ShipKey.generate()
OTHER = ShipKey.generate()
KEYS = ShipKeys.parse({"ships": {"bigblue": KEY.public()}})


def records(first: int, n: int, salt: bytes = b"") -> tuple[WireRecord, ...]:
    return tuple(
        WireRecord(
            first + i, f"MSCU{i % 5}", 1_767_225_600_000 + i, f"b/{i % 5}/env", b"%d" % i + salt
        )
        for i in range(n)
    )


def signed_batch(first: int, n: int) -> tuple[bytes, list[Proof], tuple[WireRecord, ...]]:
    recs = records(first, n)
    data = encode_batch(Batch("bigblue", "containers", recs), key=KEY)
    h, cols = decode_columns(data)
    leaves = leaves_of(h.first_seq, *cols)
    return data, proofs(h.first_seq, leaves, h.signatures), recs


@FUZZ
@given(st.integers(1, 70), st.data())
def test_every_leaf_of_any_tree_proves_its_root_and_no_other_leaf_does(
    n: int, data: st.DataObject
) -> None:
    leaves = [record_hash(i, i, "k", "t", b"%d" % i) for i in range(n)]
    levels = merkle_levels(leaves)
    root = levels[-1][0]
    i = data.draw(st.integers(0, n - 1))
    path = merkle_path(levels, i)
    assert len(path) == path_length(n, i)
    assert root_from_path(leaves[i], n, i, path) == root
    j = data.draw(st.integers(0, n - 1))
    if j != i:
        assert root_from_path(leaves[j], n, i, path) != root
        with contextlib.suppress(ValueError):  # a path of another length for j
            assert root_from_path(leaves[i], n, j, path) != root


@FUZZ
@given(st.integers(1, 3 * CHUNK_RECORDS + 5), st.integers(1, 2**40), st.data())
def test_each_record_of_a_signed_batch_is_proved_alone_and_any_change_breaks_it(
    n: int, first: int, data: st.DataObject
) -> None:
    wire, ps, recs = signed_batch(first, n)
    assert len(ps) == n and peek_header(wire).flags & FLAG_SIGNED
    i = data.draw(st.integers(0, n - 1))
    r, proof = recs[i], ps[i].encode()
    assert (
        KEYS.check("bigblue", "containers", r.seq, r.ts_ms, r.key, r.topic, r.payload, proof)
        is None
    )
    field = data.draw(st.sampled_from(["origin", "stream", "seq", "ts", "key", "topic", "payload"]))
    changed = {
        "origin": ("bigblue2", "containers", r.seq, r.ts_ms, r.key, r.topic, r.payload),
        "stream": ("bigblue", "nav", r.seq, r.ts_ms, r.key, r.topic, r.payload),
        "seq": ("bigblue", "containers", r.seq + 1, r.ts_ms, r.key, r.topic, r.payload),
        "ts": ("bigblue", "containers", r.seq, r.ts_ms + 1, r.key, r.topic, r.payload),
        "key": ("bigblue", "containers", r.seq, r.ts_ms, r.key + "x", r.topic, r.payload),
        "topic": ("bigblue", "containers", r.seq, r.ts_ms, r.key, r.topic + "x", r.payload),
        "payload": ("bigblue", "containers", r.seq, r.ts_ms, r.key, r.topic, r.payload + b"x"),
    }[field]
    keys = ShipKeys.parse({"ships": {"bigblue": KEY.public(), "bigblue2": KEY.public()}})
    assert keys.check(*changed, proof) is not None
    at = data.draw(st.integers(0, len(proof) - 1))
    flipped = (
        proof[:at] + bytes([proof[at] ^ (1 << data.draw(st.integers(0, 7)))]) + proof[at + 1 :]
    )
    assert (
        KEYS.check("bigblue", "containers", r.seq, r.ts_ms, r.key, r.topic, r.payload, flipped)
        is not None
    )


def test_another_key_proves_nothing_and_a_ship_without_key_follows_the_policy() -> None:
    _, ps, recs = signed_batch(1, 10)
    r = recs[3]
    args = ("bigblue", "containers", r.seq, r.ts_ms, r.key, r.topic, r.payload)
    wrong = ShipKeys.parse({"ships": {"bigblue": OTHER.public()}})
    assert "does not verify" in (wrong.check(*args, ps[3].encode()) or "")
    assert "no proof" in (KEYS.check(*args, None) or "")
    open_keys = ShipKeys.parse({"ships": {}})
    assert open_keys.check(*args, None) is None  # no key, not required: taken
    strict = ShipKeys.parse({"require_signatures": True, "ships": {}})
    assert "no key" in (strict.check(*args, ps[3].encode()) or "")


def test_the_gateway_check_refuses_a_batch_with_any_chunk_not_signed_by_the_ship() -> None:
    n = 2 * CHUNK_RECORDS + 3
    wire, _, _ = signed_batch(5, n)
    h, cols = decode_columns(wire)
    leaves = leaves_of(h.first_seq, *cols)
    assert len(h.signatures) == len(chunks(5, n)) * SIGNATURE_BYTES == 3 * 64
    assert KEYS.verify_batch("bigblue", "containers", 5, leaves, h.signatures) is None
    forged = OTHER.sign(b"x" * 10)
    for j in range(3):
        sigs = h.signatures[: j * 64] + forged + h.signatures[(j + 1) * 64 :]
        assert "does not verify" in (
            KEYS.verify_batch("bigblue", "containers", 5, leaves, sigs) or ""
        )
    assert KEYS.verify_batch("bigblue", "containers", 5, leaves, h.signatures[:-64])
    other_leaves = leaves_of(h.first_seq, cols[0], cols[1], cols[2], [*cols[3][:-1], b"?"])
    assert KEYS.verify_batch("bigblue", "containers", 5, other_leaves, h.signatures)


def test_a_signed_batch_round_trips_and_its_signatures_are_under_the_checksum() -> None:
    n = 2 * CHUNK_RECORDS + 1
    wire, _, recs = signed_batch(1, n)
    assert decode_batch(wire).records == recs
    h = peek_header(wire)
    assert h.header_len == 40 + len("bigblue") + len("containers") + 3 * SIGNATURE_BYTES
    at = 40 + len("bigblue") + len("containers") + 20  # a byte inside the first signature
    damaged = wire[:at] + bytes([wire[at] ^ 1]) + wire[at + 1 :]
    with pytest.raises(WireError) as info:
        decode_batch(damaged)
    assert info.value.reason == "bad_checksum"
    for cut in (h.header_len - 1, 60):
        with pytest.raises(WireError) as info:
            decode_batch(wire[:cut])
        assert info.value.reason == "truncated"


def test_keys_on_disk_are_private_and_the_keys_file_refuses_what_is_no_key(tmp_path: Path) -> None:
    path = tmp_path / "ship.key"
    KEY.save(path)
    assert path.stat().st_mode & 0o077 == 0
    assert ShipKey.load(path).public() == KEY.public()
    path.chmod(0o644)
    with pytest.raises(ConfigError, match="world-readable"):
        ShipKey.load(path)
    bad = tmp_path / "bad.key"
    bad.write_text("ed25519-secret:not base64!\n")
    bad.chmod(0o600)
    with pytest.raises(ConfigError, match="no Ed25519 key"):
        ShipKey.load(bad)
    bad.write_text(KEY.public() + "\n")  # the public half, copied by mistake
    with pytest.raises(ConfigError, match="a public key is not one"):
        ShipKey.load(bad)
    text = ShipKeys.render({"bigblue": KEY.public()}, True)
    keys_file = tmp_path / "ship_keys.toml"
    keys_file.write_text(text)
    loaded = ShipKeys.load(keys_file)
    assert loaded.require_signatures and loaded.public_keys() == {"bigblue": KEY.public()}
    for bad_data, match in [
        ({"ships": {"bigblue": "AAAA"}}, "not an Ed25519"),
        ({"ships": {"Big Blue": KEY.public()}}, "ships"),
        ({"require_signatures": "yes"}, "true or false"),
        ({"ship": {}}, "unknown keys"),
    ]:
        with pytest.raises(ConfigError, match=match):
            ShipKeys.parse(bad_data)


def test_a_ship_that_sent_before_its_key_has_its_older_records_taken_unproved_below_the_bound(
    tmp_path: Path,
) -> None:
    """``unsigned_below``: what a ship sent before it had a key carries no proof; below
    the bound (per stream) such a record is taken, at or above it refused; a record that
    carries a proof is checked whatever its seq."""
    text = ShipKeys.render({"bigblue": KEY.public()}, True, {"bigblue": {"containers": 100}})
    path = tmp_path / "ship_keys.toml"
    path.write_text(text)
    keys = ShipKeys.load(path)
    assert keys.unsigned_below == {"bigblue": {"containers": 100}}
    assert ShipKeys.render(keys.public_keys(), True, keys.unsigned_below) == text
    rec = ("bigblue", "containers", 99, 1, "k", "t", b"v")
    assert keys.check(*rec, None) is None
    assert "no proof" in (keys.check("bigblue", "containers", 100, 1, "k", "t", b"v", None) or "")
    assert "no proof" in (keys.check("bigblue", "nav", 5, 1, "k", "t", b"v", None) or "")
    assert keys.check(*rec, b"\x00" * 90) is not None  # a proof is always checked
    for bad, match in [
        ({"bigblue": {"key": KEY.public(), "unsigned_below": {"containers": 0}}}, "seqs 1 to"),
        # review N10: a bound near 2**63 would take every unsigned record for good
        ({"bigblue": {"key": KEY.public(), "unsigned_below": {"nav": 2**40 + 1}}}, "seqs 1 to"),
        ({"bigblue": {"key": KEY.public(), "unsigned_below": {"nav": 2**63 - 1}}}, "seqs 1 to"),
        ({"bigblue": {"key": KEY.public(), "unsigned_below": {"Bad Name": 5}}}, "bad stream"),
        ({"bigblue": {"key": KEY.public(), "below": {}}}, "must be"),
        ({"bigblue": {"unsigned_below": {"nav": 5}}}, "not an Ed25519"),
    ]:
        with pytest.raises(ConfigError, match=match):
            ShipKeys.parse({"ships": bad})


def test_a_ship_keys_file_others_may_write_is_refused(tmp_path: Path) -> None:
    """Review N10: whoever may write the ship keys file may add a key of theirs for
    any ship. World- or foreign-group-writable, it is refused (at start, by
    check-config, and at each re-read, which keeps the keys read before); others may
    read it (public keys only)."""
    path = tmp_path / "ship_keys.toml"
    path.write_text(ShipKeys.render({"bigblue": KEY.public()}, True))
    path.chmod(0o644)
    assert ShipKeys.load(path).signed("bigblue")
    path.chmod(0o646)
    with pytest.raises(ConfigError, match="world-writable"):
        ShipKeys.load(path)
    watched_path = tmp_path / "watched.toml"
    watched_path.write_text(path.read_text())
    watched = WatchedShipKeys(watched_path)
    watched_path.write_text(ShipKeys.render({}, False))  # every ship's key taken out...
    watched_path.chmod(0o666)  # ...by a file anyone may write: refused, the old keys kept
    eventually(lambda: watched.current() and watched.stale, within=10, what="a re-read")
    assert watched.current().signed("bigblue") and watched.failures >= 1


def _signed_by(
    key: ShipKey, stream: str, first: int, n: int
) -> tuple[tuple[WireRecord, ...], list[bytes], tuple[object, ...], bytes]:
    """Records ``first``.. of bigblue's ``stream`` as ``key`` signed them: the records,
    each one's ``sl.proof``, the batch's columns and its signatures (the gateway's)."""
    recs = records(first, n)
    h, cols = decode_columns(encode_batch(Batch("bigblue", stream, recs), key=key))
    leaves = leaves_of(h.first_seq, *cols)
    return recs, [p.encode() for p in proofs(first, leaves, h.signatures)], cols, h.signatures


def _verdicts(keys: ShipKeys, stream: str, recs: tuple[WireRecord, ...], ps: list[bytes]) -> list:
    return [
        keys.check("bigblue", stream, r.seq, r.ts_ms, r.key, r.topic, r.payload, p)
        for r, p in zip(recs, ps, strict=True)
    ]


def test_records_the_old_key_signed_stay_provable_after_the_ship_key_is_replaced(
    tmp_path: Path,
) -> None:
    """Review N4/security N6: after ``ship-key new --replace`` every record the old key
    signed that some site still lacks (a relay, history, a site rebuilt later) was
    refused for good. The old key stays in the ship's history (``previous``) and proves
    what it signed, at the merge and at the gateway (a ship still signing with it until
    its new key is on board); a key the ship never had still proves nothing."""
    old_recs, old_proofs, old_cols, old_sigs = _signed_by(KEY, "containers", 1, 40)
    new_recs, new_proofs, new_cols, new_sigs = _signed_by(OTHER, "containers", 41, 10)
    path = tmp_path / "ship_keys.toml"
    replaced = ShipKeys.parse(
        {"ships": {"bigblue": {"key": OTHER.public(), "previous": [{"key": KEY.public()}]}}}
    )
    path.write_text(ShipKeys.render(replaced.public_keys(), True, None, replaced.previous))
    keys = ShipKeys.load(path)
    assert keys.previous == replaced.previous and keys.entries() == replaced.entries()
    assert _verdicts(keys, "containers", old_recs, old_proofs) == [None] * 40
    assert _verdicts(keys, "containers", new_recs, new_proofs) == [None] * 10
    assert keys.prove_batch("bigblue", "containers", 1, old_cols, old_sigs) is not None
    assert keys.prove_batch("bigblue", "containers", 41, new_cols, new_sigs) is not None
    # the worker process's copy of the ship's entry proves the same
    copy = ShipKeys.parse({"ships": keys.entries(["bigblue"])})
    assert copy.prove_batch("bigblue", "containers", 1, old_cols, old_sigs) is not None
    stranger = ShipKey.generate()
    s_recs, s_proofs, _, _ = _signed_by(stranger, "containers", 1, 5)
    assert all(
        v and v.startswith("bad_signature") for v in _verdicts(keys, "containers", s_recs, s_proofs)
    )
    # an old file (one key per ship) loads as before, with no history
    assert ShipKeys.parse({"ships": {"bigblue": KEY.public()}}).previous == {}


def test_a_proof_names_the_key_that_signed_it_and_is_checked_against_that_key_alone() -> None:
    """Issue 41: a site must know which key signed a record (an audit of what a key
    signed, and a record checked against the key valid at its seq). The gateway writes
    in each proof the id of the key that verified its chunk, the fleet registry's id; a
    site takes the record only if that key verifies it: a proof whose id was changed to
    another key of the ship, or names a key the site lacks yet (re-driven when it
    learns it: a key cause), is refused. A proof written before key ids is still
    checked against each of the ship's keys."""
    old_recs, _, old_cols, old_sigs = _signed_by(KEY, "containers", 1, 40)
    new_recs, _, new_cols, new_sigs = _signed_by(OTHER, "containers", 41, 10)
    keys = ShipKeys.parse(
        {"ships": {"bigblue": {"key": OTHER.public(), "previous": [{"key": KEY.public()}]}}}
    )
    old = keys.prove_batch("bigblue", "containers", 1, old_cols, old_sigs)
    new = keys.prove_batch("bigblue", "containers", 41, new_cols, new_sigs)
    assert old is not None and new is not None
    assert {Proof.decode(p, 1 + i).key_id for i, p in enumerate(old)} == {KEY.id}
    assert {Proof.decode(p, 41 + i).key_id for i, p in enumerate(new)} == {OTHER.id}
    assert len(KEY.id) == KEY_ID_BYTES and key_id_of(KEYS.ships["bigblue"]) == KEY.id
    assert _verdicts(keys, "containers", old_recs, old) == [None] * 40
    assert _verdicts(keys, "containers", new_recs, new) == [None] * 10
    # the id swapped for the ship's other key: that key does not verify it
    swapped = [p[:-KEY_ID_BYTES] + OTHER.id for p in old[:3]]
    fresh = ShipKeys.parse({"ships": keys.entries()})
    assert (
        _verdicts(fresh, "containers", old_recs[:3], swapped)
        == ["bad_signature: proof does not verify: not the ship's record"] * 3
    )
    # a site that has only the old key yet: the new key's records wait for it
    early = ShipKeys.parse({"ships": {"bigblue": KEY.public()}})
    verdicts = _verdicts(early, "containers", new_recs, new)
    assert verdicts[0] == (
        f"bad_signature: proof names key {OTHER.id.hex()}, not a key of bigblue here"
    )
    assert {key_cause(v or "") for v in verdicts} == {"bad_signature"}
    # a proof from before key ids: tried against each key, as before
    legacy = [p[:-KEY_ID_BYTES] for p in old]
    assert Proof.decode(legacy[0], 1).key_id is None
    assert _verdicts(fresh, "containers", old_recs, legacy) == [None] * 40
    with pytest.raises(ValueError, match="with its key id"):
        Proof.decode(old[0] + b"x", 1)


def test_a_revoked_keys_records_above_its_bound_are_refused_and_below_it_taken() -> None:
    """``--replace --revoke --from containers=20``: a stolen key must not sign the
    ship's future seqs, but what it signed before stays provable. Per record (one chunk
    of 40 spans the bound: the chunk's cached root does not carry the records above it
    through), at the gateway per batch, and a stream the bound does not name is refused
    whole; a single bound covers every stream."""
    recs, ps, cols, sigs = _signed_by(KEY, "containers", 1, 40)
    entry = {
        "key": OTHER.public(),
        "previous": [{"key": KEY.public(), "valid_below": {"containers": 20}}],
    }
    keys = ShipKeys.parse({"require_signatures": True, "ships": {"bigblue": entry}})
    verdicts = _verdicts(keys, "containers", recs, ps)
    assert verdicts[:19] == [None] * 19
    assert all(v and key_cause(v) == "revoked" for v in verdicts[19:])
    assert keys.signature_checks <= 2  # one chunk: checked once (the new key, then the old)
    with pytest.raises(SignatureError, match="does not verify"):
        keys.prove_batch("bigblue", "containers", 1, cols, sigs)
    below = _signed_by(KEY, "containers", 1, 19)
    assert keys.prove_batch("bigblue", "containers", 1, below[2], below[3]) is not None
    nav = _signed_by(KEY, "nav", 1, 5)
    assert all(v and key_cause(v) == "revoked" for v in _verdicts(keys, "nav", nav[0], nav[1]))
    every = {"key": OTHER.public(), "previous": [{"key": KEY.public(), "valid_below": 3}]}
    keys = ShipKeys.parse({"ships": {"bigblue": every}})
    assert [v is None for v in _verdicts(keys, "nav", nav[0], nav[1])] == [True, True] + [False] * 3
    for bad, match in [
        ({"key": KEY.public(), "valid_below": 0}, "valid_below"),
        ({"key": KEY.public(), "valid_below": 2**63}, "valid_below"),
        ({"key": KEY.public(), "valid_below": {"Bad Name": 3}}, "bad stream"),
        ({"key": KEY.public(), "valid_below": True}, "valid_below"),
        ({"key": "AAAA"}, "not an Ed25519"),
        ({"valid_below": 3}, "key ="),
    ]:
        with pytest.raises(ConfigError, match=match):
            ShipKeys.parse({"ships": {"bigblue": {"key": OTHER.public(), "previous": [bad]}}})


_PUBLICS = [KEY.public(), OTHER.public(), "AAAA", "", "not base64!"]
_BOUNDS = (
    st.none()
    | st.integers(-2, 2**64)
    | st.booleans()
    | st.text(max_size=5)
    | st.dictionaries(
        st.sampled_from(["containers", "nav", "Bad Name", ""]),
        st.integers(-2, 2**64) | st.text(max_size=3),
        max_size=3,
    )
)
_PREVIOUS = (
    st.lists(
        st.fixed_dictionaries(
            {"key": st.sampled_from(_PUBLICS)},
            optional={"valid_below": _BOUNDS, "extra": st.just(1)},
        ),
        max_size=4,
    )
    | st.integers()
    | st.text(max_size=3)
)
_ENTRY = st.sampled_from(_PUBLICS) | st.fixed_dictionaries(
    {"key": st.sampled_from(_PUBLICS)},
    optional={
        "previous": _PREVIOUS,
        "unsigned_below": st.dictionaries(
            st.sampled_from(["containers", "nav"]), st.integers(-2, 2**41)
        ),
    },
)
_SIGNED = {
    (k.public(), s): _signed_by(k, s, 1, 8) for k in (KEY, OTHER) for s in ("containers", "nav")
}


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ships=st.dictionaries(st.sampled_from(["bigblue", "redsea", "Bad Ship"]), _ENTRY, max_size=3),
    require=st.booleans() | st.just("yes"),
    signer=st.sampled_from([KEY.public(), OTHER.public()]),
    stream=st.sampled_from(["containers", "nav"]),
    i=st.integers(0, 7),
    seq=st.none() | st.integers(-(2**65), 2**65),
    proof=st.sampled_from(["genuine", "none", "garbage", "cut"]),
)
def test_any_keys_file_loads_or_is_refused_by_name_and_check_gives_every_record_a_verdict(
    ships: dict, require: object, signer: str, stream: str, i: int, seq: int | None, proof: str
) -> None:
    """Whatever a keys file holds (any shape of ``previous`` and its bounds), it loads
    or is refused with a ConfigError naming the field, what loads writes back to the
    same keys, and check() returns a verdict for any record, never an exception (a
    raise would stop a puller at that record for good)."""
    try:
        keys = ShipKeys.parse({"require_signatures": require, "ships": ships})
    except ConfigError:
        return
    again = ShipKeys.parse(
        tomllib.loads(
            ShipKeys.render(
                keys.public_keys(), keys.require_signatures, keys.unsigned_below, keys.previous
            )
        )
    )
    assert again.entries() == keys.entries() and again.previous == keys.previous
    recs, ps, _, _ = _SIGNED[(signer, stream)]
    r = recs[i]
    raw = {"genuine": ps[i], "none": None, "garbage": b"\x01" * 90, "cut": ps[i][:-3]}[proof]
    for origin in ("bigblue", "redsea", "ghost"):
        verdict = keys.check(
            origin, stream, r.seq if seq is None else seq, r.ts_ms, r.key, r.topic, r.payload, raw
        )
        assert verdict is None or (isinstance(verdict, str) and verdict)
