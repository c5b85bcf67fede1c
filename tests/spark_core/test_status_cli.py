"""``shorelink-spark status`` (spark_core/status.py): what an operator at a port sees
when asked "is Singapore's data reaching us?". It reads the status files the site
application writes (``queries.status.json`` by spark_core/progress.py, here written by
its real ProgressReporter; ``replication.status.json`` in the replication's format), so
it answers while Kafka or Spark is down, and says so when they are missing or stale:
an old "up" is worse than no answer."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from spark_core.cli import main
from spark_core.progress import ProgressReporter
from tests.helpers import write_toml

SITES = {
    "sites": {
        "tokyo": {
            "streams": ["alerts", "containers"],
            "neighbours": ["singapore", "hq"],
            "checkpoint_dir": "tokyo/checkpoints",
            "table_dir": "tokyo/tables",
            "kafka": {"bootstrap": "127.0.0.1:1"},
        },
        "singapore": {
            "streams": ["alerts", "containers"],
            "neighbours": ["tokyo"],
            "checkpoint_dir": "singapore/checkpoints",
            "table_dir": "singapore/tables",
            "kafka": {"bootstrap": "127.0.0.1:2"},
        },
        "hq": {
            "streams": ["alerts", "containers"],
            "neighbours": ["tokyo"],
            "checkpoint_dir": "hq/checkpoints",
            "table_dir": "hq/tables",
            "kafka": {"bootstrap": "127.0.0.1:3"},
        },
    }
}

PROGRESS = {
    "batchId": 41,
    "timestamp": "2026-11-22T22:00:00.000Z",
    "numInputRows": 500,
    "inputRowsPerSecond": 250.0,
    "processedRowsPerSecond": 900.0,
    "durationMs": {"triggerExecution": 550},
    "sources": [
        {
            "description": "KafkaV2[SubscribePattern[sl\\.ingress\\..*]]",
            "endOffset": {"sl.ingress.containers": {"0": 100}},
            "latestOffset": {"sl.ingress.containers": {"0": 1300}},
        }
    ],
}


def _replication(now: float) -> dict[str, object]:
    return {
        "site": "tokyo",
        "updated_at": now - 1,
        "routes": {"singapore": "singapore", "hq": "hq", "sydney": None},
        "neighbours": {
            "singapore": {
                "state": "up",
                "since": now - 3600,
                "last_ok": now - 1,
                "error": None,
                "streams": {
                    "alerts": {
                        "state": "up",
                        "lag_records": 0,
                        "lag_s": 0.0,
                        "last_success": now - 2,
                    },
                    "containers": {
                        "state": "catching_up",
                        "lag_records": 48211,
                        "lag_s": 95.5,
                        "last_success": now - 3,
                    },
                },
            },
            "hq": {
                "state": "down",
                "since": now - 600,
                "last_ok": now - 600,
                "error": "KafkaError{code=_TRANSPORT,val=-195}",
                "streams": {
                    "alerts": {
                        "state": "down",
                        "lag_records": None,
                        "lag_s": None,
                        "last_success": now - 600,
                    },
                    "containers": {
                        "state": "idle",
                        "lag_records": None,
                        "lag_s": None,
                        "last_success": None,
                    },
                },
            },
        },
    }


@pytest.fixture
def sites(tmp_path: Path) -> Path:
    return write_toml(tmp_path / "sites.toml", SITES)


def _status(sites: Path, *extra: str) -> Result:
    return CliRunner().invoke(main, ["status", "--site", "tokyo", "--config", str(sites), *extra])


def _checkpoints(sites: Path) -> Path:
    return sites.parent / "tokyo" / "checkpoints"


def _write_running(sites: Path, now: float) -> None:
    reporter = ProgressReporter(_checkpoints(sites) / "queries.status.json")
    reporter.update("merge", PROGRESS, "running")
    reporter.update("merge-urgent", None, "running")
    (_checkpoints(sites) / "replication.status.json").write_text(json.dumps(_replication(now)))


def test_a_site_that_never_ran_says_so_and_fails(sites: Path) -> None:
    """A missing file must not read as "all quiet"."""
    r = _status(sites)
    assert r.exit_code == 1
    text = " ".join(r.output.split())  # a problem is wrapped at 80 columns
    assert "the site application has not run here" in text
    assert "shorelink-spark site --site tokyo" in text


def test_status_shows_each_query_and_each_neighbour_stream(sites: Path) -> None:
    now = time.time()
    _write_running(sites, now)
    r = _status(sites)
    assert r.exit_code == 1, r.output  # nothing comes from hq or sydney: problems
    lines = r.output.splitlines()
    merge = next(ln for ln in lines if ln.startswith("merge "))
    assert merge.split()[:4] == ["merge", "running", "41", "1200"]
    assert any(ln.split()[:2] == ["merge-urgent", "running"] for ln in lines)
    containers = next(ln for ln in lines if "catching_up" in ln)
    assert containers.split()[:4] == ["containers", "catching_up", "48211", "95.5"]
    # its last success was 3 s before ``now``; the command ran a moment after ``now``
    waited = int(time.time() - now) + 1
    assert any(f"{3 + s}s ago" in containers for s in range(waited + 1)), containers
    assert any(ln.startswith("hq") and "down since 10m" in ln for ln in lines)
    assert any("error: KafkaError{code=_TRANSPORT" in ln for ln in lines)
    assert any(ln.split()[:2] == ["alerts", "down"] for ln in lines)
    assert "sydney: no route" in r.output and "singapore via singapore" in r.output


def test_json_status_carries_the_files_as_written(sites: Path) -> None:
    now = time.time()
    _write_running(sites, now)
    r = _status(sites, "--json")
    assert r.exit_code == 1, r.output
    doc = json.loads(r.output)
    assert doc["ok"] is False
    assert doc["problems"] == [
        "no route to sydney's records: no neighbour leads there now",
        "alerts routed through hq is not replicating: KafkaError{code=_TRANSPORT,val=-195}",
    ]
    merge = next(q for q in doc["queries"] if q["query"] == "merge")
    assert merge["lag_records"] == 1200 and merge["state"] == "running"
    nbr = doc["replication"]["neighbours"]["singapore"]["streams"]["containers"]
    assert nbr == {
        "state": "catching_up",
        "lag_records": 48211,
        "lag_s": 95.5,
        "last_success": pytest.approx(now - 3),
    }
    assert doc["ages_s"]["replication"] < 60


def test_stale_status_fails(sites: Path) -> None:
    """The application died: its last words ("up", lag 0) must not be taken for now."""
    now = time.time()
    _write_running(sites, now - 3600)
    old = _replication(now - 3600)
    (_checkpoints(sites) / "replication.status.json").write_text(json.dumps(old))
    r = _status(sites)
    assert r.exit_code == 1
    assert "replication status is 60m old (bound 2m)" in r.output
    queries = json.loads((_checkpoints(sites) / "queries.status.json").read_text())
    queries["updated_ms"] -= 3_600_000
    (_checkpoints(sites) / "queries.status.json").write_text(json.dumps(queries))
    r = _status(sites, "--max-age", "60")
    assert r.exit_code == 1 and "queries status is" in r.output
    r = _status(sites, "--max-age", "7200")
    assert "old (bound" not in r.output  # within the bound (hq and sydney still fail it)


def test_a_failed_query_fails_the_status(sites: Path) -> None:
    now = time.time()
    _write_running(sites, now)
    reporter = ProgressReporter(_checkpoints(sites) / "queries.status.json")
    reporter.update("merge-urgent", None, "failed")
    r = _status(sites)
    assert r.exit_code == 1
    assert "problem: query merge-urgent failed" in r.output


def test_replication_not_started_is_named(sites: Path) -> None:
    ProgressReporter(_checkpoints(sites) / "queries.status.json").update("merge", None, "running")
    r = _status(sites)
    assert r.exit_code == 1
    assert "replication from singapore, hq has not started" in " ".join(r.output.split())
