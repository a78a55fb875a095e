"""SORT's semantics (Redis 7.0's ``sort.c``) over a :class:`~pion.keyspace.Keyspace`:
the elements of a list, set or sorted set, weighted by themselves or by the keys a
``BY`` pattern names, compared numerically or as strings, and ``GET`` patterns
looked up per element. The command's parsing and reply are ``pion.commands.sort``'s.

Patterns are read as Redis reads them, as C strings: the first ``*`` (before any NUL
byte) is replaced by the element; ``->`` after it names a hash field (``key->field``);
``#`` alone is the element itself; a pattern without ``*`` names nothing.

Order. Numeric weights compare as doubles, equal ones by the elements' bytes, so the
order is total. ``ALPHA`` compares with ``strcoll`` in Redis; we compare the bytes up
to the first NUL, which is ``strcoll`` in the C and C.UTF-8 locales. The sort is
stable, as glibc's ``qsort`` (a merge sort) is, so elements that compare equal keep
the order they were read in.

:func:`store_list` is SORT ... STORE's write: the destination becomes a list of
exactly the results, in one LSTORE record.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from functools import cmp_to_key

from pion.keyspace.entries import KEY_OVERHEAD, LIST_ITEM_OVERHEAD
from pion.keyspace.mutations import ListReplace
from pion.keyspace.numbers import parse_sort_weight
from pion.keyspace.sortedset import SortedSet
from pion.keyspace.store import Keyspace

__all__ = ["by_pattern", "elements_of", "sort_elements", "store_list"]


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


def _cmp(a: bytes, b: bytes) -> int:
    return (a > b) - (a < b)


def sort_elements(
    ks: Keyspace,
    elements: list[bytes],
    *,
    alpha: bool,
    desc: bool,
    by: bytes | None,
    store: bool,
) -> list[bytes] | None:
    """``elements`` sorted as SORT does; None when a weight is not a number ("One or
    more scores can't be converted into double")."""
    weights: list[float] = []
    keys: list[bytes | None] = []
    failed = False
    for e in elements:
        value = by_pattern(ks, by, e) if by is not None else e
        if alpha:
            keys.append(value if by is not None else None)
            continue
        w = 0.0 if value is None else parse_sort_weight(value)
        if w is None:
            failed, w = True, 0.0
        weights.append(w)
    if failed:
        return None
    order = list(range(len(elements)))
    cmp: Callable[[int, int], int]
    if not alpha:

        def cmp(i: int, j: int) -> int:
            a, b = weights[i], weights[j]
            return (a > b) - (a < b) or _cmp(elements[i], elements[j])

    elif by is not None:

        def cmp(i: int, j: int) -> int:
            a, b = keys[i], keys[j]
            if a is None or b is None:
                return 0 if a is b else (-1 if a is None else 1)
            return _cmp(a, b) if store else _cmp(_cstr(a), _cstr(b))

    else:

        def cmp(i: int, j: int) -> int:
            a, b = elements[i], elements[j]
            return _cmp(a, b) if store else _cmp(_cstr(a), _cstr(b))

    def ordered(i: int, j: int) -> int:
        return -cmp(i, j) if desc else cmp(i, j)

    order.sort(key=cmp_to_key(ordered))
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
