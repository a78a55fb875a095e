"""The background thread of store work: order, flush, a bounded queue, failures logged."""

from __future__ import annotations

import threading

from pion.llama.background import MAX_PENDING, Background


def test_jobs_run_in_order_and_flush_waits() -> None:
    lines: list[str] = []
    done: list[int] = []
    bg = Background(lines.append)
    for i in range(20):
        bg.submit("job", lambda i=i: done.append(i))
    assert bg.flush(10)
    assert done == list(range(20))
    bg.close()


def test_a_failing_job_is_logged_and_the_thread_goes_on() -> None:
    lines: list[str] = []
    bg = Background(lines.append)

    def boom() -> None:
        raise RuntimeError("store said no")

    bg.submit("push x", boom)
    ran = threading.Event()
    bg.submit("next", ran.set)
    assert bg.flush(10) and ran.is_set()
    assert lines == ["STORE push x failed (fail-open): store said no"]
    bg.close()


def test_full_queue_drops_and_counts() -> None:
    lines: list[str] = []
    gate = threading.Event()
    bg = Background(lines.append)
    bg.submit("blocker", gate.wait)
    accepted = sum(bg.submit("job", lambda: None) for _ in range(MAX_PENDING + 5))
    assert accepted <= MAX_PENDING and bg.dropped == MAX_PENDING + 5 - accepted > 0
    assert any("jobs already waiting" in line for line in lines)
    gate.set()
    assert bg.flush(10)
    bg.close()
