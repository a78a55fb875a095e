"""The section on fairness under hostile load: a second client's PING while another
floods or runs a long command, against redis-server in the same run, and the server's
memory under non-reading floods against ``--maxmemory-clients``."""

from __future__ import annotations

from collections.abc import Mapping

from sections._base import Result, Section, bars, figure
from sections._text import join as _join

_LOADS = {
    "ping_flood": "a pipelined PING flood",
    "set_pipeline": "a SET pipeline",
    "zadd": "one large ZADD",
    "keys": "KEYS * over a large keyspace",
    "bitpos": "BITPOS over a large string",
    "bitcount": "BITCOUNT over a large string",
    "bitop_not": "BITOP NOT of a large string",
}
# The targets: p99 at most this many times redis-server's, and never over this.
_TIMES_REDIS = 5.0
_CEILING_MS = 50.0


def fairness(results: Mapping[str, Result]) -> Section:
    data = results["fairness"]
    pion, red = data.get("pion-server", {}), data.get("redis-server", {})
    config = data.get("config", {})
    rows, labels, p99s, red99s = [], [], [], []
    losses = []
    for key, text in _LOADS.items():
        p, q = pion.get(key), red.get(key)
        if not p or not q:
            continue
        times = p["p99_ms"] / q["p99_ms"] if q["p99_ms"] else 0.0
        row = [text, p["p50_ms"], p["p99_ms"], p["max_ms"], q["p50_ms"], q["p99_ms"]]
        rows.append([*row, q["max_ms"]] if "bits_mb" in config else row)
        labels.append(key.replace("_", " "))
        p99s.append(p["p99_ms"])
        red99s.append(q["p99_ms"])
        if times > _TIMES_REDIS or p["p99_ms"] > _CEILING_MS:
            losses.append(
                f"during {text} the probe's p99 is {p['p99_ms']:.1f} ms, {times:.1f}x "
                f"redis-server's {q['p99_ms']:.1f} ms (target: at most {_TIMES_REDIS:g}x "
                f"and {_CEILING_MS:g} ms)"
            )
    fig, (ax,) = figure(width=7)
    bars(ax, labels, {"pion-server p99": p99s, "redis-server p99": red99s})
    ax.axhline(_CEILING_MS, color="black", linewidth=0.8, linestyle="--", label="50 ms")
    ax.set_ylabel("probe PING p99, ms (lower is better)")
    ax.set_title("Another client's PING during a flood or a long command")
    rss = data.get("rss", {})
    extra = []
    if rss:
        extra.append(
            (
                "Memory under four clients that pipeline GETs and never read",
                ["--maxmemory-clients MiB", "peak RSS growth MiB", "growth / bound", "evicted"],
                [
                    [
                        rss["bound_mib"],
                        rss["peak_growth_mib"],
                        rss["growth_over_bound"],
                        rss["evicted_clients"],
                    ]
                ],
            )
        )
        if rss["growth_over_bound"] > 1.5:
            losses.append(
                f"RSS grew {rss['growth_over_bound']:.2f}x the --maxmemory-clients bound "
                "(target: at most 1.5x)"
            )
    load = data.get("load_average")
    machine = f" Load average before and after: {load}." if load else ""
    keys = f"KEYS * over {config.get('keys', '?'):,} keys"
    if "bits_mb" in config:  # results from before the bit cases have none
        longest = (
            f"runs {keys}, or BITPOS, BITCOUNT or BITOP NOT over a string of "
            f"{config['bits_mb']} MB; round trips in ms, against redis-server under the same "
            "loads (a command that holds a server's loop shows as one long wait, its max: "
            "the probe sends one PING meanwhile)."
        )
    else:
        longest = f"or runs {keys}; round trips in ms, against redis-server under the same loads."
    return Section(
        title="Can one client hold up the others?",
        intro=(
            "A probe client PINGs every 2 ms from its own process while another client "
            f"floods inline PINGs for {config.get('flood_seconds', '?')} s, pipelines "
            f"{config.get('sets', '?'):,} SETs, sends one ZADD of {config.get('zadd', '?'):,} "
            f"pairs, {longest} Then four clients pipeline GETs without reading against "
            "--maxmemory-clients." + machine
        ),
        headers=[
            *["load", "pion p50", "pion p99", "pion max", "redis p50", "redis p99"],
            *(["redis max"] if "bits_mb" in config else []),
        ],
        rows=rows,
        losses=(f"{_join(losses)}." if losses else ""),
        command="python bench/fairness.py",
        figure=fig,
        extra_tables=extra,
    )
