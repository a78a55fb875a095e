"""The section on several llama-servers behind one proxy (``bench/fleet.py``): harness-shaped
sessions routed by `pion llama proxy` against round robin, least loaded and an oracle
(tokens reused, prefill seconds, TTFT), and a server killed mid-replay (failover time)."""

from __future__ import annotations

from collections.abc import Mapping

from sections._base import Result, Section, bars, figure, load_average, ratio

NAMES = {"pi": "Pi", "claude": "Claude Code", "codex": "Codex"}
ROUTERS = {
    "pion": "pion llama proxy",
    "round_robin": "round robin",
    "least_loaded": "least loaded",
    "oracle": "oracle",
}


def _pct(value: float) -> str:
    return f"{value:.1%}"


def _row(label: str, run: Result) -> list[str]:
    return [
        label, _pct(run["reuse"]), f"{run['reused_tokens']:,} of {run['prompt_tokens']:,}",
        _pct(run.get("reported_reuse", run["reuse"])), f"{run['prefill_s']:.2f}",
        f"{run['ttft_p50_s']:.3f}", f"{run['ttft_p95_s']:.3f}", str(run["errors"]),
        str(run.get("retries", 0)), f"{run['seconds']:.1f}",
    ]  # fmt: skip


def _losses(data: Result) -> list[str]:
    """Every missed target, with its figure; failed requests."""
    targets, figures = data.get("targets", {}), data.get("figures", {})
    runs, killed = data.get("runs", {}), data.get("pion_killed", {})
    out = []
    floor = targets.get("reuse_over_oracle", 0.95)
    if figures.get("reuse_over_oracle", 0.0) < floor:
        out.append(
            f"pion reused {runs['pion']['reused_tokens']:,} tokens against the oracle's "
            f"{runs['oracle']['reused_tokens']:,} ({figures['reuse_over_oracle']:.2%}, "
            f"target >= {_pct(floor)})"
        )
    ceiling = targets.get("ttft_p50_over_round_robin", 0.3)
    if figures.get("ttft_p50_over_round_robin", 0.0) > ceiling:
        out.append(
            f"pion's TTFT p50 was {runs['pion']['ttft_p50_s']:.3f} s against round robin's "
            f"{runs['round_robin']['ttft_p50_s']:.3f} s "
            f"({ratio(figures['ttft_p50_over_round_robin'])}, target <= {ratio(ceiling)})"
        )
    limit = targets.get("failover_s", 5.0)
    if figures.get("failover_s", 0.0) > limit:
        out.append(
            f"after a server was killed its sessions waited up to "
            f"{figures['failover_s']:.2f} s for an answer (target <= {limit:g} s)"
        )
    for name, run in {**runs, "pion_killed": killed}.items():
        if run.get("errors"):
            out.append(f"{ROUTERS.get(name, name)}: {run['errors']} requests never answered")
    return out


def _per_harness(runs: Mapping[str, Result]) -> list[list[str]]:
    """Reuse as the answers report it (``cache_n``), per harness and router."""
    harnesses = dict.fromkeys(r["harness"] for run in runs.values() for r in run["requests"])
    rows = []
    for harness in harnesses:
        cells = []
        for run in runs.values():
            mine = [r for r in run["requests"] if r["harness"] == harness and r.get("prompt")]
            prompt = sum(r["prompt"] for r in mine)
            cells.append(_pct(sum(r.get("cache_n") or 0 for r in mine) / prompt) if prompt else "")
        rows.append([NAMES.get(harness, harness), *cells])
    return rows


def _ttft_parts(runs: Mapping[str, Result]) -> list[list[str]]:
    """What bounds TTFT: the answered requests' own prefill (llama-server's
    ``prompt_ms``) against all prefill (warm-ups and restores included), and the TTFT
    left once a request's own prefill is taken out (waiting: for a slot, a warm-up, the
    other requests on the server)."""
    rows = []
    for name, run in runs.items():
        done = [r for r in run["requests"] if r.get("ttft_s") is not None]
        own = [(r.get("prompt_ms") or 0.0) / 1000 for r in done]
        rest = sorted(r["ttft_s"] - o for r, o in zip(done, own, strict=True))
        median = rest[len(rest) // 2] if rest else 0.0
        rows.append([
            ROUTERS.get(name, name), f"{sum(own):.2f}", f"{run['prefill_s'] - sum(own):.2f}",
            f"{run['ttft_p50_s']:.3f}", f"{median:.3f}",
        ])  # fmt: skip
    return rows


def fleet(results: Mapping[str, Result]) -> Section:
    data = results["fleet"]
    runs = data.get("runs", {})
    killed = data.get("pion_killed", {})
    fail = killed.get("failover", {})
    rows = [_row(ROUTERS.get(k, k), run) for k, run in runs.items()]
    if killed:
        rows.append(_row("pion, a server killed", killed))
    labels = [ROUTERS.get(k, k) for k in runs]
    fig, (ax, ax2) = figure(ncols=2, width=5.2)
    bars(ax, labels, {"tokens reused": [r["reuse"] for r in runs.values()]})
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("share of prompt tokens not prefilled")
    ax.set_title("Tokens reused, by router")
    bars(ax2, labels, {
        "TTFT p50": [r["ttft_p50_s"] for r in runs.values()],
        "TTFT p95": [r["ttft_p95_s"] for r in runs.values()],
    })  # fmt: skip
    ax2.set_ylabel("seconds")
    ax2.set_title("Time to first byte of the answer")
    harnesses = ", ".join(NAMES.get(h, h) for h in data.get("harnesses", {}))
    model = data.get("model", {})
    targets = data.get("targets", {})
    return Section(
        title="Which llama-server should a request go to?",
        intro=(
            f"A replay of {data.get('sessions', '?')} agent sessions shaped like the real "
            f"harnesses' requests ({harnesses}; {data.get('projects', '?')} projects each, "
            f"{data.get('turns', '?')} turns per session, a title request beside the first; "
            f"arriving {data.get('stagger_s', '?')} s apart, then all running at once) over "
            f"{data.get('servers', '?')} llama-servers {data.get('llama_build', '')} on this "
            f"machine (`-np {data.get('slots', '?')}` each, a generated random-weight model "
            f"of {model.get('layers', '?')} layers, width {model.get('width', '?')}: reuse "
            "is counted in tokens, which do not depend on the weights), fresh servers for "
            "each router. *pion llama proxy*: `--persist --slots all` with one `--upstream` "
            "and `--slot-dir` per server. The baselines are a router in the bench that "
            "sends each request straight to a llama-server (its own prompt cache), with the "
            "bytes the proxy would forward (Claude Code's billing header removed): *round "
            "robin*, request i to server i mod n; *least loaded*, the server with the "
            "fewest of the replay's requests in flight; *oracle*, each session to the server "
            "that served its previous turn (a new one to the server with the fewest "
            "sessions; llama-server picks the slot). Tokens reused: the answered requests' "
            "prompt tokens less the tokens llama-server prefilled (its `/metrics`, the "
            "proxy's warm-ups included: a token the proxy computed ahead of a request is not "
            "reused); *reported*: the answers' own `cache_n` (which counts the proxy's "
            "warm-ups as cached). Prefill: llama-server's `prompt_seconds_total`, all "
            "servers. TTFT: the first byte of the answer's body. A request that fails is sent "
            "again (retries; a baseline's come from llama-server closing an idle kept-alive "
            "connection). Failover: in a second pion run the server the proxy routed the most "
            "requests to is killed (SIGKILL) once "
            f"half the requests are answered (at {fail.get('kill_s', 0.0):.1f} s); every "
            "session with a request in flight then or one that failed after it, the time "
            f"from the kill to its next answer: the longest {fail.get('failover_s', 0.0):.2f} "
            f"s over {fail.get('sessions', 0)} sessions ({len(fail.get('failed_sessions', []))}"
            " saw a failed request). Targets: pion's tokens reused >= "
            f"{_pct(targets.get('reuse_over_oracle', 0.95))} of the oracle's, its TTFT p50 "
            f"<= {ratio(targets.get('ttft_p50_over_round_robin', 0.3))} round robin's, a "
            f"killed server's sessions answered within {targets.get('failover_s', 5.0):g} "
            f"s. Load average {load_average(data)}."
        ),
        headers=["router", "tokens reused", "reused of prompt", "reported (cache_n)",
                 "prefill s", "TTFT p50 s", "TTFT p95 s", "errors", "retries", "seconds"],
        rows=rows,
        losses="; ".join(_losses(data)),
        command="python bench/fleet.py",
        figure=fig,
        extra_tables=[(
            "Reuse the answers report (cache_n), per harness:",
            ["harness", *labels], _per_harness(runs),
        ), (
            "Where the time to first byte goes: the answered requests' own prefill against "
            "the prefill done outside them (the proxy's warm-ups and restores), and TTFT "
            "less a request's own prefill (waiting for a slot, a warm-up, the server):",
            ["router", "own prefill s", "other prefill s", "TTFT p50 s",
             "TTFT less own prefill, p50 s"], _ttft_parts(runs),
        )],
    )  # fmt: skip
