"""SORT's semantics (Redis 7.0's ``sort.c``) over a :class:`~pion.keyspace.Keyspace`:
the elements of a list, set or sorted set, weighted by themselves or by the keys a
``BY`` pattern names, compared numerically or as strings, and ``GET`` patterns
looked up per element. The command's parsing and reply are ``pion.commands.sort``'s.

Patterns are read as Redis reads them, as C strings: the first ``*`` (before any NUL
byte) is replaced by the element; ``->`` after it names a hash field (``key->field``);
``#`` alone is the element itself; a pattern without ``*`` names nothing.

Order. Numeric weights compare as doubles, equal ones by the elements' bytes, so the
order is total. ``ALPHA`` compares with ``strcoll`` in Redis; we compare the bytes up
to the first NUL, which is ``strcoll`` in the C and C.UTF-8 locales. A whole sort is
stable, as glibc's ``qsort`` (a merge sort) is, so elements that compare equal keep
the order they were read in; a partial one (BY with LIMIT) is Redis's own ``pqsort``,
ported step for step (:func:`partial_sort`), so ties land where Redis's do.

:func:`store_list` is SORT ... STORE's write: the destination becomes a list of
exactly the results, in one LSTORE record.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TypeVar

from pion.keyspace.entries import KEY_OVERHEAD, LIST_ITEM_OVERHEAD
from pion.keyspace.mutations import ListReplace
from pion.keyspace.numbers import parse_sort_weight
from pion.keyspace.sortedset import SortedSet
from pion.keyspace.store import Keyspace

__all__ = ["by_pattern", "elements_of", "partial_sort", "sort_elements", "store_list"]

T = TypeVar("T")


def _med3(v: list[T], a: int, b: int, c: int, cmp: Callable[[T, T], int]) -> int:
    if cmp(v[a], v[b]) < 0:
        return b if cmp(v[b], v[c]) < 0 else (c if cmp(v[a], v[c]) < 0 else a)
    return b if cmp(v[b], v[c]) > 0 else (a if cmp(v[a], v[c]) < 0 else c)


def _vecswap(v: list[T], a: int, b: int, n: int) -> None:
    for i in range(n):
        v[a + i], v[b + i] = v[b + i], v[a + i]


def partial_sort(v: list[T], cmp: Callable[[T, T], int], first: int, last: int) -> None:
    """Redis's ``pqsort`` (Bentley and McIlroy's quicksort, skipping the partitions
    that hold none of the positions ``first..last``): only those positions end up
    sorted. Not stable; ported step for step so that equal elements land where
    Redis's land (GEO* with COUNT, SORT BY with LIMIT)."""

    def outside(lo: int, n: int) -> bool:
        return (first < lo and last < lo) or (first >= lo + n and last >= lo + n)

    def run(lo: int, n: int) -> None:
        while True:
            if n < 7:  # insertion sort
                for pm in range(lo + 1, lo + n):
                    pl = pm
                    while pl > lo and cmp(v[pl - 1], v[pl]) > 0:
                        v[pl], v[pl - 1] = v[pl - 1], v[pl]
                        pl -= 1
                return
            pm = lo + n // 2
            if n > 7:
                pl, pn = lo, lo + n - 1
                if n > 40:
                    d = n // 8
                    pl = _med3(v, pl, pl + d, pl + 2 * d, cmp)
                    pm = _med3(v, pm - d, pm, pm + d, cmp)
                    pn = _med3(v, pn - 2 * d, pn - d, pn, cmp)
                pm = _med3(v, pl, pm, pn, cmp)
            v[lo], v[pm] = v[pm], v[lo]
            pa = pb = lo + 1
            pc = pd = lo + n - 1
            while True:
                while pb <= pc and (c := cmp(v[pb], v[lo])) <= 0:
                    if c == 0:
                        v[pa], v[pb] = v[pb], v[pa]
                        pa += 1
                    pb += 1
                while pb <= pc and (c := cmp(v[pc], v[lo])) >= 0:
                    if c == 0:
                        v[pc], v[pd] = v[pd], v[pc]
                        pd -= 1
                    pc -= 1
                if pb > pc:
                    break
                v[pb], v[pc] = v[pc], v[pb]
                pb += 1
                pc -= 1
            pn = lo + n
            r = min(pa - lo, pb - pa)
            _vecswap(v, lo, pb - r, r)
            r = min(pd - pc, pn - pd - 1)
            _vecswap(v, pb, pn - r, r)
            r = pb - pa
            if r > 1 and not outside(lo, r):
                run(lo, r)
            r = pd - pc
            if r <= 1:
                return
            lo, n = pn - r, r
            if outside(lo, n):
                return

    run(0, len(v))


def _cstr(raw: bytes) -> bytes:
    return raw.split(b"\0", 1)[0]


def by_pattern(ks: Keyspace, pattern: bytes, element: bytes) -> bytes | None:
    """``lookupKeyByPattern``: the string or hash field ``pattern`` names for
    ``element``, or None."""
    if _cstr(pattern) == b"#":
        return element
    text = _cstr(pattern)
    star = text.find(b"*")
    if star < 0:
        return None
    arrow = text.find(b"->", star + 1)
    field: bytes | None = None
    if arrow >= 0 and arrow + 2 < len(text):
        field = pattern[arrow + 2 :]
    postfix_end = arrow if field is not None else len(pattern)
    key = pattern[:star] + element + pattern[star + 1 : postfix_end]
    value = ks.lookup(key)
    if field is not None:
        return value.get(field) if isinstance(value, dict) else None
    return value if isinstance(value, bytes) else None


def sort_elements(
    ks: Keyspace,
    elements: list[bytes],
    *,
    alpha: bool,
    desc: bool,
    by: bytes | None,
    store: bool,
    span: tuple[int, int] | None = None,
) -> list[bytes] | None:
    """``elements`` sorted as SORT does; None when a weight is not a number ("One or
    more scores can't be converted into double"). With ``span`` (Redis: BY and a LIMIT
    that selects less than all) only the positions ``span[0]..span[1]`` are sorted,
    by :func:`partial_sort`, as Redis does."""
    # One sort key per element, ordered as Redis's sortCompare orders them: numeric
    # weights, equal ones by the elements' bytes; ALPHA BY, a missing key first.
    keys: list[tuple[float, bytes] | tuple[int, bytes] | bytes] = []
    failed = False
    for e in elements:
        value = by_pattern(ks, by, e) if by is not None else e
        if not alpha:
            w = 0.0 if value is None else parse_sort_weight(value)
            if w is None:  # Redis reads every weight (and key) before it answers so
                failed, w = True, 0.0
            keys.append((w, e))
        elif by is None:
            keys.append(e if store else _cstr(e))
        else:
            keys.append((0, b"") if value is None else (1, value if store else _cstr(value)))
    if failed:
        return None
    order = list(range(len(elements)))
    if span is None:
        # Stable, as glibc's qsort (a merge sort) is; reverse=True keeps equal
        # elements in their order too, as Redis's negated comparison does.
        order.sort(key=keys.__getitem__, reverse=desc)
    else:
        sign = -1 if desc else 1

        def cmp(i: int, j: int) -> int:
            a, b = keys[i], keys[j]
            return sign * ((a > b) - (a < b))  # type: ignore[operator]

        partial_sort(order, cmp, span[0], span[1])
    return [elements[i] for i in order]


def elements_of(value: deque[bytes] | set[bytes] | SortedSet) -> list[bytes]:
    """The elements as SORT reads them before sorting (a set in our order)."""
    if isinstance(value, SortedSet):
        return [m for _, m in value]
    return list(value)


def store_list(ks: Keyspace, key: bytes, items: list[bytes]) -> None:
    """``key`` becomes a list of exactly ``items`` (no deadline), whatever it held;
    no items deletes it. The caller announces the change."""
    d = ks.peek(key)
    if not items:
        if d is not None:
            ks.delete((key,))
        return
    size = len(key) + KEY_OVERHEAD + sum(len(v) + LIST_ITEM_OVERHEAD for v in items)
    ks._reserve(size - (d.size if d is not None else 0))
    ks._journal(ListReplace(key, tuple(items)))
    if key in ks:
        ks._drop(key)
    ks._apply_push(key, False, items)
