"""The ship signs what it uploads (``uplink.signing_key_file``; shorelink/proof.py): with
a key, every batch the agent sends, encoded when sent or framed from a segment sealed
at sea (also read back after a restart), carries its chunks' signatures and its ship's
public key proves them; without one nothing is signed; a segment sealed without the key
of now is never sent as it is; a key file others may read, or that holds no key, stops
the agent at start. Real SQLite logs, the batch builder's real child process."""

from __future__ import annotations

import asyncio
import base64
import os
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import sqlite_utils
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge_agent import migrations
from edge_agent.agent import Agent
from edge_agent.batching import BatchBuilder, BuildFailed, BuildSpec, SealSpec, build, seal
from edge_agent.config import EdgeConfig, load_config
from edge_agent.errors import LinkError
from edge_agent.log import EdgeLog
from edge_agent.metrics import EdgeMetrics
from edge_agent.sealing import SEAL_MAX_BYTES, Sealer
from edge_agent.status import open_log
from edge_agent.uplink import Uplink
from local_stack.mosquitto import MosquittoBroker
from shorelink.errors import ConfigError
from shorelink.proof import CHUNK_RECORDS, SIGNATURE_BYTES, ShipKey, ShipKeys, leaves_of
from shorelink.ranges import RangeSet
from shorelink.wire import (
    FLAG_SIGNED,
    Batch,
    Header,
    WireRecord,
    decode_columns,
    encode_batch,
    encode_body,
)
from shorelink.workers import MAX_BROKEN
from tests.edge_agent.helpers import Publisher, edge_config_doc, status_of
from tests.edge_agent.memory_gateway import MemoryGateway
from tests.edge_agent.uplink_helpers import fill, uplink_config
from tests.helpers import eventually_async, write_toml

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "deploy" / "edge" / "edge.toml"
KEY = ShipKey.generate()
OTHER = ShipKey.generate()
#: a port link's batch_max_bytes
PORT_BATCH_BYTES = 8 * 1024 * 1024
FIELD = "uplink.signing_key_file"


def _key_file(directory: Path, key: ShipKey = KEY, name: str = "ship.key") -> Path:
    path = directory / name
    key.save(path)  # mode 0600, as `shorelink ship-key new` writes it
    return path


def _config(tmp_path: Path, key_file: Path | None = None, **uplink: Any) -> EdgeConfig:
    if key_file is not None:
        uplink["signing_key_file"] = str(key_file)
    return uplink_config(tmp_path, gateways=[("tokyo", "port_wifi")], uplink=uplink)


def _spec(
    edge_log: EdgeLog,
    *,
    held: RangeSet | None = None,
    pos: int | None = None,
    floor: int | None = None,
    max_records: int = 50_000,
) -> BuildSpec:
    """The next batch of ``containers`` for a site holding ``held`` over a port link."""
    last = edge_log.stream_state("containers").next_seq - 1
    have = held or RangeSet()
    return BuildSpec(
        "containers", last, pos, floor, have, False, max_records, PORT_BATCH_BYTES, None
    )


def _wire(edge_log: EdgeLog, lo: int, hi: int) -> tuple[WireRecord, ...]:
    return tuple(
        WireRecord(r.seq, r.key, r.ts_ms, r.topic, r.payload)
        for r in edge_log.read("containers", lo, hi, max_records=1_000_000)
    )


def _signed_by(body: bytes, key: ShipKey) -> Header:
    """The batch's header, after checking what a site checks: the batch is flagged
    signed and ``key``'s public half proves every chunk of it."""
    header, columns = decode_columns(body)
    assert header.flags & FLAG_SIGNED
    assert len(header.signatures) == -(-header.count // CHUNK_RECORDS) * SIGNATURE_BYTES
    keys = ShipKeys.parse({"ships": {header.origin: key.public()}})
    leaves = leaves_of(header.first_seq, *columns)
    why = keys.verify_batch(
        header.origin, header.stream, header.first_seq, leaves, header.signatures
    )
    assert why is None, why
    return header


def _unsigned(body: bytes) -> Header:
    header, _ = decode_columns(body)
    assert not header.flags & FLAG_SIGNED and header.signatures == b""
    return header


def _all_batches(edge_log: EdgeLog, key: ShipKey | None) -> list[tuple[int, int, bool, bytes]]:
    """Every batch a session builds for a site holding nothing: (first, last, sealed, body)."""
    out = []
    pos = floor = None
    while (built := build(edge_log, _spec(edge_log, pos=pos, floor=floor), key)).body:
        out.append((built.first, built.last, built.sealed, built.body))
        pos, floor = built.pos, built.floor
    return out


# -- every batch built with a key is the ship's ------------------------------------------------
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 3 * CHUNK_RECORDS),
    sealed=st.integers(0, 2 * CHUNK_RECORDS + 10),
    held=st.integers(0, 3 * CHUNK_RECORDS),
    max_records=st.integers(1, 2 * CHUNK_RECORDS + 10),
)
def test_every_batch_built_with_a_key_is_signed_by_the_ship(
    n: int, sealed: int, held: int, max_records: int
) -> None:
    """Whatever the site holds, the link's batch size and the segment there is, every
    batch (encoded now or framed from a segment) carries one signature per chunk of
    ``CHUNK_RECORDS`` of its records and the ship's public key proves it: a site refuses
    anything less."""
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        edge_log = open_log(_config(tmp_path))
        try:
            fill(edge_log, "containers", n)
            if 0 < sealed <= n:
                body = seal(
                    edge_log, SealSpec("containers", 1, sealed, sealed, SEAL_MAX_BYTES), KEY
                )
                assert body is not None and body.count == sealed
                assert edge_log.segments.add("containers", body, signer=KEY.public())
            have = RangeSet([(1, min(held, n))]) if held else RangeSet()
            got: list[WireRecord] = []
            pos = floor = None
            spec = _spec(edge_log, held=have, max_records=max_records)
            while (built := build(edge_log, spec, KEY)).body:
                assert built.body is not None
                header = _signed_by(built.body, KEY)
                assert (header.first_seq, header.last_seq) == (built.first, built.last)
                got += _wire(edge_log, built.first, built.last)
                pos, floor = built.pos, built.floor
                spec = _spec(edge_log, held=have, pos=pos, floor=floor, max_records=max_records)
            missing = [s for s in range(1, n + 1) if s not in have]
            assert [r.seq for r in got] == missing
        finally:
            edge_log.close()


@pytest.mark.parametrize("workers", [0, 1], ids=["thread", "child"])
async def test_segment_sealed_with_the_key_is_sent_signed_after_a_restart(
    tmp_path: Path, workers: int
) -> None:
    """Sealed at sea (in the builder's child process, as the agent does), the segment
    keeps its signatures in SQLite; after a restart it is sent as is, signed, byte for
    byte what its records encode to with the key (Ed25519 signs deterministically)."""
    key_file = _key_file(tmp_path)
    cfg = _config(tmp_path, key_file, seal_records=500, encode_workers=workers)
    edge_log = open_log(cfg)
    fill(edge_log, "containers", 1200)
    builder = BatchBuilder(edge_log, workers=workers, signing_key_file=key_file)
    try:
        assert await Sealer(cfg, edge_log, builder, EdgeMetrics()).seal_due() == 2
        assert bool(builder.pids()) is (workers == 1)
    finally:
        builder.close()
        edge_log.close()
    with sqlite3.connect(cfg.log.path) as conn:
        rows = conn.execute(
            "SELECT first_seq, flags, length(signatures), signer FROM segments ORDER BY first_seq"
        ).fetchall()
    chunks = -(-500 // CHUNK_RECORDS)
    assert [(r[0], bool(r[1] & FLAG_SIGNED), r[2], r[3]) for r in rows] == [
        (1, True, chunks * SIGNATURE_BYTES, KEY.public()),
        (501, True, chunks * SIGNATURE_BYTES, KEY.public()),
    ]

    edge_log = open_log(cfg)  # the restart
    builder = BatchBuilder(edge_log, workers=workers, signing_key_file=key_file)
    try:
        sent = []
        pos = floor = None
        while (built := await builder.build(_spec(edge_log, pos=pos, floor=floor))).body:
            assert built.body is not None
            _signed_by(built.body, KEY)
            recs = _wire(edge_log, built.first, built.last)
            assert built.body == encode_batch(
                Batch("bigblue", "containers", recs, first_available=built.floor or 1), key=KEY
            )
            sent.append((built.first, built.last, built.sealed))
            pos, floor = built.pos, built.floor
        assert sent == [(1, 500, True), (501, 1000, True), (1001, 1200, False)]
    finally:
        builder.close()
        edge_log.close()


async def test_without_a_key_nothing_is_signed(tmp_path: Path) -> None:
    """No ``signing_key_file``: batches and segments are as before signatures."""
    cfg = _config(tmp_path, seal_records=500)
    assert cfg.uplink.signing_key_file is None
    edge_log = open_log(cfg)
    fill(edge_log, "containers", 700)
    builder = BatchBuilder(edge_log, workers=0, signing_key_file=None)
    try:
        assert builder.key is None and builder.signer == ""
        assert await Sealer(cfg, edge_log, builder, EdgeMetrics()).seal_due() == 1
        seg = edge_log.segments.get("containers", 1)
        assert seg is not None and seg.signatures == b"" and not seg.flags & FLAG_SIGNED
        batches = _all_batches(edge_log, None)
        assert [b[:3] for b in batches] == [(1, 500, True), (501, 700, False)]
        for *_, body in batches:
            _unsigned(body)
    finally:
        builder.close()
        edge_log.close()


# -- a segment sealed without the key of now ------------------------------------------------------
@pytest.mark.parametrize("before", ["unsigned", "another_key"])
async def test_segment_sealed_without_the_key_of_now_is_never_sent_as_it_is(
    tmp_path: Path, before: str
) -> None:
    """A key configured (or replaced) on a ship with a sealed backlog: the old segments
    would go unsigned (refused by every site that holds the ship's key) or signed by a
    key the sites no longer hold. Their records are encoded and signed instead; the
    sealer drops the old segments at its start and seals the records again, signed."""
    old_key = None if before == "unsigned" else _key_file(tmp_path, OTHER, "old.key")
    cfg = _config(tmp_path, old_key, seal_records=500)
    edge_log = open_log(cfg)
    fill(edge_log, "containers", 1100)
    old = BatchBuilder(edge_log, workers=0, signing_key_file=old_key)
    assert await Sealer(cfg, edge_log, old, EdgeMetrics()).seal_due() == 2
    old.close()

    key_file = _key_file(tmp_path)
    cfg = _config(tmp_path, key_file, seal_records=500)
    builder = BatchBuilder(edge_log, workers=0, signing_key_file=key_file)
    try:
        batches = _all_batches(edge_log, builder.key)
        # (encoded batches still stop where the next segment starts)
        assert [b[:3] for b in batches] == [(1, 500, False), (501, 1100, False)]
        for *_, body in batches:
            _signed_by(body, KEY)

        sealer = Sealer(cfg, edge_log, builder, EdgeMetrics())
        stop = asyncio.Event()
        stop.set()
        await sealer.run(stop)  # its start: the old segments go
        assert edge_log.segments.totals() == {}
        assert await sealer.seal_due() == 2
        batches = _all_batches(edge_log, builder.key)
        assert [b[:3] for b in batches] == [(1, 500, True), (501, 1000, True), (1001, 1100, False)]
        for *_, body in batches:
            _signed_by(body, KEY)
    finally:
        builder.close()
        edge_log.close()


async def test_signed_segments_are_not_sent_once_the_key_is_removed(tmp_path: Path) -> None:
    """The other way round: a ship whose key was taken out of its config sends what it
    would send without one, encoded then; the sealer seals it again, unsigned."""
    key_file = _key_file(tmp_path)
    cfg = _config(tmp_path, key_file, seal_records=500)
    edge_log = open_log(cfg)
    fill(edge_log, "containers", 600)
    signed = BatchBuilder(edge_log, workers=0, signing_key_file=key_file)
    assert await Sealer(cfg, edge_log, signed, EdgeMetrics()).seal_due() == 1
    signed.close()
    cfg = _config(tmp_path, seal_records=500)
    builder = BatchBuilder(edge_log, workers=0)
    try:
        assert [b[:3] for b in _all_batches(edge_log, None)] == [(1, 600, False)]
        sealer = Sealer(cfg, edge_log, builder, EdgeMetrics())
        assert sealer.drop_foreign() == 1
        assert await sealer.seal_due() == 1
        batches = _all_batches(edge_log, None)
        assert [b[:3] for b in batches] == [(1, 500, True), (501, 600, False)]
        for *_, body in batches:
            _unsigned(body)
    finally:
        builder.close()
        edge_log.close()


async def test_a_child_never_signs_with_a_key_other_than_the_one_loaded_at_start(
    tmp_path: Path,
) -> None:
    """The key file replaced while the agent runs: the builder's child, which loads the
    file itself, refuses to start; after a few tries the agent builds in a thread with
    the key it loaded at start. Every batch of a run is signed by one key."""
    key_file = _key_file(tmp_path)
    cfg = _config(tmp_path, key_file)
    edge_log = open_log(cfg)
    fill(edge_log, "containers", 100)
    builder = BatchBuilder(edge_log, workers=1, signing_key_file=key_file)
    try:
        OTHER.save(key_file)
        for _ in range(MAX_BROKEN - 1):
            with pytest.raises(BuildFailed):
                await builder.build(_spec(edge_log))
        built = await builder.build(_spec(edge_log))
        assert builder.workers == 0 and built.body is not None
        _signed_by(built.body, KEY)
    finally:
        builder.close()
        edge_log.close()


# -- through the uplink ----------------------------------------------------------------------
async def test_uplink_with_a_key_delivers_every_record_to_a_site_that_proves_them(
    tmp_path: Path,
) -> None:
    """The uplink and a site holding the ship's key (the gateway seam in memory, proving
    as a gateway with a ship keys file does): segments and encoded batches alike pass;
    every record arrives once. The same ship without its key is refused whole."""
    key_file = _key_file(tmp_path)
    cfg = _config(tmp_path, key_file, seal_records=400)
    edge_log = open_log(cfg)
    fill(edge_log, "containers", 1234)
    keys = ShipKeys.parse({"ships": {"bigblue": KEY.public()}})
    gw = MemoryGateway("tokyo", "port_wifi", ship_keys=keys)
    up = Uplink(cfg, edge_log, EdgeMetrics(), asyncio.Event(), gateways=[gw])
    try:
        assert await up.sealer.seal_due() == 3
        await up.sync_once()
    finally:
        up.close()
    assert [(r.first, r.last, r.signed, r.outcome) for r in gw.log] == [
        (1, 400, True, "ok"),
        (401, 800, True, "ok"),
        (801, 1200, True, "ok"),
        (1201, 1234, True, "ok"),
    ]
    assert gw.held("containers") == RangeSet([(1, 1234)]) and max(gw.arrivals.values()) == 1
    edge_log.close()

    unsigned = _config(tmp_path / "unsigned")
    edge_log = open_log(unsigned)
    fill(edge_log, "containers", 10)
    gw = MemoryGateway("tokyo", "port_wifi", ship_keys=keys)
    up = Uplink(unsigned, edge_log, EdgeMetrics(), asyncio.Event(), gateways=[gw])
    try:
        with pytest.raises(LinkError, match="403 unsigned"):  # the gateway put aside
            await up.sync_once()
    finally:
        up.close()
    assert [(r.signed, r.outcome) for r in gw.log] == [(False, "rejected")]
    assert gw.held("containers") == RangeSet()
    edge_log.close()


async def test_agent_signs_what_it_uploads_from_its_child_process(
    tmp_path: Path, mosquitto: MosquittoBroker, publisher: Publisher
) -> None:
    """The agent as it runs on a ship (batches built in the child process, the key
    loaded at start from the file its config names): sensor messages go MQTT -> log ->
    uplink, and a site that proves every batch against the ship's key takes them all."""
    _key_file(tmp_path)
    config = write_toml(
        tmp_path / "edge.toml",
        {
            **edge_config_doc(tmp_path, mosquitto),
            "uplink": {"token": "t", "linger": "10ms", "signing_key_file": "ship.key"},
            "gateways": [{"site": "tokyo", "url": "http://127.0.0.1:9", "link": "port_wifi"}],
        },
    )
    cfg = load_config(config)
    assert cfg.uplink.encode_workers == 1
    keys = ShipKeys.parse({"require_signatures": True, "ships": {"bigblue": KEY.public()}})
    gw = MemoryGateway("tokyo", "port_wifi", ship_keys=keys)
    agent = Agent(cfg, gateways=[gw])
    task = asyncio.create_task(agent.run(install_signals=False))
    try:
        await asyncio.wait_for(agent.ingest.connected.wait(), 20)
        await asyncio.to_thread(publisher.readings, 0, 39)
        await eventually_async(lambda: gw.held("containers") == RangeSet([(1, 40)]), within=20)
        assert agent.uplink is not None and agent.uplink.builder.pids()
    finally:
        agent.stop.set()
        await asyncio.wait_for(task, 20)
    assert gw.log and all(r.signed and r.outcome == "ok" for r in gw.log)


# -- the schema: segments of an older agent ---------------------------------------------------
def test_log_from_before_signatures_keeps_its_segments_readable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ships upgrade in place: a log whose segments an agent without signatures sealed
    (migrations 1-5) opens, gains the columns, and its segments read back unsigned: sent
    as they are without a key, never with one (encoded and signed then)."""
    cfg = _config(tmp_path)
    with monkeypatch.context() as m:
        m.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:5])
        edge_log = open_log(cfg)
        fill(edge_log, "containers", 600)
        body = encode_body(_wire(edge_log, 1, 500))
        edge_log.close()
    with sqlite3.connect(cfg.log.path) as conn:  # what that agent's sealer wrote
        conn.execute(
            "INSERT INTO segments (stream, first_seq, last_seq, flags, raw_len, decoded_len,"
            " body, sealed_ms) VALUES ('containers', 1, 500, ?, ?, ?, ?, 0)",
            [body.flags, body.raw_len, body.decoded_len, body.data],
        )
    db = sqlite_utils.Database(cfg.log.path)
    assert "signatures" not in db["segments"].columns_dict
    db.close()
    # `status` of the new version reads the old log (the agent not restarted yet)
    report = status_of(cfg, "containers")
    assert (report["records"], report["sealed_records"]) == (600, 500)

    edge_log = open_log(cfg)
    try:
        db = sqlite_utils.Database(cfg.log.path)
        assert {"signatures", "signer"} <= set(db["segments"].columns_dict)
        assert [r["id"] for r in db.query("SELECT id FROM _migrations ORDER BY id")] == list(
            range(1, len(migrations.MIGRATIONS) + 1)
        )
        db.close()
        seg = edge_log.segments.get("containers", 1)
        assert seg is not None and (seg.count, seg.signatures, seg.data) == (500, b"", body.data)
        batches = _all_batches(edge_log, None)
        assert [b[:3] for b in batches] == [(1, 500, True), (501, 600, False)]
        assert batches[0][3] == encode_batch(
            Batch("bigblue", "containers", _wire(edge_log, 1, 500))
        )
        _unsigned(batches[0][3])
        assert edge_log.segments.get("containers", 1, signer=KEY.public()) is None
        batches = _all_batches(edge_log, KEY)
        assert [b[:3] for b in batches] == [(1, 600, False)]
        for *_, b in batches:
            _signed_by(b, KEY)
    finally:
        edge_log.close()


# -- the key file --------------------------------------------------------------------------------
def test_a_key_file_others_may_read_is_refused_naming_the_key(tmp_path: Path) -> None:
    """The key lets anyone sign as this ship: a file others may read stops the agent at
    start, like a token file; so does a missing one."""
    key_file = _key_file(tmp_path)
    os.chmod(key_file, 0o644)
    with pytest.raises(ConfigError, match="world-readable") as exc:
        _config(tmp_path, key_file)
    assert exc.value.field == FIELD
    with pytest.raises(ConfigError, match="cannot read") as exc:
        _config(tmp_path, tmp_path / "missing.key")
    assert exc.value.field == FIELD
    os.chmod(key_file, 0o600)
    assert _config(tmp_path, key_file).uplink.signing_key_file == key_file


@settings(max_examples=40, deadline=None)
@given(content=st.binary(max_size=80) | st.text(max_size=80).map(str.encode))
def test_a_key_file_that_holds_no_key_is_refused_naming_the_key(content: bytes) -> None:
    """Anything but the base64 of a 32-byte seed (a truncated copy, another file, an
    empty one) is refused at start, not found out at the first batch."""
    text = content.strip()
    try:
        prefix = b"ed25519-secret:"
        valid = text.startswith(prefix)
        valid = valid and len(base64.b64decode(text.removeprefix(prefix), validate=True)) == 32
    except ValueError:
        valid = False
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        key_file = tmp_path / "ship.key"
        key_file.write_bytes(content)
        os.chmod(key_file, 0o600)
        if valid:
            _config(tmp_path, key_file)
            return
        with pytest.raises(ConfigError, match=r"holds no (Ed25519 key|ship's private key)") as exc:
            _config(tmp_path, key_file)
        assert exc.value.field == FIELD


def test_key_file_is_relative_to_the_config_file(tmp_path: Path) -> None:
    (tmp_path / "keys").mkdir()
    _key_file(tmp_path / "keys")
    text = SAMPLE.read_text().replace(
        '# signing_key_file = "/etc/shorelink/ship.key"', 'signing_key_file = "keys/ship.key"'
    )
    assert 'signing_key_file = "keys/ship.key"' in text
    (tmp_path / "edge.toml").write_text(text)
    cfg = load_config(tmp_path / "edge.toml")
    assert cfg.uplink.signing_key_file == tmp_path / "keys" / "ship.key"


def _check_config(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edge_agent.cli", "check-config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_check_config_names_a_bad_key_file_and_shows_a_good_ones_public_key(
    tmp_path: Path,
) -> None:
    """An operator checks the file before a restart: a bad key file is named the way the
    agent would refuse it; a good one's public half is shown, to compare with the
    sites' ship keys file."""
    data = {
        "ship": "bigblue",
        "log": {"path": str(tmp_path / "edge.db")},
        "streams": {"containers": {}},
        "rules": [{"filter": "bigblue/+/containers/+/env", "stream": "containers", "key": "{4}"}],
        "uplink": {"signing_key_file": "ship.key"},
    }
    config = write_toml(tmp_path / "edge.toml", data)
    key_file = _key_file(tmp_path)
    ok = _check_config(config)
    assert ok.returncode == 0, ok.stderr
    assert f"public key {KEY.public()}" in ok.stdout

    os.chmod(key_file, 0o644)
    res = _check_config(config)
    assert res.returncode == 2
    assert res.stderr.startswith(f"error: {FIELD}: ") and "world-readable" in res.stderr

    os.chmod(key_file, 0o600)
    key_file.write_text("not a key\n")
    res = _check_config(config)
    assert res.returncode == 2
    assert (
        res.stderr.startswith(f"error: {FIELD}: ") and "holds no ship's private key" in res.stderr
    )

    del data["uplink"]
    res = _check_config(write_toml(tmp_path / "edge.toml", data))
    assert res.returncode == 0 and "signing: off" in res.stdout
