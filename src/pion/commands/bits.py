"""Bit commands of the plain keyspace: GETBIT, SETBIT, BITCOUNT, BITPOS, BITOP, with Redis
7.0's replies and error texts (the semantics are ``pion.keyspace.bits``'s).

BITCOUNT, BITPOS and BITOP over strings longer than
:data:`~pion.keyspace.bits.STEP_BYTES` run their first piece at once and the rest as
:class:`~pion.commands.deferred.Steps`, a slice of the event loop at a time: done at
once on a 512 MB string, they would hold every other client up for a second or more.
Shorter strings are answered at once."""

from __future__ import annotations

from collections.abc import Generator, Sequence

from pion.commands.chunked import work_steps
from pion.commands.deferred import Steps
from pion.commands.state import Command, Context
from pion.commands.zsets import keyword
from pion.errors import PionError
from pion.keyspace.bits import (
    Work,
    bitcount,
    bitop,
    bitpos,
    getbit,
    parse_bit_offset,
    setbit,
)
from pion.keyspace.numbers import parse_int64
from pion.notify import STRING, notify
from pion.resp.reply import Reply

__all__ = ["COMMANDS"]


def _offset(raw: bytes) -> int:
    return parse_bit_offset(raw, parse_int64(raw))


def _run(work: Work) -> Reply | Steps:
    """``work``'s first piece now: its answer if that was all (a string of at most
    STEP_BYTES), else the rest in steps."""
    try:
        next(work)
    except StopIteration as stop:
        answer: int = stop.value
        return answer
    return work_steps(_rest(work))


def _rest(work: Work) -> Generator[None, None, Reply]:
    answer = yield from work
    return answer


def _getbit(ctx: Context, args: Sequence[bytes]) -> Reply:
    return getbit(ctx.state.keyspace, args[0], _offset(args[1]))


def _setbit(ctx: Context, args: Sequence[bytes]) -> Reply:
    offset = _offset(args[1])
    bit = parse_int64(args[2])
    if bit not in (0, 1):
        raise PionError("bit is not an integer or out of range")
    ks = ctx.state.keyspace
    before = ks.string(args[0], read=False)
    grows = before is None or len(before) <= offset >> 3
    old = setbit(ks, args[0], offset, bit)
    if old != bit or grows:  # Redis 7: a string left as it was announces nothing
        notify(ctx.state, STRING, "setbit", args[0])
    return old


def _bitcount(ctx: Context, args: Sequence[bytes]) -> Reply | Steps:
    """Redis 7.0 looks the key up first: a missing key is 0 whatever the arguments."""
    value = ctx.state.keyspace.string(args[0])
    if value is None:
        return 0
    if len(args) == 1:
        return _run(bitcount(value, 0, len(value) - 1, False))
    if len(args) not in (3, 4):
        raise PionError("syntax error")
    start, end = parse_int64(args[1]), parse_int64(args[2])
    if start is None or end is None:
        raise PionError("value is not an integer or out of range")
    in_bits = False
    if len(args) == 4:
        unit = keyword(args[3])
        if unit not in ("BIT", "BYTE"):
            raise PionError("syntax error")
        in_bits = unit == "BIT"
    return _run(bitcount(value, start, end, in_bits))


def _bitpos(ctx: Context, args: Sequence[bytes]) -> Reply | Steps:
    """Redis 7.0's order: the bit, then the key (missing: 0 for a clear bit, -1 for a
    set one), then start, the unit, and end."""
    bit = parse_int64(args[1])
    if bit is None:
        raise PionError("value is not an integer or out of range")
    if bit not in (0, 1):
        raise PionError("The bit argument must be 1 or 0.")
    value = ctx.state.keyspace.string(args[0])
    if value is None:
        return -1 if bit else 0
    if len(args) == 2:
        return _run(bitpos(value, bit, 0, None, False))
    if len(args) > 5:
        raise PionError("syntax error")
    start = parse_int64(args[2])
    if start is None:
        raise PionError("value is not an integer or out of range")
    in_bits = False
    if len(args) == 5:
        unit = keyword(args[4])
        if unit not in ("BIT", "BYTE"):
            raise PionError("syntax error")
        in_bits = unit == "BIT"
    end: int | None = None
    if len(args) >= 4:
        end = parse_int64(args[3])
        if end is None:
            raise PionError("value is not an integer or out of range")
    return _run(bitpos(value, bit, start, end, in_bits))


def _bitop(ctx: Context, args: Sequence[bytes]) -> Reply | Steps:
    op = keyword(args[0])
    if op not in ("AND", "OR", "XOR", "NOT"):
        raise PionError("syntax error")
    if op == "NOT" and len(args) != 3:
        raise PionError("BITOP NOT must be called with a single source key.")
    return _run(bitop(ctx.state.keyspace, op, args[1], list(args[2:])))


COMMANDS: list[Command] = [
    Command("GETBIT", _getbit, 3, frozenset({"readonly", "fast"}), "One bit of a string"),
    Command("SETBIT", _setbit, 4, frozenset({"write"}), "Set one bit of a string"),
    Command("BITCOUNT", _bitcount, -2, frozenset({"readonly"}), "Count the set bits"),
    Command("BITPOS", _bitpos, -3, frozenset({"readonly"}), "The first bit set or clear"),
    Command("BITOP", _bitop, -4, frozenset({"write"}), "AND, OR, XOR, NOT of strings"),
]
