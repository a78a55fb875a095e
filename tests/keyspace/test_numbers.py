"""Redis's number parsing: string2ll, string2d (ZADD), zslParseRange's strtod (BYSCORE
bounds) and strtoul (SCAN cursors). The oracle test covers them against redis-server;
these pin the corners where C and Python disagree."""

from __future__ import annotations

import math

import pytest

from pion.keyspace.numbers import parse_cursor, parse_int64, parse_range_bound, parse_score


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        (b"0", 0),
        (b"-1", -1),
        (b"9223372036854775807", 2**63 - 1),
        (b"-9223372036854775808", -(2**63)),
        (b"9223372036854775808", None),
        (b"-0", None),
        (b"+1", None),
        (b"01", None),
        (b" 1", None),
        (b"1 ", None),
        (b"", None),
        (b"-", None),
        (b"1_000", None),  # Python's int() would take it
        (b"\xd9\xa1", None),  # an Arabic-Indic digit: not ASCII
        (b"1" * 100, None),
    ],
)
def test_int64(raw: bytes, want: int | None) -> None:
    assert parse_int64(raw) == want


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        (b"1", 1.0),
        (b"-2.5", -2.5),
        (b".5", 0.5),
        (b"5.", 5.0),
        (b"1e3", 1000.0),
        (b"+1", 1.0),
        (b"0x10", 16.0),
        (b"0x1.8p1", 3.0),
        (b"inf", math.inf),
        (b"-Infinity", -math.inf),
        (b"1e-310", 1e-310),  # subnormal: ERANGE but not zero, so kept
        (b"nan", None),
        (b"1e400", None),  # overflow
        (b"1e-400", None),  # underflow to zero
        (b" 1", None),  # leading space
        (b"1 ", None),
        (b"", None),
        (b"1_0", None),  # Python float() takes it, strtod does not
        (b"0x", None),
        (b"1e", None),
        (b"1\x00", None),
    ],
)
def test_score(raw: bytes, want: float | None) -> None:
    assert parse_score(raw) == want


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        (b"1", (1.0, False)),
        (b"(1", (1.0, True)),
        (b"(", (0.0, True)),  # strtod of "" converts nothing and ends at NUL: Redis takes 0
        (b"", (0.0, False)),
        (b" 2", (2.0, False)),  # plain strtod skips leading space
        (b"1e400", (math.inf, False)),  # no ERANGE check here
        (b"-inf", (-math.inf, False)),
        (b"nan", None),
        (b"  ", None),
        (b"1x", None),
    ],
)
def test_range_bound(raw: bytes, want: tuple[float, bool] | None) -> None:
    assert parse_range_bound(raw) == want


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        (b"0", 0),
        (b"", 0),
        (b"+5", 5),
        (b"007", 7),
        (b"-1", 2**64 - 1),
        (b"-0", 0),
        (b"18446744073709551615", 2**64 - 1),
        (b"18446744073709551616", None),
        (b" 1", None),
        (b"1 ", None),
        (b"x", None),
        (b"+", None),
    ],
)
def test_cursor(raw: bytes, want: int | None) -> None:
    assert parse_cursor(raw) == want
