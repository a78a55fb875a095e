"""LCS (Redis 7.0): the longest common subsequence of two strings, its length (LEN), or
the matching ranges (IDX, MINMATCHLEN, WITHMATCHLEN), with Redis's replies and errors
(``t_string.c``'s ``lcsCommand``).

The work is Redis's: the whole ``(len(a)+1) x (len(b)+1)`` table of prefix LCS lengths,
then a walk back from its corner that picks the same subsequence and the same ranges
as Redis (which drops the byte where a range breaks, and ends a range at either
string's first byte). A table row is one numpy pass: a cell is the running maximum
of the row's candidates (the cell above, or the one above-left plus one on a match),
which is Redis's recurrence.

That is quadratic: two strings of 10,000 bytes are 10^8 cells, about a second of numpy.
So the table is built :data:`STEP_CELLS` cells a step and the walk
:data:`STEP_WALK` moves a step, other clients' commands running between steps; the two
strings are immutable values taken at the start, so the answer is that of one instant.
The table is bounded as in Redis 7.0: a table of more than proto-max-bulk-len bytes
(4 bytes a cell, as Redis counts) is refused. Here a cell takes 2 bytes, and LEN keeps
two rows only. The table is transient and not counted in ``--maxmemory``.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pion.commands.args import parse_int
from pion.commands.chunked import work_steps
from pion.commands.deferred import Steps
from pion.commands.state import Command, Context
from pion.errors import PionError, WrongTypeError
from pion.resp.reply import Reply

__all__ = ["COMMANDS", "STEP_CELLS", "STEP_WALK"]

# Table cells computed per step: a few milliseconds of numpy.
STEP_CELLS = 1 << 20
# Moves of the walk back per step (Python: about a millisecond per 10,000).
STEP_WALK = 20_000
# Redis 7.0 refuses a table larger than proto-max-bulk-len (512 MB), 4 bytes a cell.
MAX_TABLE_BYTES = 512 * 1024 * 1024
# Under that bound the shorter string has at most 11,585 bytes, so a cell (at most
# that length) fits 16 bits: half of Redis's memory.
_CELL = np.uint16

_Work = Generator[None, None, Reply]


def _table(a: bytes, b: bytes, whole: bool) -> Generator[None, None, np.ndarray[Any, Any]]:
    """``t[i, j]``: the LCS length of ``a[:i]`` and ``b[:j]``, a step per STEP_CELLS.
    Without ``whole`` only the last two rows are kept (LEN needs no walk back), and
    the last row is returned as ``t[-1]``."""
    t = np.zeros((len(a) + 1 if whole else 2, len(b) + 1), dtype=_CELL)
    bv = np.frombuffer(b, dtype=np.uint8)
    rows = max(1, STEP_CELLS // (len(b) + 1))
    for i in range(1, len(a) + 1):
        if i % rows == 0:
            yield
        above, row = (t[i - 1], t[i]) if whole else (t[(i - 1) & 1], t[i & 1])
        cand = np.where(bv == a[i - 1], above[:-1] + 1, above[1:])
        np.maximum.accumulate(cand, out=row[1:])
    if not whole and len(a) & 1 == 0:
        t[[0, 1]] = t[[1, 0]]  # the last row computed last
    return t


@dataclass(frozen=True, slots=True)
class _Options:
    idx: bool = False
    length: bool = False
    minlen: int = 0
    withlen: bool = False


def _lcs(a: bytes, b: bytes, opts: _Options) -> _Work:
    idx, minlen, withlen = opts.idx, opts.minlen, opts.withlen
    t = yield from _table(a, b, whole=idx or not opts.length)
    total = int(t[-1, len(b)])
    if opts.length and not idx:
        return total
    out = bytearray(total)
    k = total
    matches: list[Reply] = []
    unset = len(a)  # Redis's "no range yet" marker
    a_start, a_end, b_start, b_end = unset, 0, 0, 0
    i, j = len(a), len(b)
    moves = 0
    while i > 0 and j > 0:
        moves += 1
        if moves % STEP_WALK == 0:
            yield
        emit = False
        if a[i - 1] == b[j - 1]:
            out[k - 1] = a[i - 1]
            if a_start == unset:
                a_start = a_end = i - 1
                b_start = b_end = j - 1
            elif a_start == i and b_start == j:
                a_start -= 1
                b_start -= 1
            else:
                emit = True
            if a_start == 0 or b_start == 0:
                emit = True
            k, i, j = k - 1, i - 1, j - 1
        else:
            if t[i - 1, j] > t[i, j - 1]:
                i -= 1
            else:
                j -= 1
            emit = a_start != unset
        if emit:
            size = a_end - a_start + 1
            if idx and (minlen == 0 or size >= minlen):
                match: list[Reply] = [[a_start, a_end], [b_start, b_end]]
                matches.append([*match, size] if withlen else match)
            a_start = unset
    if idx:
        return {b"matches": matches, b"len": total}
    return bytes(out)


def _value(ctx: Context, key: bytes) -> bytes | None:
    try:
        return ctx.state.keyspace.string(key)
    except WrongTypeError:
        raise PionError("The specified keys must contain string values") from None


def _lcs_command(ctx: Context, args: Sequence[bytes]) -> Reply | Steps:
    a, b = _value(ctx, args[0]), _value(ctx, args[1])
    idx = length = withlen = False
    minlen = 0
    j = 2
    while j < len(args):
        opt = args[j].upper()
        if opt == b"IDX":
            idx = True
        elif opt == b"LEN":
            length = True
        elif opt == b"WITHMATCHLEN":
            withlen = True
        elif opt == b"MINMATCHLEN" and j + 1 < len(args):
            minlen = max(parse_int(args[j + 1]), 0)
            j += 1
        else:
            raise PionError("syntax error")
        j += 1
    if length and idx:
        raise PionError("If you want both the length and indexes, please just use IDX.")
    a, b = a or b"", b or b""
    if (len(a) + 1) * (len(b) + 1) * 4 > MAX_TABLE_BYTES:
        raise PionError("Insufficient memory, transient memory for LCS exceeds proto-max-bulk-len")
    work = _lcs(a, b, _Options(idx, length, minlen, withlen))
    if (len(a) + 1) * (len(b) + 1) <= STEP_CELLS and len(a) + len(b) < STEP_WALK:
        try:  # small: no step would ever yield
            while True:
                next(work)
        except StopIteration as stop:
            answer: Reply = stop.value
            return answer
    return work_steps(work, taken=True)


COMMANDS: list[Command] = [
    Command("LCS", _lcs_command, -3, frozenset({"readonly"}), "Longest common subsequence"),
]
