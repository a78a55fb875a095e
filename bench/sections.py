"""The sections of BENCHMARKS.md: one renderer per question a user asks, each reading
the JSON result(s) of the benchmark(s) that answer it (see ``report.py``).

A renderer returns a :class:`report.Section`: a table, a matplotlib figure, and a
``losses`` paragraph computed from the figures themselves (a ratio below the baseline
is named with its value, never hidden). Add one with ``@renderer("<result name>")``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from report import Result, Section, bars, figure, fmt, parity, ratio, renderer


def _join(items: list[str]) -> str:
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


# -- 1. bulk K/V throughput per format ------------------------------------------------


@renderer("vstore_throughput")
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
        rows.append(
            [
                name,
                row["store_mb_s"],
                ratio(row["store_x_redis"]),
                row["fetch_mb_s"],
                ratio(row["fetch_x_redis"]),
                ratio(cost),
            ]
        )
        if row["store_x_redis"] < 1.0:
            slow_store.append(f"{name} {ratio(row['store_x_redis'])}")
        if row["fetch_x_redis"] < 1.0:
            slow_fetch.append(f"{name} {ratio(row['fetch_x_redis'])}")
        if cost > 1.3:
            heavy.append(f"{name} {ratio(cost)}")
    losses = []
    if slow_store:
        losses.append(f"store is slower than redis-server's SET for {_join(slow_store)}")
    if slow_fetch:
        losses.append(f"fetch is slower than GET for {_join(slow_fetch)}")
    if heavy:
        losses.append(
            f"the server's peak memory, less its idle interpreter, passes 1.3x the stored "
            f"bytes for {_join(heavy)}"
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
            "the bytes it stores."
        ),
        headers=[
            "format",
            "store MB/s",
            "store x redis",
            "fetch MB/s",
            "fetch x redis",
            "(peak - idle) / stored",
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


@renderer("registry", "decoder")
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


# -- 3. fidelity per format ----------------------------------------------------------


@renderer("fidelity")
def fidelity(results: Mapping[str, Result]) -> Section:
    data = results["fidelity"]
    rows, labels, dist, mse, losses = [], [], [], [], []
    for row in data.get("rows", []):
        name = row["vquant"]
        labels.append(name)
        dist.append(max(1e-9, 1.0 - row["logit_cosine_min"]))
        mse.append(max(row["k_rel_mse"], row["v_rel_mse"]))
        rows.append(
            [
                name,
                row["k_rel_mse"],
                row["v_rel_mse"],
                f"{row['logit_cosine_mean']:.7f}",
                f"{row['logit_cosine_min']:.7f}",
                f"{row['greedy_agreement']:.3f}",
                row["argmax_held"],
                row["restore_ms"],
                ratio(row["speedup"]),
            ]
        )
        if row["greedy_agreement"] < 1.0 or not row["argmax_held"]:
            losses.append(
                f"{name} changes the generated tokens "
                f"(greedy agreement {row['greedy_agreement']:.3f})"
            )
        if row["speedup"] < 1.0:
            losses.append(
                f"{name} restores slower than the prefill it replaces ({ratio(row['speedup'])})"
            )
    fig, axes = figure(ncols=2)
    bars(axes[0], labels, {"1 - min logit cosine": dist})
    axes[0].set_yscale("log")
    axes[0].set_title("Next-token logits after a restore (lower is better)")
    bars(axes[1], labels, {"max(K, V) relative MSE": mse})
    axes[1].set_yscale("log")
    axes[1].set_title("Stored K/V error (lower is better)")
    model = data.get("model", {})
    worst = max(data.get("rows", []), key=lambda r: 1 - r["logit_cosine_min"], default=None)
    return Section(
        title="How faithful is each storage format?",
        intro=(
            f"A random-weight Llama ({model.get('num_hidden_layers', '?')} layers, hidden "
            f"{model.get('hidden_size', '?')}) prefills {data.get('prompts', '?')} prompts of "
            f"{data.get('prefix_tokens', '?')} tokens; the K/V are stored in each format, "
            "restored, and generation continues from them. Relative MSE of the stored K and "
            "V, cosine of the next-token logits against the unquantized cache, agreement of "
            f"{data.get('new_tokens', '?')} greedy tokens, and the time to restore a "
            f"{data.get('timing_prefix_tokens', '?')}-token prefix against prefilling it."
        ),
        headers=[
            "format",
            "K rel MSE",
            "V rel MSE",
            "logit cos mean",
            "logit cos min",
            "greedy agree",
            "argmax held",
            "restore ms",
            "x prefill",
        ],
        rows=rows,
        losses=(
            f"{_join(losses)}."
            if losses
            else "No format changed a generated token here; the cost is in the logits: "
            + (
                f"{worst['vquant']}'s cosine falls to {worst['logit_cosine_min']:.5f}. "
                if worst
                else ""
            )
            + "A random tiny model is kinder than a real one: turbo formats for K are "
            "known to hurt perplexity on some models (docs/client.md)."
        ),
        command="python bench/fidelity.py",
        figure=fig,
    )


# -- 4. durability: recovery speed and fsync policies ----------------------------------


@renderer("persistence")
def persistence(results: Mapping[str, Result]) -> Section:
    data = results["persistence"]
    rec = data.get("recovery", {})
    rows = []
    for kind in ("snapshot", "log"):
        part = rec.get(kind)
        if part:
            rows.append(
                [
                    f"load the {kind}",
                    part["read_gb_s"],
                    part["fresh_read_gb_s"],
                    part["load_gb_s"],
                    ratio(part["load_over_fresh_read"]),
                ]
            )
    policy_rows, losses = [], []
    by_batch: dict[str, dict[str, float]] = {}
    for row in data.get("storebatch", []):
        policy_rows.append([row["batch"], row["policy"], row["mb_s"], ratio(row["over_no_wal"])])
        by_batch.setdefault(row["batch"], {})[row["policy"]] = row["over_no_wal"]
        if row["policy"] != "--no-wal" and row["over_no_wal"] < 0.8:
            losses.append(
                f"`--appendfsync {row['policy']}` at {ratio(row['over_no_wal'])} of "
                f"`--no-wal` with {row['batch']} batches"
            )
    for row in rows:
        if float(row[4][:-1]) < 1.0:
            losses.append(f"{row[0]} runs at {row[4]} of a plain read into fresh memory")
    fig, axes = figure(ncols=2)
    policies = ["--no-wal", "always", "everysec", "no"]
    batches = list(by_batch)
    bars(axes[0], policies, {b: [by_batch[b].get(p, 0.0) for p in policies] for b in batches})
    axes[0].set_ylabel("x --no-wal throughput")
    axes[0].set_title("V.STOREBATCH under each fsync policy")
    if rows:
        bars(
            axes[1],
            [r[0] for r in rows],
            {
                "plain read (cached)": [r[1] for r in rows],
                "read into fresh memory": [r[2] for r in rows],
                "our load": [r[3] for r in rows],
            },
        )
        axes[1].set_ylabel("GB/s")
        axes[1].set_title("Recovery against reading the same file")
    config = data.get("config", {})
    return Section(
        title="How fast is recovery, and what does each fsync policy cost?",
        intro=(
            f"Recovery: a store of {config.get('layers', '?')} x {config.get('tokens', '?')} x "
            f"{config.get('dim', '?')} fp16 rows written through the write-ahead log and "
            "snapshotted, then loaded into an empty store, against a plain sequential read "
            "of the same file (page cache warm) and a read into freshly allocated memory "
            "(the floor for any loader whose data must land in new pages). Throughput: "
            "`V.STOREBATCH ... FMT F16` under each `--appendfsync` policy against "
            "`--no-wal`, same client, same run."
        ),
        headers=["recovery", "read GB/s", "read+alloc GB/s", "load GB/s", "load x read+alloc"],
        rows=rows,
        extra_tables=[
            ("Write throughput per policy:", ["batch", "policy", "MB/s", "x --no-wal"], policy_rows)
        ],
        losses=(
            f"{_join(losses)}. Every acknowledged write is in the log before its reply; "
            "`always` also waits for the fsync (grouped per loop iteration)."
            if losses
            else ""
        ),
        command="python bench/persistence.py",
        figure=fig,
    )


# -- 5. pion llama: session start ---------------------------------------------------------


@renderer("llama_prefix")
def llama(results: Mapping[str, Result]) -> Section:
    data = results["llama_prefix"]
    scen = data.get("scenarios", {})
    rows, labels, medians = [], [], []
    for key, s in scen.items():
        labels.append(key)
        medians.append(s["median_s"] * 1000)
        rows.append(
            [
                s["label"],
                s["median_s"] * 1000,
                s["min_s"] * 1000,
                ratio(s["ratio_to_cold"]),
                s["cache_n"][-1] if s.get("cache_n") else "",
            ]
        )
    fig, (ax,) = figure(width=7)
    bars(ax, labels, {"median time to first token (ms)": medians})
    ax.set_yscale("log")
    ax.set_ylabel("ms (log)")
    ax.set_title("Session start through pion llama proxy")
    losses = []
    c = scen.get("c")
    if c and c["ratio_to_cold"] > data.get("target_c_over_a", 0.1):
        losses.append(
            f"a restore from disk took {ratio(c['ratio_to_cold'])} of a cold start, above the "
            f"{data.get('target_c_over_a', 0.1)}x target"
        )
    a1 = scen.get("a'")
    if a1 and a1["ratio_to_cold"] > 1.0:
        losses.append(
            f"the first, cold session through the proxy costs {ratio(a1['ratio_to_cold'])} "
            "of a direct cold start (warm-up + save)"
        )
    losses.append(
        "*peers* (a session start on another machine, from slot files shared through a "
        "pion-server) is not measured: this build of `pion llama` has no shared store yet"
    )
    model = data.get("model", {})
    return Section(
        title="How fast does pion llama start a session: cold, hot, restored?",
        intro=(
            "Time to first token of a Pi-shaped session start "
            f"({data.get('prefix_tokens', '?')}-token prefix, a {model.get('layers', '?')}-layer "
            f"width-{model.get('width', '?')} model) on a "
            "real llama-server: (a) cold without pion; (a') the first session through the "
            "proxy (warm-up and save); (b) the next session in the same proxy; (c) after a "
            "llama-server restart, restored from the slot file and verified by the request "
            "itself; (c') the same with the two explicit probes. Medians of "
            f"{data.get('reps', '?')} reps."
        ),
        headers=["scenario", "median ms", "min ms", "x cold", "cache_n"],
        rows=rows,
        losses=_join(losses) + ".",
        command="python bench/llama_prefix.py",
        figure=fig,
    )


# -- 6. same-machine fetch: V.EXPORT ------------------------------------------------------


@renderer("export_fetch")
def export_fetch(results: Mapping[str, Result]) -> Section:
    data = results["export_fetch"]
    tcp = data["tcp_s"]
    lanes = [
        ("PionPromptCache.fetch over TCP", tcp),
        ("PionPromptCache.fetch, export file reused", data["export_reused_s"]),
        ("PionPromptCache.fetch, export file written in the call", data["export_first_s"]),
    ]
    if "pion_client_tcp_s" in data:
        lanes += [
            ("pion-vllm-mlx over TCP (fp16, no conversion)", data["pion_client_tcp_s"]),
            ("pion-vllm-mlx export lane (mx.load)", data["pion_client_export_s"]),
        ]
    rows = [[name, seconds * 1000, ratio(tcp / seconds)] for name, seconds in lanes]
    fig, (ax,) = figure(width=7)
    bars(
        ax,
        [f"{n[:28]}…" if len(n) > 28 else n for n, _ in lanes],
        {"ms": [s * 1000 for _, s in lanes]},
    )
    ax.set_ylabel("ms (lower is better)")
    ax.set_title(f"Fetch of {data.get('payload_mb', 0):.0f} MB of fp16 K/V on one machine")
    losses = []
    if data["speedup_first"] < 1.5:
        losses.append(
            "the first fetch after a write writes the file within the call "
            f"({ratio(data['speedup_first'])} of TCP's speed)"
        )
    if "pion_client_tcp_s" in data and data["pion_client_tcp_s"] < tcp:
        losses.append(
            f"our client's TCP lane ({tcp * 1000:.0f} ms) is slower than Pion's own client's "
            f"({data['pion_client_tcp_s'] * 1000:.0f} ms): ours returns fp32 (the fp16 to fp32 "
            "widening is most of both of our lanes' time), Pion's hands fp16 to MLX"
        )
    return Section(
        title="How fast is a same-machine fetch through V.EXPORT?",
        intro=(
            f"A {data.get('layers', '?')}-layer x {data.get('tokens', '?')}-token x "
            f"kv_dim {data.get('kv_dim', '?')} fp16 prefix fetched by `PionPromptCache.fetch` "
            "(fp32 `[N, kv_dim]` per layer out) from a pion-server on the same machine: "
            "over the socket, and through the export lane (`V.EXPORT` writes the prefix "
            "once as a safetensors file, the client maps it). Both lanes return equal "
            "arrays (checked in the run). Pion publishes 37 ms against 67 ms (1.8x) for "
            "its export lane at 2,049 tokens; the target here is 1.5x."
        ),
        headers=["lane", "ms", "x our TCP lane"],
        rows=rows,
        losses=(f"{_join(losses)}." if losses else ""),
        command="python bench/export_fetch.py --pion-client",
        figure=fig,
    )


# -- 7. memory under hostile clients ---------------------------------------------------


@renderer("client_memory")
def client_memory(results: Mapping[str, Result]) -> Section:
    data = results["client_memory"]
    pion, red = data.get("pion-server", {}), data.get("redis-server", {})
    labels = {
        "non_reader_peak_mib": "peak MiB, a client that never reads",
        "reader_peak_mib": "peak MiB, a client that reads",
        "reader_seconds": "seconds, the reading client",
        "unauth_peak_mib": "peak MiB, an unauthenticated flood",
    }
    rows = [
        [text, pion.get(k), red.get(k), ratio(pion[k] / red[k]) if red.get(k) else ""]
        for k, text in labels.items()
        if k in pion
    ]
    fig, (ax,) = figure(width=7)
    keys = [k for k in labels if k.endswith("mib") and k in pion]
    bars(
        ax,
        [labels[k].split(", ")[1] for k in keys],
        {"pion-server": [pion[k] for k in keys], "redis-server": [red.get(k, 0) for k in keys]},
    )
    ax.set_ylabel("peak MiB of the server")
    ax.set_title("Server memory under pipelined fetches")
    losses = []
    if red.get("reader_seconds") and pion.get("reader_seconds", 0) > red["reader_seconds"]:
        losses.append(
            f"the reading client is served in {pion['reader_seconds']:.2f} s against "
            f"redis-server's {red['reader_seconds']:.2f} s"
        )
    return Section(
        title="How much memory can a client make the server hold?",
        intro=(
            f"A client pipelines {data.get('depth', '?')} fetches of large values "
            f"({data.get('push_mib', '?')} MiB requested in all) and either reads the replies "
            "or never does; another floods unauthenticated bytes. The figure is the server "
            "process's peak memory, against redis-server serving the same bytes."
        ),
        headers=["measure", "pion-server", "redis-server", "pion / redis"],
        rows=rows,
        losses=(f"{_join(losses)}." if losses else ""),
        command="python bench/client_memory.py",
        figure=fig,
    )


# -- 8. the attention tier ---------------------------------------------------------------


@renderer("attend")
def attend(results: Mapping[str, Result]) -> Section:
    data = results["attend"]
    rows, labels, series, losses = [], [], {"local numpy": [], "binary lane": [], "RESP": []}, []
    for q in data.get("query_fused", []):
        label = f"D={q['d']} M={q['m']}"
        labels.append(label)
        for key, name in (("local", "local numpy"), ("binary", "binary lane"), ("resp", "RESP")):
            series[name].append(q[key]["p50_us"] / 1000)
        floor = q["binary_vs_floor_plus_rtt"]
        rows.append(
            [
                f"QUERY_FUSED {label}",
                q["local"]["p50_us"] / 1000,
                q["binary"]["p50_us"] / 1000,
                q["resp"]["p50_us"] / 1000,
                ratio(floor),
            ]
        )
        if q["m"] == 1 and floor > 1.5:
            losses.append(
                f"QUERY_FUSED {label} over the binary lane takes {ratio(floor)} of (local "
                "attention + one round trip), above the 1.5x target"
            )
    warm = data.get("warm")
    extra = []
    if warm:
        extra.append(
            (
                f"`KV.PREFIX.WARM` of {warm['layers']} layers x {warm['tokens']} tokens x "
                f"kv_dim {warm['kv_dim']} ({warm['format']}):",
                ["server ms", "same conversion locally, ms", "x local", "Pion's published ms"],
                [
                    [
                        warm["server_ms"],
                        warm["local_numpy_ms"],
                        ratio(warm["server_vs_local"]),
                        "-".join(f"{v:.0f}" for v in warm.get("pion_published_ms", [])),
                    ]
                ],
            )
        )
        low = warm.get("pion_published_ms", [0])[0]
        if low and warm["server_ms"] > warm["pion_published_ms"][-1]:
            losses.append(
                f"WARM takes {warm['server_ms']:.0f} ms against Pion's published "
                f"{low:.0f}-{warm['pion_published_ms'][-1]:.0f} ms (Apple Silicon); the same "
                f"conversion done locally takes {warm['local_numpy_ms']:.0f} ms here"
            )
    fig, (ax,) = figure(width=7)
    bars(ax, labels, series)
    ax.set_yscale("log")
    ax.set_ylabel("p50 ms (log)")
    ax.set_title("ATTEND.PREFIX.QUERY_FUSED over a cached prefix")
    prefix = data.get("prefix", {})
    return Section(
        title="How fast is attention on the server (the attention tier)?",
        intro=(
            "`ATTEND.PREFIX.QUERY_FUSED` over a "
            f"{prefix.get('tokens', '?')}-token cached prefix (H_kv {prefix.get('h_kv', '?')}, "
            f"H_q {prefix.get('h_q', '?')}) through Pion's own client, over the binary lane "
            "and over RESP, against the same attention computed locally with numpy in the "
            "client (no server at all) plus one loopback round trip. Medians of "
            f"{data.get('calls', '?')} interleaved calls."
        ),
        headers=["query", "local p50 ms", "binary p50 ms", "RESP p50 ms", "binary x (local + RTT)"],
        rows=rows,
        extra_tables=extra,
        losses=(f"{_join(losses)}." if losses else ""),
        command="python bench/attend.py",
        figure=fig,
    )


__all__ = [
    "client_memory",
    "export_fetch",
    "fidelity",
    "llama",
    "persistence",
    "small_commands",
    "throughput",
]
_ = fmt  # re-exported helper for renderers added later
