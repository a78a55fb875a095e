"""Pub/sub against a real redis-server as the oracle: scenarios and hypothesis-generated
sequences of SUBSCRIBE/PSUBSCRIBE/SSUBSCRIBE, their UNSUBSCRIBEs, PUBLISH, SPUBLISH,
PUBSUB and commands refused in subscribed mode, over three connections, in RESP2 and
RESP3; every connection's bytes after every step must be the same.

After each step every connection is sent ``PING sync<i>`` and read up to its answer
(a bulk, or RESP2 subscribed mode's ``pong`` array, or ``+QUEUED`` inside MULTI):
what came before it is what the step delivered there. The acting connection is read
first, so its command has run (and delivered to the others) before they are read.

Only what Redis leaves to its hash tables' order is compared as a set: the
confirmations of an UNSUBSCRIBE without arguments, the messages a publish delivers to
other connections (several matching patterns), and PUBSUB CHANNELS.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.keyspace import RawClient, oracle_pair, read_reply

Step = tuple[int, list[bytes]]
_UNSUBS = (b"UNSUBSCRIBE", b"PUNSUBSCRIBE", b"SUNSUBSCRIBE")


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int]]:
    with oracle_pair(tmp_path_factory.mktemp("pubsub-oracle")) as ports:
        yield ports


def _marker(value: Any, marker: bytes) -> bool:
    # Inside MULTI the PING is queued: its +QUEUED ends the step (on both servers
    # alike; the first +QUEUED read may be the command's own, the PING's then opens
    # the next step's bytes, and EXEC's array holds the PINGs' replies).
    return value in (marker, [b"pong", marker], b"QUEUED")


def _normalize(step: Step, acting: bool, replies: list[Any]) -> object:
    argv = step[1]
    name = argv[0].upper()
    raws = [r.raw for r in replies]
    if not acting:
        return sorted(raws)
    if name in _UNSUBS and len(argv) == 1:
        names = sorted(repr(r.value[1]) for r in replies)
        counts = sorted(r.value[2] for r in replies)
        return names, counts
    if name == b"PUBSUB" and len(argv) > 1 and argv[1].upper().endswith(b"CHANNELS"):
        return [sorted(r.value) if isinstance(r.value, list) else r.raw for r in replies]
    if name in (b"PUBLISH", b"SPUBLISH"):
        return sorted(raws[:-1]), raws[-1:]
    return raws


def _run(port: int, proto: int, steps: Sequence[Step], nconn: int = 3) -> list[object]:
    conns = [RawClient(port, timeout=20) for _ in range(nconn)]
    try:
        for c in conns:
            c.call("HELLO", proto)
        transcript: list[object] = []
        for i, step in enumerate(steps):
            who, argv = step
            conns[who].send(*argv)
            order = [who] + [j for j in range(nconn) if j != who]
            marker = b"sync%d" % i
            for j in order:
                conns[j].send("PING", marker)
                got = []
                while not _marker((reply := read_reply(conns[j].f)).value, marker):
                    got.append(reply)
                transcript.append((i, j, _normalize(step, j == who, got)))
        return transcript
    finally:
        for c in conns:
            c.close()


def _compare(servers: tuple[int, int], steps: Sequence[Step]) -> None:
    oracle, pion = servers
    for proto in (2, 3):
        expected = _run(oracle, proto, steps)
        assert _run(pion, proto, steps) == expected, f"RESP{proto}"


def _script(*lines: str) -> list[Step]:
    """``"1: PUBLISH a x"`` runs on connection 1; no prefix, connection 0."""
    out: list[Step] = []
    for line in lines:
        who, text = (int(line[0]), line[3:]) if line[1:3] == ": " else (0, line)
        out.append((who, [w.encode() for w in text.split(" ")]))
    return out


SCENARIOS: dict[str, list[Step]] = {
    "subscribe-publish": _script(
        "SUBSCRIBE a b",
        "1: PUBLISH a hello",
        "1: PUBLISH c nobody",
        "UNSUBSCRIBE a",
        "1: PUBLISH a x",
    ),
    "subscribed-mode": _script(
        "SUBSCRIBE a",
        "PING",
        "PING hi",
        "SET k v",
        "GET k",
        "PUBSUB NUMSUB a",
        "PUBSUB nosuch",
        "HELLO 4",
        "UNSUBSCRIBE",
        "SET k v",
        "UNSUBSCRIBE",
    ),
    "patterns": _script(
        "PSUBSCRIBE a* h?llo [xy]z",
        "1: SUBSCRIBE abc",
        "2: PUBLISH abc m1",
        "2: PUBLISH hello m2",
        "2: PUBLISH yz m3",
        "2: PUBSUB NUMPAT",
        "PUNSUBSCRIBE a* nosuch",
        "2: PUBLISH abc m4",
        "PUNSUBSCRIBE",
        "2: PUBSUB NUMPAT",
    ),
    "self-publish": _script("SUBSCRIBE a", "PSUBSCRIBE *", "PUBLISH a me", "1: PUBLISH a you"),
    "shard": _script(
        "SSUBSCRIBE s t",
        "SUBSCRIBE s",
        "1: SPUBLISH s x",
        "1: PUBLISH s y",
        "1: PUBSUB SHARDNUMSUB s t u",
        "1: PUBSUB SHARDCHANNELS",
        "1: PUBSUB SHARDCHANNELS t*",
        "SUNSUBSCRIBE s",
        "SUNSUBSCRIBE",
        "SUNSUBSCRIBE",
        "UNSUBSCRIBE",
    ),
    "pubsub-introspection": _script(
        "SUBSCRIBE a b",
        "1: SUBSCRIBE b",
        "2: PUBSUB NUMSUB a b c",
        "2: PUBSUB NUMSUB",
        "2: PUBSUB CHANNELS",
        "2: PUBSUB CHANNELS a*",
        "2: PUBSUB CHANNELS a b",
        "2: PUBSUB NUMPAT x",
        "2: PUBSUB HELP",
        "2: PUBSUB HELP x",
        "2: PUBSUB",
        "2: PUBSUB NOSUCH",
        "2: PUBLISH a",
        "2: SUBSCRIBE",
        "2: PSUBSCRIBE",
        "2: SPUBLISH s",
    ),
    "unsubscribe-unsubscribed": _script(
        "UNSUBSCRIBE",
        "PUNSUBSCRIBE",
        "SUNSUBSCRIBE",
        "UNSUBSCRIBE a",
        "PSUBSCRIBE p",
        "UNSUBSCRIBE",
    ),
    "exec": _script(
        "MULTI", "SUBSCRIBE a", "PUBLISH a x", "1: PUBLISH a y", "EXEC", "1: PUBLISH a z"
    ),
    "duplicates": _script("SUBSCRIBE a a b", "SUBSCRIBE a", "1: PUBLISH a once", "UNSUBSCRIBE b b"),
    "binary-names": [
        (0, [b"SUBSCRIBE", b"", b"\x00\r\n\xff"]),
        (1, [b"PUBLISH", b"", b"\r\n"]),
        (1, [b"PUBLISH", b"\x00\r\n\xff", b""]),
        (0, [b"PSUBSCRIBE", b"\\*x"]),
        (1, [b"PUBLISH", b"*x", b"escaped"]),
        (1, [b"PUBLISH", b"ax", b"not"]),
    ],
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenario(servers: tuple[int, int], name: str) -> None:
    _compare(servers, SCENARIOS[name])


CHANNELS = [b"a", b"b", b"ab", b"", b"h\x00"]
PATTERNS = [b"a*", b"*", b"?", b"[ab]", b"h\\\x00", b"x"]
MESSAGES = [b"m", b"", b"\r\n"]


def _command() -> st.SearchStrategy[list[bytes]]:
    chans = st.lists(st.sampled_from(CHANNELS), max_size=3)
    pats = st.lists(st.sampled_from(PATTERNS), max_size=3)
    some_chans = st.lists(st.sampled_from(CHANNELS), min_size=1, max_size=3)
    some_pats = st.lists(st.sampled_from(PATTERNS), min_size=1, max_size=3)
    chan, msg = st.sampled_from(CHANNELS), st.sampled_from(MESSAGES)
    return st.one_of(
        some_chans.map(lambda c: [b"SUBSCRIBE", *c]),
        chans.map(lambda c: [b"UNSUBSCRIBE", *c]),
        some_pats.map(lambda p: [b"PSUBSCRIBE", *p]),
        pats.map(lambda p: [b"PUNSUBSCRIBE", *p]),
        some_chans.map(lambda c: [b"SSUBSCRIBE", *c]),
        chans.map(lambda c: [b"SUNSUBSCRIBE", *c]),
        st.tuples(chan, msg).map(lambda t: [b"PUBLISH", *t]),
        st.tuples(chan, msg).map(lambda t: [b"SPUBLISH", *t]),
        chans.map(lambda c: [b"PUBSUB", b"NUMSUB", *c]),
        chans.map(lambda c: [b"PUBSUB", b"SHARDNUMSUB", *c]),
        st.just([b"PUBSUB", b"NUMPAT"]),
        st.lists(st.sampled_from(PATTERNS), max_size=1).map(lambda p: [b"PUBSUB", b"CHANNELS", *p]),
        st.just([b"PING"]),
        st.just([b"SET", b"k", b"v"]),
    )


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=st.lists(st.tuples(st.integers(0, 2), _command()), min_size=1, max_size=12))
def test_sequences(servers: tuple[int, int], steps: list[Step]) -> None:
    _compare(servers, steps)
