"""Long replies and long work cut into steps (:class:`~pion.commands.deferred.Steps`).

A command that reads many keys or members takes what it needs from the state in one
step (a C-speed copy of references: the names of the keys, a slice of a sorted set,
the items of a hash), so what it answers is the state of one instant, as in Redis.
Encoding that answer costs far more than taking it (a third of a second for 300,000
keys), and it touches nothing shared: it is done here, :data:`STEP_ITEMS` elements a
step, other clients' commands running in between.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import cast

from pion.commands.deferred import Steps
from pion.resp.encoder import Chunks, encode_reply
from pion.resp.reply import Encoded, NoReply, Reply

__all__ = [
    "BIG_REPLY",
    "STEP_ITEMS",
    "encoded_array",
    "pairs_reply",
    "reply",
    "run_now",
    "work_steps",
]

# Elements encoded per step: about half a millisecond of the loop.
STEP_ITEMS = 2048
# Replies of more elements than this are encoded in steps; smaller ones at once.
BIG_REPLY = 4 * STEP_ITEMS


def reply(items: list[Reply], proto: int) -> Reply | Steps:
    """``items`` as an array reply: at once when small, else in steps."""
    if len(items) <= BIG_REPLY:
        return items
    return Steps(_array(items, proto), taken=True)


def encoded_array(count: int, parts: Sequence[Chunks | Steps], proto: int) -> Reply | Steps:
    """An array of ``count`` elements already encoded (``parts``: chunks, and steps
    that only encode what they took, ``Steps.taken``, each in its place: a
    transaction's replies). At once when small and none is in steps, else in steps."""
    flat: Chunks = [b"*%d\r\n" % count]
    for part in parts:
        if isinstance(part, Steps) or len(flat) + len(part) > BIG_REPLY:
            return Steps(_parts(count, parts, proto), taken=True)
        flat += part
    return Encoded(b"".join(flat))


def _parts(
    count: int, parts: Sequence[Chunks | Steps], proto: int
) -> Generator[Chunks, None, Reply]:
    yield [b"*%d\r\n" % count]
    for part in parts:
        if isinstance(part, Steps):
            last = yield from part.run
            out: Chunks = []
            encode_reply(last, proto, out)
            yield out
            continue
        for start in range(0, len(part), STEP_ITEMS):
            yield part[start : start + STEP_ITEMS]
    return NoReply()


def _array(items: Sequence[Reply], proto: int) -> Generator[Chunks, None, Reply]:
    yield [b"*%d\r\n" % len(items)]
    for start in range(0, len(items), STEP_ITEMS):
        out: Chunks = []
        for item in items[start : start + STEP_ITEMS]:
            encode_reply(item, proto, out)
        yield out
    return NoReply()


def pairs_reply(
    pairs: Sequence[tuple[Reply, Reply]], proto: int, shape: str, *, swap: bool = False
) -> Reply | Steps:
    """``pairs`` (taken from the state already) as a reply, in steps when large.

    ``swap`` reads each pair as (b, a). Shapes: ``flat`` ``[a1, b1, a2, b2, ...]``,
    ``nested`` ``[[a1, b1], ...]``, ``map`` a map of a -> b (RESP3; flat in RESP2),
    ``first`` ``[a1, a2, ...]``."""
    if len(pairs) <= BIG_REPLY // 2:
        ordered = [(b, a) for a, b in pairs] if swap else pairs
        if shape == "first":
            return [a for a, _ in ordered]
        if shape == "nested":
            return [[a, b] for a, b in ordered]
        if shape == "map":
            return dict(cast("Sequence[tuple[str | bytes, Reply]]", ordered))
        out: list[Reply] = []
        for a, b in ordered:
            out += [a, b]
        return out
    return Steps(_pairs(pairs, proto, shape, swap), taken=True)


def _pairs(
    pairs: Sequence[tuple[Reply, Reply]], proto: int, shape: str, swap: bool
) -> Generator[Chunks, None, Reply]:
    n = len(pairs)
    if shape == "map" and proto == 3:
        yield [b"%%%d\r\n" % n]
    else:
        yield [b"*%d\r\n" % (n if shape in ("first", "nested") else 2 * n)]
    for start in range(0, n, STEP_ITEMS):
        out: Chunks = []
        for pair in pairs[start : start + STEP_ITEMS]:
            a, b = (pair[1], pair[0]) if swap else pair
            if shape == "first":
                encode_reply(a, proto, out)
            elif shape == "nested":
                encode_reply([a, b], proto, out)
            else:
                encode_reply(a, proto, out)
                encode_reply(b, proto, out)
        yield out
    return NoReply()


def work_steps(work: Generator[None, None, Reply], *, taken: bool = False) -> Steps:
    """Steps that only work (free memory, parse arguments) and then reply; ``taken``
    as :class:`Steps` has it."""

    def run() -> Generator[Chunks, None, Reply]:
        result = yield from _quiet(work)
        return result

    return Steps(run(), taken=taken)


def _quiet(work: Generator[None, None, Reply]) -> Generator[Chunks, None, Reply]:
    try:
        while True:
            next(work)
            yield []
    except StopIteration as stop:
        result: Reply = stop.value
        return result


def run_now(steps: Steps, proto: int) -> Chunks:
    """Every step at once and the encoded reply (where nothing may run in between: a
    connection without slices, a transaction's EXEC). Raises what a step raises."""
    out: Chunks = []
    try:
        while True:
            out += next(steps.run)
    except StopIteration as stop:
        encode_reply(stop.value, proto, out)
    return out
