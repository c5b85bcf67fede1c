"""Zstd dictionaries for batch bodies: one per stream, trained at headquarters on what
the fleet sent, carried to ships and gateways as files.

Why: a satellite batch is small (200 records), and a small batch gives zstd little to
learn from: most of a 200-record body of container telemetry is the key dictionary (a
thousand container ids), the topic patterns and the first sight of every template,
all of which the previous batch carried too. A dictionary holds them once, on both
sides; a batch compressed with it refers to them (docs/wire-format.md, "Dictionaries";
``bench/wire_size.py`` measures what it saves per stream).

A dictionary is named by its id (zstd's own dictionary id, in the dictionary's header,
32,768 .. 2**31 - 1) and kept in ``<stream>-<id>.zdict``. Ids only grow: the trainer
takes the seconds since 2020 or one more than the highest id already in its directory,
so a stream's newest dictionary is the one with the highest id. A batch compressed with
one says its id in its header (``FLAG_DICTIONARY``); a decoder that does not hold it
refuses the batch as ``unknown_dictionary`` (the ship then sends that stream without a
dictionary to that gateway: edge_agent/session.py).

Carried by files now (``uplink.dictionaries_dir`` on a ship, ``dictionaries_dir`` at a
gateway); the fleet registry will carry the same files by the same names.
"""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import zstandard

from shorelink.boundary import boundary
from shorelink.errors import ConfigError
from shorelink.files import write_atomic
from shorelink.identity import NAME_RE
from shorelink.wire_ais import AIS
from shorelink.wire_body import WireRecord, build_body

__all__ = [
    "DEFAULT_DICT_BYTES",
    "MAX_DICT_BYTES",
    "SUFFIX",
    "Dictionaries",
    "Dictionary",
    "consumed_record",
    "next_id",
    "train",
    "training_samples",
]

SUFFIX = ".zdict"
#: what the trainer makes by default: carried to every ship once, over the satellite if
#: need be (at 20 MB a day, 0.16% of a day's budget); the knee for container telemetry
#: (bench/wire_size.py, satellite batches against the same wire body without a
#: dictionary: 0.81 at 8 KiB, 0.77 at 16 KiB, 0.67 at 32 KiB, 0.67 at 64 KiB)
DEFAULT_DICT_BYTES = 32 * 1024
#: a dictionary file larger than this is refused (a decoder holds every one it has)
MAX_DICT_BYTES = 1024 * 1024
#: zstd reserves ids below 2**15 (registered dictionaries) and from 2**31 on
MIN_ID, MAX_ID = 1 << 15, (1 << 31) - 1
#: the trainer's ids: seconds since 2020-01-01T00:00Z (they reach MAX_ID in 2088)
_ID_EPOCH_S = 1_577_836_800
_ZSTD_DICT_MAGIC = b"\x37\xa4\x30\xec"
_PROBE = b"shorelink dictionary probe " * 8
_FILE = re.compile(r"(?P<stream>.+)-(?P<id>[0-9]{1,10})" + re.escape(SUFFIX))


@dataclass(frozen=True)
class Dictionary:
    """One stream's trained dictionary: its id, its bytes (zstd's dictionary format)."""

    stream: str
    dict_id: int
    data: bytes = field(repr=False)
    zstd: zstandard.ZstdCompressionDict = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not NAME_RE.fullmatch(self.stream):
            raise ValueError(f"stream {self.stream!r} is not a stream name")
        if not MIN_ID <= self.dict_id <= MAX_ID:
            raise ValueError(f"dictionary id {self.dict_id} is not in {MIN_ID}..{MAX_ID}")
        if len(self.data) > MAX_DICT_BYTES:
            raise ValueError(f"{len(self.data)} bytes > the {MAX_DICT_BYTES}-byte limit")
        if not self.data.startswith(_ZSTD_DICT_MAGIC):
            raise ValueError("not a trained zstd dictionary (no dictionary magic)")
        try:
            d = zstandard.ZstdCompressionDict(self.data, dict_type=zstandard.DICT_TYPE_FULLDICT)
            if d.dict_id() != self.dict_id:
                raise ValueError(f"the dictionary's own id is {d.dict_id()}, not {self.dict_id}")
            # its tables are read now (a corrupt one fails here, not at the first batch)
            probe = zstandard.ZstdCompressor(dict_data=d).compress(_PROBE)
            back = zstandard.ZstdDecompressor(dict_data=d).decompress(probe)
        except zstandard.ZstdError as exc:
            raise ValueError(f"a corrupt zstd dictionary: {exc}") from None
        if back != _PROBE:
            raise ValueError("a corrupt zstd dictionary: it does not give back what it packs")
        object.__setattr__(self, "zstd", d)

    @property
    def file_name(self) -> str:
        return f"{self.stream}-{self.dict_id}{SUFFIX}"

    @classmethod
    @boundary
    def load(cls, path: Path) -> Dictionary:
        """The dictionary in ``path`` (named ``<stream>-<id>.zdict``); ValueError saying
        what is wrong with it."""
        m = _FILE.fullmatch(path.name)
        if m is None:
            raise ValueError(f"{path.name}: not named <stream>-<id>{SUFFIX}")
        with path.open("rb") as f:
            data = f.read(MAX_DICT_BYTES + 1)
        return cls(m["stream"], int(m["id"]), data)

    def write(self, directory: Path) -> Path:
        """Write it into ``directory`` (owner-only: it holds pieces of the fleet's data)."""
        path = directory / self.file_name
        write_atomic(path, self.data, mode=0o600)
        return path


class Dictionaries:
    """The dictionaries a ship or a gateway holds, by id; the newest per stream."""

    def __init__(self, dictionaries: Iterable[Dictionary] = ()) -> None:
        self._by_id: dict[int, Dictionary] = {}
        for d in dictionaries:
            if d.dict_id in self._by_id:
                raise ValueError(f"two dictionaries with id {d.dict_id}")
            self._by_id[d.dict_id] = d
        self._newest: dict[str, Dictionary] = {}
        for d in sorted(self._by_id.values(), key=lambda d: d.dict_id):
            self._newest[d.stream] = d

    @classmethod
    def load(cls, directory: Path | None, key: str = "dictionaries_dir") -> Dictionaries:
        """Every ``*.zdict`` in ``directory`` (None: none); a :class:`ConfigError` naming
        ``key`` and the file when one is not a dictionary this format takes."""
        if directory is None:
            return cls()
        if not directory.is_dir():
            raise ConfigError(key, f"{directory} is not a directory")
        found = []
        try:
            paths = sorted(p for p in directory.iterdir() if p.name.endswith(SUFFIX))
            for path in paths:
                try:
                    found.append(Dictionary.load(path))
                except ValueError as exc:
                    raise ConfigError(key, f"{path}: {exc}") from None
            return cls(found)
        except OSError as exc:
            raise ConfigError(key, f"{directory}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise ConfigError(key, f"{directory}: {exc}") from None

    def get(self, dict_id: int) -> Dictionary | None:
        return self._by_id.get(dict_id)

    def newest(self, stream: str) -> Dictionary | None:
        """The stream's dictionary with the highest id (the latest trained)."""
        return self._newest.get(stream)

    def ids(self) -> list[int]:
        return sorted(self._by_id)

    def __len__(self) -> int:
        return len(self._by_id)

    def __iter__(self) -> Iterator[Dictionary]:
        return iter(sorted(self._by_id.values(), key=lambda d: d.dict_id))


#: a line of ``shorelink consume`` longer than this is refused (a record is at most
#: 1 MiB, MAX_RECORD_BYTES; as JSON with its fields and escapes, at most about 6 MiB)
MAX_CONSUMED_LINE = 8 * 1024 * 1024


@boundary
def consumed_record(line: bytes) -> tuple[str, str, WireRecord]:
    """(origin, stream, record) of one JSON line of ``shorelink consume`` (what
    headquarters trains on); ValueError saying why a line is not one."""
    if len(line) > MAX_CONSUMED_LINE:
        raise ValueError(f"a line of {len(line)} bytes (at most {MAX_CONSUMED_LINE})")
    try:
        doc = json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"not JSON: {str(exc)[:200]}") from None
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")

    def text(name: str) -> str:
        value = doc.get(name)
        if not isinstance(value, str):
            raise ValueError(f"no {name!r} text")
        try:
            value.encode()
        except UnicodeEncodeError:
            raise ValueError(f"{name!r} is not UTF-8 text") from None
        return value

    raw: dict[str, bytes] = {}
    for name in ("key", "value"):  # text when it is UTF-8, else base64 (consume's rule)
        if isinstance(doc.get(name), str):
            raw[name] = text(name).encode()
            continue
        try:
            raw[name] = base64.b64decode(text(f"{name}_b64"), validate=True)
        except ValueError:
            raise ValueError(f"{name}_b64 is not base64") from None

    def integer(name: str) -> int:
        value = doc.get(name)
        if type(value) is not int or not -(2**63) <= value < 2**63:
            raise ValueError(f"no {name!r} int64")
        return value

    key = raw["key"].decode("utf-8", "replace")
    record = WireRecord(integer("seq"), key, integer("ts"), text("mqtt_topic"), raw["value"])
    return text("origin"), text("stream"), record


def next_id(existing: Iterable[int], now_s: float | None = None) -> int:
    """A new dictionary's id: the seconds since 2020, or one more than the highest id
    given (ids only grow, so the newest of a stream is the one with the highest id)."""
    now_s = time.time() if now_s is None else now_s
    new = max(int(now_s) - _ID_EPOCH_S, max(existing, default=0) + 1, MIN_ID)
    if new > MAX_ID:
        raise ValueError(f"no dictionary id left above {max(existing, default=0)}")
    return new


def training_samples(
    records: Sequence[WireRecord],
    batch_records: int = 200,
    *,
    min_samples: int = 64,
    ais: bool = True,
) -> list[bytes]:
    """What the encoder compresses (batch bodies, before zstd) for batches of
    ``records`` (one stream of one ship, in seq order): consecutive batches of
    ``batch_records``, starting closer together when the records make fewer than
    ``min_samples`` of them (zstd's trainer needs a few dozen samples), and batches of
    one record spread over them (a satellite session often carries one: what came since
    the last; their bodies are plain, the larger ones templated, AIS sentences as
    fields: shorelink/wire_ais.py, unless ``ais`` is false, as ``encode_batch``'s)."""
    n = len(records)
    if not n:
        return []
    size = min(batch_records, n)
    stride = max(1, min(size, (n - size) // max(1, min_samples - 1)))
    starts = list(range(0, n - size + 1, stride))
    ones = min(n, max(min_samples, len(starts) // 2))
    chunks = [records[lo : lo + size] for lo in starts]
    if size > 1:
        chunks += [records[i * n // ones : i * n // ones + 1] for i in range(ones)]
    return [
        build_body(
            tuple(
                WireRecord(i + 1, r.key, r.ts_ms, r.topic, r.payload) for i, r in enumerate(chunk)
            ),
            AIS if ais else None,
        )[1]
        for chunk in chunks
    ]


def train(
    stream: str,
    samples: Sequence[bytes],
    *,
    dict_id: int,
    size: int = DEFAULT_DICT_BYTES,
    level: int = 19,
) -> Dictionary:
    """A dictionary of at most ``size`` bytes for ``stream``, trained on ``samples``
    (:func:`training_samples`); ValueError when zstd cannot train one (too few or too
    small samples)."""
    if not samples:
        raise ValueError(f"no samples of stream {stream!r} to train on")
    try:
        d = zstandard.train_dictionary(size, list(samples), dict_id=dict_id, level=level)
    except zstandard.ZstdError as exc:
        n, total = len(samples), sum(map(len, samples))
        raise ValueError(
            f"zstd could not train a dictionary of stream {stream!r} on {n} samples of"
            f" {total} bytes: {exc}"
        ) from None
    return Dictionary(stream, dict_id, d.as_bytes())
