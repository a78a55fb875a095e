"""Celery against pion-server, unmodified, with pion-server as both its broker (kombu's
Redis transport: a queue is a list taken with BRPOP, unacknowledged messages a hash
and a sorted set, the broadcasts of ``celery.control`` PUBLISH and PSUBSCRIBE) and its
result backend (results as string keys with a deadline, announced on PUBLISH; a
chord's parts counted with INCR and kept in a list).

A real worker (Celery's own ``start_worker`` test helper: a worker thread with the
solo pool, answering a ``ping`` broadcast before the test goes on) runs the tasks; the
results come back through the backend (``AsyncResult.get``).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import celery.contrib.testing.tasks  # noqa: F401  (registers celery.ping, which start_worker needs)
import pytest
from celery import Celery, chord, group
from celery.contrib.testing.worker import start_worker
from celery.result import AsyncResult

from pion.config import ServerConfig
from pion.server.run import ServerThread

# Celery's Redis backend calls redis-py's SETEX, which redis-py 8 deprecates.
pytestmark = pytest.mark.filterwarnings("ignore:Call to deprecated setex:DeprecationWarning")

app = Celery("pion-tests", set_as_current=False)
# A broker that is not there fails the test at once rather than being retried.
app.conf.broker_connection_retry_on_startup = False


@app.task(name="pion.add")
def add(a: int, b: int) -> int:
    return a + b


@app.task(name="pion.total")
def total(parts: list[int]) -> int:
    return sum(parts)


@app.task(name="pion.fail")
def fail() -> None:
    raise ValueError("on purpose")


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Celery]:
    """One server and one worker for the module: the app keeps its connections (the
    backend's result subscriber among them) for its life, so it lives as long as the
    server it talks to."""
    server = ServerThread(ServerConfig(port=0, dir=tmp_path_factory.mktemp("celery"))).start()
    url = f"redis://{server.host}:{server.port}/0"
    app.conf.broker_url = url
    app.conf.result_backend = url
    try:
        with start_worker(app, pool="solo", perform_ping_check=True, shutdown_timeout=30):
            yield app
    finally:
        # A result handle unsubscribes from its channel when collected: collected
        # while the server still answers, not at exit against a closed port.
        gc.collect()
        app.close()
        server.stop()


def test_a_task_runs_and_its_result_comes_back(worker: Celery) -> None:
    result = add.delay(2, 3)
    assert result.get(timeout=30) == 5
    assert result.state == "SUCCESS"
    # The result is a key of the backend's, read again by a fresh handle.
    assert AsyncResult(result.id, app=worker).get(timeout=30) == 5


def test_a_failing_task_raises_through_the_backend(worker: Celery) -> None:
    result = fail.delay()
    with pytest.raises(ValueError, match="on purpose"):
        result.get(timeout=30)
    assert result.state == "FAILURE"


def test_a_group_and_a_chord(worker: Celery) -> None:
    assert group(add.s(i, i) for i in range(5))().get(timeout=30) == [0, 2, 4, 6, 8]
    # The chord's header results are counted in the backend, which then calls the body.
    assert chord((add.s(i, 1) for i in range(4)), total.s())().get(timeout=30) == 10


def test_a_forgotten_result_is_gone(worker: Celery) -> None:
    result = add.delay(20, 22)
    assert result.get(timeout=30) == 42
    key = worker.backend.get_key_for_task(result.id)
    assert worker.backend.client.ttl(key) > 0  # kept for result_expires
    result.forget()
    assert not worker.backend.client.exists(key)
    assert AsyncResult(result.id, app=worker).state == "PENDING"
