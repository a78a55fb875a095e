"""Real libraries whose Redis use is Lua scripts, against pion-server unmodified:
redis-py's ``Lock`` (acquire, extend, release, a blocking acquire between two clients)
and ``limits``' Redis storage (fixed window, sliding window counter).

What needs lists (``limits``' moving window: LPUSH/LRANGE/LTRIM in its scripts;
python-redis-lock: LPUSH and BLPOP) is in test_libraries_lists.py.
"""

from __future__ import annotations

import threading

import pytest
import redis
from limits import parse, storage, strategies
from redis.exceptions import LockNotOwnedError

from pion.server.run import ServerThread


def test_redis_py_lock(client: redis.Redis) -> None:
    lock = client.lock("res", timeout=10)
    assert lock.acquire(blocking=False)
    assert lock.owned()
    other = client.lock("res", timeout=10)
    assert not other.acquire(blocking=False)
    assert lock.extend(5)
    assert client.pttl("res") > 10_000
    assert lock.reacquire()
    lock.release()
    assert not client.exists("res")
    assert other.acquire(blocking=False)
    client.set("res", "someone else")  # the release script sees another token
    with pytest.raises(LockNotOwnedError):
        other.release()
    assert client.get("res") == b"someone else"


def test_redis_py_lock_blocking_between_clients(server: ServerThread) -> None:
    a = redis.Redis(host=server.host, port=server.port)
    b = redis.Redis(host=server.host, port=server.port)
    held = a.lock("shared", timeout=30)
    assert held.acquire()
    got: list[bool] = []
    started = threading.Event()

    def waiter() -> None:
        started.set()
        got.append(
            b.lock("shared", timeout=30, sleep=0.01).acquire(blocking=True, blocking_timeout=30)
        )

    t = threading.Thread(target=waiter)
    t.start()
    started.wait()
    assert got == []  # still waiting while held
    held.release()
    t.join(60)
    assert got == [True]
    assert b.get("shared") is not None
    a.close()
    b.close()


@pytest.mark.parametrize(
    "strategy",
    [strategies.FixedWindowRateLimiter, strategies.SlidingWindowCounterRateLimiter],
)
def test_limits_redis_storage(server: ServerThread, strategy: type) -> None:
    store = storage.RedisStorage(f"redis://{server.host}:{server.port}")
    limiter = strategy(store)
    item = parse("3/minute")
    assert [limiter.hit(item, "user") for _ in range(5)] == [True, True, True, False, False]
    assert limiter.test(item, "other")
    stats = limiter.get_window_stats(item, "user")
    assert stats.remaining == 0
    limiter.clear(item, "user")
    assert limiter.hit(item, "user")
