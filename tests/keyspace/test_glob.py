"""Glob patterns: Redis's corners, checked against a direct transcription of Redis 7's
recursive ``stringmatchlen`` (the oracle test checks KEYS against redis-server too),
and hostile patterns that must stay cheap."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pion.keyspace.glob import MAX_STAR_NESTING, matches_all, stringmatch


def _redis_reference(pattern: bytes, string: bytes) -> bool:
    """Redis 7's stringmatchlen_impl, line by line (recursive; small inputs only)."""
    skip = [False]

    def at(buf: bytes, i: int) -> int:
        return buf[i] if i < len(buf) else 0

    def signed(c: int) -> int:
        return c - 256 if c >= 128 else c

    def impl(p: int, s: int, nesting: int) -> bool:
        plen, slen = len(pattern) - p, len(string) - s
        if nesting > 1000:
            return False
        while plen and slen:
            c = pattern[p]
            if c == ord("*"):
                while plen and at(pattern, p + 1) == ord("*"):
                    p += 1
                    plen -= 1
                if plen == 1:
                    return True
                while slen:
                    if impl(p + 1, s, nesting + 1):
                        return True
                    if skip[0]:
                        return False
                    s += 1
                    slen -= 1
                skip[0] = True
                return False
            if c == ord("?"):
                s += 1
                slen -= 1
            elif c == ord("["):
                p += 1
                plen -= 1
                neg = at(pattern, p) == ord("^")
                if neg:
                    p += 1
                    plen -= 1
                match = False
                while True:
                    if at(pattern, p) == ord("\\") and plen >= 2:
                        p += 1
                        plen -= 1
                        if pattern[p] == string[s]:
                            match = True
                    elif at(pattern, p) == ord("]"):
                        break
                    elif plen == 0:
                        p -= 1
                        plen += 1
                        break
                    elif plen >= 3 and at(pattern, p + 1) == ord("-"):
                        lo, hi = signed(pattern[p]), signed(pattern[p + 2])
                        if lo > hi:
                            lo, hi = hi, lo
                        p += 2
                        plen -= 2
                        if lo <= signed(string[s]) <= hi:
                            match = True
                    elif pattern[p] == string[s]:
                        match = True
                    p += 1
                    plen -= 1
                if neg:
                    match = not match
                if not match:
                    return False
                s += 1
                slen -= 1
            else:
                if c == ord("\\") and plen >= 2:
                    p += 1
                    plen -= 1
                if pattern[p] != string[s]:
                    return False
                s += 1
                slen -= 1
            p += 1
            plen -= 1
            if slen == 0:
                while at(pattern, p) == ord("*"):
                    p += 1
                    plen -= 1
                break
        return plen == 0 and slen == 0

    return impl(0, 0, 0)


@pytest.mark.parametrize(
    ("pattern", "key", "want"),
    [
        (b"k*", b"k", True),
        (b"k*", b"key", True),
        (b"k?", b"k", False),
        (b"k?", b"kx", True),
        (b"[a-c]x", b"bx", True),
        (b"[c-a]x", b"bx", True),  # reversed range is swapped
        (b"[^a]", b"a", False),
        (b"[^a]", b"b", True),
        (b"[\\]]", b"]", True),
        (b"\\*", b"*", True),
        (b"\\*", b"x", False),
        (b"[abc", b"b", True),  # an unterminated class ends with the pattern
        (b"*", b"", False),  # the matcher itself never matches an empty key ...
        (b"", b"", True),
        (b"a\x00b", b"a\x00b", True),  # patterns and keys are binary
        (b"[\x80-\xff]", b"\x90", True),  # signed chars: -128..-1 contains -112
        (b"[a-\xff]", b"b", False),  # signed: 'a'(97)..-1 swaps to -1..97, 'b' is 98
    ],
)
def test_corners(pattern: bytes, key: bytes, want: bool) -> None:
    assert stringmatch(pattern, key) is want
    assert _redis_reference(pattern, key) is want


def test_lone_star_is_no_filter() -> None:
    # ... which is why KEYS * and SCAN MATCH * skip it and list the empty key too.
    assert matches_all(b"*")
    assert not matches_all(b"**")


@settings(max_examples=3000, derandomize=True)
@given(
    st.lists(st.sampled_from(b"*?[]^-\\ab\x00\xff"), max_size=10).map(bytes),  # mostly meta
    st.lists(st.sampled_from(b"ab-]\\\x00\xff*"), max_size=8).map(bytes),
)
def test_agrees_with_redis_transcription(pattern: bytes, key: bytes) -> None:
    assert stringmatch(pattern, key) == _redis_reference(pattern, key)


def test_nesting_limit_as_redis() -> None:
    deep = b"a*" * (MAX_STAR_NESTING + 1) + b"b"
    key = b"a" * (MAX_STAR_NESTING + 1) + b"b"
    assert not stringmatch(deep, key)  # Redis gives up past 1000 nested '*'
    shallow = b"a*" * 10 + b"b"
    assert stringmatch(shallow, key)


def test_hostile_patterns_stay_cheap() -> None:
    # Classic exponential-backtracking bait, and recursion-depth bait: both finish (no
    # recursion here, O(pattern x key) at worst) instead of hanging or overflowing.
    assert not stringmatch(b"a*" * 500 + b"b", b"a" * 5000)
    assert not stringmatch(b"*" * 100_000 + b"x", b"y" * 10_000)
    assert stringmatch(b"*" * 100_000, b"y" * 10_000)
