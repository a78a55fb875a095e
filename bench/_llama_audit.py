"""What ``bench/llama_sessions.py`` reads around the proxy: the reuse each answer reports,
the proxy's counters and saves, the prompt tokens of every request, and an audit of the
slot files left in the slot dir.

Owns:

- :func:`read_reuse`: ``cache_n`` (and the prompt size llama-server reported) from a
  chat/Responses ``timings`` object or a Messages ``usage`` (plain or streamed);
- :class:`ProxyProcess`: ``pion llama proxy`` as a subprocess (the command a user runs),
  with :meth:`ProxyProcess.status` (``GET /pion/status``);
- :class:`SaveWatch`: every ``(file, created)`` pair that appears in the slot dir's
  ``index.json`` while it runs, so a save counts even when the budget deletes its file
  again before the run ends;
- :class:`Renderer`: a request's prompt tokens as llama-server computes them (the
  endpoint's conversion, ``/apply-template``, ``/tokenize`` with specials);
- :func:`claimed_prefixes` and :func:`audit`: for every slot file, the tokens it holds
  (read from its header) checked against the prefix its name stands for. The name is a
  fingerprint, so the prefix behind it is found by computing, with ``pion.llama``'s own
  fingerprint, the names of every prefix the proxy may have warmed for the requests sent;
  a file whose tokens do not start with its name's prefix holds another prefix's state.
  A name not found that way (a kind of file this audit does not know) is checked against
  its ``index.json`` entry: its token count and the requests of its harness.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
from pion_testing.launcher import free_port

from _harness_shapes import Request
from pion.llama import (
    DEFAULT_MARKERS,
    FingerprintInputs,
    LlamaClient,
    WarmRequest,
    file_name,
    fingerprint,
    warm_request_from_chat,
)
from pion.llama.endpoints import ENDPOINTS, strip_billing_header, to_chat
from pion.llama.fingerprint import model_file_identity
from pion.llama.serverinfo import ServerInfo
from pion.llama.slotfile import read_tokens

__all__ = [
    "Namer",
    "ProxyProcess",
    "Renderer",
    "SaveWatch",
    "audit",
    "claimed_prefixes",
    "common_prefix",
    "read_reuse",
]

ROOT = Path(__file__).resolve().parents[1]


def _walk(obj: Any) -> Iterable[Mapping[str, Any]]:
    """Every mapping inside ``obj``, outermost first."""
    if isinstance(obj, Mapping):
        yield obj
        for value in obj.values():
            yield from _walk(value)
    elif isinstance(obj, list):
        for value in obj:
            yield from _walk(value)


def read_reuse(events: Sequence[Any]) -> tuple[int | None, int | None]:
    """``(cache_n, prompt tokens)`` from an answer's JSON objects (one, or a stream's
    events): the last ``timings`` wins; else the largest Messages/Responses cache read."""
    cache_n: int | None = None
    total: int | None = None
    for event in events:
        for obj in _walk(event):
            timings = obj.get("timings")
            if isinstance(timings, Mapping) and isinstance(timings.get("cache_n"), int):
                cache_n = timings["cache_n"]
                prompt_n = timings.get("prompt_n")
                total = cache_n + prompt_n if isinstance(prompt_n, int) else total
    if cache_n is not None:
        return cache_n, total
    for event in events:
        for obj in _walk(event):
            read = obj.get("cache_read_input_tokens")
            details = obj.get("input_tokens_details")
            if isinstance(details, Mapping) and isinstance(details.get("cached_tokens"), int):
                read = details["cached_tokens"]
            if isinstance(read, int):
                cache_n = max(cache_n or 0, read)
                new = obj.get("input_tokens")
                if isinstance(new, int):
                    total = new + read if "cache_read_input_tokens" in obj else new
    return cache_n, total


class ProxyProcess:
    """``pion llama proxy --persist --slots all`` in front of ``upstream``, as a subprocess."""

    def __init__(self, upstream: str, slot_dir: Path, log: Path, *extra: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(ROOT / "src"), env.get("PYTHONPATH", "")) if p
        )
        cmd = [
            sys.executable, "-m", "pion", "llama", "proxy", "--upstream", upstream,
            "--port", str(self.port), "--persist", "--slot-dir", str(slot_dir),
            "--slots", "all", "--log", str(log), *extra,
        ]  # fmt: skip
        self.output = log.with_name("proxy-output.log")
        with self.output.open("ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"pion llama proxy exited:\n{self.output.read_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/pion/status", timeout=2).status_code == 200:
                    return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"pion llama proxy not ready:\n{self.output.read_text()[-3000:]}")

    def status(self) -> dict[str, Any]:
        data = httpx.get(self.url + "/pion/status", timeout=30).json()
        return data if isinstance(data, dict) else {}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(15)


def _index_files(slot_dir: Path) -> dict[str, dict[str, Any]]:
    try:
        doc = json.loads((slot_dir / "index.json").read_text())
    except (OSError, ValueError):
        return {}
    files = doc.get("files") if isinstance(doc, dict) else None
    return (
        {k: v for k, v in files.items() if isinstance(v, dict)} if isinstance(files, dict) else {}
    )


class SaveWatch:
    """Polls ``index.json`` (every 0.1 s, as an asyncio task) and keeps every
    ``(file, created)`` pair it saw: one pair per save."""

    def __init__(self, slot_dir: Path) -> None:
        self.slot_dir = slot_dir
        self.seen: set[tuple[str, float]] = set()
        self._task: asyncio.Task[None] | None = None

    def poll(self) -> int:
        for name, entry in _index_files(self.slot_dir).items():
            self.seen.add((name, float(entry.get("created", 0.0))))
        return len(self.seen)

    async def _loop(self) -> None:
        while True:
            self.poll()
            await asyncio.sleep(0.1)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> int:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        return self.poll()


def quiet(proxy: ProxyProcess, slot_dir: Path, watch: SaveWatch, settle_s: float = 2.0) -> None:
    """Wait until the proxy's background work is done: its counters and the slot dir's
    index unchanged for ``settle_s`` (at most 120 s)."""

    def state() -> str:
        status = proxy.status()
        watch.poll()
        keep = {k: status.get(k) for k in ("counts", "events", "files")}
        return json.dumps(keep, sort_keys=True, default=str)

    deadline = time.monotonic() + 120
    last, since = state(), time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - since < settle_s:
        time.sleep(0.25)
        now = state()
        if now != last:
            last, since = now, time.monotonic()


class Renderer:
    """Prompt tokens of request bodies, computed by llama-server (cached by body)."""

    def __init__(self) -> None:
        self._cache: dict[str, list[int]] = {}

    def chat_tokens(self, server_url: str, chat: Mapping[str, Any]) -> list[int]:
        """The tokens of a chat body as llama-server renders and tokenizes a prompt."""
        key = hashlib.sha256(json.dumps(chat, sort_keys=True).encode()).hexdigest()
        if key not in self._cache:
            with LlamaClient(server_url) as client:
                prompt = client.apply_template(chat)
                self._cache[key] = client.tokenize(prompt, add_special=True)
        return self._cache[key]

    def tokens(self, server_url: str, path: str, body: Mapping[str, Any]) -> list[int]:
        kind = ENDPOINTS[path.split("?", 1)[0]]
        sent = copy.deepcopy(dict(body))
        if kind == "messages":
            strip_billing_header(sent)  # as the proxy does by default
        return self.chat_tokens(server_url, to_chat(kind, sent))


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class Namer:
    """The slot file name the proxy gives a prefix: ``pion.llama``'s own fingerprint of it,
    with the server's model and build (the proxy's ``--server-id`` left empty)."""

    def __init__(self, server_url: str) -> None:
        with LlamaClient(server_url) as client:
            info = ServerInfo.from_props(client.props())
        self.model_id, self.build = info.model_id, info.build
        self.model_file = model_file_identity(info.model_path)

    def name(self, request: WarmRequest) -> str:
        inputs = FingerprintInputs.of(
            request, model_id=self.model_id, model_file=self.model_file, server_id=f"|{self.build}"
        )
        return file_name(fingerprint(inputs))

    def own_name(self, harness: str, model: str, tokens: Sequence[int]) -> str:
        """The name of a token-mode prefix of ``harness`` and ``model`` (a request's
        model, as an index entry records it)."""
        warm = WarmRequest(prefix="", model=model or None, harness=harness, tokens=tuple(tokens))
        return self.name(warm)


def claimed_prefixes(
    namer: Namer,
    renderer: Renderer,
    server_url: str,
    requests: Sequence[Request],
    lengths: Iterable[int],
) -> dict[str, tuple[int, ...]]:
    """Slot file name -> the prefix tokens it stands for, for every prefix the proxy may
    have warmed for ``requests``: Pi's marker prefix (its warm-up as rendered), and in
    token mode the first N tokens of a request, N being a length the proxy reported
    (``lengths``), a whole request, or where two requests of one harness diverge."""
    out: dict[str, tuple[int, ...]] = {}
    by_agent: dict[str, list[tuple[Request, list[int]]]] = {}
    for q in requests:
        by_agent.setdefault(q.user_agent, []).append(
            (q, renderer.tokens(server_url, q.path, q.body))
        )
    lengths = set(lengths)
    for agent, group in by_agent.items():
        for q, toks in group:
            model = q.body.get("model")
            cuts = lengths | {len(toks)} | {common_prefix(toks, t) for _, t in group}
            for n in sorted(c for c in cuts if 0 < c <= len(toks)):
                warm = WarmRequest(prefix="", model=model, harness=agent, tokens=tuple(toks[:n]))
                out.setdefault(namer.name(warm), tuple(toks[:n]))
            if q.path.startswith("/v1/chat/completions"):
                found = warm_request_from_chat(q.body, DEFAULT_MARKERS, harness=agent)
                if isinstance(found, WarmRequest):
                    prefix = renderer.chat_tokens(server_url, found.body(""))
                    out.setdefault(namer.name(found), tuple(prefix))
    return out


def _by_index(claimed: int, held: Sequence[int], best: int, best_len: int, cap: int) -> str:
    """The verdict on a file whose name is not one :func:`claimed_prefixes` derived: its
    index entry's token count against the requests of its harness."""
    if len(held) >= claimed and best >= claimed:
        return "ok"
    # A checkpoint of a whole conversation: the request's prompt, then (part of) the
    # answer the model generated, which no request holds.
    if best >= best_len - 1 and len(held) >= claimed and claimed <= best_len + cap + 1:
        return "ok"
    return "misnamed"


OwnName = Callable[[str, str, Sequence[int]], str]


def _own(entry: Mapping[str, Any], held: Sequence[int], name: str, own_name: OwnName) -> int:
    """The length of the start of ``held`` whose fingerprint is ``name`` (its index
    entry's token count, or all of it), else 0: a file named after what it holds (a whole
    conversation, answer included, has no request to derive its name from)."""
    harness, model = str(entry.get("harness", "")), str(entry.get("model", ""))
    for n in sorted({int(entry.get("tokens", 0)), len(held)}):
        if 0 < n <= len(held) and own_name(harness, model, held[:n]) == name:
            return n
    return 0


def audit(
    slot_dir: Path,
    names: Mapping[str, Sequence[int]],
    requests: Mapping[str, Sequence[Sequence[int]]],
    answer_cap: int,
    own_name: OwnName | None = None,
) -> list[dict[str, Any]]:
    """One row per slot file: the tokens it holds against the prefix its name stands for
    (``names``, from :func:`claimed_prefixes`, else the file's own tokens when
    ``own_name`` of them gives its name); where the name is not derived, against its
    ``index.json`` entry (its token count, the requests of its harness: ``requests``,
    prompt token lists by User-Agent)."""
    index = _index_files(slot_dir)
    everything = [t for lists in requests.values() for t in lists]
    rows = []
    for path in sorted(slot_dir.glob("*.bin")):
        held = read_tokens(path)
        entry = index.get(path.name)
        row: dict[str, Any] = {"file": path.name, "bytes": path.stat().st_size}
        if held is None:
            rows.append(row | {"verdict": "unreadable"})
            continue
        row["held"] = len(held)
        if entry is None:
            rows.append(row | {"verdict": "unindexed"})
            continue
        claimed = int(entry.get("tokens", 0))
        harness = str(entry.get("harness", ""))
        candidates = requests.get(harness) or everything
        scored = [(common_prefix(held, r), len(r)) for r in candidates] or [(0, 0)]
        best, best_len = max(scored)
        row |= {"claimed": claimed, "harness": harness, "matched": best}
        prefix = names.get(path.name)
        own = _own(entry, held, path.name, own_name) if prefix is None and own_name else 0
        if own:
            rows.append(row | {"named_by": "own tokens", "prefix": own, "verdict": "ok"})
        elif prefix is not None:
            ok = tuple(held[: len(prefix)]) == tuple(prefix)
            row |= {"named_by": "fingerprint", "prefix": len(prefix)}
            rows.append(row | {"verdict": "ok" if ok else "misnamed"})
        else:
            verdict = _by_index(claimed, held, best, best_len, answer_cap)
            rows.append(row | {"named_by": "index", "verdict": verdict})
    return rows
