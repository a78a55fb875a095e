"""Is restored K/V right, and is restoring it faster than recomputing it?

A tiny random-weight Llama (built from a config; grouped-query attention, kv_dim 64)
runs against a ``pion-server`` subprocess through ``pion.integrations.transformers``.
Per storage format:

* quality, over a fixed set of seeded prompts (``--prompts``, prefix ``--prefix``
  tokens + an 8-token question): K and V relative MSE of the restored cache against
  the prefilled one (``sum((r - p)**2) / sum(p**2)`` over every layer), cosine of the
  next-token logits after the question (restore vs a fresh prefill of the whole
  prompt), greedy agreement over ``NEW_TOKENS`` generated tokens, and whether the
  next token (argmax) held on every prompt;
* speed, at ``--timing-prefix`` tokens (2048): median prefill time (the same-run
  baseline) against median restore time (LOOKUP + fetch + building
  the ``DynamicCache``), and their ratio.

The eighth format, ``bf16_rope_fp8_body``, exists only per layer (SCHEMA), so its row
stores keys in it (the first ``ROPE`` values of each row in bf16, the rest fp8) and
values in fp8: the namespace's sessions are created with V.CREATE ... SCHEMA before
the prefix is registered (REGISTER keeps an existing layout). A Llama has no
decoupled rotary part, so the row measures the format's fidelity, not MLA's benefit.

    python bench/fidelity.py [--quick] [--prompts 4] [--prefix 300] [--timing-prefix 2048]

Writes ``bench/results/fidelity.json`` and prints a table (docs/client.md quotes it).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from typing import Any

import numpy as np
import redis
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from _common import print_table, start_pion, write_results
from pion.client import PionPromptCache
from pion.integrations.transformers import (
    cache_kwargs,
    cache_to_arrays,
    kv_layout,
    load_prefix,
    prefix_namespace,
    store_prefix,
)

SCHEMA_FORMAT = "bf16_rope_fp8_body"
FORMATS = ["fp16", "int8", "fp8", "mlx4g32", "turbo4", "turbo3", "turbo2", SCHEMA_FORMAT]
# bf16 values at the start of each key row for the SCHEMA-only format (of kv_dim 64).
ROPE = 16
NEW_TOKENS = 16
QUESTION = 8
MODEL = {
    "vocab_size": 1024,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
}


def tiny_model() -> Any:
    torch.manual_seed(0)
    model: Any = LlamaForCausalLM(LlamaConfig(**MODEL))
    model.eval()
    with torch.no_grad():  # first call pays torch's one-off setup; keep it off the clock
        model(torch.zeros((1, 8), dtype=torch.long))
    return model


def prompts(count: int, prefix: int) -> list[tuple[Any, Any]]:
    g = torch.Generator().manual_seed(1)
    vocab = MODEL["vocab_size"]
    return [
        (
            torch.randint(0, vocab, (1, prefix), generator=g),
            torch.randint(0, vocab, (1, QUESTION), generator=g),
        )
        for _ in range(count)
    ]


def greedy(model: Any, full: Any, **kwargs: Any) -> Any:
    with torch.no_grad():
        out = model.generate(
            full, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, **kwargs
        )
    return out[0, full.shape[1] :]


def rel_mse(restored: list[np.ndarray], prefilled: list[np.ndarray]) -> float:
    num = sum(
        float(((r.astype(np.float64) - p) ** 2).sum())
        for r, p in zip(restored, prefilled, strict=True)
    )
    den = sum(float((p.astype(np.float64) ** 2).sum()) for p in prefilled)
    return num / den


def prepare(r: redis.Redis, model: Any, ns: str, vquant: str) -> str:
    """The format to register ``ns`` with. For the SCHEMA-only format, first create the
    namespace's sessions with their per-layer layout (keys in it, values in fp8)."""
    if vquant != SCHEMA_FORMAT:
        return vquant
    n_layers, kv_heads, head_dim = kv_layout(model)
    kv_dim = kv_heads * head_dim
    spec = f"fmt={SCHEMA_FORMAT},dim={kv_dim},rope={ROPE}"
    r.execute_command("V.CREATE", f"{ns}_pk", 0, "SCHEMA", n_layers, *[spec] * n_layers)
    r.execute_command("V.CREATE", f"{ns}_pv", kv_dim, "VQUANT", "fp8")
    return "fp8"


def quality(
    pc: PionPromptCache, r: redis.Redis, model: Any, vquant: str, cases: list[tuple[Any, Any]]
) -> dict[str, Any]:
    n_layers = kv_layout(model)[0]
    k_mse, v_mse, cosines, agreement, held = [], [], [], [], True
    for prefix, question in cases:
        full = torch.cat([prefix, question], dim=1)
        with torch.no_grad():
            ref_logits = model(full).logits[0, -1]
        ref_tokens = greedy(model, full)
        ns = prefix_namespace(model, prefix, vquant, model_id="bench/tiny-llama")
        pc.drop(ns)
        prefilled = store_prefix(pc, ns, model, prefix, prepare(r, model, ns, vquant))
        restored = load_prefix(pc, ns, model)
        assert restored is not None
        want_k, want_v = cache_to_arrays(prefilled, n_layers)
        got_k, got_v = cache_to_arrays(restored, n_layers)
        k_mse.append(rel_mse(got_k, want_k))
        v_mse.append(rel_mse(got_v, want_v))
        with torch.no_grad():
            probe = copy.deepcopy(restored)
            logits = model(question, **cache_kwargs(model, probe)).logits[0, -1]
        cosines.append(torch.nn.functional.cosine_similarity(logits, ref_logits, dim=0).item())
        tokens = greedy(model, full, **cache_kwargs(model, restored))
        agreement.append((tokens == ref_tokens).float().mean().item())
        held = held and bool(tokens[0] == ref_tokens[0])
        pc.drop(ns)
    return {
        "k_rel_mse": statistics.fmean(k_mse),
        "v_rel_mse": statistics.fmean(v_mse),
        "logit_cosine_mean": statistics.fmean(cosines),
        "logit_cosine_min": min(cosines),
        "greedy_agreement": statistics.fmean(agreement),
        "argmax_held": held,
    }


def timing(
    pc: PionPromptCache, r: redis.Redis, model: Any, vquant: str, prefix: Any, *, repeat: int
) -> tuple[list[float], list[float]]:
    """``repeat`` prefill and restore times (seconds), interleaved so both see the same
    machine load."""
    ns = prefix_namespace(model, prefix, vquant, model_id="bench/tiny-llama")
    pc.drop(ns)
    store_prefix(pc, ns, model, prefix, prepare(r, model, ns, vquant))
    prefill, restore = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        with torch.no_grad():
            model(prefix, use_cache=True)
        prefill.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        cache = load_prefix(pc, ns, model)
        restore.append(time.perf_counter() - t0)
        assert cache is not None and cache.get_seq_length() == prefix.shape[1]
    pc.drop(ns)
    return prefill, restore


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="smoke sizes (2 prompts, 512 tokens)")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prefix", type=int, default=300)
    ap.add_argument("--timing-prefix", type=int, default=2048)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument(
        "--formats", nargs="+", default=FORMATS, choices=FORMATS, help="rows to measure"
    )
    args = ap.parse_args()
    if args.quick:
        args.prompts, args.timing_prefix, args.repeat = 2, 512, 3
    model = tiny_model()
    cases = prompts(args.prompts, args.prefix)
    timing_prefix = torch.randint(
        0, MODEL["vocab_size"], (1, args.timing_prefix), generator=torch.Generator().manual_seed(2)
    )
    server = start_pion()
    rows: list[dict[str, Any]] = []
    try:
        r = redis.Redis("127.0.0.1", server.port)
        with PionPromptCache("127.0.0.1", server.port) as pc:
            prefills: list[float] = []
            for vquant in args.formats:
                row = {"vquant": vquant, **quality(pc, r, model, vquant, cases)}
                if vquant == SCHEMA_FORMAT:
                    row["layout"] = f"K {SCHEMA_FORMAT} rope={ROPE}, V fp8"
                prefill, restore = timing(pc, r, model, vquant, timing_prefix, repeat=args.repeat)
                prefills += prefill
                row["restore_ms"] = statistics.median(restore) * 1000
                rows.append(row)
                print(f"  {vquant}: done", flush=True)
    finally:
        server.stop()
    # Prefill does not depend on the format: one baseline from every sample is steadier.
    prefill_ms = statistics.median(prefills) * 1000
    for row in rows:
        row["prefill_ms"] = prefill_ms
        row["speedup"] = prefill_ms / row["restore_ms"]
    headers = [
        "format",
        "K rel MSE",
        "V rel MSE",
        "logit cos (mean)",
        "logit cos (min)",
        "greedy agree",
        "argmax held",
        f"prefill ms @{args.timing_prefix}",
        "restore ms",
        "x faster",
    ]
    table = [
        [
            r["vquant"],
            f"{r['k_rel_mse']:.2e}",
            f"{r['v_rel_mse']:.2e}",
            f"{r['logit_cosine_mean']:.7f}",
            f"{r['logit_cosine_min']:.7f}",
            f"{r['greedy_agreement']:.3f}",
            "yes" if r["argmax_held"] else "NO",
            f"{r['prefill_ms']:.1f}",
            f"{r['restore_ms']:.1f}",
            f"{r['speedup']:.1f}",
        ]
        for r in rows
    ]
    print_table(headers, table)
    path = write_results(
        "fidelity",
        {
            "model": MODEL,
            "prompts": args.prompts,
            "prefix_tokens": args.prefix,
            "question_tokens": QUESTION,
            "new_tokens": NEW_TOKENS,
            "timing_prefix_tokens": args.timing_prefix,
            "repeat": args.repeat,
            "torch_threads": torch.get_num_threads(),
            "rows": rows,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
