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

import dataclasses
import time

from pion.llama.client import LlamaServerError
from pion.llama.context import SlotState, Target, WarmerContext
from pion.llama.fingerprint import file_name
from pion.llama.index import IndexEntry
from pion.llama.outcome import Outcome
from pion.llama.restore import HYBRID_ADVICE, warm_up
from pion.llama.serverinfo import ServerInfo
from pion.llama.slotfile import SlotLayout, read_layout
from pion.llama.timings import Timings

__all__ = ["cold", "measured_prefill_ms", "save_evicted", "save_held"]


def measured_prefill_ms(t: Timings, elapsed_ms: float) -> float:
    """The cold prefill time of the whole prefix from a warm-up's timings.

    ``prompt_ms`` covers the ``prompt_n`` tokens processed; when the slot already held a
    common beginning (``cache_n`` > 0, e.g. another prefix of the same harness), it is
    scaled to the full ``cache_n + prompt_n``. Without ``prompt_ms``, the warm-up's own
    wall time."""
    if t.prompt_ms is None or t.prompt_n <= 0:
        return elapsed_ms
    return t.prompt_ms * t.total / t.prompt_n


def cold(ctx: WarmerContext, target: Target) -> Outcome:
    """Warm the target's prefix into its slot from scratch and (persist) save it."""
    request, slot, fp, info = target.request, target.slot, target.fingerprint, target.info
    ctx.log(f"cache=MISS → warming slot={slot} (cold)")
    started = time.monotonic()
    res = warm_up(ctx.client, request, slot, "")
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
    if ctx.index is not None and key not in ctx.index.load().no_restore:
        n_saved = _save(ctx, slot, state, info, evicted=False)
        if n_saved is not None:
            tokens, saved = n_saved, True
            with ctx.guard:
                suspect = key in ctx.suspect
            if suspect:
                saved = _round_trip(ctx, target, name, key)
            if saved:
                _share(ctx, fp, name, info)
    ctx.slots[slot] = dataclasses.replace(
        state, tokens=tokens, saved=saved, file=name if saved else None
    )
    ms = (time.monotonic() - target.t0) * 1000.0
    return Outcome("cold", fp, slot, tokens, ms=ms, saved=saved, at=time.time())


def save_evicted(ctx: WarmerContext, slot: int, state: SlotState, info: ServerInfo) -> None:
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
    entry = index.get(name)
    path = index.slot_dir / name
    if entry is not None and path.is_file() and path.stat().st_size == entry.bytes:
        ctx.log(f"{head}, least recently used, already on disk")
        return
    if info.restore_key() in index.load().no_restore:
        ctx.log(f"{head}, least recently used, not saved (restores disabled here)")
        return
    slot_entry = ctx.client.slot(slot)
    held = slot_entry.get("n_prompt_tokens") if slot_entry else None
    if not isinstance(held, int) or held < ctx.config.gate_ratio * state.tokens:
        ctx.log(f"{head}, least recently used; the slot no longer holds it, nothing to save")
        return
    ctx.log(f"{head}, least recently used, not on disk → saving it first")
    if _save(ctx, slot, state, info, evicted=True) is not None:
        _share(ctx, state.fingerprint, name, info)


def save_held(ctx: WarmerContext, slot: int, state: SlotState, info: ServerInfo) -> bool:
    """Save what ``slot`` holds as the file of ``state``'s prefix (token mode), which the
    slot holds at its start. The slot is not touched: the file may carry more tokens (the
    conversation after the prefix), as an evicted slot's does, and a restore reuses the
    prefix's part. True when the file is on disk and indexed."""
    index = ctx.index
    if index is None or state.prompt is None:
        return False
    name = file_name(state.fingerprint)
    entry = index.get(name)
    path = index.slot_dir / name
    if entry is not None and path.is_file() and path.stat().st_size == entry.bytes:
        state.saved, state.file = True, name
        return True
    if info.restore_key() in index.load().no_restore:
        return False
    ctx.log(f"saving the prefix slot {slot} holds ({state.tokens} tok) as {name}")
    if _save(ctx, slot, state, info, evicted=True) is None:
        return False
    held = ctx.file_tokens(path)
    if held is None or held[: len(state.prompt)] != state.prompt:
        # Something else took the slot in between (another client, a restart).
        ctx.log(f"{name} does not start with the prefix: the slot changed → dropped")
        index.drop(name, delete_file=True)
        state.saved, state.file = False, None
        return False
    _share(ctx, state.fingerprint, name, info)
    return True


def _save(
    ctx: WarmerContext, slot: int, state: SlotState, info: ServerInfo, *, evicted: bool
) -> int | None:
    """Save ``slot`` as the file of ``state``'s prefix and index it; the tokens saved, or
    None on failure."""
    index = ctx.index
    if index is None:
        return None
    name = file_name(state.fingerprint)
    try:
        res = ctx.client.slot_save(slot, name)
    except LlamaServerError as exc:
        ctx.log(f"SAVE failed ({exc.short()}) → continuing without a checkpoint")
        return None
    n_saved = int(res.get("n_saved") or 0)
    n_written = int(res.get("n_written") or 0)
    ctx.log(f"SAVED {name}: n_saved={n_saved} n_written={n_written}")
    path = index.slot_dir / name
    layout: SlotLayout | None = None
    if path.is_file():
        layout = read_layout(path)
        ctx.learn_layout(info, layout)
    else:
        ctx.log(
            f"SAVED file not found at {path}: the slot dir must be llama-server's "
            "--slot-save-path → it will not be restored"
        )
    now = time.time()
    index.put(
        name,
        IndexEntry(
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
        ),
    )
    index.cleanup(ctx.config.max_files, ctx.config.max_bytes, keep=frozenset({name}))
    state.saved, state.file = True, name
    return n_saved


def _share(ctx: WarmerContext, fp: str, name: str, info: ServerInfo) -> None:
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


def _round_trip(ctx: WarmerContext, target: Target, name: str, key: str) -> bool:
    """Save → erase → restore → identical prompt, on a file saved seconds ago.

    Returns whether the file is kept (False: restores do not work here)."""
    request, slot, info = target.request, target.slot, target.info
    with ctx.guard:
        ctx.suspect.discard(key)
    ctx.log("checking a save/restore round trip (our own file failed verification)")
    ctx.client.slot_erase(slot)
    ctx.client.slot_restore(slot, name)
    t = warm_up(ctx.client, request, slot, "").timings
    if t is not None and t.reuse >= ctx.config.gate_ratio:
        ctx.log(f"round trip OK ({t.cache_n}/{t.total}): the earlier file was bad")
        return True
    got = f"{t.cache_n}/{t.total}" if t else "no timings"
    reason = (
        f"a fresh restore fails the identical-prompt gate ({got}) on build {info.build}, "
        f"model {info.model_id}: hybrid/recurrent model"
    )
    if ctx.index is not None:
        ctx.index.set_no_restore(key, reason)
        ctx.index.drop(name, delete_file=True)
    ctx.said_no_restore.add(key)
    ctx.log(f"HYBRID: {reason} → restores disabled here, warming cold instead; {HYBRID_ADVICE}")
    return False
