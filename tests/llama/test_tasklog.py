"""llama-server's trace log read into tasks (the oracle of the real-harness tests):
the first ``cached n_tokens`` of a task counts, later batches of it do not."""

from __future__ import annotations

from pathlib import Path

import pytest
from pion_testing.tasklog import main_task, read_tasks

LOG = """\
srv  params_from_: Chat format: peg-native
slot get_availabl: id  0 | task -1 | selected slot by LRU, t_last = -1
slot launch_slot_: id  0 | task 0 | processing task, is_child = 0
slot update_slots: id  0 | task 0 | new prompt, n_ctx_slot = 32768, n_keep = 0, task.n_tokens = 3000
slot update_slots: id  0 | task 0 | cached n_tokens = 0, memory_seq_rm [0, end)
slot update_slots: id  0 | task 0 | cached n_tokens = 2048, memory_seq_rm [2048, end)
slot print_timing: id  0 | task 0 | prompt eval time =    4000.50 ms /  3000 tokens
slot update_slots: id  0 | task 2 | new prompt, n_ctx_slot = 32768, n_keep = 0, task.n_tokens = 3100
slot update_slots: id  0 | task 2 | cached n_tokens = 2990, memory_seq_rm [2990, end)
slot print_timing: id  0 | task 2 | prompt eval time =      80.00 ms /   110 tokens
"""


def test_tasks_from_a_trace_log(tmp_path: Path) -> None:
    log = tmp_path / "llama-server.log"
    log.write_text(LOG)
    first, second = read_tasks(log)
    assert (first.id, first.n_tokens, first.cached, first.prompt_ms) == (0, 3000, 0, 4000.5)
    assert (second.n_tokens, second.cached, second.processed) == (3100, 2990, 110)
    assert second.reuse == pytest.approx(2990 / 3100)
    assert main_task([first, second]) is second
    # From an offset: only what the log gained since.
    offset = LOG.index("slot update_slots: id  0 | task 2 | new prompt")
    assert [t.id for t in read_tasks(log, len(LOG[:offset].encode()))] == [2]


def test_no_task_is_an_error() -> None:
    with pytest.raises(ValueError, match="no request"):
        main_task([])
