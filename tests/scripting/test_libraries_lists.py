"""Libraries whose scripts call list commands (LPUSH, LRANGE, LTRIM, BLPOP), which the
lists family serves: ``limits``' moving window and python-redis-lock."""

from __future__ import annotations

import redis
import redis_lock
from limits import parse, storage, strategies

from pion.server.run import ServerThread


def test_limits_moving_window(server: ServerThread) -> None:
    store = storage.RedisStorage(f"redis://{server.host}:{server.port}")
    limiter = strategies.MovingWindowRateLimiter(store)
    item = parse("3/minute")
    assert [limiter.hit(item, "user") for _ in range(5)] == [True, True, True, False, False]
    assert limiter.get_window_stats(item, "user").remaining == 0


def test_python_redis_lock(client: redis.Redis) -> None:
    lock = redis_lock.Lock(client, "name", expire=10)
    assert lock.acquire(blocking=False)
    assert not redis_lock.Lock(client, "name", expire=10).acquire(blocking=False)
    lock.extend(20)
    lock.release()
    other = redis_lock.Lock(client, "name", expire=10)
    assert other.acquire(blocking=True, timeout=5)
    other.release()
