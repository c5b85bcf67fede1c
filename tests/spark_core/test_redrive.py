"""Dead letters whose cause can change are tried again when it does
(spark_core/redrive.py, spark_core/quarantine.py; replication review N4): a ship's key
that reaches a site after the ship's records did, or a ship's ledger entry at the bound
on holes, must not leave records dead there for good. On real Kafka with the site's
merge (what its pullers hand it), without Spark: the re-drive reads only what was
dead-lettered since its last pass, writes what is taken now exactly once, and a
restarted merge with the same keys does not try again."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import Producer

from local_stack.kafka import KafkaBroker
from shorelink.contract import dead_topic, relay_topic
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.errors import KafkaClientError
from shorelink.kafka.reading import read_to_end
from shorelink.proof import ShipKey, ShipKeys, WatchedShipKeys, key_cause
from shorelink.retry import Backoff
from spark_core import redrive
from spark_core.config import SiteConfig
from spark_core.merge import Merger, Totals
from spark_core.merge_state import SourceRow, pulled_source
from spark_core.quarantine import (
    CAUSES,
    H_DEAD_CAUSE,
    H_DEAD_REASON,
    H_DEAD_SOURCE,
    RETRIED_CAUSES,
    dead_cause,
)
from spark_core.redrive import redrive_once, retry_row
from spark_core.replication import quarantine_of
from tests.helpers import eventually, unique
from tests.spark_core.helpers import canonical, make_site, record, signed_relayed

KEY = ShipKey.generate()


def _dead(bootstrap: str, stream: str) -> list[str]:
    """The reasons of the site's dead letters of ``stream``, in offset order."""
    ep = KafkaEndpoint.plaintext(bootstrap)
    return [
        dict(m.headers() or [])[H_DEAD_REASON].decode()
        for m in read_to_end(ep, [dead_topic(stream)], settled=True)
    ]


def _use(watched: WatchedShipKeys, path: Path, keys: ShipKeys) -> None:
    """Write the keys file and wait until the merge's watcher holds it."""
    path.write_text(
        ShipKeys.render(keys.public_keys(), keys.require_signatures, None, keys.previous)
    )
    want = keys.fingerprint()
    eventually(lambda: watched.current().fingerprint() == want, 15, "the keys re-read")


def _keyless_merge(
    kafka: KafkaBroker, tmp_path: Path, s: str
) -> tuple[SiteConfig, Merger, WatchedShipKeys, Path]:
    """A site's merge of ``s`` whose ship keys file requires signatures and names no
    ship yet: what the ship signs is dead-lettered ``unknown_ship`` until its key comes."""
    keys_file = tmp_path / "ship_keys.toml"
    keys_file.write_text(ShipKeys.render({}, require_signatures=True))
    site, _ = make_site(kafka.bootstrap, tmp_path, [s])
    merger = Merger(site)
    merger.ship_keys = watched = WatchedShipKeys(keys_file)
    return site, merger, watched, keys_file


def _signed_rows(s: str, seqs: range, neighbours: Sequence[str]) -> list[SourceRow]:
    """The ship's records of ``seqs``, signed with ``KEY``, as each neighbour relays them."""
    return [
        SourceRow(pulled_source(n, "tid", relay_topic("e1", s)), 0, off, k, v, h)
        for n in neighbours
        for off, (k, v, h) in enumerate(signed_relayed(KEY, s, seqs))
    ]


def test_records_dead_for_a_key_a_site_lacked_are_taken_once_when_the_key_arrives(
    kafka: KafkaBroker, tmp_path: Path
) -> None:
    """The ship's records reach the site (twice: two neighbours) before its key does:
    dead-lettered as ``unknown_ship``. When the key arrives, the re-drive writes each
    exactly once (40 written, 40 duplicates); a later change of the file reads only
    what was dead-lettered since (nothing), and a merge restarted with the same file
    does not try again (the marker keeps the keys it tried under)."""
    s = unique("s")
    site, merger, watched, keys_file = _keyless_merge(kafka, tmp_path, s)
    rows = _signed_rows(s, range(1, 41), ("tokyo", "sydney"))
    try:
        merger.ready()
        assert merger.write_pulled(rows).unproved == 80
        assert canonical(kafka.bootstrap, s) == []
        # the first look with this merge: the dead letters tried under these keys once
        first = redrive_once(merger)
        assert first is not None and dict(first["unknown_ship"]) == {"refused": 80}
        assert redrive_once(merger) is None  # the same keys: nothing to do
        assert {key_cause(r) for r in _dead(kafka.bootstrap, s)} == {"unknown_ship"}
        with_key = ShipKeys.parse({"require_signatures": True, "ships": {"bigblue": KEY.public()}})
        _use(watched, keys_file, with_key)
        counts = redrive_once(merger)
        assert counts is not None and dict(counts["unknown_ship"]) == {
            "written": 40,
            "duplicate": 40,
        }
        held = canonical(kafka.bootstrap, s)
        assert sorted(r.identity.seq for r in held) == list(range(1, 41))
        assert all(dict(r.headers()).get(H_DEAD_REASON) is None for r in held)
        assert merger.totals.redriven == {
            "unknown_ship:refused": 80,
            "unknown_ship:written": 40,
            "unknown_ship:duplicate": 40,
        }
        status = json.loads(merger.status_path.read_text())
        assert status["totals"]["redriven"]["unknown_ship:written"] == 40
        # another change: only what was dead-lettered since the last pass is read
        dead_before = len(_dead(kafka.bootstrap, s))
        other = ShipKey.generate()
        both = {"bigblue": KEY.public(), "redsea": other.public()}
        _use(watched, keys_file, ShipKeys.parse({"require_signatures": True, "ships": both}))
        assert redrive_once(merger) == {}
        assert len(_dead(kafka.bootstrap, s)) == dead_before
        mark = merger.state.redrive_keys
    finally:
        merger.close()
    again = Merger(site)
    again.ship_keys = WatchedShipKeys(keys_file)
    try:
        again.ready()
        assert again.state.redrive_keys == mark
        assert redrive_once(again) is None
        assert len(canonical(kafka.bootstrap, s)) == 40
    finally:
        again.close()


def test_a_pass_takes_dead_letters_below_the_high_watermark_not_only_the_stable_offset(
    kafka: KafkaBroker, tmp_path: Path
) -> None:
    """A transaction's commit returns before the broker writes its markers: right after
    it, the dead-letter topic's last stable offset can still end before its dead
    letters. A pass that ended there marked them tried under keys they were never
    planned with, and never tried them (CI: a site took a replaced ship key a moment
    after dead-lettering the new key's records, and never took them). Here another
    producer's transaction, open on the dead-letter topic before the merge's batch,
    holds the last stable offset below its dead letters, as markers not yet written
    do; it is aborted a second into the pass."""
    s = unique("s")
    _, merger, watched, keys_file = _keyless_merge(kafka, tmp_path, s)
    rows = _signed_rows(s, range(1, 21), ("tokyo",))
    other = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": unique("tx")})
    try:
        merger.ready()
        assert merger.write_pulled(rows[:10]).unproved == 10
        first = redrive_once(merger)  # under these keys: refused again, passed
        assert first is not None and dict(first["unknown_ship"]) == {"refused": 10}
        other.init_transactions(30)
        other.begin_transaction()
        (desc,) = merger.admin().describe([dead_topic(s)]).values()
        for p in desc.partitions:
            other.produce(dead_topic(s), b"open", partition=p.id)
        other.flush(30)
        assert merger.write_pulled(rows[10:]).unproved == 10
        with_key = ShipKeys.parse({"require_signatures": True, "ships": {"bigblue": KEY.public()}})
        _use(watched, keys_file, with_key)
        threading.Timer(1.0, other.abort_transaction, (30,)).start()
        counts = redrive_once(merger)
        assert counts is not None and dict(counts["unknown_ship"]) == {"written": 20}
        assert sorted(r.identity.seq for r in canonical(kafka.bootstrap, s)) == list(range(1, 21))
    finally:
        merger.close()


def test_only_dead_letters_whose_cause_can_change_are_tried_again() -> None:
    """A record that broke the contract, carries a garbled proof or is over the size
    limit stays dead: no change here takes it. Dead letters an older merge wrote
    (reasons without a cause in front, no ``sl.dead.cause``) are recognised too."""
    cases = {
        "unknown_ship: ship x has no key and signatures are required": "unknown_ship",
        "unsigned: ship x signs its records; this one has no proof": "unsigned",
        "bad_signature: proof does not verify: not the ship's record": "bad_signature",
        "revoked: signed by a previous key of x valid below seq 5 only": "revoked",
        "ship x has no key and signatures are required": "unknown_ship",
        "ship x signs its records; this one has no proof": "unsigned",
        "proof does not verify: not the ship's record": "bad_signature",
        "bad proof: proof of 3 bytes is too short": None,
        "bad record: seq out of range": None,
        "header sl.stream=a but topic is sl.ingress.b": None,
        "record of 9 value bytes > MAX_RECORD_BYTES 8": None,
        "x/y holds 4096 ranges already": "holes",
    }
    for reason, cause in cases.items():
        headers = [
            ("sl.origin", b"x"),
            (H_DEAD_REASON, reason.encode()),
            ("sl.dead.source", b"t/0/1"),
        ]
        got = retry_row("src", 0, 7, b"k", b"v", headers)
        assert (got and got[1]) == cause, reason
        if got is not None:
            assert got[0].headers == [("sl.origin", b"x")] and got[0].offset == 7
    assert retry_row("src", 0, 1, b"k", None, [(H_DEAD_REASON, b"unsigned: x")]) is None
    assert retry_row("src", 0, 1, b"k", b"v", None) is None


def test_the_cause_header_decides_and_a_reason_alone_is_read_for_one() -> None:
    """``sl.dead.cause`` names the cause (the last one, if a record was quarantined
    again); a cause it does not know falls back on the reason; a record with neither is
    no dead letter of a merge."""
    assert dead_cause([(H_DEAD_CAUSE, b"holes"), (H_DEAD_REASON, b"anything")]) == "holes"
    twice = [(H_DEAD_CAUSE, b"contract"), (H_DEAD_CAUSE, b"unsigned")]
    assert dead_cause(twice) == "unsigned"
    assert dead_cause(
        [(H_DEAD_CAUSE, b"\xff?"), (H_DEAD_REASON, b"a/b holds 9 ranges already")]
    ) == ("holes")
    assert dead_cause([(H_DEAD_REASON, b"\xff\xfe")]) == "contract"
    assert dead_cause([("sl.origin", b"x")]) is None and dead_cause(None) is None
    assert RETRIED_CAUSES < CAUSES


def _dead_causes(bootstrap: str, stream: str) -> list[tuple[str, str]]:
    """(cause, source) of the site's dead letters of ``stream``, in offset order."""
    ep = KafkaEndpoint.plaintext(bootstrap)
    out = []
    for m in read_to_end(ep, [dead_topic(stream)], settled=True):
        h = dict(m.headers() or [])
        out.append((h[H_DEAD_CAUSE].decode(), h[H_DEAD_SOURCE].decode()))
    return out


def test_records_held_back_at_the_bound_on_holes_are_taken_once_their_entry_has_room(
    kafka: KafkaBroker, tmp_path: Path
) -> None:
    """A ship's entry at the bound on holes (4 ranges here): the records that would
    split it again are quarantined as ``holes`` and the entry held back (in the marker:
    a restarted merge knows). Nothing is tried while the entry is full; once the holes
    between fill, the re-drive takes what fits and quarantines the rest again, and when
    every hole is filled it takes the last one: every seq once, nothing lost."""
    s = unique("s")
    site, _ = make_site(kafka.bootstrap, tmp_path, [s])
    rows = _rows_of(s)
    merger = Merger(site)
    merger.max_ranges = 4
    try:
        merger.ready()
        merger.write_pulled(rows([1, 3, 5, 7, 9, 11, 13]))
        assert [c for c, _ in _dead_causes(kafka.bootstrap, s)] == ["holes"] * 3
        assert set(merger.state.held_back) == {("bigblue", s)}
        assert merger.totals.quarantined == {f"{s}:holes": 3}
        assert redrive_once(merger) is None  # four ranges: no room
    finally:
        merger.close()
    merger = Merger(site)  # the marker says which entries are held back
    merger.max_ranges = 4
    try:
        merger.ready()
        assert set(merger.state.held_back) == {("bigblue", s)}
        # what the entry held when they were held back is not in the marker: one try
        first = redrive_once(merger)
        assert first is not None and dict(first["holes"]) == {"refused": 3}
        assert redrive_once(merger) is None  # still full, nothing written since
        merger.write_pulled(rows([2, 4]))  # [1-5] [7]: room for two
        counts = redrive_once(merger)
        assert counts is not None and dict(counts["holes"]) == {"written": 2, "refused": 1}
        assert set(merger.state.held_back) == {("bigblue", s)}  # 13 is still held back
        assert redrive_once(merger) is None  # full again
        merger.write_pulled(rows([6, 8, 10, 12]))
        counts = redrive_once(merger)
        assert counts is not None and dict(counts["holes"]) == {"written": 1}
        assert merger.state.held_back == {} and redrive_once(merger) is None
        assert merger.totals.quarantined == {}  # this run's batches quarantined nothing
    finally:
        merger.close()
    assert sorted(r.identity.seq for r in canonical(kafka.bootstrap, s)) == list(range(1, 14))
    dead = _dead_causes(kafka.bootstrap, s)
    assert [c for c, _ in dead] == ["holes"] * 7  # three first, three at the restart, 13
    assert dead[-1][1].startswith("~redrive/")


def _rows_of(s: str, entry: str = "e1") -> Callable[[list[int]], list[SourceRow]]:
    """Rows of ship bigblue's seqs as pulled from tokyo, at the next offsets."""
    source = pulled_source("tokyo", "tid", relay_topic(entry, s))
    offsets = iter(range(100_000))

    def rows(seqs: list[int]) -> list[SourceRow]:
        out = []
        for q in seqs:
            r = record("bigblue", s, q)
            out.append(SourceRow(source, 0, next(offsets), r.key, r.value, r.headers()))
        return out

    return rows


def test_a_ship_writing_at_the_bound_does_not_re_drive_its_held_back_record_at_every_look(
    kafka: KafkaBroker, tmp_path: Path
) -> None:
    """Review 9, finding 1: a ship's entry at the bound, one of its records held back,
    and the ship keeps sending in order (each seq extends a range: written). Its entry's
    count changed at every batch and every look re-drove the held-back record: a new
    copy in ``sl.dead.<stream>`` each second, forever. Now a look passes only when a
    held-back record can be taken: none while the ship writes 8..18, and the pass that
    follows 19 takes 20. One copy of it in the dead-letter topic, not one per look."""
    s = unique("s")
    site, _ = make_site(kafka.bootstrap, tmp_path, [s])
    rows = _rows_of(s)
    merger = Merger(site)
    merger.max_ranges = 4
    try:
        merger.ready()
        merger.write_pulled(rows([1, 3, 5, 7, 20]))
        assert set(merger.state.held_back) == {("bigblue", s)}
        for q in range(8, 19):
            merger.write_pulled(rows([q]))
            assert redrive_once(merger) is None, q
        assert len(_dead_causes(kafka.bootstrap, s)) == 1
        merger.write_pulled(rows([19]))  # 20 can be taken now
        counts = redrive_once(merger)
        assert counts is not None and dict(counts["holes"]) == {"written": 1}
        assert merger.state.held_back == {} and redrive_once(merger) is None
    finally:
        merger.close()
    assert sorted(r.identity.seq for r in canonical(kafka.bootstrap, s)) == [1, 3, 5, *range(7, 21)]
    assert len(_dead_causes(kafka.bootstrap, s)) == 1


def test_a_pass_of_several_transactions_is_not_repeated_while_nothing_can_be_taken(
    kafka: KafkaBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review 9, finding 2: a pass that needs more than one transaction (two dead
    letters each here) kept, for the source refused in a step before the last, the
    count its entry had before the pass (after a restart: none), so every look found it
    changed and passed again, forever, copying every held-back record each time. Now the
    pass ends knowing which records it refused: no other pass follows while none of them
    can be taken, whatever the ship writes meanwhile, and the one that can is taken."""
    monkeypatch.setattr(redrive, "PASS_RECORDS", 2)
    s = unique("s")
    site, _ = make_site(kafka.bootstrap, tmp_path, [s])
    rows = _rows_of(s)
    merger = Merger(site)
    merger.max_ranges = 4
    try:
        merger.ready()
        merger.write_pulled(rows([1, 3, 5, 7, 20, 30, 40, 50, 60]))
        assert len(_dead_causes(kafka.bootstrap, s)) == 5
    finally:
        merger.close()
    merger = Merger(site)  # the marker names the source, not its seqs: one pass of 3
    merger.max_ranges = 4
    try:
        merger.ready()
        first = redrive_once(merger)
        assert first is not None and dict(first["holes"]) == {"refused": 5}
        assert merger.commits == 3
        assert redrive_once(merger) is None
        for q in (8, 9, 10):  # the ship writes on: its entry's count changes
            merger.write_pulled(rows([q]))
            assert redrive_once(merger) is None, q
        assert len(_dead_causes(kafka.bootstrap, s)) == 10
        merger.write_pulled(rows(list(range(11, 20))))  # 20 can be taken now
        counts = redrive_once(merger)
        assert counts is not None and dict(counts["holes"]) == {"written": 1, "refused": 4}
        assert redrive_once(merger) is None
    finally:
        merger.close()
    assert len(_dead_causes(kafka.bootstrap, s)) == 14


def test_a_pass_asks_kafka_where_the_dead_letters_end_without_the_merges_lock(
    kafka: KafkaBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review 9, finding 5: the re-drive asked Kafka's admin API where the dead-letter
    topics end while it held the merge's lock, once a second: a broker that does not
    answer held every batch of the merge for the admin timeout, again and again. The
    pass decides under the lock and asks after it."""
    s = unique("s")
    site, _ = make_site(kafka.bootstrap, tmp_path, [s])
    rows = _rows_of(s)
    merger = Merger(site)
    merger.max_ranges = 4
    asked_free: list[bool] = []
    marks = Merger._relay_marks

    def watched(self: Merger, topics: Sequence[str], *, committed: bool = True) -> Any:
        free = self.busy.acquire(blocking=False)
        if free:
            self.busy.release()
        asked_free.append(free)
        return marks(self, topics, committed=committed)

    try:
        merger.ready()
        merger.write_pulled(rows([1, 3, 5, 7, 20]))
        merger.write_pulled(rows(list(range(8, 20))))
        monkeypatch.setattr(Merger, "_relay_marks", watched)
        counts = redrive_once(merger)
        assert counts is not None and dict(counts["holes"]) == {"written": 1}
    finally:
        merger.close()
    assert asked_free == [True]


def test_the_redrive_loop_outlives_any_error_and_backs_off_while_it_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Review 9, findings 9 and 5: an error other than the merge's or Kafka's ended the
    re-drive thread for good, silently (no dead letter re-driven at that site until a
    restart); and a failing merge was tried again every second. Here the looks fail
    three times (an unexpected error, then Kafka's, twice): the loop goes on, waits
    longer after each failure, and the fourth look goes through. A stand-in merge (the
    loop needs only its name and flags): this is about the loop, not the pass."""
    monkeypatch.setattr(redrive, "LOOK_S", 0.01)
    monkeypatch.setattr(redrive, "FAIL_BACKOFF", Backoff(first_s=0.2, cap_s=60.0))
    looks: list[float] = []
    fails: list[Exception] = [
        RuntimeError("a bug"),
        KafkaClientError("no broker"),
        KafkaClientError("no broker still"),
    ]

    def look(merger: object) -> None:
        looks.append(time.monotonic())
        if len(looks) <= len(fails):
            raise fails[len(looks) - 1]

    monkeypatch.setattr(redrive, "redrive_once", look)
    merge = SimpleNamespace(
        stopping=threading.Event(), fenced=None, query="merge", site=SimpleNamespace(name="a")
    )
    loop = redrive.Redriver([merge])  # type: ignore[list-item]
    loop.start()
    try:
        eventually(lambda: len(looks) >= 4, 20, "a look after three failures")
        assert loop._thread.is_alive()
        eventually(lambda: loop.errors["merge"] is None, 5, "the error cleared")
    finally:
        loop.stop()
    gaps = [b - a for a, b in itertools.pairwise(looks[:4])]
    assert gaps[0] >= 0.2 and gaps[1] >= 0.4 and gaps[2] >= 0.8, gaps


def test_what_the_status_says_was_taken_again_is_what_a_re_drive_wrote() -> None:
    """Review 9, finding 21: the status's "taken again" counted the dead letters a
    re-drive found held already (a copy that came another way) with those it wrote,
    so 40 records of a ship that reached the site twice showed as 80 taken."""
    totals = Totals(
        redriven={
            "unknown_ship:written": 40,
            "unknown_ship:duplicate": 40,
            "unknown_ship:refused": 80,
            "holes:duplicate": 3,
        },
        quarantined={"nav:unknown_ship": 80},
    )
    got = quarantine_of([SimpleNamespace(totals=totals)])  # type: ignore[list-item]
    assert got == {
        "quarantined": {"nav": {"unknown_ship": 80}},
        "taken_again": {"unknown_ship": 40},
    }
