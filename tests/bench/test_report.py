"""bench/report.py: BENCHMARKS.md from the results a benchmark leaves, one section per
question with its table, plot and losses; a result without a renderer still gets one.
The committed BENCHMARKS.md is exactly what the committed results render to, and the
report depends on nothing but them (no environment of the rendering machine, no clock);
the sections never import the report (no import cycle)."""

from __future__ import annotations

import ast
import importlib
import json
import platform
import re
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import report  # noqa: E402

MACHINE = {"python": "3.11", "platform": "Linux-test", "cpus": 2}


def _write(directory: Path, name: str, payload: dict[str, Any]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.json").write_text(json.dumps(payload))


def _figures(md: str, out: Path) -> list[Path]:
    return [out.parent / m for m in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)]


def test_the_committed_results_render(tmp_path: Path) -> None:
    out = tmp_path / "BENCHMARKS.md"
    assert (
        report.main(
            [
                "--results",
                str(BENCH / "results"),
                "--out",
                str(out),
                "--plots",
                str(tmp_path / "png"),
            ]
        )
        == 0
    )
    md = out.read_text()
    for name in ("vstore_throughput", "registry", "fidelity", "persistence", "export_fetch"):
        assert (BENCH / "results" / f"{name}.json").exists()
    for title in (
        "How fast are store and fetch, per format, against redis-server?",
        "How fast are small commands, against redis-server?",
        "How faithful is each storage format?",
        "How fast is recovery, and what does each fsync policy cost?",
        "How fast is a same-machine fetch through V.EXPORT?",
    ):
        assert f"## {title}" in md
    figures = _figures(md, out)
    assert len(figures) >= 5 and all(p.is_file() and p.stat().st_size > 1000 for p in figures)
    assert "**Where we lose.**" in md and "| measured on | results |" in md
    assert "Reproduce: `" in md


def test_the_committed_report_is_what_the_committed_results_render_to() -> None:
    """Byte for byte: regenerate with `python bench/report.py` after changing a result
    or a renderer, and commit both."""
    results = report.load_results(BENCH / "results")
    text = report.build(results, "docs/bench", None)
    committed = (BENCH.parent / "BENCHMARKS.md").read_text()
    assert text == committed, "BENCHMARKS.md is stale: run `python bench/report.py`"


def test_the_environment_and_dates_come_from_the_results(tmp_path: Path) -> None:
    results = tmp_path / "results"
    env = {"cpu": "Test CPU 9000", "memory": "3 GiB", "redis-server": "6.2.99"}
    for name, when in (
        ("decoder", "2026-01-02T03:04:05+0000"),
        ("late", "2026-02-03T04:05:06+0100"),
    ):
        _write(
            results,
            name,
            {"benchmark": name, "time": when, "machine": MACHINE, "environment": env, "x": 1},
        )
    first = report.build(report.load_results(results), "p", None)
    again = report.build(report.load_results(results), "p", None)
    assert first == again
    assert "Measured between 2026-01-02 03:04 UTC and 2026-02-03 03:05 UTC." in first
    row = "| Test CPU 9000, 2 CPUs; 3 GiB RAM; Linux-test; Python 3.11; redis-server 6.2.99 |"
    assert f"{row} `decoder`, `late` |" in first
    assert platform.platform() not in first  # the rendering machine is not described
    assert "| x | 1 |" in first and "environment.cpu" not in first  # not a figure


def test_a_section_without_its_results_renders_nothing(tmp_path: Path) -> None:
    """Sections listed in SECTIONS whose first result is absent leave no heading, no
    contents line and no error (so a branch that adds a section renders the same report
    until its results are committed)."""
    committed = report.load_results(BENCH / "results")
    title = next(e for e in report.SECTIONS if e.results[0] == "attend").render(committed).title
    full = report.build(committed, "p", None)
    assert f"## {title}" in full
    text = report.build({k: v for k, v in committed.items() if k != "attend"}, "p", None)
    assert title not in text
    headings = len(re.findall(r"^## ", text, re.MULTILINE))
    assert headings == len(re.findall(r"^## ", full, re.MULTILINE)) - 1
    for entry in report.SECTIONS:  # each line names a renderer that exists
        module, _, name = entry.renderer.rpartition(".")
        assert callable(getattr(importlib.import_module(f"sections.{module}"), name)), entry


def test_the_sections_never_import_the_report() -> None:
    for path in sorted((BENCH / "sections").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            assert not any(n.split(".")[0] == "report" for n in names), path


def test_every_heading_has_its_contents_link(tmp_path: Path) -> None:
    out = tmp_path / "B.md"
    report.main(["--results", str(BENCH / "results"), "--out", str(out), "--plots", str(tmp_path)])
    md = out.read_text()
    headings = re.findall(r"^## (.+)$", md, re.MULTILINE)
    links = re.findall(r"^- \[(.+)\]\(#([^)]+)\)$", md, re.MULTILINE)
    assert [t for t, _ in links] == headings[1:]  # after "Contents"
    for title, anchor in links:
        assert anchor == re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def test_a_new_benchmark_gets_a_generic_section(tmp_path: Path) -> None:
    results = tmp_path / "results"
    _write(
        results,
        "future_bench",
        {
            "benchmark": "future_bench",
            "time": "2026-01-01T00:00:00+0000",
            "machine": MACHINE,
            "quick": True,
            "query_us": 12.5,
            "rows": [{"name": "M=1", "x_redis": 0.8, "ms": 3.0}, {"name": "M=8", "x_redis": 1.4}],
            "nested": {"speedup": 2.0, "label": "dense"},
        },
    )
    out = tmp_path / "BENCHMARKS.md"
    assert (
        report.main(["--results", str(results), "--out", str(out), "--plots", str(tmp_path / "p")])
        == 0
    )
    md = out.read_text()
    assert "## `future_bench`" in md and "bench/sections/" in md
    for row in ("| query_us | 12.5 |", "| rows[M=1].x_redis | 0.8 |", "| nested.label | dense |"):
        assert row in md
    assert "Smoke sizes (--quick): not representative." in md
    assert len(_figures(md, out)) == 1  # its ratios, plotted
    assert "Reproduce: `python bench/future_bench.py`." in md


def test_renderers_say_where_we_lose(tmp_path: Path) -> None:
    results = tmp_path / "results"
    _write(
        results,
        "export_fetch",
        {
            "benchmark": "export_fetch",
            "machine": MACHINE,
            "layers": 2,
            "tokens": 8,
            "kv_dim": 4,
            "payload_mb": 0.1,
            "tcp_s": 0.010,
            "export_reused_s": 0.005,
            "export_first_s": 0.012,
            "speedup_reused": 2.0,
            "speedup_first": 0.83,
        },
    )
    out = tmp_path / "B.md"
    report.main(["--results", str(results), "--out", str(out), "--plots", str(tmp_path / "p")])
    md = out.read_text()
    assert "| PionPromptCache.fetch, export file reused | 5.00 | 2.00x |" in md
    assert "**Where we lose.** The first fetch after a write" in md and "(0.83x" in md


def test_no_results_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "broken.json").write_text("{not json")
    assert report.main(["--results", str(tmp_path), "--out", str(tmp_path / "x.md")]) == 1
    assert "skipping" in capsys.readouterr().err and not (tmp_path / "x.md").exists()
