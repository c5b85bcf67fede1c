"""A ship installs from one file with no network (issue 43, item 4): ``shorelink-edge
bundle`` writes a tar that install.sh installs in a clean Debian 12 container started
with ``--network none``, and the agent runs from it and stores what a Mosquitto in that
container's own network delivers. A ship is offline, shorelink is not on PyPI: a bundle
that reaches for the network, or misses one wheel, fails at sea where nobody can fix it.

systemd does not run in the container: the unit is checked by ``systemd-analyze verify``
against the container's file system, the sysusers.d file by ``systemd-sysusers --root``;
install.sh makes the user with ``useradd`` there, as on a ship without systemd."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import tomli_w

from edge_agent.bundle import platform_tags
from local_stack.tools import mosquitto_bin
from tests.debian_base import ULIMITS, DebianBase, podman
from tests.edge_agent.helpers import edge_config_doc
from tests.helpers import build_version, eventually

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "edge"
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
VENV = "/opt/shorelink/.venv"
#: what only the shore needs: never in a ship's bundle
SHORE_ONLY = ("confluent_kafka", "pyspark", "pyarrow", "delta_spark")


def bundle_cmd(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """``shorelink-edge bundle ARGS`` as an operator runs it from the checkout."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, "-m", "edge_agent.cli", "bundle", *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
        env=env,
    )


@pytest.fixture(scope="module")
def ship_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bundle for this machine, built once per module from this checkout (about 20 s:
    the wheel's build and pip's downloads, from pip's cache after the first time)."""
    out = tmp_path_factory.mktemp("bundle") / "ship.tar"
    res = bundle_cmd("--out", str(out))
    assert res.returncode == 0, res.stderr
    assert f"wrote {out}" in res.stdout and "sha256 " in res.stdout, res.stdout
    return out


def unpacked(bundle: Path, into: Path) -> Path:
    with tarfile.open(bundle) as tar:
        tar.extractall(into, filter="tar")
    (top,) = into.iterdir()
    return top


@pytest.fixture
def ship(debian_base: DebianBase, ship_bundle: Path) -> Iterator[tuple[str, list[str]]]:
    """A clean Debian 12 container with no network (only its own loopback), the bundle
    mounted read-only at /ship.tar; removed after the test."""
    name = f"sl-ship-{uuid.uuid4().hex[:10]}"
    rt = debian_base.runtime
    started = podman(
        *rt, "run", "-d", "--name", name, "--network", "none", *ULIMITS,
        "-v", f"{ship_bundle}:/ship.tar:ro", debian_base.image, "sleep", "600",
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    try:
        yield name, rt
    finally:
        podman(*rt, "rm", "-f", "-t", "0", name)


def run_in(
    ship: tuple[str, list[str]], *argv: str, user: str = "root", timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    name, rt = ship
    return podman(*rt, "exec", "-u", user, name, *argv, timeout=timeout)


def sh(
    ship: tuple[str, list[str]], script: str, *, user: str = "root", timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return run_in(ship, "sh", "-c", script, user=user, timeout=timeout)


def test_platform_tags_take_every_manylinux_wheel_the_ships_glibc_runs() -> None:
    """A Debian 12 ARM ship (glibc 2.36) runs wheels tagged for any glibc from 2.17 on,
    under the old alias manylinux2014 too, and none for a newer glibc."""
    tags = platform_tags("aarch64", "2.36")
    assert tags[0] == "manylinux_2_36_aarch64" and tags[-1] == "manylinux2014_aarch64"
    assert "manylinux_2_28_aarch64" in tags and "manylinux_2_37_aarch64" not in tags
    assert "manylinux1_x86_64" in platform_tags("x86_64", "2.31")


def test_the_bundle_lists_every_file_with_its_hash_and_pins_only_the_ships_packages(
    ship_bundle: Path, tmp_path: Path
) -> None:
    """SHA256SUMS names every file of the bundle with its hash (install.sh checks it),
    requirements.txt pins every wheel carried and nothing of the shore is among them,
    the unit, sample and sysusers file are deploy/edge's, and the sysusers file makes
    the user and group the unit runs as."""
    top = unpacked(ship_bundle, tmp_path / "x")
    files = sorted(p.relative_to(top).as_posix() for p in top.rglob("*") if p.is_file())
    sums = dict(reversed(ln.split("  ", 1)) for ln in (top / "SHA256SUMS").read_text().splitlines())
    assert sorted(sums) == [f for f in files if f != "SHA256SUMS"]
    for name, digest in sums.items():
        assert hashlib.sha256((top / name).read_bytes()).hexdigest() == digest, name
    wheels = sorted(p.name for p in (top / "wheels").iterdir())
    pins = [ln for ln in (top / "requirements.txt").read_text().splitlines() if "==" in ln]
    assert len(pins) == len(wheels) and any(p.startswith("shorelink[edge]==") for p in pins)
    assert not [w for w in wheels if w.split("-")[0].lower() in SHORE_ONLY], wheels
    assert all(w.endswith(".whl") for w in wheels)
    for name in ("shorelink-edge.service", "edge.toml", "shorelink.sysusers", "install.sh"):
        assert (top / name).read_bytes() == (DEPLOY / name).read_bytes(), name
    assert os.access(top / "install.sh", os.X_OK)
    env = dict(ln.split("=", 1) for ln in (top / "bundle.env").read_text().splitlines())
    # the checkout's version (from git), though the wheel is built from a copy without it
    assert env["version"] == build_version(ROOT)
    assert env["machine"] == os.uname().machine
    assert env["python"] == f"{sys.version_info[0]}.{sys.version_info[1]}"
    # the sysusers file, read by systemd's own tool, makes the unit's User= and Group=
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    for f in ("passwd", "group", "shadow", "gshadow"):
        (root / "etc" / f).touch()
    made = subprocess.run(
        ["systemd-sysusers", f"--root={root}", str(top / "shorelink.sysusers")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    unit = (top / "shorelink-edge.service").read_text()
    assert "\nUser=shorelink\n" in unit and "\nGroup=shorelink\n" in unit
    assert (root / "etc" / "passwd").read_text().startswith("shorelink:x:")
    assert (root / "etc" / "group").read_text().startswith("shorelink:x:")


@pytest.mark.timeout(600)
def test_a_ship_installs_the_bundle_with_no_network_and_the_agent_stores_what_it_receives(
    ship: tuple[str, list[str]], tmp_path: Path
) -> None:
    """In a clean Debian 12 with no network: install.sh verifies and installs; the
        agent says the bundle's version, accepts the sample config, and run as the user the
        sysusers file made, stores what sensors publish to a Mosquitto on the container's own
        loopback (the host's Mosquitto binary entered into the container's network
        namespace). The unit as installed passes systemd-analyze verify with the binary
    installed in the container."""
    name, rt = ship
    installed = sh(ship, "cd /srv && tar -xf /ship.tar && ./shorelink-edge-*/install.sh")
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert "bundle verified" in installed.stdout
    version = sh(ship, "sed -n 's/^version=//p' /srv/shorelink-edge-*/bundle.env").stdout.strip()
    said = sh(ship, f"{VENV}/bin/shorelink-edge --version")
    assert said.stdout.split()[-1] == version, said.stdout + said.stderr
    # the sample, as installed, is a config the agent accepts
    checked = sh(ship, f"{VENV}/bin/shorelink-edge check-config /etc/shorelink/edge.toml")
    assert checked.returncode == 0 and checked.stdout.startswith("ok: ship="), checked.stderr
    who = sh(ship, "stat -c '%U:%G %a' /etc/shorelink /etc/shorelink/edge.toml /var/lib/shorelink")
    assert who.stdout.split("\n")[:3] == [
        "root:shorelink 750",
        "root:shorelink 640",
        "shorelink:shorelink 700",
    ]
    # nothing of the shore was installed
    probe = f"import importlib.util as u; print([n for n in {SHORE_ONLY!r} if u.find_spec(n)])"
    assert run_in(ship, f"{VENV}/bin/python", "-c", probe).stdout.strip() == "[]"

    pid = podman(*rt, "inspect", "--format", "{{.State.Pid}}", name).stdout.strip()
    if SYSTEMD_ANALYZE:
        # the unit as installed, its ExecStart the binary installed in the container
        # (systemd is not in it: verify runs here, on the container's files)
        mount = podman(*rt, "mount", name)
        assert mount.returncode == 0, mount.stderr
        rootfs = Path(mount.stdout.strip())
        text = (rootfs / "etc/systemd/system/shorelink-edge.service").read_text()
        assert f"ExecStart={VENV}/bin/shorelink-edge run " in text
        unit = tmp_path / "shorelink-edge.service"
        unit.write_text(text.replace(f"{VENV}/", f"{rootfs}{VENV}/"))
        verified = subprocess.run(
            [SYSTEMD_ANALYZE, "verify", "--man=no", str(unit)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert verified.returncode == 0 and not verified.stderr.strip(), verified.stderr

    conf = tmp_path / "mosquitto.conf"
    conf.write_text("listener 1883 127.0.0.1\nallow_anonymous true\npersistence false\n")
    cfg = edge_config_doc(
        Path("/var/lib/shorelink"), SimpleNamespace(port=1883), client_id="edge-bundle"
    )
    (tmp_path / "edge.toml").write_text(tomli_w.dumps(cfg))
    assert (
        podman(
            *rt, "cp", str(tmp_path / "edge.toml"), f"{name}:/etc/shorelink/test.toml"
        ).returncode
        == 0
    )
    sh(ship, "chown root:shorelink /etc/shorelink/test.toml && chmod 0640 /etc/shorelink/test.toml")
    broker = subprocess.Popen(
        ["nsenter", f"--net=/proc/{pid}/ns/net", mosquitto_bin(), "-c", str(conf)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        agent = (
            f"{VENV}/bin/shorelink-edge run --config /etc/shorelink/test.toml "
            "> /var/lib/shorelink/agent.log 2>&1 &"
        )
        assert sh(ship, agent, user="shorelink").returncode == 0
        publish = """
import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="sensor")
c.connect("127.0.0.1", 1883)
c.loop_start()
for i in range(5):
    c.publish("bigblue/d1/containers/C%d/env" % i, b'{"ts": 1700000000}', qos=1).wait_for_publish(10)
c.disconnect()
"""

        def stored() -> int:
            status = sh(
                ship,
                f"{VENV}/bin/shorelink-edge status --config /etc/shorelink/test.toml --json",
                user="shorelink",
            )
            if status.returncode != 0:
                return -1
            return int(json.loads(status.stdout)["streams"]["containers"]["records"])

        def subscribed() -> bool:
            # logged once its subscription is sent: the broker queues for it from then on
            log = sh(ship, "cat /var/lib/shorelink/agent.log", user="shorelink").stdout
            assert "Traceback" not in log, log
            return "mqtt_connected" in log

        eventually(subscribed, within=60, what="the agent up on its Mosquitto")
        sent = run_in(ship, f"{VENV}/bin/python", "-c", publish)
        assert sent.returncode == 0, sent.stderr
        eventually(lambda: stored() == 5, within=60, what="5 records stored by the agent")
        # run again (as with the next bundle): the operator's edge.toml is kept
        assert sh(ship, "echo '# edited on board' >> /etc/shorelink/edge.toml").returncode == 0
        again = sh(ship, "cd /srv && ./shorelink-edge-*/install.sh")
        assert again.returncode == 0, again.stdout + again.stderr
        kept = sh(ship, "tail -n 1 /etc/shorelink/edge.toml").stdout
        assert (
            kept == "# edited on board\n" and "wrote /etc/shorelink/edge.toml" not in again.stdout
        )
    finally:
        broker.send_signal(signal.SIGTERM)
        try:
            broker.wait(10)
        except subprocess.TimeoutExpired:
            broker.kill()
            broker.wait(10)


def test_a_bundle_rebuilt_offline_from_its_own_wheels_is_the_same_file(
    ship_bundle: Path, tmp_path: Path
) -> None:
    """A bundle is reproducible (names sorted, owner root, time 0) and can be made with
    no index at all (``--no-index --find-links``, as from a mirror's folder): made again
    from its own wheels, it is the same file byte for byte, so its sha256 can be
    checked against the one the builder printed."""
    top = unpacked(ship_bundle, tmp_path / "x")
    (wheel,) = (top / "wheels").glob("shorelink-*.whl")
    again = tmp_path / "again.tar"
    res = bundle_cmd(
        "--out", str(again), "--wheel", str(wheel), "--no-index",
        "--find-links", str(top / "wheels"),
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert again.read_bytes() == ship_bundle.read_bytes()


def test_a_dependency_without_a_wheel_for_the_ships_glibc_is_named_and_nothing_written(
    ship_bundle: Path, tmp_path: Path
) -> None:
    """A ship has no compiler: a bundle for a glibc older than a wheel needs (one below what
    the bundled cryptography wheel needs) names each package
    it lacks a wheel for, and writes nothing."""
    top = unpacked(ship_bundle, tmp_path / "x")
    (wheel,) = (top / "wheels").glob("shorelink-*.whl")
    (crypto,) = (top / "wheels").glob("cryptography-*.whl")
    # one glibc below what the bundled cryptography wheel needs (manylinux2014: 2.17)
    needs = re.search(r"manylinux_2_(\d+)", crypto.name)
    glibc = f"2.{(int(needs.group(1)) if needs else 17) - 1}"
    out = tmp_path / "old.tar"
    res = bundle_cmd(
        "--out", str(out), "--glibc", glibc, "--wheel", str(wheel), "--no-index",
        "--find-links", str(top / "wheels"),
    )  # fmt: skip
    assert res.returncode == 2, res.stdout + res.stderr
    version = crypto.name.split("-")[1]
    assert "no wheel for x86_64, Python" in res.stderr and f"glibc {glibc}" in res.stderr
    named = res.stderr.split(" of: ")[1].split(" (a ship")[0]
    assert named == f"cryptography=={version}", res.stderr
    assert not out.exists() and not list(tmp_path.glob(".old.tar*"))


@pytest.mark.timeout(300)
def test_install_refuses_a_bundle_with_a_changed_or_an_added_file(
    ship: tuple[str, list[str]],
) -> None:
    """A bundle damaged on its way aboard (one byte of a wheel changed) or with a file
    slipped in is refused before anything is installed: install.sh names the file and
    /opt/shorelink is never made."""
    unpack = "mkdir -p /srv/a /srv/b && tar -xf /ship.tar -C /srv/a && tar -xf /ship.tar -C /srv/b"
    assert sh(ship, unpack).returncode == 0
    flip = (
        "cd /srv/a/shorelink-edge-* && w=$(ls wheels/paho_mqtt-*.whl) && "
        "printf 'X' | dd of=$w bs=1 seek=100 conv=notrunc 2>/dev/null && echo $w"
    )
    changed = sh(ship, flip).stdout.strip()
    refused = sh(ship, "/srv/a/shorelink-edge-*/install.sh")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert f"{changed}: FAILED" in refused.stdout + refused.stderr
    assert "differs from SHA256SUMS" in refused.stderr
    assert sh(ship, "cd /srv/b/shorelink-edge-* && cp /bin/true wheels/extra.whl").returncode == 0
    refused = sh(ship, "/srv/b/shorelink-edge-*/install.sh")
    assert refused.returncode == 1 and "not in SHA256SUMS: wheels/extra.whl" in refused.stderr
    assert sh(ship, "test -e /opt/shorelink").returncode == 1
