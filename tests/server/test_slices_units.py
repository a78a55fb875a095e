"""Units of the fairness machinery: coalescing reply pieces, numbering loop turns, and
running a Steps command at once."""

from __future__ import annotations

import asyncio

import numpy as np

from pion.commands.chunked import BIG_REPLY, pairs_reply, reply, run_now
from pion.commands.deferred import Steps
from pion.resp.encoder import encode_reply
from pion.server.replies import COALESCE_BELOW, coalesce
from pion.server.slices import Turns


def test_coalesce_joins_small_pieces_and_passes_large_ones_untouched() -> None:
    big = memoryview(np.arange(COALESCE_BELOW, dtype=np.float32)).cast("B")
    pieces = [b"*3\r\n", b"$1\r\n", b"a", b"\r\n", big, b"\r\n", b"+OK\r\n"]
    out = coalesce(list(pieces))
    assert out == [b"*3\r\n$1\r\na\r\n", big, b"\r\n+OK\r\n"]
    assert out[1] is big  # never copied
    assert b"".join(out) == b"".join(bytes(p) for p in pieces)


def test_two_million_small_pieces_become_a_handful() -> None:
    pieces = [b"+PONG\r\n"] * 2_000_000
    out = coalesce(pieces)
    assert len(out) == 1 and len(out[0]) == 7 * 2_000_000


def test_turns_are_numbered_once_per_pass_of_the_loop() -> None:
    async def body() -> list[int]:
        turns = Turns()
        seen = [turns.current(), turns.current()]
        await asyncio.sleep(0)
        seen.append(turns.current())
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        seen.append(turns.current())
        return seen

    seen = asyncio.run(body())
    assert seen[0] == seen[1] < seen[2] < seen[3]


def test_long_replies_become_steps_that_encode_as_the_plain_reply() -> None:
    items = [b"k%d" % i for i in range(BIG_REPLY + 1)]
    steps = reply(list(items), 2)
    assert isinstance(steps, Steps)
    plain: list[bytes | bytearray | memoryview] = []
    encode_reply(list(items), 2, plain)
    assert b"".join(run_now(steps, 2)) == b"".join(plain)
    assert reply(items[:10], 2) == items[:10]  # short: no steps
    pairs = [(float(i), b"m%d" % i) for i in range(BIG_REPLY)]
    for proto, shape in ((2, "flat"), (3, "nested"), (3, "map"), (2, "first")):
        stepped = pairs_reply(pairs, proto, shape, swap=True)
        assert isinstance(stepped, Steps)
        once = pairs_reply(pairs[:3], proto, shape, swap=True)
        head: list[bytes | bytearray | memoryview] = []
        encode_reply(once, proto, head)
        # The stepped encoding of the same shape starts like the plain one's elements.
        body = b"".join(run_now(stepped, proto))
        first_items = b"".join(head).split(b"\r\n", 1)[1]
        assert body.split(b"\r\n", 1)[1].startswith(first_items)
