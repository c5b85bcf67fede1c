"""``shorelink-spark status`` as text (spark_core/status.py ``render``): every line fits
80 columns (a terminal, or piped) and every figure is whole, whatever the names of the
queries, neighbours and streams: the lag an operator asks "is Singapore's data reaching
us?" for must not be cut off at the edge of the screen."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_core.cli import main
from spark_core.quarantine import CAUSES
from spark_core.status import SiteStatus, render
from tests.strategies import DIGITS, LOWER, words

NOW = 1_800_000_000.0
names = words(LOWER, LOWER + DIGITS + "_-", 62)
figures = st.integers(0, 10**15)
ages = st.one_of(st.none(), st.floats(0, 10**8).map(lambda a: NOW - a))


@st.composite
def queries(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "query": draw(names),
        "state": draw(st.sampled_from(["running", "failed", "stopped"])),
        "batch_id": draw(st.one_of(st.none(), figures)),
        "lag_records": draw(st.one_of(st.none(), figures)),
        "timestamp": "2027-01-15T08:00:00.000Z",
    }


@st.composite
def neighbours(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "state": draw(st.sampled_from(["up", "down"])),
        "since": draw(ages),
        "last_ok": draw(ages),
        "error": draw(st.one_of(st.none(), st.text(max_size=300))),
        "streams": draw(
            st.dictionaries(
                names,
                st.fixed_dictionaries(
                    {
                        "state": st.sampled_from(["up", "catching_up", "down", "idle"]),
                        "lag_records": st.one_of(st.none(), figures),
                        "lag_s": st.one_of(st.none(), st.integers(0, 10**9).map(float)),
                        "last_success": ages,
                    }
                ),
                max_size=4,
            )
        ),
        "repair": draw(
            st.dictionaries(
                names,
                st.fixed_dictionaries(
                    {
                        "lacking": st.dictionaries(names, figures, max_size=3),
                        "repaired": st.dictionaries(names, figures, max_size=3),
                        "unserved": st.dictionaries(names, st.text(max_size=80), max_size=2),
                    }
                ),
                max_size=2,
            )
        ),
    }


@st.composite
def statuses(draw: st.DrawFn) -> SiteStatus:
    replication = {
        "neighbours": draw(st.dictionaries(names, neighbours(), max_size=3)),
        "routes": draw(st.dictionaries(names, st.one_of(st.none(), names), max_size=4)),
    }
    if draw(st.booleans()):
        replication["holds_all"] = draw(st.sampled_from([None, True, False]))
        replication["lost_here"] = draw(st.dictionaries(names, figures, max_size=2))
    if draw(st.booleans()):
        causes = st.sampled_from(sorted(CAUSES))
        replication["quarantine"] = {
            "quarantined": draw(
                st.dictionaries(names, st.dictionaries(causes, figures, max_size=3), max_size=2)
            ),
            "taken_again": draw(st.dictionaries(causes, figures, max_size=2)),
        }
    return SiteStatus(
        draw(names),
        Path("/var/lib/shorelink/checkpoints"),
        {"queries": draw(st.lists(queries(), max_size=5))},
        replication,
        ages=draw(st.dictionaries(st.sampled_from(["queries", "replication"]), st.floats(0, 1e6))),
        problems=draw(st.lists(st.text(max_size=200), max_size=3)),
    )


def _figures(status: SiteStatus) -> list[str]:
    out = []
    for q in (status.queries or {})["queries"]:
        out += [str(q[k]) for k in ("batch_id", "lag_records") if q[k] is not None]
    for n in (status.replication or {})["neighbours"].values():
        for s in n["streams"].values():
            out += [str(s["lag_records"]) if s["lag_records"] is not None else ""]
            out += [f"{s['lag_s']:.1f}" if s["lag_s"] is not None else ""]
    return out


@settings(max_examples=200, deadline=None)
@given(statuses())
def test_every_line_fits_80_columns_and_every_lag_is_whole(status: SiteStatus) -> None:
    lines = render(status, NOW, width=80)
    assert all(len(line) <= 80 for line in lines), [ln for ln in lines if len(ln) > 80]
    # a figure split over two lines would count as two other figures
    shown = Counter(re.findall(r"\d+", "\n".join(lines)))
    assert shown >= Counter(re.findall(r"\d+", " ".join(_figures(status))))
    words = set(re.split(r"\s+", "\n".join(lines)))
    rep = status.replication or {}
    for name in [q["query"] for q in (status.queries or {})["queries"]] + list(rep["neighbours"]):
        assert name in words, name
    for entry, via in rep["routes"].items():
        assert (f"{entry} via {via}" if via else f"{entry}: no route") in "\n".join(lines)


def test_holdings_say_everything_is_held_or_what_is_lacking_where() -> None:
    def status(holds: bool | None) -> SiteStatus:
        repair = {
            "merge": {
                "lacking": {"containers": 50},
                "repaired": {"containers": 7},
                "unserved": {"ship1/containers": "401-410"},
            }
        }
        replication = {
            "holds_all": holds,
            "neighbours": {"tokyo": {"state": "up", "streams": {}, "repair": repair}},
        }
        return SiteStatus("hq", Path("/c"), {"queries": []}, replication)

    assert "holdings: holds everything its neighbours hold" in render(status(True), NOW, 80)
    lost = status(True)
    assert lost.replication is not None
    lost.replication["lost_here"] = {"containers": 12}
    assert "its canonical topic lost 12 of containers early" in " ".join(
        " ".join(render(lost, NOW, 80)).split()
    )
    assert "holdings: not compared with every neighbour yet" in render(status(None), NOW, 80)
    text = "\n".join(render(status(False), NOW, 80))
    assert "lacks 50 of containers that tokyo holds (merge; repaired so far 7)" in " ".join(
        text.split()
    )
    assert "tokyo names and does not serve: ship1/containers" in " ".join(text.split())


def test_the_quarantine_says_per_stream_and_cause_what_waits_and_what_lifts_it() -> None:
    replication = {
        "neighbours": {},
        "quarantine": {
            "quarantined": {"containers": {"holes": 3, "contract": 1}},
            "taken_again": {"unknown_ship": 40},
        },
    }
    text = " ".join(
        " ".join(
            render(SiteStatus("hq", Path("/c"), {"queries": []}, replication), NOW, 80)
        ).split()
    )
    assert "quarantine (sl.dead.<stream>, since the start)" in text
    assert "3 of containers: holes, tried again when the ship's ledger entry has room" in text
    assert "1 of containers: contract, not tried again: its writer must be mended" in text
    assert "taken again: 40 unknown_ship" in text
    quiet = {"neighbours": {}, "quarantine": {"quarantined": {}, "taken_again": {}}}
    lines = render(SiteStatus("hq", Path("/c"), {"queries": []}, quiet), NOW, 80)
    assert not any("quarantine" in ln for ln in lines)


SITES = """
[sites.{site}]
streams = ["containers"]
neighbours = ["{neighbour}"]
checkpoint_dir = "checkpoints"
table_dir = "tables"
[sites.{site}.kafka]
bootstrap = "127.0.0.1:1"

[sites.{neighbour}]
streams = ["containers"]
neighbours = ["{site}"]
checkpoint_dir = "other/checkpoints"
table_dir = "other/tables"
[sites.{neighbour}.kafka]
bootstrap = "127.0.0.1:2"
"""


def test_the_command_piped_fits_80_columns_with_long_names(tmp_path: Path) -> None:
    site, neighbour = "port-of-rotterdam-maasvlakte-two", "port-of-singapore-pasir-panjang"
    config = tmp_path / "sites.toml"
    config.write_text(SITES.format(site=site, neighbour=neighbour))
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    query = f"inbox-{neighbour}-containers-bulk"
    (checkpoints / "queries.status.json").write_text(
        json.dumps(
            {
                "updated_ms": NOW * 1000,
                "queries": [{"query": query, "state": "running", "batch_id": 123456789012345}],
            }
        )
    )
    stream = {"state": "catching_up", "lag_records": 987654321098765, "lag_s": 86400.5}
    replication = {
        "updated_at": NOW,
        "neighbours": {neighbour: {"state": "up", "streams": {"containers": stream}}},
        "routes": {neighbour: neighbour},
    }
    (checkpoints / "replication.status.json").write_text(json.dumps(replication))
    r = CliRunner().invoke(
        main,
        ["status", "--site", site, "--config", str(config), "--max-age", "1e12"],
        env={"COLUMNS": "80"},
    )
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert all(len(line) <= 80 for line in lines), r.output
    words = set(r.output.split())
    assert {query, "123456789012345", "987654321098765", "86400.5"} <= words, r.output


def test_the_status_says_which_fleet_registry_version_the_site_enforces() -> None:
    """Issue 41: each site reports the registry version it enforces, and what it refused
    (a forged entry there means someone wrote into its topics)."""
    replication = {
        "neighbours": {},
        "registry": {
            "version": 4210,
            "refused": {"forged": 2, "replayed": 1},
            "quarantine": [
                {
                    "version": 4211,
                    "reason": "forged",
                    "error": "entry 4211: signature does not verify",
                    "at": "2026-11-30T04:50:00Z",
                }
            ],
        },
    }
    status = SiteStatus("tokyo", Path("/c"), {"queries": []}, replication)
    lines = render(status, NOW, 80)
    assert all(len(line) <= 80 for line in lines)
    text = " ".join(" ".join(lines).split())
    assert "fleet registry: version 4210 enforced; entries refused: 2 forged, 1 replayed" in text
    # the newest refused, readable outside the process: which entry, why, when
    assert (
        "refused 2026-11-30T04:50:00Z: entry 4211: forged: entry 4211: signature does not verify"
        in text
    )
    del replication["registry"]
    assert "fleet registry" not in " ".join(render(status, NOW, 80))
