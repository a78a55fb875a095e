"""A function that runs long, as an EVAL script does (test_busy.py): other clients
wait, then are answered -BUSY (naming FUNCTION KILL) once busy-reply-threshold has
passed; FUNCTION STATS names the running function; FUNCTION KILL stops it (SCRIPT KILL
is refused with -BUSY), and refuses (-UNKILLABLE) a function that has written. The same bytes as
redis-server's, which the test runs against too."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pion.config import ServerConfig
from pion.server.run import ServerThread
from support.keyspace import RawClient, RedisServer, read_reply

BUSY = (
    b"-BUSY Redis is busy running a script. You can only call FUNCTION KILL or SHUTDOWN NOSAVE.\r\n"
)
EVAL_BUSY = (
    b"-BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.\r\n"
)
NOTBUSY = b"-NOTBUSY No scripts in execution right now.\r\n"
UNKILLABLE = (
    b"-UNKILLABLE Sorry the script already executed write commands against the dataset. "
    b"You can either wait the script termination or kill the server in a hard way using "
    b"the SHUTDOWN NOSAVE command.\r\n"
)
LIB = """#!lua name=busy
redis.register_function('forever', function(keys, args)
  local i = 0 while true do i = i + 1 end
end)
redis.register_function('writes_then_loops', function(keys, args)
  redis.call('set', 'w', '1') local i = 0 while i < 1e8 do i = i + 1 end return i
end)
"""


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[dict[str, int]]:
    oracle = RedisServer(tmp_path)
    pion = ServerThread(ServerConfig(port=0, dir=tmp_path / "pion", appendfsync="no")).start()
    yield {"redis": oracle.port, "pion": pion.port}
    pion.stop()
    oracle.stop()


def _wait_busy(c: RawClient, busy: bytes = BUSY) -> None:
    """PING until the answer is BUSY (the threshold passed)."""
    while True:
        reply = c.call("PING").raw
        if reply == busy:
            return
        assert reply == b"+PONG\r\n"


def _wait_eval_busy(c: RawClient) -> None:
    _wait_busy(c, EVAL_BUSY)


@pytest.mark.parametrize("server", ["redis", "pion"])
def test_busy_function_matches_redis(servers: dict[str, int], server: str) -> None:
    port = servers[server]
    looping, other = RawClient(port), RawClient(port)
    assert other.call("FUNCTION", "LOAD", LIB).raw == b"$4\r\nbusy\r\n"
    assert other.call("CONFIG", "SET", "busy-reply-threshold", "50").raw == b"+OK\r\n"
    looping.send("FCALL", "forever", "1", "k", "a")
    _wait_busy(other)
    assert other.call("SET", "k", "v").raw == BUSY
    stats = other.call("FUNCTION", "STATS").value
    assert isinstance(stats, list) and stats[0] == b"running_script"
    running = stats[1]
    assert running[:4] == [
        b"name",
        b"forever",
        b"command",
        [b"FCALL", b"forever", b"1", b"k", b"a"],
    ]
    assert running[4] == b"duration_ms" and running[5] >= 50
    assert other.call("SCRIPT", "KILL").raw == BUSY  # not the one to stop a function
    assert other.call("FUNCTION", "KILL").raw == b"+OK\r\n"
    assert read_reply(looping.f).raw == (
        b"-ERR Script killed by user with SCRIPT KILL... script: forever, on @user_function:3.\r\n"
    )
    assert other.call("FUNCTION", "KILL").raw == NOTBUSY
    assert other.call("GET", "k").raw == b"$-1\r\n"  # the refused SET did not run
    # a function that wrote cannot be killed; it ends on its own
    looping.send("FCALL", "writes_then_loops", "0")
    _wait_busy(other)
    assert other.call("FUNCTION", "KILL").raw == UNKILLABLE
    assert other.call("GET", "w").raw == BUSY
    assert read_reply(looping.f).raw == b":100000000\r\n"
    assert other.call("GET", "w").raw == b"$1\r\n1\r\n"
    # FUNCTION KILL does not stop an EVAL script (SCRIPT KILL does)
    looping.send("EVAL", "local i = 0 while true do i = i + 1 end", "0")
    _wait_eval_busy(other)
    assert other.call("FUNCTION", "KILL").raw == EVAL_BUSY
    assert other.call("SCRIPT", "KILL").raw == b"+OK\r\n"
    assert read_reply(looping.f).raw.startswith(b"-ERR Script killed by user with SCRIPT KILL")
    other.call("CONFIG", "SET", "busy-reply-threshold", "5000")
    looping.close()
    other.close()
