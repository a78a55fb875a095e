"""RQ (a job queue built on Redis lists, sets and sorted sets) against pion-server,
unmodified: a job is enqueued, a real worker (RQ's ``SimpleWorker``, in burst mode,
in this process) takes it from the queue and runs it, and its result comes back.

RQ 2.x records each job's start and result in a stream (``XADD rq:results:<id>``
with ``MAXLEN ~``, inside the MULTI that finishes the job; ``XREVRANGE`` reads it
back) and listens for commands on a SUBSCRIBE thread (optional: it logs and goes on
without)."""

from __future__ import annotations

import redis
import rq

from pion.server.run import ServerThread
from support.rq_jobs import add, fail


def test_a_worker_runs_an_enqueued_job(server: ServerThread) -> None:
    r = redis.Redis(port=server.port)
    queue = rq.Queue("pion", connection=r)
    job = queue.enqueue(add, 2, 3)
    assert queue.count == 1
    worker = rq.SimpleWorker([queue], connection=r)
    assert worker.work(burst=True)
    job.refresh()
    assert job.get_status() == "finished"
    assert job.return_value() == 5
    assert queue.count == 0


def test_results_are_kept_in_the_jobs_stream(server: ServerThread) -> None:
    r = redis.Redis(port=server.port)
    queue = rq.Queue("pion", connection=r)
    ok = queue.enqueue(add, 1, 1)
    bad = queue.enqueue(fail, "boom")
    assert rq.SimpleWorker([queue], connection=r).work(burst=True)
    ok.refresh()
    bad.refresh()
    assert ok.get_status() == "finished" and bad.get_status() == "failed"
    result = bad.latest_result()
    assert result is not None and result.type == result.Type.FAILED
    assert "ValueError: boom" in (result.exc_string or "")
    # Read back from the stream RQ wrote: XREVRANGE on rq:results:<id>.
    assert [x.return_value for x in ok.results()] == [2]
    assert r.type(f"rq:results:{ok.id}") == b"stream"
    assert r.xlen(f"rq:results:{ok.id}") == 1
