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
from support.rq_jobs import add


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
