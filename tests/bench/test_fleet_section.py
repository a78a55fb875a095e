"""bench/sections/fleet.py: routers over several llama-servers (tokens reused, prefill,
TTFT) and a killed server's failover, with the plot, and every missed target named."""

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


def _run(reused: int, ttft: float, errors: int = 0) -> dict[str, Any]:
    requests = [
        {
            "harness": "pi",
            "cache_n": 900,
            "prompt": 1000,
            "status": 200,
            "ttft_s": ttft,
            "prompt_ms": 50.0,
        },
        {
            "harness": "claude",
            "cache_n": 1500,
            "prompt": 3000,
            "status": 200,
            "ttft_s": ttft + 0.5,
            "prompt_ms": 250.0,
        },
        {"harness": "claude", "status": 0, "failures": [[1.0, 1.2, 0, "ReadError"]]},
    ]
    return {
        "requests": requests,
        "answered": 2,
        "errors": errors,
        "retries": 1,
        "prompt_tokens": 4000,
        "reused_tokens": reused,
        "reuse": reused / 4000,
        "reported_reuse": 0.6,
        "prefill_s": 3.25,
        "ttft_p50_s": ttft,
        "ttft_p95_s": ttft * 3,
        "seconds": 20.5,
    }


def _payload(pion_reused: int, pion_ttft: float, failover_s: float) -> dict[str, Any]:
    runs = {
        "pion": _run(pion_reused, pion_ttft),
        "round_robin": _run(2000, 0.5),
        "least_loaded": _run(2200, 0.45),
        "oracle": _run(3600, 0.2),
    }
    killed = _run(3000, 0.3, errors=0) | {
        "failover": {"kill_s": 10.0, "sessions": 4, "failed_sessions": ["pi-project0"],
                     "failover_s": failover_s},
    }  # fmt: skip
    return {
        "benchmark": "fleet",
        "machine": {"python": "3.11", "platform": "Linux-test", "cpus": 2},
        "harnesses": {"pi": {}, "claude": {}},
        "servers": 3,
        "slots": 2,
        "sessions": 6,
        "projects": 3,
        "turns": 4,
        "stagger_s": 0.3,
        "runs": runs,
        "pion_killed": killed,
        "figures": {
            "reuse_over_oracle": pion_reused / 3600,
            "ttft_p50_over_round_robin": pion_ttft / 0.5,
            "failover_s": failover_s,
        },
        "targets": {"reuse_over_oracle": 0.95, "ttft_p50_over_round_robin": 0.3, "failover_s": 5.0},
        "model": {"layers": 2, "width": 128},
        "llama_build": "b11434",
        "load_avg_before": [1.0, 1.0, 1.0],
        "load_avg_after": [2.0, 1.0, 1.0],
    }


def _render(tmp_path: Path, payload: dict[str, Any]) -> tuple[str, Path]:
    results = tmp_path / "results"
    results.mkdir()
    (results / "fleet.json").write_text(json.dumps(payload))
    out = tmp_path / "B.md"
    args = ["--results", str(results), "--out", str(out), "--plots", str(tmp_path)]
    assert report.main(args) == 0
    return out.read_text(), out


def test_misses_are_named(tmp_path: Path) -> None:
    md, out = _render(tmp_path, _payload(pion_reused=1800, pion_ttft=0.4, failover_s=7.5))
    assert "## Which llama-server should a request go to?" in md
    assert "| pion llama proxy | 45.0% | 1,800 of 4,000 | 60.0% | 3.25 | 0.400 | 1.200 |" in md
    assert "| oracle | 90.0% | 3,600 of 4,000 |" in md
    assert "| pion, a server killed | 75.0% |" in md
    assert "Pion reused 1,800 tokens against the oracle's 3,600 (50.00%, target >= 95.0%)" in md
    assert "TTFT p50 was 0.400 s against round robin's 0.500 s (0.80x, target <= 0.30x)" in md
    assert "its sessions waited up to 7.50 s for an answer (target <= 5 s)" in md
    assert "over 4 sessions (1 saw a failed request)" in md
    # Per harness, the answers' own cache_n: Pi 900 of 1000, Claude 1500 of 3000.
    assert "| Pi | 90.0% | 90.0% | 90.0% | 90.0% |" in md
    assert "| Claude Code | 50.0% |" in md
    # Own prefill 0.05 + 0.25 s of 3.25; TTFT less own prefill: 0.35 and 0.65 (p50 the upper).
    assert "| pion llama proxy | 0.30 | 2.95 | 0.400 | 0.650 |" in md
    (figure,) = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert (out.parent / figure).stat().st_size > 1000


def test_met_targets_leave_no_losses(tmp_path: Path) -> None:
    md, _ = _render(tmp_path, _payload(pion_reused=3500, pion_ttft=0.1, failover_s=2.0))
    section = md.split("## Which llama-server should a request go to?")[1]
    assert "Where we lose" not in section.split("Reproduce:")[0]
    assert "tokens against the oracle's" not in md
    assert "against round robin's" not in md
    assert "waited up to" not in md
