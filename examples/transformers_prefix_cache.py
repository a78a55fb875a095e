"""Reuse a prompt prefix's K/V across requests with transformers and a Pion server.

Start a server, then run this (needs ``pip install 'pion[transformers]'``)::

    pion-server --port 1974 &
    python examples/transformers_prefix_cache.py --port 1974

It builds a tiny random-weight Llama from a config (no download), so it runs anywhere
in seconds; with a real model, replace ``tiny_model`` with ``from_pretrained`` and the
random tokens with your tokenizer's output. The first request prefills the shared
prefix and stores it; the second restores it from the server and skips the prefill;
both continue to the same tokens.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from pion.client import PionPromptCache
from pion.integrations.transformers import cache_kwargs, load_prefix, prefix_namespace, store_prefix


def tiny_model() -> Any:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=1024,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,  # grouped-query attention: kv_dim = 2 * 32
        max_position_embeddings=4096,
    )
    model: Any = LlamaForCausalLM(config)
    model.eval()
    with torch.no_grad():  # warm up, so the timed prefill is not torch's first call
        model(torch.zeros((1, 8), dtype=torch.long))
    return model


def answer(
    pc: PionPromptCache, model: Any, ns: str, prefix: Any, question: Any, *, vquant: str
) -> Any:
    """One request: restore the prefix if the server has it, else prefill and store it."""
    start = time.perf_counter()
    cache = load_prefix(pc, ns, model)
    if cache is None:
        cache = store_prefix(pc, ns, model, prefix, vquant)
        how = "prefilled and stored"
    else:
        how = "restored from Pion"
    ready_ms = (time.perf_counter() - start) * 1000
    full = torch.cat([prefix, question], dim=1)
    with torch.no_grad():
        out = model.generate(full, max_new_tokens=12, do_sample=False, **cache_kwargs(model, cache))
    print(f"  prefix {how} in {ready_ms:.1f} ms")
    return out[0, full.shape[1] :]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=1974)
    parser.add_argument("--password", default=None)
    parser.add_argument("--vquant", default="fp16", help="storage format (fp16 int8 fp8 ...)")
    parser.add_argument("--prefix-tokens", type=int, default=1024)
    parser.add_argument("--keep", action="store_true", help="leave the prefix on the server")
    args = parser.parse_args()

    model = tiny_model()
    g = torch.Generator().manual_seed(1)
    prefix = torch.randint(0, 1024, (1, args.prefix_tokens), generator=g)  # e.g. system prompt
    questions = [torch.randint(0, 1024, (1, 8), generator=g) for _ in range(2)]

    with PionPromptCache(args.host, args.port, password=args.password) as pc:
        ns = prefix_namespace(model, prefix, args.vquant, model_id="example/tiny-llama")
        pc.drop(ns)  # start cold, so the first request shows the miss path
        for i, question in enumerate(questions, 1):
            print(f"request {i}:")
            tokens = answer(pc, model, ns, prefix, question, vquant=args.vquant)
            with torch.no_grad():  # the same request without any cache, for comparison
                full = torch.cat([prefix, question], dim=1)
                fresh = model.generate(full, max_new_tokens=12, do_sample=False)[0, full.shape[1] :]
            same = "same as" if tokens.tolist() == fresh.tolist() else "DIFFERENT from"
            print(f"  tokens {tokens.tolist()} ({same} a fresh prefill)")
        receipt = pc.stats()
        print(
            f"server receipt: {receipt['kvprefix_hits']} hit(s), "
            f"{receipt['kvprefix_tokens_served']} tokens served, "
            f"{receipt['prefill_seconds_avoided_measured']:.3f} s of measured prefill avoided"
        )
        if not args.keep:
            pc.drop(ns)


if __name__ == "__main__":
    main()
