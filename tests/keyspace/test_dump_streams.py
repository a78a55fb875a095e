"""DUMP and RESTORE of streams against a real redis-server 7.0: streams with deleted and
trimmed entries, consumer groups, consumers and pending entries moved both ways (the
oracle deep-checks what it restores: ``sanitize-dump-payload yes``), hypothesis-built
streams, RDB types 15 and 21 built from the format's layout, hostile payloads, and a
restored stream kept across a restart."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pion.config import ServerConfig
from pion.keyspace.rdb import crc64
from pion.server.run import ServerThread
from support.keyspace import RawClient, damaged, oracle_pair
from support.rdb_streams import SEEN, Group, Node, stream_payload


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[redis.Redis, redis.Redis]]:
    with oracle_pair(tmp_path_factory.mktemp("oracle-dump-streams")) as ports:
        clients = (redis.Redis(port=ports[0]), redis.Redis(port=ports[1]))
        clients[0].config_set("sanitize-dump-payload", "yes")
        yield clients
        for c in clients:
            c.close()


def _clean(info: Any, drop: tuple[bytes, ...]) -> Any:
    """XINFO STREAM FULL without ``drop``'s fields."""
    if isinstance(info, dict):
        return {k: _clean(v, drop) for k, v in info.items() if k not in drop}
    if isinstance(info, list):
        return [_clean(v, drop) for v in info]
    return info


def _view(r: redis.Redis, key: str) -> Any:
    """What a client sees of a stream, in a form that compares across servers: not
    the radix tree's node and key counts (how Redis lays out its listpack nodes: a
    restored stream's live entries are regrouped as XADD would group them, so the
    count differs from the source's where its nodes held deleted entries), nor the idle
    times a clock gives."""
    groups = r.xinfo_groups(key)
    pending = {
        g["name"]: [
            (p["message_id"], p["consumer"], p["times_delivered"])
            for p in r.xpending_range(key, g["name"], "-", "+", 10_000)
        ]
        for g in groups
    }
    consumers = {
        g["name"]: [(c["name"], c["pending"]) for c in r.xinfo_consumers(key, g["name"])]
        for g in groups
    }
    full = r.execute_command("XINFO", "STREAM", key, "FULL")
    return (
        r.xrange(key),
        r.xrevrange(key),
        _clean(full, (b"radix-tree-nodes", b"radix-tree-keys")),
        groups,
        pending,
        consumers,
    )


def _move(src: redis.Redis, dst: redis.Redis, key: str, to: str) -> None:
    payload = src.dump(key)
    assert payload is not None and payload[:1] in (b"\x13", b"\x15")
    dst.delete(to)
    assert dst.restore(to, 0, payload) == b"OK"
    assert _view(dst, to) == _view(src, key)


def _both_ways(oracle: redis.Redis, pion: redis.Redis, key: str) -> None:
    _move(oracle, pion, key, key)  # redis-server's payload, read by pion-server
    _move(pion, oracle, key, key + ":back")  # pion-server's, deep-checked by redis-server


def _entries(r: redis.Redis, key: str, n: int, big: bool = False) -> list[bytes]:
    ids = []
    for i in range(1, n + 1):
        if big and i % 10 == 0:
            fields: dict[str, Any] = {"blob": b"z" * 5000, "n": i}
        elif i % 4 == 0:
            fields = {"other": -i * 1000, "x": "y" * (i % 150)}
        else:
            fields = {"a": i, "b": "v" * (i % 70), "c": str(-(2**63) + i)}
        ids.append(r.xadd(key, fields, id=f"{1000 + i // 3}-{i}"))
    return ids


def _shape(r: redis.Redis, key: str, shape: str) -> None:
    r.delete(key)
    if shape == "empty-mkstream":
        r.xgroup_create(key, "g", id="$", mkstream=True)
        return
    ids = _entries(r, key, 350 if shape != "small" else 5, big=shape == "big-values")
    if shape == "deleted":
        r.xdel(key, *ids[::7], ids[-1])
    elif shape == "trimmed":
        r.xtrim(key, maxlen=230, approximate=True)
        r.xtrim(key, maxlen=181)
        r.xdel(key, ids[-5])
    elif shape == "all-deleted":
        r.xdel(key, *ids)
    elif shape == "groups":
        _groups(r, key, ids)


def _groups(r: redis.Redis, key: str, ids: list[bytes]) -> None:
    r.xgroup_create(key, "g1", id="0")
    r.xgroup_create(key, "g2", id=ids[100])
    r.xgroup_create(key, "idle", id="$")
    r.xgroup_createconsumer(key, "idle", "nobody")
    r.xreadgroup("g1", "alice", {key: ">"}, count=30)
    r.xreadgroup("g1", "bob", {key: ">"}, count=20)
    r.xreadgroup("g1", "noack", {key: ">"}, count=5, noack=True)
    r.xreadgroup("g2", "carol", {key: ">"}, count=10)
    r.xack(key, "g1", *ids[:10])
    r.xclaim(key, "g1", "bob", 0, ids[10:15])  # moved between consumers, count 2
    r.xclaim(key, "g1", "dave", 0, ids[20:22], idle=5000, retrycount=7)
    r.xdel(key, ids[12], ids[40], ids[104])  # pending entries deleted from the stream
    r.xgroup_setid(key, "g2", ids[150], entries_read=151)


SHAPES = ["small", "deleted", "trimmed", "all-deleted", "big-values", "groups", "empty-mkstream"]


@pytest.mark.parametrize("shape", SHAPES)
def test_streams_move_both_ways(pair: tuple[redis.Redis, redis.Redis], shape: str) -> None:
    oracle, pion = pair
    key = f"stream:{shape}"
    _shape(oracle, key, shape)
    _both_ways(oracle, pion, key)
    # The moved stream goes on as the original: same ids taken, same group reads.
    for r, k in ((oracle, key), (pion, key), (oracle, key + ":back")):
        assert r.xadd(k, {"after": "move"}, id="999999-1") == b"999999-1"
    want = oracle.xinfo_stream(key)
    for r, k in ((pion, key), (oracle, key + ":back")):
        got = r.xinfo_stream(k)
        for field in ("length", "last-generated-id", "entries-added", "max-deleted-entry-id"):
            assert got[field] == want[field], field


@st.composite
def _ops(draw: st.DrawFn) -> list[tuple[Any, ...]]:
    ops: list[tuple[Any, ...]] = []
    for _ in range(draw(st.integers(1, 40))):
        kind = draw(
            st.sampled_from(["add", "add", "add", "bulk", "del", "trim", "group", "read", "ack"])
        )
        if kind == "bulk":  # enough entries to fill listpack nodes
            ops.append(("bulk", draw(st.integers(20, 160)), draw(st.integers(0, 80))))
        elif kind == "add":
            n = draw(st.integers(1, 4))
            values = st.one_of(
                st.binary(max_size=30),
                st.integers(-(2**63), 2**63 - 1).map(lambda v: str(v).encode()),
            )
            fields = draw(st.lists(st.tuples(st.sampled_from([b"a", b"b", b"f"]), values)))
            fields = fields[:n] or [(b"a", b"1")]
            ops.append(("add", draw(st.integers(1, 3)), dict(fields)))
        elif kind in ("del", "ack"):
            ops.append((kind, draw(st.integers(0, 50))))
        elif kind == "trim":
            ops.append(("trim", draw(st.integers(0, 30)), draw(st.booleans())))
        else:
            ops.append((kind, draw(st.sampled_from([b"g", b"h"])), draw(st.integers(1, 5))))
    return ops


def _play(r: redis.Redis, ops: list[tuple[Any, ...]]) -> None:
    r.delete("h")
    r.xgroup_create("h", "g", id="$", mkstream=True)
    ms, seq = 1, 0
    for op in ops:
        ids = [e[0] for e in r.xrange("h")] if op[0] in ("del", "ack") else []
        if op[0] == "add":
            ms, seq = (ms + 1, 0) if op[1] == 1 else (ms, seq + 1)
            r.xadd("h", op[2], id=f"{ms}-{seq}")
        elif op[0] == "bulk":
            ms += 1
            with r.pipeline(transaction=False) as p:
                for n in range(op[1]):
                    p.xadd("h", {"k": n, "pad": "p" * op[2]}, id=f"{ms}-{n}")
                p.execute()
            seq = op[1] - 1
        elif op[0] == "del" and ids:
            r.xdel("h", ids[op[1] % len(ids)])
        elif op[0] == "trim":
            r.xtrim("h", maxlen=op[1], approximate=op[2])
        elif op[0] == "group" and op[1] not in [g["name"] for g in r.xinfo_groups("h")]:
            r.xgroup_create("h", op[1], id="0")
        elif op[0] == "read" and any(g["name"] == op[1] for g in r.xinfo_groups("h")):
            r.xreadgroup(op[1].decode(), f"c{op[2]}", {"h": ">"}, count=op[2])
        elif op[0] == "ack" and ids:
            r.xack("h", "g", ids[op[1] % len(ids)])


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=_ops())
def test_generated_streams_move_both_ways(
    pair: tuple[redis.Redis, redis.Redis], ops: list[tuple[Any, ...]]
) -> None:
    oracle, pion = pair
    _play(oracle, ops)
    _both_ways(oracle, pion, "h")
    # The same changes made by pion-server's own commands (its nodes after XDEL and
    # XTRIM, not a restore's): its payload, restored by redis-server, reads back as
    # pion-server's stream, and holds what redis-server's own commands made.
    _play(pion, ops)
    _move(pion, oracle, "h", "h:pion")
    for field in ("length", "last-generated-id", "entries-added", "max-deleted-entry-id"):
        assert oracle.xinfo_stream("h:pion")[field] == oracle.xinfo_stream("h")[field]
    assert oracle.xrange("h:pion") == oracle.xrange("h")


# -- types 15 and 21, built from the layout ------------------------------------------

_NODES = [
    Node((5, 0), [((5, 0), False, {b"a": b"1", b"b": b"x"}), ((5, 1), True, {b"a": b"2"})]),
    Node((7, 3), [((7, 3), False, {b"a": b"-9", b"q": b"w" * 80}), ((9, 0), False, {b"a": b"3"})]),
]
_GROUPS = [
    Group(
        b"g",
        (7, 3),
        2,
        {(5, 0): (1_700_000_000_000, 3), (7, 3): (42, 1)},
        {b"c1": [(5, 0)], b"c2": [(7, 3)]},
    ),
    Group(b"h", (0, 0), 0, {}, {b"idle": []}),
]


@pytest.mark.parametrize("kind", [15, 19, 21])
def test_stream_types_from_the_layout(pair: tuple[redis.Redis, redis.Redis], kind: int) -> None:
    oracle, pion = pair
    fields = dict(length=3, last=(9, 0), first=(5, 0), max_deleted=(5, 1), added=4)
    payload = stream_payload(kind, _NODES, groups=_GROUPS, **fields)
    assert pion.restore(f"t{kind}", 0, payload, replace=True) == b"OK"
    assert [e[0] for e in pion.xrange(f"t{kind}")] == [b"5-0", b"7-3", b"9-0"]
    info = pion.execute_command("XINFO", "STREAM", f"t{kind}", "FULL")
    consumers = info[b"groups"][0][b"consumers"]
    assert [(c[b"name"], c[b"seen-time"]) for c in consumers] == [(b"c1", SEEN), (b"c2", SEEN)]
    assert info[b"groups"][0][b"pending"] == [
        [b"5-0", b"c1", 1_700_000_000_000, 3],
        [b"7-3", b"c2", 42, 1],
    ]
    if kind == 15:  # Redis 7.0's assumptions for an older stream
        assert (info[b"entries-added"], info[b"max-deleted-entry-id"]) == (3, b"0-0")
    else:
        assert (info[b"entries-added"], info[b"max-deleted-entry-id"]) == (4, b"5-1")
    if kind != 21:  # redis-server 7.0 reads these too, and agrees
        assert oracle.restore(f"t{kind}", 0, payload, replace=True) == b"OK"
        assert _view(pion, f"t{kind}") == _view(oracle, f"t{kind}")


# -- hostile payloads -----------------------------------------------------------------


def _seal(body: bytes, version: int = 10) -> bytes:
    out = body + version.to_bytes(2, "little")
    return out + crc64(out).to_bytes(8, "little")


def _bad(pion: redis.Redis, payload: bytes) -> None:
    with pytest.raises(redis.ResponseError, match=r"^Bad data format$"):
        pion.restore("bad", 0, payload, replace=True)


BIG = b"\x81" + b"\xff" * 8  # a length of 2**64 - 1


def test_hostile_stream_payloads_answer_bad_data_format(
    pair: tuple[redis.Redis, redis.Redis],
) -> None:
    _, pion = pair
    good = dict(length=3, last=(9, 0), first=(5, 0), max_deleted=(5, 1), added=4)
    assert pion.restore("ok", 0, stream_payload(19, _NODES, groups=_GROUPS, **good)) == b"OK"
    wrong: list[bytes] = [
        _seal(b"\x13" + BIG),  # 2**64 - 1 nodes, none there
        _seal(b"\x13\x01" + BIG),  # a node key claiming 2**64 - 1 bytes
        stream_payload(19, _NODES, groups=_GROUPS, **{**good, "length": 4}),
        stream_payload(19, _NODES, groups=_GROUPS, **{**good, "last": (8, 0)}),
        stream_payload(19, _NODES, groups=_GROUPS, **{**good, "added": 2}),
        stream_payload(19, _NODES[::-1], groups=_GROUPS, **good),  # nodes out of order
        stream_payload(19, [Node((5, 1), _NODES[0].entries)], groups=[], **good),  # master > id
        stream_payload(19, _NODES, groups=_GROUPS * 2, **good),  # a repeated group
        stream_payload(
            19, _NODES, groups=[_GROUPS[0]._replace(consumers={b"c1": [(5, 0)]})], **good
        ),
        stream_payload(
            19,
            _NODES,
            groups=[_GROUPS[0]._replace(consumers={b"c1": [(5, 0), (6, 6)], b"c2": [(7, 3)]})],
            **good,
        ),
        stream_payload(
            19,
            _NODES,
            groups=[_GROUPS[0]._replace(consumers={b"c1": [(5, 0)], b"c2": [(5, 0), (7, 3)]})],
            **good,
        ),
        stream_payload(19, _NODES, groups=[_GROUPS[0]._replace(read=-2)], **good),
        stream_payload(19, _NODES, groups=_GROUPS, key_size=15, **good),
        stream_payload(19, _NODES, groups=_GROUPS, master_counts=(9, 9), **good),
        stream_payload(19, _NODES, groups=_GROUPS, element_count=99, **good),
        stream_payload(19, _NODES, groups=_GROUPS, flags=8, **good),
        stream_payload(19, [Node((5, 0), [])], groups=[], **{**good, "length": 0}),
        _seal(stream_payload(19, _NODES, groups=_GROUPS, **good)[:-13]),  # cut short
    ]
    for payload in wrong:
        _bad(pion, payload)
    assert pion.exists("bad") == 0


def test_damaged_stream_payloads_never_hurt_the_server(
    pair: tuple[redis.Redis, redis.Redis],
) -> None:
    """Bytes flipped, cut or grown inside real streams' payloads (redis-server's and
    pion-server's), the checksum made right again so the decoder meets the damage: an
    error or a stream that reads back whole, never a crash or a hang."""
    oracle, pion = pair
    payloads = []
    for shape in ("small", "deleted", "groups", "empty-mkstream"):
        _shape(oracle, "src", shape)
        payload = oracle.dump("src")
        assert payload is not None
        pion.restore("src", 0, payload, replace=True)
        payloads += [payload, pion.dump("src")]
    rng = random.Random(11)
    for n in range(400):
        body = damaged(rng, payloads, n)
        try:
            pion.restore("h", 0, _seal(body), replace=True)
        except redis.ResponseError as exc:
            assert str(exc) == "Bad data format"
        else:
            if pion.type("h") == b"stream":  # what was accepted reads back whole
                pion.execute_command("XINFO", "STREAM", "h", "FULL")
                pion.xrevrange("h")
                pion.dump("h")
    assert pion.ping() is True


def test_restored_stream_survives_a_restart(tmp_path: Path) -> None:
    good = dict(length=3, last=(9, 0), first=(5, 0), max_deleted=(5, 1), added=4)
    payload = stream_payload(19, _NODES, groups=_GROUPS, **good)
    config = ServerConfig(port=0, dir=tmp_path / "data", appendfsync="always")
    srv = ServerThread(config).start()
    r = redis.Redis(port=srv.port)
    assert r.restore("s", 0, payload) == b"OK"
    before = r.execute_command("XINFO", "STREAM", "s", "FULL")
    dumped = r.dump("s")
    r.close()
    srv.stop()
    srv = ServerThread(ServerConfig(port=0, dir=tmp_path / "data")).start()
    r = redis.Redis(port=srv.port)
    try:
        assert r.execute_command("XINFO", "STREAM", "s", "FULL") == before
        assert r.dump("s") == dumped
    finally:
        r.close()
        srv.stop()


def test_restore_wakes_a_blocked_stream_read(pair: tuple[redis.Redis, redis.Redis]) -> None:
    """As redis-server 7.0 (``dbAdd`` signals the key): a client blocked in XREAD on
    the key gets the restored entries."""
    oracle = pair[0]
    _shape(oracle, "src", "small")
    payload = oracle.dump("src")
    assert payload is not None
    for r in pair:
        r.delete("w")
        port = int(r.connection_pool.connection_kwargs["port"])
        blocked = RawClient(port)
        blocked.send("XREAD", "COUNT", 2, "BLOCK", 10_000, "STREAMS", "w", "0-0")
        deadline = time.monotonic() + 10
        while not any(c["cmd"] == "xread" for c in r.client_list()):
            assert time.monotonic() < deadline, r.client_list()
        assert r.restore("w", 0, payload) == b"OK"
        reply = blocked.call("PING").value  # XREAD's reply comes first
        assert [e[0] for e in reply[0][1]] == [b"1000-1", b"1000-2"]
        blocked.close()
