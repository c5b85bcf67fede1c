"""Container numbers are the key of every container's history at every site: a number
with a wrong check digit is a box that cannot be found again."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from fleet_sim.iso6346 import check_digit, checksum, container_number, is_valid

owners = st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZ", min_size=3, max_size=3)
serials = st.integers(0, 999_999)


def test_the_standards_example_is_valid() -> None:
    """CSQU3054383, the example of ISO 6346 (its check digit 3 worked by hand there)."""
    assert check_digit("CSQU305438") == 3
    assert is_valid("CSQU3054383") and not is_valid("CSQU3054384")


@given(owners, serials, st.sampled_from("UJZ"))
def test_every_generated_number_is_valid_and_round_trips(owner: str, serial: int, cat: str) -> None:
    assume(checksum(f"{owner}{cat}{serial:06d}") != 10)
    number = container_number(owner, serial, cat)
    assert len(number) == 11 and number.startswith(owner + cat)
    assert int(number[4:10]) == serial
    assert is_valid(number)


@given(owners, serials, st.integers(4, 9), st.integers(1, 9))
def test_a_changed_serial_digit_is_caught(owner: str, serial: int, pos: int, delta: int) -> None:
    """No weight 2**i is 0 modulo 11, so one wrong digit always changes the remainder;
    it slips through only where the standard's 10-written-as-0 makes two remainders
    share a digit (which is why issued numbers avoid remainder 10)."""
    assume(checksum(f"{owner}U{serial:06d}") != 10)
    number = container_number(owner, serial)
    wrong = number[:pos] + str((int(number[pos]) + delta) % 10) + number[pos + 1 :]
    assert checksum(wrong[:10]) != checksum(number[:10])
    assert is_valid(wrong) == (checksum(wrong[:10]) == 10 and number[10] == "0")


@given(st.text(max_size=14))
def test_anything_else_is_not_a_container_number(text: str) -> None:
    if is_valid(text):
        assert check_digit(text[:10]) == int(text[10])


def test_a_serial_with_remainder_ten_is_refused() -> None:
    serial = next(s for s in range(1000) if checksum(f"ABCU{s:06d}") == 10)
    with pytest.raises(ValueError, match="remainder 10"):
        container_number("ABC", serial)


def test_bad_parts_are_named() -> None:
    with pytest.raises(ValueError, match="owner code"):
        container_number("ab1", 1)
    with pytest.raises(ValueError, match="serial"):
        container_number("ABC", 1_000_000)
    with pytest.raises(ValueError, match="category"):
        container_number("ABC", 1, "X")
