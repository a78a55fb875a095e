"""bench/llama_sessions.py against the real llama-server and `pion llama proxy`: one
sequential run of two small harness-shaped sessions. Every request is answered with its
reuse read, every slot file the proxy leaves has a name the audit derives from the
requests (so no file escapes the name check through the weaker index fallback), and the
tokens llama-server computed come from its own log."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

from pion_testing.paths import ensure_llama_server  # noqa: E402

import llama_sessions as bench  # noqa: E402
from _harness_shapes import SHAPES, session  # noqa: E402
from _llama_audit import Renderer  # noqa: E402

pytestmark = pytest.mark.llama


def test_a_sequential_run_is_measured_and_audited() -> None:
    sessions = [
        session(SHAPES[name].scaled(0.1), f"{name}-t", 2, bench.ANSWER_CAP)
        for name in ("pi", "claude")
    ]
    stack = bench.Stack(ensure_llama_server(), bench.model_path(), 1, 1, ())
    try:
        run = bench.run_once(stack, sessions, False, Renderer())
    finally:
        stack.close()
    records = run["requests"]
    assert [(r["harness"], r["turn"], r["kind"]) for r in records] == [
        ("pi", 1, "main"), ("pi", 1, "side"), ("pi", 2, "main"),
        ("claude", 1, "main"), ("claude", 1, "side"), ("claude", 2, "main"),
    ]  # fmt: skip
    assert all(r["status"] == 200 and r["cache_n"] is not None for r in records), records
    # The prompt llama-server reported is the one the benchmark rendered for the request.
    assert all(r["reported_prompt"] == r["prompt"] for r in records), records
    # A second turn extends the first: most of it comes from the slot.
    for second in (r for r in records if r["turn"] == 2):
        assert second["cache_n"] > second["prompt"] // 2, second
    assert run["files"] and run["saves"] >= len(run["files"])
    # Every name is derived (from a request, or from the tokens the file holds): none is
    # left to the weaker check against its index entry.
    assert {f["named_by"] for f in run["files"]} <= {"fingerprint", "own tokens"}, run["files"]
    assert all(f["verdict"] in ("ok", "misnamed") for f in run["files"])
    assert run["prefilled"]["tasks"] >= len(records)
    assert 0 < run["prefilled"]["computed"] <= run["prefilled"]["tokens"]
