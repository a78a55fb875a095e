"""A script that runs long (busy-reply-threshold, alias lua-time-limit), with real
clients: other clients' commands wait for a script (it is atomic) and are answered
-BUSY once the threshold has passed; SCRIPT KILL stops a script that has not written
and is refused (-UNKILLABLE) for one that has; the server serves again after. Replies
and their order are asserted, never times. The replies match redis-server's bytes
(test_busy_matches_redis)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from pion.config import ServerConfig
from pion.server.run import ServerThread
from support.keyspace import RawClient, RedisServer, read_reply

BUSY = (
    b"-BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.\r\n"
)
UNKILLABLE = (
    b"-UNKILLABLE Sorry the script already executed write commands against the dataset. "
    b"You can either wait the script termination or kill the server in a hard way using "
    b"the SHUTDOWN NOSAVE command.\r\n"
)
FOREVER = "local i = 0 while true do i = i + 1 end"
# long past a 50 ms threshold on any machine
WRITES_THEN_LOOPS = (
    "redis.call('set', 'w', '1') local i = 0 while i < 1e8 do i = i + 1 end return i"
)


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[dict[str, int]]:
    oracle = RedisServer(tmp_path)
    pion = ServerThread(ServerConfig(port=0, dir=tmp_path / "pion", appendfsync="no")).start()
    yield {"redis": oracle.port, "pion": pion.port}
    pion.stop()
    oracle.stop()


def _wait_busy(c: RawClient) -> None:
    """PING until the answer is BUSY (the threshold passed)."""
    while True:
        reply = c.call("PING").raw
        if reply == BUSY:
            return
        assert reply == b"+PONG\r\n"


@pytest.mark.parametrize("server", ["redis", "pion"])
def test_busy_matches_redis(servers: dict[str, int], server: str) -> None:
    port = servers[server]
    looping, other = RawClient(port), RawClient(port)
    assert other.call("CONFIG", "SET", "busy-reply-threshold", "50").raw == b"+OK\r\n"
    assert other.call("CONFIG", "GET", "lua-time-limit").value == [b"lua-time-limit", b"50"]
    looping.send("EVAL", FOREVER, "0")
    _wait_busy(other)
    assert other.call("SET", "k", "v").raw == BUSY
    assert other.call("SCRIPT", "KILL").raw == b"+OK\r\n"
    assert read_reply(looping.f).raw == (
        b"-ERR Script killed by user with SCRIPT KILL... script: "
        b"3fcf51a9b854b8f66cb8685600b0d7df968f4398, on @user_script:1.\r\n"
    )
    assert other.call("SCRIPT", "KILL").raw == b"-NOTBUSY No scripts in execution right now.\r\n"
    assert other.call("GET", "k").raw == b"$-1\r\n"  # the refused SET did not run
    # a script that wrote cannot be killed; it ends on its own
    looping.send("EVAL", WRITES_THEN_LOOPS, "0")
    _wait_busy(other)
    assert other.call("SCRIPT", "KILL").raw == UNKILLABLE
    assert other.call("GET", "w").raw == BUSY
    assert read_reply(looping.f).raw == b":100000000\r\n"
    assert other.call("GET", "w").raw == b"$1\r\n1\r\n"
    other.call("CONFIG", "SET", "busy-reply-threshold", "5000")
    looping.close()
    other.close()


def test_other_clients_never_see_a_script_half_done(servers: dict[str, int]) -> None:
    """Before the threshold other clients' commands wait for the script: each sees
    none or all of its writes, never part of them."""
    port = servers["pion"]
    looping = RawClient(port)
    looping.call("CONFIG", "SET", "busy-reply-threshold", "600000")
    body = """
        redis.call('set', 'a', '1')
        local i = 0 while i < 2e7 do i = i + 1 end
        redis.call('set', 'b', '2')
        return 'done'
    """
    looping.send("EVAL", body, "0")
    replies: dict[int, bytes] = {}

    def reader(i: int) -> None:
        c = RawClient(port)
        replies[i] = c.call("MGET", "a", "b").raw
        c.close()

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert read_reply(looping.f).raw == b"$4\r\ndone\r\n"
    none, both = b"*2\r\n$-1\r\n$-1\r\n", b"*2\r\n$1\r\n1\r\n$1\r\n2\r\n"
    assert len(replies) == 4 and set(replies.values()) <= {none, both}
    looping.close()
