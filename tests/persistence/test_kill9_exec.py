"""The kill -9 loop for transactions: a writer sends redis-py's transactional pipeline
(MULTI, four writes of two types, EXEC) to a real server under ``--appendfsync
always`` (and ``everysec``), round after round, and the server is SIGKILLed at a
random moment and restarted. After every restart the four writes agree (an EXEC is
never half there), the last acknowledged EXEC is there, and the one in flight at the
kill is wholly there or wholly absent.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from support import no_retry

ROUNDS = int(os.environ.get("PION_KILL9_ROUNDS", "12"))


class Writer:
    """EXEC number i sets a, b and hash field h.f to i and increments n (to i)."""

    def __init__(self, r: redis.Redis, start: int) -> None:
        self.r = r
        self.acked = start
        self.sent = start

    def run(self) -> None:
        while True:
            i = self.acked + 1
            pipe = self.r.pipeline()  # transactional: MULTI .. EXEC
            pipe.set("a", i).set("b", i).hset("h", "f", i).incr("n")
            self.sent = i
            try:
                replies = pipe.execute()
            except (redis.ConnectionError, redis.TimeoutError):
                return
            assert replies == [True, True, int(i == 1), i], replies
            self.acked = i


def observe(r: redis.Redis) -> int:
    """The EXEC whose writes the server holds; fails if they disagree."""
    a, b, f, n = r.get("a"), r.get("b"), r.hget("h", "f"), r.get("n")
    values = {v for v in (a, b, f, n)}
    assert len(values) == 1, (a, b, f, n)  # never part of an EXEC
    (v,) = values
    return 0 if v is None else int(v)


@pytest.mark.parametrize("policy", ["always", "everysec"])
def test_kill9_inside_exec(spawn_server: Callable[..., Any], policy: str) -> None:
    """Under ``everysec`` too: a process crash leaves the page cache, so an
    acknowledged EXEC (written before its reply) survives kill -9 whatever the policy."""
    rng = random.Random(int(os.environ.get("PION_KILL9_SEED", "23")))
    rounds = ROUNDS if policy == "always" else max(1, ROUNDS // 2)
    acked, sent = 0, 0
    for _ in range(rounds + 1):
        srv = spawn_server("--appendfsync", policy)
        r = srv.client(retry=no_retry())
        held = observe(r)
        # The acknowledged EXEC is there; the one in flight wholly or not at all.
        assert held in (acked, sent), (held, acked, sent)
        writer = Writer(r, held)
        thread = threading.Thread(target=writer.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while writer.acked < held + 3 and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(rng.uniform(0, 0.05))  # a random moment among the EXECs
        srv.kill()
        thread.join(timeout=30)
        assert not thread.is_alive()
        acked, sent = writer.acked, writer.sent
    assert acked > rounds * 3  # the writer really wrote between the kills
