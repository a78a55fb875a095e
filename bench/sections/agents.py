"""The section on the real agent harnesses (``bench/agents.py``): each harness's session
start (time to first token, llama-server's prompt time) cold, hot and after a
llama-server restart, direct against llama-server and through `pion llama proxy`."""

from __future__ import annotations

from collections.abc import Mapping

from sections._base import Result, Section, bars, figure, load_average, ratio

NAMES = {"pi": "Pi", "claude": "Claude Code", "codex": "Codex"}
SCENARIOS = ("cold", "hot", "restart")


def _ms(value: float | None) -> float | str:
    return value if value is not None else ""


def agents(results: Mapping[str, Result]) -> Section:
    data = results["agents"]
    harnesses = data.get("harnesses", {})
    targets = data.get("targets", {"restart": 0.1, "hot": 0.05})
    rows, labels = [], []
    direct_ms: list[float] = []
    pion_ms: list[float] = []
    losses = []
    for name, h in harnesses.items():
        label = NAMES.get(name, name)
        for scenario in SCENARIOS:
            d, p = h["direct"][scenario], h["pion"][scenario]
            x = h["ratios"][scenario]
            labels.append(f"{label} {scenario}")
            direct_ms.append(d["ttft_ms"])
            pion_ms.append(p["ttft_ms"])
            rows.append(
                [
                    label,
                    scenario,
                    d["ttft_ms"],
                    _ms(d["prompt_ms"]),
                    f"{d['cached']:,}/{d['n_tokens']:,}",
                    p["ttft_ms"],
                    _ms(p["prompt_ms"]),
                    f"{p['cached']:,}/{p['n_tokens']:,}",
                    ratio(x),
                ]
            )
            target = targets.get(scenario)
            if target is not None and x > target:
                # What bounds it: the prompt after what the sessions share is prefilled at
                # every session start, whatever a prefix cache holds.
                losses.append(
                    f"{label} {scenario} via pion took {ratio(x)} of its direct cold start "
                    f"(target {target}x): {p['n_tokens'] - p['cached']:,} of its "
                    f"{p['n_tokens']:,} prompt tokens follow what its sessions share and are "
                    f"prefilled at every start ({(p['prompt_ms'] or 0) / 1000:.0f} s)"
                )
    fig, (ax,) = figure(width=9)
    bars(ax, labels, {"direct": direct_ms, "via pion llama": pion_ms})
    ax.set_yscale("log")
    ax.set_ylabel("time to first token, ms (log)")
    ax.set_title("Agent session starts: direct vs through pion llama")
    versions = ", ".join(f"{k} {v}" for k, v in data.get("versions", {}).items())
    return Section(
        title="How fast does each agent harness start a session through pion llama?",
        intro=(
            f"The real harnesses ({versions}), each configured with the blocks of "
            "docs/llama.md, three sessions each (cold on a fresh llama-server, hot, after a "
            f"restart) on {data.get('model', 'SmolLM2')} served by llama-server "
            f"{data.get('llama_build', '')} (one slot of {data.get('ctx', '?')} tokens, a "
            "template that renders the tools first, answers capped at "
            f"{data.get('answer_cap', '?')} tokens), direct and through `pion llama proxy "
            "--persist`. Time to first token of each session's main request, measured in "
            "front of either side from its first attempt (Claude Code gives up on a request "
            "after 5 minutes without a token and sends it again; the work llama-server did "
            "is kept). From llama-server's log: the prompt time of the requests of the main "
            "size whose prompt it finished (the proxy's warm-up included; an attempt given "
            "up mid-prompt reports none, its time is only in the time to first token), and "
            "the cached/prompt tokens of the request that answered. Ratios against the "
            "harness's direct cold start; targets: after a restart "
            f"<= {targets.get('restart')}x, a hit <= {targets.get('hot')}x. Load average "
            f"{load_average(data)}."
        ),
        headers=["harness", "session", "direct ttft ms", "direct prompt ms", "direct cached",
                 "pion ttft ms", "pion prompt ms", "pion cached", "pion x direct cold"],
        rows=rows,
        losses="; ".join(losses),
        command="python bench/agents.py",
        figure=fig,
    )  # fmt: skip
