"""redis-server as the oracle for streams: hypothesis generates command sequences over
two streams and a string (so WRONGTYPE and the missing-key errors are exercised), sends
each to a real redis-server and to pion-server and compares the replies byte for byte,
in RESP2 and RESP3: XADD with explicit and partial ids and every trimming form, the
ranges, XDEL, XTRIM, XSETID, XREAD, the consumer groups (XGROUP, XREADGROUP, XACK,
XPENDING, XCLAIM, XAUTOCLAIM) and XINFO.

Ids are always given (``*`` takes the clock, which the two servers do not share).
Compared loosely, only where the two cannot agree: how long ago an entry was delivered
or a consumer seen (XPENDING's idle column, XINFO CONSUMERS' ``idle``), and XINFO
STREAM's ``radix-tree-nodes`` (the shape of Redis's radix tree, which Pion does not
have). Minimum idle times are 0 or beyond any test's length, so they select the same
entries on both.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.keyspace import Err, RawClient, Reply, oracle_pair

KEYS = [b"s0", b"s1", b"str"]
IDS = [b"1-1", b"1-2", b"2", b"2-*", b"3-0", b"5", b"5-*", b"0-1", b"0-0", b"7-3", b"x", b"-1"]
RANGE_IDS = [b"-", b"+", b"0", b"1-1", b"(1-1", b"2", b"(2-0", b"5-0", b"(+", b"(0-0", b"x"]
READ_IDS = [b"0", b"0-0", b"1-1", b"2-0", b"$", b">", b"x"]
GROUP_IDS = [b"0", b"$", b"1-1", b"3-0", b"x", b"-"]
FIELDS = [b"f", b"g", b"", b"\x00\r\n", b"1"]
GROUPS = [b"g0", b"g1"]
CONSUMERS = [b"c0", b"c1"]
COUNTS = [b"0", b"1", b"2", b"-1", b"x"]

key = st.sampled_from(KEYS)
group = st.sampled_from(GROUPS)
consumer = st.sampled_from(CONSUMERS)


def _cmd(*parts: Any) -> st.SearchStrategy[list[bytes]]:
    return st.tuples(*parts).map(
        lambda t: [x for p in t for x in (p if isinstance(p, list) else [p])]
    )


def _one(*options: list[bytes]) -> st.SearchStrategy[list[bytes]]:
    return st.sampled_from(list(options))


trim = _one(
    [],
    [],
    [b"MAXLEN", b"2"],
    [b"MAXLEN", b"=", b"1"],
    [b"MAXLEN", b"~", b"1"],
    [b"MAXLEN", b"0"],
    [b"MAXLEN", b"-1"],
    [b"MINID", b"2"],
    [b"MINID", b"~", b"3"],
    [b"MINID", b"x"],
    [b"MAXLEN", b"~", b"1", b"LIMIT", b"5"],
    [b"MAXLEN", b"1", b"LIMIT", b"5"],
    [b"LIMIT", b"5"],
    [b"MAXLEN", b"1", b"MINID", b"1"],
    [b"NOMKSTREAM"],
)
pairs = st.lists(st.sampled_from(FIELDS), min_size=1, max_size=4)

STREAM_COMMANDS = st.one_of(
    _cmd(st.just(b"XADD"), key, trim, st.sampled_from(IDS), pairs),
    _cmd(st.just(b"XADD"), key, st.sampled_from(IDS), pairs),
    _cmd(
        st.sampled_from([b"XRANGE", b"XREVRANGE"]),
        key,
        st.sampled_from(RANGE_IDS),
        st.sampled_from(RANGE_IDS),
        _one([], [b"COUNT", b"1"], [b"COUNT", b"0"], [b"COUNT", b"-2"], [b"COUNT"], [b"x"]),
    ),
    _cmd(st.just(b"XLEN"), key),
    _cmd(st.just(b"XDEL"), key, st.lists(st.sampled_from(IDS), min_size=1, max_size=3)),
    _cmd(st.just(b"XTRIM"), key, trim),
    _cmd(
        st.just(b"XSETID"),
        key,
        st.sampled_from([b"7-3", b"1-1", b"9", b"x"]),
        _one(
            [],
            [b"ENTRIESADDED", b"9"],
            [b"ENTRIESADDED", b"0"],
            [b"MAXDELETEDID", b"8"],
            [b"MAXDELETEDID", b"1-1"],
            [b"ENTRIESADDED"],
            [b"BOGUS", b"1"],
        ),
    ),
    _cmd(
        st.just(b"XREAD"),
        _one([], [b"COUNT", b"1"], [b"COUNT", b"-1"], [b"NOACK"], [b"GROUP", b"g0", b"c0"]),
        st.just(b"STREAMS"),
        st.sampled_from([[b"s0"], [b"s0", b"s1"], [b"str"]]).flatmap(
            lambda ks: st.lists(st.sampled_from(READ_IDS), min_size=len(ks), max_size=len(ks)).map(
                lambda ids, ks=ks: [*ks, *ids]
            )
        ),
    ),
    _cmd(
        st.just(b"XGROUP"),
        st.just(b"CREATE"),
        key,
        group,
        st.sampled_from(GROUP_IDS),
        _one([], [b"MKSTREAM"], [b"ENTRIESREAD", b"1"], [b"ENTRIESREAD", b"-2"], [b"x"]),
    ),
    _cmd(
        st.just(b"XGROUP"),
        st.just(b"SETID"),
        key,
        group,
        st.sampled_from(GROUP_IDS),
        _one([], [b"ENTRIESREAD", b"2"], [b"MKSTREAM"]),
    ),
    _cmd(st.just(b"XGROUP"), st.just(b"DESTROY"), key, group),
    _cmd(
        st.just(b"XGROUP"),
        st.sampled_from([b"CREATECONSUMER", b"DELCONSUMER"]),
        key,
        group,
        consumer,
    ),
    _cmd(st.just(b"XGROUP"), st.sampled_from([b"HELP", b"BOGUS", b"create"])),
    _cmd(
        st.just(b"XREADGROUP"),
        st.just(b"GROUP"),
        group,
        consumer,
        _one([], [b"COUNT", b"1"], [b"NOACK"], [b"COUNT", b"2", b"NOACK"]),
        st.just(b"STREAMS"),
        st.sampled_from([[b"s0"], [b"s0", b"s1"], [b"str"]]).flatmap(
            lambda ks: st.lists(
                st.sampled_from([b">", b">", b"0", b"1-1", b"$", b"x"]),
                min_size=len(ks),
                max_size=len(ks),
            ).map(lambda ids, ks=ks: [*ks, *ids])
        ),
    ),
    _cmd(st.just(b"XACK"), key, group, st.lists(st.sampled_from(IDS), min_size=1, max_size=3)),
    _cmd(st.just(b"XPENDING"), key, group),
    _cmd(
        st.just(b"XPENDING"),
        key,
        group,
        _one([], [b"IDLE", b"0"], [b"IDLE", b"100000000"], [b"IDLE", b"x"]),
        st.sampled_from(RANGE_IDS),
        st.sampled_from(RANGE_IDS),
        st.sampled_from([b"10", b"1", b"0", b"x"]),
        _one([], [b"c0"], [b"c1"], [b"nobody"]),
    ),
    _cmd(
        st.just(b"XCLAIM"),
        key,
        group,
        consumer,
        st.sampled_from([b"0", b"100000000", b"x"]),
        st.lists(st.sampled_from(IDS[:8]), min_size=1, max_size=3),
        _one(
            [],
            [b"JUSTID"],
            [b"FORCE"],
            [b"RETRYCOUNT", b"5"],
            [b"LASTID", b"7-3"],
            [b"FORCE", b"JUSTID"],
            [b"BOGUS"],
            [b"IDLE", b"x"],
        ),
    ),
    _cmd(
        st.just(b"XAUTOCLAIM"),
        key,
        group,
        consumer,
        st.sampled_from([b"0", b"100000000", b"x"]),
        st.sampled_from([b"0", b"1-2", b"(1-1", b"x"]),
        _one([], [b"COUNT", b"1"], [b"JUSTID"], [b"COUNT", b"0"], [b"x"]),
    ),
    _cmd(st.just(b"XINFO"), st.just(b"GROUPS"), key),
    _cmd(st.just(b"XINFO"), st.just(b"STREAM"), key),
    _cmd(st.just(b"XINFO"), st.just(b"CONSUMERS"), key, group),
    _cmd(st.just(b"XINFO"), st.sampled_from([b"HELP", b"BOGUS"])),
    _cmd(st.sampled_from([b"TYPE", b"DEL", b"EXISTS"]), key),
    _cmd(st.just(b"OBJECT"), st.just(b"ENCODING"), key),
    _cmd(st.just(b"SET"), st.just(b"str"), st.just(b"v")),
)

_LOOSE_COUNTERS = {b"idle", b"radix-tree-nodes"}


def _normal(cmd: list[bytes], value: Any) -> Any:
    """``value`` with the time-dependent numbers (module docstring) set to 0."""
    name = cmd[0].upper()
    if name == b"XPENDING" and len(cmd) > 3 and isinstance(value, list):
        return [[e[0], e[1], 0, e[3]] if isinstance(e, list) else e for e in value]
    return _zero_counters(value)


def _zero_counters(value: Any) -> Any:
    if isinstance(value, tuple) and value and value[0] == "map":
        return ("map", [(k, 0 if k in _LOOSE_COUNTERS else _zero_counters(v)) for k, v in value[1]])
    if isinstance(value, list):
        out = []
        for i, v in enumerate(value):
            prev = value[i - 1] if i else None
            loose = isinstance(prev, bytes) and prev in _LOOSE_COUNTERS and isinstance(v, int)
            out.append(0 if loose else _zero_counters(v))
        return out
    return value


def _same(cmd: list[bytes], want: Reply, got: Reply) -> bool:
    if want.raw == got.raw:
        return True
    return bool(_normal(cmd, want.value) == _normal(cmd, got.value))


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int]]:
    with oracle_pair(tmp_path_factory.mktemp("oracle-streams")) as ports:
        yield ports


_PROBES = (
    [b"TYPE"],
    [b"XRANGE", b"-", b"+"],
    [b"XINFO", b"STREAM"],
    [b"XINFO", b"GROUPS"],
    [b"XPENDING", b"g0"],
    [b"XPENDING", b"g1", b"-", b"+", b"10"],
)


def _run(ports: tuple[int, int], proto: int, examples: int) -> None:
    clients = [RawClient(p) for p in ports]
    if proto == 3:
        for c in clients:
            assert not isinstance(c.call("HELLO", 3).value, Err)

    @settings(
        max_examples=examples,
        derandomize=True,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(st.lists(STREAM_COMMANDS, min_size=1, max_size=25))
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
            for probe in _PROBES:
                full = (
                    [probe[0], *probe[1:2], k, *probe[2:]]
                    if probe[0] != b"TYPE"
                    else [
                        b"TYPE",
                        k,
                    ]
                )
                if probe[0] == b"XRANGE":
                    full = [b"XRANGE", k, b"-", b"+"]
                elif probe[0] == b"XPENDING":
                    full = [b"XPENDING", k, *probe[1:]]
                want, got = clients[0].call(*full), clients[1].call(*full)
                assert _same(full, want, got), (full, want.raw, got.raw, history)

    try:
        run()
    finally:
        for c in clients:
            c.close()


@pytest.mark.parametrize("proto", [2, 3])
def test_stream_command_sequences_match_redis(servers: tuple[int, int], proto: int) -> None:
    _run(servers, proto, int(os.environ.get("STREAM_EXAMPLES", "400")))
