"""Write ``BENCHMARKS.md`` from the JSON results the benchmarks leave in ``bench/results/``.

Each benchmark stays independent: it writes ``<name>.json`` and knows nothing of this
report. Here, a registry maps result names to *section renderers* (the ``sections`` package):
a renderer answers one question a user asks (how fast against redis-server, how
faithful, how durable...) with a table, a PNG plot and a paragraph that says where we
lose. A result no renderer claims still gets a section, from :func:`generic` (its
numbers as a table, its ratios as a plot), so a new benchmark shows up at once, and a
renderer of twenty lines makes it read well.

    python bench/report.py                        # bench/results -> BENCHMARKS.md, docs/bench/
    python bench/report.py --results DIR --out FILE --plots DIR

``make bench`` runs every benchmark then this; ``make bench-quick`` (part of ``make
test``) runs them at smoke sizes into a temporary directory and writes the report
there, so CI proves the whole chain works without replacing the committed figures.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, never a display
import matplotlib.pyplot as plt

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
Result = dict[str, Any]


@dataclass
class Section:
    """One question and its answer."""

    title: str
    intro: str
    headers: Sequence[str]
    rows: Sequence[Sequence[Any]]
    losses: str  # where we lose, said plainly (empty: nowhere in these figures)
    command: str
    figure: plt.Figure | None = None
    extra_tables: list[tuple[str, Sequence[str], Sequence[Sequence[Any]]]] = field(
        default_factory=list
    )


@dataclass(frozen=True)
class Renderer:
    results: tuple[str, ...]  # the result names it reads; the first must be present
    render: Callable[[Mapping[str, Result]], Section]
    order: int  # where its section goes in the report (lower first)


REGISTRY: list[Renderer] = []


def renderer(
    *results: str, order: int = 1000
) -> Callable[[Callable[[Mapping[str, Result]], Section]], Any]:
    """Register a section renderer for ``results``; sections appear by ``order``, then
    in the order they were registered."""

    def register(fn: Callable[[Mapping[str, Result]], Section]) -> Any:
        REGISTRY.append(Renderer(results, fn, order))
        return fn

    return register


# -- formatting helpers the renderers share ------------------------------------------


def fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e7):
            return f"{value:.2e}"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.3g}" if abs(value) < 1 else f"{value:.2f}"
    return str(value)


def ratio(value: float) -> str:
    return f"{value:.2f}x"


def is_quick(data: Result) -> bool:
    config = data.get("config")
    return bool(data.get("quick") or (isinstance(config, dict) and config.get("quick")))


def figure(ncols: int = 1, width: float = 6.4) -> tuple[plt.Figure, Any]:
    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, 3.6), squeeze=False)
    return fig, axes[0]


def bars(ax: Any, labels: Sequence[str], series: Mapping[str, Sequence[float]]) -> None:
    """Grouped bars: one group per label, one bar per series."""
    n = max(1, len(series))
    width = 0.8 / n
    for i, (name, values) in enumerate(series.items()):
        xs = [x + (i - (n - 1) / 2) * width for x in range(len(labels))]
        ax.bar(xs, values, width, label=name)
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right")
    if len(series) > 1:
        ax.legend(fontsize=8)


def parity(ax: Any, y: float = 1.0, label: str = "redis-server") -> None:
    ax.axhline(y, color="black", linewidth=0.8, linestyle="--", label=label)


# -- the generic section, for results no renderer claims -----------------------------

_RATIO = re.compile(r"(ratio|_x_|x_redis|speedup|over_|_over)", re.IGNORECASE)
_SKIP = {"benchmark", "time", "machine", "quick"}


def flatten(data: Any, prefix: str = "") -> Iterable[tuple[str, Any]]:
    """Scalar leaves as ``a.b.c`` paths (lists of dicts indexed; long lists skipped)."""
    if isinstance(data, dict):
        for key, value in data.items():
            if not prefix and key in _SKIP:
                continue
            yield from flatten(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(data, list):
        if len(data) <= 32 and all(isinstance(v, dict) for v in data):
            for i, value in enumerate(data):
                label = next((str(value[k]) for k in ("name", "format", "label") if k in value), i)
                yield from flatten(value, f"{prefix}[{label}]")
    elif isinstance(data, int | float | str | bool):
        yield prefix, data


def generic(name: str, data: Result) -> Section:
    leaves = list(flatten(data))
    ratios = [(k, float(v)) for k, v in leaves if _RATIO.search(k) and isinstance(v, int | float)]
    fig = None
    if ratios:
        fig, (ax,) = figure(width=max(6.4, 0.5 * len(ratios)))
        bars(ax, [k for k, _ in ratios], {"ratio": [v for _, v in ratios]})
        parity(ax, label="1.0")
        ax.set_ylabel("ratio")
        ax.set_title(name)
    return Section(
        title=f"`{name}`",
        intro=(
            f"Every figure of `bench/results/{name}.json` (no dedicated renderer yet: add "
            "one to `bench/sections/` to give this section its question and plot)."
        ),
        headers=["figure", "value"],
        rows=[[k, fmt(v)] for k, v in leaves],
        losses="",
        command=f"python bench/{name}.py",
        figure=fig,
    )


# -- the document --------------------------------------------------------------------


def load_results(directory: Path) -> dict[str, Result]:
    out: dict[str, Result] = {}
    for path in sorted(directory.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            print(f"report: skipping {path}: {exc}", file=sys.stderr)
            continue
        if isinstance(data, dict):
            out[path.stem] = data
    return out


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _redis_server_version() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        return "not installed"
    try:
        out = subprocess.run(
            [binary, "--version"], capture_output=True, timeout=10, text=True, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    m = re.search(r"v=(\S+)", out.stdout)
    return m.group(1) if m else out.stdout.strip()


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 2**20:.0f} GiB"
    except OSError:
        pass
    return "unknown"


def environment() -> list[tuple[str, str]]:
    sys.path.insert(0, str(ROOT / "src"))
    try:
        from pion import __version__ as pion_version
    except ImportError:
        pion_version = _version("pion")
    return [
        ("machine", f"{_cpu_model()}, {os.cpu_count()} CPUs, {_memory_gib()} RAM"),
        ("system", platform.platform()),
        ("Python", platform.python_version()),
        ("pion", pion_version),
        ("redis-server (baseline)", _redis_server_version()),
        (
            "libraries",
            ", ".join(
                f"{p} {_version(p)}"
                for p in ("numpy", "redis", "hiredis", "uvloop", "pion-vllm-mlx", "matplotlib")
            ),
        ),
    ]


def _provenance(data: Result) -> str:
    machine = data.get("machine")
    if isinstance(machine, dict):
        where = f"{machine.get('platform', '?')}, {machine.get('cpus', '?')} CPUs"
    else:
        where = str(machine or "machine not recorded")
    when = data.get("time", "time not recorded")
    quick = " **Smoke sizes (--quick): not representative.**" if is_quick(data) else ""
    return f"Measured {when} on {where}.{quick}"


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    def cell(v: Any) -> str:
        return (v if isinstance(v, str) else fmt(v)).replace("|", "\\|")

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return lines


def _slug(title: str) -> str:
    """A file name for the section's plot."""
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")[:60] or "section"


def _anchor(title: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def build(results: Mapping[str, Result], out: Path, plots: Path) -> str:
    """The whole document; plots are written under ``plots``."""
    plots.mkdir(parents=True, exist_ok=True)
    sections: list[tuple[Section, list[Result]]] = []
    claimed: set[str] = set()
    for r in sorted(REGISTRY, key=lambda r: r.order):
        if r.results[0] not in results:
            continue
        inputs = {name: results[name] for name in r.results if name in results}
        claimed.update(inputs)
        sections.append((r.render(inputs), list(inputs.values())))
    for name in sorted(set(results) - claimed):
        sections.append((generic(name, results[name]), [results[name]]))

    today = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Benchmarks",
        "",
        "How Pion's server, client and `pion llama` perform, each figure against a",
        "baseline measured in the same run on the same machine (redis-server holding the",
        "same bytes through the same client, a cold prefill on the same llama-server, a",
        "plain read of the same files). Generated by `python bench/report.py` from the",
        "JSON results under `bench/results/`: do not edit by hand. Sections may come from",
        "different runs (each says when and where); on a busy machine latency tails (p99)",
        "swing from run to run, so read ratios within a section.",
        "",
        f"Report written {today}. Reproduce everything with `make bench` (a few minutes",
        "to an hour on 2 cores), or one section with the command under it.",
        "",
        *_table(["environment", ""], environment()),
        "",
        "## Contents",
        "",
    ]
    for section, _ in sections:
        lines.append(f"- [{section.title}](#{_anchor(section.title)})")
    for section, inputs in sections:
        lines += ["", f"## {section.title}", "", section.intro, ""]
        lines += _table(section.headers, section.rows)
        for caption, headers, rows in section.extra_tables:
            lines += ["", caption, "", *_table(headers, rows)]
        if section.figure is not None:
            png = plots / f"{_slug(section.title)}.png"
            section.figure.tight_layout()
            section.figure.savefig(png, dpi=80)
            plt.close(section.figure)
            rel = os.path.relpath(png, out.parent)
            lines += ["", f"![{section.title}]({rel})"]
        if section.losses:
            losses = section.losses[0].upper() + section.losses[1:]
            lines += ["", f"**Where we lose.** {losses}"]
        lines += ["", " ".join(_provenance(d) for d in inputs), f"Reproduce: `{section.command}`."]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--results", type=Path, default=HERE / "results")
    ap.add_argument("--out", type=Path, default=ROOT / "BENCHMARKS.md")
    ap.add_argument("--plots", type=Path, default=ROOT / "docs" / "bench")
    args = ap.parse_args(argv)
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    import sections  # noqa: F401  (registers the renderers)

    results = load_results(args.results)
    if not results:
        print(f"report: no results in {args.results}", file=sys.stderr)
        return 1
    text = build(results, args.out, args.plots)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"report: {len(results)} result(s) -> {args.out} (plots in {args.plots})")
    return 0


if __name__ == "__main__":
    # Run as the module `report`, the one `sections` registers its renderers with.
    sys.path.insert(0, str(HERE))
    import report

    sys.exit(report.main())
