"""``shorelink fleet rollout`` and ``fleet status`` against a real Kafka holding ship
report records: the decision an operator relies on (advance a healthy canary, stop a
broken one and say why) must come from the reports as the site holds them, and be
written as signed entries every site follows."""

from __future__ import annotations

import json
import time
from pathlib import Path

from local_stack.kafka import KafkaBroker
from shorelink.contract import canonical_topic
from shorelink.fleet.log import Registry
from shorelink.kafka.ship_reports import newest_reports
from shorelink.kafka.topics import TopicSpec, ensure_topics, producer
from shorelink.ship_report import ReportedConfig, ShipReport, report_record
from tests.helpers import unique
from tests.shorelink.test_fleet_cli import _ok


class _Sea:
    """Ship reports written to a report stream of this test's own."""

    def __init__(self, kafka: KafkaBroker) -> None:
        self.stream = unique("agent")
        self.topic = canonical_topic(self.stream)
        ensure_topics(kafka.endpoint, [TopicSpec(self.topic, 2)])
        self.producer = producer(kafka.endpoint)
        self.seq: dict[str, int] = {}

    def report(self, ship: str, version: int, failure: str | None = None) -> None:
        seq = self.seq[ship] = self.seq.get(ship, 0) + 1
        at = int(time.time() * 1000)
        report = ShipReport(at, "port", {}, {}, config=ReportedConfig(version, failure))
        rec = report_record(ship, self.stream, seq, report, "hq")
        headers: list[tuple[str, str | bytes | None]] = list(rec.headers())
        self.producer.produce(self.topic, rec.value, rec.key, headers=headers)
        assert self.producer.flush(20) == 0


def test_a_healthy_canary_advances_and_a_broken_change_stops_at_its_canary(
    tmp_path: Path, kafka: KafkaBroker
) -> None:
    """The voyage's promise at headquarters: a good change reaches the group stage by
    stage on the ships' own word, a broken one never leaves its canaries."""
    reg = tmp_path / "registry"
    r = ["--registry", str(reg)]
    _ok("init", *r)
    ships = [f"ship{i}" for i in range(10)]
    for s in ships:
        _ok("provision", s, "--group", "north", *r)
    base = tmp_path / "base.toml"
    base.write_text("[alarms]\nthreshold = 4\n")
    _ok("config", "set", str(base), "--group", "north", *r)
    before = Registry.open(reg).state.version
    sea = _Sea(kafka)
    k = ["--kafka", kafka.bootstrap, "--report-stream", sea.stream]
    for s in ships:
        sea.report(s, before)

    status = json.loads(_ok("status", "--json", *k, *r).output)
    assert {s["health"] for s in status["ships"]} == {"ok"}
    assert all(s["applied"] == before and s["heard_s_ago"] < 60 for s in status["ships"])

    new = tmp_path / "new.toml"
    new.write_text("[alarms]\nthreshold = 5\n")
    out = _ok(
        "rollout",
        "start",
        str(new),
        "--group",
        "north",
        "--canary",
        "2",
        *r,
        "--healthy-for",
        "0s",
        "--stop-at",
        "0%",
    ).output
    rid = Registry.open(reg).state.version
    canaries = out.split("canary: ")[1].split(";")[0].split(", ")
    assert len(canaries) == 2
    # the canaries' reports from before the rollout say nothing about it: held
    assert "held" in _ok("rollout", "tick", *k, *r).output
    for s in canaries:
        sea.report(s, rid)
    assert "advance" in _ok("rollout", "tick", *k, *r).output
    state = Registry.open(reg).state
    assert state.rollouts[rid].stage == 1
    assert {state.config_version(s) for s in ships} == {rid}
    for s in ships:
        sea.report(s, rid)
    assert "done" in _ok("rollout", "tick", *k, *r).output
    assert Registry.open(reg).state.rollouts[rid].state == "done"

    broken = tmp_path / "broken.toml"
    broken.write_text("[alarms]\nthresh = 5\n")
    out = _ok("rollout", "start", str(broken), "--group", "north", "--canary", "20%", *r).output
    bad = Registry.open(reg).state.version
    canaries = out.split("canary: ")[1].split(";")[0].split(", ")
    sea.report(canaries[0], rid, "alarms.thresh: unknown key")
    sea.report(canaries[1], bad)
    rollouts = json.loads(_ok("rollout", "status", "--json", *k, *r).output)
    decision = rollouts[-1]["decision"]
    assert decision["action"] == "stop"
    assert decision["ships"][canaries[0]]["state"] == "failed"
    assert "stop" in _ok("rollout", "tick", *k, *r).output
    state = Registry.open(reg).state
    stopped = state.rollouts[bad]
    assert stopped.state == "stopped" and stopped.by == "health"
    assert "1 of 2 ships failed" in (stopped.reason or "")
    assert "unknown key" in (stopped.reason or "")
    assert {state.config_version(s) for s in ships} == {rid}, "the canaries are taken back"
    table = _ok("status", *k, *r).output
    assert "failed" in table and f"rollout {bad}" not in table, "only rollouts under way"
    assert "stopped" in _ok("rollout", "status", *r).output

    # what is not a report is counted, and each ship's newest report is its last seq's
    sea.producer.produce(sea.topic, b"not a report", b"x")
    assert sea.producer.flush(20) == 0
    found = newest_reports(kafka.endpoint, sea.stream)
    assert found.bad == 1 and set(found.reports) == set(ships)
    assert found.reports[canaries[1]].config == ReportedConfig(bad, None)
