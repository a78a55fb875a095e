"""A partial restore: no file of a prefix, but a saved one that shares most of its
tokens (a prefix one tool or one rule longer or shorter).

Owns :func:`restore_partial`, which the warmer tries when :func:`pion.llama.restore.restore`
found nothing for the prefix: the saved file sharing the longest token prefix with it
(:func:`longest_shared`) is restored when it is long enough (:data:`PARTIAL_MIN_TOKENS`,
:data:`PARTIAL_MIN_SHARE`), after the same compatibility check as any restore, so that
the cold build that follows computes only the rest. Runs under the slot's lease.
"""

from __future__ import annotations

import asyncio

from pion.llama.client import LlamaServerError
from pion.llama.context import Target, WarmerContext
from pion.llama.index import IndexEntry, SlotIndex
from pion.llama.learn import common_prefix
from pion.llama.restore import FileChecker, target_tokens

__all__ = ["PARTIAL_MIN_SHARE", "PARTIAL_MIN_TOKENS", "longest_shared", "restore_partial"]

# A saved prefix that shares at least this many tokens, and at least
# ``PARTIAL_MIN_SHARE`` of the new prefix, is restored before the new one is warmed:
# llama-server reuses the common tokens and computes only the rest.
PARTIAL_MIN_TOKENS = 32
PARTIAL_MIN_SHARE = 0.5


def longest_shared(
    ctx: WarmerContext, index: SlotIndex, tokens: tuple[int, ...], skip: str
) -> tuple[int, str, IndexEntry] | None:
    """The indexed file (not of fingerprint ``skip``) whose tokens share the longest
    prefix with ``tokens``: (tokens shared, name, entry). Reads the slot dir: call it off
    the event loop."""
    best: tuple[int, str, IndexEntry] | None = None
    for name, entry in sorted(index.files.items()):
        path = index.slot_dir / name
        if entry.fingerprint == skip or not path.is_file():
            continue
        if path.stat().st_size != entry.bytes:
            continue
        held = ctx.file_tokens(path)
        if held is None:
            continue
        shared = common_prefix(held, tokens)
        if best is None or shared > best[0]:
            best = (shared, name, entry)
    return best


async def restore_partial(ctx: WarmerContext, target: Target) -> tuple[str, int] | None:
    """No file of this prefix: restore the saved prefix that shares the most tokens with
    it, when that is long (:data:`PARTIAL_MIN_TOKENS`, :data:`PARTIAL_MIN_SHARE`), so the
    cold build that follows computes only the rest. Returns (file, tokens shared)."""
    index, slot, info = ctx.index, target.slot, target.info
    if index is None:
        return None
    loaded = await asyncio.to_thread(index.load)
    key = info.restore_key()
    if key in loaded.no_restore or not loaded.files:
        return None
    try:
        tokens = await target_tokens(ctx, target.request, slot)
    except LlamaServerError as exc:
        ctx.log(f"no partial restore (tokenizing failed: {exc.short()})")
        return None
    checker = FileChecker(ctx, info, slot)
    best = await asyncio.to_thread(longest_shared, ctx, loaded, tokens, target.fingerprint)
    need = max(PARTIAL_MIN_TOKENS, PARTIAL_MIN_SHARE * len(tokens))
    if best is None or best[0] < need:
        return None
    shared, name, entry = best
    why = await checker.why_not(entry.facts())
    if why is not None:
        ctx.count("refused_compat")
        ctx.log(f"REFUSED {name} for a partial restore: {why} → cold build")
        return None
    try:
        res = await ctx.client.slot_restore(slot, name)
    except LlamaServerError as exc:
        ctx.log(f"partial restore of {name} failed ({exc.short()}) → cold build")
        return None
    await asyncio.to_thread(index.touch, name)
    ctx.count("partial_restores")
    ctx.log(
        f"RESTORE {name} (partial): shares {shared} of {len(tokens)} tokens with this "
        f"prefix, n_restored={res.get('n_restored')} → warming the rest, saving it beside"
    )
    return name, shared
