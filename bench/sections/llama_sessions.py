"""The section on agent sessions through `pion llama proxy` (``bench/llama_sessions.py``):
token reuse of harness-shaped sessions run concurrently against one after another on
``-np 1`` and ``-np 2``, the proxy's restores and saves per request, slot files saved
under another prefix's name, and a conversation resumed after a llama-server restart."""

from __future__ import annotations

from collections.abc import Mapping

from sections._base import Result, Section, bars, figure, load_average, ratio

NAMES = {"pi": "Pi", "claude": "Claude Code", "codex": "Codex"}
MODES = ("sequential", "concurrent")


def _pct(value: float) -> str:
    return f"{value:.1%}"


def llama_sessions(results: Mapping[str, Result]) -> Section:
    data = results["llama_sessions"]
    targets = data.get("targets", {})
    floor = targets.get("concurrent_over_sequential", 0.95)
    runs = data.get("concurrency", {})
    rows, losses = [], []
    labels: list[str] = []
    series: dict[str, list[float]] = {m: [] for m in MODES}
    for key, run in runs.items():
        slots = f"-np {key.removeprefix('np')}"
        labels.append(slots)
        for mode in MODES:
            m = run[mode]
            series[mode].append(m["reuse"])
            rows.append([
                slots, mode, _pct(m["reuse"]), _pct(m["reuse_main"]),
                f"{m['restores_per_request']:.2f}", f"{m['saves_per_request']:.2f}",
                f"{m['misnamed']} of {len(m['files'])}", m["errors"],
                m["prefilled"]["computed"], m["seconds"],
            ])  # fmt: skip
            if m["misnamed"]:
                losses.append(
                    f"{slots} {mode}: {m['misnamed']} of {len(m['files'])} slot files hold "
                    "another prefix's tokens under their name"
                )
            if m["errors"]:
                losses.append(f"{slots} {mode}: {m['errors']} requests failed")
        if run["ratio"] < floor:
            losses.append(
                f"{slots}: concurrent sessions reused {_pct(run['concurrent']['reuse'])} of "
                f"their prompt tokens against {_pct(run['sequential']['reuse'])} one after "
                f"another ({ratio(run['ratio'])}, target >= {ratio(floor)})"
            )
    res = data.get("resume", {})
    target = targets.get("resume_recomputed", 0.01)
    if res and res["recomputed"] > target:
        losses.append(
            f"resumed after a restart, the next turn recomputed {_pct(res['recomputed'])} "
            f"of its {res['prompt']:,} prompt tokens ({res['computed']:,} computed, target "
            f"<= {_pct(target)})"
        )
    fig, (ax, ax2) = figure(ncols=2, width=5.2)
    bars(ax, labels, series)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("prompt tokens reused")
    ax.set_title("Harness sessions: one after another vs all at once")
    if res:
        ax2.bar(["resumed turn"], [res["recomputed"] * 100], width=0.4, color="tab:red")
        ax2.axhline(target * 100, color="black", linewidth=0.8, linestyle="--", label="target")
        ax2.legend(fontsize=8)
    ax2.set_ylabel("% of the prompt computed again")
    ax2.set_title("Resumed after a llama-server restart")
    harnesses = ", ".join(NAMES.get(h, h) for h in data.get("harnesses", {}))
    model = data.get("model", {})
    return Section(
        title="Do concurrent agent sessions and restarts keep their reuse through pion llama?",
        intro=(
            f"Replayed sessions shaped like the real harnesses' requests ({harnesses}; "
            f"{data.get('turns', '?')} turns each, every turn the conversation so far plus "
            "an answer and a new user message, a title request sent beside the first) "
            "through `pion llama proxy --persist --slots all` in front of llama-server "
            f"{data.get('llama_build', '')} ({data.get('slot_ctx', '?'):,} tokens per slot) "
            f"serving a generated random-weight model ({model.get('layers', '?')} layers, "
            f"width {model.get('width', '?')}): reuse is counted in tokens, which do not "
            "depend on the weights. Each run starts from a fresh llama-server, proxy and "
            f"slot dir; each configuration ran {data.get('reps', 1)} time(s), the figures "
            "are over all its runs. Reuse: tokens each answer reports cached over the "
            "request's prompt tokens, all requests. Restores from `/pion/status`, saves from "
            "`index.json`; misnamed: slot files whose tokens do not start with the prefix "
            "their name stands for (one after another means session after session: a "
            "session's title request still goes beside its first request). Tokens "
            "computed: llama-server's own count, the proxy's warm-ups included. Resume: a "
            "Claude-Code-shaped session of "
            f"{res.get('turns', '?')} turns ({res.get('last_turn_tokens', 0):,} prompt "
            "tokens at the last), llama-server restarted on the same slot dir, then the "
            f"next turn ({res.get('prompt', 0):,} tokens): {res.get('computed', 0):,} "
            f"computed, {_new_turn(res)}recomputed {_pct(res.get('recomputed', 0.0))} "
            "(the proxy keeps checkpoints of the conversation and restores the longest; "
            "Pion's own `pion serve`: 89 of 17,452)"
            + (", run alone after the concurrency runs" if data.get("resume_only") else "")
            + f". Targets: concurrent reuse >= {ratio(floor)} sequential, no misnamed "
            f"file, resume <= {_pct(target)}. Load average {load_average(data)}."
        ),
        headers=["slots", "run", "reuse", "reuse (main)", "restores/req", "saves/req",
                 "misnamed files", "errors", "tokens computed", "seconds"],
        rows=rows,
        losses="; ".join(losses),
        command="python bench/llama_sessions.py",
        figure=fig,
        extra_tables=[("Reuse per harness:", ["slots", "harness", *MODES], _per_harness(runs))],
    )  # fmt: skip


def _reuse(requests: list[Result], harness: str) -> str:
    mine = [r for r in requests if r["harness"] == harness]
    prompt = sum(r.get("prompt", 0) for r in mine)
    return _pct(sum(r.get("cache_n") or 0 for r in mine) / prompt) if prompt else ""


def _per_harness(runs: Mapping[str, Result]) -> list[list[str]]:
    rows = []
    for key, run in runs.items():
        harnesses = dict.fromkeys(r["harness"] for r in run["sequential"].get("requests", []))
        for harness in harnesses:
            cells = [_reuse(run[mode].get("requests", []), harness) for mode in MODES]
            rows.append([f"-np {key.removeprefix('np')}", NAMES.get(harness, harness), *cells])
    return rows


def _new_turn(res: Result) -> str:
    """The new turn's own tokens (computed for the first time) are not recomputed."""
    new = res.get("new_turn_tokens")
    return f"of them {new:,} the new turn's own (never computed before): " if new else ""
