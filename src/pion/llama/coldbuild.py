"""Build a prefix cold, save it to disk, share it through the store; save an evicted slot.

Owns the warmer's write side:

- :func:`cold`: a warm-up request with only the prefix and an empty user message,
  ``n_predict: 0``, pinned to the slot; its ``timings.prompt_ms`` is the measured cold
  prefill time that the receipt later credits. With persistence on, the slot is saved as
  ``pi-prefix-<fp16>.bin``, indexed with everything a restore is checked against (build,
  model, slot context, the cache layout read from the file), and, with a store, pushed to
  it in the background (a request never waits for a push) and its receipt namespace
  registered.
- the hybrid check (:func:`_round_trip`): when a restore of our own file failed, a fresh
  save → erase → restore → identical prompt tells a bad file from a model whose restores
  cannot work on this build (recorded as ``no_restore``).
- :func:`save_evicted`: a slot about to take another prefix (LRU) whose prefix is not on
  disk yet is saved first.
- :func:`save_held`: a prefix the slot already held (the start of a longer one warmed
  before: a learned boundary moved back) gets its own file, from the slot as it is; the
  file's tokens are checked to start with the prefix's before it is indexed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from pathlib import Path

from pion.llama.client import LlamaServerError
from pion.llama.context import SlotState, Target, WarmerContext
from pion.llama.fingerprint import file_name
from pion.llama.index import IndexEntry, SlotIndex
from pion.llama.learn import common_prefix
from pion.llama.outcome import Outcome
from pion.llama.restore import HYBRID_ADVICE, target_tokens, warm_up
from pion.llama.serverinfo import ServerInfo
from pion.llama.slotfile import read_layout, read_tokens
from pion.llama.timings import Timings

__all__ = ["SCRATCH_FILE", "cold", "measured_prefill_ms", "save_evicted", "save_held", "share"]

# Where llama-server writes a save before it is checked; not a pi-prefix-*.bin name, so the
# index never lists it.
SCRATCH_FILE = "pion-saving-slot{slot}.bin"


def measured_prefill_ms(t: Timings, elapsed_ms: float) -> float:
    """The cold prefill time of the whole prefix from a warm-up's timings.

    ``prompt_ms`` covers the ``prompt_n`` tokens processed; when the slot already held a
    common beginning (``cache_n`` > 0, e.g. another prefix of the same harness), it is
    scaled to the full ``cache_n + prompt_n``. Without ``prompt_ms``, the warm-up's own
    wall time."""
    if t.prompt_ms is None or t.prompt_n <= 0:
        return elapsed_ms
    return t.prompt_ms * t.total / t.prompt_n


async def cold(ctx: WarmerContext, target: Target) -> Outcome:
    """Warm the target's prefix into its slot from scratch and (persist) save it."""
    request, slot, fp, info = target.request, target.slot, target.fingerprint, target.info
    ctx.log(f"cache=MISS → warming slot={slot} (cold)")
    started = time.monotonic()
    res = await warm_up(ctx.client, request, slot, "")
    t = res.timings
    if t is None:
        raise LlamaServerError("warm-up answer has no timings", res.status)
    prefill_ms = measured_prefill_ms(t, (time.monotonic() - started) * 1000.0)
    ctx.log(f"warm-up done: HTTP {res.status} prompt_n={t.prompt_n} cache_n={t.cache_n}")
    tokens, saved = t.total, False
    key = info.restore_key()
    name = file_name(fp)
    harness = ctx.config.harness if ctx.config.harness is not None else request.harness
    state = SlotState(
        fp,
        tokens,
        "warm-up",
        time.time(),
        label=request.label(),
        prefill_ms=prefill_ms,
        model=request.model or info.model_id,
        harness=harness,
        prompt=request.tokens,
    )
    if ctx.index is not None and not await _no_restore(ctx, key):
        if state.prompt is None:
            # Text mode: the tokens llama-server rendered the warm-up to, which every save
            # of this prefix is checked against (up to the gate: the real requests share
            # the prefix, not the warm-up's empty user turn).
            state.prompt = await target_tokens(ctx, request, slot)
            state.prompt_exact = False
        n_saved = await _save(ctx, slot, state, info, evicted=False)
        if n_saved is not None:
            tokens, saved = n_saved, True
            with ctx.guard:
                suspect = key in ctx.suspect
            if suspect:
                saved = await _round_trip(ctx, target, name, key)
            if saved:
                share(ctx, fp, name, info)
    ctx.slots[slot] = dataclasses.replace(
        state, tokens=tokens, saved=saved, file=name if saved else None
    )
    ms = (time.monotonic() - target.t0) * 1000.0
    return Outcome("cold", fp, slot, tokens, ms=ms, saved=saved, at=time.time())


async def save_evicted(ctx: WarmerContext, slot: int, state: SlotState, info: ServerInfo) -> None:
    """``slot`` is about to take another prefix: save the one it holds, unless its file is
    on disk (or restores cannot work here). The disk is checked, not remembered: a budget
    cleanup or ``pion llama gc`` may have deleted the file since it was saved."""
    ctx.count("evictions")
    head = f"EVICT slot {slot}: {state.fingerprint[:16]}… ({state.label or '?'})"
    index = ctx.index
    if index is None:
        ctx.log(f"{head}, least recently used")
        return
    name = file_name(state.fingerprint)
    if await asyncio.to_thread(_on_disk, index, name):
        ctx.log(f"{head}, least recently used, already on disk")
        return
    if await _no_restore(ctx, info.restore_key()):
        ctx.log(f"{head}, least recently used, not saved (restores disabled here)")
        return
    slot_entry = await ctx.client.slot(slot)
    held = slot_entry.get("n_prompt_tokens") if slot_entry else None
    if not isinstance(held, int) or held < ctx.config.gate_ratio * state.tokens:
        ctx.log(f"{head}, least recently used; the slot no longer holds it, nothing to save")
        return
    ctx.log(f"{head}, least recently used, not on disk → saving it first")
    if await _save(ctx, slot, state, info, evicted=True) is not None:
        share(ctx, state.fingerprint, name, info)


async def save_held(ctx: WarmerContext, slot: int, state: SlotState, info: ServerInfo) -> bool:
    """Save what ``slot`` holds as the file of ``state``'s prefix (token mode), which the
    slot holds at its start. The slot is not touched: the file may carry more tokens (the
    conversation after the prefix), as an evicted slot's does, and a restore reuses the
    prefix's part. True when the file is on disk and indexed."""
    index = ctx.index
    if index is None or state.prompt is None:
        return False
    name = file_name(state.fingerprint)
    if await asyncio.to_thread(_on_disk, index, name):
        state.saved, state.file = True, name
        return True
    if await _no_restore(ctx, info.restore_key()):
        return False
    ctx.log(f"saving the prefix slot {slot} holds ({state.tokens} tok) as {name}")
    if await _save(ctx, slot, state, info, evicted=True) is None:
        return False
    share(ctx, state.fingerprint, name, info)
    return True


async def _save(
    ctx: WarmerContext, slot: int, state: SlotState, info: ServerInfo, *, evicted: bool
) -> int | None:
    """Save ``slot`` as the file of ``state``'s prefix and index it; the tokens saved, or
    None on failure.

    Every save is checked before it is named: llama-server writes it under a scratch name,
    and only when the file's tokens start with the prefix's own tokens is it renamed to
    the prefix's file and indexed. A slot that holds anything else (another request ran
    in it, the server restarted) is refused, counted (``saves_refused``), never named."""
    index = ctx.index
    if index is None:
        return None
    name = file_name(state.fingerprint)
    if state.prompt is None:
        ctx.count("saves_refused")
        ctx.log(f"SAVE of {name} refused: the prefix's tokens are unknown (nothing to check)")
        return None
    scratch = SCRATCH_FILE.format(slot=slot)
    try:
        res = await ctx.client.slot_save(slot, scratch)
    except LlamaServerError as exc:
        ctx.log(f"SAVE failed ({exc.short()}) → continuing without a checkpoint")
        return None
    n_saved = int(res.get("n_saved") or 0)
    n_written = int(res.get("n_written") or 0)
    path = index.slot_dir / name
    checked = await asyncio.to_thread(_check_and_name, ctx, index.slot_dir / scratch, path, state)
    if checked is not None:
        ctx.count("saves_refused")
        ctx.log(f"SAVE of {name} refused: {checked} → not named, not indexed")
        return None
    ctx.log(f"SAVED {name}: n_saved={n_saved} n_written={n_written}")
    layout = await asyncio.to_thread(read_layout, path)
    ctx.learn_layout(info, layout)
    now = time.time()
    entry = IndexEntry(
        fingerprint=state.fingerprint,
        # An evicted slot also holds the conversation after the prefix: the prefix's
        # own count is what a restore must reach.
        tokens=min(state.tokens, n_saved) if evicted else n_saved,
        bytes=n_written,
        created=now,
        last_used=now,
        model=state.model or info.model_id,
        server=info.build,
        harness=state.harness,
        prefill_ms=state.prefill_ms,
        file_tokens=n_saved,
        n_ctx=info.n_ctx,
        model_identity=info.model_identity(),
        layout=layout.to_json() if layout is not None else None,
    )
    await asyncio.to_thread(_index_put, ctx, name, entry)
    state.saved, state.file = True, name
    return n_saved


def _check_and_name(ctx: WarmerContext, scratch: Path, path: Path, state: SlotState) -> str | None:
    """Rename the scratch save to the prefix's file when its tokens start with the
    prefix's; else delete it and say why. Runs in a worker thread."""
    prompt = state.prompt or ()
    if not scratch.is_file():
        return (
            f"the saved file is not at {scratch} (the slot dir must be llama-server's "
            "--slot-save-path)"
        )
    held = read_tokens(scratch)
    shared = common_prefix(held or (), prompt)
    need = len(prompt) if state.prompt_exact else ctx.config.gate_ratio * len(prompt)
    if held is None or not prompt or shared < need:
        scratch.unlink(missing_ok=True)
        return (
            f"the slot holds {len(held or ())} tokens sharing {shared} of the prefix's "
            f"{len(prompt)} (another request ran in it, or the server restarted)"
        )
    os.replace(scratch, path)
    return None


def _index_put(ctx: WarmerContext, name: str, entry: IndexEntry) -> None:
    if ctx.index is not None:
        ctx.index.put(name, entry)
        ctx.index.cleanup(ctx.config.max_files, ctx.config.max_bytes, keep=frozenset({name}))


def _on_disk(index: SlotIndex, name: str) -> bool:
    entry = index.get(name)
    path = index.slot_dir / name
    return entry is not None and path.is_file() and path.stat().st_size == entry.bytes


async def _no_restore(ctx: WarmerContext, key: str) -> bool:
    if ctx.index is None:
        return True
    loaded = await asyncio.to_thread(ctx.index.load)
    return key in loaded.no_restore


def share(ctx: WarmerContext, fp: str, name: str, info: ServerInfo) -> None:
    """Push the saved file and register its receipt namespace, in the background."""
    store, background, index = ctx.store, ctx.background, ctx.index
    if store is None or background is None or index is None:
        return
    entry = index.get(name)
    if entry is None or entry.bytes <= 0:
        return
    path = index.slot_dir / name
    with ctx.guard:
        replace = fp in ctx.refused_store
        ctx.refused_store.discard(fp)
    fields = {
        "fingerprint": fp,
        "tokens": entry.tokens,
        "prefill_ms": entry.prefill_ms,
        "build": info.build,
        "model": info.model_identity(),
        "n_ctx": info.n_ctx,
        "layout": entry.facts().layout,
    }

    def push() -> None:
        t = time.monotonic()
        manifest, pushed = store.push(path, fields, replace=replace)
        ms = (time.monotonic() - t) * 1000.0
        if pushed:
            ctx.count("store_pushes")
            ctx.log(
                f"STORE PUSHED {name}: {manifest.size} bytes in {manifest.chunks} chunk(s), "
                f"{ms:.0f} ms"
            )
        else:
            ctx.log(f"STORE already has {name} (from {manifest.origin or '?'}): not pushed")
        store.register(fp, entry.prefill_ms)

    background.submit(f"push {name}", push)


async def _round_trip(ctx: WarmerContext, target: Target, name: str, key: str) -> bool:
    """Save → erase → restore → identical prompt, on a file saved seconds ago.

    Returns whether the file is kept (False: restores do not work here)."""
    request, slot, info = target.request, target.slot, target.info
    with ctx.guard:
        ctx.suspect.discard(key)
    ctx.log("checking a save/restore round trip (our own file failed verification)")
    await ctx.client.slot_erase(slot)
    await ctx.client.slot_restore(slot, name)
    t = (await warm_up(ctx.client, request, slot, "")).timings
    if t is not None and t.reuse >= ctx.config.gate_ratio:
        ctx.log(f"round trip OK ({t.cache_n}/{t.total}): the earlier file was bad")
        return True
    got = f"{t.cache_n}/{t.total}" if t else "no timings"
    reason = (
        f"a fresh restore fails the identical-prompt gate ({got}) on build {info.build}, "
        f"model {info.model_id}: hybrid/recurrent model"
    )
    if ctx.index is not None:
        await asyncio.to_thread(ctx.index.set_no_restore, key, reason)
        await asyncio.to_thread(ctx.index.drop, name, True)
    ctx.said_no_restore.add(key)
    ctx.log(f"HYBRID: {reason} → restores disabled here, warming cold instead; {HYBRID_ADVICE}")
    return False
