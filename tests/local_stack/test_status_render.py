"""``shorelink stack status`` as text (local_stack/cli.py): every line fits 80 columns (a
terminal, or piped) and every pid, port and log is whole: the line an operator reads
to find the dead component's log must not run off the screen. The stack itself is
started in test_stack.py; these read a stack.json of this process and a dead one."""

from __future__ import annotations

import os
import re
import socket
import sys
from collections import Counter
from pathlib import Path

from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from local_stack.cli import render_status, stack
from local_stack.stack import Component, StackInfo
from tests.helpers import run_process
from tests.strategies import DIGITS, LOWER, words

names = words(LOWER, LOWER + DIGITS + ":_-", 40)


def _fits_and_whole(lines: list[str], figures: list[str], words: list[str]) -> None:
    assert all(len(line) <= 80 for line in lines), [ln for ln in lines if len(ln) > 80]
    # a figure split over two lines would count as two other figures
    shown = Counter(re.findall(r"\d+", "\n".join(lines)))
    assert shown >= Counter(re.findall(r"\d+", " ".join(figures)))
    on_lines = set("\n".join(lines).split())
    for w in words:
        assert w in on_lines, w


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            names,
            st.sampled_from(["up", "dead", "not-listening"]),
            st.integers(1, 4_194_304),
            st.one_of(st.just(""), st.integers(1, 65535).map(lambda p: f"127.0.0.1:{p}")),
            st.from_regex(r"logs/[a-z0-9_-]{1,60}/[a-z]{1,12}\.log", fullmatch=True),
        ),
        max_size=12,
    )
)
def test_every_line_fits_80_columns_and_every_pid_port_and_log_is_whole(
    components: list[tuple[str, str, int, str, str]],
) -> None:
    base = Path("/srv/shorelink/stacks/voyage-2027-01-15")
    rows = [(Component(n, pid, str(base / log), addr), s) for n, s, pid, addr, log in components]
    lines = render_status(base, rows, 80)
    figures = [f"{pid} {addr} {log}" for _, _, pid, addr, log in components]
    _fits_and_whole(lines, figures, [w for n, s, _, _, log in components for w in (n, s, log)])


def test_the_command_piped_fits_80_columns_and_names_the_dead_components_log(
    tmp_path: Path,
) -> None:
    d = tmp_path / "a-stack-directory-with-a-name-long-enough-to-matter"
    dead = run_process("dead", [sys.executable, "-c", "pass"], tmp_path / "dead.log")
    assert dead.popen is not None
    dead.popen.wait(30)
    with socket.socket() as listening, socket.socket() as closed:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        closed.bind(("127.0.0.1", 0))  # bound, not listening: nobody answers
        up, down = (f"127.0.0.1:{s.getsockname()[1]}" for s in (listening, closed))
        me = os.getpid()
        site = "port-of-rotterdam-maasvlakte-two"
        info = StackInfo(
            d,
            sites={site: {"pid": me, "log": str(d / "logs" / f"kafka-{site}.log"), "kafka": up}},
            ships={"ship1": {"pid": dead.pid, "log": str(d / "logs" / "ship1.log"), "mqtt": down}},
            processes={"edge:ship1": {"pid": me, "log": str(d / "logs" / "edge-ship1.log")}},
        )
        d.mkdir()
        info.save()
        r = CliRunner().invoke(stack, ["status", "--dir", str(d)], env={"COLUMNS": "80"})
    assert r.exit_code == 1, r.output
    lines = r.output.splitlines()
    _fits_and_whole(
        lines,
        [str(dead.pid), str(me), up, down],
        [f"kafka:{site}", "logs/ship1.log", f"logs/kafka-{site}.log", "dead", "edge:ship1"],
    )
    at = next(i for i, ln in enumerate(lines) if ln.startswith("mosquitto:ship1"))
    assert lines[at].split()[1] == "dead"
    assert "logs/ship1.log" in " ".join(lines[at : at + 2]).split()
