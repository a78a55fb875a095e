"""Checkpoints of whole conversations: after an answer, the slot is saved with the
conversation it holds, so that a later request (after a llama-server restart, or on
another machine through the store) restores the conversation up to its previous turn, not
only the stable prefix.

Owns :func:`save_checkpoint`, called after a request's answer, still under its slot's
lease (:meth:`PrefixWarmer.finish <pion.llama.warmer.PrefixWarmer.finish>`, a task no
answer waits for). The restore side is :func:`pion.llama.restore.restore` (the
checkpoint sharing the longest token prefix with the request, before the prefix's own
file). The rules:

- **The request's own tokens** (:attr:`WarmRequest.conversation
  <pion.llama.prefix.WarmRequest.conversation>`) are what a checkpoint is checked
  against and later found by. A Pi-marker request (text mode) renders nothing on its way:
  its tokens are asked for (``/apply-template``, ``/tokenize``) only after an answer that
  grew its conversation enough, or to pick a checkpoint to restore; its prefix is then
  the part of its warm-up's rendering (the prefix, then an empty user turn) the
  conversation holds, at least the gate ratio of it.
- **Rate-limited by new tokens**: saved only when the conversation grew by at least
  ``checkpoint_tokens`` (``--checkpoint-tokens``) past the longest slot file that
  already holds its start (the prefix's own file, or an earlier checkpoint).
- **Checked before it is named**: llama-server writes the save under a scratch name; the
  file is renamed only when its tokens start with the prefix's and share at least
  ``gate_ratio`` of the request's, else deleted and counted (``saves_refused``). Its
  name is ``pi-prefix-<fp16>.bin`` of its own fingerprint: the prefix's fingerprint and
  a hash of the file's tokens, so a name never stands for other tokens.
- **Indexed like any slot file** (``prefix``: the prefix's fingerprint), under the same
  ``--max-files``/``--max-bytes`` budget, least recently used first; a checkpoint that
  holds an older one's request (the same conversation, later; up to ``gate_ratio``)
  replaces it. With a store, it is pushed like any file and listed under its prefix with
  the SHA-256 of the request's tokens it was checked for (but their last
  :data:`GENERATION_TAIL`), so that another machine (or an emptied slot dir) finds the
  longest one a request continues.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from array import array
from collections.abc import Sequence
from pathlib import Path

from pion.llama.client import LlamaServerError
from pion.llama.coldbuild import SCRATCH_FILE, share
from pion.llama.context import SlotState, WarmerContext
from pion.llama.fingerprint import file_name, tokens_digest
from pion.llama.index import IndexEntry, SlotIndex
from pion.llama.learn import common_prefix
from pion.llama.serverinfo import ServerInfo
from pion.llama.slotfile import read_layout, read_tokens

__all__ = ["GENERATION_TAIL", "checkpoint_fingerprint", "save_checkpoint"]

# Tokens at the end of a request that its next turn may render differently (the
# generation prompt: ``<|im_start|>assistant\n``, a ``<think>`` opener): a checkpoint is
# listed in the store by the digest of its request's tokens without them.
GENERATION_TAIL = 16


def checkpoint_fingerprint(prefix_fp: str, tokens: Sequence[int]) -> str:
    """The fingerprint of a checkpoint of prefix ``prefix_fp`` holding ``tokens``."""
    digest = hashlib.sha256(b"pion-llama-checkpoint\0" + prefix_fp.encode() + b"\0")
    digest.update(array("q", tokens).tobytes())
    return digest.hexdigest()


def _known(ctx: WarmerContext, index: SlotIndex, conversation: tuple[int, ...]) -> int:
    """Tokens of ``conversation`` some indexed slot file already holds at its start.
    Reads the slot dir: runs in a worker thread."""
    best = 0
    for name, entry in index.files.items():
        path = index.slot_dir / name
        try:
            if path.stat().st_size != entry.bytes:
                continue
        except OSError:
            continue
        held = ctx.file_tokens(path)
        if held:
            best = max(best, common_prefix(held, conversation))
    return best


async def save_checkpoint(
    ctx: WarmerContext,
    slot: int,
    state: SlotState,
    conversation: tuple[int, ...],
    info: ServerInfo,
) -> str | None:
    """Under ``slot``'s lease, after the answer of a request of ``conversation`` ran in it:
    save the slot as a checkpoint of that conversation when it grew enough. Returns the
    file's name, or None when nothing was saved."""
    index, cfg = ctx.index, ctx.config
    prefix = state.prompt
    if index is None or cfg.checkpoint_tokens <= 0 or prefix is None:
        return None
    if not state.prompt_exact:
        # Text mode (a Pi marker): the slot's prompt is its warm-up's rendering, the
        # prefix then an empty user turn; the conversation holds the prefix part of it.
        shared = common_prefix(prefix, conversation)
        if shared < cfg.gate_ratio * state.tokens:
            return None
        prefix = conversation[:shared]
    if len(conversation) <= len(prefix) or conversation[: len(prefix)] != prefix:
        return None
    loaded = await asyncio.to_thread(index.load)
    if info.restore_key() in loaded.no_restore:
        return None
    known = await asyncio.to_thread(_known, ctx, loaded, conversation)
    if len(conversation) - known < cfg.checkpoint_tokens:
        ctx.count("checkpoints_skipped")
        return None
    scratch = SCRATCH_FILE.format(slot=slot)
    try:
        await ctx.client.slot_save(slot, scratch)
    except LlamaServerError as exc:
        ctx.log(f"CHECKPOINT save failed ({exc.short()}) → none")
        return None
    named = await asyncio.to_thread(
        _check_and_name, ctx, index.slot_dir / scratch, state.fingerprint, prefix, conversation
    )
    if isinstance(named, str):
        ctx.count("saves_refused")
        ctx.log(f"CHECKPOINT of slot {slot} refused: {named} → not named, not indexed")
        return None
    fp, name, held, shared = named
    path = index.slot_dir / name
    layout = await asyncio.to_thread(read_layout, path)
    ctx.learn_layout(info, layout)
    now = time.time()
    scale = shared / state.tokens if state.tokens > 0 else 1.0
    entry = IndexEntry(
        fingerprint=fp,
        tokens=shared,
        bytes=await asyncio.to_thread(lambda: path.stat().st_size),
        created=now,
        last_used=now,
        model=state.model or info.model_id,
        server=info.build,
        harness=state.harness,
        prefill_ms=state.prefill_ms * scale,
        file_tokens=len(held),
        n_ctx=info.n_ctx,
        model_identity=info.model_identity(),
        layout=layout.to_json() if layout is not None else None,
        prefix=state.fingerprint,
    )
    replaced = await asyncio.to_thread(_index_checkpoint, ctx, index, name, entry, held)
    ctx.count("checkpoints_saved")
    ctx.log(
        f"CHECKPOINT {name}: slot {slot}'s conversation, {shared} of the request's "
        f"{len(conversation)} tokens ({len(conversation) - known} new), {len(held)} in the "
        f"file, prefix {state.fingerprint[:16]}…"
        + (f"; replaces {', '.join(replaced)}" if replaced else "")
    )
    share(ctx, fp, name, info)
    # The request's tokens but their tail: its generation prompt, which the next turn
    # renders anew once the answer follows it (a digest of them would never match).
    listed = max(len(prefix), shared - GENERATION_TAIL)
    _list_in_store(ctx, state.fingerprint, fp, conversation[:listed])
    return name


def _list_in_store(
    ctx: WarmerContext, prefix_fp: str, fp: str, conversation: tuple[int, ...]
) -> None:
    """After its push (the same background queue, in order), list the checkpoint under
    its prefix in the store, with the digest a request's tokens are compared with."""
    store, background = ctx.store, ctx.background
    if store is None or background is None:
        return
    digest = tokens_digest(conversation)
    background.submit(
        f"list checkpoint {fp[:16]}",
        lambda: store.add_checkpoint(prefix_fp, fp, len(conversation), digest),
    )


def _check_and_name(
    ctx: WarmerContext,
    scratch: Path,
    prefix_fp: str,
    prefix: tuple[int, ...],
    conversation: tuple[int, ...],
) -> tuple[str, str, tuple[int, ...], int] | str:
    """Name the scratch save when its tokens start with the prefix's and share at least
    the gate ratio of the conversation's: (fingerprint, name, its tokens, shared). Else
    delete it and say why. Runs in a worker thread."""
    if not scratch.is_file():
        return (
            f"the saved file is not at {scratch} (the slot dir must be llama-server's "
            "--slot-save-path)"
        )
    held = read_tokens(scratch)
    shared = common_prefix(held or (), conversation)
    need = max(len(prefix), ctx.config.gate_ratio * len(conversation))
    if held is None or shared < need:
        scratch.unlink(missing_ok=True)
        return (
            f"the slot holds {len(held or ())} tokens sharing {shared} of the request's "
            f"{len(conversation)} (another request ran in it, or the server restarted)"
        )
    fp = checkpoint_fingerprint(prefix_fp, held)
    name = file_name(fp)
    os.replace(scratch, scratch.with_name(name))
    return fp, name, tuple(held), shared


def _index_checkpoint(
    ctx: WarmerContext, index: SlotIndex, name: str, entry: IndexEntry, held: tuple[int, ...]
) -> list[str]:
    """Index the checkpoint ``name``, forget (and delete) the older checkpoints it
    continues, then apply the budget. Returns the replaced files. Runs in a worker
    thread."""
    replaced: list[str] = []
    with index.edit():
        for other, old in list(index.files.items()):
            if other == name or not old.checkpoint:
                continue
            # Replaced by a later checkpoint of the same conversation: the new file holds
            # the old one's request up to the gate ratio (the end of a request, its
            # generation prompt, may render differently once the answer follows it).
            if old.prefix != entry.prefix or old.tokens > entry.tokens:
                continue
            tokens = ctx.file_tokens(index.slot_dir / other)
            need = ctx.config.gate_ratio * old.tokens
            if tokens is not None and common_prefix(tokens, held) >= need:
                del index.files[other]
                (index.slot_dir / other).unlink(missing_ok=True)
                replaced.append(other)
        index.files[name] = entry
    index.cleanup(ctx.config.max_files, ctx.config.max_bytes, keep=frozenset({name}))
    return replaced
