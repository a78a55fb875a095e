"""arq (asyncio job queues) against pion-server, unmodified: jobs are enqueued (a
sorted set for the queue, the job a string key written in a MULTI with WATCH), a real
arq ``Worker`` in burst mode takes them (its Lua-free claim: SET NX of an in-progress
key, then the job's EXEC) and runs them, and the results are read back (a string key
with a deadline).

arq 0.28 declares ``redis<6``; Pion pins redis-py 8, so arq is installed without its
dependencies (requirements-nodeps.txt) and runs here on redis-py 8's asyncio client.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from arq import create_pool
from arq.connections import RedisSettings
from arq.jobs import JobStatus
from arq.worker import Worker, func

from pion.server.run import ServerThread

# arq 0.28 calls APIs that redis-py 8 deprecates (retry_on_timeout, close()).
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:arq")


async def add(ctx: dict[str, Any], a: int, b: int) -> int:
    return a + b


async def fail(ctx: dict[str, Any]) -> None:
    raise ValueError("on purpose")


def _worker(pool: Any) -> Worker:
    return Worker(
        functions=[func(add, name="add"), func(fail, name="fail", max_tries=1)],
        redis_pool=pool,
        burst=True,
        poll_delay=0.01,
        handle_signals=False,
    )


def test_a_worker_runs_an_enqueued_job(server: ServerThread) -> None:
    async def scenario() -> None:
        pool = await create_pool(RedisSettings(host=server.host, port=server.port))
        try:
            job = await pool.enqueue_job("add", 2, 3)
            assert job is not None
            assert await job.status() == JobStatus.queued
            # The same job id is refused while the first is queued.
            assert await pool.enqueue_job("add", 1, 1, _job_id=job.job_id) is None
            failing = await pool.enqueue_job("fail")
            assert failing is not None
            worker = _worker(pool)
            await worker.main()
            assert (worker.jobs_complete, worker.jobs_failed) == (1, 1)
            assert await job.result(timeout=10) == 5
            assert await job.status() == JobStatus.complete
            info = await job.result_info()
            assert info is not None and info.success and info.args == (2, 3)
            with pytest.raises(ValueError, match="on purpose"):
                await failing.result(timeout=10)
            assert await pool.zcard("arq:queue") == 0
            await worker.close()
        finally:
            await pool.aclose()

    asyncio.run(scenario())


def test_a_deferred_job_waits_for_its_time(server: ServerThread) -> None:
    async def scenario() -> None:
        pool = await create_pool(RedisSettings(host=server.host, port=server.port))
        try:
            job = await pool.enqueue_job("add", 4, 5, _defer_by=0.2)
            assert job is not None
            assert await job.status() == JobStatus.deferred
            # Burst mode waits for every queued job, the deferred one too, which is
            # taken only once its score (its due time) is past.
            worker = _worker(pool)
            await worker.main()
            assert await job.result(timeout=10) == 9
            info = await job.result_info()
            assert info is not None
            assert (info.start_time - info.enqueue_time).total_seconds() >= 0.2
            await worker.close()
        finally:
            await pool.aclose()

    asyncio.run(scenario())
