"""ISO 6346 container numbers: a 3-letter owner code, a category letter (``U`` freight
container, ``J`` detachable equipment, ``Z`` trailer or chassis), a 6-digit serial and a
check digit, e.g. ``CSQU3054383``.

The check digit: each of the first ten characters gets a value (digits their own; letters
A=10 upwards, skipping 11, 22 and 33, the multiples of 11), weighted by 2**position; the
sum modulo 11, and a remainder of 10 written as 0.
"""

from __future__ import annotations

import string

__all__ = ["check_digit", "checksum", "container_number", "is_valid"]

CATEGORIES = "UJZ"


def _letter_values() -> dict[str, int]:
    values: dict[str, int] = {}
    n = 10
    for letter in string.ascii_uppercase:
        if n % 11 == 0:
            n += 1
        values[letter] = n
        n += 1
    return values


_VALUES = {**_letter_values(), **{d: int(d) for d in string.digits}}


def _check_prefix(prefix: str) -> None:
    if len(prefix) != 10:
        raise ValueError(f"an ISO 6346 prefix has 10 characters, not {len(prefix)}: {prefix!r}")
    owner, category, serial = prefix[:3], prefix[3], prefix[4:]
    if not (owner.isascii() and owner.isalpha() and owner.isupper()):
        raise ValueError(f"owner code must be 3 capital letters: {owner!r}")
    if category not in CATEGORIES:
        raise ValueError(f"category must be one of {CATEGORIES}: {category!r}")
    if not (serial.isascii() and serial.isdigit()):
        raise ValueError(f"serial must be 6 digits: {serial!r}")


def checksum(prefix10: str) -> int:
    """The weighted sum of owner code + category + serial (10 characters), modulo 11."""
    _check_prefix(prefix10)
    return sum(_VALUES[c] * (1 << i) for i, c in enumerate(prefix10)) % 11


def check_digit(prefix10: str) -> int:
    """The check digit of owner code + category + serial (10 characters)."""
    return checksum(prefix10) % 10


def container_number(owner: str, serial: int, category: str = "U") -> str:
    """``owner`` (3 letters), ``serial`` (0..999999) -> the 11-character number."""
    if not 0 <= serial <= 999_999:
        raise ValueError(f"serial must be 0..999999: {serial}")
    prefix = f"{owner}{category}{serial:06d}"
    if checksum(prefix) == 10:
        raise ValueError(f"{prefix}: remainder 10 (check digit 0 twice over); take another serial")
    return prefix + str(check_digit(prefix))


def is_valid(number: str) -> bool:
    """True for a well-formed number whose check digit is right."""
    if len(number) != 11 or not number[10].isdigit():
        return False
    try:
        return check_digit(number[:10]) == int(number[10])
    except ValueError:
        return False
