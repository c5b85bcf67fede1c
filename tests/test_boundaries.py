"""Every function that takes outside bytes is marked, listed and tested
(docs/boundaries.md): a boundary nobody listed is a boundary nobody held to a bound, and
the next hostile input that stops a site comes through it. Read from the source (ast),
so a mark, a row and a test cannot drift apart, and a new route handler, MQTT callback
or parser of outside text fails here until it is marked or explained."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "docs" / "boundaries.md"
PACKAGES = ("shorelink", "edge_agent", "core_gateway", "spark_core")

#: functions the scan below finds that are not boundaries, each with why
ALLOWED = {
    "edge_agent.fleet_config:_read_state": "the agent's own file beside its log "
    "(<log.path>.fleet.json), written atomically by it alone; each entry line in it is "
    "checked again against fleet.pub (decode_entry, marked) before it is used",
    "shorelink.fleet.shipconfig:document_of": "the document of an entry whose fleet "
    "signature was checked; parse_toml and strict_json.loads (marked) read it",
    "spark_core.merge:_read_stamp": "the application's own stamps in its state_dir "
    "(merges.json, <query>.sources.json, <query>.assign.json); one it cannot read "
    "starts the query afresh",
    "spark_core.merge:merge_layout": "the site's merges' own layout record in "
    "sl.merge.marker (only they may write it: ACL); one it cannot read fails the start "
    "with MergeError",
    "spark_core.merge_state:MergeState.restore_marker": "the merge's own marker: only the "
    "site's merge may write sl.merge.marker (ACL); one it cannot read fails the load "
    "with MergeError",
    "edge_agent.ingest:Ingest._on_message": "queues the message as received; "
    "Ingest._prepare hands each to admit_message (marked)",
    "edge_agent.gateway:_Upload._read": "the gateway's answers: only checked to be a JSON "
    "object (strict_json.loads, marked) before the session reads each field",
    "core_gateway.app:_healthz": "reads nothing of the request",
    "core_gateway.app:_registry": "reads nothing of the request",
    "core_gateway.app:_readyz": "reads nothing of the request",
    "core_gateway.app:_metrics": "reads nothing of the request",
    "core_gateway.app:_error_middleware.<locals>.mw": "maps a handler's errors to JSON; "
    "reads only the matched route",
    "spark_core.ops.app:_headers": "adds headers to the answer; reads nothing",
    "spark_core.ops.app:_index": "reads nothing of the request (behind _auth)",
    "spark_core.ops.app:_healthz": "reads nothing of the request",
    "spark_core.ops.app:_api_index": "reads nothing of the request (behind _auth)",
    "spark_core.ops.app:_coastlines": "reads nothing of the request (behind _auth)",
    "spark_core.ops.app:_events": "reads nothing of the request (behind _auth)",
    "spark_core.ops.app:_metrics": "reads nothing of the request (behind _auth)",
    "spark_core.ops.app:_json": "its handlers read nothing of the request (behind _auth)",
    "spark_core.ops.users:_unb64": "part of the users file's _parse (marked)",
    "spark_core.ops.follow:_alert": "part of SiteFollower._apply (marked)",
    "shorelink.proof:_public_key": "part of ShipKeys.load (marked)",
    "shorelink.proof:load_private_key": "part of ShipKey.load and FleetKey.load (marked)",
    "shorelink.fleet.entry:_raw_public": "part of decode_entry and read_anchor (marked)",
    "shorelink.fleet.cli:read_document": "an operator's configuration file at "
    "headquarters (config set, rollout start), only checked to parse (strict_json.loads "
    "and parse_toml, marked) before it is signed into the registry",
    "shorelink.config:Section._from_env": "a config value from the operator's environment, "
    "as trusted as the config file",
    "shorelink.cli:ship_key_new": "reads back the keys file it is about to write",
    "shorelink.cli:ship_key_revoke": "reads back the keys file it is about to write",
    "edge_agent.rules:_event_time": "part of map_message (marked)",
    "spark_core.progress:_parsed": "Spark's own progress report (the JVM's JSON)",
    "spark_core.progress:_offsets": "Spark's own progress report (the JVM's JSON)",
    "spark_core.tables:_query_id": "Spark's own checkpoint metadata",
    "spark_core.status:_load": "a status file this site's application wrote",
    "spark_core.purge:spark_position": "Spark's own checkpoint offsets",
    "edge_agent.bundle:_source_version": "the checkout's own pyproject.toml, at build time "
    "on shore",
    "edge_agent.bundle:build_wheel": "the checkout's own pyproject.toml, at build time on shore",
    "edge_agent.bundle:_no_wheel": "pip's own --report of a dry run, at build time on shore",
}

_ROUTE_METHODS = {"add_get", "add_post", "add_put", "add_patch", "add_delete", "add_head"}
_WEB_ROUTES = {"get", "post", "put", "patch", "delete", "head", "route"}
_PARSERS = {
    ("json", "loads"),
    ("json", "load"),
    ("tomllib", "loads"),
    ("tomllib", "load"),
    ("strict_json", "loads"),
    ("base64", "b64decode"),
}


@dataclass(frozen=True)
class Scan:
    """One module read: its functions' qualnames, the marked ones, and the functions
    that take outside input by their shape (``why``: what the scan saw)."""

    functions: frozenset[str]
    marked: frozenset[str]
    found: dict[str, str]


def _is_mark(d: ast.expr) -> bool:
    return (isinstance(d, ast.Name) and d.id == "boundary") or (
        isinstance(d, ast.Attribute) and d.attr == "boundary"
    )


def _is_middleware(d: ast.expr) -> bool:
    return (isinstance(d, ast.Attribute) and d.attr == "middleware") or (
        isinstance(d, ast.Name) and d.id == "middleware"
    )


def _ref(node: ast.expr) -> str | None:
    """The simple name a handler or callback expression refers to."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Call):
        return _ref(node.func)
    if isinstance(node, ast.Lambda):
        return "<lambda>"
    return None


def scan(source: str) -> Scan:
    """Read a module's source: what it defines, marks, and takes from outside."""
    tree = ast.parse(source)
    functions: dict[str, ast.AST] = {}
    marked: set[str] = set()
    found: dict[str, str] = {}
    refs: list[tuple[str, str]] = []  # (simple name, why)

    def visit(node: ast.AST, prefix: str, in_function: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.", in_function)
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                qual = f"{prefix}{child.name}"
                functions[qual] = child
                if any(_is_mark(d) for d in child.decorator_list):
                    marked.add(qual)
                if any(_is_middleware(d) for d in child.decorator_list):
                    found.setdefault(qual, "an aiohttp middleware")
                visit(child, f"{qual}.<locals>.", qual)
            else:
                _look(child, in_function)
                visit(child, prefix, in_function)

    def _look(node: ast.AST, in_function: str | None) -> None:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            attr, owner = node.func.attr, node.func.value
            owner_name = owner.id if isinstance(owner, ast.Name) else None
            if (owner_name, attr) in _PARSERS and in_function is not None:
                found.setdefault(in_function, f"calls {owner_name}.{attr}")
            handler = None
            if attr in _ROUTE_METHODS and len(node.args) >= 2:
                handler = node.args[1]
            elif attr == "add_route" and len(node.args) >= 3:
                handler = node.args[2]
            elif owner_name == "web" and attr in _WEB_ROUTES and len(node.args) >= 2:
                handler = node.args[-1]
            elif attr == "message_callback_add" and len(node.args) >= 2:
                handler = node.args[1]
            if handler is not None and (name := _ref(handler)):
                refs.append((name, f"handles {attr}"))
        if isinstance(node, ast.Assign):
            for target in node.targets:
                is_callback = isinstance(target, ast.Attribute) and target.attr == "on_message"
                if is_callback and (name := _ref(node.value)):
                    refs.append((name, "an MQTT on_message callback"))

    visit(tree, "", None)
    for name, why in refs:
        quals = [q for q in functions if q.rpartition(".")[2] == name] or [name]
        for qual in quals:
            found.setdefault(qual, why)
    return Scan(frozenset(functions), frozenset(marked), found)


def unmarked(source: str, module: str, allowed: dict[str, str] = ALLOWED) -> list[str]:
    """The functions of ``source`` that take outside input by their shape and are
    neither marked nor allowed."""
    s = scan(source)
    return sorted(
        f"{module}:{qual} ({why})"
        for qual, why in s.found.items()
        if qual not in s.marked and f"{module}:{qual}" not in allowed
    )


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(p.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = p
    return out


MODULES = _modules()
SCANS = {m: scan(p.read_text()) for m, p in MODULES.items()}
MARKED = {f"{m}:{q}" for m, s in SCANS.items() for q in s.marked}


@dataclass(frozen=True)
class Row:
    function: str
    tests: tuple[str, ...]
    cells: tuple[str, ...]


def rows() -> list[Row]:
    out = []
    for line in TABLE.read_text().splitlines():
        if not line.startswith("| `"):
            continue
        cells = tuple(c.strip() for c in line.strip().strip("|").split("|"))
        function = re.fullmatch(r"`([\w.]+:[\w.<>]+)`", cells[0])
        assert function, f"docs/boundaries.md: first cell is no `module:qualname`: {line}"
        tests = tuple(re.findall(r"`(tests/[^`]+)`", cells[-1]))
        out.append(Row(function.group(1), tests, cells))
    return out


ROWS = rows()


def test_every_marked_boundary_has_a_row() -> None:
    listed = {r.function for r in ROWS}
    assert not MARKED - listed, f"marked but not in docs/boundaries.md: {MARKED - listed}"


def test_every_row_names_a_marked_function_that_exists() -> None:
    for row in ROWS:
        module, _, qual = row.function.partition(":")
        assert module in SCANS, f"{row.function}: no module {module}"
        assert qual in SCANS[module].functions, f"{row.function}: no such function"
        assert row.function in MARKED, f"{row.function} has a row but no @boundary"


def test_every_row_says_its_input_error_bound_and_test() -> None:
    assert len(ROWS) >= 30
    for row in ROWS:
        assert len(row.cells) == 5 and all(row.cells), f"{row.function}: {row.cells}"
        assert row.tests, f"{row.function} names no test"
    assert len({r.function for r in ROWS}) == len(ROWS), "a function has two rows"


def _defined_tests(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {
        n.name
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name.startswith("test_")
    }


def test_every_rows_test_exists() -> None:
    missing = []
    for row in ROWS:
        for test in row.tests:
            file, _, name = test.partition("::")
            path = ROOT / file
            if not path.is_file() or name.partition("[")[0] not in _defined_tests(path):
                missing.append(f"{row.function}: {test}")
    assert not missing, f"tests named in docs/boundaries.md that do not exist: {missing}"


@pytest.mark.parametrize(
    "module",
    sorted(MODULES),
)
def test_every_handler_callback_and_parser_of_outside_text_is_marked_or_explained(
    module: str,
) -> None:
    """An aiohttp route handler or middleware, an MQTT ``on_message`` callback, or a
    function that parses text (json, tomllib, strict_json, base64) in the kernel or a
    deployable is marked ``@boundary`` (and so has a row and a test) or is on
    :data:`ALLOWED` with the reason it takes nothing from outside."""
    assert not unmarked(MODULES[module].read_text(), module)


def test_the_allow_list_names_only_functions_the_scan_finds() -> None:
    """An explanation outlives the code it explained: each entry still names a function
    the scan finds and that is not marked."""
    for name in ALLOWED:
        module, _, qual = name.partition(":")
        assert module in SCANS, name
        s = SCANS[module]
        assert qual in s.found and qual not in s.marked, f"{name}: stale allow-list entry"


SYNTHETIC = """
import json
from aiohttp import web
from shorelink.boundary import boundary

def make_app():
    app = web.Application()
    app.router.add_post("/x", _upload)
    app.router.add_get("/y", _marked)
    return app

async def _upload(request):
    return web.Response(body=await request.read())

@boundary
async def _marked(request):
    return web.Response()

class Listener:
    def start(self, client):
        client.on_message = self._on_message

    def _on_message(self, client, userdata, msg):
        pass

def read_config(text):
    return json.loads(text)

@web.middleware
async def gate(request, handler):
    return await handler(request)
"""


def test_the_check_finds_an_unmarked_handler_callback_parser_and_middleware() -> None:
    """The scan is the fence: run over a module with one of each, it names each, and
    the marked handler is not named."""
    found = unmarked(SYNTHETIC, "sample", allowed={})
    assert found == [
        "sample:Listener._on_message (an MQTT on_message callback)",
        "sample:_upload (handles add_post)",
        "sample:gate (an aiohttp middleware)",
        "sample:read_config (calls json.loads)",
    ]
    marked = SYNTHETIC.replace("async def _upload", "@boundary\nasync def _upload")
    assert "sample:_upload (handles add_post)" not in unmarked(marked, "sample", allowed={})


def test_the_scan_sees_the_project() -> None:
    """A scan that reads no module proves nothing."""
    assert "core_gateway.app:_batch" in MARKED and "shorelink.contract:Record.from_kafka" in MARKED
    assert SCANS["core_gateway.app"].found["_batch"] == "handles add_post"
    assert "Ingest._on_message" in SCANS["edge_agent.ingest"].found
