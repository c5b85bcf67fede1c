"""The Grafana dashboards (deploy/grafana/dashboards/) and the Prometheus alert rules
(deploy/prometheus/shorelink-alerts.yml) name only metrics the processes serve. A panel
over a misspelt or renamed metric draws "No data" and an alert over one never fires:
nothing says so until the day it should have. So every metric name in every query and
rule is pulled out of its PromQL and looked up in what the deployable it watches really
serves: a running agent's and a running gateway's ``/metrics``, and the registry the
site application serves (spark_core/metrics.py ``site_registry``, built from a real
site's replicator, merges, query progress and table keeper, served and scraped over
HTTP: no Spark needed, the names are the collector's); and every label a selector
matches on (``{state="down"}``) is one the metric has, as its registry declares it. The
rules file is checked
against the shape we ask of it (a severity, a summary, a description, a ``for``), and
Prometheus's own code (local_stack/promcheck: its rules loader and PromQL parser, what
``promtool check rules`` runs) reads the rules and every dashboard query."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from core_gateway.cli import serve
from core_gateway.metrics import GatewayMetrics
from edge_agent.metrics import EdgeMetrics
from local_stack.mosquitto import MosquittoBroker
from local_stack.process import free_port
from local_stack.tools import promcheck_bin
from spark_core.config import parse_config as parse_sites
from spark_core.jobs.site import mergers
from spark_core.metrics import serve_metrics, site_registry
from spark_core.progress import ProgressReporter
from spark_core.replication import Replicator
from spark_core.tables import TableKeeper
from tests.core_gateway.helpers import gateway_config
from tests.edge_agent.helpers import edge_config_doc
from tests.helpers import eventually, run_process, write_toml

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "deploy" / "prometheus" / "shorelink-alerts.yml"
DASHBOARDS = ROOT / "deploy" / "grafana" / "dashboards"
#: each deployable: its dashboard and its group of rules
WATCHED = {
    "edge": ("shorelink-edge.json", "shorelink-edge"),
    "gateway": ("shorelink-gateway.json", "shorelink-gateway"),
    "site": ("shorelink-site.json", "shorelink-site"),
}

# -- PromQL: the metric names of an expression ------------------------------------------

#: words of PromQL that are not metric names (operators, modifiers, aggregations, which
#: may stand before their ``by (...)`` rather than before a parenthesis)
KEYWORDS = frozenset(
    [
        "and",
        "or",
        "unless",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "offset",
        "bool",
        "atan2",
        "inf",
        "nan",
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
        "quantile",
        "limitk",
        "limit_ratio",
    ]
)
#: modifiers whose parenthesised list is label names, not expressions
LABEL_LISTS = frozenset(["by", "without", "on", "ignoring", "group_left", "group_right"])
_TOKEN = re.compile(
    r"""(?P<str>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)"""
    r"|(?P<var>\$\{[^}]*\}|\$\w+)"  # a Grafana variable ($instance, ${datasource})
    r"|(?P<num>(?:0x[0-9a-fA-F]+|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?)(?:[a-zA-Z]+\d*)*)"
    r"|(?P<id>[a-zA-Z_:][\w:]*)"
    r"|(?P<sym>\S)"
)


def metric_names(expr: str) -> set[str]:
    """The metric names ``expr`` selects: every identifier that is not a function
    (followed by ``(``), a keyword, a label inside ``{...}``, a label list after
    ``by``/``on``/... or inside a range ``[...]``; and ``{__name__="..."}``."""
    tokens = [(m.lastgroup, m.group()) for m in _TOKEN.finditer(expr)]
    names: set[str] = set()
    depth = {"{": 0, "[": 0}
    closing = {"}": "{", "]": "["}
    skip_list = False  # the next (...) is a list of label names
    list_depth = 0
    for i, (kind, text) in enumerate(tokens):
        if kind == "sym" and text in depth:
            depth[text] += 1
        elif kind == "sym" and text in closing:
            depth[closing[text]] -= 1
        elif depth["{"] or depth["["]:
            if kind == "id" and text == "__name__":
                value = next((t for k, t in tokens[i + 1 : i + 4] if k == "str"), None)
                if value is not None:
                    names.add(value[1:-1])
        elif list_depth:
            list_depth += text == "("
            list_depth -= text == ")"
        elif skip_list:
            if text == "(":
                list_depth, skip_list = 1, False
        elif kind == "id":
            after = tokens[i + 1][1] if i + 1 < len(tokens) else ""
            if text.lower() in LABEL_LISTS:  # PromQL's keywords have no case
                skip_list = True
            elif text.lower() not in KEYWORDS and after != "(":
                names.add(text)
    return names


def selector_labels(expr: str) -> dict[str, set[str]]:
    """metric name -> the label names its selectors in ``expr`` match on
    (``m{a="x", b=~"y"}``): a matcher on a label the family lacks matches nothing, so a
    panel stays empty and an alert never fires."""
    tokens = [(m.lastgroup, m.group()) for m in _TOKEN.finditer(expr)]
    out: dict[str, set[str]] = {}
    for i, (kind, text) in enumerate(tokens[:-1]):
        if kind != "id" or text.lower() in KEYWORDS or tokens[i + 1][1] != "{":
            continue
        labels = out.setdefault(text, set())
        j = i + 2
        while j < len(tokens) and tokens[j][1] != "}":
            if tokens[j][0] == "id" and j + 1 < len(tokens) and tokens[j + 1][1] in "=!":
                labels.add(tokens[j][1])
            j += 1
    return out


def variable_expr(query: str) -> str:
    """The PromQL inside a Grafana variable's query (``label_values(EXPR, label)``,
    ``query_result(EXPR)``); "" when it names no metric (``label_values(label)``)."""
    if m := re.fullmatch(r"\s*label_values\((.*),\s*\w+\s*\)\s*", query, re.S):
        return m.group(1)
    if m := re.fullmatch(r"\s*query_result\((.*)\)\s*", query, re.S):
        return m.group(1)
    return ""


# -- what a dashboard and a rule group name ----------------------------------------------


def dashboard(name: str) -> dict[str, Any]:
    return dict(json.loads((DASHBOARDS / name).read_text()))


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for p in board["panels"]:
        yield p
        yield from p.get("panels", [])  # a collapsed row holds its panels


def dashboard_exprs(board: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in panels(board) for t in p.get("targets", [])]
    for var in board["templating"]["list"]:
        if var["type"] == "query":
            q = var["query"]
            exprs.append(variable_expr(q["query"] if isinstance(q, dict) else q))
    return exprs


def rules() -> dict[str, Any]:
    return dict(yaml.safe_load(RULES.read_text()))


def group_exprs(group: str) -> list[str]:
    (g,) = [g for g in rules()["groups"] if g["name"] == group]
    return [r["expr"] for r in g["rules"]]


def exprs_of(deployable: str) -> list[tuple[str, str]]:
    """(file, expr) of the deployable's dashboard and its group of rules."""
    board, group = WATCHED[deployable]
    return [
        *((board, e) for e in dashboard_exprs(dashboard(board))),
        *((RULES.name, e) for e in group_exprs(group)),
    ]


def used_by(deployable: str) -> dict[str, set[str]]:
    """metric name -> where the deployable's dashboard and rules use it."""
    used: dict[str, set[str]] = {}
    for where, expr in exprs_of(deployable):
        for name in metric_names(expr):
            used.setdefault(name, set()).add(where)
    return used


#: labels Prometheus gives every series it scrapes (the target's)
TARGET_LABELS = frozenset({"job", "instance"})


def registry_labels(registry: CollectorRegistry) -> dict[str, set[str]]:
    """Family name -> its label names, as the process's registry declares them (a
    family without samples shows none in ``/metrics``): a metric's ``labelnames``, a
    collector's families' ``labels``, and what samples carry (an info's keys)."""
    out: dict[str, set[str]] = {}
    for collector in list(registry._collector_to_names):
        for family in collector.collect():
            names = out.setdefault(family.name, set())
            names.update(getattr(family, "_labelnames", ()))
            names.update(label for sample in family.samples for label in sample.labels)
        if hasattr(collector, "_labelnames"):  # a metric whose children are not there yet
            out.setdefault(collector._name, set()).update(collector._labelnames)
    return out


def family_of(series: str, families: dict[str, set[str]]) -> str:
    for suffix in ("_total", "_created", "_bucket", "_sum", "_count", "_info", ""):
        if suffix and series.endswith(suffix) and series.removesuffix(suffix) in families:
            return series.removesuffix(suffix)
    return series


def served_series(text: str) -> set[str]:
    """Every series name a ``/metrics`` body can carry, from its families (labelled
    families are there before their first sample): a counter's ``_total`` and
    ``_created``, a histogram's ``_bucket``, ``_sum`` and ``_count``."""
    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_sum", "_count", "_created"),
        "summary": ("", "_sum", "_count", "_created"),
        "info": ("_info",),
    }
    return {
        family.name + suffix
        for family in text_string_to_metric_families(text)
        for suffix in suffixes.get(family.type, ("",))
    }


def assert_serves_what_is_used(deployable: str, text: str, registry: CollectorRegistry) -> None:
    """Every metric the deployable's dashboard and rules name is in ``text`` (what it
    served), and every label their selectors match on is one ``registry`` (its own,
    built as the process builds it) gives that metric, or a target's."""
    served = served_series(text)
    used = used_by(deployable)
    assert len(used) >= 10, f"the {deployable}'s dashboard and rules name {sorted(used)}"
    missing = {name: sorted(where) for name, where in used.items() if name not in served}
    assert not missing, f"named but not served by the {deployable}: {missing}"
    families = registry_labels(registry)
    wrong = []
    for where, expr in exprs_of(deployable):
        for series, labels in selector_labels(expr).items():
            family = family_of(series, families)
            has = (
                families.get(family, set())
                | TARGET_LABELS
                | ({"le"} if series.endswith("_bucket") else set())
            )
            if labels - has:
                wrong.append(f"{where}: {series}{{{', '.join(sorted(labels - has))}}}")
    assert not wrong, f"matchers on labels the {deployable}'s metrics lack: {wrong}"


#: a Kafka where nothing listens (the discard port)
NO_BROKER = type("NoBroker", (), {"bootstrap": "127.0.0.1:9"})()


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return str(r.read().decode())


# -- the PromQL reader itself -----------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('up{job="x"} == 0', {"up"}),
        (
            "histogram_quantile(0.99, sum by (instance, le) "
            '(rate(a_seconds_bucket{instance=~"$instance"}[$__rate_interval])))',
            {"a_seconds_bucket"},
        ),
        (
            "time() - t_seconds > on (job, instance) group_left () 3 * i_seconds",
            {"t_seconds", "i_seconds"},
        ),
        (
            'sum without (le) (rate(x_total{reason!~"gap|busy"}[15m] offset 1h)) / '
            "ignoring(reason) group_right(site) y",
            {"x_total", "y"},
        ),
        (
            '{__name__="named_by_label", a="b"} or max(m:recorded[5m:30s]) > bool 1e3',
            {"named_by_label", "m:recorded"},
        ),
        ("deriv(b[30m]) > 0 and c > 3600 unless sum(d) by (stream)", {"b", "c", "d"}),
        (
            'count_values("value", e) + topk(3, f) + label_replace(g, "a", "$1", "b", "(.*)")',
            {"e", "f", "g"},
        ),
        ("vector(1) + 0x1F + 1.5e-3 + Inf - NaN", set()),
        ("sum(h) BY (a) AND ON(b) i", {"h", "i"}),
    ],
)
def test_promql_metric_names_are_found_behind_functions_matchers_and_modifiers(
    expr: str, names: set[str]
) -> None:
    """A reader that took a label, a function or a duration for a metric would fail
    every check below; one that missed a metric would pass a dashboard that draws
    nothing."""
    assert metric_names(expr) == names


def test_selector_label_matchers_are_found_per_metric() -> None:
    expr = (
        'sum by (a) (rate(x_total{reason!~"gap|busy", instance=~"$i"}[5m])) '
        'or y{state="down"} == 1 unless z and {__name__="w"}'
    )
    assert selector_labels(expr) == {"x_total": {"reason", "instance"}, "y": {"state"}}


def test_grafana_variable_queries_give_their_metric() -> None:
    assert metric_names(variable_expr("label_values(shorelink_gateway_ready, instance)")) == {
        "shorelink_gateway_ready"
    }
    assert variable_expr("label_values(instance)") == ""


# -- the files' shapes ------------------------------------------------------------------

_DURATION = re.compile(r"(\d+(ms|s|m|h|d|w|y))+")
_TEMPLATE_FIELD = re.compile(r"\{\{.*?\}\}", re.S)


def rule_problems(doc: Any) -> list[str]:
    """What Prometheus would refuse in a rules file, or what an operator needs and a
    rule lacks: groups of named rules, each an alert (or a recording rule) with an
    ``expr``; ``for`` a duration; a ``severity`` label; a summary and a description;
    balanced brackets and templates in every text."""
    out: list[str] = []
    if not isinstance(doc, dict) or set(doc) != {"groups"} or not isinstance(doc["groups"], list):
        return ["top level: exactly a list `groups`"]
    seen_groups: set[str] = set()
    seen_alerts: set[str] = set()
    for g in doc["groups"]:
        if not isinstance(g, dict) or not isinstance(g.get("name"), str):
            out.append(f"group without a name: {g!r:.80}")
            continue
        where = g["name"]
        if where in seen_groups:
            out.append(f"{where}: group name twice")
        seen_groups.add(where)
        if unknown := set(g) - {"name", "interval", "rules", "limit", "query_offset", "labels"}:
            out.append(f"{where}: unknown keys {sorted(unknown)}")
        if "interval" in g and not _DURATION.fullmatch(str(g["interval"])):
            out.append(f"{where}: interval {g['interval']!r}")
        if not isinstance(g.get("rules"), list) or not g["rules"]:
            out.append(f"{where}: no rules")
            continue
        for r in g["rules"]:
            out.extend(_rule_problems(where, r, seen_alerts))
    return out


def _rule_problems(group: str, r: Any, seen: set[str]) -> list[str]:
    if not isinstance(r, dict):
        return [f"{group}: a rule that is not a mapping"]
    name = r.get("alert") or r.get("record")
    where = f"{group}/{name}"
    out: list[str] = []
    if ("alert" in r) == ("record" in r):
        return [f"{where}: exactly one of alert and record"]
    allowed = {"alert", "expr", "for", "keep_firing_for", "labels", "annotations"}
    if "record" in r:
        allowed = {"record", "expr", "labels"}
    if unknown := set(r) - allowed:
        out.append(f"{where}: unknown keys {sorted(unknown)}")
    expr = r.get("expr")
    if not isinstance(expr, str) or not expr.strip():
        return [*out, f"{where}: no expr"]
    if not metric_names(expr):
        out.append(f"{where}: expr names no metric")
    stack: list[str] = []
    pairs = {")": "(", "]": "[", "}": "{"}
    for kind, text in ((m.lastgroup, m.group()) for m in _TOKEN.finditer(expr)):
        if kind == "sym" and text in "([{":
            stack.append(text)
        elif kind == "sym" and text in pairs and (not stack or stack.pop() != pairs[text]):
            out.append(f"{where}: unbalanced {text!r}")
    if stack:
        out.append(f"{where}: unclosed {stack}")
    if "record" in r:
        return out
    if not re.fullmatch(r"[A-Z][A-Za-z0-9]+", name):
        out.append(f"{where}: alert names are CamelCase")
    if name in seen:
        out.append(f"{where}: alert name twice")
    seen.add(name)
    for key in ("for", "keep_firing_for"):
        if key in r and not _DURATION.fullmatch(str(r[key])):
            out.append(f"{where}: {key} {r[key]!r} is not a duration")
    if "for" not in r:
        out.append(f"{where}: no `for` (fires on the first evaluation that matches)")
    labels = r.get("labels") or {}
    if labels.get("severity") not in ("critical", "warning", "info"):
        out.append(f"{where}: severity critical, warning or info")
    notes = r.get("annotations") or {}
    for key in ("summary", "description"):
        if not isinstance(notes.get(key), str) or len(notes[key]) < 20:
            out.append(f"{where}: annotation {key} missing or too short")
    for key, text in [*labels.items(), *notes.items()]:
        if not isinstance(text, str):
            out.append(f"{where}: {key} is not a string")
        elif text.count("{{") != text.count("}}") or any(
            not re.fullmatch(r"\{\{-? *(\$labels\.\w+|\$value(?: *\| *\w+)?) *-?\}\}", t)
            for t in _TEMPLATE_FIELD.findall(text)
        ):
            out.append(f"{where}: {key} has a template Prometheus would not expand")
    return out


def test_the_alert_rules_file_has_the_shape_prometheus_reads() -> None:
    doc = rules()
    assert rule_problems(doc) == []
    assert {g["name"] for g in doc["groups"]} == {group for _, group in WATCHED.values()}
    # the sample Prometheus configuration loads this file and scrapes each deployable
    sample = yaml.safe_load((RULES.parent / "prometheus.yml").read_text())
    assert [Path(f).name for f in sample["rule_files"]] == [RULES.name]
    jobs = {c["job_name"] for c in sample["scrape_configs"]}
    assert jobs == {"shorelink-edge", "shorelink-gateway", "shorelink-spark"}


@pytest.mark.parametrize(
    ("break_it", "problem"),
    [
        (lambda r: r.pop("expr"), "no expr"),
        (lambda r: r.update({"for": "5 minutes"}), "not a duration"),
        (lambda r: r.pop("for"), "no `for`"),
        (lambda r: r["labels"].pop("severity"), "severity"),
        (lambda r: r["annotations"].pop("description"), "description"),
        (lambda r: r.update({"expr": "sum(rate(x[5m])"}), "unclosed"),
        (lambda r: r["annotations"].update({"summary": "{{ $labels.a } went wrong"}), "template"),
        (lambda r: r.update({"severity": "critical"}), "unknown keys"),
    ],
)
def test_the_rule_check_refuses_a_broken_rule(break_it: Any, problem: str) -> None:
    """So that a pass above means something: each break of the first rule is named."""
    doc = rules()
    break_it(doc["groups"][0]["rules"][0])
    assert any(problem in p for p in rule_problems(doc)), rule_problems(doc)


def test_prometheus_own_code_reads_the_rules_and_every_dashboard_query(tmp_path: Path) -> None:
    """The check above is ours; this one is Prometheus's (local_stack/promcheck: its
    rulefmt loads the rules file as Prometheus does, templates and all, and its PromQL
    parser reads every rule, panel and variable query), and it refuses a file broken in
    each way it checks, so a pass means something."""
    check = [promcheck_bin(), str(RULES), *map(str, sorted(DASHBOARDS.glob("*.json")))]
    run = subprocess.run(check, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    queries = sum(len(dashboard_exprs(dashboard(board))) for board, _ in WATCHED.values())
    n_rules = sum(len(g["rules"]) for g in rules()["groups"])
    assert f"checked {queries + n_rules} rules and queries, 0 problems" in run.stdout
    text = RULES.read_text()
    # a file that does not decode is refused before its rules are read: a file of its own
    (tmp_path / "duration.yml").write_text(text.replace("for: 1h", "for: an hour"))
    (tmp_path / "rules.yml").write_text(
        text.replace("shorelink_spark_holds_all == 0", "shorelink_spark_holds_all == == 0").replace(
            "humanizeDuration }}", "humanizeDuration }"
        )
    )
    board = json.loads((DASHBOARDS / "shorelink-site.json").read_text())
    board["panels"][2]["targets"][0]["expr"] += ")"
    (tmp_path / "broken.json").write_text(json.dumps(board))
    run = subprocess.run(
        [
            promcheck_bin(),
            *(str(tmp_path / f) for f in ("duration.yml", "rules.yml", "broken.json")),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 1
    for said in ("could not parse expression", "template", "an hour", "broken.json: panel"):
        assert said in run.stdout, run.stdout


@pytest.mark.parametrize("name", sorted(board for board, _ in WATCHED.values()))
def test_each_dashboard_is_ready_for_file_provisioning(name: str) -> None:
    """Provisioned as it is: its own uid, no numeric id (Grafana assigns it), the
    Prometheus data source asked in a variable and used by every panel and query, every
    panel on the 24-column grid with an id of its own and a description."""
    board = dashboard(name)
    assert board["uid"] == name.removesuffix(".json") and board.get("id") is None
    variables = {v["name"]: v for v in board["templating"]["list"]}
    ds = variables["datasource"]
    assert (ds["type"], ds["query"]) == ("datasource", "prometheus")
    assert "instance" in variables
    ids = [p["id"] for p in panels(board)]
    assert len(ids) == len(set(ids))
    shown = [p for p in panels(board) if p["type"] != "row"]
    assert len(shown) >= 10
    for p in shown:
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p.get("description") and p["targets"], p["title"]
        pos = p["gridPos"]
        assert pos["x"] + pos["w"] <= 24 and pos["h"] > 0, p["title"]
        for t in p["targets"]:
            assert t["datasource"] == p["datasource"] and metric_names(t["expr"]), p["title"]


# -- against what each deployable serves ------------------------------------------------


def test_every_metric_the_edge_dashboard_and_rules_name_is_served_by_a_running_agent(
    tmp_path: Path, mosquitto: MosquittoBroker
) -> None:
    port = free_port()
    doc = edge_config_doc(tmp_path, mosquitto)
    doc["metrics"] = {"host": "127.0.0.1", "port": port}
    cfg = write_toml(tmp_path / "edge.toml", doc)
    argv = [sys.executable, "-m", "edge_agent.cli", "run", "--config", str(cfg)]
    proc = run_process("edge-agent", argv, tmp_path / "agent.log")
    try:
        text = ""

        def served() -> bool:
            nonlocal text
            try:
                text = scrape(port)
            except OSError:
                return False
            return "shorelink_edge_mqtt_connected 1.0" in text

        eventually(served, 30, "the agent's /metrics, connected to its broker", proc=proc)
    finally:
        proc.stop(grace=5)
    assert_serves_what_is_used("edge", text, EdgeMetrics().registry)


async def test_every_metric_the_gateway_dashboard_and_rules_name_is_served_by_a_running_gateway(
    tmp_path: Path,
) -> None:
    """The gateway as the tests run it (core_gateway.cli ``serve``, a real aiohttp
    server), before its Kafka answers: it serves every family from the start (and says
    it is not ready: the alert ShorelinkGatewayNotReady reads that), so no broker is
    needed to know the names."""
    cfg = gateway_config(tmp_path, NO_BROKER)  # type: ignore[arg-type]
    # it gives up on each try at once, so it stops at once too
    cfg = dataclasses.replace(cfg, kafka=cfg.kafka.with_timeout(0.5))
    stop = asyncio.Event()
    started = asyncio.Event()
    task = asyncio.create_task(serve(cfg, install_signals=False, started=started, stop=stop))
    try:
        await asyncio.wait_for(started.wait(), 30)
        text = await asyncio.to_thread(scrape, cfg.metrics_port)
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
    assert "shorelink_gateway_ready 0.0" in text
    assert_serves_what_is_used("gateway", text, GatewayMetrics().registry)


def test_every_metric_the_site_dashboard_and_rules_name_is_served_by_the_site_application(
    tmp_path: Path,
) -> None:
    """The registry ``shorelink-spark site`` serves (spark_core/jobs/site.py
    ``build_supervisor``), from the real objects of a site with a neighbour, tables and
    both merges, none of them started: the collector's families do not depend on
    Spark or Kafka having answered."""
    doc = {
        "sites": {
            "tokyo": {
                "streams": ["alerts", "containers"],
                "neighbours": ["hq"],
                "tables": True,
                "checkpoint_dir": str(tmp_path / "tokyo" / "checkpoints"),
                "table_dir": str(tmp_path / "tokyo" / "tables"),
                "kafka": {"bootstrap": "127.0.0.1:9"},
            },
            "hq": {
                "streams": ["alerts", "containers"],
                "neighbours": ["tokyo"],
                "checkpoint_dir": str(tmp_path / "hq" / "checkpoints"),
                "table_dir": str(tmp_path / "hq" / "tables"),
                "kafka": {"bootstrap": "127.0.0.1:9"},
            },
        }
    }
    cfg = parse_sites(doc, base=tmp_path)
    site = cfg.site("tokyo")
    merges = mergers(site, cfg)
    replicator = Replicator(cfg, site, merges)
    progress = ProgressReporter(tmp_path / "queries.status.json")
    keeper = TableKeeper(None, site)
    server = serve_metrics("127.0.0.1", 0, replicator, merges, progress, keeper)
    try:
        text = scrape(server.server_port)
    finally:
        server.shutdown()
    assert len(merges) == 2 and replicator.pullers
    assert_serves_what_is_used("site", text, site_registry(replicator, merges, progress, keeper))
