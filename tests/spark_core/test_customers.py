"""Who owns a container when: owner codes, leases at the reading's own time, and a
customers file that changes while the merge runs (no Spark needed here)."""

from __future__ import annotations

import datetime as dt
import os
import time
import tomllib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleet_sim.iso6346 import container_number
from shorelink.errors import ConfigError
from spark_core.config import parse_config
from spark_core.customers import (
    Customer,
    Customers,
    Lease,
    Ownership,
    parse_customers,
    retroactive_leases,
)
from spark_core.topics import customer_ownership, site_specs

DAY = 86_400_000
T0 = 1_780_000_000_000  # 2026-05-28T...Z, in ms


def _customers(leases: list[dict[str, object]] | None = None) -> dict[str, object]:
    return {
        "customers": {
            "acme": {"owner_codes": ["ACMU"]},
            "globex": {"owner_codes": ["GLBU", "GLBZ"], "leases": leases or []},
        }
    }


def _iso(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms / 1000))


@given(ts=st.integers(T0 - 100 * DAY, T0 + 100 * DAY), serial=st.integers(0, 9_999_999))
def test_the_owner_code_decides_without_a_lease(ts: int, serial: int) -> None:
    c = parse_customers(_customers())
    assert c.owner(f"ACMU{serial:07d}", ts) == "acme"
    assert c.owner(f"GLBZ{serial:07d}", ts) == "globex"
    assert c.owner(f"BBLU{serial:07d}", ts) is None  # Big Blue's own
    assert c.owner("position", ts) is None  # a key that is no container


@given(
    start=st.integers(0, 50),
    days=st.integers(1, 30),
    ts=st.integers(T0 - 10 * DAY, T0 + 100 * DAY),
)
def test_a_lease_moves_a_container_at_its_time_and_not_before(
    start: int, days: int, ts: int
) -> None:
    """A reading belongs to whoever owns its container at the reading's own time."""
    lo, hi = T0 + start * DAY, T0 + (start + days) * DAY
    leased = {"container": "ACMU1234562", "from": _iso(lo), "to": _iso(hi)}
    c = parse_customers(_customers([leased]))
    expected = "globex" if lo <= ts < hi else "acme"
    assert c.owner("ACMU1234562", ts) == expected
    assert c.owner("ACMU7654321", ts) == "acme"  # the owner's other containers stay


def test_an_open_ended_lease_and_toml_datetimes() -> None:
    since = dt.datetime(2026, 6, 1, tzinfo=dt.UTC)
    c = parse_customers(_customers([{"container": "BBLU0000015", "from": since}]))
    at = int(since.timestamp() * 1000)
    assert c.owner("BBLU0000015", at - 1) is None
    assert c.owner("BBLU0000015", at) == "globex"
    assert c.owner("BBLU0000015", at + 3650 * DAY) == "globex"


@pytest.mark.parametrize(
    ("data", "field", "why"),
    [
        (
            {"customers": {"a": {"owner_codes": ["ACMU"]}, "b": {"owner_codes": ["ACMU"]}}},
            "customers.b.owner_codes",
            "already a's",
        ),
        ({"customers": {"a": {"owner_codes": ["ACM1"]}}}, "customers.a.owner_codes", "3 letters"),
        ({"customers": {"A b": {}}}, "customers.A b", "customer"),
        ({"customers": {"a": {"owner": ["ACMU"]}}}, "customers.a.owner", "unknown key"),
        (
            {"customers": {"a": {"leases": [{"container": "ACMU1", "from": "2026-01-01T00:00Z"}]}}},
            "customers.a.leases[0].container",
            "container id",
        ),
        (
            {
                "customers": {
                    "a": {"leases": [{"container": "ACMU1234562", "from": "2026-01-01T00:00"}]}
                }
            },
            "customers.a.leases[0].from",
            "time zone",
        ),
        (
            {
                "customers": {
                    "a": {
                        "leases": [
                            {
                                "container": "ACMU1234562",
                                "from": "2026-02-01T00:00Z",
                                "to": "2026-01-01T00:00Z",
                            }
                        ]
                    }
                }
            },
            "customers.a.leases[0].to",
            "after from",
        ),
        (
            {
                "customers": {
                    "a": {"leases": [{"container": "ACMU1234562", "from": "2026-01-01T00:00Z"}]},
                    "b": {
                        "leases": [
                            {
                                "container": "ACMU1234562",
                                "from": "2025-06-01T00:00Z",
                                "to": "2026-01-02T00:00Z",
                            }
                        ]
                    },
                }
            },
            "customers.b.leases[0].from",
            "leased to a",
        ),
    ],
)
def test_a_bad_customers_file_names_its_key(data: dict[str, object], field: str, why: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_customers(data)
    assert info.value.field == field and why in str(info.value)


def test_a_changed_file_is_read_again_and_a_broken_one_keeps_the_last_good(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SL_TEST_ACME_PASSWORD", "pw")
    path = tmp_path / "customers.toml"
    path.write_text(
        '[customers.acme]\nowner_codes = ["ACMU"]\npassword = "${SL_TEST_ACME_PASSWORD}"\n'
    )
    own = Ownership(path)
    assert own.customers.owner("GLBU0000001", T0) is None
    assert own.customers.passwords()["acme"].value == "pw"
    assert not own.refresh(), "nothing changed"
    path.write_text(path.read_text() + '[customers.globex]\nowner_codes = ["GLBU"]\n')
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 1_000_000_000))
    assert own.refresh() and own.reloads == 1
    assert own.customers.owner("GLBU0000001", T0) == "globex"
    path.write_text('[customers.acme]\nowner_codes = ["ACMU", "ACMU"]\n')  # hostile
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 2_000_000_000))
    assert not own.refresh() and own.reload_errors == 1
    assert own.customers.owner("GLBU0000001", T0) == "globex", "the last good ownership"


def test_the_sample_customers_file_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    sample = Path(__file__).resolve().parents[2] / "deploy" / "spark" / "customers.toml"
    for name in ("SL_CUSTOMER_MAERSKLINE_PASSWORD", "SL_CUSTOMER_COOLFRUIT_PASSWORD"):
        monkeypatch.setenv(name, "pw")
    own = Ownership(sample)
    assert set(own.customers.customers) == {"maerskline", "coolfruit"}


@given(
    start=st.datetimes(timezones=st.timezones()) | st.datetimes(),
    end=st.datetimes(timezones=st.timezones()) | st.datetimes() | st.none(),
    as_text=st.booleans(),
)
def test_any_lease_period_reads_or_is_an_error_naming_its_key(
    start: dt.datetime, end: dt.datetime | None, as_text: bool
) -> None:
    """The file is an operator's, edited while the merge runs: whatever dates it holds,
    the reload gets a ConfigError naming the key (and keeps the last good), never
    another exception."""
    lease: dict[str, object] = {"container": "ACMU1234562", "from": start}
    if end is not None:
        lease["to"] = end
    if as_text:
        lease = {k: v.isoformat() if isinstance(v, dt.datetime) else v for k, v in lease.items()}
    try:
        c = parse_customers({"customers": {"a": {"leases": [lease]}}})
    except ConfigError as exc:
        assert exc.field.startswith("customers.a.leases[0].")
    else:
        (parsed,) = c.customers["a"].leases
        assert start.tzinfo is not None
        assert c.owner("ACMU1234562", parsed.from_ms) == "a"
        assert c.owner("ACMU1234562", parsed.from_ms - 1) is None


def test_an_unreadable_file_keeps_the_last_good(tmp_path: Path) -> None:
    """Not UTF-8, gone, a directory: counted and logged like a bad key, the merge goes on
    with the ownership it had."""
    path = tmp_path / "customers.toml"
    path.write_text('[customers.acme]\nowner_codes = ["ACMU"]\n')
    own = Ownership(path)
    path.write_bytes(b'[customers.acme]\nowner_codes = ["\xff\xfe"]\n')
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 1_000_000_000))
    assert not own.refresh() and own.reload_errors == 1
    path.unlink()
    assert not own.refresh() and own.reload_errors == 2
    path.mkdir()
    assert not own.refresh() and own.reload_errors == 3
    assert own.customers.owner("ACMU0000011", T0) == "acme", "the last good ownership"
    path.rmdir()
    path.write_text('[customers.acme]\nowner_codes = ["ACMZ"]\n')
    assert own.refresh() and own.reloads == 1, "a good file again"
    assert own.customers.owner("ACMU0000011", T0) is None
    assert own.customers.owner("ACMZ0000011", T0) == "acme"


@pytest.mark.parametrize("keep", [True, False])
def test_customer_topics_are_kept_only_where_the_site_says(tmp_path: Path, keep: bool) -> None:
    """HQ only: a port with ``customer_topics = false`` neither creates nor writes them."""
    (tmp_path / "customers.toml").write_text('[customers.acme]\nowner_codes = ["ACMU"]\n')
    cfg = parse_config(
        tomllib.loads(
            'customers_file = "customers.toml"\n'
            "[sites.port]\n"
            'streams = ["containers", "nav"]\n'
            'checkpoint_dir = "/tmp/x"\n'
            'table_dir = "/tmp/x"\n'
            f"customer_topics = {str(keep).lower()}\n"
            "[sites.port.kafka]\n"
            'bootstrap = "localhost:9092"\n'
        ),
        base=tmp_path,
    )
    site = cfg.site("port")
    own = customer_ownership(site, cfg)
    topics = {s.name for s in site_specs(cfg, site)}
    if keep:
        assert own is not None and own.path == tmp_path / "customers.toml"
        assert {t for t in topics if t.startswith("sl.customer.")} == {
            "sl.customer.acme.containers"  # the site has no alerts stream
        }
    else:
        assert own is None
        assert not any(t.startswith("sl.customer.") for t in topics)


@given(
    owner=st.text("ABCDEFGHIJKLMNOPQRSTUVWXYZ", min_size=3, max_size=3),
    category=st.sampled_from("UJZ"),
    serial=st.integers(0, 999_999),
    wrong=st.integers(1, 9),
)
def test_a_leased_container_needs_its_check_digit(
    owner: str, category: str, serial: int, wrong: int
) -> None:
    """A typo in a lease would leave the container's readings with its code's owner:
    the check digit catches it (ISO 6346, as fleet_sim numbers containers)."""
    try:
        number = container_number(owner, serial, category)
    except ValueError:
        return  # a serial ISO 6346 gives no number for (remainder 10)
    c = parse_customers(_customers([{"container": number, "from": _iso(T0)}]))
    assert c.owner(number, T0) == "globex"
    typo = number[:10] + str((int(number[10]) + wrong) % 10)
    with pytest.raises(ConfigError) as info:
        parse_customers(_customers([{"container": typo, "from": _iso(T0)}]))
    assert info.value.field == "customers.globex.leases[0].container"
    assert f"check digit is {number[10]}" in str(info.value)


def iso(t: dt.datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def _leases_file(leases: list[tuple[str, str, str | None]]) -> str:
    out = []
    for name in sorted({n for n, _f, _t in leases}):
        out.append(f"[customers.{name}]\n")
        for n, frm, to in leases:
            if n == name:
                out.append(
                    f'[[customers.{name}.leases]]\ncontainer = "ACMU1234562"\nfrom = {frm}\n'
                )
                if to is not None:
                    out.append(f"to = {to}\n")
    return "".join(out)


def test_a_lease_reaching_into_the_past_is_refused_on_reload_and_one_from_now_on_is_taken(
    tmp_path: Path,
) -> None:
    """Review finding 15: a lease added at one site with a ``from`` in the past would give
    readings this site merged already to the old owner and later ones to the new, and
    another site reading the file at another time splits them elsewhere. The reload is
    refused, counted and logged (the last good ownership stays); a lease starting after
    now, or ending an open one after now, is taken."""
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    past, future = now - dt.timedelta(days=1), now + dt.timedelta(hours=1)
    path = tmp_path / "customers.toml"
    path.write_text(_leases_file([("acme", iso(now - dt.timedelta(days=30)), None)]))
    own = Ownership(path)

    def rewrite(leases: list[tuple[str, str, str | None]], n: int) -> bool:
        path.write_text(_leases_file(leases))
        os.utime(path, ns=(time.time_ns(), time.time_ns() + n * 1_000_000_000))
        return own.refresh()

    base = ("acme", iso(now - dt.timedelta(days=30)), None)
    yesterday = int(past.timestamp() * 1000)
    # globex leases it from yesterday: refused
    ended = ("acme", base[1], iso(past))
    assert not rewrite([ended, ("globex", iso(past), None)], 1)
    assert own.reload_errors == 1 and own.customers.owner("ACMU1234562", yesterday) == "acme"
    # from an hour from now on: taken, and the past stays acme's
    assert rewrite([("acme", base[1], iso(future)), ("globex", iso(future), None)], 2)
    assert own.customers.owner("ACMU1234562", yesterday) == "acme"
    assert own.customers.owner("ACMU1234562", int(future.timestamp() * 1000)) == "globex"
    # removing acme's lease, which began a month ago: refused
    assert not rewrite([("globex", iso(future), None)], 3)
    assert own.reload_errors == 2


@st.composite
def lease_sets(draw: st.DrawFn) -> list[tuple[str, Lease]]:
    out: list[tuple[str, Lease]] = []
    for _ in range(draw(st.integers(0, 3))):
        start = draw(st.integers(0, 100))
        end = draw(st.none() | st.integers(start + 1, 120))
        lease = Lease("ACMU1234562", start, end)
        if not any(lease.overlaps(other) for _n, other in out):
            out.append((draw(st.sampled_from(["a", "b"])), lease))
    return out


def _leased(leases: list[tuple[str, Lease]]) -> Customers:
    by: dict[str, list[Lease]] = {}
    for name, lease in leases:
        by.setdefault(name, []).append(lease)
    return Customers({n: Customer(n, leases=tuple(ls)) for n, ls in by.items()})


@given(lease_sets(), lease_sets(), st.integers(0, 130))
def test_a_change_not_refused_never_gives_the_past_another_owner(
    old: list[tuple[str, Lease]], new: list[tuple[str, Lease]], now: int
) -> None:
    """Whatever the change of leases, when retroactive_leases lets it through every
    instant before now has the same owner before and after; a change of owner of some
    past instant is always refused."""
    a, b = _leased(old), _leased(new)
    same_past = all(a.owner("ACMU1234562", t) == b.owner("ACMU1234562", t) for t in range(0, now))
    if not retroactive_leases(a, b, now):
        assert same_past
