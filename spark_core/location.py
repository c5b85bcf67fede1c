"""Where a site keeps what Spark writes, its Delta tables and its streaming checkpoints:
a local path or any Hadoop filesystem URL (``s3a://bucket/x``, ``abfss://c@acct.dfs.core.windows.net/x``,
``hdfs://nn/x``, ``file:///x``).

Spark takes either as it is. The driver's own look at them (does a table exist yet, a
checkpoint's offset log and query id, a checkpoint dropped to start a query afresh)
goes through Python's file functions for a path, as before, and through the JVM's
Hadoop ``FileSystem`` for a URL, with the session's Hadoop configuration: the
credentials and endpoint Spark itself uses (``spark.hadoop.fs.s3a.*`` in
``[spark.conf]``), and the filesystem jars the Spark carries (``hadoop-aws`` for
``s3a://``, through ``spark.jars.packages``).

A :class:`Location` that is a path is also an ``os.PathLike``, so code (and tests) that
handle a local site's directories as paths keep working; a URL refuses to be one.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shorelink.errors import ConfigError

__all__ = ["Location", "delete", "exists", "read_text"]

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


@dataclass(frozen=True)
class Location:
    """A directory or file of a site's Spark data: ``text`` is a path or a URL."""

    text: str

    @classmethod
    def from_config(cls, text: str, base: Path | None, field: str) -> Location:
        """As the sites file writes it: a URL as it is, a path relative to the file."""
        if not text:
            raise ConfigError(field, "expected a path or a Hadoop filesystem URL, got ''")
        if _SCHEME.match(text):
            return cls(text)
        path = Path(text)
        return cls(str(base / path if base is not None and not path.is_absolute() else path))

    @property
    def is_url(self) -> bool:
        return _SCHEME.match(self.text) is not None

    @property
    def path(self) -> Path:
        """The local path; a URL has none (TypeError)."""
        if self.is_url:
            raise TypeError(f"{self.text} is a URL, not a local path")
        return Path(self.text)

    @property
    def name(self) -> str:
        return self.text.rstrip("/").rsplit("/", 1)[-1]

    def __truediv__(self, part: str) -> Location:
        if self.is_url:
            return Location(f"{self.text.rstrip('/')}/{part}")
        return Location(str(Path(self.text) / part))

    def __fspath__(self) -> str:
        return str(self.path)

    def __str__(self) -> str:
        return self.text


def _hadoop(spark: Any, loc: Location) -> tuple[Any, Any]:
    """(FileSystem, Path) of ``loc`` in the session's JVM, with its Hadoop configuration."""
    jvm = spark.sparkContext._jvm
    path = jvm.org.apache.hadoop.fs.Path(loc.text)
    return path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()), path


def exists(spark: Any, loc: Location) -> bool:
    if not loc.is_url:
        return loc.path.exists()
    fs, path = _hadoop(spark, loc)
    return bool(fs.exists(path))


def read_text(spark: Any, loc: Location) -> str:
    """The file's text (UTF-8); FileNotFoundError when it is not there, OSError when it
    cannot be read."""
    if not loc.is_url:
        return loc.path.read_text()
    fs, path = _hadoop(spark, loc)
    try:
        if not fs.exists(path):
            raise FileNotFoundError(loc.text)
        stream = fs.open(path)
        try:
            data = spark.sparkContext._jvm.org.apache.commons.io.IOUtils.toByteArray(stream)
        finally:
            stream.close()
    except OSError:
        raise
    except Exception as exc:  # py4j's Py4JJavaError: the store refused or failed
        raise OSError(f"{loc.text}: {exc}") from exc
    return bytes(data).decode()


def delete(spark: Any, loc: Location) -> None:
    """Remove ``loc`` and everything under it (nothing when it is not there)."""
    if not loc.is_url:
        if loc.path.is_dir():
            shutil.rmtree(loc.path)
        else:
            loc.path.unlink(missing_ok=True)
        return
    fs, path = _hadoop(spark, loc)
    fs.delete(path, True)
