"""HyperLogLog (PFADD, PFCOUNT, PFMERGE), BITFIELD/BITFIELD_RO and LCS against a real
redis-server 7.0, byte for byte in RESP2 and RESP3: hypothesis sequences of PFADD,
PFMERGE and PFCOUNT comparing every reply and the HLL's bytes (``GET``), BITFIELD
sequences, LCS with every option (also cut into many steps); values copied from
redis-server; the errors. Then what only Pion has: another client served during a
long LCS, the log (kill -9, restart), ``--maxmemory``, WATCH and notifications.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pion.commands import lcs
from pion.config import ServerConfig
from pion.server.run import ServerThread
from support import ServerProcess, data_budget, encode_command
from support.keyspace import RawClient, RedisServer

Pair = tuple[RawClient, RawClient]


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    work = tmp_path_factory.mktemp("families")
    oracle = RedisServer(work)
    pion = ServerThread(ServerConfig(port=0, dir=work / "pion", appendfsync="no")).start()
    pair = RawClient(oracle.port), RawClient(pion.port)
    yield pair
    for c in pair:
        c.close()
    pion.stop()
    oracle.stop()


def _check(pair: Pair, *cmd: Any) -> bytes:
    want, got = (c.call(*cmd) for c in pair)
    assert want.raw == got.raw, (cmd, want.raw[:300], got.raw[:300])
    return got.raw


def _both(pair: Pair, *cmd: Any) -> None:
    for c in pair:
        c.call(*cmd)


_SETTINGS = settings(
    max_examples=60,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)

# --- HyperLogLog ------------------------------------------------------------------------

_KEYS = ("h1", "h2", "h3")
_elements = st.lists(st.integers(0, 5000).map(lambda i: b"e%d" % i), max_size=12)
_hll_op = st.one_of(
    st.tuples(st.just("PFADD"), st.sampled_from(_KEYS), _elements),
    # Enough elements at once to pass 3000 sparse bytes and go dense.
    st.tuples(st.just("PFADD-MANY"), st.sampled_from(_KEYS), st.integers(1, 4000)),
    st.tuples(st.just("PFMERGE"), st.sampled_from(_KEYS), st.lists(st.sampled_from(_KEYS))),
    st.tuples(st.just("PFCOUNT"), st.sampled_from(_KEYS), st.lists(st.sampled_from(_KEYS))),
)


@_SETTINGS
@given(ops=st.lists(_hll_op, min_size=1, max_size=12), proto=st.sampled_from(["2", "3"]))
def test_hll_sequences_match_redis(servers: Pair, ops: list[Any], proto: str) -> None:
    _both(servers, "HELLO", proto)
    _both(servers, "FLUSHALL")
    for name, key, extra in ops:
        if name == "PFADD-MANY":
            _check(servers, "PFADD", key, *[b"m%d" % i for i in range(extra)])
        elif name == "PFCOUNT":
            _check(servers, "PFCOUNT", key, *extra)
        else:
            _check(servers, name, key, *extra)
        _check(servers, "GET", key)


@pytest.mark.parametrize("max_bytes", ["0", "40", "500", "3000"])
def test_hll_sparse_max_bytes_matches_redis(servers: Pair, max_bytes: str) -> None:
    _both(servers, "FLUSHALL")
    _check(servers, "CONFIG", "SET", "hll-sparse-max-bytes", max_bytes)
    _check(servers, "CONFIG", "GET", "hll-sparse-max-bytes")
    for n in (1, 30, 200):
        _check(servers, "PFADD", "k", *[b"x%d" % i for i in range(n)])
        _check(servers, "GET", "k")
        _check(servers, "PFCOUNT", "k")
        _check(servers, "GET", "k")
    _check(servers, "PFMERGE", "m", "k")
    _check(servers, "GET", "m")
    _both(servers, "CONFIG", "SET", "hll-sparse-max-bytes", "3000")


def test_hll_values_copied_from_redis_count_and_grow_here(servers: Pair) -> None:
    oracle, pion = servers
    _both(servers, "FLUSHALL")
    for key, n, counted in (("sparse", 300, False), ("dense", 20_000, False), ("c", 9, True)):
        oracle.call("PFADD", key, *[b"v%d" % i for i in range(n)])
        if counted:  # a valid cached count: answered from the header
            oracle.call("PFCOUNT", key)
        value = oracle.call("GET", key).raw.split(b"\r\n", 1)[1][:-2]
        pion.call("SET", key, value)
        _check(servers, "PFCOUNT", key)  # the stale cache: computed here
        _check(servers, "GET", key)
        _check(servers, "PFADD", key, *[b"w%d" % i for i in range(500)])
        _check(servers, "GET", key)
        _check(servers, "PFCOUNT", key, "sparse")
    _check(servers, "PFMERGE", "both", "sparse", "dense")
    _check(servers, "GET", "both")


def test_hll_errors_match_redis(servers: Pair) -> None:
    _both(servers, "FLUSHALL")
    _both(servers, "SET", "plain", "hello")
    _both(servers, "SET", "number", "12345")
    _both(servers, "SET", "dense-short", b"HYLL\x00" + bytes(11) + bytes(100))
    _both(servers, "SET", "encoding", b"HYLL\x02" + bytes(11) + b"\x7f\xff")
    # Sparse opcodes covering 16383 registers, or none at all.
    _both(servers, "SET", "short", b"HYLL\x01" + bytes(10) + b"\x80\x7f\xfe")
    _both(servers, "SET", "empty", b"HYLL\x01" + bytes(11))
    _both(servers, "RPUSH", "list", "x")
    _check(servers, "PFADD", "ok", "a")
    for key in ("plain", "number", "dense-short", "encoding", "short", "empty", "list"):
        _check(servers, "PFCOUNT", key)
        _check(servers, "PFCOUNT", "ok", key)
        _check(servers, "PFMERGE", "dest", "ok", key)
        _check(servers, "PFMERGE", key, "ok")
        _check(servers, "GET", "dest")
    _check(servers, "PFADD", "plain", "a")
    _check(servers, "PFADD", "list", "a")
    _check(servers, "PFADD", "empty", "a")
    for cmd in ("PFADD", "PFCOUNT", "PFMERGE"):
        _check(servers, cmd)


# --- BITFIELD ---------------------------------------------------------------------------

_width = st.one_of(
    st.sampled_from([1, 7, 8, 9, 15, 16, 31, 32, 33, 62, 63, 64]), st.integers(1, 64)
)
_type = st.one_of(
    st.tuples(st.sampled_from("iu"), _width).map(lambda t: f"{t[0]}{t[1]}"),
    st.sampled_from(["u64", "i65", "i0", "x8", "I8", "i", "u-1"]),
)
_offset = st.one_of(
    st.integers(0, 90).map(str),
    st.integers(0, 9).map(lambda i: f"#{i}"),
    st.sampled_from(["-1", "#-1", "x", "4294967296", "#9223372036854775807"]),
)
_value = st.one_of(
    st.sampled_from([0, 1, -1, 127, -128, 255, 256, 2**62, 2**63 - 1, -(2**63)]),
    st.integers(-1000, 1000),
).map(str)
_subop = st.one_of(
    st.tuples(st.just("GET"), _type, _offset),
    st.tuples(st.sampled_from(["SET", "INCRBY", "incrby"]), _type, _offset, _value),
    st.tuples(st.just("OVERFLOW"), st.sampled_from(["WRAP", "SAT", "FAIL", "sat", "bad"])),
)


@_SETTINGS
@given(
    calls=st.lists(
        st.tuples(st.sampled_from(["BITFIELD", "BITFIELD", "BITFIELD_RO"]), st.lists(_subop)),
        min_size=1,
        max_size=8,
    ),
    proto=st.sampled_from(["2", "3"]),
)
def test_bitfield_sequences_match_redis(servers: Pair, calls: list[Any], proto: str) -> None:
    _both(servers, "HELLO", proto)
    _both(servers, "FLUSHALL")
    _both(servers, "SET", "b", b"\x81\x42\xff\x00\x10")
    for name, subops in calls:
        for key in ("b", "new"):
            _check(servers, name, key, *[arg for op in subops for arg in op])
            _check(servers, "GET", key)


def test_bitfield_errors_match_redis(servers: Pair) -> None:
    _both(servers, "FLUSHALL")
    _both(servers, "RPUSH", "list", "x")
    _check(servers, "BITFIELD", "list")
    _check(servers, "BITFIELD", "list", "GET", "u8", "0")
    _check(servers, "BITFIELD", "list", "SET", "u8", "0", "1")
    _check(servers, "BITFIELD_RO", "list", "GET", "u8", "0")
    _check(servers, "BITFIELD_RO", "missing", "SET", "u8", "0", "1")
    _check(servers, "BITFIELD", "missing", "OVERFLOW", "FAIL", "INCRBY", "u2", "100", "9")
    _check(servers, "GET", "missing")  # created by the write that failed
    for args in (["GET"], ["GET", "u8"], ["SET", "u8", "0"], ["OVERFLOW"], ["INCRBY", "u8"]):
        _check(servers, "BITFIELD", "k", *args)
    _check(servers, "BITFIELD")


# --- LCS --------------------------------------------------------------------------------

_text = st.text(alphabet="abc", max_size=40)
_lcs_opt = st.sampled_from(
    [["IDX"], ["LEN"], ["WITHMATCHLEN"], ["MINMATCHLEN", "2"], ["MINMATCHLEN", "-1"], ["idx"]]
)


@_SETTINGS
@given(
    a=st.one_of(st.none(), _text),
    b=st.one_of(st.none(), _text),
    opts=st.lists(_lcs_opt, max_size=3),
    proto=st.sampled_from(["2", "3"]),
    stepped=st.booleans(),
)
def test_lcs_matches_redis(
    servers: Pair,
    monkeypatch: pytest.MonkeyPatch,
    *,
    a: str | None,
    b: str | None,
    opts: list[list[str]],
    proto: str,
    stepped: bool,
) -> None:
    if stepped:  # (the server runs in this process) many steps on short strings
        monkeypatch.setattr(lcs, "STEP_CELLS", 5)
        monkeypatch.setattr(lcs, "STEP_WALK", 3)
    _both(servers, "HELLO", proto)
    _both(servers, "FLUSHALL")
    for key, value in (("a", a), ("b", b)):
        if value is not None:
            _both(servers, "SET", key, value)
    _check(servers, "LCS", "a", "b", *[w for opt in opts for w in opt])


def test_lcs_long_strings_and_errors_match_redis(servers: Pair) -> None:
    _both(servers, "HELLO", "3")
    _both(servers, "FLUSHALL")
    _both(servers, "SET", "x", "ohmytext")
    _both(servers, "SET", "y", "mynewtext")
    _check(servers, "LCS", "x", "y", "IDX", "MINMATCHLEN", "4", "WITHMATCHLEN")
    _both(servers, "SET", "r1", bytes(range(256)) * 12)
    _both(servers, "SET", "r2", bytes(range(255, -1, -3)) * 30)
    _check(servers, "LCS", "r1", "r2", "IDX", "WITHMATCHLEN")
    _check(servers, "LCS", "r1", "r2")
    _both(servers, "SET", "big1", "a" * 12_000)
    _both(servers, "SET", "big2", "b" * 12_000)
    _check(servers, "LCS", "big1", "big2")  # a table past proto-max-bulk-len
    _both(servers, "RPUSH", "list", "x")
    _check(servers, "LCS", "x", "list")
    _check(servers, "LCS", "x", "y", "LEN", "IDX")
    _check(servers, "LCS", "x", "y", "MINMATCHLEN")
    _check(servers, "LCS", "x", "y", "MINMATCHLEN", "x")
    _check(servers, "LCS", "x", "y", "BAD")
    _check(servers, "LCS", "x")
    _both(servers, "HELLO", "2")


def _ping(sock: socket.socket) -> None:
    sock.sendall(encode_command("PING"))
    got = b""
    while not got.endswith(b"\r\n"):
        chunk = sock.recv(64)
        assert chunk, "server closed the probe"
        got += chunk
    assert got == b"+PONG\r\n"


def test_another_client_is_answered_during_a_long_lcs(tmp_path: Any) -> None:
    srv = ServerThread(ServerConfig(port=0, dir=tmp_path, appendfsync="no")).start()
    try:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=60) as long:
            long.sendall(encode_command("SET", "a", "ab" * 2000))
            long.recv(64)
            long.sendall(encode_command("SET", "b", "ba" * 2000))
            long.recv(64)
            waits: list[float] = []
            done = threading.Event()

            def probe() -> None:
                with socket.create_connection(("127.0.0.1", srv.port), timeout=60) as p:
                    while not done.is_set():
                        t0 = time.monotonic()
                        _ping(p)
                        waits.append(time.monotonic() - t0)

            t = threading.Thread(target=probe, daemon=True)
            t.start()
            while not waits:
                time.sleep(0.001)
            before = len(waits)
            start = time.monotonic()
            long.sendall(encode_command("LCS", "a", "b", "LEN"))
            got = long.recv(64)
            while not got.endswith(b"\r\n"):
                got += long.recv(64)
            took = time.monotonic() - start
            during = len(waits) - before
            done.set()
            t.join(timeout=30)
        assert got == b":3999\r\n"
        # 16 million cells in steps: the probe's PINGs were answered while it ran.
        assert during >= 5, (during, took)
        assert max(waits) < took / 2, (max(waits), took)
    finally:
        srv.stop()


# --- what only Pion has: the log, maxmemory, WATCH, notifications -----------------------

Spawn = Callable[..., ServerProcess]


def _writes(r: redis.Redis) -> None:
    r.pfadd("sparse", *[f"s{i}" for i in range(100)])
    r.expire("sparse", 100_000)
    r.pfadd("dense", *[f"d{i}" for i in range(5000)])
    r.pfadd("dense", "one more")
    r.pfcount("dense")  # stores the count in the key
    r.pfadd("shrinks", "a")
    r.pfmerge("merged", "sparse", "dense")
    r.execute_command("BITFIELD", "bf", "SET", "i5", "#3", "-7", "INCRBY", "u3", "40", "3")
    r.execute_command("BITFIELD", "bf", "OVERFLOW", "FAIL", "INCRBY", "u2", "300", "9")


def _values(r: redis.Redis) -> dict[bytes, tuple[Any, ...]]:
    return {k: (r.get(k), r.pexpiretime(k)) for k in sorted(r.keys("*"))}


def test_writes_survive_kill9_and_a_snapshot(spawn_server: Spawn) -> None:
    srv = spawn_server("--appendfsync", "always")
    r = srv.client()
    r.pfadd("before", "x", "y")
    assert r.execute_command("KV.PREFIX.SAVE") == b"OK"
    _writes(r)
    r.pfadd("before", "z")  # a key of the snapshot, changed in the tail
    r.pfadd("stale", "never counted")  # its cached count stays stale across the restart
    counts = {k: r.pfcount(k) for k in (b"sparse", b"dense", b"merged", b"before")}
    before = _values(r)
    assert len(before[b"dense"][0] or b"") == 12304 and before[b"sparse"][1] > 0
    srv.kill()
    r2 = spawn_server("--appendfsync", "always").client()
    assert _values(r2) == before
    assert {k: r2.pfcount(k) for k in counts} == counts


def test_growth_answers_oom_past_maxmemory(server_factory: Callable[..., ServerThread]) -> None:
    srv = server_factory()
    r = redis.Redis(port=srv.port)
    data_budget(r, 200_000)
    r.pfadd("h", "a")
    r.pfadd("dense", *[f"e{i}" for i in range(5000)])
    r.set("filler", b"x" * 180_000)
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        r.pfadd("h", *[f"e{i}" for i in range(5000)])  # would go dense: 12 KB more
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        r.pfmerge("new", "dense")
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        r.execute_command("BITFIELD", "bf", "SET", "u8", "200000", "1")
    assert r.pfcount("h") == 1 and r.exists("new", "bf") == 0
    assert r.execute_command("BITFIELD", "h", "GET", "u8", "0") == [ord("H")]
    r.close()


def test_watch_sees_pfadd_pfmerge_bitfield_and_a_stored_count(servers: Pair) -> None:
    """As redis-server: each of these aborts a transaction watching its key, and so
    does a PFCOUNT that stores a recomputed count; a cached count changes nothing."""
    ports = [c.sock.getpeername()[1] for c in servers]
    changes = [
        ("PFADD", "w", "new"),
        ("PFMERGE", "w"),
        ("BITFIELD", "w", "OVERFLOW", "FAIL", "INCRBY", "u2", "0", "9"),
        ("PFCOUNT", "w"),  # stale after the write above: stored
        ("PFCOUNT", "w"),  # cached: nothing changes
        ("PFADD", "w", "new"),  # already counted: nothing changes
    ]
    for port in ports:
        watcher, other = RawClient(port), RawClient(port)
        watcher.call("FLUSHALL")
        watcher.call("PFADD", "w", "a")
        replies = []
        for change in changes:
            watcher.call("WATCH", "w")
            watcher.call("MULTI")
            watcher.call("PING")
            other.call(*change)
            replies.append(watcher.call("EXEC").raw)
        watcher.close()
        other.close()
        if port == ports[0]:
            want = replies
    assert replies == want
    assert replies[-2:] == [b"*1\r\n+PONG\r\n"] * 2 and replies[0] == b"*-1\r\n"


def test_notifications_are_redis_events(server: ServerThread) -> None:
    r = redis.Redis(port=server.port)
    r.config_set("notify-keyspace-events", "E$")
    p = r.pubsub()
    p.subscribe("__keyevent@0__:pfadd", "__keyevent@0__:setbit", "__keyevent@0__:set")
    for _ in range(3):
        p.get_message(timeout=5)
    r.pfadd("h", "a")
    r.pfadd("h", "a")  # nothing changed: no event
    r.pfcount("h")  # stores the count: no event (as Redis)
    r.pfmerge("m", "h")
    r.execute_command("BITFIELD", "bf", "GET", "u8", "0")
    r.execute_command("BITFIELD", "bf", "SET", "u8", "0", "1")
    r.set("end", "x")  # the last event: whatever was sent before it has arrived
    got = []
    while not got or got[-1][1] != b"end":
        message = p.get_message(timeout=5)
        assert message is not None
        got.append((message["channel"], message["data"]))
    assert got == [
        (b"__keyevent@0__:pfadd", b"h"),
        (b"__keyevent@0__:pfadd", b"m"),
        (b"__keyevent@0__:setbit", b"bf"),
        (b"__keyevent@0__:set", b"end"),
    ]
    p.close()
    r.close()
