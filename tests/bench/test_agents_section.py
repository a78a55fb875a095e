"""bench/sections/agents.py: the agent harnesses' session starts, direct and via pion,
with their ratios, the plot, and the sessions that miss their target named."""

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


def _session(ttft: float, cached: int, tokens: int = 1000) -> dict[str, Any]:
    return {"ttft_ms": ttft, "prompt_ms": ttft * 0.9, "n_tokens": tokens, "cached": cached}


def test_agents_section(tmp_path: Path) -> None:
    direct = {"cold": _session(10000, 0), "hot": _session(9000, 20), "restart": _session(10000, 0)}
    pion = {"cold": _session(11000, 990), "hot": _session(300, 990), "restart": _session(2000, 990)}
    ratios = {"cold": 1.1, "hot": 0.03, "restart": 0.2}
    payload = {
        "benchmark": "agents",
        "machine": {"python": "3.11", "platform": "Linux-test", "cpus": 2},
        "harnesses": {"claude": {"direct": direct, "pion": pion, "ratios": ratios}},
        "targets": {"restart": 0.1, "hot": 0.05},
        "versions": {"@anthropic-ai/claude-code": "2.1.197"},
        "load_avg_before": [1.0, 1.0, 1.0],
        "load_avg_after": [2.0, 1.0, 1.0],
    }
    results = tmp_path / "results"
    results.mkdir()
    (results / "agents.json").write_text(json.dumps(payload))
    out = tmp_path / "B.md"
    args = ["--results", str(results), "--out", str(out), "--plots", str(tmp_path)]
    assert report.main(args) == 0
    md = out.read_text()
    assert "## How fast does each agent harness start a session through pion llama?" in md
    assert "| Claude Code | hot | 9,000 | 8,100 | 20/1,000 | 300 | 270 | 990/1,000 | 0.03x |" in md
    # The restart misses its 0.1x target and is named; the hit meets its 0.05x.
    assert "Claude Code restart via pion took 0.20x of its direct cold start" in md
    assert "Claude Code hot via pion" not in md
    (figure,) = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert (out.parent / figure).stat().st_size > 1000
