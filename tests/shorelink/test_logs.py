"""Log lines as operators' tools read them: logfmt and JSON that give back every value a
call site passes (any text, every Unicode category, bytes, huge values), one line each,
whose own ``ts``, ``level``, ``logger`` and ``event`` no value can change; other
libraries' records in the same shape with their text as one value; the journal's
priorities."""

from __future__ import annotations

import ast
import io
import json
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient
from hypothesis import given, settings
from hypothesis import strategies as st

from local_stack.kafka import KafkaBroker
from local_stack.process import free_port
from shorelink.kafka.endpoint import KafkaEndpoint, name_clients
from shorelink.kafka.topics import TopicSpec, ensure_topics
from shorelink.logs import Logger, RateLimitedLog, formatter, get_logger, logfmt
from tests.bounds import KIB, Bound, within
from tests.helpers import eventually, unique
from tests.logfmt import read_logfmt

NAME = "shorelink.test"
_TS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
#: every Unicode category: controls, format characters, U+2028, U+00A0, lone surrogates
_char = st.characters(exclude_categories=())
#: (a high and a low surrogate side by side are no text: JSON reads them as the one
#: character they encode; surrogateescape only ever makes low ones)
_text = st.text(_char).filter(lambda t: not re.search("[\ud800-\udbff][\udc00-\udfff]", t))
_forged = st.builds(
    lambda a, b: f"{a} level=debug ts=2001-01-01 logger=x event=all_good\n{b}", _text, _text
)
_values = st.one_of(
    _text,
    _forged,
    st.binary(),
    st.integers(),
    st.floats(allow_nan=False),
    st.booleans(),
    st.none(),
    st.builds(lambda c, n: c * n, _char, st.integers(1_000, 50_000)),  # huge
)
#: keys a call site may pass (the structlog machinery's own excepted)
_keys = st.one_of(st.from_regex(r"[a-z_][a-z0-9_]{0,15}", fullmatch=True), _text).filter(
    lambda k: k not in ("event", "exc_info", "stack_info", "_record", "_from_structlog")
)


@contextmanager
def _capture(
    *, as_json: bool = False, priority: bool = False, name: str = NAME
) -> Iterator[io.StringIO]:
    """What the process's handler (``configure_logging``) writes for logger ``name``."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter(as_json=as_json, priority=priority))
    std = logging.getLogger(name)
    saved = std.handlers[:], std.propagate, std.level
    std.handlers[:], std.propagate = [handler], False
    std.setLevel(logging.DEBUG)
    try:
        yield out
    finally:
        std.handlers[:], std.propagate = saved[0], saved[1]
        std.setLevel(saved[2])


def _lines(emit: Callable[[Logger], None], **kw: bool) -> list[str]:
    """The lines ``emit`` writes; each must end with the one newline the handler adds."""
    with _capture(**kw) as out:
        emit(get_logger(NAME))
    lines = out.getvalue().split("\n")
    assert lines[-1] == ""
    return lines[:-1]


def _as_text(value: object) -> str:
    return repr(value) if isinstance(value, bytes) else str(value)


def _as_json(value: object) -> object:
    """Numbers JSON cannot hold exactly (beyond 64 bits, infinities) come back as text."""
    if isinstance(value, bytes) or (isinstance(value, int) and abs(value) >= 1 << 64):
        return _as_text(value)
    if isinstance(value, float) and abs(value) == float("inf"):
        return str(value)
    return value


def _back(text: object, value: object) -> bool:
    if isinstance(value, bytes):
        return isinstance(text, str) and ast.literal_eval(text) == value
    return text == value


def _bytes(value: object) -> int:
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogatepass"))
    return len(value) if isinstance(value, bytes) else 32


#: what rendering one line may cost (docs/boundaries.md, the renderer's row)
_BOUND = Bound(256 * KIB, 32, cpu_s=0.5, cpu_per_mib=8)


@settings(max_examples=200, deadline=5000)
@given(st.lists(st.tuples(_keys, _values), max_size=6).map(dict))
def test_every_value_comes_back_exactly_and_none_changes_the_lines_own_fields(
    values: dict[str, object],
) -> None:
    """Review (security N2, N8): the earlier formatter parsed ``"event=x topic=%s"``
    messages back; a no-break space hung it inside the logging lock, and a topic holding
    `` level=debug event=all_good`` rewrote the line. Fields are now data: whatever a
    value holds (every Unicode category, bytes, numbers, a huge text) and whatever its
    key, the line is one line (no newline, nothing ``str.splitlines`` splits at), its
    ``ts``, ``level``, ``logger`` and ``event`` are the call's, it has exactly one field
    per value, and each value comes back exactly, in logfmt (with or without the
    journal's priority) and in JSON."""
    want = list(values.values())
    size = sum(map(_bytes, want)) + sum(map(_bytes, values))  # the bound's n: UTF-8 bytes
    for kw in ({}, {"priority": True}, {"as_json": True}):
        if kw:
            (line,) = _lines(lambda log: log.warning("warned", **values), **kw)
        else:  # measured once: tracemalloc slows every allocation down
            (line,) = _lines(
                lambda log: within(_BOUND, (), lambda: log.warning("warned", **values), size=size)
            )
        assert len(line.splitlines()) == 1 and line.isprintable()
        if kw.get("as_json"):
            back = json.loads(line)
            got = list(back.values())[4:]
            assert all(_back(g, _as_json(v)) for g, v in zip(got, want, strict=True))
        else:
            assert line.startswith("<4>ts=" if kw else "ts=")
            back = read_logfmt(line)
            got = list(back.values())[4:]
            assert all(_back(g, _as_text(v)) for g, v in zip(got, want, strict=True))
        assert list(back)[:4] == ["ts", "level", "logger", "event"]
        assert back["level"] == "warning" and back["logger"] == NAME
        assert back["event"] == "warned" and _TS.fullmatch(back["ts"])
        assert not back["ts"].startswith("2001")


@settings(max_examples=200, deadline=5000)
@given(_text, _text)
def test_another_librarys_record_is_its_text_as_one_value(text: str, arg: str) -> None:
    """librdkafka (through the process's logger), aiohttp and py4j log through the
    standard library: their lines get the same ``ts``, ``level`` and ``logger``, and
    their text (formatted as the library asked) is one ``message`` value, never read
    for fields, whatever it holds."""
    lib = "aiohttp.test"
    for kw in ({}, {"as_json": True}):
        with _capture(name=lib, **kw) as out:
            error = logging.getLogger(lib).error
            size = _bytes(text) + _bytes(arg)
            within(_BOUND, (), error, "%s event=x level=debug %s", text, arg, size=size)
        (line,) = out.getvalue().split("\n")[:-1]
        back = json.loads(line) if kw else read_logfmt(line)
        assert list(back) == ["ts", "level", "logger", "message"]
        assert back["level"] == "error" and back["logger"] == lib
        assert back["message"] == f"{text} event=x level=debug {arg}"


def test_a_huge_value_is_written_whole_and_at_once() -> None:
    """A value of 8 MB (a topic, a payload in an error, any text) is written in one
    line that gives it back, in well under a second or two: no hang, no cut."""
    big = 'a\u00a0\n\u2028"=b' * 1_000_000
    t0 = time.monotonic()
    (line,) = _lines(lambda log: log.error("big", value=big))
    assert time.monotonic() - t0 < 10
    assert read_logfmt(line)["value"] == big


def test_an_exception_is_one_quoted_value() -> None:
    """``log.exception`` writes the traceback as one ``exc`` value, on the same line."""

    def emit(log: Logger) -> None:
        try:
            raise ZeroDivisionError("level=debug\nevent=forged")
        except ZeroDivisionError:
            log.exception("failed", site="hq")

    (line,) = _lines(emit)
    back = read_logfmt(line)
    assert list(back) == ["ts", "level", "logger", "event", "site", "exc"]
    assert back["level"] == "error" and back["event"] == "failed"
    assert back["exc"].startswith("Traceback") and "event=forged" in back["exc"]


def test_a_field_named_exc_is_kept_beside_the_exceptions_traceback() -> None:
    """``log.exception("x", exc=...)`` wrote the traceback over the call's own ``exc``
    field: the field was lost (found while writing bench/fuzz.py's log oracle, which
    expects every field back). The line's ``exc`` is the traceback, the field ``exc_``."""

    def emit(log: Logger) -> None:
        try:
            raise KeyError("k")
        except KeyError:
            log.exception("failed", exc="the caller's", exc_="another")
        log.info("plain", exc="no exception")

    failed, plain = (read_logfmt(line) for line in _lines(emit))
    assert list(failed)[4:] == ["exc_", "exc__", "exc"]
    assert failed["exc_"] == "the caller's" and failed["exc__"] == "another"
    assert failed["exc"].startswith("Traceback") and "KeyError: 'k'" in failed["exc"]
    assert list(plain)[4:] == ["exc_"] and plain["exc_"] == "no exception"


def test_any_handler_reads_a_records_message_as_logfmt(caplog: pytest.LogCaptureFixture) -> None:
    """A record's message for any other handler (pytest's, a default one before
    ``configure_logging``) is its event and fields in logfmt, not a dict's repr."""
    caplog.set_level(logging.INFO, logger=NAME)
    get_logger(NAME).info("seen", topic="a b", n=3)
    RateLimitedLog(get_logger(NAME)).warning("k", "limited", error="x")
    assert [r.getMessage() for r in caplog.records] == [
        'event=seen topic="a b" n=3',
        "event=limited error=x suppressed=0",
    ]


def test_keys_that_differ_only_in_characters_a_key_cannot_hold_stay_two_fields(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """bench/fuzz.py (the log target) found it: a record's message wrote ``{"a b": 1,
    "a_b": 2}`` as ``a_b=1 a_b=2``, one key twice, so a reader kept one value of two.
    Every field is its own key, in the line and in the message, as ``_head`` writes it."""
    caplog.set_level(logging.INFO, logger=NAME)
    fields: dict[str, object] = {"a b": 1, "a_b": 2, "a\nb": 3, "": 4, "\u00e9": 5}
    get_logger(NAME).info("keys", **fields)
    (line,) = _lines(lambda log: log.info("keys", **fields))
    assert caplog.records[0].getMessage() == "event=keys a_b=1 a_b_=2 a_b__=3 _=4 __=5"
    back = read_logfmt(line)
    assert list(back)[4:] == ["a_b", "a_b_", "a_b__", "_", "__"]
    assert list(back.values())[4:] == ["1", "2", "3", "4", "5"]


class _Unwritable:
    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    def __str__(self) -> str:
        raise self.exc


@pytest.mark.parametrize("exc", [ValueError("v"), UnicodeError("u"), RuntimeError("r")])
def test_a_value_whose_text_raises_is_written_as_its_type_not_lost_with_its_line(
    exc: Exception,
) -> None:
    """bench/fuzz.py (the log target) found it: a value whose ``str`` raised a
    ValueError (UnicodeError among them) took the whole line with it (the standard
    library's "--- Logging error ---" on stderr instead). Any value is written: one
    that cannot be text as its type and address."""
    value = _Unwritable(exc)
    for kw in ({}, {"as_json": True}):
        (line,) = _lines(lambda log: log.error("odd", value=value, after=1), **kw)
        back = json.loads(line) if kw else read_logfmt(line)
        assert back["value"] == object.__repr__(value) and str(back["after"]) == "1"


def test_a_repeated_error_is_logged_once_then_counted() -> None:
    """RateLimitedLog: the first of a run is written, the rest counted into the next."""

    def emit(log: Logger) -> None:
        limited = RateLimitedLog(log, interval=3600)
        for _ in range(5):
            limited.warning("link", "link_down", site="hq")
        limited._last["link"] -= 7200
        limited.warning("link", "link_down", site="hq")

    lines = _lines(emit)
    assert [read_logfmt(ln)["suppressed"] for ln in lines] == ["0", "4"]


def test_logfmt_quotes_only_what_needs_it() -> None:
    line = logfmt({"event": "x", "path": "a b", "error": 'it\'s "bad"\n', "n": "5", "e": ""})
    assert line == 'event=x path="a b" error="it\'s \\"bad\\"\\n" n=5 e=""'
    assert logfmt({"nbsp": "a\u00a0b", "k": b"\x00"}) == 'nbsp="a\\u00a0b" k="b\'\\\\x00\'"'


def test_under_systemd_each_line_carries_its_priority(tmp_path: Path) -> None:
    """``journalctl -p warning`` shows what the journal got with priority 4 or less:
    with ``JOURNAL_STREAM`` naming stderr, each line starts with ``<N>`` (another
    library's too); elsewhere not."""
    script = (
        "import logging; from shorelink.logs import configure_logging, get_logger\n"
        "configure_logging('debug')\n"
        "log = get_logger('t')\n"
        "log.error('e'); log.warning('w'); log.info('i'); log.debug('d')\n"
        "logging.getLogger('lib').critical('c')\n"
    )
    out = tmp_path / "stderr"
    with open(out, "wb") as f:
        st = os.fstat(f.fileno())
        env = dict(os.environ, JOURNAL_STREAM=f"{st.st_dev}:{st.st_ino}")
        subprocess.run([sys.executable, "-c", script], stderr=f, env=env, check=True, timeout=60)
    lines = out.read_text().splitlines()
    assert [ln[:3] for ln in lines] == ["<3>", "<4>", "<6>", "<7>", "<2>"]
    assert [read_logfmt(ln).get("event") for ln in lines] == ["e", "w", "i", "d", None]
    plain = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert plain.stderr.startswith("ts=")


def test_every_kafka_client_is_named_and_logs_through_the_process_logger(
    kafka: KafkaBroker, caplog: pytest.LogCaptureFixture
) -> None:
    """Review (ecosystem): no Kafka client had a ``client.id``, and librdkafka wrote its
    own raw lines to stderr (647 in the voyage's Spark log). Every client built from an
    endpoint carries the process's name, which the broker reports for a group's member,
    and its librdkafka log reaches the process's logger (warnings and worse)."""
    group = unique("named")
    name_clients(f"shorelink-test-{group}")
    try:
        ep = KafkaEndpoint.plaintext(kafka.bootstrap, timeout_s=10)
        ensure_topics(ep, [TopicSpec(group, 1)])
        consumer = Consumer(ep.client_config({"group.id": group}))
        try:
            consumer.subscribe([group])
            admin = AdminClient(ep.client_config())

            def member_named() -> bool:
                consumer.poll(0.2)
                (desc,) = admin.describe_consumer_groups([group]).values()
                try:
                    members = desc.result(10).members
                except KafkaException:  # the group's coordinator is still loading
                    return False
                return [m.client_id for m in members] == [f"shorelink-test-{group}"]

            eventually(member_named, 30, "the group's member, by its client.id")
        finally:
            consumer.close()
        with caplog.at_level(logging.WARNING, logger="librdkafka"):
            nowhere = Producer(KafkaEndpoint.plaintext(f"127.0.0.1:{free_port()}").client_config())
            eventually(
                lambda: (
                    nowhere.poll(0.2) is not None
                    and any(r.name == "librdkafka" for r in caplog.records)
                ),
                20,
                "librdkafka's connection error in the process's log",
            )
    finally:
        name_clients("shorelink")
