"""``shorelink dict train``: headquarters trains one dictionary per stream on what ships
sent (the JSON lines ``shorelink consume`` prints), writes each where ships and gateways
load them from, owner-only, and says its id and size; ids grow run after run."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from click.testing import CliRunner

from shorelink.cli import main
from shorelink.wire import Batch, encode_batch
from shorelink.wire_dict import Dictionaries
from tests.shorelink.test_wire import telemetry


def _consumed(path: Path, ship: str = "bigblue") -> Path:
    """Container readings and positions as ``shorelink consume`` prints them."""
    lines = []
    for r in telemetry(40, 10, seed=3):
        lines.append(
            {"origin": ship, "stream": "containers", "seq": r.seq, "key": r.key,
             "value": r.payload.decode(), "ts": r.ts_ms, "site": "hq", "mqtt_topic": r.topic,
             "topic": "sl.containers", "partition": 0, "offset": r.seq}
        )  # fmt: skip
    for i in range(1, 400):
        lines.append(
            {"origin": ship, "stream": "nav", "seq": i, "key": "position",
             "value": f'{{"lat":{35 + i / 1000:.4f},"lon":{139 + i / 900:.4f}}}',
             "ts": 1_767_225_600_000 + i * 10_000, "site": "hq",
             "mqtt_topic": f"{ship}/nav/position", "topic": "sl.nav", "partition": 0,
             "offset": i}
        )  # fmt: skip
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return path


def test_train_writes_one_owner_only_dictionary_per_stream_that_ships_and_gateways_load(
    tmp_path: Path,
) -> None:
    records = _consumed(tmp_path / "sent.jsonl")
    out = tmp_path / "dicts"
    result = CliRunner().invoke(
        main, ["dict", "train", "--records", str(records), "--out", str(out), "--json"]
    )
    assert result.exit_code == 0, result.output
    made = json.loads(result.output)["dictionaries"]
    assert [m["stream"] for m in made] == ["containers", "nav"]
    assert made[0]["id"] < made[1]["id"] and all(0 < m["bytes"] <= 32 * 1024 for m in made)
    held = Dictionaries.load(out)
    assert held.ids() == [m["id"] for m in made]
    for m in made:
        assert stat.S_IMODE(os.stat(m["file"]).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o700
    # the dictionary compresses the stream it was trained for
    d = held.newest("containers")
    assert d is not None
    batch = Batch("bigblue", "containers", tuple(telemetry(40, 5, seed=3)[:200]))
    assert len(encode_batch(batch, dictionary=d)) < 0.8 * len(encode_batch(batch))

    again = CliRunner().invoke(
        main, ["dict", "train", "--records", str(records), "--out", str(out),
               "--stream", "containers"],
    )  # fmt: skip
    assert again.exit_code == 0, again.output
    newest = Dictionaries.load(out).newest("containers")
    assert newest is not None and newest.dict_id > made[1]["id"]
    assert str(newest.dict_id) in again.output


def test_input_that_is_not_consume_output_exits_2_naming_file_and_line(tmp_path: Path) -> None:
    records = _consumed(tmp_path / "sent.jsonl")
    bad = len(records.read_text().splitlines()) + 1
    with records.open("a") as f:
        f.write('{"origin": "bigblue", "stream": "nav"}\n')
    result = CliRunner().invoke(
        main, ["dict", "train", "--records", str(records), "--out", str(tmp_path / "d")]
    )
    assert result.exit_code == 2
    assert f"{records}:{bad}: not a line of shorelink consume" in result.output


def test_too_few_records_to_train_on_exits_2_naming_the_stream(tmp_path: Path) -> None:
    records = tmp_path / "few.jsonl"
    records.write_text(
        json.dumps({"origin": "bigblue", "stream": "alerts", "seq": 1, "key": "k",
                    "value": "x", "ts": 1, "mqtt_topic": "t"}) + "\n"
    )  # fmt: skip
    result = CliRunner().invoke(
        main, ["dict", "train", "--records", str(records), "--out", str(tmp_path / "d")]
    )
    assert result.exit_code == 2
    assert "stream alerts" in result.output
