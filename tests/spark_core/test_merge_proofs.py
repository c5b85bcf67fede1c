"""Review finding 6, at the merge (the planner; the same code the pullers run against
real Kafka in test_replication.py's hostile neighbour): a neighbour offers records in
its own relay topic. With the ship keys file, a record of a ship that signs is taken
only with its proof, so whatever a hostile neighbour offers, and in whatever order with
the genuine copies, the site ends holding exactly the ship's genuine records, each
once; a forged seq never reaches the ledger (the bound on holes, the ledger's size),
and with ``require_signatures`` an invented ship adds nothing."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shorelink.contract import H_PROOF, H_SEQ, Record, relay_topic
from shorelink.fleet.bundle import provision
from shorelink.fleet.entry import FleetKey, sign_entry
from shorelink.fleet.log import Registry
from shorelink.fleet.state import FleetState
from shorelink.fleet.travel import entry_record
from shorelink.fleet.views import site_ship_keys
from shorelink.identity import Identity
from shorelink.ledger import MAX_HOLDINGS_RANGES
from shorelink.proof import ShipKey, ShipKeys
from shorelink.ranges import RangeSet
from shorelink.wire import Batch, WireRecord, decode_columns, encode_batch
from spark_core.merge_state import (
    Headers,
    MergeState,
    RowBatch,
    SourceRow,
    plan_batch,
    pulled_source,
)

KEY = ShipKey.generate()
KEYS = ShipKeys.parse({"ships": {"bigblue": KEY.public()}})
STRICT = ShipKeys.parse({"require_signatures": True, "ships": {"bigblue": KEY.public()}})
FROM_N = pulled_source("nasty", "topic-id-1", relay_topic("nasty", "containers"))
FROM_G = pulled_source("good", "topic-id-2", relay_topic("good", "containers"))


def _genuine(n: int) -> list[tuple[bytes, bytes, Headers]]:
    """The ship's records 1..n as its entry site's gateway wrote them: key, value,
    headers with the proof."""
    recs = tuple(
        WireRecord(s, f"MSCU{s % 4}", 1_767_225_600_000 + s, f"b/d/{s % 4}/env", b'{"t":%d}' % s)
        for s in range(1, n + 1)
    )
    h, cols = decode_columns(encode_batch(Batch("bigblue", "containers", recs), key=KEY))
    proofs = KEYS.prove_batch("bigblue", "containers", 1, cols, h.signatures)
    assert proofs is not None
    out = []
    for r, p in zip(recs, proofs, strict=True):
        rec = Record(
            Identity("bigblue", "containers", r.seq),
            r.key.encode(),
            r.payload,
            r.ts_ms,
            "tokyo",
            r.topic,
        )
        out.append((rec.key, rec.value, [*rec.headers(), (H_PROOF, p)]))
    return out


GENUINE = _genuine(40)


def _forged(seq: int, how: int, origin: str = "bigblue") -> tuple[bytes, bytes, Headers]:
    """What a hostile neighbour can make of ``seq``: no proof, another record's proof,
    the genuine proof on another payload, or garbage for a proof."""
    rec = Record(Identity(origin, "containers", seq), b"MSCU0", b'{"t":-1}', 1, "nasty", "x")
    headers: Headers = list(rec.headers())
    real = GENUINE[(seq - 1) % len(GENUINE)][2][-1]
    if how == 1:
        headers.append((H_PROOF, GENUINE[seq % len(GENUINE)][2][-1][1]))
    elif how == 2:
        headers.append(real)
    elif how == 3:
        headers.append((H_PROOF, b"\x00" * 90))
    return rec.key, rec.value, headers


def _rows(items: list[tuple[str, tuple[bytes, bytes, Headers]]]) -> list[SourceRow]:
    offsets: dict[str, int] = {}
    out = []
    for topic, (key, value, headers) in items:
        offsets[topic] = offsets.get(topic, -1) + 1
        out.append(SourceRow(topic, 0, offsets[topic], key, value, headers))
    return out


def _apply(
    state: MergeState, rows: list[SourceRow], keys: ShipKeys
) -> tuple[list[tuple[int, bytes]], int, int]:
    plan = plan_batch(rows, state, None, keys)
    for source, held in plan.ledger.items():
        state.held[source] = held
    state.offsets.update(plan.offsets)
    written = [(int(dict(h)[H_SEQ]), v) for _, _, v, h in plan.canonical]
    return written, plan.unproved, plan.duplicates


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_whatever_a_neighbour_forges_and_in_whatever_order_the_site_holds_the_ships_records(
    data: st.DataObject,
) -> None:
    forged = data.draw(
        st.lists(
            st.tuples(st.integers(1, 60) | st.integers(1, 2**62), st.integers(0, 3)), max_size=30
        ),
        label="forged",
    )
    items = [(FROM_N, _forged(s, how)) for s, how in forged]
    items += [(FROM_G, g) for g in GENUINE]
    order = data.draw(st.permutations(range(len(items))), label="order")
    cuts = sorted(data.draw(st.lists(st.integers(0, len(items)), max_size=4), label="batches"))
    state = MergeState()
    written: list[tuple[int, bytes]] = []
    unproved = duplicates = 0
    rows = _rows([items[i] for i in order])
    for lo, hi in zip([0, *cuts], [*cuts, len(items)], strict=True):
        w, u, d = _apply(state, rows[lo:hi], KEYS)
        written += w
        unproved += u
        duplicates += d
    assert sorted(written) == sorted((int(dict(h)[H_SEQ]), v) for _, v, h in GENUINE)
    # every forgery dead-lettered, or dropped as a duplicate once the genuine was held
    assert unproved + duplicates == len(forged)
    assert str(state.held[("bigblue", "containers")]) == "1-40"  # no forged seq held


def test_forged_isolated_seqs_cannot_fill_the_bound_on_holes() -> None:
    """Scenario 2 of the finding: isolated seqs far apart would make the ledger entry
    reach MAX_HOLDINGS_RANGES, and genuine records that split it further be dead."""
    state = MergeState()
    spread = [(FROM_N, _forged(1000 + 7 * i, i % 4)) for i in range(MAX_HOLDINGS_RANGES + 10)]
    written, unproved, _ = _apply(state, _rows(spread), KEYS)
    assert (written, unproved) == ([], MAX_HOLDINGS_RANGES + 10)
    assert ("bigblue", "containers") not in state.held
    odd = [GENUINE[i] for i in range(0, 40, 2)]  # 20 ranges of one seq each
    written, _, _ = _apply(state, _rows([(FROM_G, g) for g in odd]), KEYS)
    assert len(written) == 20 and len(state.held[("bigblue", "containers")]) == 20


def test_with_required_signatures_an_invented_ship_adds_nothing_to_the_ledger() -> None:
    """Scenario 3: invented (origin, stream) pairs would grow every ledger for good."""
    state = MergeState()
    invented = [(FROM_N, _forged(1, 0, f"ghost{i}")) for i in range(50)]
    written, unproved, _ = _apply(state, _rows(invented), STRICT)
    assert (written, unproved, state.held) == ([], 50, {})
    # without require_signatures a ship with no key is taken as it comes (moving over)
    written, unproved, _ = _apply(MergeState(), _rows(invented), KEYS)
    assert (len(written), unproved) == (50, 0)


def test_a_held_record_is_relayed_again_only_from_a_proved_copy() -> None:
    """A copy of a held identity offered through another entry is relayed again under
    that entry (docs/replication.md, "One identity entered at two sites") only if it
    is the ship's: a forged one would take the genuine one's place in that relay."""
    state = MergeState(held={("bigblue", "containers"): RangeSet.parse("1-40")})
    entry = {FROM_N: "nasty", FROM_G: "good"}.get
    rows = _rows([(FROM_N, _forged(3, 2)), (FROM_G, GENUINE[4])])
    plan = plan_batch(rows, state, entry, KEYS)
    assert [int(dict(h)[H_SEQ]) for _, _, _, h in plan.again] == [5]
    assert plan.duplicates == 2


def test_a_rebuilt_site_takes_back_what_a_ship_sent_before_its_key_and_no_forgery_above() -> None:
    """A ship sent seqs 1-10 before it had a key (no proof); the keys file says so
    (``unsigned_below``). A site rebuilt empty takes them back from a neighbour; above
    the bound a record without a proof is still a forgery."""
    keys = ShipKeys.parse(
        {
            "require_signatures": True,
            "ships": {"bigblue": {"key": KEY.public(), "unsigned_below": {"containers": 11}}},
        }
    )
    old = [_forged(s, 0) for s in range(1, 11)]  # as the ship sent them: no proof
    later = [_forged(s, 0) for s in range(11, 16)]
    written, unproved, _ = _apply(MergeState(), _rows([(FROM_G, r) for r in old + later]), keys)
    assert [s for s, _ in written] == list(range(1, 11)) and unproved == 5


def _beyond(seq: bytes, ts: bytes, proof: bytes | None) -> tuple[bytes, bytes, Headers]:
    """A neighbour's record of bigblue with ``sl.seq``/``sl.ts`` as given (raw digits)."""
    headers: Headers = [
        ("sl.origin", b"bigblue"),
        ("sl.stream", b"containers"),
        ("sl.seq", seq),
        ("sl.ts", ts),
        ("sl.site", b"nasty"),
        ("sl.mqtt_topic", b"x"),
    ]
    if proof is not None:
        headers.append((H_PROOF, proof))
    return b"MSCU0", b"{}", headers


def _one_record_proof(seq: int) -> bytes:
    """A well-formed proof for a chunk of one record at ``seq`` (garbage signature)."""
    return struct.pack("<QH", seq, 1) + b"\x01" * 64


class _Vouched(RowBatch):
    """The rows as Spark hands them over after vouching (contract_sql.vouch): the
    identity read already where the headers pass Spark's rule."""

    def __init__(self, rows: list[SourceRow]) -> None:
        super().__init__(rows)
        for i, r in enumerate(rows):
            h = dict(r.headers)
            seq, origin = h["sl.seq"], h["sl.origin"]
            if isinstance(seq, bytes) and re.fullmatch(rb"[1-9][0-9]{0,17}", seq):
                assert isinstance(origin, bytes)
                self.origins[i], self.seqs[i] = origin.decode(), int(seq)


@pytest.mark.parametrize("spark", [False, True], ids=["python", "spark_vouched"])
def test_a_neighbours_record_beyond_int64_is_dead_lettered_and_the_feed_goes_on(
    spark: bool,
) -> None:
    """Review finding N4: one pulled row with ``sl.ts`` >= 2**63 (or ``sl.seq`` >=
    2**63, 2**64) made plan_batch raise, and the puller retried that offset for ever: a
    neighbour's one record stalled the feed. Such a row breaks the contract: it is
    dead-lettered and counted, and the genuine records after it are taken."""
    big = [
        _beyond(b"5", b"%d" % 2**63, _one_record_proof(5)),
        _beyond(b"%d" % 2**63, b"1", _one_record_proof(2**63)),
        _beyond(b"%d" % 2**64, b"1", None),
        _beyond(b"6", b"9" * 5000, _one_record_proof(6)),
        _beyond(b"0" * 5000 + b"7", b"1", _one_record_proof(7)),
    ]
    rows = _rows([(FROM_N, r) for r in big] + [(FROM_G, g) for g in GENUINE])
    batch = _Vouched(rows) if spark else RowBatch(rows)
    plan = plan_batch(batch, MergeState(), None, KEYS)
    assert len(plan.canonical) == len(GENUINE)
    assert len(plan.dead) == len(big)
    assert plan.offsets[(FROM_N, 0)] == len(big)  # the feed moves past them


@settings(max_examples=300, deadline=None)
@given(
    seq=st.integers(min_value=-(2**70), max_value=2**70) | st.integers(2**63 - 2, 2**64 + 2),
    ts=st.integers(min_value=-(2**70), max_value=2**70) | st.integers(2**63 - 2, 2**64 + 2),
    key=st.text() | st.binary(),
    topic=st.text() | st.binary(),
    payload=st.binary(),
    proof=st.none() | st.binary(max_size=300) | st.just(b"chunk"),
    origin=st.sampled_from(["bigblue", "ghost"]),
)
def test_checking_a_record_returns_a_verdict_whatever_its_headers_hold(
    seq: int,
    ts: int,
    key: str | bytes,
    topic: str | bytes,
    payload: bytes,
    proof: bytes | None,
    origin: str,
) -> None:
    """ShipKeys.check never raises (a raise stops the puller at that record): any
    value a neighbour can put in a record gets a verdict. ``chunk``: a well-formed
    proof of a one-record chunk at the record's seq, so the record's hash is taken."""
    if proof == b"chunk":
        proof = _one_record_proof(seq % 2**64)
    for keys in (KEYS, STRICT):
        verdict = keys.check(origin, "containers", seq, ts, key, topic, payload, proof)
        assert verdict is None or isinstance(verdict, str)


def test_a_forged_copy_offered_again_costs_no_second_signature_check() -> None:
    """Review N5: a forged proof costs an Ed25519 check (about 80 µs, ten times a
    genuine record's share of its chunk's one check). A failed (chunk, root) is
    remembered: the same forgery offered 500 times, by one neighbour or several, is
    checked once and dead-lettered every time."""
    keys = ShipKeys.parse({"ships": {"bigblue": KEY.public()}})
    forged = _forged(7, 1)  # another record's genuine proof on this record
    rows = _rows([(FROM_N, forged)] * 250 + [(FROM_G, forged)] * 250)
    plan = plan_batch(rows, MergeState(), None, keys)
    assert (plan.unproved, len(plan.dead), plan.canonical) == (500, 500, [])
    assert keys.signature_checks == 1


def test_a_registry_record_is_taken_only_with_the_fleets_proof_even_from_the_own_ingress(
    tmp_path: Path,
) -> None:
    """The merge keeps the first copy of an identity: a record of the fleet registry's
    origin made up by a neighbour, or written into a site's own ingress by anyone but
    headquarters' publisher, would take the genuine entry's place at that site for good
    (docs/fleet-registry.md, "How it travels"). No gateway writes the registry's
    records, so no gateway's check vouches for them: the fleet's proof is checked from
    every source."""
    reg = Registry.init(tmp_path / "reg")
    provision(reg, "bigblue", ["north"], out=tmp_path / "b")
    genuine = [entry_record(e, reg.fleet_key(), "hq") for e in reg.entries()]
    thief = FleetKey.generate()
    forged = sign_entry(
        thief, len(genuine) + 1, reg.state.head, "ship_revoked", {"ship": "bigblue"}
    )
    fake = entry_record(forged, thief, "hq")
    keys = site_ship_keys(FleetState(anchor=reg.state.fleet_key))  # a site knowing the root
    pulled = pulled_source("nasty", "topic-id-3", relay_topic("nasty", "registry"))
    for source in (pulled, "sl.ingress.registry"):
        state = MergeState()
        rows = _rows([(source, r) for r in [fake, *genuine]])
        written, unproved, _ = _apply(state, rows, keys)
        assert unproved == 1
        assert [s for s, _ in written] == [1, 2, 3, 4]
        assert str(state.held[("fleet", "registry")]) == "1-4"
