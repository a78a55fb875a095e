"""Pub/sub as clients use it: redis-py's ``PubSub`` (get_message, listen,
run_in_thread) in RESP2 and RESP3; a subscriber that stops reading is disconnected at
``client-output-buffer-limit pubsub`` while the others keep their messages; a
subscriber's disconnect, CLIENT KILL and eviction forget its subscriptions; CLIENT LIST
and INFO show them; CONFIG GET/SET of the two settings answer as redis-server does."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from pion.pubsub import OutputLimit
from pion.server.run import ServerThread
from support.keyspace import RawClient, oracle_pair, read_reply


def _wait_for(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 20
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


@pytest.mark.parametrize("protocol", [2, 3])
def test_redis_py_get_message_and_listen(server: ServerThread, protocol: int) -> None:
    r = redis.Redis(host=server.host, port=server.port, protocol=protocol, socket_timeout=30)
    p = r.pubsub()
    p.subscribe("news")
    p.psubscribe("alerts.*")
    first = p.get_message(timeout=5)
    assert first is not None
    assert first["type"] == "subscribe"
    assert first["channel"] == b"news"
    second = p.get_message(timeout=5)
    assert second is not None
    assert second["type"] == "psubscribe"
    assert r.publish("news", "hello") == 1
    assert r.publish("alerts.fire", "hot") == 1
    assert r.publish("elsewhere", "x") == 0
    assert r.pubsub_numsub("news", "none") == [(b"news", 1), (b"none", 0)]
    assert r.pubsub_numpat() == 1
    assert r.pubsub_channels() == [b"news"]
    got = []
    for message in p.listen():
        got.append((message["type"], message["channel"], message["data"]))
        if len(got) == 2:
            break
    assert got == [("message", b"news", b"hello"), ("pmessage", b"alerts.fire", b"hot")]
    stats = r.info("commandstats")
    assert stats["cmdstat_publish"]["calls"] == 3
    assert stats["cmdstat_subscribe"]["calls"] == 1
    assert stats["cmdstat_pubsub"]["calls"] == 3
    p.unsubscribe()
    p.punsubscribe()
    p.close()
    _wait_for(lambda: r.pubsub_numsub("news") == [(b"news", 0)], "the unsubscribe")
    r.close()


def test_redis_py_run_in_thread(server: ServerThread) -> None:
    r = redis.Redis(host=server.host, port=server.port, socket_timeout=30)
    received: list[bytes] = []
    done = threading.Event()

    def handler(message: dict[str, Any]) -> None:
        received.append(message["data"])
        if len(received) == 50:
            done.set()

    p = r.pubsub()
    p.subscribe(jobs=handler)
    worker = p.run_in_thread(sleep_time=0.01, daemon=True)
    try:
        _wait_for(lambda: r.pubsub_numsub("jobs") == [(b"jobs", 1)], "the subscription")
        for i in range(50):
            assert r.publish("jobs", str(i)) == 1
        assert done.wait(20)
    finally:
        worker.stop()
        worker.join(20)
        p.close()
    assert received == [str(i).encode() for i in range(50)]
    r.close()


def _subscriber(port: int, channel: bytes, rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket()
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect(("127.0.0.1", port))
    sock.sendall(b"*2\r\n$9\r\nSUBSCRIBE\r\n$%d\r\n%s\r\n" % (len(channel), channel))
    return sock


def _closed_by_server(sock: socket.socket) -> bool:
    """Drain what was sent; True once the server has closed the connection."""
    sock.settimeout(20)
    try:
        while sock.recv(1 << 20):
            pass
    except ConnectionResetError:
        pass
    return True


@pytest.mark.parametrize("limit", ["pubsub 256kb 0 0", "pubsub 0 128kb 1"])
def test_slow_subscriber_is_disconnected(server: ServerThread, limit: str) -> None:
    """A subscriber that never reads passes the limit (hard, or soft for longer than
    its seconds) and is closed; a reading one gets every message."""
    admin = RawClient(server.port)
    assert admin.call("CONFIG", "SET", "client-output-buffer-limit", limit).raw == b"+OK\r\n"
    slow = _subscriber(server.port, b"feed", rcvbuf=4096)
    fast = RawClient(server.port)
    assert fast.call("SUBSCRIBE", "feed").value == [b"subscribe", b"feed", 1]
    _wait_for(lambda: admin.call("PUBSUB", "NUMSUB", "feed").value == [b"feed", 2], "both")
    payload = b"x" * 65536
    counts = []
    for _ in range(1000):  # 64 MB: past any kernel socket buffers, then the limit
        counts.append(admin.call("PUBLISH", "feed", payload).value)
        assert read_reply(fast.f).value == [b"message", b"feed", payload]
        if counts[-1] == 1:
            break
        if limit.endswith(" 1"):
            time.sleep(0.01)  # the soft limit needs time over it, not bytes
    assert counts[-1] == 1, "the slow subscriber was never disconnected"
    assert counts[0] == 2
    assert _closed_by_server(slow)
    assert admin.call("PUBSUB", "NUMSUB", "feed").value == [b"feed", 1]
    info = admin.call("INFO", "stats").value
    assert b"client_output_buffer_limit_disconnections:1" in info
    # The reading subscriber is unaffected.
    assert admin.call("PUBLISH", "feed", "after").value == 1
    assert read_reply(fast.f).value == [b"message", b"feed", b"after"]
    fast.close()
    admin.close()
    slow.close()


def test_output_limit_rule() -> None:
    """Redis's rule: at the hard limit at once; over the soft one for more than its
    seconds (exactly the seconds is not yet); back under it, the soft clock restarts.
    The clock is not read under the soft limit."""

    def never() -> float:
        raise AssertionError("the clock was read under the soft limit")

    limit = OutputLimit(hard=100, soft=50, soft_seconds=2)
    assert limit.exceeded(100, None, never) == (True, None)
    assert limit.exceeded(49, 5.0, never) == (False, None)
    assert limit.exceeded(60, None, lambda: 10.0) == (False, 10.0)
    assert limit.exceeded(60, 10.0, lambda: 12.0) == (False, 10.0)
    assert limit.exceeded(60, 10.0, lambda: 12.5) == (True, 10.0)
    assert OutputLimit(0, 0, 0).exceeded(1 << 40, None, never) == (False, None)


def test_disconnect_and_kill_forget_subscriptions(server: ServerThread) -> None:
    admin = RawClient(server.port)
    gone = RawClient(server.port)
    gone.call("SUBSCRIBE", "a", "b")
    killed = RawClient(server.port)
    killed.call("PSUBSCRIBE", "p*")
    killed_id = None
    for line in admin.call("CLIENT", "LIST").value.decode().splitlines():
        if "psub=1" in line:
            assert " flags=P " in line
            assert " sub=0 psub=1 ssub=0 " in line
            killed_id = line.split()[0].split("=")[1]
        elif "sub=2" in line:
            assert " flags=P db=0 sub=2 psub=0 ssub=0 " in line
        else:
            assert " flags=N db=0 sub=0 psub=0 ssub=0 " in line
    assert killed_id is not None
    info = admin.call("INFO", "stats").value
    assert b"pubsub_channels:2\r\n" in info
    assert b"pubsub_patterns:1\r\n" in info
    gone.close()
    _wait_for(lambda: admin.call("PUBSUB", "NUMSUB", "a").value == [b"a", 0], "the disconnect")
    assert admin.call("CLIENT", "KILL", "ID", killed_id).value == 1
    _wait_for(lambda: admin.call("PUBSUB", "NUMPAT").value == 0, "the kill")
    assert admin.call("PUBLISH", "pq", "x").value == 0
    assert admin.call("PUBSUB", "CHANNELS").value == []
    admin.close()


def test_client_kill_type_pubsub(server: ServerThread) -> None:
    admin = RawClient(server.port)
    plain = RawClient(server.port)
    subscriber = RawClient(server.port)
    subscriber.call("SUBSCRIBE", "a")
    assert admin.call("CLIENT", "KILL", "TYPE", "pubsub").value == 1
    _wait_for(lambda: admin.call("PUBSUB", "NUMSUB", "a").value == [b"a", 0], "the kill")
    assert plain.call("PING").value == b"PONG"
    assert admin.call("CLIENT", "KILL", "TYPE", "normal").value == 1  # SKIPME: not admin
    assert admin.call("CLIENT", "KILL", "TYPE", "pubsub").value == 0
    for c in (admin, plain, subscriber):
        c.close()


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int]]:
    with oracle_pair(tmp_path_factory.mktemp("pubsub-config")) as ports:
        yield ports


CONFIG_STEPS = [
    ("GET", "client-output-buffer-limit"),
    ("SET", "client-output-buffer-limit", "pubsub 1mb 512kb 10"),
    ("GET", "client-output-buffer-limit"),
    ("SET", "client-output-buffer-limit", "pubsub 1k 2 3 normal 0 0 0"),
    ("GET", "client-output-buffer-limit"),
    ("SET", "client-output-buffer-limit", "pubsub 1mb"),
    ("SET", "client-output-buffer-limit", "foo 1 2 3"),
    ("SET", "client-output-buffer-limit", "pubsub x 2 3"),
    ("SET", "client-output-buffer-limit", "pubsub 1 2 -3"),
    ("SET", "client-output-buffer-limit", "pubsub 33554432 8388608 60"),
    ("GET", "notify-keyspace-events"),
    ("SET", "notify-keyspace-events", "KEA"),
    ("GET", "notify-keyspace-events"),
    ("SET", "notify-keyspace-events", "Kn"),
    ("GET", "notify-keyspace-events"),
    ("SET", "notify-keyspace-events", "Ag$lshzxeKEtmdn"),
    ("GET", "notify-keyspace-events"),
    ("SET", "notify-keyspace-events", "ndtg"),
    ("GET", "notify-keyspace-events"),
    ("SET", "notify-keyspace-events", "lxE"),
    ("GET", "notify-keyspace-events"),
    ("SET", "notify-keyspace-events", "KEA_"),
    ("GET", "notify-keyspace-events"),
    ("SET", "notify-keyspace-events", ""),
    ("GET", "notify-keyspace-events"),
]


@pytest.mark.parametrize("protocol", [2, 3])
def test_config_matches_redis(servers: tuple[int, int], protocol: int) -> None:
    replies = []
    for port in servers:
        c = RawClient(port)
        c.call("HELLO", protocol)
        replies.append([c.call("CONFIG", *step).raw for step in CONFIG_STEPS])
        c.close()
    assert replies[1] == replies[0]
