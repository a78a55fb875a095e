"""The section on streams: XADD and a consumer's XREADGROUP + XACK against
redis-server (``bench/streams.py``)."""

from __future__ import annotations

from collections.abc import Mapping

from sections._base import Result, Section, bars, figure, parity, ratio
from sections._text import join


def streams(results: Mapping[str, Result]) -> Section:
    data = results["streams"]
    target = float(data.get("target", 0.5))
    rows, labels, vs_redis, losses = [], [], [], []
    for r in data.get("results", []):
        m = r["median"]
        x = m["pion"] / m["redis"]
        labels.append(r["case"])
        vs_redis.append(x)
        rows.append([r["case"], r["unit"], m["pion"], m["redis"], ratio(x)])
        if x < target:
            losses.append(f"{r['case']} {ratio(x)}")
    fig, (ax,) = figure(width=6.4)
    bars(ax, labels, {"x redis (no persistence)": vs_redis})
    parity(ax)
    ax.axhline(target, color="red", linewidth=0.8, linestyle=":", label=f"target {target}x")
    ax.legend(fontsize=8)
    ax.set_ylabel("pion-server x redis-server")
    ax.set_title("Streams: XADD, XREADGROUP + XACK")
    return Section(
        title="How fast are streams (XADD, a consumer group's read and ack) against redis-server?",
        intro=(
            "XADD with `*` ids from redis-benchmark (50 clients, unpipelined), and one "
            "consumer taking a stream's entries one XREADGROUP `>` COUNT 1 at a time and "
            "acknowledging each with XACK (two round trips per entry, as a job worker "
            "does); pion-server with one worker and its log (`everysec`: each XADD, "
            "delivery and XACK is a record) against redis-server without persistence, "
            f"medians of {data.get('rounds', '?')} rounds. Target: {target}x redis-server."
        ),
        headers=["case", "unit", "pion", "redis", "pion x redis"],
        rows=rows,
        losses=(
            f"Below the {target}x target: {join(losses)}. Each of these commands is one "
            "small request, so the server's per-command cost in Python (dispatch, the "
            "stream's change, its log record) is what separates it from redis-server."
            if losses
            else ""
        ),
        command="python bench/streams.py",
        figure=fig,
    )
