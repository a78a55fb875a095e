"""Restore a prefix into a slot from the local disk (tier 1) or the shared store (tier 2).

Owns the restore step of the warmer (:func:`restore`) and rejecting a restore that did not
verify (:func:`reject`). In order:

1. ``no_restore`` recorded for this (build, model): nothing is restored (hybrid models).
   **A checkpoint of the conversation** (:mod:`pion.llama.checkpoint`) that shares more of
   the request's tokens than its prefix is restored in place of the prefix's own file:
   the longest such (:func:`longest_checkpoint`), after the compatibility check.
2. **Local disk**: ``pi-prefix-<fp16>.bin`` in the slot dir, only when ``index.json``
   lists it for this fingerprint with its exact byte size (llama-server b11434 aborts on a
   truncated slot file instead of answering an error, taking every session down).
3. **Store** (``--store``), when the disk cannot serve: the manifest is read and checked
   first, the file pulled to a temporary name and renamed into the slot dir only after its
   size and SHA-256 match (:meth:`pion.llama.store.SlotStore.pull`), then indexed.
   Anything wrong with the store (down, slow, corrupt) means a cold build, logged.
4. **Compatibility**, for either tier, before llama-server sees the file: build, model,
   slot context and cache layout must match the running server (:mod:`pion.llama.compat`;
   the layout read from the file's own bytes).
5. The restore itself, then verification: ``verify="probe"`` runs the identical-prompt
   gate and the divergent probe now; ``"fast"`` leaves it to the real request
   (:meth:`PrefixWarmer.observe <pion.llama.warmer.PrefixWarmer.observe>`).

Returns the outcome, or None when the caller must build the prefix cold (after a partial
restore, :mod:`pion.llama.partial`, when a saved prefix shares most of its tokens).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

from pion.llama.client import AsyncLlamaClient, CompletionResult, LlamaServerError
from pion.llama.compat import FileFacts, ServerFacts, mismatch
from pion.llama.context import Pending, SlotState, Target, WarmerContext
from pion.llama.fingerprint import file_name, tokens_digest
from pion.llama.index import IndexEntry, SlotIndex
from pion.llama.learn import common_prefix
from pion.llama.manifest import Manifest
from pion.llama.outcome import Outcome
from pion.llama.prefix import WarmRequest
from pion.llama.serverinfo import ServerInfo
from pion.llama.slotfile import SlotLayout, read_layout
from pion.llama.store import StoreCorrupt, StoreError

__all__ = [
    "HYBRID_ADVICE",
    "NO_SAVING_ADVICE",
    "FileChecker",
    "longest_checkpoint",
    "reject",
    "restore",
    "target_tokens",
    "warm_body",
    "warm_up",
]


HYBRID_ADVICE = (
    "this llama.cpp build does not keep context checkpoints in slot files (a build with "
    "upstream #26004 does); for in-process reuse on hybrid/recurrent models start "
    "llama-server with --ctx-checkpoints N (e.g. 32), --checkpoint-min-step 0..4096 and a "
    "small -ub (128-512)"
)
NO_SAVING_ADVICE = (
    "a sliding-window or hybrid/recurrent model keeps state (SWA cells, context "
    "checkpoints) that this build's slot files do not carry"
)


def warm_body(request: WarmRequest, slot: int, user: str) -> dict[str, object]:
    # n_predict 0: process the prompt, generate nothing; id_slot pins the slot;
    # cache_prompt keeps the K/V in the slot for the next request.
    extra: dict[str, Any] = {
        "n_predict": 0,
        "id_slot": slot,
        "cache_prompt": True,
        "stream": False,
    }
    if request.tokens is not None:
        return request.completion_body(user, **extra)
    return request.body(user, **extra)


async def warm_up(
    client: AsyncLlamaClient, request: WarmRequest, slot: int, user: str
) -> CompletionResult:
    """One warm-up request into ``slot``: the prefix, then ``user``; a chat completion
    (text mode) or a raw completion of the prefix's tokens (token mode)."""
    body = warm_body(request, slot, user)
    if request.tokens is not None:
        return await client.complete(body)
    return await client.chat(body)


class FileChecker:
    """Compares file facts with the running server, learning its layout when needed."""

    def __init__(self, ctx: WarmerContext, info: ServerInfo, slot: int) -> None:
        self.ctx, self.info, self.slot = ctx, info, slot
        with ctx.guard:
            known = ctx.layouts.get(info)
        self.server: ServerFacts = ctx.facts(info, known)

    async def why_not(self, facts: FileFacts) -> str | None:
        if facts.layout is not None and self.server.layout is None:
            layout = await self.ctx.server_layout(self.info, self.slot, probe=True)
            self.server = dataclasses.replace(self.server, layout=layout)
        return mismatch(facts, self.server)


async def restore(ctx: WarmerContext, target: Target) -> Outcome | None:
    """Restore the target's prefix into its slot from disk or store and (probe mode)
    verify it."""
    request, slot, fp, info = target.request, target.slot, target.fingerprint, target.info
    if ctx.index is None:
        return None
    index = await asyncio.to_thread(ctx.index.load)
    key = info.restore_key()
    if key in index.no_restore:
        if key not in ctx.said_no_restore:
            ctx.said_no_restore.add(key)
            reason = index.no_restore[key].get("reason", "")
            ctx.log(f"restore disabled for this server build/model ({reason}) → cold build")
        return None
    name = file_name(fp)
    checker = FileChecker(ctx, info, slot)
    tier = "disk"
    entry: IndexEntry | None
    prefix_n = len(request.tokens or ())
    found = await _checkpoint(ctx, index, target, checker)
    if found is not None:
        (name, entry, tier), prefix_n = found
    else:
        entry = await _local(ctx, index, name, fp, checker)
    if entry is None and ctx.store is not None:
        entry, tier = await _pull(ctx, target, index, name, checker), "store"
    if entry is None:
        return None
    try:
        res = await ctx.client.slot_restore(slot, name)
    except LlamaServerError as exc:
        ctx.log(f"no checkpoint (restore {exc.short()}) → cold build")
        return None
    n_restored = int(res.get("n_restored") or 0)
    restore_ms = float((res.get("timings") or {}).get("restore_ms", 0.0))
    ctx.log(
        f"RESTORE {name}: n_restored={n_restored} n_read={res.get('n_read')} ({restore_ms:.0f} ms)"
    )
    if n_restored <= 0:
        ctx.log("RESTORE gave no tokens → cold build")
        return None
    own_file = n_restored == (entry.file_tokens or entry.tokens)
    # A checkpoint holds the prefix and a conversation after it: the prefix's own count
    # is what the real request is verified against and what later hits check.
    tokens = prefix_n if entry.checkpoint else entry.tokens
    prompt = request.tokens
    if prompt is None:
        # Text mode: the file's own tokens (checked when it was saved) stand for the prefix.
        held = await ctx.tokens_of(ctx.index.slot_dir / name)
        prompt = held[:tokens] if held else None
    state = SlotState(
        fp,
        tokens,
        "restore",
        time.time(),
        label=request.label(),
        prefill_ms=entry.prefill_ms,
        saved=True,
        file=name,
        prompt=prompt,
        prompt_exact=request.tokens is not None,
    )
    if ctx.config.verify == "probe":
        failure = await _probe(ctx, request, slot)
        if failure is not None:
            await reject(ctx, slot, name, key=key, own_file=own_file, why=failure, erase=True)
            return None
        await asyncio.to_thread(ctx.index.touch, name)
        ctx.slots[slot] = state
        return _finish(Outcome("restored", fp, slot, tokens, file=name, tier=tier), target.t0)
    await asyncio.to_thread(ctx.index.touch, name)
    state.pending = Pending(name, own_file, key, n_restored, restore_ms)
    ctx.slots[slot] = state
    outcome = Outcome("restored", fp, slot, tokens, file=name, tier=tier, pending_verify=True)
    return _finish(outcome, target.t0)


async def target_tokens(ctx: WarmerContext, request: WarmRequest, slot: int) -> tuple[int, ...]:
    """The tokens a warm-up of ``request`` sends: its own (token mode), or its chat body
    rendered and tokenized by llama-server (text mode)."""
    if request.tokens is not None:
        return request.tokens
    prompt = await ctx.client.apply_template(warm_body(request, slot, ""))
    return tuple(await ctx.client.tokenize(prompt, add_special=True))


def longest_checkpoint(
    ctx: WarmerContext, index: SlotIndex, tokens: tuple[int, ...]
) -> tuple[int, str, IndexEntry] | None:
    """The indexed conversation checkpoint (:mod:`pion.llama.checkpoint`) whose tokens
    share the longest prefix with ``tokens``: (tokens shared, name, entry). Reads the
    slot dir: call it off the event loop."""
    best: tuple[int, str, IndexEntry] | None = None
    for name, entry in sorted(index.files.items()):
        path = index.slot_dir / name
        if not entry.checkpoint or not path.is_file() or path.stat().st_size != entry.bytes:
            continue
        held = ctx.file_tokens(path)
        if held is None:
            continue
        # One token is always evaluated: a file holding all of ``tokens`` serves one less.
        shared = min(common_prefix(held, tokens), len(tokens) - 1)
        if best is None or shared > best[0]:
            best = (shared, name, entry)
    return best


async def _checkpoint(
    ctx: WarmerContext, index: SlotIndex, target: Target, checker: FileChecker
) -> tuple[tuple[str, IndexEntry, str], int] | None:
    """The checkpoint to restore for the target's request instead of its prefix's own
    file: the compatible one sharing the longest token prefix with the whole request,
    when that is longer than the prefix (the conversation up to an earlier turn); from
    the slot dir, or pulled from the store when it lists a longer one. ((name, entry,
    tier), the prefix's tokens)."""
    request = target.request
    conversation, prefix = request.conversation, request.tokens
    if conversation is not None and prefix is None:
        # Text mode (a Pi marker): the prefix is the part of its warm-up's rendering the
        # request holds.
        try:
            warm = await target_tokens(ctx, request, target.slot)
        except LlamaServerError as exc:
            ctx.log(f"no checkpoint restore (tokenizing failed: {exc.short()})")
            return None
        prefix = conversation[: common_prefix(warm, conversation)]
    if conversation is None or prefix is None or len(conversation) <= len(prefix):
        return None
    best = await asyncio.to_thread(longest_checkpoint, ctx, index, conversation)
    local = best[0] if best is not None else 0
    pulled = await _stored_checkpoint(ctx, target, index, max(local, len(prefix)), checker)
    if pulled is not None:
        return pulled, len(prefix)
    if best is None or best[0] <= len(prefix):
        return None
    shared, name, entry = best
    why = await checker.why_not(entry.facts())
    if why is not None:
        ctx.count("refused_compat")
        ctx.log(f"REFUSED checkpoint {name} before restore: {why} → the prefix's own file")
        return None
    ctx.count("checkpoint_restores")
    ctx.log(
        f"CHECKPOINT {name} shares {shared} of the request's {len(conversation)} tokens "
        f"(the prefix: {len(prefix)}) → restoring it"
    )
    return (name, entry, "disk"), len(prefix)


async def _stored_checkpoint(
    ctx: WarmerContext, target: Target, index: SlotIndex, floor: int, checker: FileChecker
) -> tuple[str, IndexEntry, str] | None:
    """The longest checkpoint the store lists under the target's prefix whose tokens
    (by their SHA-256) start the request and are more than ``floor``, pulled into the
    slot dir (verified like any pull)."""
    store, conversation = ctx.store, target.request.conversation or ()
    if store is None or not store.usable():
        return None
    try:
        listed = await asyncio.to_thread(store.checkpoints, target.fingerprint)
    except StoreError as exc:
        ctx.log(f"STORE checkpoints unavailable ({exc})")
        return None
    for tokens, fp, digest in sorted(((t, f, d) for f, t, d in listed), reverse=True):
        if not floor < tokens <= len(conversation):
            continue
        if await asyncio.to_thread(tokens_digest, conversation[:tokens]) != digest:
            continue
        name = file_name(fp)
        stored = dataclasses.replace(target, fingerprint=fp)
        entry = await _pull(ctx, stored, index, name, checker)
        if entry is None:
            return None
        entry.prefix, entry.tokens = target.fingerprint, tokens
        await asyncio.to_thread(_put, ctx, index, name, entry)
        ctx.count("checkpoint_restores")
        ctx.log(
            f"CHECKPOINT {name} from the store: shares {tokens} of the request's "
            f"{len(conversation)} tokens → restoring it"
        )
        return name, entry, "store"
    return None


def _put(ctx: WarmerContext, index: SlotIndex, name: str, entry: IndexEntry) -> None:
    index.put(name, entry)
    index.cleanup(ctx.config.max_files, ctx.config.max_bytes, keep=frozenset({name}))


def _finish(outcome: Outcome, t0: float) -> Outcome:
    ms = (time.monotonic() - t0) * 1000.0
    return dataclasses.replace(outcome, ms=ms, at=time.time())


async def _local(
    ctx: WarmerContext, index: SlotIndex, name: str, fp: str, checker: FileChecker
) -> IndexEntry | None:
    then = "trying the store" if ctx.store is not None else "cold build"
    entry = index.files.get(name)
    path = index.slot_dir / name
    if not path.is_file():
        ctx.log(f"no checkpoint ({name} not in the slot dir) → {then}")
        return None
    # Only files the index vouches for, byte for byte, go to the server: llama-server
    # b11434 aborts (GGML_ASSERT in state_seq_load_file) on a truncated slot file
    # instead of answering an error, which would take every session down with it.
    if entry is None:
        ctx.log(f"no checkpoint ({name} is not in index.json, not restored) → {then}")
        return None
    if entry.fingerprint != fp:
        ctx.log(f"no checkpoint ({name} belongs to {entry.fingerprint[:16]}…) → {then}")
        return None
    size = path.stat().st_size
    if size != entry.bytes:
        ctx.log(
            f"no checkpoint ({name} is {size} bytes, index.json says {entry.bytes}: "
            f"truncated or replaced, deleted) → {then}"
        )
        await asyncio.to_thread(index.drop, name, True)
        return None
    why = await checker.why_not(entry.facts())
    if why is not None:
        ctx.count("refused_compat")
        ctx.log(f"REFUSED {name} before restore: {why} → {then}")
        return None
    return entry


async def _pull(
    ctx: WarmerContext, target: Target, index: SlotIndex, name: str, checker: FileChecker
) -> IndexEntry | None:
    fp = target.fingerprint
    store = ctx.store
    if store is None:
        return None
    if not store.usable():
        ctx.log("STORE skipped (it failed moments ago) → cold build")
        return None
    try:
        manifest = await asyncio.to_thread(store.manifest, fp)
    except StoreCorrupt as exc:
        ctx.refused_store.add(fp)
        ctx.log(f"STORE REFUSED the manifest of {name}: {exc} → cold build")
        return None
    except StoreError as exc:
        ctx.log(f"STORE unavailable ({exc}) → cold build")
        return None
    if manifest is None:
        ctx.log(f"STORE has no {name} → cold build")
        return None
    facts = FileFacts(manifest.build, manifest.model, manifest.n_ctx, manifest.layout)
    why = await checker.why_not(facts)
    if why is not None:
        ctx.count("refused_compat")
        ctx.log(f"STORE REFUSED {name} (built on {manifest.origin}): {why} → cold build")
        return None
    path = index.slot_dir / name
    t = time.monotonic()
    try:
        await asyncio.to_thread(store.pull, manifest, path)
    except StoreCorrupt as exc:
        ctx.refused_store.add(fp)
        ctx.log(f"STORE REFUSED {name}: {exc}; never sent to llama-server → cold build")
        return None
    except (StoreError, OSError) as exc:
        ctx.log(f"STORE pull of {name} failed ({exc}) → cold build")
        return None
    ms = (time.monotonic() - t) * 1000.0
    # The file's own bytes, not the manifest's word, decide the layout check.
    layout = await asyncio.to_thread(read_layout, path)
    why = await checker.why_not(FileFacts(manifest.build, manifest.model, manifest.n_ctx, layout))
    if why is None and manifest.layout is not None and layout != manifest.layout:
        why = "the file's cache layout is not the one its manifest states"
    if why is not None:
        ctx.refused_store.add(fp)
        await asyncio.to_thread(index.drop, name, True)
        path.unlink(missing_ok=True)
        ctx.count("refused_compat")
        ctx.log(f"STORE REFUSED {name} after pulling: {why} → cold build")
        return None
    entry = _entry(ctx, target.request, manifest, layout)
    await asyncio.to_thread(_put, ctx, index, name, entry)
    ctx.count("store_pulls")
    ctx.log(
        f"STORE PULLED {name}: {manifest.size} bytes in {ms:.0f} ms, size and SHA-256 "
        f"verified (built on {manifest.origin or '?'})"
    )
    return entry


def _entry(
    ctx: WarmerContext, request: WarmRequest, manifest: Manifest, layout: SlotLayout | None
) -> IndexEntry:
    now = time.time()
    harness = ctx.config.harness if ctx.config.harness is not None else request.harness
    return IndexEntry(
        fingerprint=manifest.fingerprint,
        tokens=manifest.tokens,
        bytes=manifest.size,
        created=now,
        last_used=now,
        model=str(manifest.model.get("id", "")),
        server=manifest.build,
        harness=harness,
        prefill_ms=manifest.prefill_ms,
        n_ctx=manifest.n_ctx,
        model_identity=manifest.model,
        layout=layout.to_json() if layout is not None else None,
        origin=f"store:{manifest.origin}",
    )


async def _probe(ctx: WarmerContext, request: WarmRequest, slot: int) -> str | None:
    """pi-prefix-cache's two-stage verification; returns why it failed, or None."""
    gate = f"{ctx.config.gate_ratio:.0%}"
    ident = (await warm_up(ctx.client, request, slot, "")).timings
    if ident is None:
        return "identical-prompt gate: no timings in the answer"
    if ident.reuse < ctx.config.gate_ratio:
        return f"identical-prompt gate {ident.cache_n}/{ident.total} < {gate}"
    div = (await warm_up(ctx.client, request, slot, ctx.config.probe_message)).timings
    if div is None:
        return "divergent probe: no timings in the answer"
    if div.cache_n == 0:
        # Kept: a rebuild would produce the same checkpoint chain (as pi-prefix-cache keeps it).
        ctx.log(
            f"RESTORE WARNING: divergent probe cache_n=0 of {div.total} — no context "
            "checkpoint before the divergence (server flags? e.g. the prefix is shorter "
            "than --checkpoint-min-step); restore kept"
        )
    ctx.log(
        f"RESTORE verified: identical {ident.cache_n}/{ident.total}, "
        f"divergent probe {div.cache_n}/{div.total}"
    )
    return None


async def reject(
    ctx: WarmerContext, slot: int, name: str, *, key: str, own_file: bool, why: str, erase: bool
) -> None:
    """A restore did not verify: drop the file (the next session rebuilds it)."""
    ctx.log(f"RESTORE invalid ({why}) → {'erase + ' if erase else ''}cold rebuild")
    if erase:
        await ctx.client.slot_erase(slot)
    if ctx.index is not None:
        await asyncio.to_thread(ctx.index.drop, name, True)
    if own_file:
        # Our own file, right token count, and still no reuse: maybe the server cannot
        # restore this model at all. The next cold build checks (hybrid detection).
        with ctx.guard:
            ctx.suspect.add(key)
