"""Sections on the server's speed against redis-server: bulk K/V throughput per format,
small commands, the plain keyspace, multi-worker throughput and LRU eviction."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sections._base import Result, Section, bars, figure, parity, ratio
from sections._text import join as _join

# -- 1. bulk K/V throughput per format ------------------------------------------------


def throughput(results: Mapping[str, Result]) -> Section:
    data = results["vstore_throughput"]
    config = data.get("config", {})
    rows, labels, store, fetch = [], [], [], []
    slow_store, slow_fetch, heavy = [], [], []
    for row in data.get("pion", []):
        name = row["format"]
        labels.append(name)
        store.append(row["store_x_redis"])
        fetch.append(row["fetch_x_redis"])
        cost = row.get("store_cost_over_vstore", row["peak_over_vstore"])
        within = row.get("peak_within_bound", cost <= 1.3)
        rows.append(
            [
                name,
                row["store_mb_s"],
                ratio(row["store_x_redis"]),
                row["fetch_mb_s"],
                ratio(row["fetch_x_redis"]),
                ratio(cost),
                "yes" if within else "no",
            ]
        )
        if row["store_x_redis"] < 1.0:
            slow_store.append(f"{name} {ratio(row['store_x_redis'])}")
        if row["fetch_x_redis"] < 1.0:
            slow_fetch.append(f"{name} {ratio(row['fetch_x_redis'])}")
        if not within:
            heavy.append(f"{name} {ratio(cost)}")
    losses = []
    if slow_store:
        losses.append(f"store is slower than redis-server's SET for {_join(slow_store)}")
    if slow_fetch:
        losses.append(f"fetch is slower than GET for {_join(slow_fetch)}")
    if heavy:
        losses.append(
            f"the server's peak memory, less its idle interpreter, passes 1.3x the stored "
            f"bytes plus two layers in flight for {_join(heavy)}"
        )
    fig, (ax,) = figure(width=8)
    bars(ax, labels, {"store (fp32 in)": store, "fetch (fp32 out)": fetch})
    parity(ax)
    ax.set_ylabel("x redis-server (higher is better)")
    ax.set_title("V.STOREBATCH / V.FETCH BATCH against SET / GET of the same bytes")
    shape = f"{config.get('layers', '?')} layers x {config.get('tokens', '?')} tokens x "
    shape += f"{config.get('dim', '?')} dims"
    return Section(
        title="How fast are store and fetch, per format, against redis-server?",
        intro=(
            f"One prefix of {shape} of fp32, stored with one `V.STOREBATCH` per layer "
            "(pipelined) and read back with one `V.FETCH ... BATCH`, against `SET`/`GET` "
            "of the same fp32 bytes on redis-server through the same redis-py client. "
            "MB/s count fp32 payload bytes on both sides, so `x redis` is a plain time "
            "ratio. `fp16/F16` is what Pion's clients do: fp16 on the wire both ways. "
            "Peak memory is the server's high-water mark (VmHWM) less its idle RSS, over "
            "the bytes it stores; `within` compares it with 1.3x the stored bytes plus "
            "the in-flight bound (two layers' blobs, one command's stored rows, the "
            "receive buffers)."
        ),
        headers=[
            "format",
            "store MB/s",
            "store x redis",
            "fetch MB/s",
            "fetch x redis",
            "(peak - idle) / stored",
            "within",
        ],
        rows=rows,
        losses=(
            f"Against redis-server holding the same bytes, {'; '.join(losses)}. Quantizing "
            "formats do arithmetic redis-server does not (encode on store, decode on "
            "fetch); the fp16 rows convert fp32 to fp16 and back."
            if losses
            else ""
        ),
        command="python bench/vstore_throughput.py",
        figure=fig,
    )


# -- 2. small commands: LOOKUP throughput, MEMBERSHIP latency, the decoder ---------------


def small_commands(results: Mapping[str, Result]) -> Section:
    reg = results["registry"]
    mem, look = reg.get("membership", {}), reg.get("lookup", {})
    rows: list[list[Any]] = [
        [
            "KV.PREFIX.LOOKUP, 50 clients (req/s)",
            look.get("pion_lookup_rps_P1"),
            look.get("redis_get_rps_P1"),
            ratio(look.get("ratio_P1", 0.0)),
        ],
        [
            "KV.PREFIX.LOOKUP, 50 clients, -P 16 (req/s)",
            look.get("pion_lookup_rps_P16"),
            look.get("redis_get_rps_P16"),
            ratio(look.get("ratio_P16", 0.0)),
        ],
        [
            "MEMBERSHIP K=N=1,562 p50 (µs)",
            mem.get("p50_us"),
            mem.get("redis_get_12k_p50_us"),
            ratio(mem["redis_get_12k_p50_us"] / mem["p50_us"]) if mem else "",
        ],
        [
            "MEMBERSHIP K=N=1,562 p99 (µs)",
            mem.get("p99_us"),
            mem.get("redis_get_12k_p99_us"),
            ratio(mem["redis_get_12k_p99_us"] / mem["p99_us"]) if mem else "",
        ],
        [
            "PING p50 (µs): the loopback floor",
            mem.get("pion_ping_p50_us"),
            mem.get("redis_ping_p50_us"),
            "",
        ],
    ]
    for p in (1, 16):
        # The server's CPU time per request (results from before it was measured lack it).
        if f"pion_lookup_cpu_us_P{p}" in look:
            pion_us, redis_us = look[f"pion_lookup_cpu_us_P{p}"], look[f"redis_get_cpu_us_P{p}"]
            rows.append(
                [
                    f"KV.PREFIX.LOOKUP{', -P 16' if p == 16 else ''}: server CPU (µs/req)",
                    pion_us,
                    redis_us,
                    ratio(redis_us / pion_us),
                ]
            )
    losses = []
    for key, label in (("ratio_P1", "LOOKUP unpipelined"), ("ratio_P16", "LOOKUP at -P 16")):
        if look.get(key, 1.0) < 1.0:
            losses.append(f"{label} at {ratio(look[key])} of redis-server's GET")
    if mem and mem["p50_us"] > mem["redis_get_12k_p50_us"]:
        losses.append(
            f"MEMBERSHIP p50 {mem['p50_us']:.0f} µs against {mem['redis_get_12k_p50_us']:.0f} µs "
            f"(p99 {mem['p99_us']:.0f} against {mem['redis_get_12k_p99_us']:.0f})"
        )
    decoder = results.get("decoder")
    if decoder:
        for name, part in decoder.items():
            if isinstance(part, dict) and "ratio" in part:
                rows.append(
                    [
                        f"request decoder, {name} (commands/s)",
                        part["pion_cmds_per_s"],
                        part["hiredis_cmds_per_s"],
                        ratio(part["ratio"]),
                    ]
                )
                if part["ratio"] < 1.0:
                    losses.append(
                        f"the request decoder at {ratio(part['ratio'])} of hiredis on {name}"
                    )
    fig, axes = figure(ncols=2)
    ax = axes[0]
    if "cdf_pion_us" in mem:
        qs = [q / 100 for q in mem["cdf_quantiles"]]
        ax.plot(mem["cdf_pion_us"], qs, marker=".", label="pion KV.PREFIX.MEMBERSHIP")
        ax.plot(mem["cdf_redis_us"], qs, marker=".", label="redis-server GET, 12.5 KB")
        ax.set_xscale("log")
        ax.set_xlabel("latency (µs, log)")
        ax.set_ylabel("fraction of calls")
        ax.legend(fontsize=8)
        ax.set_title("MEMBERSHIP latency CDF, K = N = 1,562")
    elif mem:
        bars(
            ax,
            ["p50", "p99"],
            {
                "pion": [mem["p50_us"], mem["p99_us"]],
                "redis GET": [mem["redis_get_12k_p50_us"], mem["redis_get_12k_p99_us"]],
            },
        )
        ax.set_ylabel("µs")
        ax.set_title("MEMBERSHIP latency (rerun bench/registry.py for the CDF)")
    ax = axes[1]
    labels = ["LOOKUP", "LOOKUP -P 16"]
    bars(
        ax,
        labels,
        {
            "pion": [look.get("pion_lookup_rps_P1", 0), look.get("pion_lookup_rps_P16", 0)],
            "redis-server GET": [look.get("redis_get_rps_P1", 0), look.get("redis_get_rps_P16", 0)],
        },
    )
    ax.set_ylabel("requests/s (redis-benchmark)")
    ax.set_title("Small-command throughput")
    return Section(
        title="How fast are small commands, against redis-server?",
        intro=(
            "`KV.PREFIX.LOOKUP` driven by `redis-benchmark` (50 clients, unpipelined and "
            "`-P 16`) against redis-server `GET` in the same run; `KV.PREFIX.MEMBERSHIP` "
            "of 1,562 probes against a 1,562-hash table (100k tokens at block size 64), "
            "end to end through redis-py with hiredis, against redis-server `GET` of a "
            "value the request's size (12.5 KB); and the request decoder alone against "
            "hiredis's parser. The last column is pion's speed as a fraction of the "
            "baseline's (latencies inverted), so 1.00x is parity."
        ),
        headers=["measure", "pion", "redis-server / hiredis", "pion x baseline"],
        rows=rows,
        losses=(f"{_join(losses)}." if losses else ""),
        command="python bench/registry.py && python bench/decoder.py",
        figure=fig,
    )


# -- 9. the plain keyspace ---------------------------------------------------------------


def keyspace(results: Mapping[str, Result]) -> Section:
    data = results["keyspace"]
    rows, labels, with_log, no_wal, losses = [], [], [], [], []
    # The server CPU columns, where the results have them (measured since issue 31).
    with_cpu = any("cpu_us_per_request" in r for r in data.get("results", []))
    for r in data.get("results", []):
        m = r["median"]
        base = m["redis"]
        labels.append(r["case"])
        with_log.append(m["pion"] / base)
        no_wal.append(m["pion-nowal"] / base)
        row = [
            r["case"],
            r["unit"],
            m["pion"],
            m["pion-nowal"],
            base,
            m["redis-aof"],
            ratio(m["pion"] / base),
            ratio(m["pion"] / m["redis-aof"]),
        ]
        if with_cpu:
            cpu = r.get("cpu_us_per_request", {})
            row += [cpu.get("pion-nowal", ""), cpu.get("redis", "")]
        rows.append(row)
        if m["pion-nowal"] < base:
            losses.append(f"{r['case']} {ratio(m['pion-nowal'] / base)}")
    fig, (ax,) = figure(width=9)
    bars(ax, labels, {"pion (log everysec)": with_log, "pion --no-wal": no_wal})
    parity(ax)
    ax.set_ylabel("x redis-server without persistence")
    ax.set_title("Plain keyspace: strings through redis-benchmark and LMCache-shaped chunks")
    return Section(
        title="How fast is the plain keyspace (PrefixStore, LMCache) against redis-server?",
        intro=(
            "`SET`/`GET` of 256 B to 8 MB values through `redis-benchmark` (unpipelined and "
            "`-P 16`) and LMCache-shaped 4 MB chunks over 8 connections, against "
            "redis-server without persistence and with an `everysec` AOF, medians of "
            f"{data.get('rounds', '?')} rounds. Pion runs with its log (`everysec`) and with "
            "`--no-wal`."
            + (
                " The CPU columns are each server's CPU time (user + system) per request: on "
                "a shared machine rates follow each process's share of the CPU, CPU time is "
                "what the server spends."
                if with_cpu
                else ""
            )
        ),
        headers=[
            "case",
            "unit",
            "pion",
            "pion --no-wal",
            "redis",
            "redis AOF",
            "pion x redis",
            "pion x AOF",
            *(["--no-wal CPU µs/req", "redis CPU µs/req"] if with_cpu else []),
        ],
        rows=rows,
        losses=(
            "Even without its log, the keyspace is slower than redis-server for "
            f"{_join(losses)}; with the log, writes are bound by the disk."
            if losses
            else ""
        ),
        command="python bench/keyspace.py",
        figure=fig,
    )


# -- 11. eviction cost ---------------------------------------------------------------------


def vstore_eviction(results: Mapping[str, Result]) -> Section:
    data = results["vstore_eviction"]
    this, base = data.get("this", {}), data.get("baseline", {})
    rows = []
    for key, part in this.items():
        if isinstance(part, dict) and "per_victim_us" in part:
            old = base.get(key, {})
            rows.append(
                [
                    key,
                    part.get("sessions", ""),
                    part["per_victim_us"],
                    old.get("per_victim_us", ""),
                    ratio(old["per_victim_us"] / part["per_victim_us"])
                    if old.get("per_victim_us")
                    else "",
                ]
            )
    speed = data.get("speedup", {})
    fig, (ax,) = figure(width=7)
    bars(ax, list(speed), {"x faster than the previous code": list(speed.values())})
    ax.set_yscale("log")
    ax.set_title("LRU eviction, this code against the previous (same run)")
    return Section(
        title="What does LRU eviction cost?",
        intro=(
            "Creating a session at the session limit (which evicts the least recently used "
            "namespace) and lowering the limit at once, against the previous eviction code "
            "run in the same process."
        ),
        headers=["case", "sessions", "µs per victim", "previous code µs", "x faster"],
        rows=rows,
        extra_tables=[("Speed-ups:", ["case", "x"], [[k, ratio(v)] for k, v in speed.items()])],
        losses="",
        command="python bench/vstore_eviction.py",
        figure=fig,
    )


def workers(results: Mapping[str, Result]) -> Section:
    data = results["workers"]
    rps, ratios = data.get("rps", {}), data.get("ratios", {})
    cases = list(ratios)
    redis_rps = rps.get("redis-server", {})
    w1, w2 = rps.get("pion -w 1", {}), rps.get("pion -w 2", {})
    rows = [
        [
            case,
            w1.get(case),
            w2.get(case),
            redis_rps.get(case),
            ratio(r["w1_vs_redis"]),
            ratio(r["w2_vs_redis"]),
            ratio(r["w2_vs_w1"]),
        ]
        for case, r in ratios.items()
    ]
    fig, (ax,) = figure(width=7)
    bars(
        ax,
        cases,
        {
            "pion -w 1": [ratios[c]["w1_vs_redis"] for c in cases],
            "pion -w 2": [ratios[c]["w2_vs_redis"] for c in cases],
        },
    )
    parity(ax)
    ax.set_ylabel("x redis-server (one process)")
    ax.set_title("Throughput with one and two workers")
    slow = [f"{c} {ratio(ratios[c]['w2_vs_redis'])}" for c in cases if ratios[c]["w2_vs_redis"] < 1]
    return Section(
        title="What do more workers buy?",
        intro=(
            "`redis-benchmark` against `pion-server -w 1` and `-w 2 --independent-workers` "
            "(namespaces spread over both, the cross-worker directory answering LOOKUP), "
            f"against one redis-server; medians of {data.get('rounds', '?')} rounds of "
            f"{data.get('requests', '?')} requests on this 2-core machine."
        ),
        headers=[
            "case",
            "-w 1 req/s",
            "-w 2 req/s",
            "redis req/s",
            "-w 1 x redis",
            "-w 2 x redis",
            "-w 2 x -w 1",
        ],
        rows=rows,
        losses=(
            f"With two workers, still below one redis-server process for {_join(slow)}."
            if slow
            else ""
        ),
        command="python bench/workers.py",
        figure=fig,
    )
