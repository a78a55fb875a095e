"""The section on the proxy's own status page under load (``bench/llama_status.py``):
``GET /pion/status`` latency while the proxy holds hundreds of requests on one slot,
against the same requests to the idle proxy."""

from __future__ import annotations

from collections.abc import Mapping

from sections._base import Result, Section, bars, figure, load_average


def llama_status(results: Mapping[str, Result]) -> Section:
    data = results["llama_status"]
    n = data.get("requests", 0)
    phases = {"idle proxy": data["idle"], f"{n} requests held": data["under_load"]}
    rows = [
        [name, s["n"], f"{s['p50_ms']:.1f}", f"{s['p99_ms']:.1f}", f"{s['max_ms']:.1f}"]
        for name, s in phases.items()
    ]
    target = data.get("target_ms", 100.0)
    losses = []
    under = data["under_load"]
    if under["max_ms"] > target:
        losses.append(
            f"under load the slowest status answer took {under['max_ms']:.0f} ms (p99 "
            f"{under['p99_ms']:.0f} ms, p50 {under['p50_ms']:.0f} ms) against the {target:.0f} ms "
            f"target; idle, its max was {data['idle']['max_ms']:.0f} ms. The status is "
            "answered by the proxy's front door, a thread of its own, off the event loop "
            "that parses and leases the requests; that thread still needs Python's GIL "
            "and a CPU of this shared 2-core machine (load average "
            f"{load_average(data)})"
        )
    if data.get("answered_200", n) < n:
        losses.append(f"{n - data['answered_200']} of the {n} requests did not answer 200")
    fig, (ax,) = figure(width=5.2)
    bars(
        ax,
        list(phases),
        {p: [s[f"{p}_ms"] for s in phases.values()] for p in ("p50", "p99", "max")},
    )
    ax.axhline(target, color="black", linewidth=0.8, linestyle="--", label="target")
    ax.set_ylabel("ms")
    ax.set_title("GET /pion/status while the proxy holds requests")
    return Section(
        title="Does pion llama's status page stay fast under load?",
        intro=(
            f"`pion llama proxy --persist` in front of a real llama-server with one slot "
            f"(`-np 1`, a tiny generated model); {n} Pi-shaped chat requests sent at once, so "
            "all but one wait on the slot's lease while a client in another process asks "
            "`/pion/status` every 20 ms, one request at a time (in the process sending the "
            "burst, its own event loop's wait would be counted as the proxy's). Baseline: "
            "the same status "
            f"requests to the idle proxy before. All {n} requests took "
            f"{data.get('load_seconds', 0.0):.1f} s, {data.get('answered_200', 0)} answered "
            f"200 ({data.get('lease_waits', 0)} waited for the lease, "
            f"{data.get('lease_timeouts', 0)} waited past `--lease-wait` "
            f"{data.get('lease_wait_s', 30):g} s and went through unwarmed). The proxy "
            "answers `/pion/status` in its front door's thread, off the event loop that "
            f"holds the requests. Load average {load_average(data)}. Target: every "
            f"status answer within {target:.0f} ms."
        ),
        headers=["phase", "status requests", "p50 ms", "p99 ms", "max ms"],
        rows=rows,
        losses=(f"{'; '.join(losses)}." if losses else ""),
        command="python bench/llama_status.py",
        figure=fig,
    )
