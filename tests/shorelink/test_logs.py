"""Log lines as operators' tools read them: logfmt and JSON that give back every value a
call site wrote (spaces, quotes, newlines, any text), and the journal's priorities."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
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
from shorelink.logs import _JsonFormatter, _LogfmtFormatter, fields, logfmt
from tests.helpers import eventually, unique

_keys = st.from_regex(r"[a-z_][a-z0-9_]{0,10}", fullmatch=True).filter(
    lambda k: k not in ("ts", "level", "logger", "msg", "exc")
)
#: a value a call site writes with %s: one word, no quote at its start
_words = st.text(st.characters(blacklist_categories=("Z", "C")), min_size=1, max_size=20).filter(
    lambda w: w[0] not in "'\"" and not any(c.isspace() for c in w)
)


def _record(msg: str, *args: object, level: int = logging.INFO) -> logging.LogRecord:
    return logging.LogRecord("shorelink.test", level, __file__, 1, msg, args, None)


@given(st.dictionaries(_keys, st.text(max_size=40), max_size=6), _words)
def test_every_value_comes_back_from_json_and_logfmt(values: dict[str, str], word: str) -> None:
    """Review (ecosystem): ``--log-json`` cut every value at its first space
    (``"error": "'every"``) and key=value kept Python's quotes. A value written with
    ``%r`` comes back exactly, whatever it holds; one written with ``%s`` too."""
    msg = " ".join(["event=test", "plain=%s", *(f"{k}=%r" for k in values)])
    record = _record(msg, word, *values.values())
    want = {"event": "test", "plain": word, **values}
    as_json = json.loads(_JsonFormatter().format(record))
    assert {k: as_json[k] for k in want} == want
    assert as_json["level"] == "info" and as_json["logger"] == "shorelink.test"
    line = _LogfmtFormatter().format(record)
    assert "\n" not in line
    back = fields(line)
    assert {k: back[k] for k in want} == want


@settings(max_examples=400, deadline=2000)
@given(st.text(max_size=200))
def test_any_message_is_read_back_in_one_pass(message: str) -> None:
    """Review (security N2): ``fields`` looped for ever on whitespace other than a space
    (a tab, U+00A0, U+2003: categories Z and C, which the alphabet above leaves out),
    inside the logging lock. Any text at all: it returns, and the line it makes is one
    line."""
    out = fields(message)
    assert all(isinstance(v, str) for v in out.values())
    line = _LogfmtFormatter().format(_record("event=x v=%s", message))
    assert "\n" not in line and "\r" not in line


_odd_text = st.text(
    st.characters(codec="utf-8", categories=("Zs", "Zl", "Zp", "Cc", "Cf", "Co", "Lu", "Nd", "Po")),
    max_size=60,
)


@settings(max_examples=300, deadline=2000)
@given(_odd_text, _odd_text)
def test_no_value_a_call_site_logs_rewrites_the_lines_own_fields(topic: str, other: str) -> None:
    """Review (security N8): a topic holding `` level=debug ts=2001 event=all_good`` was
    written as a debug line of event ``all_good``. Whatever a value holds, logged with
    ``%s`` or ``%r``, the line keeps its level, time, logger and event."""
    for msg in ("event=warned topic=%s other=%r", "event=warned topic=%r other=%s"):
        record = _record(msg, topic + " level=debug ts=2001 logger=x event=all_good", other)
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        for line in (_LogfmtFormatter().format(record), _JsonFormatter().format(record)):
            back = json.loads(line) if line.startswith("{") else fields(line)
            assert back["level"] == "warning" and back["event"] == "warned"
            assert back["logger"] == "shorelink.test" and back["ts"].startswith("20")
            assert not back["ts"].startswith("2001")


def test_logfmt_quotes_only_what_needs_it() -> None:
    line = logfmt({"event": "x", "path": "a b", "error": 'it\'s "bad"\n', "n": "5", "e": ""})
    assert line == 'event=x path="a b" error="it\'s \\"bad\\"\\n" n=5 e=""'
    assert fields("free words event=y k=v") == {"event": "y", "k": "v", "msg": "free words"}


def test_under_systemd_each_line_carries_its_priority(tmp_path: Path) -> None:
    """``journalctl -p warning`` shows what the journal got with priority 4 or less:
    with ``JOURNAL_STREAM`` naming stderr, each line starts with ``<N>``; elsewhere not."""
    script = (
        "import logging; from shorelink.logs import configure_logging\n"
        "configure_logging('debug')\n"
        "log = logging.getLogger('t')\n"
        "log.error('event=e'); log.warning('event=w'); log.info('event=i'); log.debug('event=d')\n"
    )
    out = tmp_path / "stderr"
    with open(out, "wb") as f:
        st = os.fstat(f.fileno())
        env = dict(os.environ, JOURNAL_STREAM=f"{st.st_dev}:{st.st_ino}")
        subprocess.run([sys.executable, "-c", script], stderr=f, env=env, check=True, timeout=60)
    lines = out.read_text().splitlines()
    assert [ln[:3] for ln in lines] == ["<3>", "<4>", "<6>", "<7>"]
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
