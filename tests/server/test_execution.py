"""One execution model and one error boundary (``pion.commands.execution``,
``pion.server.running``), through a fake transport and commands of the test's own:

- a :class:`Wait` holds its client's later commands and no one else's, replies once
  what it waits for comes (or its time is out), forgets a client that left, answers
  at once inside EXEC and runs like any other for a silenced client;
- a failure on every path (a handler's reply that cannot be encoded, an offloaded
  ``finish``, a step, a streamed piece, a wait's ``then``; on the RESP lane, inside
  EXEC, for a silenced client) is a counted error reply (``internal_errors``,
  errorstats, the command's ``failed_calls``) and the connection goes on, except a
  reply broken after its first bytes went out, which drops the connection (counted).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator, Sequence
from pathlib import Path
from typing import Any

import hiredis
import numpy as np

from pion.commands import build_table
from pion.commands.deferred import LazyBulk, Offload, Steps, Stream, Wait
from pion.commands.state import Command, Context
from pion.resp.encoder import Chunks
from pion.resp.reply import Reply
from pion.server.connection import Connection, Phase
from support.transport import FakeTransport, connect


class ManualOffload:
    """An offloader whose work runs when the test says so."""

    def __init__(self) -> None:
        self.queue: list[tuple[Callable[[], Any], Callable[[Any], None]]] = []

    def submit(self, work: Callable[[], Any], done: Callable[[Any], None]) -> None:
        self.queue.append((work, done))

    def run_all(self) -> None:
        while self.queue:
            work, done = self.queue.pop(0)
            try:
                result = work()
            except Exception as exc:
                result = exc
            done(result)


class Event:
    """What a fake blocking command waits for: ``fire()`` wakes every waiter."""

    def __init__(self) -> None:
        self.waiters: list[Callable[[], None]] = []
        self.fired = False
        self.cancelled = 0
        self.then_ran = 0

    def ready(self, go: Callable[[], None]) -> None:
        if self.fired:
            go()
        else:
            self.waiters.append(go)

    def fire(self) -> None:
        self.fired = True
        for go in self.waiters:
            go()
        self.waiters.clear()

    def cancel(self) -> None:
        self.cancelled += 1

    def then(self) -> Reply:
        self.then_ran += 1
        return b"came"


class Unencodable:
    """A reply value no encoder knows: encoding it raises."""


def _steps(chunks: Sequence[Chunks], last: object) -> Generator[Chunks, None, Reply]:
    yield from chunks
    return last  # type: ignore[return-value]


def _bad_finish(result: object) -> Reply:
    raise KeyError("bug in finish")


def _table(event: Event, timeout: float | None = None) -> Any:
    def wait(ctx: Context, args: Sequence[bytes]) -> Wait:
        return Wait(event.ready, event.then, lambda: None, timeout=timeout, cancel=event.cancel)

    def bad_steps(ctx: Context, args: Sequence[bytes]) -> Steps:
        if args and args[0] == b"late":  # fails after its first chunk went out
            return Steps(_steps([[b"*2\r\n", b"+a\r\n"]], Unencodable()))
        return Steps(_steps([[]], Unencodable()))

    def bad_then(ctx: Context, args: Sequence[bytes]) -> Wait:
        def then() -> Reply:
            raise RuntimeError("bug in then")

        return Wait(lambda go: go(), then, lambda: None)

    def boom() -> np.ndarray:
        raise RuntimeError("decoder bug")

    extra = [
        Command("T.WAIT", wait, 1),
        Command("T.BADREPLY", lambda ctx, args: Unencodable(), 1),  # type: ignore[arg-type,return-value]
        Command(
            "T.BADFINISH",
            lambda ctx, args: Offload(lambda: 1, _bad_finish),
            1,
        ),
        Command("T.BADSTEPS", bad_steps, -1),
        Command("T.BADTHEN", bad_then, 1),
        Command(
            "T.BADSTREAM",
            lambda ctx, args: Stream([LazyBulk(16, [lambda: np.zeros(1, "<f8"), boom])], False),
            1,
        ),
    ]
    return build_table(extra)


def encode(*args: object) -> bytes:
    parts = [a if isinstance(a, bytes) else str(a).encode() for a in args]
    return b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)


def parse(wire: bytes) -> list[Any]:
    reader = hiredis.Reader()
    reader.feed(wire)
    out = []
    while (item := reader.gets()) is not False:
        out.append(("error", str(item)) if isinstance(item, hiredis.ReplyError) else item)
    return out


def _conn(
    tmp_path: Path, event: Event | None = None, **kw: Any
) -> tuple[Connection, FakeTransport]:
    return connect(tmp_path, table=_table(event or Event(), kw.pop("timeout", None)), **kw)


def _failed_calls(conn: Connection, name: str) -> int:
    return conn._state.stats.commands[name][3]


async def _until(check: Callable[[], bool]) -> None:
    """Let the loop run until ``check()`` holds (callbacks, timers)."""
    for _ in range(2000):
        if check():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("the condition never held")


# -- Wait ---------------------------------------------------------------------------------


def test_a_wait_holds_its_clients_later_commands_until_it_comes(tmp_path: Path) -> None:
    async def body() -> None:
        event = Event()
        conn, t = _conn(tmp_path, event)
        other, t2 = _conn(tmp_path / "b")
        conn.data_received(encode("PING") + encode("T.WAIT") + encode("ECHO", "after"))
        assert parse(bytes(t.written)) == [b"PONG"]
        assert conn.phase is Phase.BUSY
        other.data_received(encode("PING"))  # another client is not held up
        assert parse(bytes(t2.written)) == [b"PONG"]
        await asyncio.sleep(0)
        assert parse(bytes(t.written)) == [b"PONG"]
        event.fire()
        await _until(lambda: len(parse(bytes(t.written))) == 3)
        assert parse(bytes(t.written)) == [b"PONG", b"came", b"after"]
        assert conn.phase is Phase.READY and event.cancelled == 0

    asyncio.run(body())


def test_a_wait_that_times_out_answers_expired_and_is_cancelled(tmp_path: Path) -> None:
    async def body() -> None:
        event = Event()
        conn, t = _conn(tmp_path, event, timeout=0.001)
        conn.data_received(encode("T.WAIT") + encode("PING"))
        await _until(lambda: len(parse(bytes(t.written))) == 2)
        assert parse(bytes(t.written)) == [None, b"PONG"]
        assert event.cancelled == 1
        event.fire()  # too late: ignored
        await asyncio.sleep(0)
        assert event.then_ran == 0

    asyncio.run(body())


def test_a_wait_whose_client_left_is_cancelled_and_never_resumed(tmp_path: Path) -> None:
    async def body() -> None:
        event = Event()
        conn, t = _conn(tmp_path, event)
        conn.data_received(encode("T.WAIT"))
        conn.connection_lost(None)
        assert event.cancelled == 1
        event.fire()
        await asyncio.sleep(0)
        assert event.then_ran == 0 and t.written == b""

    asyncio.run(body())


def test_inside_exec_a_wait_answers_at_once(tmp_path: Path) -> None:
    async def body() -> None:
        event = Event()
        conn, t = _conn(tmp_path, event)
        conn.data_received(encode("MULTI") + encode("T.WAIT") + encode("EXEC"))
        assert parse(bytes(t.written)) == [b"OK", b"QUEUED", [None]]
        assert event.cancelled == 1
        event.fire()
        t.written.clear()
        conn.data_received(encode("MULTI") + encode("T.WAIT") + encode("EXEC"))
        assert parse(bytes(t.written)) == [b"OK", b"QUEUED", [b"came"]]

    asyncio.run(body())


def test_a_silenced_clients_wait_runs_and_answers_nothing(tmp_path: Path) -> None:
    async def body() -> None:
        event = Event()
        conn, t = _conn(tmp_path, event)
        conn.data_received(encode("CLIENT", "REPLY", "OFF") + encode("T.WAIT") + encode("PING"))
        assert conn.phase is Phase.BUSY
        event.fire()
        await _until(lambda: not conn._running.busy)
        conn.data_received(encode("CLIENT", "REPLY", "ON") + encode("ECHO", "x"))
        assert event.then_ran == 1
        assert parse(bytes(t.written)) == [b"OK", b"x"]

    asyncio.run(body())


# -- the error boundary, path by path ---------------------------------------------------------


def _counted(conn: Connection, name: str, internal: int) -> None:
    state = conn._state
    assert state.counters.internal_errors == internal
    assert _failed_calls(conn, name) >= 1
    assert state.stats.errors["ERR"] >= 1


def test_an_unencodable_reply_is_a_counted_error_on_every_path(tmp_path: Path) -> None:
    async def body() -> None:
        conn, t = _conn(tmp_path)
        internal = ("error", "ERR internal error")
        conn.data_received(encode("T.BADREPLY") + encode("PING"))
        assert parse(bytes(t.written)) == [internal, b"PONG"]
        _counted(conn, "T.BADREPLY", 1)
        t.written.clear()
        # Inside EXEC the command's slot is the error (EXEC's array still encodes).
        conn.data_received(encode("MULTI") + encode("T.BADREPLY") + encode("EXEC"))
        wire = bytes(t.written)
        assert wire.startswith(b"+OK\r\n+QUEUED\r\n*1\r\n")
        assert conn._state.counters.internal_errors == 2

    asyncio.run(body())


def test_a_failed_finish_is_a_counted_error_offloaded_inline_and_silenced(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        internal = ("error", "ERR internal error")
        manual = ManualOffload()
        conn, t = _conn(tmp_path, offload=manual)
        conn.data_received(encode("T.BADFINISH") + encode("PING"))
        manual.run_all()
        assert parse(bytes(t.written)) == [internal, b"PONG"]
        _counted(conn, "T.BADFINISH", 1)
        inline, t2 = _conn(tmp_path / "inline")
        inline.data_received(encode("T.BADFINISH") + encode("PING"))
        assert parse(bytes(t2.written)) == [internal, b"PONG"]
        _counted(inline, "T.BADFINISH", 1)
        t.written.clear()
        conn.data_received(encode("CLIENT", "REPLY", "OFF") + encode("T.BADFINISH"))
        manual.run_all()
        conn.data_received(encode("CLIENT", "REPLY", "ON") + encode("PING"))
        assert parse(bytes(t.written)) == [b"OK", b"PONG"]
        assert conn._state.counters.internal_errors == 2
        assert _failed_calls(conn, "T.BADFINISH") == 2

    asyncio.run(body())


def test_a_step_whose_reply_cannot_be_encoded_is_a_counted_error(tmp_path: Path) -> None:
    async def body() -> None:
        inline, t0 = _conn(tmp_path / "inline")  # no slices: the steps run at once
        inline.data_received(encode("T.BADSTEPS") + encode("PING"))
        assert parse(bytes(t0.written)) == [("error", "ERR internal error"), b"PONG"]
        _counted(inline, "T.BADSTEPS", 1)
        conn, t = _conn(tmp_path)
        conn._steps_async = True  # steps on the loop, as a served connection runs them
        conn.data_received(encode("T.BADSTEPS") + encode("PING"))
        await _until(lambda: len(parse(bytes(t.written))) == 2)
        assert parse(bytes(t.written)) == [("error", "ERR internal error"), b"PONG"]
        assert not t.aborted
        _counted(conn, "T.BADSTEPS", 1)
        # After part of its reply went out the reply cannot be finished: dropped, counted.
        conn.data_received(encode("T.BADSTEPS", "late"))
        await _until(lambda: t.aborted)
        assert conn._state.counters.internal_errors == 2
        assert _failed_calls(conn, "T.BADSTEPS") == 2

    asyncio.run(body())


def test_a_failed_then_and_a_broken_stream_are_counted(tmp_path: Path) -> None:
    async def body() -> None:
        conn, t = _conn(tmp_path)
        conn.data_received(encode("T.BADTHEN") + encode("PING"))
        await _until(lambda: len(parse(bytes(t.written))) == 2)
        assert parse(bytes(t.written)) == [("error", "ERR internal error"), b"PONG"]
        _counted(conn, "T.BADTHEN", 1)
        manual = ManualOffload()
        streamed, t2 = _conn(tmp_path / "s", offload=manual)
        streamed.data_received(encode("T.BADSTREAM"))
        manual.run_all()
        assert t2.aborted
        _counted(streamed, "T.BADSTREAM", 1)

    asyncio.run(body())


def test_silenced_deferred_work_runs_off_the_loop(tmp_path: Path) -> None:
    """CLIENT REPLY OFF no longer settles deferred work inline: an offloaded command
    goes to the worker pool like any client's (its fairness slices kept)."""

    async def body() -> None:
        manual = ManualOffload()
        conn, t = _conn(tmp_path, offload=manual)
        conn.data_received(encode("CLIENT", "REPLY", "OFF") + encode("T.BADFINISH"))
        assert len(manual.queue) == 1 and conn.phase is Phase.BUSY
        manual.run_all()
        assert conn.phase is Phase.READY and t.written == b""

    asyncio.run(body())
