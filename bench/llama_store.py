"""Benchmark: `pion llama` beyond one machine and one slot.

Part 1, a session start on a second machine. One real llama-server plays machine B: it is
restarted before every measurement (a fresh process: no K/V in memory) and serves a
~7k-token Pi-shaped prefix (the model of ``bench/llama_prefix.py``: 8 layers, width 512).
Time to first token of the session's first request:

  (a)  cold          no pion, straight to llama-server: the full prefill (the baseline)
  (b)  local disk    through the proxy, the slot file already in B's slot dir
  (c)  from store    through the proxy, B's slot dir empty: the file is pulled from a
                     pion-server subprocess (4 MB chunks, size and SHA-256 checked), then
                     restored; it was pushed there by an earlier build (machine A)

Targets: (c) <= 1.5 x (b) and (c) <= 0.1 x (a).

Part 2, several prefixes on one server. Three different Pi-shaped prefixes, sessions
interleaved A B C A B C ...; the total time of the workload and the median TTFT of the
sessions after each prefix's first:

  (i)   single-slot proxy, -np 1, --persist: every switch restores from disk
  (ii)  -np 3 proxy, --slots all, --persist: one prefix per slot, hits
  (iii) -np 3 without pion: llama-server's own slot choice (longest common prefix)

TTFT is measured by the client, from sending the request to the first streamed content
delta, so everything the proxy does (pull, hash, restore) is inside it. Results: a table
on stdout and ``bench/results/llama_store.json``.

Run: ``PYTHONPATH=src .venv/bin/python bench/llama_store.py [--reps 3] [--quick]``.
"""

from __future__ import annotations

from _common import print_table, start_pion, write_results  # first: scripts/ on sys.path

# isort: split

import argparse
import contextlib
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pion_testing.launcher import LlamaServerProcess
from pion_testing.llama_samples import pi_chat_body
from pion_testing.paths import ensure_llama_server
from pion_testing.testmodel import ModelSpec, make_model

from llama_prefix import calibrate, ttft
from pion.llama.client import LlamaClient
from pion.llama.config import WarmerConfig
from pion.llama.paths import cache_dir
from pion.llama.proxy import PrefixProxy, running_proxy

VARIANTS = ("compiler team", "storage team", "web team")


def bench_model(layers: int, width: int, context: int) -> Path:
    spec = ModelSpec(
        layers=layers, width=width, heads=8, kv_heads=4, ff=int(2.75 * width), context=context
    )
    model = cache_dir() / "models" / f"bench-{spec.layers}x{spec.width}-c{spec.context}.gguf"
    if not model.exists():
        make_model(model, spec)
    return model


@contextlib.contextmanager
def proxy_for(config: WarmerConfig) -> Iterator[tuple[str, PrefixProxy]]:
    proxy = PrefixProxy(config)
    with running_proxy(proxy) as url:
        yield url, proxy


def part1(args: argparse.Namespace, binary: Path, model: Path, work: Path) -> dict[str, Any]:
    store = start_pion()
    store_url = f"redis://127.0.0.1:{store.port}"
    server = LlamaServerProcess(
        binary,
        model,
        slot_dir=work / "slots-b",
        ctx=args.tokens + 4096,
        threads=args.threads,
        log_path=work / "llama-b.log",
    )
    samples: dict[str, list[float]] = {"a": [], "b": [], "c": []}
    reuse: dict[str, list[int]] = {"a": [], "b": [], "c": []}
    session = 0

    def body(n_rules: int) -> dict[str, Any]:
        nonlocal session
        session += 1
        user = f"Session {session}: what should I work on first?"
        return pi_chat_body(user, n_rules=n_rules, stream=True, max_tokens=4)

    def config(slot_dir: Path) -> WarmerConfig:
        return WarmerConfig(
            base_url=server.url,
            persist=True,
            slot_dir=slot_dir,
            log_path=work / "prefix-cache.log",
            store=store_url,
        )

    def record(name: str, result: tuple[float, dict[str, Any]]) -> None:
        samples[name].append(result[0])
        reuse[name].append(int(result[1].get("cache_n", -1)))
        print(f"  ({name}) {result[0] * 1000:.0f} ms, cache_n {reuse[name][-1]}", flush=True)

    try:
        server.start()
        with LlamaClient(server.url) as client:
            n_rules = calibrate(client, args.tokens)
            tokens = len(
                client.tokenize(client.apply_template(pi_chat_body(n_rules=n_rules)), True)
            )
        print(f"part 1: {model.name}, prompt {tokens} tokens", flush=True)
        # Machine A builds the prefix once and pushes it to the store.
        build_dir = work / "slots-a"
        server.slot_dir = build_dir
        server.restart()
        with proxy_for(config(build_dir)) as (url, proxy):
            ttft(url, body(n_rules))
            proxy.flush()
        pushes = proxy.warmer.store.counts["pushes"] if proxy.warmer.store else 0
        if pushes != 1:
            raise RuntimeError("the build was not pushed to the store")
        for rep in range(args.reps):
            print(f"cold rep {rep + 1}/{args.reps}", flush=True)
            server.restart()
            record("a", ttft(server.url, body(n_rules)))
        # (b) and (c) alternate, so that load from other processes on a shared machine
        # falls on both alike.
        for rep in range(args.restore_reps):
            print(f"restore rep {rep + 1}/{args.restore_reps}", flush=True)
            server.slot_dir = build_dir  # B with the file on its own disk
            server.restart()
            with proxy_for(config(build_dir)) as (url, _):
                record("b", ttft(url, body(n_rules)))
            fresh = work / f"slots-b-{rep}"
            server.slot_dir = fresh  # B with an empty slot dir: only the store has it
            server.restart()
            with proxy_for(config(fresh)) as (url, proxy):
                record("c", ttft(url, body(n_rules)))
                outcome = proxy.status()["outcomes"][-1]
            if outcome.get("tier") != "store":
                raise RuntimeError(f"(c) did not restore from the store: {outcome}")
            shutil.rmtree(fresh, ignore_errors=True)
        size = next(build_dir.glob("pi-prefix-*.bin")).stat().st_size
    finally:
        server.stop()
        store.stop()
    med = {k: statistics.median(v) for k, v in samples.items()}
    return {
        "prefix_tokens": tokens,
        "slot_file_bytes": size,
        "samples_s": samples,
        "cache_n": reuse,
        "median_s": med,
        "min_s": {k: min(v) for k, v in samples.items()},
        "store_over_disk": med["c"] / med["b"],
        "store_over_cold": med["c"] / med["a"],
        "targets_met": med["c"] <= 1.5 * med["b"] and med["c"] <= 0.1 * med["a"],
    }


def part2(args: argparse.Namespace, binary: Path, model: Path, work: Path) -> dict[str, Any]:
    per_slot = args.tokens2 + 2048
    results: dict[str, Any] = {}
    setups = {
        "i": ("single-slot proxy, -np 1", 1, "proxy1"),
        "ii": ("-np 3 proxy, --slots all", 3, "proxy3"),
        "iii": ("-np 3, no pion", 3, "direct"),
    }
    n_rules: int | None = None
    for key, (label, parallel, mode) in setups.items():
        slot_dir = work / f"slots-{key}"
        server = LlamaServerProcess(
            binary,
            model,
            slot_dir=slot_dir,
            ctx=per_slot * parallel,
            parallel=parallel,
            threads=args.threads,
            log_path=work / f"llama-{key}.log",
        )
        times: list[float] = []
        cache: list[int] = []
        try:
            server.start()
            if n_rules is None:
                with LlamaClient(server.url) as client:
                    n_rules = calibrate(client, args.tokens2)
            config = WarmerConfig(
                base_url=server.url,
                persist=True,
                slot_dir=slot_dir,
                log_path=work / f"prefix-cache-{key}.log",
                all_slots=parallel > 1,
            )
            with contextlib.ExitStack() as stack:
                url = server.url
                if mode != "direct":
                    url, _ = stack.enter_context(proxy_for(config))
                t0 = time.perf_counter()
                for session in range(args.rounds * len(VARIANTS)):
                    variant = VARIANTS[session % len(VARIANTS)]
                    user = f"Session {session}: go on."
                    payload = pi_chat_body(
                        user, n_rules=n_rules, variant=f"You work on the {variant}.",
                        stream=True, max_tokens=4,
                    )  # fmt: skip
                    took, timings = ttft(url, payload)
                    times.append(took)
                    cache.append(int(timings.get("cache_n", -1)))
                total = time.perf_counter() - t0
        finally:
            server.stop()
        later = times[len(VARIANTS) :]
        results[key] = {
            "label": label,
            "total_s": total,
            "median_later_s": statistics.median(later),
            "ttft_s": times,
            "cache_n": cache,
        }
        print(f"  ({key}) {label}: total {total:.1f} s", flush=True)
    results["prefix_tokens_about"] = args.tokens2
    results["rounds"] = args.rounds
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description="pion llama: store restores and many slots")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=7000, help="part 1 prefix size")
    parser.add_argument("--tokens2", type=int, default=1500, help="part 2 prefix size")
    parser.add_argument("--rounds", type=int, default=4, help="part 2 rounds of A B C")
    parser.add_argument("--reps", type=int, default=3, help="cold runs (a)")
    parser.add_argument("--restore-reps", type=int, default=7, help="runs of (b) and (c)")
    parser.add_argument("--threads", type=int, default=None, help="llama-server -t")
    parser.add_argument("--quick", action="store_true", help="small sizes (smoke run)")
    args = parser.parse_args()
    if args.quick:
        args.tokens, args.tokens2, args.rounds, args.reps, args.restore_reps = 1500, 600, 2, 1, 2
    binary = ensure_llama_server()
    model = bench_model(args.layers, args.width, max(32768, args.tokens * 2))
    work = Path(tempfile.mkdtemp(prefix="pion-bench-llama-store-"))
    try:
        one = part1(args, binary, model, work)
        two = part2(args, binary, model, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = one["median_s"]
    print(f"\nSession start on a second machine, {one['prefix_tokens']}-token prefix, "
          f"slot file {one['slot_file_bytes'] / 1e6:.1f} MB, medians of {args.reps} cold "
          f"and {args.restore_reps} restores:")  # fmt: skip
    print_table(
        ["scenario", "median ms", "x cold", "x local disk"],
        [
            ["(a) cold, no pion", med["a"] * 1000, 1.0, med["a"] / med["b"]],
            ["(b) restored from local disk", med["b"] * 1000, med["b"] / med["a"], 1.0],
            ["(c) pulled from pion-server", med["c"] * 1000, one["store_over_cold"],
             one["store_over_disk"]],
        ],
    )  # fmt: skip
    print(
        f"targets (c) <= 1.5 x (b) and <= 0.1 x (a): {'met' if one['targets_met'] else 'NOT met'}"
    )
    print(f"\nThree prefixes interleaved, {args.rounds} rounds, ~{args.tokens2} tokens each:")
    base = two["i"]["total_s"]
    print_table(
        ["setup", "total s", "x single-slot", "median TTFT ms (later sessions)"],
        [
            [two[k]["label"], two[k]["total_s"], two[k]["total_s"] / base,
             two[k]["median_later_s"] * 1000]
            for k in ("i", "ii", "iii")
        ],
    )  # fmt: skip
    path = write_results(
        "llama_store",
        {
            "model": {"layers": args.layers, "width": args.width, "file": model.name},
            "reps": args.reps,
            "restore_reps": args.restore_reps,
            "threads": args.threads,
            "second_machine": one,
            "several_prefixes": two,
        },
    )
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
