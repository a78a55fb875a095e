"""llama-server's trace log read into tasks (the oracle of the real-harness tests):
the first ``cached n_tokens`` of a task counts, later batches of it do not."""

from __future__ import annotations

from pathlib import Path

import pytest
from pion_testing.tasklog import Task, main_task, main_tasks, read_tasks

LOG = """\
srv  params_from_: Chat format: peg-native
slot get_availabl: id  0 | task -1 | selected slot by LRU, t_last = -1
slot launch_slot_: id  0 | task 0 | processing task, is_child = 0
slot update_slots: id  0 | task 0 | new prompt, n_ctx_slot = 32768, n_keep = 0, task.n_tokens = 3000
slot update_slots: id  0 | task 0 | cached n_tokens = 0, memory_seq_rm [0, end)
slot update_slots: id  0 | task 0 | cached n_tokens = 2048, memory_seq_rm [2048, end)
slot print_timing: id  0 | task 0 | prompt eval time =    4000.50 ms /  3000 tokens
slot      release: id  0 | task 0 | stop processing: n_tokens = 3000, truncated = 0
slot update_slots: id  0 | task 2 | new prompt, n_ctx_slot = 32768, n_keep = 0, task.n_tokens = 3100
slot update_slots: id  0 | task 2 | cached n_tokens = 2990, memory_seq_rm [2990, end)
slot print_timing: id  0 | task 2 | prompt eval time =      80.00 ms /   110 tokens
slot      release: id  0 | task 2 | stop processing: n_tokens = 3116, truncated = 0
"""


def test_tasks_from_a_trace_log(tmp_path: Path) -> None:
    log = tmp_path / "llama-server.log"
    log.write_text(LOG)
    first, second = read_tasks(log)
    assert (first.id, first.n_tokens, first.cached, first.prompt_ms) == (0, 3000, 0, 4000.5)
    assert (second.n_tokens, second.cached, second.processed) == (3100, 2990, 110)
    assert second.reuse == pytest.approx(2990 / 3100)
    assert (first.final, second.final) == (3000, 3116)
    # The first is a warm-up (it generated nothing); the second the request.
    assert main_task([first, second]) is second
    # From an offset: only what the log gained since.
    offset = LOG.index("slot update_slots: id  0 | task 2 | new prompt")
    assert [t.id for t in read_tasks(log, len(LOG[:offset].encode()))] == [2]


def test_the_main_task_is_the_first_request_of_the_main_size_that_answered() -> None:
    title = Task(0, 200, prompt_ms=50.0, final=216)
    warm_up = Task(1, 20_000, prompt_ms=8_000.0, final=20_000)  # n_predict 0
    given_up = Task(2, 20_000, cached=20_000 - 1, final=20_000 - 1)  # the harness hung up
    retry = Task(3, 20_000, cached=19_999, prompt_ms=9.0, final=20_016)
    follow_up = Task(4, 20_100, cached=20_016, prompt_ms=90.0, final=20_116)
    tasks = [title, warm_up, given_up, retry, follow_up]
    assert main_tasks(tasks) == [warm_up, given_up, retry, follow_up]
    assert main_task(tasks) is retry
    assert [t.answered for t in tasks] == [True, False, False, True, True]
    # Nothing answered (a killed session): the first of the main size still answers.
    assert main_task([title, warm_up]) is warm_up


def test_no_task_is_an_error() -> None:
    with pytest.raises(ValueError, match="no request"):
        main_task([])
