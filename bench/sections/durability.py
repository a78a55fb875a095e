"""Sections on durability and memory: recovery and fsync policies, what a client can
make the server hold, the cluster tier."""

from __future__ import annotations

from collections.abc import Mapping

from sections._base import Result, Section, bars, figure, ratio
from sections._text import join as _join

# -- 4. durability: recovery speed and fsync policies ----------------------------------


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


# -- 7. memory under hostile clients ---------------------------------------------------


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


# -- 10. the cluster tier -----------------------------------------------------------------


def tier(results: Mapping[str, Result]) -> Section:
    data = results["tier"]
    prefix = data.get("prefix", {})
    lanes = [
        ("fill from the tier (node B)", data["tier_fill_s"], data["tier_fill_mib_s"]),
        ("redis-py GET of the same bytes", data["redis_get_s"], data["redis_get_mib_s"]),
        (
            "redis-py GET, the tier's key layout",
            data["redis_get_tier_layout_s"],
            data["redis_get_tier_layout_mib_s"],
        ),
        ("a local hit (node B)", data["local_hit_s"], data["local_hit_mib_s"]),
    ]
    rows = [[name, seconds * 1000, mib] for name, seconds, mib in lanes]
    rows.append(["store, sync tier", data["store_with_sync_tier_s"] * 1000, ""])
    rows.append(["store, no tier", data["store_without_tier_s"] * 1000, ""])
    fig, (ax,) = figure(width=7)
    bars(ax, [n for n, _, _ in lanes], {"MiB/s": [m for _, _, m in lanes]})
    ax.set_ylabel("MiB/s (higher is better)")
    ax.set_title("Fetching a prefix only the cluster tier holds")
    losses = []
    if data["ratio_fill_vs_get_throughput"] < 1.0:
        losses.append(
            f"a fill from the tier runs at {ratio(data['ratio_fill_vs_get_throughput'])} of "
            "redis-py GET of the same bytes from the same cluster "
            f"({ratio(data['ratio_fill_vs_get_tier_layout_throughput'])} of GET in the "
            "tier's layout)"
        )
    losses.append(
        f"a sync tier makes a store take {ratio(data['ratio_store_sync_tier_vs_none_time'])} "
        "the time of one without it"
    )
    return Section(
        title="How fast is a fetch from the cluster tier?",
        intro=(
            f"A {prefix.get('layers', '?')}-layer x {prefix.get('tokens', '?')}-token x "
            f"{prefix.get('dim', '?')} {prefix.get('format', '?')} prefix (K and V) stored on "
            "node A and fetched on node B, which fills it from the shared tier (a 3-node "
            "Redis Cluster), against redis-py `GET` of the same bytes from the same cluster "
            f"and a local hit; medians of {data.get('repeat', '?')}."
        ),
        headers=["lane", "ms", "MiB/s"],
        rows=rows,
        losses=_join(losses) + ".",
        command="python bench/tier.py",
        figure=fig,
    )
