"""Hypothesis strategies the property tests share."""

from __future__ import annotations

import string

from hypothesis import strategies as st

LOWER = string.ascii_lowercase
DIGITS = string.digits


def words(first: str, rest: str, max_rest: int) -> st.SearchStrategy[str]:
    """The strings ``[first][rest]{0,max_rest}`` matches (each argument a set of
    characters): ``st.from_regex`` of that pattern, three times cheaper to draw (a third
    of a render test's time went into drawing names)."""
    return st.builds(
        lambda head, tail: head + tail,
        st.sampled_from(first),
        st.text(st.sampled_from(rest), max_size=max_rest),
    )


# -- the whole input space, for the boundaries' property tests (docs/boundaries.md) -----

#: characters a parser or a renderer trips on: controls, odd whitespace and line
#: breaks, zero-width and direction marks, a BOM, a lone surrogate, astral, quotes,
#: escapes, a terminal's escape, the delimiters of JSON, TOML, logfmt and HTTP
ODD_CHARS = (
    "\x00\x01\x07\x08\t\n\x0b\x0c\r\x1b\x7f\x85\xa0\u1680\u2000\u2007\u200b\u200d"
    "\u2028\u2029\u202e\u3000\ufeff\ufffd\ufffe\ud800\udfff\U0001f600\U0010ffff"
    "\"'\\=:,;#[]{}$%/ -.+_0123456789eE"
)


def any_text(max_size: int = 200) -> st.SearchStrategy[str]:
    """Text of every Unicode category, surrogates included, with the odd characters
    above drawn often."""
    every = st.characters(exclude_categories=())
    return st.text(st.one_of(every, st.sampled_from(ODD_CHARS)), max_size=max_size)


def any_bytes(max_size: int = 400) -> st.SearchStrategy[bytes]:
    """Arbitrary bytes, and the UTF-8 (surrogates: "surrogatepass") of any text."""
    return st.one_of(
        st.binary(max_size=max_size),
        any_text(max_size // 2).map(lambda t: t.encode("utf-8", "surrogatepass")),
    )


def mutated(sample: bytes, max_edits: int = 4) -> st.SearchStrategy[bytes]:
    """``sample`` (a valid input) cut, with bytes changed, inserted or removed: inputs
    that pass a parser's first checks and fail deep inside."""

    def edit(data: bytes, edits: list[tuple[int, int, int]]) -> bytes:
        b = bytearray(data)
        for kind, at, value in edits:
            i = at % (len(b) + 1)
            if kind == 0 and i < len(b):
                b[i] = value
            elif kind == 1:
                b.insert(i, value)
            elif kind == 2 and i < len(b):
                del b[i]
            elif kind == 3:
                del b[i:]
        return bytes(b)

    one = st.tuples(st.integers(0, 3), st.integers(0, 1 << 20), st.integers(0, 255))
    return st.builds(edit, st.just(sample), st.lists(one, max_size=max_edits))


#: numbers a parser may choke on: beyond int64, beyond a double, thousands of digits
HUGE_INTS = st.sampled_from([2**63, 2**64 + 1, -(2**63) - 1, 10**308, 10**400, 10**4200])


def json_values(max_leaves: int = 20) -> st.SearchStrategy[object]:
    """JSON documents with any text, huge and negative numbers, odd floats."""
    leaves = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        HUGE_INTS,
        st.floats(allow_nan=False, allow_infinity=False),
        any_text(40),
    )
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.dictionaries(any_text(12), inner, max_size=4)
        ),
        max_leaves=max_leaves,
    )


def deep_json(max_depth: int = 200_000) -> st.SearchStrategy[bytes]:
    """Nesting past any recursion limit, numbers past any float, the constants strict
    JSON refuses: ``[[[[...``, ``{"a":{"a":...``, ``1e999``, ``NaN``, ``-Infinity``."""
    depth = st.integers(1, max_depth)
    return st.one_of(
        depth.map(lambda n: b"[" * n + b"]" * n),
        depth.map(lambda n: b'{"a":' * n + b"1" + b"}" * n),
        depth.map(lambda n: b"[" * n),
        st.sampled_from([b"1e999", b"-1e999", b"NaN", b"Infinity", b"-Infinity", b"9" * 5000]),
    )


def header_text(max_size: int = 80) -> st.SearchStrategy[str]:
    """An HTTP header's value as a client can send it: visible ASCII and the bytes
    0xa0-0xff (a server reads those as Latin-1, or as UTF-8 with lone surrogates)."""
    byte = st.one_of(
        st.characters(min_codepoint=0x20, max_codepoint=0x7E),
        st.characters(min_codepoint=0xA0, max_codepoint=0xFF),
    )
    return st.text(byte, max_size=max_size)
