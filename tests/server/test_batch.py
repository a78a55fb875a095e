"""Runs of plain GET and SET served in one call (``pion.server.batch``): the two twins
hold one contract, and a connection that serves runs answers, counts and stores
exactly what the lane alone does, in every state that makes a run leave a command or
stop altogether."""

from __future__ import annotations

import asyncio
import copy
import os
import random
from pathlib import Path
from typing import Any

import pytest

from pion.commands import plain
from pion.keyspace.entries import KEY_OVERHEAD, Entry
from pion.resp.encoder import SMALL_BULK
from pion.server import batch, connection
from support.transport import connect

compiled = pytest.mark.skipif(not plain.COMPILED, reason="the compiled twin is not built")


def frame(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%b\r\n" % (len(a), a) for a in args)


# -- the twins ------------------------------------------------------------------------------


def test_compiled_twin_is_built_where_required() -> None:
    """`make test` builds the compiled twins and sets PION_REQUIRE_SPEEDUPS, so a
    build that silently fell back to pure Python cannot pass as tested."""
    if os.environ.get("PION_REQUIRE_SPEEDUPS") == "1":
        assert plain.COMPILED, "pion.commands._plain is not built: run scripts/build-speedups"


@compiled
def test_the_compiled_constants_are_the_python_ones() -> None:
    from pion.commands import _plain  # type: ignore[attr-defined]

    assert (_plain.KEY_OVERHEAD, _plain.SMALL_BULK) == (KEY_OVERHEAD, SMALL_BULK)


def _keyspace(rng: random.Random) -> dict[bytes, Entry]:
    data: dict[bytes, Entry] = {}
    for i in range(12):
        key = b"k%d" % i
        kind = rng.choice(["str"] * 12 + ["ttl", "hash", "big", "empty"])
        value: Any = {
            "str": b"v" * rng.randrange(1, 300),
            "ttl": b"t",
            "hash": {b"f": b"v"},
            "big": b"B" * (SMALL_BULK + 1),
            "empty": b"",
        }[kind]
        size = len(key) + (len(value) if isinstance(value, bytes) else 40) + KEY_OVERHEAD
        data[key] = Entry(value, i, 5 if kind == "ttl" else 0, size, 0)
    return data


def _commands(rng: random.Random) -> list[list[bytes]]:
    names = [b"GET", b"get", b"SET", b"set"] * 6 + [b"Get", b"GETX", b"PING"]
    cmds = []
    for _ in range(rng.randrange(1, 40)):
        name = rng.choice(names)
        key = b"k%d" % rng.randrange(14)  # some missing
        if name.upper() == b"SET":
            argv = [name, key, b"x" * rng.randrange(0, 400)]
            if rng.random() < 0.1:
                argv.append(b"NX")
        else:
            argv = [name, key] if rng.random() < 0.95 else [name]
        cmds.append(argv)
    cmds.reverse()
    return cmds


def _state(data: dict[bytes, Entry]) -> dict[bytes, tuple[Any, int, int, int]]:
    return {k: (e.value, e.size, e.deadline, e.touched) for k, e in data.items()}


@compiled
def test_the_twins_serve_and_leave_the_same_commands() -> None:
    from pion.commands._plain import run as c_run  # type: ignore[import-not-found]

    rng = random.Random(7)
    served = left = 0
    for _ in range(600):
        data = _keyspace(rng)
        ready = _commands(rng)
        may_set = rng.random() < 0.8
        max_cmds = rng.choice([1, 3, 64, 64, 64])
        max_bytes = rng.choice([0, 100, 1 << 20, 1 << 20])
        results = []
        for twin in (plain.py_run, c_run):
            d, r = copy.deepcopy(data), copy.deepcopy(ready)
            out: list[bytes] = []
            slow: list[Any] = []
            res = twin(r, d, out, b"$-1\r\n", 9, may_set, max_cmds, max_bytes, -1, slow)
            # The microseconds are each twin's own (fields 6 and 7).
            results.append((res[:6], res[8], out, r, _state(d), slow))
        assert results[0] == results[1]
        (ran, nbytes, gets, hits, sets, grow), _, out, rest, after, _ = results[0]
        assert ran == len(out) == len(ready) - len(rest) == gets + sets and hits <= gets
        assert nbytes == sum(map(len, out))
        before = _state(data)
        assert grow == sum(after[k][1] - before[k][1] for k in before)
        served += ran
        left += bool(rest)
    assert served > 400 and left > 300  # both outcomes were exercised


@compiled
def test_the_twins_queue_the_same_commands() -> None:
    from pion.commands._plain import queue as c_queue  # type: ignore[import-not-found]

    get, set_ = object(), object()
    rng = random.Random(11)
    queued_any = left = 0
    for _ in range(600):
        ready = _commands(rng)
        may_set = rng.random() < 0.8
        max_cmds, room = rng.choice([1, 3, 64]), rng.choice([0, 50, 400, 1 << 20])
        results = []
        for twin in (plain.py_queue, c_queue):
            r, q = copy.deepcopy(ready), [("before", [b"X"])]
            res = twin(r, q, get, set_, may_set, max_cmds, room)
            results.append((res, r, [(c is get, c is set_, argv) for c, argv in q[1:]]))
        assert results[0] == results[1]
        (done, nbytes, _), rest, queued = results[0]
        assert done == len(queued) == len(ready) - len(rest) <= max_cmds
        assert nbytes == sum(len(a) for *_, argv in queued for a in argv) <= room
        queued_any += done
        left += bool(rest)
    assert queued_any > 400 and left > 300


@pytest.mark.parametrize("twin", ["py", "c"])
def test_every_command_reaches_the_slow_log_at_threshold_zero(twin: str) -> None:
    if twin == "c" and not plain.COMPILED:
        pytest.skip("the compiled twin is not built")
    run = plain.py_run if twin == "py" else plain.run
    data = {b"a": Entry(b"1", 0, 0, 1 + 1 + KEY_OVERHEAD, 0)}
    ready = [[b"GET", b"a"], [b"SET", b"a", b"22"], [b"GET", b"zz"]]
    slow: list[Any] = []
    res = run(ready, data, [], b"$-1\r\n", 3, True, 64, 1 << 20, 0, slow)
    assert res[0] == 3 and res[8] == 1 and not ready
    assert [argv for argv, _ in slow] == [[b"GET", b"zz"], [b"SET", b"a", b"22"], [b"GET", b"a"]]
    assert all(isinstance(usec, int) and usec >= 0 for _, usec in slow)
    assert data[b"a"].value == b"22" and data[b"a"].touched == 3 and res[5] == 1


# -- a connection with runs against one without --------------------------------------------

V = b"v" * 256


def _script() -> list[bytes]:
    return [
        frame(b"SET", b"k", V),  # a new key: the lane's
        frame(b"SET", b"k", V + b"+"),  # then the run's
        frame(b"GET", b"k"),
        frame(b"get", b"missing"),
        frame(b"SET", b"big", b"B" * (SMALL_BULK + 1)),
        frame(b"GET", b"big"),  # sent without a copy: the lane's
        frame(b"SET", b"ttl", b"1", b"PX", b"100000"),
        frame(b"GET", b"ttl"),  # a deadline to check: the lane's
        frame(b"SET", b"ttl", b"2"),  # a deadline to clear: the lane's
        frame(b"PTTL", b"ttl"),
        frame(b"HSET", b"h", b"f", b"v"),
        frame(b"GET", b"h"),  # WRONGTYPE
        frame(b"SET", b"h", b"s"),  # replaces a hash: the lane's
        frame(b"GET", b"h"),
        frame(b"SET", b"k"),  # arity
        frame(b"CONFIG", b"SET", b"slowlog-log-slower-than", b"0"),
        frame(b"GET", b"k"),
        frame(b"SET", b"k", b"short"),
        frame(b"SLOWLOG", b"LEN"),
        frame(b"CONFIG", b"SET", b"slowlog-log-slower-than", b"10000"),
        frame(b"MULTI"),
        frame(b"SET", b"k", b"q"),  # queued: the lane's
        frame(b"EXEC"),
        frame(b"CONFIG", b"SET", b"notify-keyspace-events", b"KA"),
        frame(b"SET", b"k", b"n"),  # a notification to raise: the lane's
        frame(b"CONFIG", b"SET", b"notify-keyspace-events", b""),
        frame(b"WATCH", b"other"),
        frame(b"SET", b"k", b"w"),  # a watcher to tell: the lane's
        frame(b"UNWATCH"),
        frame(b"SET", b"k", b"after"),
        frame(b"OBJECT", b"ENCODING", b"k"),
        frame(b"DBSIZE"),
        frame(b"SELECT", b"1"),
        frame(b"GET", b"k"),  # another database
        frame(b"SET", b"k", b"db1"),
        frame(b"SET", b"k", b"db1 again"),
        frame(b"SELECT", b"0"),
        frame(b"GET", b"k"),
        frame(b"KV.PREFIX.REGISTER", b"ns", b"64", b"fp16"),
        frame(b"KV.PREFIX.LOOKUP", b"ns"),  # a run of probes
        frame(b"kv.prefix.lookup", b"nope"),
        frame(b"KV.PREFIX.LOOKUP", b"broken"),  # the registry fails: internal error
        frame(b"KV.PREFIX.LOOKUP", b"ns"),
        frame(b"KV.PREFIX.LOOKUP", b""),  # the name's length: the lane's error
        frame(b"KV.PREFIX.LOOKUP", b"ns", b"TOKENS", b"5"),  # options: the lane's
        frame(b"MULTI"),
        frame(b"GET", b"k"),
        frame(b"SET", b"k", b"in a transaction"),
        frame(b"KV.PREFIX.LOOKUP", b"ns"),  # queued by the lane
        frame(b"EXEC"),  # not plain: the lane's
        frame(b"MULTI"),  # a transaction that arrived whole: answered as a whole
        frame(b"SET", b"k", b"whole"),
        frame(b"GET", b"k"),
        frame(b"GET", b"missing"),
        frame(b"SET", b"fresh", b"1"),  # a new key: left to the boundary, inside EXEC
        frame(b"GET", b"ttl"),  # a deadline to check: the same
        frame(b"exec"),
        frame(b"multi"),
        frame(b"EXEC"),  # an empty one
        frame(b"MULTI"),
        frame(b"SET", b"k", b"x"),
        frame(b"get", b"k"),
        frame(b"multi"),  # nested: an error, the transaction goes on
        frame(b"EXEC"),  # plain: served, through the boundary
        frame(b"EXEC"),  # without MULTI
        frame(b"MULTI"),
        frame(b"SET", b"k"),  # arity while queuing: EXECABORT
        frame(b"EXEC"),
        frame(b"WATCH", b"k"),
        frame(b"SET", b"k", b"changed"),  # a watcher to tell: the lane's
        frame(b"MULTI"),
        frame(b"SET", b"k", b"watched"),  # queued by the lane (a watcher)
        frame(b"EXEC"),  # nil: k changed after WATCH
        frame(b"MULTI"),
        frame(b"SET", b"k", b"unwatched"),
        frame(b"EXEC"),
        frame(b"MULTI"),
        frame(b"SET", b"k", b"dropped"),
        frame(b"DISCARD"),
        frame(b"GET", b"k"),
        frame(b"HELLO", b"3"),
        frame(b"GET", b"missing"),  # RESP3's null
        frame(b"CLIENT", b"REPLY", b"SKIP"),
        frame(b"SET", b"k", b"silent"),
        frame(b"GET", b"k"),
    ]


class _Journal:
    """A log that keeps its records (a SET then needs one: no run may take it)."""

    def __init__(self) -> None:
        self.records: list[Any] = []

    def append(self, m: Any) -> None:
        self.records.append(m)


def _run(
    tmp_path: Path, script: list[bytes], *, log: bool = False, **config: Any
) -> dict[str, Any]:
    out: dict[str, Any] = {}

    async def body() -> None:
        conn, t = connect(tmp_path, **config)
        state = conn._state
        ks = state.databases.all
        changes = [0]  # what --no-wal counts for rdb_changes_since_last_save

        def changed(count: int) -> None:
            changes[0] += count

        journal = _Journal()
        for k in ks:
            k.changed = changed
            if log:
                k.journal = journal  # type: ignore[assignment]
        lookup = state.registry.lookup

        def failing(ns: bytes, tokens: int | None, prefill_ms: int | None) -> bool:
            if ns == b"broken":
                raise RuntimeError("a bug in the registry")
            return lookup(ns, tokens, prefill_ms)

        state.registry.lookup = failing  # type: ignore[method-assign]
        for wire in script:  # as the socket hands reads over (BufferedProtocol)
            buf = conn.get_buffer(len(wire))
            buf[: len(wire)] = wire
            conn.buffer_updated(len(wire))
        stats = state.stats
        out.update(
            wire=bytes(t.written),
            commands=state.counters.total_commands_processed,
            hits=[k.hits for k in ks[:2]],
            misses=[k.misses for k in ks[:2]],
            used=[k.used_bytes for k in ks[:2]],
            sizes=[sum(e.size for e in k.entries.values()) for k in ks[:2]],
            calls={n: (row[0], row[2], row[3]) for n, row in stats.commands.items()},
            errors=dict(stats.errors),
            slow=[e.args for e in stats.slowlog],
            changes=changes[0],
            records=len(journal.records),
            last=conn.client.last_command,
            internal=state.counters.internal_errors,
        )

    asyncio.run(body())
    return out


@pytest.mark.parametrize("log", [False, True], ids=["no log", "a log"])
@pytest.mark.parametrize("twin", ["compiled", "python"])
@pytest.mark.parametrize("reads", ["one read", "one read per command"])
def test_runs_answer_count_and_store_as_the_lane(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reads: str, twin: str, log: bool
) -> None:
    if twin == "python":
        monkeypatch.setattr(plain, "run", plain.py_run)
    elif not plain.COMPILED:
        pytest.skip("the compiled twin is not built")
    script = _script()
    if reads == "one read":
        script = [b"".join(script)]
    with_runs = _run(tmp_path / "runs", script, log=log)
    with monkeypatch.context() as patch:
        patch.setattr(connection, "HEADS", frozenset())
        lane_only = _run(tmp_path / "lane", script, log=log)
    assert with_runs == lane_only
    assert bool(with_runs["records"]) == log and bool(with_runs["changes"]) != log
    assert with_runs["used"] == with_runs["sizes"]  # used_bytes kept exact
    assert with_runs["internal"] == 1 and with_runs["errors"]["ERR"] >= 1
    assert with_runs["calls"]["KV.PREFIX.LOOKUP"] == (7, 0, 2)  # calls, rejected, failed
    assert with_runs["calls"]["EXEC"][0] == 9 and b"*-1\r\n" in with_runs["wire"]
    assert b"WRONGTYPE" in with_runs["wire"] and with_runs["calls"]["GET"][0] >= 8


def test_a_pipeline_of_plain_commands_is_served_by_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs: list[int] = []
    serve = batch.serve

    def counting(*args: Any) -> tuple[int, int]:
        done = serve(*args)
        runs.append(done[0])
        return done

    monkeypatch.setattr(connection, "serve_batch", counting)
    setup = [frame(b"SET", b"k%d" % i, V) for i in range(4)]
    pipeline = [frame(b"SET", b"k%d" % (i % 4), V) for i in range(50)]
    pipeline += [frame(b"GET", b"k%d" % (i % 4)) for i in range(50)]
    got = _run(tmp_path, [b"".join(setup), b"".join(pipeline)])
    assert sum(runs) == 100 and max(runs) == batch.BATCH  # served in runs, none alone
    assert got["calls"]["SET"][0] == 54 and got["calls"]["GET"][0] == 50
    assert got["hits"][0] == 50 and got["changes"] == 54
    assert got["last"] == "GET"


@pytest.mark.parametrize(
    "config",
    [{"requirepass": "pw"}, {"maxmemory": 1 << 30}],
    ids=["auth required", "maxmemory"],
)
def test_states_that_stop_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config: dict[str, Any]
) -> None:
    runs: list[int] = []
    serve = batch.serve
    monkeypatch.setattr(connection, "serve_batch", lambda *a: runs.append(1) or serve(*a))
    script = [frame(b"SET", b"k", V), frame(b"GET", b"k"), frame(b"GET", b"k")]
    if "requirepass" in config:
        script = [frame(b"GET", b"k"), frame(b"AUTH", b"pw"), *script]
    got = _run(tmp_path, [b"".join(script)], **config)
    if "requirepass" in config:
        assert got["wire"].startswith(b"-NOAUTH") and got["calls"]["GET"][1] == 1
        assert got["calls"]["GET"][0] == 2  # after AUTH, runs serve it
    else:
        assert got["calls"]["GET"][0] == 2 and got["hits"][0] == 2
    assert runs  # asked, and the answers are the lane's
    with monkeypatch.context() as patch:
        patch.setattr(connection, "HEADS", frozenset())
        assert _run(tmp_path / "lane", [b"".join(script)], **config) == got


def test_metered_handlers_get_no_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With --metrics-port every handler is counted by its wrapper: no run bypasses it."""
    runs: list[int] = []
    serve = plain.serve
    monkeypatch.setattr(batch, "serve_plain", lambda *a, **k: runs.append(1) or serve(*a, **k))

    async def body() -> bytes:
        conn, t = connect(tmp_path)
        conn._state.metered = True
        wire = frame(b"SET", b"k", V) + frame(b"SET", b"k", V) + frame(b"GET", b"k")
        buf = conn.get_buffer(len(wire))
        buf[: len(wire)] = wire
        conn.buffer_updated(len(wire))
        return bytes(t.written)

    assert asyncio.run(body()) == b"+OK\r\n+OK\r\n$256\r\n" + V + b"\r\n"
    assert not runs


def test_transactions_that_arrive_whole_are_served_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole: list[int] = []
    serve_whole = batch.serve_whole

    def counting(*args: Any) -> tuple[int, int]:
        done = serve_whole(*args)
        whole.append(done[0])
        return done

    monkeypatch.setattr(batch, "serve_whole", counting)
    setup = frame(b"SET", b"a", V) + frame(b"SET", b"b", V)
    txn = frame(b"MULTI") + frame(b"SET", b"a", b"1") + frame(b"GET", b"b") + frame(b"EXEC")
    got = _run(tmp_path, [setup, txn * 10])
    assert whole == [4] * 10
    assert got["calls"]["MULTI"][0] == got["calls"]["EXEC"][0] == 10
    assert got["calls"]["SET"][0] == 12 and got["calls"]["GET"][0] == 10
    reply = b"+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n+OK\r\n$256\r\n" + V + b"\r\n"
    assert got["wire"] == b"+OK\r\n+OK\r\n" + reply * 10
    assert got["commands"] == 2 + 10 * 6  # MULTI, EXEC, each command queued and run


def test_with_a_log_writes_keep_the_lane_and_reads_still_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SET that needs a log record is declined once per slice (not asked again for
    each write), and the GETs after it are still served in runs."""
    asked: list[tuple[int, int]] = []
    serve = batch.serve
    monkeypatch.setattr(connection, "serve_batch", lambda *a: asked.append(serve(*a)) or asked[-1])
    setup = frame(b"SET", b"k", V)
    pipeline = frame(b"SET", b"k", V) * 5 + frame(b"MULTI") + frame(b"SET", b"k", V)
    pipeline += frame(b"EXEC") + frame(b"GET", b"k") * 10
    got = _run(tmp_path, [setup, pipeline], log=True)
    assert asked == [batch.NO_WRITES, (10, 10 * len(b"$256\r\n" + V + b"\r\n"))]
    assert got["records"] == 7 and got["calls"]["GET"][0] == 10


def test_redis_py_pipelines_over_tcp_are_served_in_runs(
    server_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real server on a real socket, redis-py's pipelines (plain and transactional)
    and a router's probes: the answers and INFO's counters are the lane's, and runs
    served them (the server runs in this process: its run functions are counted)."""
    import redis

    served = {"plain": 0, "whole": 0, "lookups": 0}

    def counting(kind: str, fn: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> tuple[int, int]:
            done: tuple[int, int] = fn(*args, **kwargs)
            served[kind] += done[0]
            return done

        return wrapped

    monkeypatch.setattr(batch, "serve_plain", counting("plain", batch.serve_plain))
    monkeypatch.setattr(batch, "serve_whole", counting("whole", batch.serve_whole))
    monkeypatch.setattr(batch, "serve_lookups", counting("lookups", batch.serve_lookups))
    srv = server_factory(wal_enabled=False)
    r = redis.Redis(host=srv.host, port=srv.port, protocol=2, socket_timeout=30)
    try:
        r.mset({f"k{i}": "old" for i in range(50)})  # the keys exist: SETs overwrite
        r.config_resetstat()
        pipe = r.pipeline(transaction=False)
        for i in range(50):
            pipe.set(f"k{i}", f"v{i}")
            pipe.get(f"k{i}")
        assert pipe.execute() == [x for i in range(50) for x in (True, f"v{i}".encode())]
        with r.pipeline() as tx:  # MULTI, 4 SETs, EXEC in one write
            for i in range(4):
                tx.set(f"k{i}", "in a transaction")
            assert tx.execute() == [True] * 4
        r.execute_command("KV.PREFIX.REGISTER", "ns", 64, "fp16")
        probes = r.pipeline(transaction=False)
        for _ in range(20):
            probes.execute_command("KV.PREFIX.LOOKUP", "ns")
        assert probes.execute() == [b"HIT"] * 20
        stats = r.info("commandstats")
        assert stats["cmdstat_set"]["calls"] == 54 and stats["cmdstat_get"]["calls"] == 50
        assert stats["cmdstat_multi"]["calls"] == stats["cmdstat_exec"]["calls"] == 1
        assert stats["cmdstat_kv.prefix.lookup"]["calls"] == 20
        assert r.get("k3") == b"in a transaction" and r.get("k9") == b"v9"
    finally:
        r.close()
    # (a read split mid-command leaves the command it cut to the lane)
    assert served["plain"] > 90 and served["whole"] == 6 and served["lookups"] > 15
