"""Write ``BENCHMARKS.md`` from the JSON results the benchmarks leave in ``bench/results/``.

Each benchmark stays independent: it writes ``<name>.json`` and knows nothing of this
report. Here, :data:`SECTIONS` lists the *section renderers* (the ``sections`` package),
one line each, in the report's order: a renderer answers one question a user asks (how
fast against redis-server, how faithful, how durable...) with a table, a PNG plot and a
paragraph that says where we lose. A section whose first result is absent is left out.
A result no renderer claims still gets a section, from :func:`generic` (its numbers as
a table, its ratios as a plot), so a new benchmark shows up at once.

The document is a function of the results alone: the environment table and the dates
come from what each result recorded (``machine``, ``environment``, ``time``), never from
the machine that renders, so the committed ``BENCHMARKS.md`` is exactly what the
committed ``bench/results/`` render to (a test re-renders and compares).

    python bench/report.py                        # bench/results -> BENCHMARKS.md, docs/bench/
    python bench/report.py --results DIR --out FILE --plots DIR

``make bench`` runs every benchmark then this; ``make bench-quick`` (part of ``make
test``) runs them at smoke sizes into a temporary directory and writes the report
there, so CI proves the whole chain works without replacing the committed figures.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))  # the ``sections`` package sits beside this file

from sections._base import (  # noqa: E402
    Result,
    Section,
    bars,
    close,
    figure,
    fmt,
    is_quick,
    parity,
)

__all__ = ["SECTIONS", "Entry", "build", "generic", "load_results", "main"]


@dataclass(frozen=True)
class Entry:
    """One section of the report: its renderer, ``"<module>.<function>"`` under
    ``sections/``, and the result names it reads (the first must be present)."""

    renderer: str
    results: tuple[str, ...]

    def render(self, results: Mapping[str, Result]) -> Section:
        module, _, name = self.renderer.rpartition(".")
        fn: Callable[[Mapping[str, Result]], Section] = getattr(
            importlib.import_module(f"sections.{module}"), name
        )
        return fn(results)


def _entry(renderer: str, *results: str) -> Entry:
    return Entry(renderer, results)


# The report's sections, in order. One line per section: add yours where its question
# belongs. A section whose first result is absent renders nothing.
SECTIONS: list[Entry] = [
    _entry("server.throughput", "vstore_throughput"),
    _entry("server.small_commands", "registry", "decoder"),
    _entry("server.keyspace", "keyspace"),
    _entry("transactions.transactions", "transactions"),
    _entry("families.streams", "streams"),
    _entry("families.lists_sets", "lists_sets"),
    _entry("families.scripting", "scripting"),
    _entry("families.pubsub", "pubsub"),
    _entry("server.workers", "workers"),
    _entry("fairness.fairness", "fairness"),
    _entry("server.vstore_eviction", "vstore_eviction"),
    _entry("durability.persistence", "persistence"),
    _entry("durability.client_memory", "client_memory"),
    _entry("durability.tier", "tier"),
    _entry("features.fidelity", "fidelity"),
    _entry("real.real_model", "real_model", "real_model_ttft"),
    _entry("features.llama", "llama_prefix"),
    _entry("real.llama_real", "llama_prefix_smollm2"),
    _entry("llama_store.llama_store", "llama_store"),
    _entry("agents.agents", "agents"),
    _entry("llama_sessions.llama_sessions", "llama_sessions"),
    _entry("fleet.fleet", "fleet"),
    _entry("llama_status.llama_status", "llama_status"),
    _entry("features.export_fetch", "export_fetch"),
    _entry("features.attend", "attend"),
]


# -- the generic section, for results no renderer claims -----------------------------

_RATIO = re.compile(r"(ratio|_x_|x_redis|speedup|over_|_over)", re.IGNORECASE)
_SKIP = {"benchmark", "time", "machine", "environment", "quick"}


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


def _when(data: Result) -> datetime.datetime | None:
    try:
        return datetime.datetime.strptime(str(data.get("time")), "%Y-%m-%dT%H:%M:%S%z")
    except ValueError:
        return None


def _measured_on(data: Result) -> str:
    """Where one result was measured, as it recorded it (``machine``; ``environment``
    in results written since the report stopped looking at the rendering machine)."""
    machine = data.get("machine")
    env = data.get("environment")
    env = env if isinstance(env, dict) else {}
    parts: list[str] = []
    if isinstance(machine, dict):
        cpu = env.get("cpu")
        cpus = f"{machine.get('cpus', '?')} CPUs"
        parts.append(f"{cpu}, {cpus}" if cpu else cpus)
        if env.get("memory"):
            parts.append(f"{env['memory']} RAM")
        parts.append(str(machine.get("platform", "platform not recorded")))
        parts.append(f"Python {machine.get('python', '?')}")
    elif machine:
        parts.append(str(machine))
    else:
        parts.append("machine not recorded")
    for key in ("pion", "redis-server", "libraries"):
        if env.get(key):
            parts.append(f"{key} {env[key]}" if key != "libraries" else str(env[key]))
    return "; ".join(parts)


def environment(results: Mapping[str, Result]) -> list[tuple[str, str]]:
    """One row per machine the results were measured on, with the results from it."""
    by_machine: dict[str, list[str]] = {}
    for name in sorted(results):
        by_machine.setdefault(_measured_on(results[name]), []).append(f"`{name}`")
    return [(where, ", ".join(names)) for where, names in by_machine.items()]


def _span(results: Mapping[str, Result]) -> str:
    times = sorted(t for t in (_when(d) for d in results.values()) if t is not None)
    if not times:
        return "Measurement times are not recorded."
    first, last = (
        t.astimezone(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC") for t in (times[0], times[-1])
    )
    if first == last:
        return f"Measured {first}."
    return f"Measured between {first} and {last}."


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


def build(results: Mapping[str, Result], link: str, plots: Path | None) -> str:
    """The whole document. Figures are linked as ``<link>/<slug>.png`` and written
    under ``plots`` (None: not written, e.g. to compare the text alone)."""
    if plots is not None:
        plots.mkdir(parents=True, exist_ok=True)
    sections: list[tuple[Section, list[Result]]] = []
    claimed: set[str] = set()
    for entry in SECTIONS:
        if entry.results[0] not in results:
            continue
        inputs = {name: results[name] for name in entry.results if name in results}
        claimed.update(inputs)
        sections.append((entry.render(inputs), list(inputs.values())))
    for name in sorted(set(results) - claimed):
        sections.append((generic(name, results[name]), [results[name]]))

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
        f"{_span(results)} Reproduce everything with `make bench` (a few minutes",
        "to an hour on 2 cores), or one section with the command under it.",
        "",
        "Where each result was measured, as it recorded it:",
        "",
        *_table(["measured on", "results"], environment(results)),
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
            name = f"{_slug(section.title)}.png"
            if plots is not None:
                section.figure.tight_layout()
                section.figure.savefig(plots / name, dpi=80)
            close(section.figure)
            lines += ["", f"![{section.title}]({link}/{name})"]
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
    results = load_results(args.results)
    if not results:
        print(f"report: no results in {args.results}", file=sys.stderr)
        return 1
    link = Path(os.path.relpath(args.plots.absolute(), args.out.absolute().parent)).as_posix()
    text = build(results, link, args.plots)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"report: {len(results)} result(s) -> {args.out} (plots in {args.plots})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
