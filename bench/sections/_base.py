"""What every section renderer shares: the :class:`Section` it returns and the
formatting and plotting helpers. ``report.py`` imports the sections, never the other
way round, so the report and its sections form no import cycle."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, never a display
import matplotlib.pyplot as plt

# The report holds each section's figure until it writes the page (one per section, more
# than pyplot's warning threshold of 20); each is closed once saved (:func:`close`).
plt.rcParams["figure.max_open_warning"] = 0

__all__ = [
    "Result",
    "Section",
    "bars",
    "close",
    "figure",
    "fmt",
    "is_quick",
    "parity",
    "ratio",
]

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


def load_average(data: Result) -> str:
    """The 1-minute load average before and after a run (``load_avg_before``/``_after``:
    ``os.getloadavg()``): how shared the machine was."""
    before, after = data.get("load_avg_before"), data.get("load_avg_after")
    if not before or not after:
        return "not recorded"
    return f"{before[0]:.1f} before, {after[0]:.1f} after"


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


def close(fig: plt.Figure) -> None:
    """Release a figure once it is saved (pyplot keeps every open one)."""
    plt.close(fig)
