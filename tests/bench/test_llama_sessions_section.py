"""bench/sections/llama_sessions.py: concurrent against sequential sessions through the
proxy and a resumed conversation, with the plot, and every missed target named."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import report  # noqa: E402
import sections  # noqa: E402, F401  (registers the renderers)


def _run(reuse: float, misnamed: int = 0, errors: int = 0) -> dict[str, Any]:
    requests = [
        {"harness": "pi", "cache_n": round(reuse * 1000), "prompt": 1000},
        {"harness": "claude", "cache_n": round(reuse * 3000), "prompt": 3000},
        {"harness": "claude", "cache_n": None, "prompt": 1000},  # a request that failed
    ]
    files = [
        {"file": f"f{i}.bin", "verdict": "misnamed" if i < misnamed else "ok"} for i in range(4)
    ]
    return {
        "requests": requests,
        "reuse": reuse,
        "reuse_main": reuse + 0.01,
        "restores_per_request": 0.25,
        "saves_per_request": 0.5,
        "files": files,
        "misnamed": misnamed,
        "errors": errors,
        "prefilled": {"tasks": 12, "tokens": 40000, "computed": 5210},
        "seconds": 12.5,
    }


def _payload(concurrent_np1: dict[str, Any], recomputed: float) -> dict[str, Any]:
    np1 = {"sequential": _run(0.9), "concurrent": concurrent_np1}
    np1["ratio"] = concurrent_np1["reuse"] / 0.9
    np2 = {"sequential": _run(0.9), "concurrent": _run(0.89), "ratio": 0.89 / 0.9}
    return {
        "benchmark": "llama_sessions",
        "machine": {"python": "3.11", "platform": "Linux-test", "cpus": 2},
        "harnesses": {"pi": {}, "claude": {}},
        "turns": 4,
        "reps": 2,
        "concurrency": {"np1": np1, "np2": np2},
        "resume": {
            "turns": 5,
            "last_turn_tokens": 15800,
            "prompt": 16100,
            "computed": round(recomputed * 16100),
            "recomputed": recomputed,
        },
        "targets": {"concurrent_over_sequential": 0.95, "misnamed": 0, "resume_recomputed": 0.01},
        "model": {"layers": 2, "width": 128},
        "llama_build": "b11434",
        "slot_ctx": 24576,
        "load_avg_before": [1.0, 1.0, 1.0],
        "load_avg_after": [2.0, 1.0, 1.0],
    }


def _render(tmp_path: Path, payload: dict[str, Any]) -> tuple[str, Path]:
    results = tmp_path / "results"
    results.mkdir()
    (results / "llama_sessions.json").write_text(json.dumps(payload))
    out = tmp_path / "B.md"
    args = ["--results", str(results), "--out", str(out), "--plots", str(tmp_path)]
    assert report.main(args) == 0
    return out.read_text(), out


def test_misses_are_named(tmp_path: Path) -> None:
    md, out = _render(tmp_path, _payload(_run(0.3, misnamed=1, errors=2), recomputed=0.19))
    assert "## Do concurrent agent sessions and restarts keep their reuse through pion llama?" in md
    assert "| -np 1 | concurrent | 30.0% | 31.0% | 0.25 | 0.50 | 1 of 4 | 2 | 5,210 | 12.5 |" in md
    assert "| -np 2 | sequential | 90.0% | 91.0% |" in md
    assert "-np 1 concurrent: 1 of 4 slot files hold another prefix's tokens" in md
    assert "-np 1 concurrent: 2 requests failed" in md
    assert "-np 1: concurrent sessions reused 30.0% of their prompt tokens against 90.0%" in md
    # -np 2 is within 5% of its sequential run: not named.
    assert "-np 2:" not in md
    assert "the next turn recomputed 19.0% of its 16,100 prompt tokens (3,059 computed" in md
    assert "Claude Code" in md and "Pi" in md
    assert "each configuration ran 2 time(s)" in md
    assert "| -np 1 | Pi | 90.0% | 30.0% |" in md
    assert "| -np 1 | Claude Code | 67.5% | 22.5% |" in md
    (figure,) = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert (out.parent / figure).stat().st_size > 1000


def test_met_targets_leave_no_losses(tmp_path: Path) -> None:
    md, _ = _render(tmp_path, _payload(_run(0.88), recomputed=0.005))
    assert "slot files hold another prefix" not in md
    assert "requests failed" not in md
    assert "concurrent sessions reused" not in md
    assert "the next turn recomputed" not in md
    assert "| -np 1 | concurrent | 88.0% |" in md
