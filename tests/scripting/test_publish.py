"""A script that publishes, against a real redis-server as the oracle: ``PUBLISH``
from ``redis.call`` and the keyspace notifications of a script's writes reach the
subscribers, in RESP2 and RESP3, with the same bytes as redis-server 7's. A script
runs on its own thread (``pion.scripting.runtime``) while the loop thread is parked:
the messages it publishes are flushed by the loop once the script is done."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from support.keyspace import RawClient, oracle_pair, read_reply


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int]]:
    with oracle_pair(tmp_path_factory.mktemp("script-publish-oracle")) as ports:
        yield ports


SCRIPT = (
    "redis.call('publish', 'ch', 'one'); redis.call('set', KEYS[1], 'v'); "
    "redis.call('del', KEYS[1]); return redis.call('publish', 'ch', 'two')"
)


def _transcript(port: int, proto: str) -> list[bytes]:
    actor, sub = RawClient(port), RawClient(port)
    try:
        actor.call("CONFIG", "SET", "notify-keyspace-events", "E$g")
        sub.call("HELLO", proto)
        sub.call("SUBSCRIBE", "ch", "__keyevent@0__:set", "__keyevent@0__:del")
        for _ in range(2):
            read_reply(sub.f)  # the other two subscriptions' confirmations
        out = [actor.call("EVAL", SCRIPT, "1", "k").raw]
        sub.send("PING", "end")
        while (reply := read_reply(sub.f)).value not in ([b"pong", b"end"], b"end"):
            out.append(reply.raw)
        return out
    finally:
        actor.call("CONFIG", "SET", "notify-keyspace-events", "")
        actor.close()
        sub.close()


@pytest.mark.parametrize("proto", ["2", "3"])
def test_a_scripts_messages_reach_subscribers(servers: tuple[int, int], proto: str) -> None:
    oracle, pion = servers
    expected = _transcript(oracle, proto)
    assert expected[0] == b":1\r\n"
    assert len(expected) == 5  # one, set, del, two
    assert _transcript(pion, proto) == expected


def _self_subscribed(port: int) -> list[bytes]:
    c = RawClient(port)
    try:
        c.call("HELLO", "3")
        c.call("CONFIG", "SET", "notify-keyspace-events", "KEl")
        c.call("PSUBSCRIBE", "__key*__:*")
        body = "redis.call('rpush', KEYS[1], 'a'); return redis.call('publish', 'mine', 'y')"
        c.send("SUBSCRIBE", "mine")
        c.send("EVAL", body, "1", "k")
        c.send("PING", "end")
        got = []
        while (reply := read_reply(c.f)).value != b"end":
            got.append(reply.raw)
        c.call("CONFIG", "SET", "notify-keyspace-events", "")
        return got
    finally:
        c.close()


def test_a_resp3_client_gets_its_scripts_messages_before_the_reply(
    servers: tuple[int, int],
) -> None:
    oracle, pion = servers
    expected = _self_subscribed(oracle)
    assert expected[-1] == b":1\r\n"  # SUBSCRIBE's push, three messages, then EVAL's reply
    assert _self_subscribed(pion) == expected
