"""The fast lane (``pion.server.lane``: GET, SET, a plain KV.PREFIX.LOOKUP, PING, MULTI, EXEC):
taken for the commands it covers, and byte for byte what the generic path answers,
with the same counters, for every case a check would refuse (arity, NOAUTH, LOADING,
MISCONF, WRONGTYPE), RESP3, large values and spellings outside the lane."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from pion.server import connection, dispatch
from pion.server.connection import Connection
from support.transport import FakeTransport, connect

VALUE = b"v" * 256
BIG = b"b" * 5000  # past SMALL_BULK: header, value, CRLF as three chunks


def frame(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%b\r\n" % (len(a), a) for a in args)


SCRIPT = [
    frame(b"PING"),
    frame(b"ping", b"hello"),
    frame(b"GET", b"missing"),
    frame(b"SET", b"k", VALUE),
    frame(b"get", b"k"),
    frame(b"Get", b"k"),  # mixed case: the generic path
    frame(b"GET", b"k", b"extra"),  # arity
    frame(b"SET", b"k"),  # arity
    frame(b"SET", b"big", BIG),
    frame(b"GET", b"big"),
    frame(b"SET", b"k", b"w", b"NX"),  # options: the handler's cursor
    frame(b"SET", b"k", b"w", b"BOGUS"),
    frame(b"HSET", b"h", b"f", b"v"),
    frame(b"GET", b"h"),  # WRONGTYPE
    frame(b"SET", b"h", b"now a string"),
    frame(b"KV.PREFIX.LOOKUP", b"ns"),  # MISS
    frame(b"KV.PREFIX.REGISTER", b"ns", b"64", b"fp16"),
    frame(b"kv.prefix.lookup", b"ns"),  # HIT
    frame(b"KV.PREFIX.LOOKUP", b""),  # ns length
    frame(b"KV.PREFIX.LOOKUP", b"ns", b"TOKENS", b"5"),
    # A transaction: the lane queues inside MULTI and runs EXEC, as the generic path.
    frame(b"MULTI"),
    frame(b"SET", b"t", b"1"),
    frame(b"GET", b"h"),  # WRONGTYPE, inside EXEC: that command fails alone
    frame(b"get", b"t"),
    frame(b"multi"),  # nested: an error, the transaction goes on
    frame(b"EXEC"),
    frame(b"EXEC"),  # without MULTI
    frame(b"MULTI"),
    frame(b"SET", b"t"),  # arity while queuing: EXECABORT
    frame(b"exec"),
    frame(b"HELLO", b"3"),
    frame(b"GET", b"missing"),  # RESP3 null
    frame(b"GET", b"k"),
    frame(b"WATCH", b"t"),
    frame(b"SET", b"t", b"2"),
    frame(b"MULTI"),
    frame(b"GET", b"t"),
    frame(b"EXEC"),  # a watched key changed: RESP3 null
]


def run_script(tmp_path: Path, script: list[bytes], **config: Any) -> tuple[bytes, dict[str, int]]:
    out: dict[str, Any] = {}

    async def body() -> None:
        conn, t = connect(tmp_path, **config)
        for wire in script:
            conn.data_received(wire)
        state = conn._state
        out["wire"] = bytes(t.written)
        out["counters"] = {
            "commands": state.counters.total_commands_processed,
            "hits": state.keyspace.hits,
            "misses": state.keyspace.misses,
            "internal": state.counters.internal_errors,
        }

    asyncio.run(body())
    return out["wire"], out["counters"]


def test_the_lane_answers_as_the_generic_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast = run_script(tmp_path / "fast", SCRIPT)
    monkeypatch.setattr(connection, "lane_of", lambda table: {})
    generic = run_script(tmp_path / "generic", SCRIPT)
    assert fast == generic
    assert b"WRONGTYPE" in fast[0] and b"wrong number of arguments for 'get'" in fast[0]
    assert b"$5000\r\n" + BIG + b"\r\n" in fast[0] and fast[1]["internal"] == 0


# Commands outside the lane that change what it may take, in the middle of one read's
# batch: the lane is asked again after each (lane.usable).
STATE_CHANGES = [
    frame(b"SET", b"k", VALUE),
    frame(b"GET", b"k"),
    frame(b"CLIENT", b"REPLY", b"OFF"),
    frame(b"GET", b"k"),
    frame(b"SET", b"k", b"w"),
    frame(b"CLIENT", b"REPLY", b"ON"),
    frame(b"GET", b"k"),
    frame(b"CLIENT", b"REPLY", b"SKIP"),
    frame(b"GET", b"k"),
    frame(b"GET", b"k"),
    frame(b"SUBSCRIBE", b"ch"),
    frame(b"GET", b"k"),  # a RESP2 subscriber may not
    frame(b"PING"),
    frame(b"UNSUBSCRIBE", b"ch"),
    frame(b"GET", b"k"),
    frame(b"MULTI"),
    frame(b"SUBSCRIBE", b"ch"),
    frame(b"EXEC"),  # runs a command outside the lane: asked again after it
    frame(b"GET", b"k"),
    frame(b"UNSUBSCRIBE"),
    frame(b"GET", b"k"),
]


def test_one_read_answers_as_the_generic_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for script in (SCRIPT, STATE_CHANGES):
        fast = run_script(tmp_path / "fast", [b"".join(script)])
        with monkeypatch.context() as patch:
            patch.setattr(connection, "lane_of", lambda table: {})
            generic = run_script(tmp_path / "generic", [b"".join(script)])
        assert fast == generic
        assert fast == run_script(tmp_path / "one by one", script)
    assert fast[0].count(b"only (P|S)SUBSCRIBE") == 2 and fast[0].endswith(b":0\r\n$1\r\nw\r\n")


def test_noauth_and_loading_leave_the_lane(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = [frame(b"GET", b"k"), frame(b"AUTH", b"secret"), frame(b"SET", b"k", b"1")]
    script.append(frame(b"GET", b"k"))
    fast = run_script(tmp_path / "fast", script, requirepass="secret")
    monkeypatch.setattr(connection, "lane_of", lambda table: {})
    assert fast == run_script(tmp_path / "generic", script, requirepass="secret")
    assert fast[0].startswith(b"-NOAUTH") and fast[0].endswith(b"+OK\r\n$1\r\n1\r\n")


class _FailingLog:
    def write_refusal(self) -> str:
        return "Errors writing to the AOF file: No space left on device"

    def needs_sync(self) -> bool:
        return False


@pytest.mark.parametrize("flag", ["loading", "misconf"])
def test_refused_states_take_the_generic_path(tmp_path: Path, flag: str) -> None:
    async def body() -> None:
        conn, t = connect(tmp_path)
        if flag == "loading":
            conn._state.loading = True
        else:
            conn._state.persistence = _FailingLog()  # type: ignore[assignment]
        conn.data_received(frame(b"SET", b"k", b"1") + frame(b"GET", b"k"))
        first = bytes(t.written).split(b"\r\n")[0]
        assert first.startswith(b"-LOADING" if flag == "loading" else b"-MISCONF")

    asyncio.run(body())


def test_the_lane_skips_the_generic_dispatch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[bytes] = []
    generic = dispatch.dispatch

    def counting(ctx: Any, argv: Any) -> Any:
        calls.append(argv[0])
        return generic(ctx, argv)

    monkeypatch.setattr(dispatch, "dispatch", counting)
    script = [
        frame(b"KV.PREFIX.REGISTER", b"ns", b"64", b"fp16"),
        frame(b"SET", b"k", VALUE),
        frame(b"GET", b"k"),
        frame(b"KV.PREFIX.LOOKUP", b"ns"),
        frame(b"PING"),
        frame(b"ECHO", b"x"),
        frame(b"MULTI"),
        frame(b"SET", b"t", b"1"),
        frame(b"GET", b"t"),
        frame(b"ECHO", b"y"),
        frame(b"EXEC"),
    ]
    wire, _ = run_script(tmp_path, script)
    assert calls == [b"KV.PREFIX.REGISTER", b"ECHO", b"ECHO"]
    assert wire == (
        b"+OK\r\n+OK\r\n$256\r\n" + VALUE + b"\r\n+HIT\r\n+PONG\r\n$1\r\nx\r\n"
        b"+OK\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n*3\r\n+OK\r\n$1\r\n1\r\n$1\r\ny\r\n"
    )


def test_reads_scanned_in_place_survive_the_scratch_buffer_being_reused(
    tmp_path: Path,
) -> None:
    """The connection's scratch buffer is refilled by the next read: commands scanned
    from it are copies, and the unfinished tail is kept."""

    async def body() -> None:
        conn, t = connect(tmp_path)
        assert isinstance(conn, Connection) and isinstance(t, FakeTransport)
        wire = frame(b"SET", b"a", b"1") + frame(b"SET", b"b", b"2") + frame(b"GET", b"a")
        cut = len(wire) - 5
        for part in (wire[:cut], wire[cut:]):
            buf = conn.get_buffer(len(part))
            buf[: len(part)] = part
            conn.buffer_updated(len(part))
            buf[: len(part)] = b"\xff" * len(part)  # the next read overwrites it
        assert bytes(t.written) == b"+OK\r\n+OK\r\n$1\r\n1\r\n"

    asyncio.run(body())
