"""A site application's state for an operator: ``shorelink-spark status --site S``.

The application writes two files in the site's ``state_dir`` (by default its
``checkpoint_dir``), each to a temporary name then renamed (so a reader never sees half
of one):

- ``queries.status.json`` (spark_core/progress.py): every supervised query's state and
  last progress: batch, input rows, Kafka records not processed yet;
- ``replication.status.json`` (spark_core/replication.py): per neighbour the link's
  state, and per stream the replication state (``up``, ``catching_up``, ``down``, ``idle``:
  the records come by another route), lag in records and seconds, last success; the
  routes (entry site -> the neighbour its records come through).

This module reads them, judges them (:func:`read_status`: a missing file means the
application has not run at this site, an old one that it is not running now) and lays
them out (:func:`render`). It reads files only: it works while Kafka or Spark is down,
which is when it is needed.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from shorelink.textout import block, table, wrap
from spark_core.config import SiteConfig
from spark_core.quarantine import retried_when

__all__ = [
    "DEFAULT_MAX_AGE_S",
    "QUERIES_FILE",
    "REPLICATION_FILE",
    "SiteStatus",
    "holdings",
    "lacking",
    "read_status",
    "render",
]

QUERIES_FILE = "queries.status.json"
REPLICATION_FILE = "replication.status.json"
#: a status file older than this: the application is not running (it rewrites the
#: queries file on every batch and at least every idle progress event, ~10 s, and the
#: replication file every ``probe_interval``)
DEFAULT_MAX_AGE_S = 120.0


@dataclass
class SiteStatus:
    site: str
    #: where the files are (the site's state_dir)
    state_dir: Path
    #: ``queries.status.json`` as written, or None when missing
    queries: dict[str, Any] | None
    #: ``replication.status.json`` as written, or None when missing
    replication: dict[str, Any] | None
    #: age in seconds of each file read (by its own ``updated_*`` stamp)
    ages: dict[str, float] = field(default_factory=dict)
    #: what makes the status not OK (the command exits 1 when any)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_json(self) -> dict[str, Any]:
        return {
            "site": self.site,
            "ok": self.ok,
            "problems": self.problems,
            "ages_s": {k: round(v, 1) for k, v in self.ages.items()},
            "queries": (self.queries or {}).get("queries", []),
            "replication": self.replication,
        }


def _load(path: Path, problems: list[str]) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        problems.append(f"cannot read {path}: {exc}")
        return None
    if not isinstance(data, dict):
        problems.append(f"{path} is not a JSON object")
        return None
    return data


def read_status(
    site: SiteConfig, *, max_age_s: float = DEFAULT_MAX_AGE_S, now: float | None = None
) -> SiteStatus:
    """Read and judge the site's status files."""
    now = time.time() if now is None else now
    d = site.state_path
    problems: list[str] = []
    queries = _load(d / QUERIES_FILE, problems)
    replication = _load(d / REPLICATION_FILE, problems)
    status = SiteStatus(site.name, d, queries, replication, problems=problems)
    if queries is None and replication is None and not problems:
        problems.append(
            f"no status in {d}: the site application has not run here "
            f"(start it: shorelink-spark site --site {site.name} --config ...)"
        )
        return status
    if queries is None:
        problems.append(f"no {QUERIES_FILE} in {d}: no query of the application has started")
    else:
        updated = queries.get("updated_ms")
        if isinstance(updated, int | float):
            status.ages["queries"] = now - updated / 1000
        for q in queries.get("queries") or ():
            if q.get("state") == "failed":
                problems.append(f"query {q.get('query')} failed")
    if replication is None:
        if site.neighbours:
            problems.append(
                f"no {REPLICATION_FILE} in {d}: replication from "
                f"{', '.join(site.neighbours)} has not started"
            )
    else:
        updated = replication.get("updated_at")
        if isinstance(updated, int | float):
            status.ages["replication"] = now - updated
        problems += _replication_problems(replication)
    for what, age in status.ages.items():
        if age > max_age_s:
            problems.append(
                f"{what} status is {_age(age)} old (bound {_age(max_age_s)}): the site "
                "application is not running, or is stuck"
            )
    return status


def _replication_problems(replication: dict[str, Any]) -> list[str]:
    """What should carry data and does not: an entry site with no route (its records
    reach this site from nowhere), a stream routed through a neighbour that fails."""
    out = []
    routes = replication.get("routes")
    for entry, via in sorted(routes.items() if isinstance(routes, dict) else ()):
        if via is None:
            out.append(f"no route to {entry}'s records: no neighbour leads there now")
    neighbours = replication.get("neighbours")
    for name, nbr in sorted(neighbours.items() if isinstance(neighbours, dict) else ()):
        if isinstance(nbr, dict) and nbr.get("failing_until") is not None:
            out.append(
                f"pulls from {name} keep failing (routed around it where another path "
                f"exists): {nbr.get('pull_error') or '?'}"
            )
        streams = nbr.get("streams") if isinstance(nbr, dict) else None
        for stream, st in sorted(streams.items() if isinstance(streams, dict) else ()):
            if isinstance(st, dict) and st.get("state") == "down":
                why = st.get("error") or nbr.get("error") or "the link is down"
                out.append(f"{stream} routed through {name} is not replicating: {why}")
    return out


# -- layout ----------------------------------------------------------------------------


def lacking(rep: dict[str, Any]) -> list[dict[str, Any]]:
    """Of a replication status: per neighbour, merge and stream, how many seqs the
    neighbour holds and the site does not (repair by identity: spark_core/repair.py),
    and how many it repaired so far."""
    out = []
    for name, n in sorted((rep.get("neighbours") or {}).items()):
        for merge, r in sorted(((n or {}).get("repair") or {}).items()):
            r = r or {}
            repaired = r.get("repaired") or {}
            for stream, count in sorted((r.get("lacking") or {}).items()):
                out.append(
                    {
                        "neighbour": name,
                        "merge": merge,
                        "stream": stream,
                        "records": count,
                        "repaired": repaired.get(stream, 0),
                    }
                )
    return out


def holdings(rep: dict[str, Any]) -> tuple[str, list[str]] | None:
    """Repair by identity (spark_core/repair.py) in words, for this command and the
    operations page alike: a headline (whether the site holds everything its neighbours
    hold), then what it lacks of each neighbour's and stream's, what a neighbour names
    and does not serve, and what its own canonical topic lost early. None where the
    site has no repair (no neighbours)."""
    if "holds_all" not in rep:
        return None
    holds = rep["holds_all"]
    if holds is None:
        return "holdings: not compared with every neighbour yet", []
    lost = [
        f"its canonical topic lost {n} of {stream} early (forgotten, repaired from neighbours)"
        for stream, n in sorted((rep.get("lost_here") or {}).items())
    ]
    if holds:
        return "holdings: holds everything its neighbours hold", lost
    lines = [
        f"lacks {x['records']} of {x['stream']} that {x['neighbour']} holds ({x['merge']}; "
        f"repaired so far {x['repaired']})"
        for x in lacking(rep)
    ]
    for name, n in sorted((rep.get("neighbours") or {}).items()):
        for _, r in sorted(((n or {}).get("repair") or {}).items()):
            unserved = (r or {}).get("unserved") or {}
            if unserved:
                lines.append(f"{name} names and does not serve: {', '.join(sorted(unserved))}")
    return "holdings: lacks what a neighbour holds", [*lines, *lost]


def _holdings(rep: dict[str, Any], width: int | None) -> list[str]:
    said = holdings(rep)
    if said is None:
        return []
    head, details = said
    if rep["holds_all"] is not None and not rep["holds_all"]:  # what it lacks, packed
        return block(head, details, width)
    return wrap(head, width, "", "  ") + [
        ln for d in details for ln in wrap(d, width, "  ", "    ")
    ]


def _quarantine(rep: dict[str, Any], width: int | None) -> list[str]:
    """What the merges quarantined since they started (spark_core/quarantine.py), per
    stream and cause, with what lifts each cause; and what was taken again."""
    q = rep.get("quarantine") or {}
    lines = []
    for stream, causes in sorted((q.get("quarantined") or {}).items()):
        for cause, n in sorted((causes or {}).items()):
            lines.append(f"{n} of {stream}: {cause}, {retried_when(cause)}")
    taken = q.get("taken_again") or {}
    if taken:
        lines.append(
            "taken again: " + ", ".join(f"{n} {cause}" for cause, n in sorted(taken.items()))
        )
    if not lines:
        return []
    return ["", *block("quarantine (sl.dead.<stream>, since the start)", lines, width)]


def _age(seconds: float) -> str:
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    if s < 172800:
        return f"{s // 3600}h"
    return f"{s // 86400}d"


def _ago(epoch_s: Any, now: float) -> str:
    if not isinstance(epoch_s, int | float):
        return "-"
    return f"{_age(now - epoch_s)} ago"


def _iso_ago(text: Any, now: float) -> str:
    """Spark's progress ``timestamp`` (ISO 8601, UTC) as an age."""
    if not isinstance(text, str):
        return "-"
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return text
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return _ago(t.timestamp(), now)


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.1f}"
    return str(v)


def render(status: SiteStatus, now: float | None = None, width: int | None = None) -> list[str]:
    """The status as lines of text that fit ``width`` (default: the terminal's, 80
    piped): the queries, then each neighbour and its streams, then the routes and the
    problems."""
    now = time.time() if now is None else now
    ages = ", ".join(f"{k} updated {_age(v)} ago" for k, v in status.ages.items())
    out = wrap(f"site {status.site}" + (f" ({ages})" if ages else ""), width)
    queries = (status.queries or {}).get("queries") or []
    if queries:
        rows = [
            [
                str(q.get("query", "?")),
                str(q.get("state", "?")),
                _cell(q.get("batch_id")),
                _cell(q.get("lag_records")),
                "-",
                _iso_ago(q.get("timestamp"), now),
            ]
            for q in sorted(queries, key=lambda q: str(q.get("query")))
        ]
        header = ["query", "state", "batch", "lag records", "lag (s)", "last batch"]
        out += ["", *table(header, rows, width, right={2, 3, 4})]
    rep = status.replication or {}
    neighbours = rep.get("neighbours") or {}
    errors: list[str] = []
    if neighbours:
        rows = []
        for name in sorted(neighbours):
            n = neighbours[name] or {}
            link = str(n.get("state", "?"))
            if n.get("since") is not None:
                link += f" since {_ago(n.get('since'), now)}"
            if n.get("failing_until") is not None:
                link += ", pulls failing"
            rows.append([name, "(link)", link, "-", "-", _ago(n.get("last_ok"), now)])
            if n.get("error"):
                errors += wrap(f"{name}: link error: {n['error']}", width, "", "  ")
            for stream in sorted(n.get("streams") or {}):
                st = n["streams"][stream] or {}
                rows.append(
                    [
                        "",
                        stream,
                        str(st.get("state", "?")),
                        _cell(st.get("lag_records")),
                        _cell(st.get("lag_s")),
                        _ago(st.get("last_success"), now),
                    ]
                )
        header = ["neighbour", "stream", "state", "lag records", "lag (s)", "last success"]
        out += ["", *table(header, rows, width, right={3, 4}), *errors]
    if "holds_all" in rep:
        out += ["", *_holdings(rep, width)]
    if isinstance(reg := rep.get("registry"), dict):
        refused = reg.get("refused") or {}
        why = ", ".join(f"{n} {r}" for r, n in sorted(refused.items())) if refused else "none"
        out += [
            "",
            *wrap(
                f"fleet registry: version {_cell(reg.get('version'))} enforced; entries refused: {why}",
                width,
            ),
        ]
        for q in (reg.get("quarantine") or [])[:5]:  # the newest refused, newest first
            if isinstance(q, dict):
                line = f"  refused {_cell(q.get('at'))}: entry {_cell(q.get('version'))}"
                out += wrap(f"{line}: {q.get('reason')}: {q.get('error')}", width)
    out += _quarantine(rep, width)
    routes = rep.get("routes") or {}
    if routes:
        shown = [
            f"{entry} via {via}" if via else f"{entry}: no route"
            for entry, via in sorted(routes.items())
        ]
        out += ["", *block("routes (entry site -> neighbour)", shown, width)]
    if status.problems:
        out.append("")
        for p in status.problems:
            out += wrap(f"problem: {p}", width, "", "  ")
    return out
