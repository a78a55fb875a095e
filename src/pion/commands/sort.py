"""SORT and SORT_RO: the elements of a list, set or sorted set, sorted numerically or
(ALPHA) as strings, ASC/DESC, LIMIT, weighted BY a pattern (a pattern without ``*``,
such as ``nosort``, keeps the stored order), with GET patterns (``#``, ``key->field``)
and, for SORT, STORE into a list. Argument order, replies and errors are Redis 7.0's
``sortCommandGeneric``; the sorting and the lookups are ``pion.keyspace.sort``'s.

Where Redis's answer follows its hash tables' order (a set's elements unsorted with
``BY nosort``, except for STORE and scripts, which sort them ALPHA as Redis's do;
elements that compare equal under ALPHA BY, in a set or sorted set), ours follows our
own order. Cluster and ACL restrictions of BY and GET do not apply.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from pion.commands.args import parse_int
from pion.commands.state import Command, Context
from pion.commands.zsets import keyword
from pion.errors import PionError, WrongTypeError
from pion.keyspace.sort import by_pattern, elements_of, sort_elements, store_list
from pion.keyspace.sortedset import SortedSet
from pion.notify import GENERIC, LIST, notify
from pion.resp.reply import Reply

__all__ = ["COMMANDS"]


@dataclass
class _Options:
    desc: bool = False
    alpha: bool = False
    start: int = 0
    count: int = -1
    store: bytes | None = None
    by: bytes | None = None
    dontsort: bool = False
    gets: list[bytes] = field(default_factory=list)


def _options(args: Sequence[bytes], readonly: bool) -> _Options:
    o = _Options()
    j = 1
    while j < len(args):
        word = keyword(args[j])
        left = len(args) - j - 1
        if word in ("ASC", "DESC"):
            o.desc = word == "DESC"
        elif word == "ALPHA":
            o.alpha = True
        elif word == "LIMIT" and left >= 2:
            o.start, o.count = parse_int(args[j + 1]), parse_int(args[j + 2])
            j += 2
        elif word == "STORE" and left >= 1 and not readonly:
            o.store = args[j + 1]
            j += 1
        elif word == "BY" and left >= 1:
            o.by = args[j + 1]
            # A pattern naming no key ("nosort"): keep the stored order. As in
            # Redis, a later BY with a "*" does not undo it.
            if b"*" not in args[j + 1].split(b"\0", 1)[0]:
                o.dontsort = True
            j += 1
        elif word == "GET" and left >= 1:
            o.gets.append(args[j + 1])
            j += 1
        else:
            raise PionError("syntax error")
        j += 1
    return o


def _sort(ctx: Context, args: Sequence[bytes], readonly: bool) -> Reply:
    o = _options(args, readonly)
    ks = ctx.state.keyspace
    value = ks.lookup(args[0])
    if value is not None and not isinstance(value, (deque, set, SortedSet)):
        raise WrongTypeError()
    elements = [] if value is None else elements_of(value)
    scripts = ctx.state.scripts
    in_script = scripts is not None and scripts.running
    if o.dontsort and isinstance(value, set) and (o.store is not None or in_script):
        # A set's order is its hash table's: what is stored, or handed to a script,
        # is sorted instead (Redis's rule, so replicas and replays agree).
        o.dontsort, o.alpha, o.by = False, True, None
    n = len(elements)
    start = max(o.start, 0)
    end = n - 1 if o.count < 0 else start + o.count - 1
    if start >= n:
        start, end = n - 1, n - 2
    end = min(end, n - 1)
    if o.dontsort:
        if o.desc and not isinstance(value, set):
            elements.reverse()
    else:
        # Redis sorts only the LIMIT's positions when a BY pattern weighs them.
        span = (start, end) if o.by is not None and (start != 0 or end != n - 1) else None
        picked = sort_elements(
            ks, elements, alpha=o.alpha, desc=o.desc, by=o.by, store=o.store is not None, span=span
        )
        if picked is None:
            raise PionError("One or more scores can't be converted into double")
        elements = picked
    chosen = elements[start : end + 1] if end >= start else []
    if o.store is None:
        if not o.gets:
            return list(chosen)
        return [by_pattern(ks, g, e) for e in chosen for g in o.gets]
    items = chosen if not o.gets else [by_pattern(ks, g, e) or b"" for e in chosen for g in o.gets]
    existed = ks.peek(o.store) is not None
    store_list(ks, o.store, items)
    if items:
        notify(ctx.state, LIST, "sortstore", o.store)
    elif existed:
        notify(ctx.state, GENERIC, "del", o.store)
    return len(items)


def _sort_rw(ctx: Context, args: Sequence[bytes]) -> Reply:
    return _sort(ctx, args, readonly=False)


def _sort_ro(ctx: Context, args: Sequence[bytes]) -> Reply:
    return _sort(ctx, args, readonly=True)


COMMANDS: list[Command] = [
    Command("SORT", _sort_rw, -2, frozenset({"write"}), "Sort a list, set or sorted set"),
    Command("SORT_RO", _sort_ro, -2, frozenset({"readonly"}), "SORT without STORE"),
]
