"""What every shorelink command line shares: the ``--config`` option, exiting with a
clear one-line error, loading a config or exiting; the hand-over between ``shorelink``
and the options other packages add to it."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

from shorelink.errors import ConfigErrors, ShorelinkError

__all__ = [
    "BOOTSTRAP_LOCATOR",
    "config_option",
    "fail",
    "load_or_exit",
    "seq_bound",
    "stream_seqs",
]

T = TypeVar("T")

#: ``ctx.meta`` key where an option that names a site's Kafka another way than
#: ``--bootstrap`` (the local stack's ``shorelink audit --stack DIR``) leaves a
#: ``site -> KafkaEndpoint`` function
BOOTSTRAP_LOCATOR = "shorelink.bootstrap_locator"


def config_option(what: str, envvar: str) -> Callable[[Any], Any]:
    """``--config FILE`` (required; also from ``envvar``), passed as ``config_path``."""
    return click.option(
        "--config",
        "config_path",
        type=click.Path(path_type=Path),
        required=True,
        envvar=envvar,
        help=f"{what} config TOML (env {envvar}).",
    )


def fail(exc: Exception) -> NoReturn:
    """Print ``error: ...`` to stderr (a line each when a file has several bad keys) and
    exit 2."""
    for one in exc.errors if isinstance(exc, ConfigErrors) else (exc,):
        click.echo(f"error: {one}", err=True)
    sys.exit(2)


def load_or_exit(loader: Callable[[Path], T], path: Path) -> T:
    try:
        return loader(path)
    except ShorelinkError as exc:
        fail(exc)


def stream_seqs(items: Sequence[str], option: str) -> dict[str, int]:
    """``STREAM=SEQ`` options as a mapping; a ShorelinkError naming a bad one."""
    out = {}
    for item in items:
        stream, _, seq = item.partition("=")
        if not seq.isdigit() or int(seq) < 1:
            raise ShorelinkError(f"{option} {item!r}: give STREAM=SEQ, SEQ >= 1")
        out[stream] = int(seq)
    return out


def seq_bound(items: Sequence[str], option: str) -> int | dict[str, int]:
    """``[STREAM=]SEQ`` options: one SEQ for every stream, or a seq per STREAM (a
    stream not named: none of its seqs)."""
    if len(items) == 1 and items[0].isdigit():
        if int(items[0]) < 1:
            raise ShorelinkError(f"{option} 0: give SEQ >= 1")
        return int(items[0])
    return stream_seqs(items, option)
