"""The offload pool running one command's work in parts (``Split``,
src/pion/server/offload.py): the parts run at once on several threads, the command is
done once, after the last part, with the result or the first failure."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import pytest

from pion.codecs import get_codec
from pion.commands.deferred import Split
from pion.server.offload import Offloader


def run(work: Any, threads: int = 2) -> list[Any]:
    """Submit ``work`` and wait (on the loop) for its one ``done``."""
    outcomes: list[Any] = []

    async def body() -> None:
        pool = Offloader(threads)
        finished = asyncio.Event()

        def done(result: Any) -> None:
            outcomes.append(result)
            finished.set()

        try:
            pool.submit(work, done)
            await asyncio.wait_for(finished.wait(), 60)
            await asyncio.sleep(0)  # a second done, if there were one, would land here
            assert pool.in_flight == 0
        finally:
            pool.close()

    asyncio.run(body())
    return outcomes


def test_parts_run_at_once_on_several_threads() -> None:
    # Each part waits for the other at a barrier: run one after the other, the first
    # would time out there (BrokenBarrierError) and the work would fail.
    barrier = threading.Barrier(2, timeout=30)
    names: list[str] = []

    def part() -> None:
        names.append(threading.current_thread().name)
        barrier.wait()

    outcomes = run(Split([part, part], lambda: "all done"))
    assert outcomes == ["all done"]
    assert len(set(names)) == 2
    assert all(name.startswith("pion-offload") for name in names)


def test_the_first_failure_is_the_outcome_and_result_is_not_taken() -> None:
    def fail() -> None:
        raise ValueError("part failed")

    def result() -> str:
        raise AssertionError("result taken after a part failed")

    outcomes = run(Split([lambda: None, fail, lambda: None], result))
    assert len(outcomes) == 1
    assert isinstance(outcomes[0], ValueError)


def test_a_failing_result_is_the_outcome() -> None:
    def result() -> str:
        raise KeyError("no result")

    outcomes = run(Split([lambda: None, lambda: None], result))
    assert len(outcomes) == 1
    assert isinstance(outcomes[0], KeyError)


def test_called_directly_the_parts_run_in_order() -> None:
    seen: list[int] = []
    work = Split([lambda: seen.append(1), lambda: seen.append(2)], lambda: len(seen))
    assert work() == 2
    assert seen == [1, 2]


@pytest.mark.parametrize("fmt", ["int8", "turbo3"])
def test_a_store_in_row_blocks_gives_the_bytes_of_one_encode(fmt: str) -> None:
    from pion.commands.vstore import _encode_work

    codec = get_codec(fmt)
    rows = np.random.default_rng(5).standard_normal((2000, 1024)).astype("<f4")
    work = _encode_work(codec, rows, 0, 0)
    assert len(work.parts) > 1
    (outcome,) = run(work, threads=4)
    tagged, encoded = outcome
    assert tagged is codec
    assert encoded.tobytes() == codec.encode(rows).tobytes()
