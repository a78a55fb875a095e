"""Streams beyond the oracle's sequences: XREAD and XREADGROUP with BLOCK (woken by
another connection's XADD, in arrival order, after the EXEC or script that added, the
null array on timeout, at once inside EXEC), keyspace notifications and XINFO STREAM
FULL against redis-server, WATCH, ``--maxmemory`` and the memory estimate against
tracemalloc, the log and snapshot format of every change, a restart (snapshot plus
log) and a kill -9 that keeps an acknowledged XADD."""

from __future__ import annotations

import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from pion.config import ServerConfig
from pion.keyspace import KeyMutation, Keyspace, StreamChange
from pion.keyspace.streamops import (
    Ack,
    Claim,
    ConsumerCreate,
    ConsumerDelete,
    Deliver,
    GroupCreate,
    GroupDestroy,
    GroupSetId,
    StreamAdd,
    StreamCreate,
    StreamDelete,
    StreamEntries,
    StreamSetId,
    StreamTrim,
)
from pion.keyspace.streams import create_group, deliver, xadd
from pion.persistence import keyspace_format as kf
from pion.server.run import ServerThread
from support import data_budget
from support.keyspace import RawClient, RedisServer, read_reply

Spawn = Callable[..., Any]


@pytest.fixture(scope="module")
def oracle(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    srv = RedisServer(tmp_path_factory.mktemp("redis"))
    yield srv
    srv.stop()


class Blocked(threading.Thread):
    """One client running one blocking command on its own connection."""

    def __init__(self, port: int, *cmd: Any) -> None:
        super().__init__(daemon=True)
        self.r = redis.Redis(port=port, socket_timeout=30)
        self.r.ping()  # connected before it blocks: arrival order is ours
        self.cmd = cmd
        self.result: Any = "not yet"

    def run(self) -> None:
        try:
            self.result = self.r.execute_command(*self.cmd)
        except redis.ResponseError as exc:
            self.result = str(exc)


def _blocked_now(port: int) -> int:
    return int(redis.Redis(port=port).info("clients")["blocked_clients"])


def _blocked(port: int, *cmd: Any) -> Blocked:
    """Start ``cmd`` on its own client and return once the server has it waiting."""
    before = _blocked_now(port)
    t = Blocked(port, *cmd)
    t.start()
    deadline = time.monotonic() + 10
    while _blocked_now(port) <= before:
        assert time.monotonic() < deadline, "never blocked"
        time.sleep(0.01)
    return t


def test_xread_block_is_woken_by_another_connections_xadd(server: ServerThread) -> None:
    r = redis.Redis(port=server.port)
    r.xadd("s", {"old": "1"}, id="1-1")
    waiter = _blocked(server.port, "XREAD", "BLOCK", "0", "STREAMS", "s", "other", "$", "$")
    r.xadd("other", {"f": "v"}, id="5-1")
    waiter.join(5)
    assert waiter.result == [[b"other", [(b"5-1", {b"f": b"v"})]]]


def test_xread_block_times_out_with_the_null_array(server: ServerThread) -> None:
    raw = RawClient(server.port)
    started = time.monotonic()
    assert raw.call("XREAD", "BLOCK", "150", "STREAMS", "s", "$").raw == b"*-1\r\n"
    assert time.monotonic() - started >= 0.14
    raw.call("XGROUP", "CREATE", "s", "g", "$", "MKSTREAM")
    assert raw.call("XREADGROUP", "GROUP", "g", "c", "BLOCK", "50", "STREAMS", "s", ">").raw == (
        b"*-1\r\n"
    )
    raw.call("HELLO", "3")
    assert raw.call("XREAD", "BLOCK", "50", "STREAMS", "s", "$").raw == b"_\r\n"
    raw.close()


def test_group_readers_are_served_in_arrival_order(server: ServerThread) -> None:
    r = redis.Redis(port=server.port)
    r.xgroup_create("s", "g", id="$", mkstream=True)
    cmd = ("XREADGROUP", "GROUP", "g")
    first = _blocked(server.port, *cmd, "c1", "COUNT", "1", "BLOCK", "0", "STREAMS", "s", ">")
    second = _blocked(server.port, *cmd, "c2", "COUNT", "1", "BLOCK", "0", "STREAMS", "s", ">")
    r.xadd("s", {"n": "1"}, id="1-1")
    first.join(5)
    assert first.result == [[b"s", [(b"1-1", {b"n": b"1"})]]]
    assert second.result == "not yet"
    r.xadd("s", {"n": "2"}, id="2-1")
    second.join(5)
    assert second.result == [[b"s", [(b"2-1", {b"n": b"2"})]]]
    pending = r.xpending_range("s", "g", "-", "+", 10)
    assert [(p["message_id"], p["consumer"]) for p in pending] == [
        (b"1-1", b"c1"),
        (b"2-1", b"c2"),
    ]


def test_a_blocked_group_reader_ends_when_its_group_or_key_goes(server: ServerThread) -> None:
    r = redis.Redis(port=server.port)
    r.xgroup_create("s", "g", id="$", mkstream=True)
    cmd = ("XREADGROUP", "GROUP", "g", "c", "BLOCK", "0", "STREAMS", "s", ">")
    waiter = _blocked(server.port, *cmd)
    r.xgroup_destroy("s", "g")
    waiter.join(5)
    assert waiter.result == "NOGROUP the consumer group this client was blocked on no longer exists"
    r.xgroup_create("s", "g", id="$")
    reader = _blocked(server.port, "XREAD", "BLOCK", "0", "STREAMS", "s", "$")
    waiter = _blocked(server.port, *cmd)
    r.delete("s")
    waiter.join(5)
    assert waiter.result == "UNBLOCKED the stream key no longer exists"
    assert reader.result == "not yet"  # XREAD keeps waiting, as in Redis
    r.xadd("s", {"a": "1"}, id="1-1")
    reader.join(5)
    assert reader.result == [[b"s", [(b"1-1", {b"a": b"1"})]]]


def test_woken_after_the_exec_and_the_script_that_add(server: ServerThread) -> None:
    r = redis.Redis(port=server.port)
    waiter = _blocked(server.port, "XREAD", "BLOCK", "0", "STREAMS", "s", "$")
    with r.pipeline(transaction=True) as p:
        p.xadd("s", {"a": "1"}, id="1-1")
        p.xlen("s")
        p.xadd("s", {"b": "2"}, id="2-1")
        assert p.execute() == [b"1-1", 1, b"2-1"]
    waiter.join(5)
    # Served once the EXEC ended: both entries are there by then.
    assert waiter.result == [[b"s", [(b"1-1", {b"a": b"1"}), (b"2-1", {b"b": b"2"})]]]
    waiter = _blocked(server.port, "XREAD", "BLOCK", "0", "STREAMS", "s", "$")
    r.eval("redis.call('XADD', KEYS[1], '3-1', 'c', '3'); return 1", 1, "s")
    waiter.join(5)
    assert waiter.result == [[b"s", [(b"3-1", {b"c": b"3"})]]]


def test_a_script_may_not_block(oracle: RedisServer, server: ServerThread) -> None:
    script = "return redis.pcall('xread', 'BLOCK', '0', 'STREAMS', KEYS[1], '$')"
    replies = [
        RawClient(port).call("EVAL", script, "1", "s").raw for port in (oracle.port, server.port)
    ]
    assert (
        replies[0]
        == replies[1]
        == (b"-ERR xread command is not allowed with BLOCK option from scripts\r\n")
    )


def test_inside_exec_a_blocking_read_answers_at_once(server: ServerThread) -> None:
    r = redis.Redis(port=server.port)
    with r.pipeline(transaction=True) as p:
        p.execute_command("XREAD", "BLOCK", "0", "STREAMS", "s", "0")
        p.xadd("s", {"a": "1"}, id="1-1")
        p.execute_command("XREAD", "BLOCK", "0", "STREAMS", "s", "0")
        assert p.execute() == [[], b"1-1", [[b"s", [(b"1-1", {b"a": b"1"})]]]]
    raw = RawClient(server.port)  # the first is the null array, as a timeout's
    raw.call("MULTI")
    raw.call("XREAD", "BLOCK", "0", "STREAMS", "empty", "0")
    raw.call("XREADGROUP", "GROUP", "g", "c", "BLOCK", "0", "STREAMS", "s", ">")
    assert raw.call("EXEC").raw.startswith(b"*2\r\n*-1\r\n-NOGROUP")
    raw.close()


def _events(port: int, commands: list[list[str]]) -> list[list[bytes]]:
    actor, sub = RawClient(port), RawClient(port)
    try:
        actor.call("FLUSHALL")
        sub.call("PSUBSCRIBE", "__key*__:*")
        actor.call("CONFIG", "SET", "notify-keyspace-events", "KEA")
        out = []
        for i, cmd in enumerate(commands):
            step = [actor.call(*cmd).raw]
            sub.send("PING", b"s%d" % i)
            while (reply := read_reply(sub.f)).value != [b"pong", b"s%d" % i]:
                step.append(reply.raw)
            out.append(step)
        return out
    finally:
        actor.call("CONFIG", "SET", "notify-keyspace-events", "")
        actor.close()
        sub.close()


_NOTIFYING = [
    ["XADD", "s", "1-1", "a", "1"],
    ["XADD", "s", "MAXLEN", "1", "2-1", "b", "2"],
    ["XADD", "s", "3-1", "c", "3"],
    ["XDEL", "s", "3-1", "9-9"],
    ["XDEL", "s", "9-9"],
    ["XTRIM", "s", "MAXLEN", "0"],
    ["XTRIM", "s", "MAXLEN", "0"],
    ["XSETID", "s", "5-5"],
    ["XGROUP", "CREATE", "s", "g", "0"],
    ["XGROUP", "CREATE", "new", "g", "$", "MKSTREAM"],
    ["XGROUP", "SETID", "s", "g", "0"],
    ["XGROUP", "CREATECONSUMER", "s", "g", "c"],
    ["XGROUP", "CREATECONSUMER", "s", "g", "c"],
    ["XADD", "s", "6-1", "d", "4"],
    ["XREADGROUP", "GROUP", "g", "c2", "STREAMS", "s", ">"],
    ["XREADGROUP", "GROUP", "g", "c3", "STREAMS", "s", "0"],
    ["XCLAIM", "s", "g", "c4", "0", "6-1"],
    ["XAUTOCLAIM", "s", "g", "c5", "0", "0"],
    ["XACK", "s", "g", "6-1"],
    ["XGROUP", "DELCONSUMER", "s", "g", "c"],
    ["XGROUP", "DELCONSUMER", "s", "g", "nobody"],
    ["XGROUP", "DESTROY", "s", "g"],
    ["XGROUP", "DESTROY", "s", "g"],
    ["XADD", "s", "NOMKSTREAM", "7-1", "e", "5"],
    ["XADD", "nokey", "NOMKSTREAM", "7-1", "e", "5"],
]


def test_notifications_match_redis(oracle: RedisServer, server: ServerThread) -> None:
    assert _events(server.port, _NOTIFYING) == _events(oracle.port, _NOTIFYING)


def _zero_times(value: Any) -> Any:
    """XINFO STREAM FULL with its clock readings (seen-time, delivery times) and
    radix-tree-nodes zeroed."""
    if isinstance(value, list):
        out = []
        for i, v in enumerate(value):
            prev = value[i - 1] if i else None
            timed = prev in (b"seen-time", b"radix-tree-nodes")
            out.append(0 if timed else _zero_times(v))
        if len(out) in (3, 4) and isinstance(out[0], bytes) and b"-" in out[0]:
            out[-2] = 0  # a pending entry: [id, (consumer,) delivery time, count]
        return out
    return value


def test_xinfo_stream_full_matches_redis(oracle: RedisServer, server: ServerThread) -> None:
    script = [
        *[["XADD", "s", f"{i}-1", "f", str(i)] for i in range(1, 13)],
        ["XDEL", "s", "4-1"],
        ["XGROUP", "CREATE", "s", "g", "0"],
        ["XGROUP", "CREATE", "s", "a", "$"],
        ["XREADGROUP", "GROUP", "g", "c1", "COUNT", "3", "STREAMS", "s", ">"],
        ["XREADGROUP", "GROUP", "g", "c2", "COUNT", "2", "STREAMS", "s", ">"],
    ]
    replies = []
    for port in (oracle.port, server.port):
        c = RawClient(port)
        c.call("FLUSHALL")
        for cmd in script:
            c.call(*cmd)
        replies.append(
            [
                _zero_times(c.call("XINFO", "STREAM", "s", "FULL").value),
                _zero_times(c.call("XINFO", "STREAM", "s", "FULL", "COUNT", "2").value),
                _zero_times(c.call("XINFO", "STREAM", "s", "FULL", "COUNT", "0").value),
            ]
        )
        c.close()
    assert replies[0] == replies[1]


def test_watch_sees_stream_changes(server: ServerThread) -> None:
    r = redis.Redis(port=server.port)
    other = redis.Redis(port=server.port)
    r.xadd("s", {"a": "1"}, id="1-1")
    r.xgroup_create("s", "g", id="0")
    for change in (
        lambda: other.xadd("s", {"b": "2"}),
        lambda: other.xreadgroup("g", "c", {"s": ">"}),
        lambda: other.xack("s", "g", "1-1"),
        lambda: other.xtrim("s", maxlen=0),
    ):
        with r.pipeline() as p:
            p.watch("s")
            change()
            p.multi()
            p.xlen("s")
            with pytest.raises(redis.WatchError):
                p.execute()


def test_xadd_answers_oom_past_maxmemory(server_factory: Callable[..., ServerThread]) -> None:
    srv = server_factory()
    r = redis.Redis(port=srv.port)
    data_budget(r, 200_000)
    r.xadd("s", {"f": b"x" * 150_000})
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        r.xadd("s", {"f": b"y" * 100_000})
    assert r.xlen("s") == 1
    usage = r.memory_usage("s")
    assert usage is not None and 150_000 < usage < 151_000
    r.xtrim("s", maxlen=0)  # freeing makes room again
    assert r.xadd("s", {"f": b"y" * 100_000})


_EVERY_CHANGE = [
    StreamCreate(4_000_000_000_000),
    StreamAdd((1, 2), (b"f", b"\x00" * 70_000), None),
    StreamAdd((3, 4), (b"f", b"v"), (3, 0)),
    StreamTrim((3, 4)),
    StreamDelete(((3, 4), (5, 6))),
    StreamSetId((9, 9), 12, (4, 4)),
    StreamEntries((((10, 1), (b"a", b"b")), ((11, 0), (b"c", b"")))),
    GroupCreate(b"g", (0, 0), -1),
    GroupSetId(b"g", (10, 1), 3),
    ConsumerCreate(b"g", b"c", 1_700_000_000_000),
    Deliver(b"g", b"c", 1_700_000_000_001, ((10, 1), (11, 0)), (11, 0), 4, False),
    Ack(b"g", ((10, 1),)),
    Claim(b"g", b"d", (((11, 0), 1_700_000_000_002, 3),), ((10, 1),), (12, 0)),
    Claim(b"g", b"d", (), (), None),
    ConsumerDelete(b"g", b"c"),
    GroupDestroy(b"g"),
]


def test_every_stream_change_round_trips_through_the_log_format() -> None:
    for change in _EVERY_CHANGE:
        m = StreamChange(b"key", change)
        op, parts = kf.encode(m)
        payload = b"".join(bytes(p) for p in parts)
        assert kf.decode(op, payload) == m
        assert kf.describe(op, payload) == "STREAM"


def _replayed(records: list[KeyMutation]) -> Keyspace:
    ks = Keyspace()
    for m in records:
        op, parts = kf.encode(m)
        ks.apply(kf.decode(op, b"".join(bytes(p) for p in parts)))
    return ks


def test_a_snapshot_of_a_stream_rebuilds_it() -> None:
    records: list[KeyMutation] = [StreamChange(b"s", c) for c in _EVERY_CHANGE[:-2]]
    ks = _replayed(records)
    again = _replayed(list(ks.dump()))
    for a, b in ((ks, again),):
        sa, sb = a.lookup(b"s"), b.lookup(b"s")
        assert repr(_shape(sa)) == repr(_shape(sb))
    assert ks.used_bytes == again.used_bytes


def _shape(s: Any) -> Any:
    groups = {
        name: (
            g.last_id,
            g.entries_read,
            {i: (p.consumer, p.time, p.count) for i, p in sorted(g.pel.items())},
            {c: (v.seen, sorted(v.pending)) for c, v in sorted(g.consumers.items())},
        )
        for name, g in sorted(s.groups.items())
    }
    nodes = [(n.ids, n.live) for n in s.nodes]
    return s.ids, s.entries, s.last_id, s.entries_added, s.max_deleted, nodes, groups


def _fill(r: redis.Redis) -> None:
    for i in range(1, 151):
        r.xadd("s", {"n": str(i)}, id=f"{i}-0")
    r.xdel("s", "7-0")
    r.xgroup_create("s", "g", id="0")
    r.xreadgroup("g", "c1", {"s": ">"}, count=5)
    r.xreadgroup("g", "c2", {"s": ">"}, count=2, noack=True)
    r.xack("s", "g", "1-0")
    r.xclaim("s", "g", "c3", 0, ["2-0"])
    r.xgroup_create("t", "empty", id="$", mkstream=True)
    r.expire("t", 1000)


def _observe(r: redis.Redis) -> Any:
    return [
        r.xrange("s"),
        r.xinfo_stream("s"),
        r.xinfo_groups("s"),
        [(c["name"], c["pending"]) for c in r.xinfo_consumers("s", "g")],
        [
            (p["message_id"], p["consumer"], p["times_delivered"])
            for p in r.xpending_range("s", "g", "-", "+", 100)
        ],
        r.xinfo_groups("t"),
        r.type("t"),
    ]


def test_a_restart_keeps_streams_and_groups(tmp_path: Path) -> None:
    config = ServerConfig(port=0, dir=tmp_path)
    srv = ServerThread(config).start()
    r = redis.Redis(port=srv.port)
    _fill(r)
    assert r.execute_command("KV.PREFIX.SAVE") == b"OK"  # a snapshot, then the log
    r.xadd("s", {"n": "after"}, id="200-0", maxlen=100, approximate=True)
    r.xreadgroup("g", "c1", {"s": ">"}, count=1)
    before = _observe(r)
    srv.stop()
    srv = ServerThread(config).start()
    r = redis.Redis(port=srv.port)
    assert _observe(r) == before
    assert 990 < r.ttl("t") <= 1000
    srv.stop()


def test_kill9_loses_no_acknowledged_xadd(spawn_server: Spawn) -> None:
    srv = spawn_server("--appendfsync", "always")
    r = srv.client()
    _fill(r)
    before = _observe(r)
    acknowledged = r.xadd("s", {"n": "last"})  # an id from the clock, logged as it came
    srv.kill()
    r2 = spawn_server("--appendfsync", "always").client()
    assert r2.xrange("s", "-", "+")[-1] == (acknowledged, {b"n": b"last"})
    after = _observe(r2)
    assert after[3:] == before[3:]  # the groups' lag grew by the entry
    assert r2.xinfo_stream("s")["last-generated-id"] == acknowledged


def test_stream_accounting_tracks_real_memory() -> None:
    """used_bytes stays within 2x of what tracemalloc sees for a stream of small entries
    with a group whose PEL holds half of them (the overheads of streamtype.py)."""
    ks = Keyspace()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(1, 20_001):
        fields = (bytes(bytearray(b"field")), bytes(bytearray(b"v:%08d" % i)))
        xadd(ks, b"s", fields, (i, 0), True, nomkstream=False, trim=None)
    create_group(ks, b"s", b"g", last=(0, 0), read=0, mkstream=False)
    deliver(ks, b"s", b"g", b"consumer", count=10_000, noack=False)
    real = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert 0.5 < ks.used_bytes / real < 2.0, (ks.used_bytes, real)


def _node_script() -> list[list[str]]:
    """Streams of several listpack nodes (100 entries or 4096 bytes each), trimmed with
    ``~`` (whole nodes only), with LIMIT, and exactly, around XDEL's tombstones."""
    script = [["XADD", "s", f"{i}-0", "f", "v" * (i % 7)] for i in range(1, 251)]
    script += [["XADD", "big", f"{i}-0", "f", "x" * 300] for i in range(1, 41)]
    ms = 1_700_000_000_000
    for i in range(1, 120):  # clock-like ids, integer values, changing field names
        fields = ["f", str(i * 997)] if i % 3 else ["g", "a" * (i % 70), "h", str(-i)]
        script.append(["XADD", "mixed", f"{ms + i * 1_000}-{i % 4}", *fields])
    script += [["XADD", "huge", f"{i}-0", "f", "z" * (1000 * i)] for i in range(1, 8)]
    script += [
        ["XDEL", "s", "5-0", "150-0"],
        ["XTRIM", "s", "MAXLEN", "~", "180"],
        ["XTRIM", "s", "MINID", "~", "160"],
        ["XTRIM", "s", "MAXLEN", "~", "10", "LIMIT", "50"],
        ["XADD", "s", "MAXLEN", "~", "50", "300-0", "a", "b"],
        ["XTRIM", "s", "MAXLEN", "55"],
        ["XTRIM", "s", "MAXLEN", "~", "20"],
        ["XTRIM", "big", "MAXLEN", "~", "20"],
        ["XADD", "big", "MINID", "~", "30", "50-0", "f", "y"],
        ["XTRIM", "mixed", "MAXLEN", "~", "30"],
        ["XTRIM", "mixed", "MINID", "~", str(ms + 100_000)],
        ["XTRIM", "huge", "MAXLEN", "~", "2"],
    ]
    return script


def test_approximate_trimming_removes_the_nodes_redis_removes(
    oracle: RedisServer, server: ServerThread
) -> None:
    transcripts = []
    for port in (oracle.port, server.port):
        c = RawClient(port)
        c.call("FLUSHALL")
        out = []
        for cmd in _node_script():
            out.append(c.call(*cmd).raw)
            if cmd[0] != "XADD" or cmd[2] in ("MAXLEN", "MINID"):
                for key in ("s", "big", "mixed", "huge"):
                    out.append(_zero_times(c.call("XINFO", "STREAM", key).value))
        transcripts.append(out)
        c.close()
    assert transcripts[0] == transcripts[1]
