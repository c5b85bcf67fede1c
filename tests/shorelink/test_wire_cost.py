"""What decoding a batch costs is bounded by what it is charged for
(the security review's finding H1): bodies of a few hundred bytes built so that
a naive decoder makes one Python int per body byte (the review's batch made the old
decoder allocate 57 times the bytes it was charged) stay within
:func:`shorelink.wire.decode_cost_bound`, measured with tracemalloc (deterministic),
whether the decoder takes them or refuses them."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shorelink.wire import Limits, WireError, decode_columns, decode_cost_bound, peek_header
from tests import wire_bombs
from tests.bounds import Bound, measured

#: what decoding may take of the CPU: per MiB of body and decompressed bytes
CPU = Bound(0, cpu_s=2.0, cpu_per_mib=16)
#: a lower cap than the default, so that a refused body's bound is not mostly the cap
LIMITS = Limits(max_decompressed_bytes=8 * 1024 * 1024)


def _peak_within_bound(data: bytes, limits: Limits = LIMITS) -> tuple[str, int, int]:
    """Decode ``data``, measured (tests/bounds.py): (outcome, peak bytes, the bound).
    Its process time is held to :data:`CPU` too (generous: it catches the quadratic)."""
    h = peek_header(data, limits)
    with measured() as m:
        try:
            _, (keys, _, topics, payloads) = decode_columns(data, limits)
            decoded = sum(map(len, payloads)) + sum(map(len, keys)) + sum(map(len, topics))
            outcome = "ok"
        except WireError as exc:
            decoded, outcome = limits.max_decompressed_bytes, exc.reason
    bound = decode_cost_bound(len(data), h.raw_len, h.count, decoded)
    assert m.peak <= bound, f"{outcome}: peak {m.peak} > bound {bound} ({h.raw_len} raw bytes)"
    cpu = CPU.cpu(len(data) + h.raw_len)
    assert m.cpu_s <= cpu, f"{outcome}: {m.cpu_s:.2f} s > {cpu:.2f} s ({h.raw_len} raw bytes)"
    return outcome, m.peak, bound


def test_the_reviews_batch_costs_what_it_is_charged() -> None:
    """The review's shape at a fifth of its records: 40 number slots of width-1 zeros
    predicted by the record's time. The old decoder peaked at about 26 MiB here."""
    raw = wire_bombs.number_columns(40, 10_000)
    data = wire_bombs.batch(raw, 10_000)
    assert len(data) < 1024 and len(raw) > 400_000
    outcome, peak, _ = _peak_within_bound(data)
    assert outcome == "ok" and peak < 16 * 1024 * 1024


def test_a_template_with_more_slots_than_any_payload_has_is_refused_before_reading() -> None:
    raw = wire_bombs.segment_lengths(4_000_000)
    outcome, peak, _ = _peak_within_bound(wire_bombs.batch(raw, 1))
    assert outcome == "malformed" and peak < len(raw) + 1024 * 1024


def test_numbers_beyond_the_cap_are_refused_within_the_bound() -> None:
    """Every number renders as a 13-digit time: more than the cap; refused after
    rendering at most the cap, never holding every column at once."""
    raw = wire_bombs.number_columns(120, 6_000)
    outcome, _, _ = _peak_within_bound(wire_bombs.batch(raw, 6_000))
    assert outcome == "decompressed_too_large"


_COLUMNS = st.tuples(
    st.integers(0, 2),  # fixed, repr, text
    st.integers(0, 1),  # plain, runs
    st.sampled_from([1, 2, 4, 8]),
    st.sampled_from([b"", b"\x01", b"\x7f", b"\xff", b"\x80\x00", b"\x01\x00\x00\x00"]),
)


@settings(max_examples=15, deadline=20_000, suppress_health_check=[HealthCheck.too_slow])
@given(
    count=st.integers(1, 1500),
    n_keys=st.integers(1, 40),
    slots=st.lists(st.integers(0, 120), min_size=1, max_size=4),
    columns=st.lists(_COLUMNS, min_size=1, max_size=4),
)
def test_any_templated_body_costs_at_most_its_bound(
    count: int, n_keys: int, slots: list[int], columns: list[tuple[int, int, int, bytes]]
) -> None:
    raw = wire_bombs.templated(count, n_keys, slots, columns)
    _peak_within_bound(wire_bombs.batch(raw, count))


def test_one_record_per_template_of_many_slots_is_refused_before_a_column_is_opened() -> None:
    """Review (security N1): one record per template, 180 number (or text) slots each:
    the decoder opened every template's columns before rendering one, 801 MiB and 11 s
    for a 727-byte body that was then accepted. A body's templates open at most
    ``count + _MAX_SLOTS`` columns: this one is refused, within its bound."""
    for raw, count in (
        (wire_bombs.many_templates(15_000, 180), 15_000),
        (wire_bombs.many_templates(5_000, 180, text=True), 5_000),
    ):
        outcome, peak, _ = _peak_within_bound(wire_bombs.batch(raw, count), Limits())
        assert outcome == "malformed" and peak < len(raw) + 8 * 1024 * 1024


@settings(max_examples=12, deadline=20_000, suppress_health_check=[HealthCheck.too_slow])
@given(
    n_templates=st.integers(1, 4000),
    slots=st.integers(0, 200),
    text=st.booleans(),
    head=st.integers(0, 4096),
)
def test_many_templates_cost_at_most_their_bound(
    n_templates: int, slots: int, text: bool, head: int
) -> None:
    """Templates of one record each up to the column cap and past it (the first one
    ``head`` slots wide, the rest ``slots``): a template's columns are opened, rendered
    and dropped before the next one's, so what is held follows the records decoded."""
    raw = wire_bombs.many_templates(n_templates, slots, text=text, first=head)
    _peak_within_bound(wire_bombs.batch(raw, n_templates))
