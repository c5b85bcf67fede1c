"""Command output for people: text that fits the terminal, with every figure whole.

A command's plain output is read in an 80-column terminal, or piped to a file or a
mail. A table wider than that wraps into noise, and one cut to fit (a column cut to an
ellipsis) hides the very figure the operator asked for. So every command lays out its
rows here, and ``--json`` is the form for programs.

- :func:`table`: rows as columns when they fit; else the last column (the long one:
  gap ranges, a detail, a log path) on lines of its own under each row; else one
  :func:`block` per row, ``label: value`` fields.
- :func:`block`: a head line, then fields packed on indented lines, three spaces apart.
- :func:`wrap`: text broken at spaces and after commas, so that a list of ranges wraps
  between two ranges. A word longer than a line is cut: a path after a slash, anything
  else where the line ends, but never inside a figure (a run of digits and points).
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Collection, Iterable, Sequence

__all__ = ["MAX_WIDTH", "WIDTH", "block", "table", "terminal_width", "wrap"]

#: the width of a terminal nobody has resized, and of piped output
WIDTH = 80
#: wider lines are hard to read even on a wide screen
MAX_WIDTH = 160
#: below this, lines are left wider than the terminal rather than cut to pieces
MIN_WIDTH = 40

INDENT = "  "
#: between two fields of a block, and two columns of a table
FIELD_GAP = "   "
COLUMN_GAP = "  "

#: runs of blanks, words ending in a comma (a break may follow), other words
_TOKENS = re.compile(r"\s+|[^\s,]*,|[^\s,]+")
_FIGURE = frozenset("0123456789.")


def terminal_width() -> int:
    """The terminal's columns (``COLUMNS`` when set; 80 when piped), kept between 40
    and 160."""
    columns = shutil.get_terminal_size((WIDTH, 24)).columns
    return max(MIN_WIDTH, min(MAX_WIDTH, columns))


def wrap(
    text: str, width: int | None = None, indent: str = "", subsequent_indent: str | None = None
) -> list[str]:
    """``text`` as lines of at most ``width`` columns (default: :func:`terminal_width`),
    broken at blanks and after commas. Blanks, newlines included, become one space; no
    line for blank text."""
    width = width or terminal_width()
    rest = indent if subsequent_indent is None else subsequent_indent
    if width <= max(len(indent), len(rest)):
        raise ValueError(f"width {width} leaves no room after the indent")
    lines: list[str] = []
    line, filled, space = indent, False, False
    for token in _TOKENS.findall(text):
        if token[0].isspace():
            space = filled
            continue
        piece = " " + token if space else token
        space = False
        if len(line) + len(piece) <= width:
            line, filled = line + piece, True
            continue
        if filled:
            lines.append(line)
            line = rest
        while len(line) + len(token) > width:
            cut = _cut(token, width - len(line))
            lines.append(line + token[:cut])
            line, token = rest, token[cut:]
        line, filled = line + token, True
    if filled:
        lines.append(line)
    return lines


def _cut(word: str, room: int) -> int:
    """Where to cut ``word``, longer than ``room``: after its last slash that fits (a
    path); else as far as fits, but before a figure that would otherwise be split
    (unless the figure alone is longer than the line)."""
    slash = word.rfind("/", 0, room)
    if slash > 0:
        return slash + 1
    cut = room
    while cut > 0 and _inside_figure(word, cut):
        cut -= 1
    return cut or room


def _inside_figure(word: str, at: int) -> bool:
    """Would cutting ``word`` before ``at`` split a figure, or a range of them
    (``100-250``: a hyphen between figures belongs to them)?"""
    before, after = word[at - 1], word[at]
    if before in _FIGURE and after in _FIGURE:
        return True
    if before == "-" and after in _FIGURE:
        return at >= 2 and word[at - 2] in _FIGURE
    if after == "-" and before in _FIGURE:
        return at + 1 < len(word) and word[at + 1] in _FIGURE
    return False


def block(head: str, fields: Iterable[str], width: int | None = None) -> list[str]:
    """``head`` on its own line(s), then the non-blank ``fields`` packed on lines
    indented two spaces. A field is split over lines only when longer than one."""
    width = width or terminal_width()
    lines = wrap(head, width)
    line = ""
    for field in fields:
        field = " ".join(field.split())
        if not field:
            continue
        if line and len(INDENT + line + FIELD_GAP + field) <= width:
            line += FIELD_GAP + field
            continue
        if line:
            lines.append(INDENT + line)
            line = ""
        if len(INDENT + field) <= width:
            line = field
        else:
            lines += wrap(field, width, INDENT, INDENT * 2)
    if line:
        lines.append(INDENT + line)
    return lines


def table(
    header: Sequence[str],
    rows: Iterable[Sequence[str]],
    width: int | None = None,
    *,
    right: Collection[int] = (),
) -> list[str]:
    """``rows`` under ``header``, laid out to fit ``width`` (default:
    :func:`terminal_width`), the first that fits of:

    1. columns (those in ``right``, by index, aligned right: numbers);
    2. columns but the last, whose cell goes under its row, ``label: value``, wrapped
       (a blank one is left out);
    3. one block per row: the first cell as its head, then ``label: value`` of each
       non-blank cell. A blank first cell continues the group of the row above (as a
       table prints it), so the block repeats that row's head.
    """
    width = width or terminal_width()
    head = [_flat(h) for h in header]
    body = [[_flat(c) for c in r] for r in rows]
    for r in body:
        if len(r) != len(head):
            raise ValueError(f"a row of {len(r)} cells under {len(head)} headers")
    if _fits(head, body, width):
        return _columns(head, body, right)
    if len(head) > 1 and _fits(head[:-1], [r[:-1] for r in body], width):
        columns = _columns(head[:-1], [r[:-1] for r in body], right)
        out = [columns[0]]
        for line, r in zip(columns[1:], body, strict=True):
            out.append(line)
            if r[-1]:
                out += wrap(f"{head[-1]}: {r[-1]}", width, INDENT, INDENT * 2)
        return out
    out = []
    group = ""
    for r in body:
        group = r[0] or group
        out += block(group, [f"{h}: {c}" for h, c in zip(head[1:], r[1:], strict=True) if c], width)
    return out


def _flat(cell: str) -> str:
    return " ".join(str(cell).split())


def _widths(head: Sequence[str], body: Sequence[Sequence[str]]) -> list[int]:
    return [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]


def _fits(head: Sequence[str], body: Sequence[Sequence[str]], width: int) -> bool:
    return sum(_widths(head, body)) + len(COLUMN_GAP) * (len(head) - 1) <= width


def _columns(
    head: Sequence[str], body: Sequence[Sequence[str]], right: Collection[int]
) -> list[str]:
    widths = _widths(head, body)
    return [
        COLUMN_GAP.join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ).rstrip()
        for r in [head, *body]
    ]
