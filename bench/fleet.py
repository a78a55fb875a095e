"""Benchmark: agent sessions over several llama-servers, routed by `pion llama proxy`
against round robin, least loaded and an oracle; and a server killed mid-replay.

A replay of many agent sessions (``_harness_shapes``: Pi on ``/v1/chat/completions``,
Claude Code on ``/v1/messages``, Codex on ``/v1/responses``; several projects per harness,
each a session of several turns, every turn the conversation so far plus an answer and a
new user message, a title request beside the first), the sessions arriving a little
apart and then running concurrently, over 2-3 real llama-servers (scripts/build-llama-server,
``-np 2`` each) serving a generated random-weight model (reuse is counted in tokens, which
do not depend on the weights, so a tiny model fits this 2-core machine). Each routing runs
on fresh servers, one after another:

  pion          ``pion llama proxy --persist --slots all`` with one ``--upstream`` (and
                ``--slot-dir``) per server: the fleet routes each request to the server
                holding its prefix (docs/llama.md, "Several llama-servers").
  round_robin   a router in this script: request ``i`` to server ``i mod n``, sent
                straight to llama-server (its own prompt cache, ``cache_prompt``).
  least_loaded  the same, to the server with the fewest requests of this replay in flight
                (ties: the first).
  oracle        the same, each session to the server that served its previous turn (which
                holds its prefix: it is computed from the replay, no router can know
                better); a new session to the server with the fewest sessions.
  pion_killed   pion again, and the server it routed the most requests to killed
                (SIGKILL) once half the requests are answered: a request that fails is
                sent again (as a harness retries) until it is answered.

The baselines send each body as the proxy forwards it (Claude Code's per-prompt billing
header removed, :func:`pion.llama.endpoints.strip_billing_header`), so every router offers
llama-server the same bytes. Per request: tokens reused (``timings.cache_n`` of the answer,
else its ``cache_read_input_tokens`` / ``cached_tokens``) over its prompt tokens (as
llama-server counts them), prefill seconds (``timings.prompt_ms``, else llama-server's
``/metrics`` ``prompt_seconds_total``, summed over the servers) and TTFT (the first byte
of the answer's body). Failover: after the kill, every session with a request in flight or
one that failed, the time from the kill to its next answer; the longest.

Targets: pion's reused tokens >= 95% of the oracle's; pion's TTFT p50 <= 0.3x round
robin's; a killed server's sessions answered again within 5 s.
Results: a table on stdout and ``bench/results/fleet.json``.

Run: ``PYTHONPATH=src .venv/bin/python bench/fleet.py`` (``--quick``: two servers, two
harnesses, few short sessions: a smoke run of under a minute).
"""

from __future__ import annotations

import _common  # first: it puts scripts/ on sys.path for pion_testing; where results go

# isort: split

import argparse
import asyncio
import copy
import json
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from pion_testing.launcher import LlamaServerProcess
from pion_testing.paths import LLAMA_BUILD, ensure_llama_server
from pion_testing.testmodel import ModelSpec, make_model

from _harness_shapes import SHAPES, Request, session
from _llama_audit import ProxyProcess, read_reuse
from pion.llama.endpoints import strip_billing_header
from pion.llama.paths import cache_dir

ANSWER_CAP = 8
SLOTS = 2
SLOT_CTX = 24576
REQUEST_TIMEOUT_S = 120.0
RETRY_FOR_S = 60.0  # a failed request is sent again for this long, then counted failed
TARGETS = {"reuse_over_oracle": 0.95, "ttft_p50_over_round_robin": 0.3, "failover_s": 5.0}
MODEL = ModelSpec(layers=2, width=128, heads=4, kv_heads=2, ff=256, context=65536)
ROUTERS = ("pion", "round_robin", "least_loaded", "oracle")
_METRIC = re.compile(rb"^llamacpp:(prompt_seconds_total|prompt_tokens_total)\s+([0-9.eE+-]+)", re.M)


def model_path() -> Path:
    # The same generated model as bench/llama_sessions.py (made once, cached).
    path = cache_dir() / "models" / f"bench-sessions-{MODEL.layers}x{MODEL.width}.gguf"
    if not path.exists():
        make_model(path, MODEL)
    return path


# -- the servers ------------------------------------------------------------------------


class Servers:
    """Fresh llama-servers (each its own slot dir) in a temporary directory, and for
    pion the proxy in front of them all."""

    def __init__(self, binary: Path, model: Path, n: int, threads: int, pion: bool) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="pion-bench-fleet-"))
        self.servers: list[LlamaServerProcess] = []
        self.proxy: ProxyProcess | None = None
        self.at_kill = {"seconds": 0.0, "tokens": 0.0}  # a killed server's last figures
        try:
            for i in range(n):
                self.servers.append(
                    LlamaServerProcess(
                        binary, model, slot_dir=self.root / f"slots{i}", ctx=SLOT_CTX * SLOTS,
                        parallel=SLOTS, threads=threads, extra_args=["--metrics"],
                        log_path=self.root / f"llama-server{i}.log",
                    ).start()
                )  # fmt: skip
            if pion:
                extra = []
                for i, s in enumerate(self.servers[1:], 1):
                    extra += ["--upstream", s.url, "--slot-dir", str(self.root / f"slots{i}")]
                first = self.servers[0]
                self.proxy = ProxyProcess(
                    first.url, self.root / "slots0", self.root / "prefix-cache.log", *extra
                )
        except BaseException:
            self.close()
            raise

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def prefill(self) -> dict[str, float]:
        """llama-server's own prompt seconds and prompt tokens computed, summed over the
        servers still running and a killed one's figures read just before the kill."""
        total = dict(self.at_kill)
        for s in self.servers:
            if s.proc is not None:
                for k, v in _prefill(s.url).items():
                    total[k] += v
        return total

    def kill(self) -> int:
        """SIGKILL the server the proxy routed the most requests to (a crash: no goodbye,
        its in-flight answers cut, the most sessions to move); which one it was."""
        index = len(self.servers) - 1
        if self.proxy is not None:
            fleet = self.proxy.status().get("fleet", {}).get("servers", [])
            routed = [sum(s.get("routed", {}).values()) for s in fleet]
            if len(routed) == len(self.servers):
                index = max(range(len(routed)), key=lambda i: (routed[i], i))
        server = self.servers[index]
        for k, v in _prefill(server.url).items():
            self.at_kill[k] += v
        if server.proc is not None:
            server.proc.kill()
            server.proc.wait(10)
            server.proc = None
        return index

    def close(self) -> None:
        if self.proxy is not None:
            self.proxy.stop()
        for s in self.servers:
            s.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def _prefill(url: str) -> dict[str, float]:
    """The prompt seconds and tokens one llama-server computed (its ``/metrics``: every
    task, a proxy's warm-ups included; tokens found in its cache are not counted)."""
    try:
        text = httpx.get(url + "/metrics", timeout=10).content
    except httpx.HTTPError:
        return {}
    found = {m.group(1).decode(): float(m.group(2)) for m in _METRIC.finditer(text)}
    return {
        "seconds": found.get("prompt_seconds_total", 0.0),
        "tokens": found.get("prompt_tokens_total", 0.0),
    }


# -- the routers ------------------------------------------------------------------------


@dataclass
class Router:
    """Where each request of a replay goes: the proxy, or a baseline's choice of server."""

    name: str
    urls: list[str]
    proxy: str | None = None
    inflight: list[int] = field(default_factory=list)
    sent: int = 0
    home: dict[str, int] = field(default_factory=dict)  # oracle: session -> server

    def __post_init__(self) -> None:
        self.inflight = [0] * len(self.urls)

    def pick(self, req: Request) -> int | None:
        """The server index for ``req`` (None: the proxy decides)."""
        if self.proxy is not None:
            return None
        if self.name == "round_robin":
            self.sent += 1
            return (self.sent - 1) % len(self.urls)
        if self.name == "least_loaded":
            return min(range(len(self.urls)), key=lambda i: self.inflight[i])
        if req.session not in self.home:  # oracle: a new session where fewest live
            counts = [list(self.home.values()).count(i) for i in range(len(self.urls))]
            self.home[req.session] = min(range(len(self.urls)), key=lambda i: counts[i])
        return self.home[req.session]


def _body(req: Request, direct: bool) -> dict[str, Any]:
    """What is sent: a baseline sends what the proxy would forward (no billing header)."""
    body = copy.deepcopy(req.body)
    if direct and req.path.startswith("/v1/messages"):
        strip_billing_header(body)
    return body


def _timings(raw: bytes) -> tuple[float | None, int | None]:
    """``(prompt_ms, prompt_n)`` of the last ``timings`` object in an answer."""
    ms, n = None, None
    for m in re.finditer(rb'"timings"\s*:\s*(\{[^{}]*\})', raw):
        try:
            t = json.loads(m.group(1))
        except ValueError:
            continue
        ms, n = t.get("prompt_ms"), t.get("prompt_n")
    return ms, n


def _events(raw: bytes) -> list[Any]:
    text = raw.strip()
    if text.startswith(b"{"):
        return [json.loads(text)]
    return [json.loads(line[6:]) for line in raw.split(b"\n") if line.startswith(b"data: {")]


async def _attempt(
    client: httpx.AsyncClient, router: Router, req: Request, t0: float
) -> dict[str, Any]:
    i = router.pick(req)
    url = router.proxy if i is None else router.urls[i]
    rec: dict[str, Any] = {"server": i, "start_s": time.monotonic() - t0}
    if i is not None:
        router.inflight[i] += 1
    try:
        headers = {"user-agent": req.user_agent, "content-type": "application/json"}
        body = _body(req, i is not None)
        async with client.stream("POST", f"{url}{req.path}", json=body, headers=headers) as r:
            chunks = []
            async for chunk in r.aiter_raw():
                if not chunks:
                    rec["ttft_s"] = time.monotonic() - t0 - rec["start_s"]
                chunks.append(chunk)
        raw = b"".join(chunks)
        rec["status"] = r.status_code
        if r.status_code == 200:
            rec["cache_n"], rec["prompt"] = read_reuse(_events(raw))
            rec["prompt_ms"], _ = _timings(raw)
    except (httpx.HTTPError, ValueError) as exc:
        rec |= {"status": 0, "error": f"{type(exc).__name__}: {exc}"[:200]}
    finally:
        if i is not None:
            router.inflight[i] -= 1
    rec["end_s"] = time.monotonic() - t0
    return rec


async def send(client: httpx.AsyncClient, router: Router, req: Request, t0: float,
               done: list[dict[str, Any]]) -> dict[str, Any]:  # fmt: skip
    """One request, sent again while it fails (for ``RETRY_FOR_S``): its last attempt,
    with the failed ones' times."""
    first = time.monotonic()
    failures: list[list[float]] = []
    while True:
        rec = await _attempt(client, router, req, t0)
        if rec["status"] == 200 or time.monotonic() - first > RETRY_FOR_S:
            break
        failures.append([rec["start_s"], rec["end_s"], rec["status"], rec.get("error")])
        await asyncio.sleep(0.1)  # not a hot loop against a proxy that answers 502 at once
    rec |= {"harness": req.harness, "session": req.session, "turn": req.turn, "kind": req.kind}
    rec["failures"] = failures
    done.append(rec)
    return rec


async def replay(
    router: Router, sessions: Sequence[list[list[Request]]], stagger: float,
    kill: Callable[[], int] | None = None,
) -> tuple[list[dict[str, Any]], tuple[float, int] | None]:  # fmt: skip
    """Every session, session ``k`` starting ``k * stagger`` s in; ``kill`` (a function)
    called once half the requests are answered. The records, and the kill's time and
    the server it killed."""
    t0 = time.monotonic()
    done: list[dict[str, Any]] = []
    total = sum(len(t) for s in sessions for t in s)
    killed: list[tuple[float, int]] = []
    timeout = httpx.Timeout(REQUEST_TIMEOUT_S, connect=5.0)

    async def run(k: int, turns: list[list[Request]], client: httpx.AsyncClient) -> None:
        await asyncio.sleep(k * stagger)
        for turn in turns:
            await asyncio.gather(*(send(client, router, r, t0, done) for r in turn))

    async def killer() -> None:
        while len(done) < total // 2:
            await asyncio.sleep(0.05)
        assert kill is not None
        victim = await asyncio.to_thread(kill)
        killed.append((time.monotonic() - t0, victim))

    async with httpx.AsyncClient(timeout=timeout, limits=httpx.Limits(max_connections=64)) as c:
        tasks = [run(k, s, c) for k, s in enumerate(sessions)]
        await asyncio.gather(*tasks, *([killer()] if kill is not None else []))
    return done, (killed[0] if killed else None)


# -- the figures ------------------------------------------------------------------------


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def summarize(
    records: list[dict[str, Any]], prefill: dict[str, float], seconds: float
) -> dict[str, Any]:
    """Reuse as llama-server computed it: the prompt tokens of every answered request
    less the tokens it prefilled (a proxy's warm-ups included: a token the proxy
    computed ahead is not reused); ``cache_n`` as the answers report it beside."""
    ok = [r for r in records if r["status"] == 200]
    prompt = sum(r.get("prompt") or 0 for r in ok)
    computed = round(prefill.get("tokens", 0.0))
    reused = max(0, prompt - computed)
    reported = sum(r.get("cache_n") or 0 for r in ok)
    ttft = [r["ttft_s"] for r in ok if "ttft_s" in r]
    timed = [r["prompt_ms"] for r in ok if isinstance(r.get("prompt_ms"), (int, float))]
    return {
        "requests": records,
        "answered": len(ok),
        "errors": len(records) - len(ok),
        "retries": sum(len(r["failures"]) for r in records),
        "prompt_tokens": prompt,
        "reused_tokens": reused,
        "reuse": reused / prompt if prompt else 0.0,
        "computed_tokens": computed,
        "reported_cache_n": reported,
        "reported_reuse": reported / prompt if prompt else 0.0,
        "prefill_s": prefill.get("seconds", 0.0),
        "prefill_s_timings": sum(timed) / 1000,
        "requests_with_timings": len(timed),
        "ttft_p50_s": _pct(ttft, 0.5),
        "ttft_p95_s": _pct(ttft, 0.95),
        "seconds": seconds,
    }


def failover(records: list[dict[str, Any]], kill_s: float) -> dict[str, Any]:
    """After the kill at ``kill_s``: per session with a request in flight then, or one
    that failed after it, the time from the kill to its next answer."""
    waits: dict[str, float] = {}
    failed: set[str] = set()
    for r in records:
        in_flight = r["start_s"] <= kill_s < r["end_s"]
        fails = [f for f in r["failures"] if f[1] >= kill_s]
        if fails:
            failed.add(r["session"])
        if (in_flight or fails) and r["status"] == 200:
            wait = r["end_s"] - kill_s
            waits[r["session"]] = min(waits.get(r["session"], wait), wait)
    return {
        "kill_s": kill_s,
        "sessions": len(waits),
        "failed_sessions": sorted(failed),
        "failover_s": max(waits.values(), default=0.0),
        "failed_failover_s": max((waits[s] for s in failed if s in waits), default=0.0),
        "waits": waits,
    }


def run_router(args: argparse.Namespace, name: str, sessions: list[list[list[Request]]],
               tools: tuple[Path, Path], *, kill: bool = False) -> dict[str, Any]:  # fmt: skip
    """One replay of ``sessions`` on fresh servers routed by ``name``; ``tools``: the
    llama-server binary and the model."""
    binary, model = tools
    pion = name == "pion"
    servers = Servers(binary, model, args.servers, args.threads, pion)
    try:
        proxy = servers.proxy.url if servers.proxy is not None else None
        router = Router(name, servers.urls, proxy)
        t0 = time.monotonic()
        records, killed = asyncio.run(
            replay(router, sessions, args.stagger, servers.kill if kill else None)
        )
        out = summarize(records, servers.prefill(), time.monotonic() - t0)
        if proxy is not None and servers.proxy is not None:
            status = servers.proxy.status()
            out["fleet"] = {
                "decisions": status.get("fleet", {}).get("decisions", {}),
                "routed": [s.get("routed", {}) for s in status.get("fleet", {}).get("servers", [])],
            }
        if killed is not None:
            out["failover"] = failover(records, killed[0]) | {"killed": killed[1]}
    finally:
        servers.close()
    f = out.get("failover", {})
    print(
        f"  {name}{' (a server killed)' if kill else ''}: reuse {out['reuse']:.3f} "
        f"(reported {out['reported_reuse']:.3f}), "
        f"prefill {out['prefill_s']:.2f} s, TTFT p50 {out['ttft_p50_s']:.3f} s "
        f"p95 {out['ttft_p95_s']:.3f} s, {out['errors']} errors, {out['retries']} retries"
        + (f", failover {f['failover_s']:.2f} s" if f else "")
        + f", {out['seconds']:.1f} s",
        flush=True,
    )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="a smoke run (under a minute)")
    ap.add_argument("--servers", type=int, default=3)
    ap.add_argument("--projects", type=int, default=3, help="sessions per harness")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--scale", type=float, default=1.0, help="prompt sizes, x the shapes'")
    ap.add_argument("--stagger", type=float, default=0.3, help="seconds between arrivals")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    names = ["pi", "claude", "codex"]
    if args.quick:
        args.servers, args.projects, args.turns, args.scale = 2, 2, 3, 0.2
        names = ["pi", "claude"]
    shapes = [SHAPES[n].scaled(args.scale) for n in names]
    sessions = [
        session(shape, f"{shape.name}-project{p}", args.turns, ANSWER_CAP)
        for p in range(args.projects)
        for shape in shapes
    ]
    tools = ensure_llama_server(), model_path()
    started, load_before = time.monotonic(), os.getloadavg()
    print(f"{len(sessions)} sessions of {args.turns} turns over {args.servers} llama-servers:")
    runs = {name: run_router(args, name, sessions, tools) for name in ROUTERS}
    killed = run_router(args, "pion", sessions, tools, kill=True)
    pion, oracle, rr = runs["pion"], runs["oracle"], runs["round_robin"]
    figures = {
        "reuse_over_oracle": pion["reused_tokens"] / oracle["reused_tokens"]
        if oracle["reused_tokens"]
        else 0.0,
        "ttft_p50_over_round_robin": pion["ttft_p50_s"] / rr["ttft_p50_s"]
        if rr["ttft_p50_s"]
        else 0.0,
        "failover_s": killed["failover"]["failover_s"],
    }
    met = {
        "reuse_over_oracle": figures["reuse_over_oracle"] >= TARGETS["reuse_over_oracle"],
        "ttft_p50_over_round_robin": figures["ttft_p50_over_round_robin"]
        <= TARGETS["ttft_p50_over_round_robin"],
        "failover_s": figures["failover_s"] <= TARGETS["failover_s"],
    }
    _common.print_table(
        ["router", "reuse", "reused tokens", "prefill s", "TTFT p50", "TTFT p95", "errors"],
        [[k, r["reuse"], r["reused_tokens"], r["prefill_s"], r["ttft_p50_s"], r["ttft_p95_s"],
          r["errors"]] for k, r in {**runs, "pion_killed": killed}.items()],
    )  # fmt: skip
    _common.write_results("fleet", {
        "quick": args.quick,
        "harnesses": {s.name: {"path": s.path, "user_agent": s.user_agent} for s in shapes},
        "servers": args.servers,
        "slots": SLOTS,
        "slot_ctx": SLOT_CTX,
        "sessions": len(sessions),
        "projects": args.projects,
        "turns": args.turns,
        "scale": args.scale,
        "stagger_s": args.stagger,
        "runs": runs,
        "pion_killed": killed,
        "figures": figures,
        "targets": TARGETS,
        "met": met,
        "model": {"layers": MODEL.layers, "width": MODEL.width, "generated": True},
        "llama_build": LLAMA_BUILD,
        "threads": args.threads,
        "answer_cap": ANSWER_CAP,
        "load_avg_before": load_before,
        "load_avg_after": os.getloadavg(),
        "seconds": time.monotonic() - started,
    })  # fmt: skip
    print(f"figures: {json.dumps(figures)}\ntargets: {json.dumps(met)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
