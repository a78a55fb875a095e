"""A streamed reply's parts leave in wire order whatever order its pieces are computed
in; at most STREAM_DEPTH pieces compute at once; nothing starts while the client is
behind; a broken or short stream is reported once; a gone client ends it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np

from pion.commands.deferred import Awaiting, LazyBulk, Stream
from pion.server.streaming import STREAM_DEPTH, StreamSender


class Manual:
    """Work runs when the test says, in any order."""

    def __init__(self) -> None:
        self.queue: list[tuple[Callable[[], Any], Callable[[Any], None]]] = []

    def submit(self, work: Callable[[], Any], done: Callable[[Any], None]) -> None:
        self.queue.append((work, done))

    def run(self, i: int) -> None:
        work, done = self.queue.pop(i)
        try:
            result = work()
        except Exception as exc:
            result = exc
        done(result)


def piece(value: int, n: int = 4) -> Callable[[], np.ndarray]:
    return lambda: np.full(n, value, np.uint8)


def sender(stream: Stream, **over: Any) -> tuple[StreamSender, Manual, dict[str, Any]]:
    manual = Manual()
    seen: dict[str, Any] = {"out": bytearray(), "done": [], "behind": False, "alive": True}

    def send(chunks: list[Any], nbytes: int) -> None:
        data = b"".join(bytes(c) for c in chunks)
        assert len(data) == nbytes
        seen["out"] += data

    s = StreamSender(
        stream,
        2,
        manual,  # type: ignore[arg-type]
        send=send,
        behind=lambda: seen["behind"],
        alive=lambda: seen["alive"],
        done=lambda error, exc: seen["done"].append(error),
    )
    return s, manual, seen


def test_out_of_order_pieces_leave_in_order() -> None:
    stream = Stream([LazyBulk(8, [piece(1), piece(2)]), None, LazyBulk(4, [piece(3)])], True)
    s, manual, seen = sender(stream)
    s.pump()
    assert len(manual.queue) == STREAM_DEPTH == 2
    manual.run(1)  # the second piece finishes first: held back
    assert bytes(seen["out"]) == b"*3\r\n$8\r\n"
    manual.run(0)  # the first: both go, then the rest of the framing, then piece 3
    assert len(manual.queue) == 1
    manual.run(0)
    want = b"*3\r\n$8\r\n" + bytes([1] * 4 + [2] * 4) + b"\r\n$-1\r\n$4\r\n" + bytes([3] * 4)
    assert bytes(seen["out"]) == want + b"\r\n"
    assert seen["done"] == [None]


def test_nothing_starts_while_behind() -> None:
    stream = Stream([LazyBulk(12, [piece(1), piece(2), piece(3)])], False)
    s, manual, seen = sender(stream)
    seen["behind"] = True
    s.pump()
    assert manual.queue == []
    assert bytes(seen["out"]) == b""  # not even the framing: the client is behind
    seen["behind"] = False
    s.pump()
    assert len(manual.queue) == 2
    while manual.queue:
        manual.run(0)
    assert bytes(seen["out"]) == b"$12\r\n" + bytes([1] * 4 + [2] * 4 + [3] * 4) + b"\r\n"
    assert seen["done"] == [None]


def test_a_failed_piece_is_reported_once() -> None:
    def boom() -> np.ndarray:
        raise RuntimeError("bug")

    stream = Stream([LazyBulk(8, [boom, piece(2)])], False)
    s, manual, seen = sender(stream)
    s.pump()
    manual.run(0)
    manual.run(0)  # the other piece finishes after the failure: ignored
    assert len(seen["done"]) == 1
    assert "bug" in seen["done"][0]


def test_short_and_long_pieces_are_reported() -> None:
    s, manual, seen = sender(Stream([LazyBulk(8, [piece(1)])], False))
    s.pump()
    manual.run(0)
    assert "short" in seen["done"][0]
    s, manual, seen = sender(Stream([LazyBulk(2, [piece(1)])], False))
    s.pump()
    manual.run(0)
    assert "over-ran" in seen["done"][0]


def test_a_gone_client_ends_the_stream_quietly() -> None:
    s, manual, seen = sender(Stream([LazyBulk(8, [piece(1), piece(2)])], False))
    s.pump()
    seen["alive"] = False
    manual.run(0)
    manual.run(0)
    assert seen["done"] == [None]


def test_an_awaiting_piece_reaches_a_worker_only_once_ready() -> None:
    async def run() -> None:
        ready: list[Callable[[], None]] = []
        stream = Stream([LazyBulk(8, [Awaiting(ready.append, piece(1)), piece(2)])], False)
        s, manual, seen = sender(stream)
        s.pump()
        assert len(manual.queue) == 1  # only the second: the first waits for its rows
        manual.run(0)  # done, and held back behind the first
        assert bytes(seen["out"]) == b"$8\r\n"
        ready[0]()  # what the first needs has arrived (told from another thread)
        await asyncio.sleep(0)
        assert len(manual.queue) == 1
        manual.run(0)
        assert bytes(seen["out"]) == b"$8\r\n" + bytes([1] * 4 + [2] * 4) + b"\r\n"
        assert seen["done"] == [None]

    asyncio.run(run())


def test_an_awaiting_piece_called_inline_waits_itself() -> None:
    def ready(go: Callable[[], None]) -> None:
        go()  # already there

    assert bytes(Awaiting(ready, piece(5))()) == bytes([5] * 4)
