"""Redis's glob-style patterns (``KEYS``, ``SCAN ... MATCH``), byte for byte.

The semantics are those of Redis 7's ``stringmatchlen`` (``util.c`` in Redis's
source), including its corners, so a pattern selects the same keys here as on
redis-server (an oracle test checks this):

* ``*`` any run of bytes, ``?`` exactly one byte, ``\\x`` the byte ``x``;
* ``[abc]``, ``[^abc]``, ``[a-z]`` (a reversed range ``[z-a]`` is swapped; bytes compare
  as C's signed ``char``, so a range never spans the 0x7f/0x80 boundary the way an
  unsigned reading would), ``\\`` escapes inside a class; an unterminated ``[`` class
  ends at the end of the pattern;
* a pattern never matches an empty key unless it is empty (Redis's matcher returns
  early on an empty string); ``KEYS *`` and ``SCAN`` without MATCH list every key,
  empty ones included, because callers test for a lone ``*`` first (:func:`matches_all`);
* after 1000 nested ``*`` groups Redis stops matching (its guard against abusive
  patterns): so do we.

Redis recurses at every ``*``; once a ``*`` has tried every suffix and failed, it
abandons the whole match. So only the innermost ``*`` ever backtracks, which makes
this iterative version (classic two-pointer backtracking) exact, with no recursion for
a hostile pattern to exhaust, and O(len(pattern) * len(key)) in the worst case.
"""

from __future__ import annotations

__all__ = ["MAX_STAR_NESTING", "matches_all", "stringmatch"]

# Redis's stringmatchlen_impl: "if (nesting > 1000) return 0".
MAX_STAR_NESTING = 1000

_STAR = 0x2A
_QUESTION = 0x3F
_OPEN = 0x5B
_CLOSE = 0x5D
_CARET = 0x5E
_BACKSLASH = 0x5C
_DASH = 0x2D


def _signed(byte: int) -> int:
    """A byte as x86-64 C compares a ``char``."""
    return byte - 256 if byte >= 0x80 else byte


def matches_all(pattern: bytes) -> bool:
    """True for the lone ``*`` that Redis's callers treat as "no filter"."""
    return pattern == b"*"


def _class_end(pattern: bytes, p: int, c: int) -> tuple[bool, int]:
    """Match byte ``c`` against the class whose ``[`` is at ``p``: (matched, index of
    the class's last byte)."""
    plen = len(pattern)
    p += 1
    negate = p < plen and pattern[p] == _CARET
    if negate:
        p += 1
    match = False
    while True:
        cur = pattern[p] if p < plen else 0
        left = plen - p
        if cur == _BACKSLASH and left >= 2:
            p += 1
            if pattern[p] == c:
                match = True
        elif cur == _CLOSE:
            break
        elif left == 0:
            p -= 1  # unterminated: the class ends with the pattern
            break
        elif left >= 3 and pattern[p + 1] == _DASH:
            start, end = _signed(cur), _signed(pattern[p + 2])
            if start > end:
                start, end = end, start
            p += 2
            if start <= _signed(c) <= end:
                match = True
        elif cur == c:
            match = True
        p += 1
    return match != negate, p


def stringmatch(pattern: bytes, key: bytes) -> bool:
    """Whether ``key`` matches ``pattern`` as Redis's ``stringmatchlen`` decides."""
    plen, slen = len(pattern), len(key)
    p = s = 0
    # The innermost '*' and the key position its current attempt started from.
    star_p = star_s = -1
    nesting = 0
    while True:
        if p < plen and s < slen:
            op = pattern[p]
            if op == _STAR:
                while p + 1 < plen and pattern[p + 1] == _STAR:
                    p += 1
                if p + 1 == plen:
                    return True
                nesting += 1
                if nesting > MAX_STAR_NESTING:
                    return False
                star_p, star_s = p, s
                p += 1
                continue
            ok = True
            if op == _QUESTION:
                pass
            elif op == _OPEN:
                ok, p = _class_end(pattern, p, key[s])
            else:
                if op == _BACKSLASH and plen - p >= 2:
                    p += 1
                ok = pattern[p] == key[s]
            if ok:
                p += 1
                s += 1
                if s == slen:
                    while p < plen and pattern[p] == _STAR:
                        p += 1
                    if p == plen:
                        return True
                    # fall through to the failure handling below
                else:
                    continue
        elif p == plen and s == slen:
            return True
        # This attempt failed: the innermost '*' takes one more byte, or all is lost.
        if star_p < 0:
            return False
        star_s += 1
        if star_s >= slen:
            return False
        p, s = star_p + 1, star_s
