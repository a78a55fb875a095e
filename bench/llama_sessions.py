"""Benchmark: agent sessions through `pion llama proxy`, concurrent against one after another,
and a conversation resumed after a llama-server restart.

Replayed sessions shaped like the real harnesses' (``_harness_shapes``: Pi on
``/v1/chat/completions``, Claude Code on ``/v1/messages``, Codex on ``/v1/responses``;
several turns, each the previous conversation plus an answer and a new user message; a
title request sent at the same time as the first main request) go through
``pion llama proxy --persist --slots all`` (a subprocess, the command a user runs) in
front of the real llama-server (scripts/build-llama-server) serving a generated
random-weight model (scripts/pion_testing/testmodel.py). Reuse is counted in tokens,
which do not depend on the weights, so a tiny model makes long prompts affordable.

  (a) concurrency  the sessions one after another, then all at once (asyncio), on
                   ``-np 1`` and on ``-np 2``, each run on a fresh llama-server, proxy and
                   slot dir. Per request: tokens reused (``cache_n`` of the answer's
                   ``timings``, ``cache_read_input_tokens`` of a Messages answer) over its
                   prompt tokens (as llama-server tokenizes it). Per run: the proxy's
                   restores (``/pion/status`` counts) and saves (``index.json``), the
                   tokens llama-server prefilled in all (its log at ``-lv 4``: the proxy's
                   warm-ups included), and an audit of every slot file: the tokens it holds
                   (read from its header) must start with the prefix its index entry
                   claims, else it was saved under another prefix's name.
  (b) resume       one Claude-Code-shaped session of five turns (>= 15k prompt tokens at
                   the last), llama-server restarted on the same slot dir, then the next
                   turn: the tokens llama-server computed for it (warm-ups and restores
                   included) over its prompt; *recomputed*: those beyond the new turn's
                   own tokens (the sixth request's tokens after what the fifth request
                   holds, never computed before), over its prompt. ``--resume-only``
                   runs only this part and keeps the committed result's (a).

Targets: concurrent reuse >= 0.95 x sequential; no misnamed file; resume <= 1% recomputed
(Pion's own ``pion serve`` resumed a Claude Code session recomputing 89 of 17,452).
Results: a table on stdout and ``bench/results/llama_sessions.json``.

Run: ``PYTHONPATH=src .venv/bin/python bench/llama_sessions.py`` (``--quick``: two
harnesses, two turns, small prompts, ``-np 1`` only: a smoke run of under a minute).
"""

from __future__ import annotations

import _common  # first: it puts scripts/ on sys.path for pion_testing; where results go

# isort: split

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
from pion_testing.launcher import LlamaServerProcess
from pion_testing.paths import LLAMA_BUILD, ensure_llama_server
from pion_testing.tasklog import TRACE_FLAGS, read_tasks
from pion_testing.testmodel import ModelSpec, make_model

from _harness_shapes import SHAPES, Request, Shape, session
from _llama_audit import (
    Namer,
    ProxyProcess,
    Renderer,
    SaveWatch,
    audit,
    claimed_prefixes,
    common_prefix,
    quiet,
    read_reuse,
)
from pion.llama.paths import cache_dir

ANSWER_CAP = 8
SLOT_CTX = 24576
REQUEST_TIMEOUT_S = 300.0
TARGETS = {"concurrent_over_sequential": 0.95, "misnamed": 0, "resume_recomputed": 0.01}
MODEL = ModelSpec(layers=2, width=128, heads=4, kv_heads=2, ff=256, context=65536)
RESUME_TOKENS = 15000
# --keep: leave each run's folder (llama-server and proxy logs, slot dir) for a look.
KEEP = False


def model_path() -> Path:
    path = cache_dir() / "models" / f"bench-sessions-{MODEL.layers}x{MODEL.width}.gguf"
    if not path.exists():
        make_model(path, MODEL)
    return path


# -- sending ------------------------------------------------------------------------------


def _sse_events(raw: bytes) -> list[Any]:
    """The JSON objects of an event stream (``data: {...}`` lines), or the one JSON body."""
    text = raw.strip()
    if text.startswith(b"{"):
        return [json.loads(text)]
    events = []
    for line in raw.split(b"\n"):
        data = line.strip()
        if data.startswith(b"data: {"):
            events.append(json.loads(data[6:]))
    return events


async def send(client: httpx.AsyncClient, url: str, req: Request, t0: float) -> dict[str, Any]:
    """One request through the proxy: its status, time and the reuse its answer reports."""
    record: dict[str, Any] = {
        "harness": req.harness, "session": req.session, "turn": req.turn, "kind": req.kind,
        "start_s": time.monotonic() - t0,
    }  # fmt: skip
    try:
        headers = {"user-agent": req.user_agent, "content-type": "application/json"}
        async with client.stream("POST", url + req.path, json=req.body, headers=headers) as r:
            raw = await r.aread()
        record["status"] = r.status_code
        cache_n, reported = read_reuse(_sse_events(raw)) if r.status_code == 200 else (None, None)
        record |= {"cache_n": cache_n, "reported_prompt": reported}
    except (httpx.HTTPError, ValueError) as exc:
        record |= {"status": 0, "error": f"{type(exc).__name__}: {exc}"[:300]}
    record["seconds"] = time.monotonic() - t0 - record["start_s"]
    return record


async def run_session(
    client: httpx.AsyncClient, url: str, turns: list[list[Request]], t0: float
) -> list[dict[str, Any]]:
    """A session's turns in order; a turn's requests (main and side) at the same time."""
    out: list[dict[str, Any]] = []
    for turn in turns:
        out += await asyncio.gather(*(send(client, url, r, t0) for r in turn))
    return out


async def drive(
    url: str, sessions: Sequence[list[list[Request]]], concurrent: bool, watch: SaveWatch
) -> list[dict[str, Any]]:
    timeout = httpx.Timeout(REQUEST_TIMEOUT_S, connect=10.0)
    limits = httpx.Limits(max_connections=32)
    t0 = time.monotonic()
    watch.start()
    try:
        async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
            if concurrent:
                done = await asyncio.gather(*(run_session(client, url, s, t0) for s in sessions))
                return [r for rs in done for r in rs]
            return [r for s in sessions for r in await run_session(client, url, s, t0)]
    finally:
        await watch.stop()


# -- one run --------------------------------------------------------------------------------


class Stack:
    """A fresh llama-server, slot dir and proxy in a temporary directory."""

    def __init__(self, binary: Path, model: Path, np: int, threads: int, extra: Sequence[str]):
        self.root = Path(tempfile.mkdtemp(prefix="pion-bench-sessions-"))
        self.slot_dir = self.root / "slots"
        self.server = LlamaServerProcess(
            binary, model, slot_dir=self.slot_dir, ctx=SLOT_CTX * np, parallel=np,
            threads=threads, extra_args=[*TRACE_FLAGS, *extra],
            log_path=self.root / "llama-server.log",
        ).start()  # fmt: skip
        try:
            self.proxy = ProxyProcess(
                self.server.url, self.slot_dir, self.root / "prefix-cache.log"
            )
        except BaseException:
            self.server.stop()
            raise
        self.watch = SaveWatch(self.slot_dir)

    def revive(self) -> bool:
        """Restart llama-server (same port, same slot dir) if it died or stopped answering
        (the issue's wedged and aborted servers); whether it had to."""
        if self.server.proc is not None and self.server.proc.poll() is None:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.server.url + "/health", timeout=10).status_code == 200:
                    return False
        self.server.restart()
        return True

    def log_offset(self) -> int:
        return int(self.server.log_path.stat().st_size)

    def prefilled(self, offset: int) -> dict[str, int]:
        """What llama-server computed since ``offset``: tasks, prompt tokens, of them cached."""
        tasks = read_tasks(self.server.log_path, offset)
        return {
            "tasks": len(tasks),
            "tokens": sum(t.n_tokens for t in tasks),
            "computed": sum(t.n_tokens - t.cached for t in tasks),
        }

    def close(self) -> None:
        self.proxy.stop()
        self.server.stop()
        if KEEP:
            print(f"  kept {self.root} (logs, slot dir)", flush=True)
        else:
            shutil.rmtree(self.root, ignore_errors=True)


def _delta(after: dict[str, Any], before: dict[str, Any]) -> dict[str, int]:
    keys = set(after) | set(before)
    out = {k: int(after.get(k, 0)) - int(before.get(k, 0)) for k in keys}
    return {k: v for k, v in sorted(out.items()) if v}


def _restores(counts: dict[str, int]) -> int:
    """Restores the proxy did: whole (``restored``) and partial (``partial``) outcomes."""
    return counts.get("restored", 0) + counts.get("partial", 0)


def summarize(records: list[dict[str, Any]], tokens: list[list[int]]) -> dict[str, Any]:
    """Reuse over all requests, over main requests and over side requests."""
    for record, toks in zip(records, tokens, strict=True):
        record["prompt"] = len(toks)

    def reuse(rs: list[dict[str, Any]]) -> float:
        prompt = sum(r["prompt"] for r in rs)
        return sum(r.get("cache_n") or 0 for r in rs) / prompt if prompt else 0.0

    return {
        "reuse": reuse(records),
        "reuse_main": reuse([r for r in records if r["kind"] == "main"]),
        "reuse_side": reuse([r for r in records if r["kind"] == "side"]),
        "prompt_tokens": sum(r["prompt"] for r in records),
        "errors": sum(1 for r in records if r.get("status") != 200),
    }


def run_once(
    stack: Stack,
    sessions: list[list[list[Request]]],
    concurrent: bool,
    renderer: Renderer,
    earlier: Sequence[Request] = (),
) -> dict[str, Any]:
    """One run of ``sessions`` through ``stack``: reuse, restores, saves, the audit (of
    the slot dir against these requests and the ``earlier`` ones of the same stack)."""
    before, offset, t0 = stack.proxy.status(), stack.log_offset(), time.monotonic()
    records = asyncio.run(drive(stack.proxy.url, sessions, concurrent, stack.watch))
    seconds = time.monotonic() - t0
    revived = stack.revive()  # the audit needs llama-server's tokenizer
    quiet(stack.proxy, stack.slot_dir, stack.watch)
    after = stack.proxy.status()
    counts = _delta(after.get("counts", {}), before.get("counts", {}))
    events = _delta(after.get("events", {}), before.get("events", {}))
    by_key = {(r.harness, r.session, r.turn, r.kind): r for s in sessions for t in s for r in t}
    reqs = [by_key[(r["harness"], r["session"], r["turn"], r["kind"])] for r in records]
    tokens = [renderer.tokens(stack.server.url, q.path, q.body) for q in reqs]
    known = [*earlier, *reqs]
    by_agent: dict[str, list[list[int]]] = {}
    for q in known:
        by_agent.setdefault(q.user_agent, []).append(
            renderer.tokens(stack.server.url, q.path, q.body)
        )
    outcomes = after.get("outcomes", [])
    lengths = {int(o.get("tokens", 0)) for o in outcomes}
    lengths |= {int(e.get("tokens", 0)) for e in (after.get("files") or {}).values()}
    namer = Namer(stack.server.url)
    names = claimed_prefixes(namer, renderer, stack.server.url, known, lengths)
    files = audit(stack.slot_dir, names, by_agent, ANSWER_CAP, namer.own_name)
    n = len(records)
    restores, saves = _restores(counts), len(stack.watch.seen)
    return {
        "concurrent": concurrent,
        "seconds": seconds,
        "llama_server_revived": revived,
        "requests": records,
        **summarize(records, tokens),
        "restores": restores,
        "saves": saves,
        "restores_per_request": restores / n if n else 0.0,
        "saves_per_request": saves / n if n else 0.0,
        "counts": counts,
        "events": events,
        "failures": after.get("failures", {}),
        "prefilled": stack.prefilled(offset),
        "files": files,
        "misnamed": sum(1 for f in files if f["verdict"] == "misnamed"),
        "unreadable": sum(1 for f in files if f["verdict"] == "unreadable"),
        "unindexed": sum(1 for f in files if f["verdict"] == "unindexed"),
        "named_by_index": sum(1 for f in files if f.get("named_by") == "index"),
        "outcomes": outcomes,
    }


# -- the scenarios ----------------------------------------------------------------------------


SUMMED = ("errors", "restores", "saves", "misnamed", "unreadable", "unindexed", "named_by_index")


def combine(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Repetitions of one configuration as one run: reuse over every request of every
    repetition, counts summed, rates per request; each repetition's figures kept."""
    requests = [r | {"rep": i} for i, run in enumerate(runs) for r in run["requests"]]

    def total(key: str) -> int:
        return sum(int(run[key]) for run in runs)

    def reuse(rs: list[dict[str, Any]]) -> float:
        prompt = sum(r["prompt"] for r in rs)
        return sum(r.get("cache_n") or 0 for r in rs) / prompt if prompt else 0.0

    n = len(requests)
    keep = ("reuse", "restores", "saves", "misnamed", "errors", "seconds")
    return {
        "concurrent": runs[0]["concurrent"],
        "seconds": sum(run["seconds"] for run in runs),
        "requests": requests,
        "reuse": reuse(requests),
        "reuse_main": reuse([r for r in requests if r["kind"] == "main"]),
        "reuse_side": reuse([r for r in requests if r["kind"] == "side"]),
        "prompt_tokens": total("prompt_tokens"),
        **{k: total(k) for k in SUMMED},
        "restores_per_request": total("restores") / n if n else 0.0,
        "saves_per_request": total("saves") / n if n else 0.0,
        "prefilled": {k: sum(run["prefilled"][k] for run in runs) for k in runs[0]["prefilled"]},
        "files": [f | {"rep": i} for i, run in enumerate(runs) for f in run["files"]],
        "llama_server_revived": sum(bool(run["llama_server_revived"]) for run in runs),
        "runs": [
            {k: run[k] for k in keep}
            | {"counts": run["counts"], "events": run["events"], "failures": run["failures"]}
            for run in runs
        ],
    }


def concurrency(args: argparse.Namespace, shapes: list[Shape], binary: Path, model: Path,
                renderer: Renderer) -> dict[str, Any]:  # fmt: skip
    out: dict[str, Any] = {}
    sessions = [session(shape, f"{shape.name}-s1", args.turns, ANSWER_CAP) for shape in shapes]
    for np in args.np:
        runs: dict[str, Any] = {}
        for mode in ("sequential", "concurrent"):
            reps = []
            for _ in range(args.reps):
                stack = Stack(binary, model, np, args.threads, args.llama_arg)
                try:
                    reps.append(run_once(stack, sessions, mode == "concurrent", renderer))
                finally:
                    stack.close()
                r = reps[-1]
                print(f"  -np {np} {mode}: reuse {r['reuse']:.3f} (main {r['reuse_main']:.3f}), "
                      f"{r['restores']} restores, {r['saves']} saves, {r['misnamed']} misnamed, "
                      f"{r['errors']} errors, {r['seconds']:.1f} s", flush=True)  # fmt: skip
            runs[mode] = combine(reps)
        seq, conc = runs["sequential"]["reuse"], runs["concurrent"]["reuse"]
        runs["ratio"] = conc / seq if seq else 0.0
        out[f"np{np}"] = runs
    return out


def _sized(shape: Shape, turns: int, target: int, server_url: str, renderer: Renderer) -> Shape:
    """``shape`` scaled so that its last turn's prompt is about ``target`` tokens."""
    factor = 1.0
    for _ in range(3):
        scaled = shape.scaled(factor)
        last = session(scaled, "sizing", turns, ANSWER_CAP)[-1][0]
        n = len(renderer.tokens(server_url, last.path, last.body))
        if target <= n <= target * 1.1:
            return scaled
        factor *= target * 1.04 / n
    return shape.scaled(factor)


def resume(
    args: argparse.Namespace, binary: Path, model: Path, renderer: Renderer
) -> dict[str, Any]:
    """Five turns of a Claude-Code-shaped session, llama-server restarted, the sixth turn."""
    stack = Stack(binary, model, 1, args.threads, args.llama_arg)
    try:
        shape = _sized(
            SHAPES["claude"], args.resume_turns, args.resume_tokens, stack.server.url, renderer
        )
        turns = session(shape, "claude-resume", args.resume_turns + 1, ANSWER_CAP)
        before = run_once(stack, [turns[:-1]], False, renderer)
        stack.server.restart()
        earlier = [r for turn in turns[:-1] for r in turn]
        after = run_once(stack, [turns[-1:]], False, renderer, earlier)
        result = _resumed(args, stack, renderer=renderer, turns=turns, before=before, after=after)
    finally:
        stack.close()
    return result


def _resumed(
    args: argparse.Namespace,
    stack: Stack,
    *,
    renderer: Renderer,
    turns: list[list[Request]],
    before: dict[str, Any],
    after: dict[str, Any],
) -> dict[str, Any]:
    (turn,) = after["requests"]
    prompt, computed = turn["prompt"], after["prefilled"]["computed"]
    last = [r for r in before["requests"] if r["kind"] == "main"][-1]
    # The new turn (its tokens after what the previous turn's request holds) is computed
    # for the first time: what is *re*computed is the rest.
    (sixth,) = turns[-1]
    fifth = [q for q in turns[-2] if q.kind == "main"][-1]
    url = stack.server.url
    new = prompt - common_prefix(renderer.tokens(url, sixth.path, sixth.body),
                                 renderer.tokens(url, fifth.path, fifth.body))  # fmt: skip
    return {
        "turns": args.resume_turns,
        "last_turn_tokens": last["prompt"],
        "prompt": prompt,
        "cache_n": turn.get("cache_n"),
        "computed": computed,
        "new_turn_tokens": new,
        "computed_share": computed / prompt if prompt else 1.0,
        "recomputed": max(0, computed - new) / prompt if prompt else 1.0,
        "status": turn.get("status"),
        "before": before,
        "after": after,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="a smoke run (under a minute)")
    ap.add_argument("--harness", choices=sorted(SHAPES), action="append")
    ap.add_argument("--np", type=int, action="append", help="llama-server slots (-np)")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--reps", type=int, default=2, help="runs of each configuration")
    ap.add_argument("--resume-turns", type=int, default=5)
    ap.add_argument("--resume-tokens", type=int, default=RESUME_TOKENS)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--llama-arg", action="append", default=[], help="extra llama-server flag")
    ap.add_argument("--keep", action="store_true", help="keep each run's logs and slot dir")
    ap.add_argument(
        "--resume-only",
        action="store_true",
        help="run only (b) and replace its part of the committed result",
    )
    args = ap.parse_args()
    global KEEP
    KEEP = args.keep
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    scale = 1.0
    if args.quick:
        args.harness = args.harness or ["pi", "claude"]
        args.np, args.turns, args.resume_turns, args.resume_tokens = args.np or [1], 2, 2, 1500
        args.reps = 1
        scale = 0.25
    names = args.harness or ["pi", "claude", "codex"]
    args.np = args.np or [1, 2]
    shapes = [SHAPES[n].scaled(scale) for n in names]
    binary, model = ensure_llama_server(), model_path()
    renderer = Renderer()
    started, load_before = time.monotonic(), os.getloadavg()
    previous: dict[str, Any] = {}
    if args.resume_only:
        previous = json.loads((_common.RESULTS / "llama_sessions.json").read_text())
        runs = previous["concurrency"]
    else:
        print("concurrent against sequential:", flush=True)
        runs = concurrency(args, shapes, binary, model, renderer)
    print("resume after a restart:", flush=True)
    t_resume = time.monotonic()
    resumed = resume(args, binary, model, renderer)
    resumed_s = time.monotonic() - t_resume
    print(
        f"  {resumed['computed']:,} of {resumed['prompt']:,} tokens computed "
        f"({resumed['computed_share']:.2%}; the new turn {resumed['new_turn_tokens']:,}: "
        f"{resumed['recomputed']:.2%} recomputed), "
        f"last turn before: {resumed['last_turn_tokens']:,}"
    )
    rows = []
    for key, r in runs.items():
        for mode in ("sequential", "concurrent"):
            m = r[mode]
            rows.append([key, mode, m["reuse"], m["restores_per_request"], m["saves_per_request"],
                         m["misnamed"], m["errors"], m["prefilled"]["computed"]])  # fmt: skip
    _common.print_table(["slots", "run", "reuse", "restores/req", "saves/req", "misnamed",
                         "errors", "tokens computed"], rows)  # fmt: skip
    misnamed = sum(r[m]["misnamed"] for r in runs.values() for m in ("sequential", "concurrent"))
    misnamed += resumed["before"]["misnamed"] + resumed["after"]["misnamed"]
    met = {
        "concurrent_over_sequential": all(
            r["ratio"] >= TARGETS["concurrent_over_sequential"] for r in runs.values()
        ),
        "misnamed": misnamed == 0,
        "resume_recomputed": resumed["recomputed"] <= TARGETS["resume_recomputed"],
    }
    kept = {k: previous[k] for k in ("turns", "reps", "seconds") if k in previous}
    _common.write_results("llama_sessions", {
        "quick": args.quick,
        "harnesses": {s.name: {"path": s.path, "user_agent": s.user_agent} for s in shapes},
        "turns": args.turns,
        "reps": args.reps,
        "concurrency": runs,
        "resume": resumed,
        "misnamed": misnamed,
        "targets": TARGETS,
        "met": met,
        "model": {"layers": MODEL.layers, "width": MODEL.width, "generated": True},
        "llama_build": LLAMA_BUILD,
        "slot_ctx": SLOT_CTX,
        "threads": args.threads,
        "answer_cap": ANSWER_CAP,
        "llama_args": args.llama_arg,
        "load_avg_before": load_before,
        "load_avg_after": os.getloadavg(),
        "seconds": time.monotonic() - started,
        **kept,
        "resume_seconds": resumed_s,
        "resume_only": args.resume_only,
    })  # fmt: skip
    print(f"targets: {json.dumps(met)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
