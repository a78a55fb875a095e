"""redis-server as the oracle for GEO*, ZRANGESTORE and SORT: hypothesis generates
command sequences, sends each to a real redis-server and to pion-server and compares
the replies byte for byte, in RESP2 and RESP3; the keys' states must agree at the end.
A fixed scenario checks the keyspace notifications of these commands.

Some geo members share a position, so COUNT cuts among equal distances (Redis's
partial quicksort decides where ties land; ours is a port of it). Compared loosely,
only where the two cannot agree: SORT of a set ``BY nosort`` (Redis's order is its hash
table's) and ALPHA sorts BY a pattern of a set or sorted set (ties keep the order the
elements were read in, a hash table's in Redis) are compared as multisets of their
per-element groups.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.keyspace import Err, RawClient, Reply, oracle_pair, read_reply


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int]]:
    with oracle_pair(tmp_path_factory.mktemp("oracle-geo")) as ports:
        yield ports


def _cmd(*parts: Any) -> st.SearchStrategy[list[bytes]]:
    return st.tuples(*parts).map(
        lambda t: [x for p in t for x in (p if isinstance(p, list) else [p])]
    )


def _run(
    ports: tuple[int, int],
    proto: int,
    commands: st.SearchStrategy[list[bytes]],
    *,
    probes: list[list[bytes]],
    setup: list[list[bytes]],
    examples: int = 200,
) -> None:
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
    @given(st.lists(commands, min_size=1, max_size=20))
    def run(sequence: list[list[bytes]]) -> None:
        for c in clients:
            assert c.call("FLUSHALL").raw == b"+OK\r\n"
            for cmd in setup:
                assert not isinstance(c.call(*cmd).value, Err), cmd
        history: list[list[bytes]] = []
        for cmd in sequence:
            want, got = clients[0].call(*cmd), clients[1].call(*cmd)
            assert _same(cmd, want, got), (
                f"\ncommand  {cmd!r}\nredis    {want.raw!r}\npion     {got.raw!r}\n"
                f"after    {history!r}"
            )
            history.append(cmd)
        for probe in probes:
            want, got = clients[0].call(*probe), clients[1].call(*probe)
            assert want.raw == got.raw, (probe, want.raw, got.raw, history)

    try:
        run()
    finally:
        for c in clients:
            c.close()


# -- GEO and ZRANGESTORE -------------------------------------------------------------

GEO_KEYS = [b"g0", b"g1", b"str"]
# Each member's own positions: Sicily, the poles' edges, the antimeridian, the equator.
PLACES: dict[bytes, list[tuple[bytes, bytes]]] = {
    b"Palermo": [(b"13.361389", b"38.115556"), (b"13.4", b"38.2")],
    b"Catania": [(b"15.087269", b"37.502669")],
    b"Palermo2": [(b"13.361389", b"38.115556")],
    b"Palermo3": [(b"13.361389", b"38.115556"), (b"13.4", b"38.2")],
    b"Agrigento": [(b"13.583333", b"37.316667"), (b"13.6", b"37.3")],
    b"north": [(b"179.9", b"85.05112878"), (b"-0.5", b"84.9")],
    b"south": [(b"-179.95", b"-85.05112878"), (b"0.25", b"-80.5")],
    b"east": [(b"180", b"0.1234"), (b"-180", b"-0.125")],
    b"zero": [(b"0", b"0"), (b"0.001", b"-0.002")],
    b"\x00\r\n": [(b"2.3522", b"48.8566")],
}
MEMBERS = [*PLACES, b"nope"]
INVALID = [(b"181", b"0"), (b"0", b"85.06"), (b"x", b"1"), (b"1", b""), (b"nan", b"1")]
CENTERS = [b"15", b"37", b"0", b"-179.5", b"85", b"-85", b"13.5", b"x", b"200"]
RADII = [b"0", b"1", b"50", b"200", b"5000", b"20000", b"-1", b"x", b"0.5"]
UNITS = [b"m", b"km", b"mi", b"ft", b"KM", b"yd"]

member = st.sampled_from(MEMBERS)
geo_key = st.sampled_from([b"g0", b"g0", b"g0", b"g1", b"str"])
triple = st.sampled_from(list(PLACES.items())).flatmap(
    lambda kv: st.sampled_from(kv[1]).map(lambda pos: [pos[0], pos[1], kv[0]])
)
bad_triple = st.sampled_from(INVALID).map(lambda pos: [pos[0], pos[1], b"bad"])
coord = st.sampled_from(CENTERS)
radius = st.sampled_from(RADII)
unit = st.sampled_from(UNITS)
# Centres near the members, and radii that reach some of them.
good_center = st.sampled_from(
    [[b"15", b"37"], [b"13.5", b"38"], [b"0", b"0"], [b"179.5", b"84"], [b"-179.5", b"-84"]]
)
good_radius = st.sampled_from([b"0", b"50", b"200", b"300", b"2000", b"5000", b"20000"])
good_unit = st.sampled_from([b"km", b"km", b"mi", b"KM", b"m"])

_GOOD_OPTIONS = [
    [b"ASC"],
    [b"DESC"],
    [b"COUNT", b"1"],
    [b"COUNT", b"3"],
    [b"COUNT", b"2", b"ANY"],
    [b"WITHDIST"],
    [b"WITHCOORD"],
    [b"WITHHASH"],
]
_BAD_OPTIONS = [[b"COUNT", b"0"], [b"COUNT", b"x"], [b"ANY"], [b"BOGUS"]]
search_options = st.lists(st.sampled_from(_GOOD_OPTIONS * 4 + _BAD_OPTIONS), max_size=4).map(
    lambda groups: [w for g in groups for w in g]
)
store_options = st.sampled_from(
    [[], [], [b"STORE", b"g1"], [b"STOREDIST", b"g1"], [b"STORE", b"zd"], [b"STORE"]]
)
from_part = st.one_of(
    st.tuples(member).map(lambda t: [b"FROMMEMBER", t[0]]),
    st.tuples(coord, coord).map(lambda t: [b"FROMLONLAT", t[0], t[1]]),
)
by_part = st.one_of(
    st.tuples(radius, unit).map(lambda t: [b"BYRADIUS", t[0], t[1]]),
    st.tuples(radius, radius, unit).map(lambda t: [b"BYBOX", t[0], t[1], t[2]]),
)
good_from = st.one_of(
    st.tuples(member).map(lambda t: [b"FROMMEMBER", t[0]]),
    good_center.map(lambda c: [b"FROMLONLAT", *c]),
)
good_by = st.one_of(
    st.tuples(good_radius, good_unit).map(lambda t: [b"BYRADIUS", t[0], t[1]]),
    st.tuples(good_radius, good_radius, good_unit).map(lambda t: [b"BYBOX", t[0], t[1], t[2]]),
)
# Mostly one FROM and one BY; sometimes a part left out, given twice or malformed, to
# reach the "exactly one of" and the argument errors.
search_parts = st.one_of(
    st.tuples(good_from, good_by).map(lambda t: [*t[0], *t[1]]),
    st.tuples(good_by, good_from).map(lambda t: [*t[0], *t[1]]),
    st.tuples(good_from, good_by).map(lambda t: [*t[0], *t[1]]),
    st.lists(st.one_of(from_part, by_part), min_size=0, max_size=3).map(
        lambda groups: [w for g in groups for w in g]
    ),
)
zrange_options = st.lists(
    st.sampled_from(
        [[b"BYSCORE"], [b"BYLEX"], [b"REV"], [b"LIMIT", b"0", b"2"], [b"LIMIT", b"1", b"-1"]]
    ),
    max_size=3,
).map(lambda groups: [w for g in groups for w in g])

GEO_COMMANDS = st.one_of(
    _cmd(st.just(b"GEOADD"), st.just(b"g0"), st.lists(triple, min_size=1, max_size=4)).map(
        lambda c: [*c[:2], *(w for t in c[2:] for w in t)]
    ),
    _cmd(
        st.just(b"GEOADD"),
        geo_key,
        st.sampled_from([[], [b"NX"], [b"XX"], [b"CH"], [b"NX", b"CH"], [b"NX", b"XX"]]),
        st.lists(st.one_of(*[triple] * 10, bad_triple), min_size=0, max_size=4).map(
            lambda ts: [w for t in ts for w in t]
        ),
    ),
    _cmd(st.sampled_from([b"GEOPOS", b"GEOHASH"]), geo_key, st.lists(member, max_size=3)),
    _cmd(
        st.just(b"GEODIST"),
        geo_key,
        member,
        member,
        st.sampled_from([[], [b"km"], [b"MI"], [b"ft"], [b"yd"], [b"m", b"x"]]),
    ),
    _cmd(
        st.sampled_from([b"GEOSEARCH", b"GEOSEARCHSTORE g1"]),
        geo_key,
        search_parts,
        search_options,
    ).map(lambda c: [*c[0].split(), *c[1:]]),
    _cmd(st.just(b"GEOSEARCHSTORE"), st.just(b"zd"), geo_key, from_part, by_part).map(
        lambda c: [*c, b"STOREDIST"] if len(c) % 2 else c
    ),
    _cmd(
        st.sampled_from([b"GEORADIUS", b"GEORADIUS_RO"]),
        geo_key,
        coord,
        coord,
        radius,
        unit,
        search_options,
        store_options,
    ),
    _cmd(
        st.sampled_from([b"GEORADIUS", b"GEORADIUS_RO"]),
        geo_key,
        good_center,
        good_radius,
        good_unit,
        search_options,
    ),
    _cmd(
        st.sampled_from([b"GEORADIUSBYMEMBER", b"GEORADIUSBYMEMBER_RO"]),
        geo_key,
        member,
        radius,
        unit,
        search_options,
        store_options,
    ),
    _cmd(
        st.just(b"ZRANGESTORE"),
        st.sampled_from([b"zd", b"g1", b"str"]),
        geo_key,
        st.sampled_from([b"0", b"1", b"-1", b"(3479099956230698", b"[a", b"-", b"+", b"x"]),
        st.sampled_from([b"-1", b"2", b"+inf", b"4000000000000000", b"[z", b"+", b"-"]),
        zrange_options,
    ),
    _cmd(
        st.just(b"ZRANGESTORE"),
        st.sampled_from([b"zd", b"g1"]),
        st.just(b"g0"),
        st.sampled_from(
            [
                [b"0", b"-1"],
                [b"1", b"2", b"REV"],
                [b"-inf", b"+inf", b"BYSCORE", b"LIMIT", b"1", b"2"],
                [b"+inf", b"(3479099956230698", b"BYSCORE", b"REV"],
                [b"-", b"+", b"BYLEX"],
                [b"[z", b"[b", b"BYLEX", b"REV", b"LIMIT", b"0", b"3"],
            ]
        ),
    ),
    _cmd(st.just(b"ZADD"), geo_key, st.sampled_from([b"1", b"3479099956230698"]), member),
    _cmd(st.just(b"ZREM"), geo_key, member),
    _cmd(st.just(b"SET"), st.sampled_from([b"str", b"g1", b"zd"]), st.just(b"v")),
    _cmd(st.just(b"DEL"), st.sampled_from([b"g0", b"g1"])),
)
# Every sequence starts from every member in g0, at its first position.
GEO_SETUP = [[b"GEOADD", b"g0", *(w for m, pos in PLACES.items() for w in (*pos[0], m))]]
GEO_PROBES = [[b"TYPE", k] for k in (*GEO_KEYS, b"zd")] + [
    [b"ZRANGE", k, b"0", b"-1", b"WITHSCORES"] for k in (b"g0", b"g1", b"zd")
]


@pytest.mark.parametrize("proto", [2, 3])
def test_geo_command_sequences_match_redis(servers: tuple[int, int], proto: int) -> None:
    _run(servers, proto, GEO_COMMANDS, probes=GEO_PROBES, setup=GEO_SETUP, examples=300)


# -- SORT -------------------------------------------------------------------------------

ELEMENTS = [b"3", b"1", b"10", b"-2.5", b"007", b"b", b"a", b"", b"1e400", b" 4", b"inf"]
NUMERIC = [b"3", b"1", b"10", b"-2.5", b"007", b" 4", b"inf", b"2"]
element = st.sampled_from(ELEMENTS)
numeric = st.sampled_from(NUMERIC)
SORT_KEYS = [b"l0", b"s0", b"z0", b"dst", b"str", b"nokey"]
PATTERNS = [b"w_*", b"h_*->f", b"nosort", b"#", b"w_*->", b"o_*", b"*", b"h_*->g"]
pattern = st.sampled_from(PATTERNS)
_SORT_GOOD = [
    [b"ASC"],
    [b"DESC"],
    [b"ALPHA"],
    [b"ALPHA"],
    [b"LIMIT", b"0", b"3"],
    [b"LIMIT", b"2", b"-1"],
    [b"LIMIT", b"-1", b"2"],
    [b"LIMIT", b"9", b"1"],
    [b"LIMIT", b"1", b"0"],
]
_SORT_BAD = [[b"LIMIT", b"x", b"1"], [b"LIMIT", b"1"], [b"BOGUS"]]
sort_options = st.lists(
    st.one_of(
        st.sampled_from(_SORT_GOOD * 4 + _SORT_BAD),
        pattern.map(lambda p: [b"BY", p]),
        pattern.map(lambda p: [b"GET", p]),
    ),
    max_size=4,
).map(lambda groups: [w for g in groups for w in g])


def _by_star(cmd: list[bytes]) -> bool:
    """Whether the last BY pattern names keys (Redis sorts by the last BY)."""
    upper = [w.upper() for w in cmd]
    patterns = [cmd[i + 1] for i, w in enumerate(upper[:-1]) if w == b"BY"]
    return bool(patterns) and b"*" in patterns[-1] and not any(b"*" not in p for p in patterns)


def _stored_order_is_redis(cmd: list[bytes]) -> bool:
    """A stored ALPHA sort BY a pattern of a set or sorted set keeps equal elements in
    Redis's hash-table order: not generated (its replies are compared loosely)."""
    alpha = any(w.upper() == b"ALPHA" for w in cmd)
    return not (cmd[1] in (b"s0", b"z0") and alpha and _by_star(cmd))


sort_key = st.sampled_from([b"l0", b"l0", b"s0", b"s0", b"z0", b"z0", *SORT_KEYS])
SORT_COMMANDS = st.one_of(
    _cmd(
        st.just(b"RPUSH"),
        st.sampled_from([b"l0", b"dst"]),
        st.lists(numeric, min_size=1, max_size=4),
    ),
    _cmd(
        st.just(b"RPUSH"),
        st.sampled_from([b"l0", b"dst"]),
        st.lists(element, min_size=1, max_size=2),
    ),
    _cmd(st.just(b"SADD"), st.just(b"s0"), st.lists(numeric, min_size=1, max_size=4)),
    _cmd(st.just(b"SADD"), st.just(b"s0"), st.lists(element, min_size=1, max_size=2)),
    _cmd(st.just(b"ZADD"), st.just(b"z0"), numeric.filter(lambda n: n.strip() == n), element),
    _cmd(st.just(b"SET"), element.map(lambda e: b"w_" + e), st.sampled_from([*NUMERIC, b"x"])),
    _cmd(st.just(b"SET"), element.map(lambda e: b"o_" + e), st.sampled_from([b"one", b"two"])),
    _cmd(
        st.just(b"HSET"),
        element.map(lambda e: b"h_" + e),
        st.sampled_from([b"f", b"g"]),
        st.sampled_from([*NUMERIC, b"z"]),
    ),
    _cmd(st.just(b"SET"), st.just(b"str"), st.just(b"v")),
    _cmd(st.sampled_from([b"SORT", b"SORT_RO"]), sort_key, sort_options),
    _cmd(st.sampled_from([b"SORT", b"SORT_RO"]), sort_key, sort_options),
    _cmd(
        st.sampled_from([b"SORT", b"SORT", b"SORT_RO"]),
        sort_key,
        sort_options,
        st.sampled_from([[b"STORE", b"dst"], [b"STORE", b"l0"], [b"STORE"]]),
    ).filter(_stored_order_is_redis),
)
SORT_SETUP = [
    [b"RPUSH", b"l0", b"3", b"1", b"10", b"2"],
    [b"SADD", b"s0", b"5", b"-1", b"2.5", b"100"],
    [b"ZADD", b"z0", b"1", b"10", b"2", b"3", b"3", b"1"],
    [b"MSET", b"w_3", b"1", b"w_1", b"3", b"w_10", b"2", b"o_3", b"three", b"o_1", b"one"],
    [b"HSET", b"h_1", b"f", b"9", b"g", b"x"],
    [b"HSET", b"h_2", b"f", b"-4", b"g", b"y"],
]
SORT_PROBES = [[b"TYPE", k] for k in SORT_KEYS] + [
    [b"LRANGE", k, b"0", b"-1"] for k in (b"l0", b"dst")
]


def _groups(cmd: list[bytes], value: Any) -> list[Any]:
    upper = [w.upper() for w in cmd]
    size = max(1, upper.count(b"GET"))
    return sorted(repr(value[i : i + size]) for i in range(0, len(value), size))


def _same(cmd: list[bytes], want: Reply, got: Reply) -> bool:
    if want.raw == got.raw:
        return True
    name = cmd[0].upper()
    if name not in (b"SORT", b"SORT_RO") or cmd[1] not in (b"s0", b"z0"):
        return False
    if not (isinstance(want.value, list) and isinstance(got.value, list)):
        return False
    upper = [w.upper() for w in cmd]
    by_star = _by_star(cmd)
    unsorted_set = cmd[1] == b"s0" and b"BY" in upper and not by_star
    if unsorted_set or (b"ALPHA" in upper and by_star):
        return _groups(cmd, want.value) == _groups(cmd, got.value)
    return False


@pytest.mark.parametrize("proto", [2, 3])
def test_sort_command_sequences_match_redis(servers: tuple[int, int], proto: int) -> None:
    _run(servers, proto, SORT_COMMANDS, probes=SORT_PROBES, setup=SORT_SETUP, examples=300)


# -- keyspace notifications -------------------------------------------------------------

NOTIFY_SETUP = [
    ["RPUSH", "l", "3", "1", "2"],
    ["SET", "victim", "v"],
    ["SET", "victim2", "v"],
    ["SET", "victim3", "v"],
]
NOTIFY_COMMANDS = [
    ["GEOADD", "g", "13.361389", "38.115556", "Palermo", "15.087269", "37.502669", "Catania"],
    ["GEOADD", "g", "13.361389", "38.115556", "Palermo"],
    ["GEOADD", "g", "CH", "13.4", "38.115556", "Palermo"],
    ["GEOADD", "g", "1", "100", "bad"],
    ["GEORADIUS", "g", "15", "37", "200", "km", "STORE", "r"],
    ["GEORADIUS", "g", "15", "37", "1", "m", "STORE", "r"],
    ["GEORADIUSBYMEMBER", "g", "Palermo", "1", "km", "STOREDIST", "r2"],
    ["GEORADIUS", "nokey", "15", "37", "1", "m", "STORE", "victim"],
    ["GEOSEARCHSTORE", "s", "g", "FROMMEMBER", "Palermo", "BYBOX", "500", "500", "km"],
    ["GEOSEARCHSTORE", "s", "g", "FROMLONLAT", "0", "0", "BYRADIUS", "1", "km"],
    ["ZRANGESTORE", "zr", "g", "0", "0"],
    ["ZRANGESTORE", "zr", "g", "0", "-1"],
    ["ZRANGESTORE", "zr", "g", "5", "9"],
    ["ZRANGESTORE", "victim2", "nokey", "0", "-1"],
    ["SORT", "l", "STORE", "sl"],
    ["SORT", "l", "STORE", "sl"],
    ["SORT", "nokey", "STORE", "sl"],
    ["SORT", "nokey", "STORE", "victim3"],
    ["SORT", "l"],
]


def _notify_transcript(port: int, flags: str) -> list[list[bytes]]:
    actor, sub = RawClient(port), RawClient(port)
    try:
        actor.call("FLUSHALL")
        for cmd in NOTIFY_SETUP:
            actor.call(*cmd)
        sub.call("PSUBSCRIBE", "__key*__:*")
        assert actor.call("CONFIG", "SET", "notify-keyspace-events", flags).raw == b"+OK\r\n"
        out = []
        for i, cmd in enumerate(NOTIFY_COMMANDS):
            reply = actor.call(*cmd).raw
            sub.send("PING", b"s%d" % i)
            got = []
            while (r := read_reply(sub.f)).value != [b"pong", b"s%d" % i]:
                got.append(r.raw)
            out.append([reply, *got])
        return out
    finally:
        actor.call("CONFIG", "SET", "notify-keyspace-events", "")
        actor.close()
        sub.close()


@pytest.mark.parametrize("flags", ["KEA", "KEAn", "Kg", "El", "Ez"])
def test_notifications_match_redis(servers: tuple[int, int], flags: str) -> None:
    oracle, pion = servers
    assert _notify_transcript(pion, flags) == _notify_transcript(oracle, flags)


def test_a_scripts_sort_of_a_set_by_nosort_is_sorted_as_in_redis(
    servers: tuple[int, int],
) -> None:
    replies = []
    for port in servers:
        c = RawClient(port)
        c.call("DEL", "ss")
        c.call("SADD", "ss", "3", "1", "2", "b", "a", "10")
        replies.append(
            [
                c.call("EVAL", "return redis.call('SORT', KEYS[1], 'BY', 'nosort')", 1, "ss").raw,
                c.call(
                    "EVAL",
                    "return redis.call('SORT_RO', KEYS[1], 'BY', 'nosort', 'DESC', 'LIMIT', 1, 3)",
                    1,
                    "ss",
                ).raw,
            ]
        )
        c.close()
    assert replies[0] == replies[1]
    assert replies[1][0].endswith(b"$1\r\na\r\n$1\r\nb\r\n")  # sorted, ALPHA
