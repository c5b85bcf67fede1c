"""`shorelink audit --all-sites` is the proof that replication converged: every site
holds the same identities, each once. It must name the site and the seqs when one site
lacks what another holds or holds something twice, and say OK only when none does."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Producer

from local_stack.kafka import KafkaBroker
from shorelink.contract import Record, canonical_topic
from shorelink.identity import Identity
from shorelink.kafka.audit import audit_sites
from shorelink.kafka.endpoint import KafkaEndpoint
from shorelink.kafka.topics import TopicSpec, ensure_topics
from tests.helpers import unique

SITES = ("csg", "csy")


@pytest.fixture(scope="module")
def sites(kafka_sites: Callable[..., dict[str, KafkaBroker]]) -> dict[str, KafkaBroker]:
    return kafka_sites(*SITES)


def _write(bootstrap: str, stream: str, seqs: dict[str, list[int]], partitions: int) -> None:
    topic = canonical_topic(stream)
    ensure_topics(KafkaEndpoint.plaintext(bootstrap), [TopicSpec(topic, partitions=partitions)])
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for origin, ss in seqs.items():
        for s in ss:
            r = Record(Identity(origin, stream, s), f"c{s % 4}".encode(), b"{}", s, "csg", "t")
            p.produce(topic, key=r.key, value=r.value, headers=r.headers())
    assert p.flush(20) == 0


def _config(tmp_path: Path, sites: dict[str, KafkaBroker], streams: dict[str, list[str]]) -> Path:
    path = tmp_path / "sites.toml"
    path.write_text(
        "\n".join(
            f"[sites.{name}]\nstreams = {streams[name]!r}\n"
            f'[sites.{name}.kafka]\nbootstrap = "{b.bootstrap}"\n'
            for name, b in sites.items()
        ).replace("'", '"')
    )
    return path


def _audit(*args: str | Path) -> tuple[int, str, str]:
    res = subprocess.run(
        [sys.executable, "-m", "shorelink.cli", "audit", "--all-sites", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return res.returncode, res.stdout, res.stderr


def test_converged_sites_pass_the_audit(sites: dict[str, KafkaBroker], tmp_path: Path) -> None:
    stream, only_csg = unique("aud"), unique("aud")
    held = {"bigblue": list(range(1, 301)), "redstar": list(range(1, 51))}
    _write(sites["csg"].bootstrap, stream, held, partitions=3)
    _write(sites["csy"].bootstrap, stream, {o: s[::-1] for o, s in held.items()}, partitions=1)
    # a stream only csg carries: csy lacking it is not a difference
    _write(sites["csg"].bootstrap, only_csg, {"bigblue": [1, 2]}, partitions=1)
    cfg = _config(tmp_path, sites, {"csg": [stream, only_csg], "csy": [stream]})
    code, out, err = _audit("--config", cfg, "--json")
    assert code == 0, (out, err)
    report = json.loads(out)
    assert report["ok"] is True and report["problems"] == []
    rows = {(r["site"], r["stream"]): r for r in report["results"]}
    assert set(rows) == {("csg", stream), ("csy", stream), ("csg", only_csg)}
    for site in SITES:
        r = rows[(site, stream)]
        assert (r["records"], r["identities"], r["duplicates"], r["missing"]) == (350, 350, 0, 0)
    code, out, _ = _audit("--config", cfg)
    assert code == 0 and "OK: every site holds the same identities" in out
    # one site of the file, as the single-site audit
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "shorelink.cli",
            "audit",
            "--site",
            "csy",
            "--config",
            cfg,
            "--stream",
            stream,
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert [s["identities"] for s in json.loads(res.stdout)["sources"]] == [300, 50]


def test_a_missing_identity_and_a_duplicate_are_named_with_their_site(
    sites: dict[str, KafkaBroker], tmp_path: Path
) -> None:
    stream = unique("aud")
    _write(sites["csg"].bootstrap, stream, {"bigblue": [1, 2, 3, 4, 6, 7], "redstar": [1]}, 2)
    _write(sites["csy"].bootstrap, stream, {"bigblue": list(range(1, 8)), "redstar": [1, 1]}, 2)
    cfg = _config(tmp_path, sites, {"csg": [stream], "csy": [stream]})
    code, out, err = _audit("--config", cfg, "--json")
    assert code == 1, (out, err)
    report = json.loads(out)
    assert report["ok"] is False
    assert report["problems"] == [
        f"missing at csg: bigblue/{stream} seqs 5",
        f"duplicates at csy: redstar/{stream} seqs 1 (1 extra records)",
    ]
    rows = {r["site"]: r for r in report["results"]}
    assert rows["csg"]["missing_ranges"] == {"bigblue": "5"} and rows["csg"]["duplicates"] == 0
    assert rows["csy"]["duplicated_ranges"] == {"redstar": "1"} and rows["csy"]["missing"] == 0
    assert (rows["csy"]["records"], rows["csy"]["identities"]) == (9, 8)
    code, out, _ = _audit("--config", cfg)
    assert code == 1
    assert f"missing at csg: bigblue/{stream} seqs 5" in out and "NOT OK" in out


def test_the_audit_across_sites_says_why_it_cannot_run(tmp_path: Path) -> None:
    cfg = tmp_path / "sites.toml"
    cfg.write_text('[sites.csg]\nstreams = ["nav"]\n[sites.csg.kafka]\nbootstrap = "127.0.0.1:1"\n')
    res = subprocess.run(
        [sys.executable, "-m", "shorelink.cli", "audit", "--all-sites", "--config", cfg],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2 and "site csg: Kafka at 127.0.0.1:1 did not answer" in res.stderr
    cfg.write_text('[sites.csg]\nstreams = ["nav"]\n')
    code, _, err = _audit("--config", cfg)
    assert code == 2 and "sites.csg.kafka.bootstrap: is required" in err
    code, _, err = _audit()
    assert code == 2 and "--all-sites takes the sites from --config" in err


def test_audit_sites_holds_ranges_not_records(sites: dict[str, KafkaBroker]) -> None:
    """Memory: 20,000 in-order identities are one range per site."""
    stream = unique("aud")
    _write(sites["csg"].bootstrap, stream, {"bigblue": list(range(1, 20_001))}, 1)
    report = audit_sites({"csg": (sites["csg"].endpoint, [stream])})
    (r,) = report.results
    assert report.ok and len(r.sources["bigblue"].held) == 1 and r.identities == 20_000
