"""dramatiq with its ``RedisBroker`` against pion-server, unmodified: every broker
operation (enqueue, fetch, ack, nack, requeue, and the maintenance that requeues a
dead worker's messages) is one Lua script (``dispatch.lua``: lists, hashes, sets and
sorted sets), run with EVALSHA. A real ``Worker`` (its consumer and worker threads)
runs the actors; results come back through the ``Results`` middleware's Redis backend
(a list per message, pushed by the worker, waited for with BLPOP).

The broker runs its maintenance on every call here (``maintenance_chance`` at its
scale), so that part of the script runs too, not once in a thousand calls.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.redis import MAINTENANCE_SCALE, RedisBroker
from dramatiq.results import ResultFailure, Results
from dramatiq.results.backends.redis import RedisBackend

from pion.server.run import ServerThread

WAIT_MS = 30_000


@pytest.fixture
def broker(server: ServerThread) -> Iterator[RedisBroker]:
    broker = RedisBroker(host=server.host, port=server.port, maintenance_chance=MAINTENANCE_SCALE)
    broker.add_middleware(Results(backend=RedisBackend(host=server.host, port=server.port)))
    dramatiq.set_broker(broker)
    yield broker
    broker.close()


@pytest.fixture
def run_worker(broker: RedisBroker) -> Iterator[Callable[[], dramatiq.Worker]]:
    """Start the worker once the actors are declared (it consumes their queues)."""
    workers: list[dramatiq.Worker] = []

    def start() -> dramatiq.Worker:
        worker = dramatiq.Worker(broker, worker_threads=2, worker_timeout=50)
        worker.start()
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        worker.stop()


def _actor(broker: RedisBroker, fn: Callable[..., Any], **options: Any) -> Any:
    return dramatiq.actor(fn, broker=broker, store_results=True, **options)


def test_an_actor_runs_and_its_result_comes_back(
    broker: RedisBroker, run_worker: Callable[[], dramatiq.Worker]
) -> None:
    def add(a: int, b: int) -> int:
        return a + b

    actor = _actor(broker, add)
    run_worker()
    message = actor.send(2, 3)
    assert message.get_result(block=True, timeout=WAIT_MS) == 5
    group = dramatiq.group([actor.message(i, i) for i in range(4)]).run()
    assert list(group.get_results(block=True, timeout=WAIT_MS)) == [0, 2, 4, 6]
    pipe = dramatiq.pipeline([actor.message(1, 2), actor.message(3)]).run()
    assert pipe.get_result(block=True, timeout=WAIT_MS) == 6
    broker.join(actor.queue_name, timeout=WAIT_MS)


def test_a_failed_message_is_retried_after_its_delay(
    broker: RedisBroker, run_worker: Callable[[], dramatiq.Worker]
) -> None:
    calls: list[int] = []

    def flaky(x: int) -> int:
        calls.append(x)
        if len(calls) == 1:
            raise RuntimeError("first try fails")
        return x * 10

    # The retry goes through the delay queue (``default.DQ``), due 10 ms later.
    actor = _actor(broker, flaky, max_retries=1, min_backoff=10, max_backoff=10)
    run_worker()
    assert actor.send(7).get_result(block=True, timeout=WAIT_MS) == 70
    assert calls == [7, 7]


def test_a_message_out_of_retries_is_dead_lettered(
    broker: RedisBroker, run_worker: Callable[[], dramatiq.Worker]
) -> None:
    def broken() -> None:
        raise ValueError("always")

    actor = _actor(broker, broken, max_retries=0)
    run_worker()
    message = actor.send()
    with pytest.raises(ResultFailure, match="always"):
        message.get_result(block=True, timeout=WAIT_MS)
    broker.join(actor.queue_name, timeout=WAIT_MS)
    # Dead-lettered: in the queue's XQ sorted set, its body in the XQ's hash (both
    # keyed by the broker's own id for the message).
    client = broker.client
    (dead,) = client.zrange(f"dramatiq:{actor.queue_name}.XQ", 0, -1)
    body = json.loads(client.hget(f"dramatiq:{actor.queue_name}.XQ.msgs", dead))
    assert body["message_id"] == message.message_id
    assert client.llen(f"dramatiq:{actor.queue_name}") == 0


def test_a_dead_workers_message_is_requeued_by_maintenance(
    server: ServerThread, broker: RedisBroker, run_worker: Callable[[], dramatiq.Worker]
) -> None:
    """Another broker (a worker that died) fetched a message and never acked it; once
    its heartbeat is older than ``heartbeat_timeout``, the maintenance of a live
    broker's next call puts the message back on the queue, and the live worker runs
    it."""

    def echo(x: int) -> int:
        return x

    broker.heartbeat_timeout = 50  # ms
    actor = _actor(broker, echo)
    dead = RedisBroker(host=server.host, port=server.port)
    try:
        dead.declare_queue(actor.queue_name)
        message = dead.enqueue(actor.message(41))
        taken = next(dead.consume(actor.queue_name, prefetch=1, timeout=1000))
        assert taken is not None and taken.message_id == message.message_id
        acks = broker.client.keys(f"dramatiq:__acks__.{dead.broker_id}.*")
        assert len(acks) == 1  # held, unacknowledged, by the dead broker
        run_worker()
        assert message.get_result(block=True, timeout=WAIT_MS) == 41
        assert broker.client.keys(f"dramatiq:__acks__.{dead.broker_id}.*") == []
    finally:
        dead.close()
