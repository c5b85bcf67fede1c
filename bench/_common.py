"""What every benchmark script here shares: progress lines on stderr, a work directory
that is removed afterwards (or kept with --keep), signals that unwind through the
scripts' finally blocks so every process they started stops, the command line's common
part (--quick, --keep, quick/full defaults) and the run itself (one JSON object on
stdout, the logs' tails on a failure)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol, TextIO

from prometheus_client.parser import text_string_to_metric_families

from local_stack.process import Proc

__all__ = [
    "Metrics",
    "add_run_options",
    "agent_metrics_and_streams",
    "bench_parser",
    "delta",
    "exit_on_signals",
    "fill_defaults",
    "get_json",
    "hist_mean_ms",
    "pct",
    "progress",
    "r3",
    "require_at_least_one",
    "run_bench",
    "scrape",
    "total",
    "tree_cpu_s",
    "tree_pids",
    "tree_rss_mb",
    "tree_status",
    "work_dir",
    "write_size_report",
]


def agent_metrics_and_streams(metrics_port: int) -> dict[str, Any]:
    """The edge agent's metrics and streams, as every benchmark's agent config has them
    (the config files are written with tomli-w)."""
    return {
        "metrics": {"host": "127.0.0.1", "port": metrics_port},
        "streams": {
            "alerts": {"priority": 0, "on_full": "reject"},
            "nav": {"priority": 10},
            "containers": {"priority": 50},
        },
    }


def progress(name: str) -> Callable[[str], None]:
    """A ``say(msg)`` that prints ``[name HH:MM:SS] msg`` to stderr."""

    def say(msg: str) -> None:
        print(f"[{name} {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    return say


@contextlib.contextmanager
def work_dir(keep: Path | None, prefix: str) -> Iterator[Path]:
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep.resolve()
        return
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def exit_on_signals(say: Callable[[str], None]) -> None:
    """SIGTERM/SIGHUP raise SystemExit, so the finally blocks stop what was started."""

    def _exit(signum: int, _frame: object) -> None:
        say(f"stopping on signal {signum}: cleaning up")
        sys.exit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit)


def require_at_least_one(p: argparse.ArgumentParser, args: argparse.Namespace, *names: str) -> None:
    """Exit with a usage error naming the option if any of ``names`` is below 1."""
    for name in names:
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")


def bench_parser(prog: str, doc: str | None) -> argparse.ArgumentParser:
    """A benchmark's argument parser: its docstring's first paragraph as description."""
    return argparse.ArgumentParser(
        prog=prog,
        description=doc.split("\n\n")[0] if doc else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Progress goes to stderr; one JSON object goes to stdout.",
    )


def add_run_options(p: argparse.ArgumentParser, quick: str, kept: str) -> None:
    """``--quick`` (``quick``: what it runs) and ``--keep DIR`` (``kept``: what stays)."""
    p.add_argument("--quick", action="store_true", help=quick)
    p.add_argument(
        "--keep",
        type=Path,
        default=None,
        metavar="DIR",
        help=f"work in DIR and keep it ({kept}) instead of a temp dir",
    )


def fill_defaults(a: argparse.Namespace, defaults: dict[str, tuple[Any, Any]]) -> None:
    """Options not given take their (quick, full) default."""
    for name, (quick, full) in defaults.items():
        if getattr(a, name) is None:
            setattr(a, name, quick if a.quick else full)


class Bench(Protocol):
    procs: list[Proc]

    def run(self) -> dict[str, Any]: ...

    def cleanup(self) -> None: ...


def run_bench(
    say: Callable[[str], None],
    keep: Path | None,
    prefix: str,
    make: Callable[[Path], Bench],
    *,
    errors: tuple[type[BaseException], ...] = (),
    out: TextIO | None = None,
) -> int:
    """Run a benchmark in its work directory and print its one JSON object (to ``out``,
    default stdout); on a failure, say what and the tail of every process's log."""
    exit_on_signals(say)  # SIGTERM/SIGHUP unwind through the finally: every process stops
    with work_dir(keep, prefix) as work:
        bench = make(work)
        try:
            result = bench.run()
        except (RuntimeError, subprocess.SubprocessError, OSError, *errors) as exc:
            say(f"failed: {exc}; logs in {work / 'logs'}" + ("" if keep else " (removed)"))
            for p in bench.procs:
                say(f"--- {p.name} ({p.log}):\n{p.tail(10)}")
            return 1
        finally:
            bench.cleanup()
    print(json.dumps(result, indent=2), file=out or sys.stdout, flush=True)
    return 0


# -- a report of costs against a size ----------------------------------------------------
def _dig(d: Any, dotted: str) -> float | None:
    for part in dotted.split("."):
        d = d.get(part) if isinstance(d, dict) else None
    return float(d) if isinstance(d, (int, float)) else None


def write_size_report(
    path: Path,
    title: str,
    result: dict[str, Any],
    x: str,
    charts: list[tuple[str, str, dict[str, str]]],
) -> Path:
    """An HTML page at ``path``: one chart per cost against the size ``x`` of each of
    ``result["sizes"]`` (each chart: its title, its y label, and its lines as label ->
    dotted key into a size's figures), then the result's JSON. Charts as embedded PNG
    (matplotlib), so the page is one file."""
    import base64
    import html
    import io

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    sizes = result.get("sizes", [])
    xs = [s[x] for s in sizes]
    parts = [f"<h1>{html.escape(title)}</h1>"]
    for name, ylabel, lines in charts:
        fig = Figure(figsize=(7, 3))
        ax = fig.add_subplot()
        for label, key in lines.items():
            ys = [_dig(s, key) for s in sizes]
            ax.plot(xs, [float("nan") if y is None else y for y in ys], marker="o", label=label)
        ax.set_title(name)
        ax.set_xlabel(x)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize="small")
        FigureCanvasAgg(fig)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
        data = base64.b64encode(buf.getvalue()).decode()
        parts.append(f'<img alt="{html.escape(name)}" src="data:image/png;base64,{data}">')
    parts.append(f"<pre>{html.escape(json.dumps(result, indent=2))}</pre>")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title>"
        + "\n".join(parts)
    )
    return path


# -- reading a process's Prometheus metrics ---------------------------------------------
Metrics = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str, context: ssl.SSLContext | None = None) -> Metrics:
    with urllib.request.urlopen(url, timeout=5, context=context) as resp:
        text = resp.read().decode()
    out: Metrics = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out


def total(m: Metrics, name: str, **labels: str) -> float:
    """Sum of ``name`` over the series whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, lab), v in m.items() if n == name and want <= set(lab))


def delta(before: Metrics, after: Metrics, name: str, **labels: str) -> float:
    return total(after, name, **labels) - total(before, name, **labels)


def hist_mean_ms(before: Metrics, after: Metrics, name: str) -> float | None:
    n = delta(before, after, name + "_count")
    return round(delta(before, after, name + "_sum") / n * 1000, 1) if n else None


def get_json(
    url: str,
    token: str | None = None,
    timeout: float = 3.0,
    context: ssl.SSLContext | None = None,
) -> Any:
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=timeout, context=context) as resp:
        return json.loads(resp.read())


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def r3(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def tree_pids(pid: int) -> list[int]:
    """``pid`` and its descendants now (from /proc)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            for t in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (t / "children").read_text().split()]
        except OSError:
            continue
        out.append(p)
    return out


def tree_status(pid: int, name: str) -> tuple[int, int]:
    """The sum of field ``name`` of /proc/<pid>/status (``VmRSS``: kB; ``Threads``) over
    ``pid`` and its descendants, and how many processes were read."""
    total, n = 0, 0
    for p in tree_pids(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith(name + ":"):
                    total += int(line.split()[1])
        except OSError:
            continue
        n += 1
    return total, n


def tree_rss_mb(pid: int) -> tuple[float, int]:
    """RSS of ``pid`` and its descendants (from /proc), in MiB, and how many processes."""
    kb, n = tree_status(pid, "VmRSS")
    return round(kb / 1024, 1), n


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds so far of ``pid``, of its descendants alive now, and
    of those it reaped (0 once it is gone)."""
    total = 0
    for p in tree_pids(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # utime, stime; and of the root, cutime and cstime (its reaped children)
        total += sum(int(f) for f in fields[11 : 15 if p == pid else 13])
    return total / os.sysconf("SC_CLK_TCK")
