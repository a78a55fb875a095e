"""redis-server as the oracle for lists and sets: hypothesis generates command sequences
over a few keys (so lists, sets and strings collide and WRONGTYPE is exercised), sends
each to a real redis-server and to pion-server and compares the replies byte for
byte, in RESP2 and in RESP3 (where SMEMBERS and the set algebra answer a ``~`` set).

Compared loosely, only where the two cannot agree: the members of a set Redis keeps in
a hashtable come in its hash order, so those replies are compared as sorted lists
(an intset's ascending order is compared exactly, as are all replies of fewer than
two members); SRANDMEMBER's picks are compared by size. SPOP is not generated with a
count below the set's size (the servers would pop different members and diverge);
its random picks are tested on their own in ``test_lists_sets.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.keyspace import Err, RawClient, Reply, oracle_pair

KEYS = [b"l0", b"l1", b"s0", b"s1", b"str"]
ELEMENTS = [b"a", b"b", b"c", b"", b"\x00\r\n", b"1", b"2", b"10", b"-3", b"007"]
INDEXES = [b"0", b"1", b"-1", b"2", b"-2", b"5", b"-10", b"x", b"100", b"9223372036854775807"]
COUNTS = [b"0", b"1", b"2", b"3", b"-1", b"x", b"10"]

key = st.sampled_from(KEYS)
element = st.sampled_from(ELEMENTS)
index = st.sampled_from(INDEXES)
end = st.sampled_from([b"LEFT", b"RIGHT", b"left", b"up"])


def _cmd(*parts: Any) -> st.SearchStrategy[list[bytes]]:
    return st.tuples(*parts).map(
        lambda t: [x for p in t for x in (p if isinstance(p, list) else [p])]
    )


def _words(name: bytes) -> st.SearchStrategy[bytes]:
    return st.just(name)


lpos_options = st.lists(
    st.sampled_from(
        [
            [b"RANK", b"1"],
            [b"RANK", b"-1"],
            [b"RANK", b"2"],
            [b"RANK", b"-2"],
            [b"RANK", b"0"],
            [b"RANK", b"x"],
            [b"RANK", b"-9223372036854775808"],
            [b"COUNT", b"0"],
            [b"COUNT", b"2"],
            [b"COUNT", b"-1"],
            [b"MAXLEN", b"2"],
            [b"MAXLEN", b"0"],
            [b"MAXLEN", b"-1"],
            [b"BOGUS"],
            [b"RANK"],
        ]
    ),
    max_size=3,
).map(lambda groups: [w for g in groups for w in g])

mpop_count = st.sampled_from([[], [b"COUNT", b"2"], [b"COUNT", b"0"], [b"COUNT", b"x"], [b"x"]])

LIST_COMMANDS = st.one_of(
    _cmd(
        st.sampled_from([b"LPUSH", b"RPUSH", b"LPUSHX", b"RPUSHX"]),
        key,
        st.lists(element, min_size=1, max_size=4),
    ),
    _cmd(
        st.sampled_from([b"LPOP", b"RPOP"]),
        key,
        st.sampled_from([[], *[[c] for c in COUNTS], [b"1", b"2"]]),
    ),
    _cmd(st.sampled_from([b"LLEN"]), key),
    _cmd(_words(b"LRANGE"), key, index, index),
    _cmd(_words(b"LINDEX"), key, index),
    _cmd(_words(b"LSET"), key, index, element),
    _cmd(
        _words(b"LINSERT"),
        key,
        st.sampled_from([b"BEFORE", b"AFTER", b"after", b"x"]),
        element,
        element,
    ),
    _cmd(_words(b"LREM"), key, st.sampled_from(COUNTS), element),
    _cmd(_words(b"LTRIM"), key, index, index),
    _cmd(_words(b"LPOS"), key, element, lpos_options),
    _cmd(_words(b"LMOVE"), key, key, end, end),
    _cmd(_words(b"RPOPLPUSH"), key, key),
    _cmd(
        _words(b"LMPOP"),
        st.sampled_from([b"1", b"2", b"0", b"x", b"3"]),
        st.lists(key, min_size=1, max_size=2),
        end,
        mpop_count,
    ),
    _cmd(st.sampled_from([b"TYPE", b"EXISTS", b"DEL", b"OBJECT"]), key).map(
        lambda c: [c[0], b"ENCODING", c[1]] if c[0] == b"OBJECT" else c
    ),
    _cmd(_words(b"SET"), key, element),
    _cmd(_words(b"EXPIRE"), key, st.sampled_from([b"100", b"0"])),
    _cmd(_words(b"TTL"), key),
    _cmd(_words(b"COPY"), key, key, st.sampled_from([[], [b"REPLACE"]])),
    _cmd(_words(b"RENAME"), key, key),
)

SET_COMMANDS = st.one_of(
    _cmd(_words(b"SADD"), key, st.lists(element, min_size=1, max_size=4)),
    _cmd(_words(b"SREM"), key, st.lists(element, min_size=1, max_size=3)),
    _cmd(st.sampled_from([b"SMEMBERS", b"SCARD"]), key),
    _cmd(_words(b"SISMEMBER"), key, element),
    _cmd(_words(b"SMISMEMBER"), key, st.lists(element, min_size=1, max_size=3)),
    _cmd(_words(b"SPOP"), key, st.sampled_from([[b"0"], [b"20"], [b"-1"], [b"x"], [b"20", b"1"]])),
    _cmd(
        _words(b"SRANDMEMBER"),
        key,
        st.sampled_from([[], [b"0"], [b"2"], [b"-3"], [b"20"], [b"x"], [b"1", b"2"]]),
    ),
    _cmd(_words(b"SMOVE"), key, key, element),
    _cmd(st.sampled_from([b"SINTER", b"SUNION", b"SDIFF"]), st.lists(key, min_size=1, max_size=3)),
    _cmd(
        st.sampled_from([b"SINTERSTORE", b"SUNIONSTORE", b"SDIFFSTORE"]),
        key,
        st.lists(key, min_size=1, max_size=3),
    ),
    _cmd(
        _words(b"SINTERCARD"),
        st.sampled_from([b"1", b"2", b"0", b"x", b"3"]),
        st.lists(key, min_size=1, max_size=2),
        st.sampled_from([[], [b"LIMIT", b"1"], [b"LIMIT", b"0"], [b"LIMIT", b"-1"], [b"bogus"]]),
    ),
    _cmd(
        _words(b"SSCAN"),
        key,
        st.sampled_from([b"0", b"x"]),
        st.sampled_from([[], [b"MATCH", b"1*"], [b"COUNT", b"1"]]),
    ),
    _cmd(st.sampled_from([b"TYPE", b"OBJECT"]), key).map(
        lambda c: [c[0], b"ENCODING", c[1]] if c[0] == b"OBJECT" else c
    ),
    _cmd(_words(b"SET"), key, element),
    _cmd(_words(b"RPUSH"), key, element),
    _cmd(_words(b"DEL"), key),
)

# Replies that hold set members (their order is the hashtable's in Redis).
_UNORDERED = {b"SMEMBERS", b"SINTER", b"SUNION", b"SDIFF", b"SPOP"}


def _same(cmd: list[bytes], want: Reply, got: Reply) -> bool:
    if want.raw == got.raw:
        return True
    name = cmd[0].upper()
    if name in _UNORDERED and isinstance(want.value, list) and isinstance(got.value, list):
        return want.raw[:1] == got.raw[:1] and sorted(want.value) == sorted(got.value)
    if name == b"SSCAN" and isinstance(want.value, list) and isinstance(got.value, list):
        return want.value[0] == got.value[0] and sorted(want.value[1]) == sorted(got.value[1])
    if name == b"SRANDMEMBER" and isinstance(want.value, list) and isinstance(got.value, list):
        return len(want.value) == len(got.value)
    if name == b"SRANDMEMBER":
        return isinstance(want.value, bytes) and isinstance(got.value, bytes)
    if name == b"TTL" and isinstance(want.value, int) and isinstance(got.value, int):
        return want.value >= 0 and abs(want.value - got.value) <= 1
    return False


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int]]:
    with oracle_pair(tmp_path_factory.mktemp("oracle-lists")) as ports:
        yield ports


def _run(ports: tuple[int, int], proto: int, commands: st.SearchStrategy[list[bytes]]) -> None:
    clients = [RawClient(p) for p in ports]
    if proto == 3:
        for c in clients:
            assert not isinstance(c.call("HELLO", 3).value, Err)

    @settings(
        max_examples=300,
        derandomize=True,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(st.lists(commands, min_size=1, max_size=25))
    def run(sequence: list[list[bytes]]) -> None:
        for c in clients:
            assert c.call("FLUSHALL").raw == b"+OK\r\n"
        history: list[list[bytes]] = []
        for cmd in sequence:
            want, got = clients[0].call(*cmd), clients[1].call(*cmd)
            assert _same(cmd, want, got), (
                f"\ncommand  {cmd!r}\nredis    {want.raw!r}\npion     {got.raw!r}\n"
                f"after    {history!r}"
            )
            history.append(cmd)
        for k in KEYS:  # the states agree at the end, whatever the replies showed
            for probe in ([b"TYPE", k], [b"LRANGE", k, b"0", b"-1"], [b"SCARD", k]):
                want, got = clients[0].call(*probe), clients[1].call(*probe)
                assert want.raw == got.raw, (probe, want.raw, got.raw, history)

    try:
        run()
    finally:
        for c in clients:
            c.close()


@pytest.mark.parametrize("proto", [2, 3])
def test_list_command_sequences_match_redis(servers: tuple[int, int], proto: int) -> None:
    _run(servers, proto, LIST_COMMANDS)


@pytest.mark.parametrize("proto", [2, 3])
def test_set_command_sequences_match_redis(servers: tuple[int, int], proto: int) -> None:
    _run(servers, proto, SET_COMMANDS)
