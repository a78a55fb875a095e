"""Set commands' semantics (Redis's ``t_set.c``) as operations on a
:class:`~pion.keyspace.Keyspace`: SADD, SREM, SPOP, SRANDMEMBER, SMOVE, the algebra
(SINTER, SUNION, SDIFF and their STORE forms, SINTERCARD) and SSCAN.

Each write validates, asks the memory budget for what it adds, journals one record
(SPOP as the SREM of what it popped, SMOVE as one record) and applies it through
``listset.py``'s primitives.

Order and encoding. Redis 7.0 (the oracle) keeps a set of at most 512 members that
are all integers in an ``intset``, sorted by value, and every other set in a
``hashtable`` (7.2 adds ``listpack`` for small sets of strings). Pion's sets are
Python sets; for a set Redis would hold as an intset, replies list the members in
Redis's order (ascending value) and SSCAN returns them all at once with cursor 0, as
Redis does; a hashtable's order is unspecified in both. A larger set is walked
``COUNT`` members per call over a sorted copy, by position.
"""

from __future__ import annotations

from collections.abc import Iterable

from pion.keyspace.entries import KEY_OVERHEAD, SET_MEMBER_OVERHEAD
from pion.keyspace.glob import stringmatch
from pion.keyspace.hashes import random_picks
from pion.keyspace.mutations import SetAdd, SetMove, SetRemove, SetReplace
from pion.keyspace.numbers import parse_int64
from pion.keyspace.store import Keyspace

__all__ = [
    "INTSET_ENTRIES",
    "algebra",
    "encoding",
    "ordered",
    "sadd",
    "smove",
    "spop",
    "srandmember",
    "srem",
    "sscan",
    "store",
]

# Redis 7.0's set-max-intset-entries.
INTSET_ENTRIES = 512


def _int_of(m: bytes) -> int | None:
    # Redis's string2ll: what an intset can hold (no leading zeros, sign or spaces
    # beyond what the canonical form has).
    v = parse_int64(m)
    return v if v is not None and str(v).encode() == m else None


def encoding(s: set[bytes]) -> str:
    if len(s) <= INTSET_ENTRIES and all(_int_of(m) is not None for m in s):
        return "intset"
    return "hashtable"


def ordered(s: Iterable[bytes]) -> list[bytes]:
    """``s``'s members in Redis's order when it would be an intset (ascending value),
    else as they come."""
    members = list(s)
    if len(members) <= INTSET_ENTRIES:
        ints = [_int_of(m) for m in members]
        if all(i is not None for i in ints):
            return [m for _, m in sorted(zip(ints, members, strict=True))]
    return members


def sadd(ks: Keyspace, key: bytes, members: list[bytes]) -> int:
    s = ks.set_at(key, read=False)
    new = [m for m in dict.fromkeys(members) if s is None or m not in s]
    if not new:
        return 0
    grow = sum(len(m) for m in new) + len(new) * SET_MEMBER_OVERHEAD
    ks._reserve(grow + (0 if s is not None else len(key) + KEY_OVERHEAD))
    ks._journal(SetAdd(key, tuple(new)))
    return ks._apply_sadd(key, new)


def srem(ks: Keyspace, key: bytes, members: Iterable[bytes]) -> int:
    s = ks.set_at(key, read=False)
    if s is None:
        return 0
    gone = tuple(m for m in dict.fromkeys(members) if m in s)
    if gone:
        ks._journal(SetRemove(key, gone))
        ks._apply_srem(key, gone)
    return len(gone)


def spop(ks: Keyspace, key: bytes, count: int | None) -> list[bytes] | None:
    """SPOP: None for no set; else the popped members (one without ``count``)."""
    s = ks.set_at(key, read=False)
    if s is None:
        return None
    if count == 0:
        return []
    n = 1 if count is None else count
    members = list(s)
    picked = members if n >= len(members) else ks.rng.sample(members, n)
    ks._journal(SetRemove(key, tuple(picked)))
    ks._apply_srem(key, picked)
    return picked


def srandmember(ks: Keyspace, key: bytes, count: int) -> list[bytes]:
    s = ks.set_at(key)
    if s is None or count == 0:
        return []
    members = list(s)
    if count >= len(members):
        return ordered(members)
    return [members[i] for i in random_picks(ks.rng, len(members), count)]


def smove(ks: Keyspace, source: bytes, destination: bytes, member: bytes) -> bool:
    s = ks.set_at(source, read=False)
    if s is None:
        return False
    d = ks.set_at(destination, read=False)  # WRONGTYPE checked before anything moves
    if member not in s:
        return False
    if source == destination:
        return True
    if d is None or member not in d:
        ks._reserve(
            len(member) + SET_MEMBER_OVERHEAD + (0 if d else len(destination) + KEY_OVERHEAD)
        )
    ks._journal(SetMove(source, destination, member))
    ks._apply_smove(source, destination, member)
    return True


def algebra(ks: Keyspace, op: str, keys: Iterable[bytes], limit: int = 0) -> set[bytes]:
    """SINTER/SUNION/SDIFF over ``keys`` (a missing key is an empty set). Every key's
    type is checked first, as Redis does; ``limit`` stops an intersection early."""
    sets = [ks.set_at(k) for k in keys]
    if op == "inter":
        if any(s is None for s in sets):
            return set()
        present = sorted((s for s in sets if s is not None), key=len)
        if not limit:
            return present[0].intersection(*present[1:])  # C speed: one step, as Redis
        out: set[bytes] = set()
        for m in present[0]:
            if all(m in other for other in present[1:]):
                out.add(m)
                if limit and len(out) >= limit:
                    break
        return out
    if op == "union":
        return set().union(*(s for s in sets if s is not None))
    first = set(sets[0] or ())
    for s in sets[1:]:
        if s:
            first -= s
    return first


def store(ks: Keyspace, key: bytes, members: set[bytes]) -> int:
    """The STORE forms: ``key`` becomes a set of exactly ``members`` (no deadline),
    whatever it held; none deletes it. Returns the set's size."""
    d = ks.peek(key)
    if not members:
        if d is not None:
            ks.delete((key,))
        return 0
    size = len(key) + KEY_OVERHEAD + sum(len(m) + SET_MEMBER_OVERHEAD for m in members)
    ks._reserve(size - (d.size if d is not None else 0))
    items = tuple(members)
    ks._journal(SetReplace(key, items))
    if key in ks:
        ks._drop(key)
    ks._apply_sadd(key, items)
    return len(items)


def sscan(
    ks: Keyspace, key: bytes, cursor: int, count: int, pattern: bytes | None
) -> tuple[int, list[bytes]]:
    """One SSCAN step (see the module docstring): (next cursor, members)."""
    s = ks.set_at(key, read=False)
    if s is None:
        return 0, []
    if encoding(s) == "intset":
        members = ordered(s)
        nxt = 0
    else:
        every = sorted(s)
        members = every[cursor : cursor + count]
        nxt = cursor + len(members) if cursor + len(members) < len(every) else 0
    if pattern is not None:
        members = [m for m in members if stringmatch(pattern, m)]
    return nxt, members
