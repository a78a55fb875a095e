"""The section on transactions: MULTI/EXEC and redis-py's default pipeline against
redis-server (``bench/transactions.py``)."""

from __future__ import annotations

from collections.abc import Mapping

from sections._base import Result, Section, bars, figure, parity, ratio
from sections._text import join


def transactions(results: Mapping[str, Result]) -> Section:
    data = results["transactions"]
    target = float(data.get("target", 0.5))
    rows, labels, vs_redis, vs_aof, losses = [], [], [], [], []
    # pion-server without its log, where the results have it (measured since issue 31).
    no_wal = any("pion-nowal" in r["median"] for r in data.get("results", []))
    for r in data.get("results", []):
        m = r["median"]
        base = m["redis"]
        cpu = r.get("cpu_us_per_request", {})
        labels.append(r["case"])
        vs_redis.append(m["pion"] / base)
        vs_aof.append(m["pion"] / m["redis-aof"])
        nowal = m.get("pion-nowal")
        row = [
            r["case"],
            r["unit"],
            m["pion"],
            *([nowal] if no_wal else []),
            base,
            m["redis-aof"],
            ratio(m["pion"] / base),
            ratio(m["pion"] / m["redis-aof"]),
            *([ratio(nowal / base) if nowal else ""] if no_wal else []),
            cpu.get("pion", float("nan")),
            *([cpu.get("pion-nowal", float("nan"))] if no_wal else []),
            cpu.get("redis", float("nan")),
        ]
        rows.append(row)
        if m["pion"] / base < target and not r.get("reference", False):
            losses.append(f"{r['case']} {ratio(m['pion'] / base)}")
    fig, (ax,) = figure(width=8)
    bars(ax, labels, {"x redis (no persistence)": vs_redis, "x redis (AOF everysec)": vs_aof})
    parity(ax)
    ax.axhline(target, color="red", linewidth=0.8, linestyle=":", label=f"target {target}x")
    ax.legend(fontsize=8)
    ax.set_ylabel("pion-server x redis-server")
    ax.set_title("Transactions: MULTI/EXEC and redis-py's default pipeline")
    return Section(
        title="How fast are transactions (MULTI/EXEC, redis-py's pipeline) against redis-server?",
        intro=(
            "MULTI, 4 SETs, EXEC over "
            f"{data.get('connections', '?')} connections, 64 transactions per round trip "
            "(P64) and one (P1), and redis-py's default (transactional) pipeline of 100 "
            "SETs from as many threads; pion-server with one worker and its log "
            "(`everysec`; an EXEC is one log record) against redis-server without "
            f"persistence and with an `everysec` AOF, medians of {data.get('rounds', '?')} "
            f"rounds. Target: {target}x redis-server. `6 SET P64` is a reference without "
            "target: the P64 case with six plain SETs in place of each transaction. The "
            "CPU columns are each server's CPU time (user + system) per request: on a "
            "shared machine rates follow each process's share of the CPU, CPU time is "
            "what the server spends."
            + (" `--no-wal`: pion-server without its log." if no_wal else "")
        ),
        headers=[
            "case",
            "unit",
            "pion",
            *(["pion --no-wal"] if no_wal else []),
            "redis",
            "redis AOF",
            "pion x redis",
            "pion x AOF",
            *(["--no-wal x redis"] if no_wal else []),
            "pion CPU µs/req",
            *(["--no-wal CPU µs/req"] if no_wal else []),
            "redis CPU µs/req",
        ],
        rows=rows,
        losses=(
            f"Below the {target}x target (with the log): {join(losses)}. With the log "
            "each SET builds and appends its record in Python, which is what separates "
            "pion from redis-server when many commands arrive per round trip (a "
            "transaction costs about what its commands cost as plain pipelined SETs, "
            "the reference row). Without it (`--no-wal`) a transaction of plain SETs "
            "that arrives whole is answered in one run, compiled (docs/decisions.md, "
            "runs); redis-server at P64 is bound by the Python client and idles."
            if losses
            else ""
        ),
        command="python bench/transactions.py",
        figure=fig,
    )
